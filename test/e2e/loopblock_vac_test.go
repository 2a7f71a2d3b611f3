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
)

// TestExampleLoopBlockReadAhead: a VolumeAttributesClass change reaches a mounted volume.
// examples/loop-block's readAheadKiB is the read-ahead of the volume's loop device. A Block
// claim created with a class has it recorded beside its file before any pod uses it, a
// Filesystem claim without one has the default; a client stages both, and their loop
// devices read ahead by that much. Both claims then change class under the running client:
// csi-resizer's ControllerModifyVolume runs the modification pod on the volume's node,
// which sets the read-ahead of the same, live devices (read_ahead_kb in the node's sysfs)
// while the ext4 stays mounted, and records it; staged again by a new client, the volumes
// keep it. Deleting the claims removes the files and the records.
func TestExampleLoopBlockReadAhead(t *testing.T) {
	inLane(t, laneSelf)
	start := time.Now()
	waitExample(t, "loop-block")
	requireSidecar(t, "loop-block", "resizer")
	e := newEnv(t)
	// Immediate, on node 1 (this machine): the claims bind before a pod uses them, and
	// their files are where the test reads them.
	sc := e.exampleSC("loop-block", nil, storagev1.VolumeBindingImmediate, hostNode())
	fast := e.vac("fast", "loop-block", map[string]string{"readAheadKiB": "512"})
	faster := e.vac("faster", "loop-block", map[string]string{"readAheadKiB": "2048"})

	e.classClaim("disk", sc, fast, claimOpts{size: "16Mi", mode: corev1.PersistentVolumeBlock})
	e.claim("fs", sc, claimOpts{size: "32Mi"})
	pvs := map[string]*corev1.PersistentVolume{"disk": e.waitBound("disk"), "fs": e.waitBound("fs")}
	e.waitClass("disk", fast)
	file := func(claim string) string {
		return filepath.Join(loopBlockDir, pvs[claim].Spec.CSI.VolumeHandle+".img")
	}
	recorded := func(claim string) string {
		t.Helper()
		b, err := os.ReadFile(strings.TrimSuffix(file(claim), ".img") + ".readahead")
		if err != nil {
			t.Fatalf("the read-ahead recorded beside %s: %v", file(claim), err)
		}
		return strings.TrimSpace(string(b))
	}
	if d, f := recorded("disk"), recorded("fs"); d != "512" || f != "128" {
		t.Fatalf("created: recorded read-ahead %s KiB (disk, class %s) and %s KiB (fs, no class); want 512 and 128", d, fast, f)
	}
	if v := e.recordOf(pvs["disk"]); v.Spec.MutableParams["readAheadKiB"] != "512" {
		t.Fatalf("disk's record: spec.mutableParams %v", v.Spec.MutableParams)
	}
	// device is the one loop device of a claim's file on this node.
	device := func(claim string) string {
		t.Helper()
		devs := loopDevicesOf(t, file(claim))
		if len(devs) != 1 {
			t.Fatalf("%s's file %s has loop devices %v, want one", claim, file(claim), devs)
		}
		return devs[0]
	}
	wantReadAhead := func(claim, dev string, kib int) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", "read_ahead_kb"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(b)); got != fmt.Sprint(kib) {
			t.Fatalf("%s's loop device %s reads ahead %s KiB, want %d", claim, dev, got, kib)
		}
	}

	e.clientPod("client", "trap 'exit 0' TERM; sleep 3600 & wait", "fs", "disk")
	e.waitPodRunning("client")
	marker := "pav-loop-block-readahead-" + e.ns
	e.exec("client", "echo "+marker+" > /data/fs/file && sync")
	diskDev, fsDev := device("disk"), device("fs")
	wantReadAhead("disk", diskDev, 512)
	wantReadAhead("fs", fsDev, 128)

	// Both change class while the client uses them.
	e.setClass("disk", faster)
	e.setClass("fs", fast)
	e.waitClass("disk", faster)
	e.waitClass("fs", fast)
	if d, f := device("disk"), device("fs"); d != diskDev || f != fsDev {
		t.Fatalf("the loop devices changed (%s, %s; were %s, %s): the volumes were staged again, not modified live", d, f, diskDev, fsDev)
	}
	wantReadAhead("disk", diskDev, 2048)
	wantReadAhead("fs", fsDev, 512)
	if d, f := recorded("disk"), recorded("fs"); d != "2048" || f != "512" {
		t.Fatalf("recorded read-ahead %s and %s KiB after the change, want 2048 and 512", d, f)
	}
	if got := e.exec("client", "cat /data/fs/file"); got != marker+"\n" {
		t.Fatalf("the client read %q from its mounted volume after the change, want %q", got, marker)
	}
	if v := e.recordOf(pvs["fs"]); v.Status.MutableParams["readAheadKiB"] != "512" || v.Spec.MutableParams != nil {
		t.Fatalf("fs's record after the change: spec %v, status %v", v.Spec.MutableParams, v.Status.MutableParams)
	}
	for _, c := range []string{"disk", "fs"} {
		if ps := pavPods("loop-block", "modification", pvs[c].Name); len(ps) != 0 {
			t.Fatalf("modification pod %s/%s left", ps[0].Namespace, ps[0].Name)
		}
	}

	// Staged again, by another client: the volumes keep their read-ahead.
	e.deletePod("client")
	for _, c := range []string{"disk", "fs"} {
		e.waitUnstaged("loop-block", pvs[c].Spec.CSI.VolumeHandle)
		if devs := loopDevicesOf(t, file(c)); len(devs) != 0 {
			t.Fatalf("%s's loop devices %v left after unstaging", c, devs)
		}
	}
	e.clientPod("client2", "trap 'exit 0' TERM; sleep 3600 & wait", "fs", "disk")
	e.waitPodRunning("client2")
	wantReadAhead("disk", device("disk"), 2048)
	wantReadAhead("fs", device("fs"), 512)
	if got := e.exec("client2", "cat /data/fs/file"); got != marker+"\n" {
		t.Fatalf("the second client read %q, want %q", got, marker)
	}

	e.deletePod("client2")
	e.deleteClaim("disk")
	e.deleteClaim("fs")
	for _, c := range []string{"disk", "fs"} {
		e.waitPVGone(pvs[c].Name)
		for _, f := range []string{file(c), strings.TrimSuffix(file(c), ".img") + ".readahead"} {
			if _, err := os.Stat(f); !os.IsNotExist(err) {
				t.Fatalf("%s still there after deletion: %v", f, err)
			}
		}
	}
	t.Logf("TestExampleLoopBlockReadAhead took %v", time.Since(start).Round(time.Second))
}
