package deploy

import "testing"

func TestDebugPrint(t *testing.T) {
	a := newAdmitter(t)
	for _, c := range invalidObjects {
		t.Logf("%s:%s", c.name, rejectionsString(a.admit(t, c.obj, "")))
	}
}
