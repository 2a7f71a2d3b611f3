//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/pods-as-volumes/pav/internal/docscheck"
)

// blockTimeout bounds one README block: its own `kubectl wait`s say 3 minutes
// at most, and a cleanup may wait for a volume's deletion pod after a client's
// grace period.
const blockTimeout = 10 * time.Minute

// readmeNeeds are what a block may need of the node (<!-- pav:run needs=NAME -->):
// whether the node has it, and what it lacks when not.
var readmeNeeds = map[string]func() (bool, string){
	"device-mapper": func() (bool, string) { return dmAvailable(), "the kernel lists no device-mapper in /proc/misc" },
}

// TestExampleREADMEs runs, as written, the shell blocks each example's README
// marks as runnable (docs/development.md says how), so that a reader who
// copies them gets what the README promises. The README's cleanup blocks run
// first (a make demo, or an earlier run, may have left the same objects) and
// again at the end, last first; then every pod, claim and PersistentVolume of
// the default namespace that the blocks made must be gone.
func TestExampleREADMEs(t *testing.T) {
	inLane(t, laneLoopBlock, laneObjectBucket)
	files, err := filepath.Glob(filepath.Join(repo, "examples", "*", "README.md"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no example README: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(filepath.Dir(f)), func(t *testing.T) { runREADME(t, f) })
	}
}

func runREADME(t *testing.T, file string) {
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var runs, cleanups []docscheck.Block
	for _, b := range docscheck.Blocks(string(src)) {
		if b.Code == "" {
			t.Fatalf("a pav:%s marker (before line %d) is not followed by a closed code block", b.Kind, b.Line)
		}
		if b.Kind == "file" {
			continue // a file quoted as it is: internal/docscheck checks it
		}
		for k, v := range b.Attrs {
			if _, known := readmeNeeds[v]; k != "needs" || !known {
				t.Fatalf("line %d: unknown marker attribute %s=%s", b.Line, k, v)
			}
		}
		switch b.Kind {
		case "run":
			runs = append(runs, b)
		case "cleanup":
			cleanups = append(cleanups, b)
		default:
			t.Fatalf("line %d: unknown marker pav:%s", b.Line, b.Kind)
		}
	}
	if len(runs) == 0 {
		t.Fatal("no <!-- pav:run --> block: mark the commands of \"Use it\" so that they are tested")
	}

	ctx := context.Background()
	before := objectsOfREADMEs(t, ctx)
	cleanup := func(report func(string, ...any)) {
		for i := len(cleanups) - 1; i >= 0; i-- {
			if err := runBlock(t, cleanups[i]); err != nil {
				report("cleanup block at line %d: %v", cleanups[i].Line, err)
			}
		}
	}
	cleanup(t.Fatalf)
	t.Cleanup(func() {
		cleanup(t.Errorf)
		var left []string
		err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			left = sets.List(objectsOfREADMEs(t, ctx).Difference(before))
			return len(left) == 0, nil
		})
		if err != nil {
			t.Errorf("the cleanup blocks left %v", left)
		}
	})

	for _, b := range runs {
		if need := b.Attrs["needs"]; need != "" {
			if ok, lack := readmeNeeds[need](); !ok {
				t.Logf("block at line %d not run: it needs %s, and on this node %s", b.Line, need, lack)
				continue
			}
		}
		if err := runBlock(t, b); err != nil {
			t.Fatalf("block at line %d: %v", b.Line, err)
		}
	}
}

// runBlock runs a block's code with bash from the repository's root, with the
// cluster's kubectl first on the PATH, and logs what it did. It stops at the
// first command that fails.
func runBlock(t *testing.T, b docscheck.Block) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-x", "-o", "pipefail", "-c", b.Code)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig,
		"PATH="+filepath.Join(repo, "_output", "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
	// The block's commands (kubectl wait, sh -c loops) are bash's children: a
	// timeout kills them all, not only bash.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s block at line %d (%v):\n%s", b.Kind, b.Line, time.Since(start).Round(100*time.Millisecond), strings.TrimRight(out.String(), "\n"))
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// objectsOfREADMEs are what the examples' READMEs make and must leave nothing
// of: the default namespace's pods, claims and their PersistentVolumes (other
// namespaces are other tests', which may run meanwhile).
func objectsOfREADMEs(t *testing.T, ctx context.Context) sets.Set[string] {
	t.Helper()
	out := sets.New[string]()
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		if ref := pv.Spec.ClaimRef; ref == nil || ref.Namespace == corev1.NamespaceDefault {
			out.Insert("PersistentVolume " + pv.Name)
		}
	}
	pods, err := client.CoreV1().Pods(corev1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		out.Insert("pod default/" + p.Name)
	}
	pvcs, err := client.CoreV1().PersistentVolumeClaims(corev1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range pvcs.Items {
		out.Insert("PersistentVolumeClaim default/" + c.Name)
	}
	return out
}
