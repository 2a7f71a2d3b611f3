package compat

import (
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	old := Release
	Release = "v0.3.0"
	defer func() { Release = old }()
	f := Format{What: "state.json", Current: 1, Releases: map[int]string{0: "v0.2.0", 1: "v0.3.0"}}
	for _, tc := range []struct {
		version int
		want    string // "": read
	}{
		{version: 0},
		{version: 1},
		{version: 2, want: "state.json /x has format version 2 (written by a pav newer than v0.3.0), newer than version 1, the newest this pav (v0.3.0) reads: pav was downgraded"},
		{version: -1, want: "state.json /x has format version -1, which no pav writes: it is corrupt"},
	} {
		err := f.Check("/x", tc.version)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("version %d: %v", tc.version, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrNewerFormat)):
			t.Errorf("version %d: %v, want %q", tc.version, err, tc.want)
		}
	}
	if got := f.ReleaseOf(0); got != "v0.2.0" {
		t.Errorf("ReleaseOf(0) = %q", got)
	}
}
