package podrunner_test

import (
	"strings"
	"testing"

	"github.com/pods-as-volumes/pav/podrunner"
)

func TestPodFailureError(t *testing.T) {
	f := &podrunner.PodFailure{
		Phase: "creation", Pod: "pav-hello-creation-3f2a", Namespace: "default", PodPhase: "Failed", Reason: "Error",
		ExitCodes: map[string]int32{"main": 3, "aux": 1}, ErrorFile: "disk quota exceeded\n", LogTail: "ignored",
	}
	want := `creation pod default/pav-hello-creation-3f2a failed (phase Failed, reason Error): container "aux" exited with code 1; container "main" exited with code 3; /pav/error: disk quota exceeded`
	if f.Error() != want {
		t.Errorf("got  %s\nwant %s", f.Error(), want)
	}
	f.ErrorFile = ""
	if !strings.HasSuffix(f.Error(), "; log tail: ignored") {
		t.Errorf("no log tail: %s", f.Error())
	}
}
