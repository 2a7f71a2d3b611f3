package manager

import (
	"encoding/json"
	"testing"
)

func TestCovers(t *testing.T) {
	for _, tc := range []struct {
		name       string
		want, have string
		covered    bool
	}{
		{"equal", `{"a":1,"b":"x"}`, `{"a":1,"b":"x"}`, true},
		{"server defaults and other fields", `{"a":{"b":1}}`, `{"a":{"b":1,"c":2},"status":{}}`, true},
		{"changed value", `{"a":{"b":1}}`, `{"a":{"b":2}}`, false},
		{"missing value", `{"a":{"b":1}}`, `{"a":{}}`, false},
		{"zero values the server leaves out", `{"a":"","b":0,"c":false,"d":{},"e":[],"f":null}`, `{}`, true},
		{"zero value set to something else", `{"a":""}`, `{"a":"x"}`, false},
		{"empty object kept", `{"emptyDir":{}}`, `{"emptyDir":{}}`, true},
		{"scalar list in order", `{"args":["--a","--b"]}`, `{"args":["--a","--b"]}`, true},
		{"scalar list reordered", `{"args":["--a","--b"]}`, `{"args":["--b","--a"]}`, false},
		{"scalar list longer", `{"args":["--a"]}`, `{"args":["--a","--b"]}`, false},
		{"object list, any order, defaults", `{"c":[{"name":"a","image":"i"},{"name":"b"}]}`,
			`{"c":[{"name":"b","x":1},{"name":"a","image":"i","pull":"IfNotPresent"}]}`, true},
		{"object list with an item added by someone else", `{"c":[{"name":"a"}]}`, `{"c":[{"name":"a"},{"name":"istio"}]}`, true},
		{"object list item changed", `{"c":[{"name":"a","image":"i"}]}`, `{"c":[{"name":"a","image":"evil"}]}`, false},
		{"object list item removed", `{"c":[{"name":"a"},{"name":"b"}]}`, `{"c":[{"name":"a"}]}`, false},
		{"items of the same name matched one to one", `{"m":[{"name":"v","path":"/a"},{"name":"v","path":"/b"}]}`,
			`{"m":[{"name":"v","path":"/b"},{"name":"v","path":"/a"}]}`, true},
		{"one item cannot cover two", `{"t":[{"op":"Exists"},{"op":"Exists"}]}`, `{"t":[{"op":"Exists"}]}`, false},
		{"type changed", `{"a":{"b":1}}`, `{"a":"b"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w, h any
			if err := json.Unmarshal([]byte(tc.want), &w); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tc.have), &h); err != nil {
				t.Fatal(err)
			}
			if got := covers(w, h); got != tc.covered {
				t.Errorf("covers(%s, %s) = %v, want %v", tc.want, tc.have, got, tc.covered)
			}
		})
	}
}
