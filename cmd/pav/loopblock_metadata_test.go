package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/report"
)

// loop-block's snapshotMetadata pod, run for real on sparse files: the
// allocated ranges of a snapshot and the blocks changed since another, from
// a starting offset, as pav reads them (phase.ParseBlocks).
func TestLoopBlockSnapshotMetadata(t *testing.T) {
	needTools(t, "perl", "cp", "truncate")
	ctx := context.Background()
	p := loopBlock(t)
	s := newSandbox(t)
	dir := filepath.Join(s.files, "snapshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A 64 MiB volume with data at 40 KiB (two blocks' worth, not aligned)
	// and at 8 MiB; snapshot 1; then a byte changed inside the first
	// written range, a new block at 32 MiB, and the volume grown to 80 MiB
	// with data at 70 MiB; snapshot 2.
	vol := filepath.Join(s.files, lbHandle+".img")
	must(t, os.WriteFile(vol, nil, 0o644))
	must(t, os.Truncate(vol, 64*mib))
	writeAt(t, vol, 40<<10+100, randomBytes(t, 5000))
	writeAt(t, vol, 8*mib, randomBytes(t, 4096))
	snap1, snap2 := "snapshot-1.node-1", "snapshot-2.node-1"
	copySparse(t, vol, filepath.Join(dir, snap1+".img"))
	writeAt(t, vol, 40<<10+5000, []byte{0xff})
	writeAt(t, vol, 32*mib, randomBytes(t, 4096))
	must(t, os.Truncate(vol, 80*mib))
	writeAt(t, vol, 70*mib+1, randomBytes(t, 10))
	copySparse(t, vol, filepath.Join(dir, snap2+".img"))

	ev := phase.NewEvaluator(offlinePVCs{})
	list := func(target, base string, capacity, from int64) []phase.BlockRange {
		t.Helper()
		sp := &v1alpha1.PavSnapshotSpec{SnapshotName: "x", Volume: v1alpha1.SnapshotSourceVolume{Handle: lbHandle, Capacity: capacity, VolumeMode: "Block"}}
		var b *phase.MetadataSnapshot
		if base != "" {
			b = &phase.MetadataSnapshot{Spec: sp, Handle: base, Capacity: 64 * mib}
		}
		vars, err := phase.SnapshotMetadataVars(&phase.MetadataSnapshot{Spec: sp, Handle: target, Capacity: capacity}, b, from)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := ev.SnapshotMetadata(ctx, p, vars)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.PodTemplate.Spec.NodeName != "node-1" {
			t.Fatalf("the pod runs on %q, want the snapshots' node-1", cfg.PodTemplate.Spec.NodeName)
		}
		if err := s.run(t, cfg.PodTemplate); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(s.pav, "error")); err == nil {
			t.Errorf("/pav/error left after a success: %s", s.pavFile(t, "error"))
		}
		b2, err := os.ReadFile(filepath.Join(s.pav, report.FileBlocks))
		if err != nil {
			t.Fatal(err)
		}
		r, err := phase.ParseBlocks(string(b2), capacity)
		if err != nil {
			t.Fatalf("pav refuses the list: %v\n%s", err, b2)
		}
		return r
	}
	str := func(r []phase.BlockRange) string {
		var out []string
		for _, x := range r {
			out = append(out, fmt.Sprintf("%d+%d", x.Offset, x.Length))
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		name, target, base string
		capacity, from     int64
		want               string
	}{
		// The data segments, in the file system's 4 KiB blocks.
		{"allocated, snapshot 1", snap1, "", 64 * mib, 0, "40960+8192 8388608+4096"},
		{"allocated, snapshot 2", snap2, "", 80 * mib, 0, "40960+8192 8388608+4096 33554432+4096 73400320+4096"},
		{"allocated from an offset", snap2, "", 80 * mib, 8*mib + 1, "8388608+4096 33554432+4096 73400320+4096"},
		// The changed 4 KiB blocks: the byte at 45960 (block 45056), 32 MiB, 70 MiB;
		// the unchanged block at 8 MiB is not listed.
		{"changed", snap2, snap1, 80 * mib, 0, "45056+4096 33554432+4096 73400320+4096"},
		{"changed from an offset", snap2, snap1, 80 * mib, 32 * mib, "33554432+4096 73400320+4096"},
		{"nothing changed", snap1, snap1, 64 * mib, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := str(list(tc.target, tc.base, tc.capacity, tc.from)); got != tc.want {
				t.Errorf("ranges %q, want %q", got, tc.want)
			}
		})
	}
	// A snapshot whose file is not on this node: a clear error.
	sp := &v1alpha1.PavSnapshotSpec{Volume: v1alpha1.SnapshotSourceVolume{Handle: lbHandle, Capacity: mib}}
	vars, err := phase.SnapshotMetadataVars(&phase.MetadataSnapshot{Spec: sp, Handle: "gone.node-1", Capacity: mib}, nil, 0)
	must(t, err)
	cfg, err := ev.SnapshotMetadata(ctx, p, vars)
	must(t, err)
	if err := s.run(t, cfg.PodTemplate); err == nil || !strings.Contains(err.Error(), "no snapshot file") {
		t.Errorf("error %v, want no snapshot file", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		if b[i] == 0 {
			b[i] = 1 // no zero block: a sparse copy would punch it
		}
	}
	return b
}

func writeAt(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	must(t, err)
	defer f.Close()
	_, err = f.WriteAt(b, off)
	must(t, err)
}

// copySparse is the snapshotCreation pod's copy.
func copySparse(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "--sparse=always", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
}
