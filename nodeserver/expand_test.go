package nodeserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/internal/provisioner"
)

// nodeExpansionSpec's pod shows its context in its command.
const nodeExpansionSpec = "  volumeExpansion: {}\n  volumeNodeExpansion: {podTemplate: {spec: {containers: [{name: g, image: b, command: [grow, \"{{ handle }}\", \"{{ volumeMode }}\", \"{{ previousCapacity }}\", \"{{ capacity }}\", \"{{ params.color }}\"]}]}}}\n"

func expandNodeReq(handle string, required, limit int64) *csi.NodeExpandVolumeRequest {
	return &csi.NodeExpandVolumeRequest{VolumeId: handle, VolumePath: "/var/lib/kubelet/pods/x/volumes/" + handle,
		CapacityRange: &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit}}
}

// nodeExpansionCommand is the command of the node expansion pods run so far
// (the last one).
func (e *env) nodeExpansionCommand() string {
	e.t.Helper()
	pods, err := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Labels["pav.albertofaria.github.io/phase"] == string(v1alpha1.PhaseNodeExpansion) {
			return strings.Join(p.Spec.Containers[0].Command, " ")
		}
	}
	return ""
}

func TestNodeExpandVolume(t *testing.T) {
	const mi = int64(1 << 20)
	// sawStaging: the node expansion pod gets the staging pod's /pav (it
	// finds the volume staging made there).
	sawStaging := func(dir string) error {
		if _, err := os.Stat(filepath.Join(dir, "volume", "data")); err != nil {
			return fmt.Errorf("the node expansion pod does not see the staged volume: %w", err)
		}
		return nil
	}
	for _, tc := range []struct {
		name      string
		spec      string
		stage     bool
		req       *csi.NodeExpandVolumeRequest
		expansion podAction
		wantCode  codes.Code
		wantMsg   string
		wantCap   int64 // the answer's and state.json's capacity
		wantPods  int
	}{
		{name: "grows in a pod on the staging's /pav, with the staging context", spec: nodeExpansionSpec, stage: true,
			req: expandNodeReq("vol-1", 3*mi, 0), expansion: podAction{onStart: sawStaging}, wantCap: 3 * mi, wantPods: 1},
		{name: "already that large: no pod", spec: nodeExpansionSpec, stage: true,
			req: expandNodeReq("vol-1", mi, 0), wantCap: mi},
		{name: "smaller: no pod", spec: nodeExpansionSpec, stage: true,
			req: expandNodeReq("vol-1", mi/2, 0), wantCap: mi},
		{name: "pod fails: its failure, the capacity unchanged", spec: nodeExpansionSpec, stage: true,
			req:       expandNodeReq("vol-1", 3*mi, 0),
			expansion: podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Fail, Files: map[string]string{"error": "resize2fs: no space"}}},
			wantCode:  codes.Internal, wantMsg: "resize2fs: no space", wantCap: mi, wantPods: 1},
		{name: "limit below the capacity", spec: nodeExpansionSpec, stage: true,
			req: expandNodeReq("vol-1", mi/4, mi/2), wantCode: codes.OutOfRange, wantMsg: "volumes never shrink", wantCap: mi},
		{name: "not staged here", spec: nodeExpansionSpec,
			req: expandNodeReq("vol-1", 3*mi, 0), wantCode: codes.NotFound, wantMsg: "not staged on node node-1"},
		{name: "no volume path", spec: nodeExpansionSpec, stage: true,
			req: &csi.NodeExpandVolumeRequest{VolumeId: "vol-1", CapacityRange: &csi.CapacityRange{RequiredBytes: 3 * mi}}, wantCode: codes.InvalidArgument, wantMsg: "volume path is required", wantCap: mi},
		{name: "no volume id", spec: nodeExpansionSpec, stage: true,
			req: &csi.NodeExpandVolumeRequest{VolumePath: "/p"}, wantCode: codes.InvalidArgument, wantMsg: "volume id is required", wantCap: mi},
		{name: "no capacity", spec: nodeExpansionSpec, stage: true,
			req: &csi.NodeExpandVolumeRequest{VolumeId: "vol-1", VolumePath: "/p"}, wantCode: codes.InvalidArgument, wantMsg: "capacity_range.required_bytes is required", wantCap: mi},
		{name: "no volumeNodeExpansion", spec: "", stage: true,
			req: expandNodeReq("vol-1", 3*mi, 0), wantCode: codes.FailedPrecondition, wantMsg: "has no spec.volumeNodeExpansion", wantCap: mi},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, stagingSpec+unstagingSpec+tc.spec, map[v1alpha1.Phase]podAction{
				v1alpha1.PhaseStaging:       {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("hello")},
				v1alpha1.PhaseNodeExpansion: tc.expansion,
			})
			if tc.stage {
				if _, err := e.srv.NodeStageVolume(e.ctx, e.stageReq("vol-1", false)); err != nil {
					t.Fatal(err)
				}
			}
			resp, err := e.srv.NodeExpandVolume(e.ctx, tc.req)
			if status.Code(err) != tc.wantCode || tc.wantMsg != "" && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("error = %v, want %v %q", err, tc.wantCode, tc.wantMsg)
			}
			if err == nil && resp.CapacityBytes != tc.wantCap {
				t.Fatalf("capacity %d, want %d", resp.CapacityBytes, tc.wantCap)
			}
			if n := e.count(v1alpha1.PhaseNodeExpansion); n != tc.wantPods {
				t.Fatalf("%d node expansion pods, want %d", n, tc.wantPods)
			}
			if !tc.stage {
				return
			}
			st, err := readState(e.srv.volumeDir("vol-1"))
			if err != nil || st.Capacity != tc.wantCap || st.NodeExpansion != nil || st.NodeExpansionPod != nil {
				t.Fatalf("state %+v, %v; want capacity %d, no expansion", st, err, tc.wantCap)
			}
			if got := e.nodeExpansionCommand(); got != "" {
				t.Fatalf("node expansion pod left: %s", got)
			}
			// Still staged as it was: the staging verifies.
			if why, err := e.srv.verify(e.srv.volumeDir("vol-1"), st); why != "" || err != nil {
				t.Fatalf("the staging no longer holds after the expansion: %q, %v", why, err)
			}
		})
	}
}

// TestNodeExpansionContext: the pod sees the staging context with the new
// capacity, and previousCapacity.
func TestNodeExpansionContext(t *testing.T) {
	release := make(chan struct{})
	e := newEnv(t, stagingSpec+nodeExpansionSpec, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging:       {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("x")},
		v1alpha1.PhaseNodeExpansion: {onStart: func(string) error { <-release; return nil }},
	})
	if _, err := e.srv.NodeStageVolume(e.ctx, e.stageReq("vol-1", false)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := e.srv.NodeExpandVolume(ctx, expandNodeReq("vol-1", 3<<20, 0)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v", err)
	}
	if got, want := e.nodeExpansionCommand(), "grow vol-1 Filesystem 1048576 3145728 blue"; got != want {
		t.Fatalf("command %q, want %q", got, want)
	}
	close(release)
	if _, err := e.srv.NodeExpandVolume(e.ctx, expandNodeReq("vol-1", 3<<20, 0)); err != nil {
		t.Fatal(err)
	}
}

// TestNodeExpandRetries: a call that times out while its pod runs, or that
// ends (a restart) after the pod succeeded and before the outcome was
// recorded: the retry, by a restarted node plugin, adopts the same pod.
// Unstaging while a growth is under way removes its pod.
func TestNodeExpandRetries(t *testing.T) {
	for _, tc := range []struct {
		name string
		// finish: the pod finishes (Succeeded) before the retry comes.
		finish  bool
		unstage bool
	}{
		{name: "pod still running: the retry adopts it"},
		{name: "pod succeeded, outcome not recorded: the retry adopts it and records it", finish: true},
		{name: "unstaging while the growth runs removes its pod", unstage: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			e := newEnv(t, stagingSpec+unstagingSpec+nodeExpansionSpec, map[v1alpha1.Phase]podAction{
				v1alpha1.PhaseStaging:       {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("x")},
				v1alpha1.PhaseNodeExpansion: {onStart: func(string) error { <-release; return nil }},
			})
			req := e.stageReq("vol-1", false)
			if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
			defer cancel()
			if _, err := e.srv.NodeExpandVolume(ctx, expandNodeReq("vol-1", 3<<20, 0)); status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("first call: %v, want DeadlineExceeded", err)
			}
			st, _ := readState(e.srv.volumeDir("vol-1"))
			if st.NodeExpansion == nil || st.NodeExpansion.Capacity != 3<<20 || st.NodeExpansionPod == nil || st.NodeExpansionPod.UID == "" {
				t.Fatalf("the growth and its pod must be recorded: %+v", st)
			}
			srv := e.newServer(e.srv.Source.(provisioner.Static).P)
			if tc.unstage {
				close(release)
				if _, err := srv.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: req.StagingTargetPath}); err != nil {
					t.Fatal(err)
				}
				if pods, _ := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
					t.Fatalf("%d pods left after unstaging", len(pods.Items))
				}
				return
			}
			if tc.finish {
				close(release)
				waitPodPhase(t, e, v1alpha1.PhaseNodeExpansion, corev1.PodSucceeded)
			} else {
				go func() { time.Sleep(100 * time.Millisecond); close(release) }()
			}
			resp, err := srv.NodeExpandVolume(e.ctx, expandNodeReq("vol-1", 3<<20, 0))
			if err != nil || resp.CapacityBytes != 3<<20 {
				t.Fatalf("retry: %v, %v", resp, err)
			}
			if n := e.count(v1alpha1.PhaseNodeExpansion); n != 1 {
				t.Fatalf("%d node expansion pods, want 1 (adopted)", n)
			}
			if st, _ := readState(e.srv.volumeDir("vol-1")); st.Capacity != 3<<20 || st.NodeExpansionPod != nil {
				t.Fatalf("state %+v", st)
			}
			if got := e.nodeExpansionCommand(); got != "" {
				t.Fatalf("node expansion pod left: %s", got)
			}
		})
	}
}

func waitPodPhase(t *testing.T, e *env, ph v1alpha1.Phase, want corev1.PodPhase) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		pods, _ := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{})
		for _, p := range pods.Items {
			if p.Labels["pav.albertofaria.github.io/phase"] == string(ph) && p.Status.Phase == want {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no %s pod reached %s", ph, want)
}

// TestNodeExpandBlock: a Block volume's loop device grown in place is the new
// capacity afterwards, and the staging's verification takes the grown device
// for the one staging made (state.json records its new size): publishing,
// stats and staging again neither restage it nor report it abnormal. A device
// that grows behind pav's back is stale; one the pod did not grow, or
// replaced, fails the growth.
func TestNodeExpandBlock(t *testing.T) {
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("needs losetup")
	}
	const mi = int64(1 << 20)
	replace := func(t *testing.T) func(string) error {
		return func(dir string) error {
			// A new device of the new size where the old one was.
			if err := os.Remove(filepath.Join(dir, "volume")); err != nil {
				return err
			}
			old := filepath.Join(dir, "old.img")
			if err := os.Rename(filepath.Join(dir, "backing.img"), old); err != nil {
				return err
			}
			t.Cleanup(func() { fakekubelet.DetachFile(old) }) // the old device's file has a new name

			return loopVolume(t, 3*mi)(dir)
		}
	}
	for _, tc := range []struct {
		name     string
		grow     func(t *testing.T) func(string) error
		wantMsg  string
		wantSize int64 // of the published device afterwards
		// wantStale: the staging no longer verifies after a failed growth.
		wantStale bool
	}{
		{name: "grown in place", grow: func(*testing.T) func(string) error {
			return func(dir string) error { return fakekubelet.GrowLoop(dir, 3*mi) }
		}, wantSize: 3 * mi},
		{name: "not grown: still the staged volume", grow: func(*testing.T) func(string) error { return nil },
			wantMsg: "block device of 1048576 bytes, but the volume's new capacity is 3145728 bytes", wantSize: mi},
		{name: "grown to another size", grow: func(*testing.T) func(string) error {
			return func(dir string) error { return fakekubelet.GrowLoop(dir, 2*mi) }
		}, wantMsg: "block device of 2097152 bytes, but the volume's new capacity is 3145728 bytes", wantSize: 2 * mi, wantStale: true},
		// (The published device file still names the old device.)
		{name: "replaced by another device", grow: replace, wantMsg: "must grow the volume in place", wantSize: mi, wantStale: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, stagingSpec+nodeExpansionSpec, map[v1alpha1.Phase]podAction{
				v1alpha1.PhaseStaging:       {outcome: fakekubelet.Outcome{Kind: fakekubelet.Succeed}, onStart: loopVolume(t, mi)},
				v1alpha1.PhaseNodeExpansion: {onStart: tc.grow(t)},
			})
			req := e.stageReq("blk", true)
			if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(e.dir, "publish", "dev")
			pub := &csi.NodePublishVolumeRequest{VolumeId: "blk", StagingTargetPath: req.StagingTargetPath, TargetPath: target, VolumeCapability: req.VolumeCapability}
			if _, err := e.srv.NodePublishVolume(e.ctx, pub); err != nil {
				t.Fatal(err)
			}
			_, err := e.srv.NodeExpandVolume(e.ctx, &csi.NodeExpandVolumeRequest{VolumeId: "blk", VolumePath: target,
				CapacityRange: &csi.CapacityRange{RequiredBytes: 3 * mi}})
			if tc.wantMsg != "" {
				if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), tc.wantMsg) {
					t.Fatalf("error = %v, want Internal %q", err, tc.wantMsg)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if size, err := hostmount.BlockSize(target); err != nil || size != tc.wantSize {
				t.Fatalf("published device: %d bytes, %v; want %d", size, err, tc.wantSize)
			}
			dir := e.srv.volumeDir("blk")
			st, _ := readState(dir)
			why, err := e.srv.verify(dir, st)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantMsg != "" {
				// A device that is not what pav recorded is never trusted.
				if (why != "") != tc.wantStale || st.Capacity != mi {
					t.Fatalf("after a failed growth: stale %q (want stale: %v), recorded capacity %d", why, tc.wantStale, st.Capacity)
				}
				if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "blk", TargetPath: target}); err != nil {
					t.Fatal(err)
				}
				return
			}
			if why != "" || st.Capacity != 3*mi || st.Volume.Size != 3*mi {
				t.Fatalf("after the growth: %q; recorded capacity %d, size %d", why, st.Capacity, st.Volume.Size)
			}
			stats, err := e.srv.NodeGetVolumeStats(e.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "blk", VolumePath: target})
			if err != nil || stats.Usage[0].Total != 3*mi {
				t.Fatalf("stats = %v, %v", stats, err)
			}
			if why, _ := e.srv.healthOf(e.ctx, "blk"); why != "" {
				t.Fatalf("condition abnormal after the growth: %s", why)
			}
			second := filepath.Join(e.dir, "publish", "dev2")
			pub.TargetPath = second
			if _, err := e.srv.NodePublishVolume(e.ctx, pub); err != nil {
				t.Fatal(err)
			}
			if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
				t.Fatal(err)
			}
			if n := e.count(v1alpha1.PhaseStaging); n != 1 {
				t.Fatalf("%d staging pods: the grown volume was staged again", n)
			}
			// The control: a growth pav did not make is stale.
			if err := fakekubelet.GrowLoop(filepath.Join(dir, "pav"), 4*mi); err != nil {
				t.Fatal(err)
			}
			if why, _ := e.srv.verify(dir, st); !strings.Contains(why, "is now 4194304 bytes") && !strings.Contains(why, "block device of 4194304 bytes") {
				t.Fatalf("a device grown behind pav's back verifies: %q", why)
			}
			for _, p := range []string{target, second} {
				if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "blk", TargetPath: p}); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestNodeCapabilities(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("newEnv needs root")
	}
	for _, tc := range []struct {
		spec string
		want bool
	}{
		{"", false},
		{"  volumeExpansion: {}\n", false},
		{nodeExpansionSpec, true},
	} {
		e := newEnv(t, stagingSpec+tc.spec, nil)
		resp, err := e.srv.NodeGetCapabilities(e.ctx, &csi.NodeGetCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got := false
		for _, c := range resp.Capabilities {
			got = got || c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_EXPAND_VOLUME
		}
		if got != tc.want {
			t.Errorf("spec %q: EXPAND_VOLUME %v, want %v", tc.spec, got, tc.want)
		}
	}
}

// TestNodeExpandFailureThenRetry: a failed node expansion pod is removed and
// nothing is recorded; the retry runs a new pod.
func TestNodeExpandFailureThenRetry(t *testing.T) {
	e := newEnv(t, stagingSpec+nodeExpansionSpec, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging:       {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("x")},
		v1alpha1.PhaseNodeExpansion: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Fail, Files: map[string]string{"error": "busy"}}},
	})
	if _, err := e.srv.NodeStageVolume(e.ctx, e.stageReq("vol-1", false)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.srv.NodeExpandVolume(e.ctx, expandNodeReq("vol-1", 3<<20, 0)); status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("first call: %v", err)
	}
	e.setAction(v1alpha1.PhaseNodeExpansion, podAction{})
	if resp, err := e.srv.NodeExpandVolume(e.ctx, expandNodeReq("vol-1", 3<<20, 0)); err != nil || resp.CapacityBytes != 3<<20 {
		t.Fatalf("retry: %v, %v", resp, err)
	}
	if n := e.count(v1alpha1.PhaseNodeExpansion); n != 2 {
		t.Fatalf("%d node expansion pods, want 2", n)
	}
	if got := e.nodeExpansionCommand(); got != "" {
		t.Fatalf("node expansion pod left: %s", got)
	}
}
