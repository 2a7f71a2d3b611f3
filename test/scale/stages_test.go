package scale

import (
	"os"
	"strings"
	"testing"

	"github.com/pods-as-volumes/pav/podrunner"
)

// kwok's stage completes pav's pods by what carries their report, which it
// can only know by name (the sidecar) or by command (a wrapped one): it must
// keep naming them as podrunner does.
func TestStageNamesWhatCarriesTheReport(t *testing.T) {
	b, err := os.ReadFile("kwok/pav-pod-complete.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`eq .name "` + podrunner.ReportContainer + `"`, `"` + podrunner.ReportExecPath + `"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("kwok/pav-pod-complete.yaml does not test %s", want)
		}
	}
}
