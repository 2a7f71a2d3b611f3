//go:build e2e

package e2e

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// shell is a long-lived sh in a pod (kubectl exec -i), which runs one script at a time
// and returns its output: a round trip of milliseconds, where an exec per step takes a
// tenth of a second or more.
type shell struct {
	pod string
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// shellEnd marks the end of a script's output, followed by its exit status.
const shellEnd = "__pav_e2e_end__"

func (e *env) shell(pod string) *shell {
	e.t.Helper()
	cmd := kubectlCmd("exec", "-i", "-n", e.ns, pod, "--", "sh")
	in, err := cmd.StdinPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	s := &shell{pod: pod, cmd: cmd, in: in, out: bufio.NewReader(out)}
	e.t.Cleanup(func() {
		_ = s.in.Close()
		done := make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
		}
	})
	if out, err := s.run("echo ready", time.Minute); err != nil || out != "ready\n" {
		e.t.Fatalf("shell in %s: %q, %v", pod, out, err)
	}
	return s
}

// run runs script (its stderr joined to its stdout) and returns what it printed; a
// non-zero exit status is an error. Past within, the shell is killed: a file system that
// hangs must not hang the test.
func (s *shell) run(script string, within time.Duration) (string, error) {
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		if _, err := fmt.Fprintf(s.in, "{ %s\n} 2>&1; printf '\\n%s %%d\\n' $?\n", script, shellEnd); err != nil {
			done <- result{err: err}
			return
		}
		var b strings.Builder
		for {
			line, err := s.out.ReadString('\n')
			if err != nil {
				done <- result{b.String(), fmt.Errorf("shell in %s: %v", s.pod, err)}
				return
			}
			if rest, ok := strings.CutPrefix(line, shellEnd+" "); ok {
				out := strings.TrimSuffix(b.String(), "\n") // the newline printf put before the marker
				if code := strings.TrimSpace(rest); code != "0" {
					done <- result{out, fmt.Errorf("exit status %s", code)}
					return
				}
				done <- result{out, nil}
				return
			}
			b.WriteString(line)
		}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-time.After(within):
		_ = s.cmd.Process.Kill()
		return "", fmt.Errorf("shell in %s: no answer within %v to %q", s.pod, within, script)
	}
}

// renameIterations is how many times TestObjectBucketRenameAcrossNodes saves the file:
// PAV_E2E_RENAME_ITERATIONS, default 1000.
func renameIterations(t *testing.T) int {
	n := 1000
	if s := os.Getenv("PAV_E2E_RENAME_ITERATIONS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 2 {
			t.Fatalf("PAV_E2E_RENAME_ITERATIONS=%q: want a number >= 2", s)
		}
		n = v
	}
	return n
}

// savedContent is what TestObjectBucketRenameAcrossNodes saves at iteration i: its number
// and 1 to 13 letters, so that sizes vary, as a saved file's do.
func savedContent(i int) string {
	return fmt.Sprintf("%d %s", i, strings.Repeat(string(rune('a'+i%26)), 1+i%13))
}

// TestObjectBucketRenameAcrossNodes: the "atomic save" of editors and dump tools (write a
// temporary file, close it, rename it over the file) on one node, then a read of the file
// on another, many times, the two nodes taking turns (skipped on fewer than 3 nodes). With
// stock rclone it read older content 997 times in 1,000, lost saves and failed renames with
// EIO (examples/object-bucket/README.md). PAV_E2E_RENAME_LOGS=1 adds the staging pods' rclone
// logs to the first failures' diagnosis.
func TestObjectBucketRenameAcrossNodes(t *testing.T) {
	inLane(t, laneObjectBucket)
	start := time.Now()
	nodes := clusterNodes(t, 3)[:2]
	e, params := objectBucketEnv(t)
	e.waitDriverOnNodes("object-bucket", nodes)
	sc := e.exampleSC("object-bucket", params, storagev1.VolumeBindingImmediate)
	e.claim("rename", sc, claimOpts{size: "1Gi", access: corev1.ReadWriteMany})
	pv := e.waitBound("rename")
	pods := []string{"rename-a", "rename-b"}
	for i, n := range nodes {
		e.podOn(pods[i], n, "exec sleep 3600", podOpts{}, "rename")
	}
	for _, p := range pods {
		e.waitPodRunning(p)
	}
	sh := []*shell{e.shell(pods[0]), e.shell(pods[1])}
	const dir = "/data/rename"
	if _, err := sh[0].run("printf start > "+dir+"/file", time.Minute); err != nil {
		t.Fatal(err)
	}

	n := renameIterations(t)
	var stale, failedSaves []string
	loop := time.Now()
	for i := 0; i < n; i++ {
		w, r := sh[i%2], sh[1-i%2]
		want := savedContent(i)
		if out, err := w.run(fmt.Sprintf("printf %%s '%s' > %s/file.tmp && mv %s/file.tmp %s/file", want, dir, dir, dir), time.Minute); err != nil {
			failedSaves = append(failedSaves, fmt.Sprintf("iteration %d: saving on %s: %v: %s", i, w.pod, err, out))
			continue
		}
		got, err := r.run("cat "+dir+"/file", time.Minute)
		if err == nil && got == want {
			continue
		}
		msg := fmt.Sprintf("iteration %d: %s read %q (%v) right after %s saved %q", i, r.pod, got, err, w.pod, want)
		stale = append(stale, msg)
		if len(stale) > 3 {
			continue
		}
		// Diagnosis of the first few: what the reader and the writer read a moment later,
		// and what the bucket holds.
		time.Sleep(time.Second)
		later, lerr := r.run("cat "+dir+"/file; echo; ls -la "+dir, time.Minute)
		wr, werr := w.run("cat "+dir+"/file; echo; ls -la "+dir, time.Minute)
		bucket := s3(t, "rclone lsl "+s3path(pv.Spec.CSI.VolumeHandle)+"; rclone cat "+s3path(pv.Spec.CSI.VolumeHandle+"/file"))
		msg += fmt.Sprintf("; a second later the reader read %q (%v), the writer %q (%v); the bucket:\n%s", later, lerr, wr, werr, bucket)
		if os.Getenv("PAV_E2E_RENAME_LOGS") != "" {
			for _, sp := range pavPods("object-bucket", "staging", pv.Spec.CSI.VolumeHandle+"@") {
				out, _ := kubectlCmd("exec", "-n", sp.Namespace, sp.Name, "--", "sh", "-c", "tail -n 150 /tmp/rclone.log").CombinedOutput()
				msg += fmt.Sprintf("\n--- rclone log on %s:\n%s", sp.Spec.NodeName, out)
			}
		}
		t.Log(msg)
	}
	took := time.Since(loop)
	t.Logf("%d saves and reads across nodes %s and %s in %v (%v each): %d failed saves, %d stale reads", n, nodes[0], nodes[1],
		took.Round(time.Millisecond), (took / time.Duration(n)).Round(time.Microsecond), len(failedSaves), len(stale))
	if len(failedSaves) > 0 {
		t.Errorf("%d of %d saves failed; the first: %s", len(failedSaves), n, failedSaves[0])
	}
	if len(stale) > 0 {
		t.Errorf("%d of %d reads right after a save on the other node did not read what was saved; the first: %s", len(stale), n, stale[0])
	}
	// The bucket holds the last save, and no temporary file: a save that a rename overtook
	// used to leave its data under the temporary name, or nowhere.
	last := savedContent(n - 1)
	bucket := pv.Spec.CSI.VolumeHandle
	if got := s3(t, "rclone lsf "+s3path(bucket)+"; rclone cat "+s3path(bucket+"/file")); got != "file\n"+last {
		t.Errorf("the bucket lists and holds %q, want only file, with %q", got, last)
	}

	for _, p := range pods {
		e.deletePod(p)
	}
	for _, n := range nodes {
		e.waitUnstagedOn("object-bucket", pv, n)
	}
	e.deleteClaim("rename")
	e.waitPVGone(pv.Name)
	t.Logf("TestObjectBucketRenameAcrossNodes took %v", time.Since(start).Round(time.Second))
}
