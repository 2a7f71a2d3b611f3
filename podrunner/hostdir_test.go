package podrunner_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/report"
	"github.com/pods-as-volumes/pav/podrunner"
)

// A node pod has no report sidecar: its readiness is the file /pav/ready on
// the host, which no pod status announces. Here the pod is Running before the
// file exists and nothing about the pod changes afterwards: Run must still
// see the file appear.
func TestNodePodReadyWithoutPodEvent(t *testing.T) {
	hostDir := filepath.Join(t.TempDir(), "vol-r")
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Run}), envOpts{
		cfg: func(c *podrunner.Config) { c.NodeName = "node-a" },
	})
	op := stagingOp("vol-r", "node-a", hostDir)
	type outcome struct {
		res *podrunner.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := e.runner.Run(e.ctx, op)
		done <- outcome{res, err}
	}()
	e.waitPod(op, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	select {
	case o := <-done:
		t.Fatalf("Run returned before /pav/ready existed: %+v, %v", o.res, o.err)
	default:
	}
	if err := os.WriteFile(filepath.Join(hostDir, report.FileReady), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil || !o.res.Running {
		t.Fatalf("res %+v err %v", o.res, o.err)
	}
	e.remove(op)
}

// What a node pod leaves in /pav is read by the node plugin on the host, as
// root: a symlink there must not make it read (and report) a host file.
func TestNodePodFilesReadOnTheHost(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(secret, []byte("root:s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		outcome fakekubelet.Outcome
		link    string // a file of /pav made a symlink to secret
		check   func(t *testing.T, res *podrunner.Result, err error)
	}{
		{"failure: /pav/error read without a sidecar",
			fakekubelet.Outcome{Kind: fakekubelet.Fail, ExitCode: 5, Files: map[string]string{"error": "backend unreachable"}}, "",
			func(t *testing.T, _ *podrunner.Result, err error) {
				if f := mustFail(t, err); f.ErrorFile != "backend unreachable" {
					t.Errorf("error file %q", f.ErrorFile)
				}
			}},
		{"success: files read without a sidecar",
			fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"capacity": "2Gi"}}, "",
			func(t *testing.T, res *podrunner.Result, err error) {
				if err != nil || res.Files["capacity"] != "2Gi" {
					t.Errorf("res %+v err %v", res, err)
				}
			}},
		{"a symlinked handle fails the pod, unread",
			fakekubelet.Outcome{Kind: fakekubelet.Succeed}, "handle",
			func(t *testing.T, _ *podrunner.Result, err error) {
				f := mustFail(t, err)
				if f.Reason != podrunner.ReasonInvalidReport || !strings.Contains(f.Message, "not a regular file") {
					t.Errorf("failure %+v", f)
				}
			}},
		{"a symlinked error is not read",
			fakekubelet.Outcome{Kind: fakekubelet.Fail, ExitCode: 1}, "error",
			func(t *testing.T, _ *podrunner.Result, err error) {
				if f := mustFail(t, err); f.ErrorFile != "" {
					t.Errorf("error file %q", f.ErrorFile)
				}
			}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			link := c.link
			e := newEnv(t, always(c.outcome), envOpts{
				cfg: func(cfg *podrunner.Config) { cfg.NodeName = "node-a" },
				kubelet: fakekubelet.Options{OnStart: func(_ *corev1.Pod, dir string) error {
					if link == "" {
						return nil
					}
					return os.Symlink(secret, filepath.Join(dir, link))
				}},
			})
			op := stagingOp("vol-f"+string(rune('a'+i)), "node-a", filepath.Join(t.TempDir(), "pav"))
			res, err := e.runner.Run(e.ctx, op)
			if err != nil && strings.Contains(err.Error(), "s3cr3t") {
				t.Fatalf("a host file reached the outcome: %v", err)
			}
			c.check(t, res, err)
			e.remove(op)
		})
	}
}

func TestClearHostReport(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"handle", "capacity", "topology", "error", "ready", "volume", "notes"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := podrunner.ClearHostReport(dir); err != nil {
		t.Fatal(err)
	}
	left, _ := os.ReadDir(dir)
	var names []string
	for _, d := range left {
		names = append(names, d.Name())
	}
	// The pod's own files (the staged volume among them) stay.
	if strings.Join(names, ",") != "notes,volume" {
		t.Errorf("left %v", names)
	}
	if err := podrunner.ClearHostReport(dir); err != nil {
		t.Errorf("nothing to clear: %v", err)
	}
	// What cannot be removed is an error naming it, not an outcome mixed up.
	if err := os.MkdirAll(filepath.Join(dir, "error", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := podrunner.ClearHostReport(dir); err == nil || !strings.Contains(err.Error(), "/pav/error") {
		t.Errorf("err %v", err)
	}
}
