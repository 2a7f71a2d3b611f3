package procstat

import (
	"os"
	"testing"
)

func TestStatus(t *testing.T) {
	if rss := Status(os.Getpid(), "VmRSS"); rss <= 0 {
		t.Errorf("VmRSS of this process: %d", rss)
	}
	if v := Status(os.Getpid(), "NoSuchField"); v != 0 {
		t.Errorf("missing field: %d", v)
	}
	if v := Status(-1, "VmRSS"); v != 0 {
		t.Errorf("missing process: %d", v)
	}
}
