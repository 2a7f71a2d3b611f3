package v1alpha1

import "encoding/json"

// jsonCopy deep-copies an API object through JSON. pav's objects hold
// untyped phase trees and whole API objects, and are copied once per
// transition, so a generated deep-copy would buy nothing.
func jsonCopy[T any](in *T) *T {
	if in == nil {
		return nil
	}
	b, err := json.Marshal(in)
	if err != nil {
		panic(err) // cannot happen: every field marshals
	}
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		panic(err)
	}
	return out
}
