package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// loop-block's readAheadKiB (volumeModification), its scripts run for real as in
// TestLoopBlockCopiesAndGrowth: the creation pod checks the class's value and records it
// beside the file, staging applies the recorded value to the loop device it attaches
// (blockdev --setra), the modification pod applies a new value to the live device and
// records it, so that staging again keeps it; deletion removes the record. Bad values are
// refused with a /pav/error that says what is wrong, before anything is made or changed.
func TestLoopBlockReadAhead(t *testing.T) {
	needTools(t, "truncate", "stat", "flock", "blockdev", "losetup")
	ctx := context.Background()
	p := loopBlock(t)
	if f, err := phase.FeaturesOf(&p.Spec); err != nil || !f.Modification || strings.Join(f.MutableParameters, ",") != "readAheadKiB" {
		t.Fatalf("loop-block features %+v, %v: want readAheadKiB mutable", f, err)
	}
	ev := phase.NewEvaluator(offlinePVCs{})
	s := newSandbox(t)
	file := filepath.Join(s.files, lbHandle+".img")
	rec := filepath.Join(s.files, lbHandle+".readahead")
	recorded := func() string {
		t.Helper()
		b, err := os.ReadFile(rec)
		if err != nil {
			t.Fatalf("the recorded read-ahead: %v", err)
		}
		return strings.TrimSpace(string(b))
	}
	create := func(mutable map[string]string) error {
		t.Helper()
		pvc := lbClaim(t, corev1.PersistentVolumeBlock, 4*mib)
		r := phase.FromClaim(phase.Request{VolumeMode: corev1.PersistentVolumeBlock, Params: map[string]string{}, MutableParams: mutable}, pvc)
		v, err := phase.CreationVars(r, phase.Objects{PVC: pvc}, "pvc-"+string(pvc.UID))
		if err != nil {
			t.Fatal(err)
		}
		v["requisiteTopology"], v["preferredTopology"], v["selectedNode"] = []any{}, []any{}, nil
		cfg, err := ev.Creation(ctx, p, v)
		if err != nil {
			t.Fatal(err)
		}
		return s.run(t, cfg.PodTemplate)
	}

	// Bad values: refused before anything is made.
	for _, c := range []struct{ value, want string }{
		{"fast", `readAheadKiB of the claim's VolumeAttributesClass is "fast": not a whole number of KiB (0 to 65536)`},
		{"-1", `is "-1": not a whole number`},
		{"", `is "": not a whole number`},
		{"65537", "readAheadKiB of the claim's VolumeAttributesClass is 65537 KiB: out of range (0 to 65536)"},
		{"99999999999999999999", "is 99999999999999999999 KiB: out of range"},
	} {
		err := create(map[string]string{"readAheadKiB": c.value})
		if se, ok := err.(*scriptError); !ok || !strings.Contains(se.pavError, c.want) {
			t.Fatalf("creation with readAheadKiB %q: %v, want /pav/error to say %q", c.value, err, c.want)
		}
		if _, err := os.Stat(file); !os.IsNotExist(err) {
			t.Fatalf("creation with readAheadKiB %q made %s", c.value, file)
		}
	}
	// No class: 128 KiB. Leading zeros are no octal.
	for _, c := range []struct {
		mutable map[string]string
		want    string
	}{{nil, "128"}, {map[string]string{"readAheadKiB": "0512"}, "512"}} {
		if err := create(c.mutable); err != nil {
			t.Fatal(err)
		}
		if got := recorded(); got != c.want {
			t.Fatalf("creation with %v recorded %q, want %q", c.mutable, got, c.want)
		}
	}

	// Staging applies the recorded value, whatever the context says (the record is newer
	// than the class a PV names while a modification is being recorded).
	dev := stageReadAhead(t, ev, s, file, map[string]string{"readAheadKiB": "64"})
	wantReadAhead(t, dev, 512)

	// A modification: the live device and the record.
	modify := func(next, prev map[string]string) error {
		t.Helper()
		v, err := phase.ModificationVars(phase.Request{VolumeMode: corev1.PersistentVolumeBlock, Params: map[string]string{}, MutableParams: prev},
			phase.Objects{}, "pvc-"+lbUID, lbHandle, 4*mib, next)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := ev.Modification(ctx, p, v)
		if err != nil {
			t.Fatal(err)
		}
		if ctr := cfg.PodTemplate.Spec.Containers[0]; !isPrivileged(ctr) || cfg.PodTemplate.Spec.NodeName != "node-1" {
			t.Fatalf("modification pod privileged %v on %q, want privileged on the volume's node-1", isPrivileged(ctr), cfg.PodTemplate.Spec.NodeName)
		}
		return s.run(t, cfg.PodTemplate)
	}
	if err := modify(map[string]string{"readAheadKiB": "2048"}, map[string]string{"readAheadKiB": "512"}); err != nil {
		t.Fatal(err)
	}
	wantReadAhead(t, dev, 2048)
	if got := recorded(); got != "2048" {
		t.Fatalf("recorded %q after the modification, want 2048", got)
	}
	// A bad value changes nothing.
	err := modify(map[string]string{"readAheadKiB": "lots"}, map[string]string{"readAheadKiB": "2048"})
	if se, ok := err.(*scriptError); !ok || !strings.Contains(se.pavError, `is "lots": not a whole number`) {
		t.Fatalf("modification to \"lots\": %v", err)
	}
	wantReadAhead(t, dev, 2048)
	// A class without readAheadKiB: back to 128.
	if err := modify(map[string]string{}, map[string]string{"readAheadKiB": "2048"}); err != nil {
		t.Fatal(err)
	}
	wantReadAhead(t, dev, 128)
	if err := modify(map[string]string{"readAheadKiB": "4096"}, nil); err != nil {
		t.Fatal(err)
	}

	// Unstaged (the device detached) and staged again: the recorded value holds.
	mustRun(t, "losetup", "--detach", dev)
	dev = stageReadAhead(t, ev, s, file, map[string]string{"readAheadKiB": "128"})
	wantReadAhead(t, dev, 4096)
	mustRun(t, "losetup", "--detach", dev)
	// Without a record (a volume older than readAheadKiB): the class's value.
	if err := os.Remove(rec); err != nil {
		t.Fatal(err)
	}
	dev = stageReadAhead(t, ev, s, file, map[string]string{"readAheadKiB": "256"})
	wantReadAhead(t, dev, 256)
	mustRun(t, "losetup", "--detach", dev)
	// A damaged record is refused, naming it.
	if err := os.WriteFile(rec, []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := ev.Staging(ctx, p, stagingVarsRA(t, map[string]string{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.run(t, cfg.PodTemplate); err == nil || !strings.Contains(err.(*scriptError).pavError, "the read-ahead recorded in "+rec+` is "x"`) {
		t.Fatalf("staging with a damaged record: %v", err)
	}

	// Deletion removes the record with the file.
	v, err := phase.DeletionVars(phase.Request{VolumeMode: corev1.PersistentVolumeBlock, Params: map[string]string{}}, phase.Objects{}, "pvc-"+lbUID, lbHandle, 4*mib)
	if err != nil {
		t.Fatal(err)
	}
	del, err := ev.Deletion(ctx, p, v)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.run(t, del.PodTemplate); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{file, rec} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Fatalf("deletion left %s", f)
		}
	}
}

func stagingVarsRA(t *testing.T, mutable map[string]string) templating.Vars {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	v, err := phase.StagingVars(phase.Staged{VolumeMode: corev1.PersistentVolumeBlock, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Capacity: 4 * mib, Params: map[string]string{}, Handle: lbHandle, MutableParams: mutable}, phase.Objects{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// stageReadAhead runs the staging pod's script of a Block volume (root: it attaches a loop
// device) and returns the device it attached.
func stageReadAhead(t *testing.T, ev *phase.Evaluator, s sandbox, file string, mutable map[string]string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("attaches loop devices: needs root (CI runs as root)")
	}
	cfg, err := ev.Staging(context.Background(), loopBlock(t), stagingVarsRA(t, mutable))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		out, _ := exec.Command("losetup", "--noheadings", "--output", "NAME", "--associated", file).Output()
		for _, d := range strings.Fields(string(out)) {
			_ = exec.Command("losetup", "--detach", d).Run()
		}
	})
	if err := s.run(t, cfg.PodTemplate); err != nil {
		t.Fatalf("staging: %v", err)
	}
	devs := strings.Fields(mustRun(t, "losetup", "--noheadings", "--output", "NAME", "--associated", file))
	if len(devs) != 1 {
		t.Fatalf("staging attached %v to %s, want one loop device", devs, file)
	}
	return devs[0]
}

// wantReadAhead checks a device's read-ahead, in KiB, as the kernel has it.
func wantReadAhead(t *testing.T, dev string, kib int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", "read_ahead_kb"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != strconv.Itoa(kib) {
		t.Fatalf("%s: read_ahead_kb %s, want %d", dev, got, kib)
	}
}
