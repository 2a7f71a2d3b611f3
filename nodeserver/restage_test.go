package nodeserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/internal/provisioner"
)

// tmpfsStaging is a KeepRunning staging pod that mounts a tmpfs at
// /pav/volume (a FUSE daemon would mount its file system) and writes which
// staging it is; the unstaging pod unmounts it.
func tmpfsStaging(gen *atomic.Int32) map[v1alpha1.Phase]podAction {
	return map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: func(dir string) error {
			v := filepath.Join(dir, "volume")
			if err := os.MkdirAll(v, 0o755); err != nil {
				return err
			}
			if err := unix.Mount("tmpfs", v, "tmpfs", 0, "size=1m"); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(v, "staging"), []byte(fmt.Sprint(gen.Add(1))), 0o644)
		}},
		v1alpha1.PhaseUnstaging: {onStart: func(dir string) error { return hostmount.Unmount(filepath.Join(dir, "volume")) }},
	}
}

// publish calls NodePublishVolume as kubelet does: ABORTED (another operation
// holds the volume, such as the staging-loss check that a pod event starts in
// the background) is retried, for up to 10 s; any other answer is returned.
func (e *env) publish(req *csi.NodeStageVolumeRequest, target string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := e.srv.NodePublishVolume(e.ctx, &csi.NodePublishVolumeRequest{VolumeId: req.VolumeId, StagingTargetPath: req.StagingTargetPath,
			TargetPath: target, VolumeCapability: req.VolumeCapability, VolumeContext: req.VolumeContext})
		if status.Code(err) != codes.Aborted || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *env) unpublish(handle string, targets ...string) {
	e.t.Helper()
	for _, target := range targets {
		if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: handle, TargetPath: target}); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) unstage(req *csi.NodeStageVolumeRequest) {
	e.t.Helper()
	if _, err := e.srv.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: req.VolumeId, StagingTargetPath: req.StagingTargetPath}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := os.Stat(e.srv.volumeDir(req.VolumeId)); !os.IsNotExist(err) {
		e.t.Fatalf("volume directory left behind: %v", err)
	}
}

// condition decodes the VolumeCondition (field 2, CSI 1.9) pav puts in a
// NodeGetVolumeStatsResponse, as kubelet reads it.
func condition(t testing.TB, resp *csi.NodeGetVolumeStatsResponse) (abnormal bool, message string) {
	t.Helper()
	b := resp.ProtoReflect().GetUnknown()
	num, typ, n := protowire.ConsumeTag(b)
	if num != 2 || typ != protowire.BytesType || n < 0 {
		t.Fatalf("no VolumeCondition (field 2) in the response: %x", b)
	}
	cond, m := protowire.ConsumeBytes(b[n:])
	if m < 0 || n+m != len(b) {
		t.Fatalf("malformed field 2: %x", b)
	}
	found := false
	for len(cond) > 0 {
		num, typ, n := protowire.ConsumeTag(cond)
		cond = cond[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(cond)
			abnormal, found, cond = protowire.DecodeBool(v), true, cond[n:]
		case num == 2 && typ == protowire.BytesType:
			s, n := protowire.ConsumeString(cond)
			message, cond = s, cond[n:]
		default:
			t.Fatalf("unexpected field %d in VolumeCondition", num)
		}
	}
	if !found {
		t.Fatal("VolumeCondition without abnormal")
	}
	return abnormal, message
}

func (e *env) stats(handle, target string) (bool, string) {
	e.t.Helper()
	resp, err := e.srv.NodeGetVolumeStats(e.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: handle, VolumePath: target})
	if err != nil {
		e.t.Fatalf("NodeGetVolumeStats: %v", err)
	}
	return condition(e.t, resp)
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCapabilities(t *testing.T) {
	resp, err := (&Server{}).NodeGetCapabilities(context.Background(), &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	have := map[csi.NodeServiceCapability_RPC_Type]bool{}
	for _, c := range resp.Capabilities {
		have[c.GetRpc().GetType()] = true
	}
	for _, want := range []csi.NodeServiceCapability_RPC_Type{csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS, 4 /* VOLUME_CONDITION, CSI ≤ 1.12 */, csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH} {
		if !have[want] {
			t.Errorf("capability %d not advertised", want)
		}
	}
}

// TestStagingPodDiesUnderLiveClient: a KeepRunning staging pod deleted while a
// client uses the volume is reported at once (one event per death, also
// across a restart), the volume's condition turns abnormal, and the next
// client pod on the node gets the volume staged again in NodePublishVolume
// (kubelet does not call NodeStage again while a pod uses the volume).
func TestStagingPodDiesUnderLiveClient(t *testing.T) {
	var gen atomic.Int32
	e := newEnv(t, stagingSpec+unstagingSpec, tmpfsStaging(&gen))
	req := e.stageReq("vol-live", false)
	req.VolumeContext = e.dynamicVolume("vol-live", corev1.PersistentVolumeFilesystem)
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	a, b := filepath.Join(e.dir, "target", "a"), filepath.Join(e.dir, "target", "b")
	if err := e.publish(req, a); err != nil {
		t.Fatal(err)
	}
	if abnormal, msg := e.stats("vol-live", a); abnormal {
		t.Fatalf("a healthy volume is abnormal: %s", msg)
	}
	st, _ := readState(e.srv.volumeDir("vol-live"))
	if !st.KeepRunning || st.StagingPod == nil || st.StagingPod.UID == "" || st.Volume == nil || !st.Volume.MountRoot || st.BootID == "" {
		t.Fatalf("state.json lacks what verifying needs: %+v", st)
	}

	// Someone deletes the staging pod.
	if err := e.client.CoreV1().Pods(st.StagingPod.Namespace).Delete(e.ctx, st.StagingPod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ev := e.waitEvent(10*time.Second, "Warning "+ReasonStagingLost, st.StagingPod.String(), "vol-live", "node-1")
	t.Logf("event: %s", ev)
	abnormal, msg := e.stats("vol-live", a)
	if !abnormal || !strings.Contains(msg, "staging pod "+st.StagingPod.String()) {
		t.Fatalf("condition after the staging pod died: abnormal=%v %q", abnormal, msg)
	}
	h, err := e.srv.NodeGetVolumeHealth(e.ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: "vol-live"})
	if err != nil || len(h.VolumeHealth.HealthStatuses) != 1 || h.VolumeHealth.HealthStatuses[0].Status != csi.VolumeHealthErrorType_INACCESSIBLE {
		t.Fatalf("NodeGetVolumeHealth = %v, %v", h, err)
	}
	// The live client keeps what it has.
	if got := readFile(t, filepath.Join(a, "staging")); got != "1" {
		t.Fatalf("client a reads staging %q", got)
	}

	// One event per death: a restarted plugin (relist, sweep) does not repeat it.
	e.srv = e.newServer(e.srv.Source.(provisioner.Static).P)
	time.Sleep(300 * time.Millisecond)
	mustNotHave(t, e.drainEvents(), ReasonStagingLost)

	// A new client pod on the node: NodePublish stages the volume again.
	if err := e.publish(req, b); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(b, "staging")); got != "2" {
		t.Fatalf("client b reads staging %q, want the second staging", got)
	}
	if n, u := e.count(v1alpha1.PhaseStaging), e.count(v1alpha1.PhaseUnstaging); n != 2 || u != 1 {
		t.Fatalf("%d staging and %d unstaging pods, want 2 and 1 (the lost staging is unstaged first)", n, u)
	}
	e.waitEvent(time.Second, "Normal "+ReasonRestaged)
	if abnormal, msg := e.stats("vol-live", b); abnormal {
		t.Fatalf("re-staged volume abnormal: %s", msg)
	}
	if got := readFile(t, filepath.Join(a, "staging")); got != "1" {
		t.Fatalf("client a now reads staging %q", got)
	}
	e.unpublish("vol-live", a, b)
	e.unstage(req)
	if n := e.count(v1alpha1.PhaseUnstaging); n != 2 {
		t.Fatalf("%d unstaging pods, want 2", n)
	}
}

// loopStaging is a Block volume's staging: a loop device over a file in
// /pav, its device node at /pav/volume, and, like a careful provider, the
// device's disk sequence number, so that the unstaging pod only detaches the
// device if it still is the one staging attached.
func loopStaging(t *testing.T) map[v1alpha1.Phase]podAction {
	return map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Succeed}, onStart: func(dir string) error {
			dev, err := fakekubelet.AttachLoop(dir, 1<<20)
			if dev != "" {
				img := filepath.Join(dir, "backing.img")
				t.Cleanup(func() { fakekubelet.DetachFile(img) })
				_ = os.WriteFile(filepath.Join(dir, "loop"), []byte(dev), 0o600)
				_ = os.WriteFile(filepath.Join(dir, "diskseq"), []byte(diskseq(dev)), 0o600)
			}
			return err
		}},
		v1alpha1.PhaseUnstaging: {onStart: func(dir string) error {
			dev, err := os.ReadFile(filepath.Join(dir, "loop"))
			if err != nil {
				return nil
			}
			if seq, _ := os.ReadFile(filepath.Join(dir, "diskseq")); diskseq(string(dev)) != string(seq) {
				return nil // not ours any more
			}
			return exec.Command("losetup", "-d", string(dev)).Run()
		}},
	}
}

func diskseq(dev string) string {
	b, _ := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(dev), "diskseq"))
	return strings.TrimSpace(string(b))
}

// attachDecoy puts another volume's file on a loop device.
func attachDecoy(t *testing.T, dev string) string {
	t.Helper()
	decoy := filepath.Join(t.TempDir(), "other-volume.img")
	if err := os.WriteFile(decoy, []byte("other volume's data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(decoy, 1<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", dev, decoy).CombinedOutput(); err != nil {
		t.Fatalf("losetup %s: %v: %s", dev, err, out)
	}
	t.Cleanup(func() { fakekubelet.DetachFile(decoy) })
	return decoy
}

func detach(t *testing.T, dev string) {
	t.Helper()
	if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d %s: %v: %s", dev, err, out)
	}
}

// TestRestageAfterReboot: after a node reboot (a new boot ID, every mount and
// loop device gone), a staged volume is staged afresh, without the unstaging
// pod (nothing it would undo survived, and device numbers it saved may be
// another volume's now); never is the bare directory, or a device node whose
// minor went to another volume, published.
func TestRestageAfterReboot(t *testing.T) {
	for _, tc := range []struct {
		name  string
		block bool
	}{{"Filesystem mount", false}, {"Block loop device", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var gen atomic.Int32
			actions := tmpfsStaging(&gen)
			if tc.block {
				if _, err := exec.LookPath("losetup"); err != nil {
					t.Skip("needs losetup")
				}
				actions = loopStaging(t)
			}
			e := newEnv(t, stagingSpec+unstagingSpec, actions)
			mode := corev1.PersistentVolumeFilesystem
			if tc.block {
				mode = corev1.PersistentVolumeBlock
			}
			req := e.stageReq("vol-boot", tc.block)
			req.VolumeContext = e.dynamicVolume("vol-boot", mode)
			if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
				t.Fatal(err)
			}
			a := filepath.Join(e.dir, "target", "a")
			if err := e.publish(req, a); err != nil {
				t.Fatal(err)
			}
			dir := e.srv.volumeDir("vol-boot")

			// The reboot: every mount goes, loop devices are detached, and
			// a loop minor the volume had may go to another volume.
			decoy := ""
			var dev string
			if tc.block {
				b, _ := os.ReadFile(filepath.Join(dir, "pav", "loop"))
				dev = string(b)
				detach(t, dev)
			}
			if err := hostmount.UnmountAll(e.dir); err != nil {
				t.Fatal(err)
			}
			if tc.block {
				decoy = attachDecoy(t, dev)
			}
			p := e.srv.Source.(provisioner.Static).P
			e.srv = e.newServer(p)
			e.srv.BootID = "00000000-0000-0000-0000-000000000001"

			// kubelet stages the volume again (it counts it as uncertain
			// after a restart) and publishes it to the restarted pod.
			if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
				t.Fatal(err)
			}
			e.waitEvent(time.Second, "Warning "+ReasonStagingLost, "rebooted")
			if n, u := e.count(v1alpha1.PhaseStaging), e.count(v1alpha1.PhaseUnstaging); n != 2 || u != 0 {
				t.Fatalf("%d staging and %d unstaging pods, want 2 and 0 (no unstaging after a reboot)", n, u)
			}
			b := filepath.Join(e.dir, "target", "b")
			if err := e.publish(req, b); err != nil {
				t.Fatal(err)
			}
			id, err := hostmount.Identify(b)
			if err != nil {
				t.Fatal(err)
			}
			if tc.block {
				if strings.HasSuffix(id.BackingFile, filepath.Base(decoy)) || id.Size != 1<<20 {
					t.Fatalf("published %+v: another volume's device", id)
				}
				if out, _ := exec.Command("losetup", "--noheadings", "--output", "BACK-FILE", dev).Output(); !strings.Contains(string(out), decoy) {
					t.Fatalf("the other volume's loop device was touched: %q", out)
				}
			} else {
				var fs unix.Statfs_t
				if err := unix.Statfs(b, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
					t.Fatalf("published a bare directory, not the staging's mount (statfs type %x, %v)", fs.Type, err)
				}
				if got := readFile(t, filepath.Join(b, "staging")); got != "2" {
					t.Fatalf("client reads staging %q", got)
				}
			}
			e.unpublish("vol-boot", b)
			e.unstage(req)
			if u := e.count(v1alpha1.PhaseUnstaging); u != 1 {
				t.Fatalf("%d unstaging pods after the final unstage, want 1", u)
			}
		})
	}
}

// TestStaleLoopDeviceNeverPublished: without a reboot, the loop device of a
// Block volume was detached and its minor given to another volume's file; a
// new client must get the volume's own device (the volume is staged again;
// the careful unstaging pod leaves the other volume's device alone).
func TestStaleLoopDeviceNeverPublished(t *testing.T) {
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("needs losetup")
	}
	e := newEnv(t, stagingSpec+unstagingSpec, loopStaging(t))
	req := e.stageReq("vol-loop", true)
	req.VolumeContext = e.dynamicVolume("vol-loop", corev1.PersistentVolumeBlock)
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(e.srv.volumeDir("vol-loop"), "pav", "loop"))
	dev := string(b)
	detach(t, dev)
	decoy := attachDecoy(t, dev)

	a := filepath.Join(e.dir, "target", "a")
	if err := e.publish(req, a); err != nil {
		t.Fatal(err)
	}
	id, err := hostmount.Identify(a)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(id.BackingFile, filepath.Base(decoy)) {
		t.Fatalf("published the other volume's device: %+v", id)
	}
	e.waitEvent(time.Second, "Warning "+ReasonStagingLost, "detached or attached again")
	if out, _ := exec.Command("losetup", "--noheadings", "--output", "BACK-FILE", dev).Output(); !strings.Contains(string(out), decoy) {
		t.Fatalf("the other volume's loop device was detached: %q", out)
	}
	if n, u := e.count(v1alpha1.PhaseStaging), e.count(v1alpha1.PhaseUnstaging); n != 2 || u != 1 {
		t.Fatalf("%d staging and %d unstaging pods, want 2 and 1", n, u)
	}
	e.unpublish("vol-loop", a)
	e.unstage(req)
}

// TestStageFinality: kubelet never calls NodeUnstageVolume after a final
// NodeStageVolume error, so a final code only comes once nothing of the
// staging is left on the node; otherwise the code is non-final, and
// NodeUnstageVolume then cleans everything up.
func TestStageFinality(t *testing.T) {
	badTemplate := "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Mi}\n  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: \"{{ nope }}\"}]}}}\n"
	failing := podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Fail, Files: map[string]string{"error": "backend down"}}}
	for _, tc := range []struct {
		name       string
		spec       string
		actions    map[v1alpha1.Phase]podAction
		foreign    bool          // a pod pav did not create holds the staging pod's name
		timeout    time.Duration // the CSI call's deadline
		retrySpec  string        // the provisioner changes before kubelet's retry
		wantCode   codes.Code
		wantLeft   bool // the volume's directory is left (for NodeUnstage)
		wantInMsg  string
		wantUnstag int
	}{
		{name: "template error before anything", spec: badTemplate, wantCode: codes.InvalidArgument, wantInMsg: "nope"},
		{name: "staging pod fails, unstaging cleans up", spec: stagingSpec + unstagingSpec,
			actions:  map[v1alpha1.Phase]podAction{v1alpha1.PhaseStaging: failing},
			wantCode: codes.Internal, wantInMsg: "backend down", wantUnstag: 1},
		{name: "staging and unstaging pods fail", spec: stagingSpec + unstagingSpec,
			actions:  map[v1alpha1.Phase]podAction{v1alpha1.PhaseStaging: failing, v1alpha1.PhaseUnstaging: failing},
			wantCode: codes.Aborted, wantLeft: true, wantInMsg: "undoing it failed too", wantUnstag: 1},
		{name: "foreign pod holds the name", spec: stagingSpec + unstagingSpec, foreign: true,
			wantCode: codes.FailedPrecondition, wantInMsg: "pav did not create"},
		{name: "deadline while the pod starts", spec: stagingSpec + unstagingSpec, timeout: 200 * time.Millisecond,
			actions:  map[v1alpha1.Phase]podAction{v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Hang}}},
			wantCode: codes.DeadlineExceeded, wantLeft: true, wantUnstag: 1},
		{name: "template broken on a retry while a staging pod exists", spec: stagingSpec + unstagingSpec, timeout: 200 * time.Millisecond,
			actions:   map[v1alpha1.Phase]podAction{v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Hang}}},
			retrySpec: badTemplate + unstagingSpec, wantCode: codes.Aborted, wantLeft: true, wantInMsg: "nope", wantUnstag: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.spec, tc.actions)
			req := e.stageReq("vol-f", false)
			op := PodOperation(node, e.srv.StateDir, "test", v1alpha1.PhaseStaging, "vol-f", corev1.PodTemplateSpec{})
			if tc.foreign {
				e.add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: op.PodName(), Namespace: "pav"}})
			}
			ctx := e.ctx
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(e.ctx, tc.timeout)
				defer cancel()
			}
			_, err := e.srv.NodeStageVolume(ctx, req)
			if tc.retrySpec != "" {
				p, lerr := provisioner.Load([]byte("metadata: {name: test}\nspec:\n" + tc.retrySpec))
				if lerr != nil {
					t.Fatal(lerr)
				}
				e.srv.Source = provisioner.Static{P: p}
				_, err = e.srv.NodeStageVolume(e.ctx, req)
			}
			code := status.Code(err)
			if code != tc.wantCode || !strings.Contains(err.Error(), tc.wantInMsg) {
				t.Fatalf("error %v, want %v containing %q", err, tc.wantCode, tc.wantInMsg)
			}
			_, serr := os.Stat(e.srv.volumeDir("vol-f"))
			if left := serr == nil; left != tc.wantLeft {
				t.Fatalf("volume directory left: %v, want %v", left, tc.wantLeft)
			}
			if !nonFinal(code) && serr == nil {
				t.Fatalf("a final %v with the staging's directory left: kubelet would never unstage it", code)
			}
			if tc.foreign {
				if _, err := e.client.CoreV1().Pods("pav").Get(e.ctx, op.PodName(), metav1.GetOptions{}); err != nil {
					t.Fatalf("the foreign pod was deleted: %v", err)
				}
				return
			}
			if tc.wantLeft {
				// kubelet: uncertain, so NodeUnstage comes; it cleans up.
				p, _ := provisioner.Load([]byte("metadata: {name: test}\nspec:\n" + tc.spec))
				e.srv.Source = provisioner.Static{P: p}
				e.setAction(v1alpha1.PhaseUnstaging, podAction{})
				e.unstage(req)
			}
			if n := e.count(v1alpha1.PhaseUnstaging); n < tc.wantUnstag {
				t.Fatalf("%d unstaging pods, want %d", n, tc.wantUnstag)
			}
			if pods, _ := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
				t.Fatalf("%d pods left", len(pods.Items))
			}
		})
	}
}

// TestReportLostLeavesTheVolumeFree: the staging pods' events (a completed pod's
// deletion, a live one's changes) do not take the volume unless there is a loss
// to report, so that a NodeStageVolume or NodeUnstageVolume made at that moment
// is not refused with Aborted (it once was, in make test on a loaded machine).
func TestReportLostLeavesTheVolumeFree(t *testing.T) {
	srv := &Server{NodeID: "node-1", StateDir: t.TempDir()}
	live := &podID{Namespace: "pav", Name: "p", UID: "u-1"}
	for _, tc := range []struct {
		name string
		st   *staged
	}{
		{"no state", nil},
		{"completed staging pod", &staged{Handle: "v", Staged: true, StagingPod: &podID{Namespace: "pav", Name: "p", UID: "u-1", Deleting: true}}},
		{"live staging pod, still serving", &staged{Handle: "v", Staged: true, KeepRunning: true, StagingPod: live}},
		{"loss reported already", &staged{Handle: "v", Staged: true, KeepRunning: true, StagingPod: live, LostReported: "u-1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := srv.volumeDir("v")
			_ = os.RemoveAll(dir)
			if tc.st != nil {
				if err := os.MkdirAll(dir, 0o750); err != nil {
					t.Fatal(err)
				}
				if err := writeState(dir, tc.st); err != nil {
					t.Fatal(err)
				}
			}
			srv.reportLost("v", func(*staged) string {
				release, ok := srv.busy.TryAcquire("v")
				if !ok {
					t.Error("the volume was taken before knowing there is a loss to report")
				}
				release()
				return ""
			})
			release, ok := srv.busy.TryAcquire("v")
			if !ok {
				t.Fatal("the volume is still taken")
			}
			release()
		})
	}
}
