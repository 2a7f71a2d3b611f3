//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// lbData reads and writes a marker on a loop-block claim in a client pod: a file in a
// Filesystem volume, the sector at 1 MiB of a Block one.
type lbData struct {
	mode corev1.PersistentVolumeMode
}

func (d lbData) write(claim, s string) string {
	if d.mode == corev1.PersistentVolumeBlock {
		return "echo " + s + " | dd of=/dev/" + claim + " bs=512 seek=2048 count=1 conv=sync 2>/dev/null && sync"
	}
	return "echo " + s + " > /data/" + claim + "/file && sync"
}

func (d lbData) read(claim string) string {
	if d.mode == corev1.PersistentVolumeBlock {
		return "dd if=/dev/" + claim + " bs=512 skip=2048 count=1 2>/dev/null | head -n 1"
	}
	return "cat /data/" + claim + "/file"
}

// TestExampleLoopBlockSnapshots: snapshots, restores and clones of examples/loop-block, for
// a Filesystem and a Block volume. A VolumeSnapshot of a volume in use becomes readyToUse
// with the handle "<snapshot name>.<node>" and a copy of the backing file beside it; data
// written afterwards is not in it. A claim restored from it (bigger than the snapshot)
// holds the snapshot's data at its own size; a clone of the volume holds the volume's
// current data, and writing to the clone leaves the original alone. Deleting everything
// leaves no PavVolume or PavSnapshot record, no pod, and no file on the node.
func TestExampleLoopBlockSnapshots(t *testing.T) {
	inLane(t, laneSelf) // its own namespace, classes and volumes only
	start := time.Now()
	requireSnapshotCRDs(t)
	waitExample(t, "loop-block")
	requireSidecar(t, "loop-block", "snapshotter")
	e := newEnv(t)
	node := nodeName(t)
	sc := e.exampleSC("loop-block", nil, storagev1.VolumeBindingImmediate, node)
	vsc := e.snapshotClass("loop-block")

	for _, mode := range []corev1.PersistentVolumeMode{corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeBlock} {
		t.Run(string(mode), func(t *testing.T) {
			e := e.in(t)
			d := lbData{mode}
			m := strings.ToLower(string(mode))
			src, restored, clone, snap := "src-"+m, "restored-"+m, "clone-"+m, "snap-"+m
			const size, restoredSize = 32 << 20, 48 << 20

			e.claim(src, sc, claimOpts{size: "32Mi", mode: mode})
			srcPV := e.waitBound(src)
			srcHandle := srcPV.Spec.CSI.VolumeHandle
			files := []string{filepath.Join(loopBlockDir, srcHandle+".img")}

			// The snapshot is cut while a client has the volume staged and in use.
			original, changed := "original-"+e.ns, "changed-"+e.ns
			e.clientPod("writer", "trap 'exit 0' TERM; sleep 3600 & wait", src)
			e.waitPodRunning("writer")
			e.exec("writer", d.write(src, original))
			e.volumeSnapshot(snap, vsc, src)
			ready := e.waitSnapshotReady(snap)
			snapName := "snapshot-" + ready.uid
			if ready.handle != snapName+"."+node {
				t.Fatalf("snapshot handle %q, want %q (<snapshot name>.<node>)", ready.handle, snapName+"."+node)
			}
			if ready.restoreSize != size {
				t.Fatalf("restoreSize %d, want the volume's %d", ready.restoreSize, size)
			}
			snapFile := filepath.Join(loopBlockDir, "snapshots", ready.handle+".img")
			if st, err := os.Stat(snapFile); err != nil || st.Size() != size {
				t.Fatalf("snapshot file %s: %v (%v), want %d bytes", snapFile, err, st, size)
			}
			// Written after the snapshot: in the volume (and its clone), not in the snapshot.
			e.exec("writer", d.write(src, changed))
			e.deletePod("writer")
			e.waitUnstaged("loop-block", srcHandle)

			// Restore, into a bigger claim.
			e.sourcedClaim(restored, sc, claimOpts{size: "48Mi", mode: mode}, snapshotSource(snap))
			restoredPV := e.waitBound(restored)
			files = append(files, filepath.Join(loopBlockDir, restoredPV.Spec.CSI.VolumeHandle+".img"))
			if got := restoredPV.Spec.Capacity[corev1.ResourceStorage]; got.Value() != restoredSize {
				t.Fatalf("restored PV capacity %s, want 48Mi", got.String())
			}
			sizeScript := "blockdev --getsize64 /dev/" + restored
			if mode == corev1.PersistentVolumeFilesystem {
				sizeScript = "df -kP /data/" + restored
			}
			out := e.runClient("restore-reader", d.read(restored)+" && "+sizeScript, restored)
			e.deletePod("restore-reader")
			if !strings.HasPrefix(out, original+"\n") {
				t.Fatalf("the restored volume holds %q, want the snapshot's %q", out, original)
			}
			rest := strings.TrimPrefix(out, original+"\n")
			if mode == corev1.PersistentVolumeBlock && rest != fmt.Sprintf("%d\n", restoredSize) {
				t.Fatalf("the restored device is %q bytes, want %d", rest, restoredSize)
			}
			if mode == corev1.PersistentVolumeFilesystem {
				// Grown past the snapshot's 32 MiB by the creation pod's resize2fs.
				if kib := dfTotal(t, rest); kib <= size>>10 || kib > restoredSize>>10 {
					t.Fatalf("the restored file system has %d KiB, want more than 32 MiB and at most 48 MiB", kib)
				}
			}

			// Clone the volume, then write to the clone: the original keeps its data.
			e.sourcedClaim(clone, sc, claimOpts{size: "32Mi", mode: mode}, claimSource(src))
			clonePV := e.waitBound(clone)
			files = append(files, filepath.Join(loopBlockDir, clonePV.Spec.CSI.VolumeHandle+".img"))
			if out := e.runClient("clone-reader", d.read(clone), clone); out != changed+"\n" {
				t.Fatalf("the clone holds %q, want the volume's %q", out, changed)
			}
			e.deletePod("clone-reader")
			cloneOnly := "clone-only-" + e.ns
			e.runClient("clone-writer", d.write(clone, cloneOnly), clone)
			e.deletePod("clone-writer")
			if out := e.runClient("readers", d.read(src)+" && "+d.read(clone), src, clone); out != changed+"\n"+cloneOnly+"\n" {
				t.Fatalf("original and clone hold %q, want %q then %q", out, changed, cloneOnly)
			}
			e.deletePod("readers")

			// Everything deleted: nothing of it is left.
			e.deleteSnapshot(snap, ready.content)
			for _, c := range []string{src, restored, clone} {
				e.deleteClaim(c)
			}
			pvs := []string{srcPV.Name, restoredPV.Name, clonePV.Name}
			for _, pv := range pvs {
				e.waitPVGone(pv)
			}
			handles := []string{srcHandle, restoredPV.Spec.CSI.VolumeHandle, clonePV.Spec.CSI.VolumeHandle, ready.handle}
			e.poll("no PavVolume, PavSnapshot or pod left", func() (bool, error) {
				for _, pv := range pvs {
					if v, err := record(e.ctx, pv); v != nil || err != nil {
						return false, fmt.Errorf("PavVolume %s left (%v)", v1alpha1.VolumeRecordName(pv), err)
					}
				}
				recs, err := pavSnapshotRecords(e.ctx, []string{snapName}, []string{srcHandle})
				if err != nil || len(recs) > 0 {
					return false, fmt.Errorf("PavSnapshots left: %v (%v)", recs, err)
				}
				if pods := providerPodsOf(e.ctx, "loop-block", append(append([]string{snapName}, pvs...), handles...)); len(pods) > 0 {
					return false, fmt.Errorf("pods left: %v", pods)
				}
				return true, nil
			})
			for _, f := range append(files, snapFile) {
				for _, f := range []string{f, f + ".part"} {
					if _, err := os.Stat(f); !os.IsNotExist(err) {
						t.Errorf("%s still on the node after deletion: %v", f, err)
					}
				}
			}
		})
	}
	t.Logf("TestExampleLoopBlockSnapshots took %v", time.Since(start).Round(time.Second))
}
