package report_test

import (
	"os/exec"
	"strings"
	"testing"
)

// pav-report starts in every controller-side pod: it must stay a binary of
// the standard library and this package, whose start costs a millisecond and
// a megabyte (pav's own binary: some 60 ms and 30 MB, mostly client-go's and
// the metrics' package initialisation).
func TestReportBinaryLinksTheStandardLibraryOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		"github.com/pods-as-volumes/pav/cmd/pav-report").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		switch p {
		case "github.com/pods-as-volumes/pav/cmd/pav-report", "github.com/pods-as-volumes/pav/internal/report":
		default:
			t.Errorf("pav-report links %s: keep it to the standard library", p)
		}
	}
}
