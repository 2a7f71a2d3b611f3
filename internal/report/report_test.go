package report_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pods-as-volumes/pav/internal/report"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReportRoundTrip(t *testing.T) {
	bigError := strings.Repeat("x", 5000) + "THE END"
	cases := []struct {
		name     string
		files    map[string]string
		budget   int
		want     map[string]string // exact files wanted (nil: check by func)
		check    func(t *testing.T, got map[string]string)
		parseErr string
	}{
		{name: "none", files: nil, budget: 4096, want: map[string]string{}},
		{name: "all", budget: 4096,
			files: map[string]string{"handle": "vol-1\n", "capacity": " 1Gi ", "topology": "- {zone: a}\n", "error": "quota <exceeded> & \"more\"", "ready": "", "other": "x"},
			want:  map[string]string{"handle": "vol-1\n", "capacity": " 1Gi ", "topology": "- {zone: a}\n", "error": "quota <exceeded> & \"more\""}},
		{name: "a capacity pod's report", budget: 4096,
			files: map[string]string{"capacity": "0\n", "maximumVolumeSize": "1Gi"},
			want:  map[string]string{"capacity": "0\n", "maximumVolumeSize": "1Gi"}},
		{name: "empty handle kept", files: map[string]string{"handle": ""}, budget: 4096, want: map[string]string{"handle": ""}},
		{name: "long error keeps tail", budget: 4096,
			files: map[string]string{"handle": "h", "error": bigError},
			check: func(t *testing.T, got map[string]string) {
				if got["handle"] != "h" {
					t.Errorf("handle %q", got["handle"])
				}
				e := got["error"]
				if !strings.HasPrefix(e, "…") || !strings.HasSuffix(e, "THE END") || len(e) < 3500 {
					t.Errorf("error not truncated to its tail: %d bytes, %q…%q", len(e), e[:10], e[len(e)-10:])
				}
			}},
		{name: "escapes shrink budget", budget: 1000,
			files: map[string]string{"error": strings.Repeat("\x01\"", 2000) + "END"},
			check: func(t *testing.T, got map[string]string) {
				if !strings.HasSuffix(got["error"], "END") {
					t.Errorf("tail lost: %q", got["error"])
				}
			}},
		{name: "multibyte tail stays valid", budget: 300,
			files: map[string]string{"error": strings.Repeat("é", 1000) + "fin"},
			check: func(t *testing.T, got map[string]string) {
				if !utf8.ValidString(got["error"]) || !strings.HasSuffix(got["error"], "fin") {
					t.Errorf("bad tail %q", got["error"])
				}
			}},
		{name: "huge handle dropped, not cut", budget: 4096,
			files:    map[string]string{"handle": strings.Repeat("h", 5000), "capacity": "1"},
			check:    func(t *testing.T, got map[string]string) { assertNo(t, got, "handle") },
			parseErr: "/pav/handle (5000 bytes) is too large"},
		{name: "huge topology dropped before capacity and handle", budget: 4096,
			files: map[string]string{"handle": "h", "capacity": "1", "topology": strings.Repeat("t", 5000)},
			check: func(t *testing.T, got map[string]string) {
				assertNo(t, got, "topology")
				if got["handle"] != "h" || got["capacity"] != "1" {
					t.Errorf("handle or capacity lost: %v", got)
				}
			},
			parseErr: "/pav/topology (5000 bytes) is too large"},
		{name: "huge maximumVolumeSize dropped before capacity", budget: 4096,
			files: map[string]string{"capacity": "1", "maximumVolumeSize": strings.Repeat("9", 5000)},
			check: func(t *testing.T, got map[string]string) {
				assertNo(t, got, "maximumVolumeSize")
				if got["capacity"] != "1" {
					t.Errorf("capacity lost: %v", got)
				}
			},
			parseErr: "/pav/maximumVolumeSize (5000 bytes) is too large"},
		{name: "group snapshots", budget: 4096,
			files: map[string]string{"snapshots": "pvc-1.node-a: {handle: g-0.node-a, capacity: 1Mi}\n", "handle": "g"},
			want:  map[string]string{"snapshots": "pvc-1.node-a: {handle: g-0.node-a, capacity: 1Mi}\n", "handle": "g"}},
		{name: "huge snapshots dropped before topology, capacity and handle", budget: 4096,
			files: map[string]string{"handle": "h", "topology": "t", "snapshots": strings.Repeat("s", 5000)},
			check: func(t *testing.T, got map[string]string) {
				assertNo(t, got, "snapshots")
				if got["handle"] != "h" || got["topology"] != "t" {
					t.Errorf("handle or topology lost: %v", got)
				}
			},
			parseErr: "/pav/snapshots (5000 bytes) is too large"},
		{name: "tiny budget", budget: 40,
			files:    map[string]string{"handle": strings.Repeat("h", 30), "error": "e"},
			check:    func(t *testing.T, got map[string]string) { assertNo(t, got, "handle") },
			parseErr: "too large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFiles(t, dir, c.files)
			msg := report.Message(dir, c.budget)
			if len(msg) > c.budget {
				t.Fatalf("message of %d bytes exceeds budget %d", len(msg), c.budget)
			}
			got, err := report.Parse(msg)
			if c.parseErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.parseErr) {
					t.Fatalf("Parse error %v, want %q (msg %s)", err, c.parseErr, msg)
				}
			} else if err != nil {
				t.Fatalf("Parse: %v (msg %s)", err, msg)
			}
			if c.want != nil {
				if len(got) != len(c.want) {
					t.Errorf("got %v, want %v", got, c.want)
				}
				for k, v := range c.want {
					if got[k] != v {
						t.Errorf("%s = %q, want %q", k, got[k], v)
					}
				}
			}
			if c.check != nil {
				c.check(t, got)
			}
		})
	}
}

func assertNo(t *testing.T, got map[string]string, key string) {
	t.Helper()
	if _, ok := got[key]; ok {
		t.Errorf("%s present (%d bytes)", key, len(got[key]))
	}
}

func TestReportUnreadableFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "handle"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/hostname", filepath.Join(dir, "capacity")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "error"), []byte("disk full"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Through the sidecar's message, and read directly (the node plugin's
	// way): the same files, the same refusals.
	parsed, perr := report.Parse(report.Message(dir, 4096))
	read, rerr := report.Read(dir, 4096)
	for how, r := range map[string]struct {
		got map[string]string
		err error
	}{"message": {parsed, perr}, "read": {read, rerr}} {
		if r.err == nil || !strings.Contains(r.err.Error(), "/pav/handle is not a regular file") || !strings.Contains(r.err.Error(), "/pav/capacity") {
			t.Fatalf("%s: err %v", how, r.err)
		}
		if len(r.got) != 1 || r.got["error"] != "disk full" {
			t.Errorf("%s: files %v", how, r.got)
		}
	}
	if perr.Error() != rerr.Error() {
		t.Errorf("message: %v; read: %v", perr, rerr)
	}
}

func TestParseReportErrors(t *testing.T) {
	if _, err := report.Parse(""); !errors.Is(err, report.ErrNoReport) {
		t.Errorf("empty: %v", err)
	}
	if _, err := report.Parse(`{"handle": "x`); err == nil || errors.Is(err, report.ErrNoReport) {
		t.Errorf("truncated JSON: %v", err)
	}
	got, err := report.Parse(`{"handle":"h","unknown":"u"}`)
	if err != nil || len(got) != 1 || got["handle"] != "h" {
		t.Errorf("got %v, %v", got, err)
	}
}

func TestReportCommand(t *testing.T) {
	dir := t.TempDir()
	if code := report.Run(context.Background(), dir, "", true); code != 1 {
		t.Errorf("check-ready without ready: %d", code)
	}
	writeFiles(t, dir, map[string]string{"ready": "", "handle": "h1", "error": strings.Repeat("e", 9000)})
	if code := report.Command(context.Background(), []string{"--dir=" + dir, "--check-ready"}); code != 0 {
		t.Errorf("check-ready with ready: %d", code)
	}
	if code := report.Command(context.Background(), []string{"--bogus"}); code != 2 {
		t.Errorf("bad flag: %d", code)
	}

	// Blocks until told to stop (SIGTERM in a pod; ctx here), then writes the report.
	t.Setenv("PAV_REPORT_MAX_BYTES", "1000")
	termLog := filepath.Join(t.TempDir(), "termination-log")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { done <- report.Command(ctx, []string{"--dir=" + dir, "--termination-log=" + termLog}) }()
	select {
	case code := <-done:
		t.Fatalf("returned %d before being stopped", code)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit code %d", code)
	}
	msg, err := os.ReadFile(termLog)
	if err != nil {
		t.Fatal(err)
	}
	if len(msg) > 1000 {
		t.Errorf("report of %d bytes ignores the budget", len(msg))
	}
	files, err := report.Parse(string(msg))
	if err != nil || files["handle"] != "h1" || !strings.HasPrefix(files["error"], "…e") {
		t.Errorf("files %v, err %v", files, err)
	}
}
