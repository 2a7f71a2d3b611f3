package report_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/pods-as-volumes/pav/internal/report"
)

func TestExec(t *testing.T) {
	cases := []struct {
		name     string
		argv     []string
		wantCode int
		want     string // the report written
	}{
		{"success with a handle", []string{"sh", "-c", `printf h-1 > "$D/handle"; printf 5Gi > "$D/capacity"`}, 0, `{"capacity":"5Gi","handle":"h-1"}`},
		{"failure with /pav/error", []string{"sh", "-c", `echo "disk full" > "$D/error"; exit 3`}, 3, `{"error":"disk full\n"}`},
		{"killed by a signal", []string{"sh", "-c", `kill -KILL $$`}, 128 + 9, `{}`},
		{"arguments passed as they are", []string{"sh", "-c", `printf '%s|' "$@" > "$D/handle"`, "sh", "a b", "$(X)", ""}, 0, `{"handle":"a b|$(X)||"}`},
		{"not found", []string{"no-such-command-for-pav"}, 127, `{}`},
		{"not executable", []string{"/dev/null"}, 126, `{}`},
		{"no command", nil, 2, `{}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Setenv("D", dir)
			log := filepath.Join(t.TempDir(), "termination-log")
			if got := report.Exec(c.argv, dir, log, report.MaxMessage); got != c.wantCode {
				t.Errorf("exit code %d, want %d", got, c.wantCode)
			}
			b, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != c.want {
				t.Errorf("report %s, want %s", b, c.want)
			}
		})
	}
}

// The kubelet's SIGTERM (the pod is deleted) reaches the command, whose own
// handler decides how it ends; the report still follows.
func TestExecForwardsSignals(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("D", dir)
	log := filepath.Join(t.TempDir(), "termination-log")
	code := make(chan int, 1)
	go func() {
		code <- report.Exec([]string{"sh", "-c", `trap 'echo stopped > "$D/error"; exit 7' TERM; : > "$D/trapped"; while :; do sleep 0.01; done`},
			dir, log, report.MaxMessage)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "trapped")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the command never started")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// To this process: Exec's handler takes it (the test would die otherwise).
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-code:
		if c != 7 {
			t.Errorf("exit code %d, want the command's 7", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the command did not end on SIGTERM")
	}
	if b, _ := os.ReadFile(log); string(b) != `{"error":"stopped\n"}` {
		t.Errorf("report %s", b)
	}
}

func TestCommandExec(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(t.TempDir(), "termination-log")
	if err := os.WriteFile(filepath.Join(dir, "error"), []byte("0123456789abcdefghij"), 0o644); err != nil {
		t.Fatal(err)
	}
	code := report.Command(context.Background(), []string{"--exec", "--dir=" + dir, "--termination-log=" + log, "--max-bytes=24",
		"--", "sh", "-c", "exit 1", "--dir=/elsewhere"})
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if b, _ := os.ReadFile(log); string(b) != `{"error":"…bcdefghij"}` {
		t.Errorf("report %s (%d bytes), want the error's tail within 24 bytes", b, len(b))
	}
}

// A node pod's wrapper writes the command's exit code, not a report, and
// ReadExit reads it back only from a regular file holding a number.
func TestCommandExecExitFile(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(t.TempDir(), "termination-log")
	for _, c := range []struct {
		script string
		want   int
	}{
		{"echo done > \"$0\"/handle", 0},
		{"exit 3", 3},
		{"kill -TERM $$", 128 + 15},
	} {
		if _, ok := report.ReadExit(dir); ok {
			os.Remove(filepath.Join(dir, report.FileExit))
		}
		code := report.Command(context.Background(), []string{"--exec", "--dir=" + dir, "--termination-log=" + log,
			"--exit-file=" + filepath.Join(dir, report.FileExit), "--", "sh", "-c", c.script, dir})
		if code != c.want {
			t.Errorf("%q: exit code %d, want %d", c.script, code, c.want)
		}
		if got, ok := report.ReadExit(dir); !ok || got != c.want {
			t.Errorf("%q: ReadExit = %d, %v; want %d, true", c.script, got, ok, c.want)
		}
	}
	if _, err := os.Stat(log); !os.IsNotExist(err) {
		t.Errorf("a node pod's wrapper wrote a termination message (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, report.FileExit+".tmp")); !os.IsNotExist(err) {
		t.Errorf("the temporary exit file is left (%v)", err)
	}
}

func TestReadExit(t *testing.T) {
	for _, c := range []struct {
		name   string
		make   func(path string) error
		want   int
		wantOK bool
	}{
		{"none", func(string) error { return nil }, 0, false},
		{"code", func(p string) error { return os.WriteFile(p, []byte("0\n"), 0o644) }, 0, true},
		{"failure", func(p string) error { return os.WriteFile(p, []byte("137\n"), 0o644) }, 137, true},
		{"half written", func(p string) error { return os.WriteFile(p, nil, 0o644) }, 0, false},
		{"not a number", func(p string) error { return os.WriteFile(p, []byte("ok"), 0o644) }, 0, false},
		{"too large", func(p string) error { return os.WriteFile(p, []byte("0                  \n"), 0o644) }, 0, false},
		{"symlink", func(p string) error {
			target := filepath.Join(filepath.Dir(p), "zero")
			if err := os.WriteFile(target, []byte("0"), 0o644); err != nil {
				return err
			}
			return os.Symlink(target, p)
		}, 0, false},
		{"directory", func(p string) error { return os.Mkdir(p, 0o755) }, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := c.make(filepath.Join(dir, report.FileExit)); err != nil {
				t.Fatal(err)
			}
			if got, ok := report.ReadExit(dir); got != c.want || ok != c.wantOK {
				t.Errorf("ReadExit = %d, %v; want %d, %v", got, ok, c.want, c.wantOK)
			}
		})
	}
}

// A controller-side pod's wrapper copies a successful report, the one in the
// termination log, to the ended file the node plugin relays; a failure is
// not copied (its status says why), and ReadEnded takes only a readable
// report from a regular file.
func TestCommandExecEndedFile(t *testing.T) {
	for _, c := range []struct {
		script string
		code   int
		copied bool
	}{
		{`printf h-1 > "$0"/handle`, 0, true},
		{`printf h-2 > "$0"/handle; exit 3`, 3, false},
		{`ln -s /etc/passwd "$0"/.pav-ended`, 0, true}, // replaced by the copy
	} {
		dir := t.TempDir()
		log := filepath.Join(t.TempDir(), "termination-log")
		ended := filepath.Join(dir, report.FileEnded)
		code := report.Command(context.Background(), []string{"--exec", "--dir=" + dir, "--termination-log=" + log,
			"--ended-file=" + ended, "--", "sh", "-c", c.script, dir})
		if code != c.code {
			t.Errorf("%q: exit code %d, want %d", c.script, code, c.code)
		}
		msg, ok := report.ReadEnded(dir)
		want, _ := os.ReadFile(log)
		switch {
		case ok != c.copied:
			t.Errorf("%q: ReadEnded = %q, %v; want a copy: %v", c.script, msg, ok, c.copied)
		case ok && msg != string(want):
			t.Errorf("%q: copy %q, termination log %q", c.script, msg, want)
		}
	}
	for _, c := range []struct {
		name string
		make func(path string) error
	}{
		{"a symlink", func(p string) error { return os.Symlink("/etc/hostname", p) }},
		{"a directory", func(p string) error { return os.Mkdir(p, 0o755) }},
		{"a FIFO", func(p string) error { return syscall.Mkfifo(p, 0o644) }},
		{"not a report", func(p string) error { return os.WriteFile(p, []byte("done"), 0o644) }},
		{"a report with a problem", func(p string) error { return os.WriteFile(p, []byte(`{"reportProblem":"x"}`), 0o644) }},
		{"too large", func(p string) error { return os.WriteFile(p, make([]byte, report.MaxMessage+1), 0o644) }},
	} {
		dir := t.TempDir()
		if err := c.make(filepath.Join(dir, report.FileEnded)); err != nil {
			t.Fatal(err)
		}
		if msg, ok := report.ReadEnded(dir); ok {
			t.Errorf("%s: ReadEnded = %q, true", c.name, msg)
		}
	}
}
