package podrunner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/report"
)

// Node pods (staging, unstaging, node expansion: Operation.HostPath set) have
// no report sidecar. Their /pav is a directory of the node plugin's own state
// directory, which the node plugin reads itself: the files once the pod has
// finished, /pav/ready through inotify while a KeepRunning pod runs. A native
// sidecar costs the kubelet one more relist before the user's containers start
// (it starts them only once it has seen the sidecar running) and one more after
// they end (the sidecar is stopped, then its exit must be seen), about a second
// each with the kubelet's 1 s PLEG period, on the path of every client pod that
// waits for its volume to be staged.
//
// With Config.Report = ReportExec, a node pod whose caller discards it
// (Operation.EndAtExit: staging) and whose one container states its command is
// wrapped like a controller-side pod, but pav-report then writes no report: it
// writes the command's exit code to /pav/.pav-exit as the command ends
// (report.ExecNode). The node plugin sees that file through inotify, so a
// staging pod that runs to completion is done when its command is, not a
// relist (up to 1 s) and a status update later. A failure still waits for the
// pod's status, which says why. The image volume is of the pav image, which
// every node with a node plugin has. Pods whose caller waits for them to go
// (unstaging, node expansion) are not wrapped: deleting a pod whose end the
// kubelet has not published yet takes it longer (a graceful deletion's round
// trip, about 2 s here) than publishing the end (a relist) and deleting the
// finished pod, which the API server does at once.
//
// What a pod leaves there is input: the files are opened without following
// symlinks and must be regular (report.Read, the rules of the sidecar's report), and a new pod's outcome must
// not be read from an earlier pod's files, which ClearHostReport removes.

// clearedFiles are the files ClearHostReport removes: the reported ones, the
// readiness signal and a wrapped command's exit code (with its temporary file).
var clearedFiles = append(append([]string{}, report.Files...), report.FileReady, report.FileExit, report.FileExit+".tmp")

// ClearHostReport removes, from the host directory dir of a node pod's /pav,
// what an earlier pod (of another phase, or an earlier attempt) left there as
// its outcome: handle, capacity, topology, error, ready and .pav-exit. Call it before a
// new pod runs there (a new token), never before adopting one, whose files are
// its outcome. A directory or anything else that cannot be removed is an
// error: the new pod's outcome could not be told from the old one's.
func ClearHostReport(dir string) error {
	for _, name := range clearedFiles {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing /pav/%s, left by an earlier pod, before the next pod runs: %w", name, err)
		}
	}
	return nil
}

// hostReady reports whether a node pod has signalled ready: dir/ready exists,
// whatever it is (the sidecar's probe asked the same inside the pod).
func hostReady(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, report.FileReady))
	return err == nil
}

// readyPollPeriod is how often a KeepRunning node pod's /pav/ready is looked
// for when inotify is not available (the limit of watches reached): the
// period of the readiness probe the report sidecar used to run.
const readyPollPeriod = time.Second

// watchHostDir calls poke whenever dir/ready or dir/.pav-exit (a wrapped
// command's exit code) may have appeared, until the returned stop is called.
// It watches dir with inotify; if that fails, it logs why and pokes every
// readyPollPeriod instead.
func watchHostDir(ctx context.Context, dir string, poke func()) (stop func()) {
	logger := klog.FromContext(ctx)
	done := make(chan struct{})
	// The kubelet creates a missing host directory (DirectoryOrCreate); make
	// it first so that it can be watched from the start.
	err := os.MkdirAll(dir, 0o750)
	var w *fsnotify.Watcher
	if err == nil {
		w, err = fsnotify.NewWatcher()
	}
	if err == nil {
		if err = w.Add(dir); err != nil {
			_ = w.Close()
		}
	}
	if err != nil {
		logger.Info("Cannot watch the pod's /pav for its ready and exit files; looking every second instead", "dir", dir, "err", err.Error())
		quit := make(chan struct{})
		go func() {
			defer close(done)
			t := time.NewTicker(readyPollPeriod)
			defer t.Stop()
			for {
				select {
				case <-quit:
					return
				case <-t.C:
					poke()
				}
			}
		}()
		return func() { close(quit); <-done }
	}
	go func() {
		defer close(done)
		for {
			select {
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if n := filepath.Base(ev.Name); n == report.FileReady || n == report.FileExit {
					poke()
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				// An overflow may have dropped the event: look again.
				logger.V(2).Info("Watching the pod's /pav", "dir", dir, "err", err.Error())
				poke()
			}
		}
	}()
	return func() { _ = w.Close(); <-done }
}
