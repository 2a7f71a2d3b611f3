package v1alpha1

import (
	"reflect"
	"strings"
	"testing"
)

// Every phase names a distinct spec field, the one its JSON tag names, and
// Spec.Phase returns that field: a phase added to one switch but not the
// other would be silently skipped by phase.Check.
func TestPhasesAndFields(t *testing.T) {
	st := reflect.TypeOf(PavProvisionerSpec{})
	byTag := map[string]int{}
	for i := range st.NumField() {
		byTag[strings.Split(st.Field(i).Tag.Get("json"), ",")[0]] = i
	}
	seen := map[string]Phase{}
	for _, p := range Phases {
		f := p.Field()
		if f == "" {
			t.Errorf("phase %q has no field", p)
			continue
		}
		if q, dup := seen[f]; dup {
			t.Errorf("phases %q and %q share field %q", q, p, f)
		}
		seen[f] = p
		i, ok := byTag[f]
		if !ok {
			t.Errorf("phase %q: PavProvisionerSpec has no field tagged %q", p, f)
			continue
		}
		var s PavProvisionerSpec
		v := &Value{Data: map[string]any{"phase": string(p)}}
		reflect.ValueOf(&s).Elem().Field(i).Set(reflect.ValueOf(v))
		if got := s.Phase(p); got != v {
			t.Errorf("Spec.Phase(%q) does not return spec.%s", p, f)
		}
		for _, q := range Phases {
			if q != p && s.Phase(q) != nil {
				t.Errorf("Spec.Phase(%q) returns spec.%s", q, f)
			}
		}
	}
	if Phase("nope").Field() != "" || (&PavProvisionerSpec{}).Phase("nope") != nil {
		t.Error("an unknown phase has a field")
	}
}

func TestHasMode(t *testing.T) {
	s := PavProvisionerSpec{ProvisioningModes: []ProvisioningMode{Static, Ephemeral}}
	for _, m := range ProvisioningModes {
		if got, want := s.HasMode(m), m != Dynamic; got != want {
			t.Errorf("HasMode(%s) = %v, want %v", m, got, want)
		}
	}
}
