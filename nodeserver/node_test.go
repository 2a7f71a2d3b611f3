package nodeserver

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/controllerserver"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/podrunner"
)

const node = "node-1"

// env holds one node plugin on a fake cluster whose fake kubelet runs the phase
// pods with per-test behaviour, counting pod creations per phase.
type env struct {
	t       testing.TB
	dir     string
	client  *fake.Clientset
	kubelet *fakekubelet.Kubelet
	srv     *Server
	ctx     context.Context
	events  *record.FakeRecorder

	mu      sync.Mutex
	creates map[string]int
	// commands: the command of each phase's last pod (its first container).
	commands map[string]string
	actions  map[v1alpha1.Phase]podAction
	stop     context.CancelFunc // stops the current server's runner
	// records holds the PavVolumes of inline volumes (inline_test.go).
	records *dynamicfake.FakeDynamicClient
}

type podAction struct {
	outcome fakekubelet.Outcome
	onStart func(pavDir string) error
}

func newEnv(t testing.TB, spec string, actions map[v1alpha1.Phase]podAction) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("node server tests make real bind mounts and need root (CI runs as root)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &env{t: t, dir: t.TempDir(), ctx: ctx, creates: map[string]int{}, commands: map[string]string{}, events: record.NewFakeRecorder(1000)}
	e.client = fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	// The fake clientset ignores field selectors; the node plugin lists only
	// its node's pods, and the tests check it reads nothing more.
	e.client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sel := a.(k8stesting.ListAction).GetListRestrictions().Fields
		if sel == nil || sel.Empty() {
			return false, nil, nil
		}
		obj, err := e.client.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		list := obj.(*corev1.PodList)
		kept := list.Items[:0]
		for _, p := range list.Items {
			if sel.Matches(fields.Set{"spec.nodeName": p.Spec.NodeName}) {
				kept = append(kept, p)
			}
		}
		list.Items = kept
		return true, list, nil
	})
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		// Count pods that come into being; a create that meets an existing pod is
		// adoption, not a second pod.
		if _, err := e.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), a.GetNamespace(), pod.Name); err == nil {
			return false, nil, nil
		}
		e.mu.Lock()
		e.creates[pod.Labels[podrunner.LabelPhase]]++
		if c := pod.Spec.Containers; len(c) > 0 {
			e.commands[pod.Labels[podrunner.LabelPhase]] = strings.Join(c[0].Command, " ")
		}
		e.mu.Unlock()
		return false, nil, nil
	})
	e.actions = map[v1alpha1.Phase]podAction{}
	for ph, a := range actions {
		e.actions[ph] = a
	}
	behaviour := func(pod *corev1.Pod) fakekubelet.Outcome {
		return e.action(v1alpha1.Phase(pod.Labels[podrunner.LabelPhase])).outcome
	}
	onStart := func(pod *corev1.Pod, dir string) error {
		if f := e.action(v1alpha1.Phase(pod.Labels[podrunner.LabelPhase])).onStart; f != nil {
			return f(dir)
		}
		return nil
	}
	// A wrapped command's exit code comes before the kubelet publishes its
	// pod's end, as on a real node (its relist).
	e.kubelet = fakekubelet.New(e.client, behaviour, fakekubelet.Options{Node: node, Dir: filepath.Join(e.dir, "pods"), OnStart: onStart,
		StatusLag: 20 * time.Millisecond})
	if err := e.kubelet.Start(ctx); err != nil {
		t.Fatal(err)
	}
	p, err := provisioner.Load([]byte("metadata: {name: test}\nspec:\n" + spec))
	if err != nil {
		t.Fatal(err)
	}
	if err := phase.Check(p); err != nil {
		t.Fatal(err)
	}
	e.srv = e.newServer(p)
	t.Cleanup(func() {
		_ = hostmount.UnmountAll(e.dir)
		cancel()
		e.kubelet.Wait()
	})
	return e
}

// newServer is a fresh node plugin process (a driver restart) on the same
// cluster; the previous one stops.
func (e *env) newServer(p *v1alpha1.PavProvisioner) *Server {
	if e.stop != nil {
		e.stop()
	}
	ctx, stop := context.WithCancel(e.ctx)
	e.stop = stop
	runner := podrunner.New(podrunner.Config{Client: kubetest.Wrap(e.client), Provisioner: p.Name, NodeName: node, ReportImage: "pav:test",
		Report: podrunner.ReportExec, PodTimeout: 20 * time.Second})
	if e.records == nil {
		e.records = recordstest.NewClient()
	}
	eval := phase.NewEvaluator(nil)
	srv := &Server{NodeID: node, StateDir: filepath.Join(e.dir, "state"), Source: provisioner.Static{P: p},
		Eval: eval, Pods: runner, Client: kubetest.Wrap(e.client), Recorder: e.events,
		Inline: &controllerserver.Server{Source: provisioner.Static{P: p}, Eval: eval, Pods: runner, Records: records.NewNodeStore(e.records, p.Name, node)}}
	srv.WatchStagingPods(runner)
	if err := runner.Start(ctx); err != nil {
		e.t.Fatal(err)
	}
	srv.Sweep()
	return srv
}

func (e *env) action(ph v1alpha1.Phase) podAction {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.actions[ph]
}

// setAction changes what the pods of a phase do from now on.
func (e *env) setAction(ph v1alpha1.Phase, a podAction) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.actions[ph] = a
}

func (e *env) count(ph v1alpha1.Phase) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.creates[string(ph)]
}

func (e *env) stageReq(handle string, block bool) *csi.NodeStageVolumeRequest {
	c := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	if block {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	}
	return &csi.NodeStageVolumeRequest{VolumeId: handle, StagingTargetPath: filepath.Join(e.dir, "staging", handle),
		VolumeCapability: c, VolumeContext: map[string]string{"color": "blue", volume.KeyCapacity: "1048576"}}
}

const (
	stagingSpec   = "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Mi}\n  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: b, command: [echo, \"{{ params.color }}\"]}]}}}\n"
	unstagingSpec = "  volumeUnstaging: {podTemplate: {spec: {containers: [{name: u, image: b}]}}}\n"
)

func makeVolumeDir(content string) func(string) error {
	return func(dir string) error {
		if err := os.MkdirAll(filepath.Join(dir, "volume"), 0o755); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, "volume", "data"), []byte(content), 0o644)
	}
}

func TestStageUnstageFilesystem(t *testing.T) {
	var unstagingSawVolume bool
	e := newEnv(t, stagingSpec+unstagingSpec, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("hello")},
		v1alpha1.PhaseUnstaging: {onStart: func(dir string) error {
			_, err := os.Stat(filepath.Join(dir, "volume", "data"))
			unstagingSawVolume = err == nil
			return nil
		}},
	})
	req := e.stageReq("vol-1", false)
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatalf("repeated stage: %v", err)
	}
	if n := e.count(v1alpha1.PhaseStaging); n != 1 {
		t.Fatalf("%d staging pods, want 1", n)
	}
	target := filepath.Join(e.dir, "pods-target", "a")
	pub := &csi.NodePublishVolumeRequest{VolumeId: "vol-1", StagingTargetPath: req.StagingTargetPath, TargetPath: target,
		VolumeCapability: req.VolumeCapability, Readonly: true}
	if _, err := e.srv.NodePublishVolume(e.ctx, pub); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "hello" {
		t.Fatalf("published volume reads %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); err == nil {
		t.Fatal("read-only publish is writable")
	}
	if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-1", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("target path not removed: %v", err)
	}
	if _, err := e.srv.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: req.StagingTargetPath}); err != nil {
		t.Fatal(err)
	}
	if !unstagingSawVolume {
		t.Fatal("the unstaging pod must see the /pav directory the staging pod left")
	}
	if _, err := os.Stat(e.srv.volumeDir("vol-1")); !os.IsNotExist(err) {
		t.Fatalf("volume directory left behind: %v", err)
	}
	pods, _ := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{})
	if len(pods.Items) != 0 {
		t.Fatalf("%d pods left behind", len(pods.Items))
	}
	if _, err := e.srv.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: req.StagingTargetPath}); err != nil {
		t.Fatalf("unstaging an unstaged volume: %v", err)
	}
}

func TestUnstageRemovesStagingPodInItsNamespace(t *testing.T) {
	spec := "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Mi}\n  volumeStaging: {podTemplate: {metadata: {namespace: storage}, spec: {containers: [{name: s, image: b}]}}}\n"
	e := newEnv(t, spec, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("x")},
	})
	req := e.stageReq("vol-ns", false)
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	if pods, _ := e.client.CoreV1().Pods("storage").List(e.ctx, metav1.ListOptions{}); len(pods.Items) != 1 {
		t.Fatalf("%d staging pods in namespace storage, want 1", len(pods.Items))
	}
	if _, err := e.srv.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-ns", StagingTargetPath: req.StagingTargetPath}); err != nil {
		t.Fatal(err)
	}
	if pods, _ := e.client.CoreV1().Pods("storage").List(e.ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Fatalf("staging pod left running in namespace storage")
	}
}

func TestStageFailures(t *testing.T) {
	symlinkOut := func(dir string) error { return os.Symlink("/etc", filepath.Join(dir, "volume")) }
	regularFile := func(dir string) error { return os.WriteFile(filepath.Join(dir, "volume"), nil, 0o644) }
	for _, tc := range []struct {
		name          string
		spec          string
		staging       podAction
		unstaging     podAction
		block         bool
		wantCode      codes.Code
		wantMsg       string
		wantUnstaging int
		// once: said once in the error, as the staging pod's; a second time
		// would blame the unstaging pod with a file it did not write.
		once string
	}{
		{name: "staging pod fails: unstaging pod runs", spec: stagingSpec + unstagingSpec,
			staging:  podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Fail, ExitCode: 3, Files: map[string]string{"error": "mount: permission denied"}}},
			wantCode: codes.Internal, wantMsg: "mount: permission denied", wantUnstaging: 1},
		{name: "staging and unstaging pods fail", spec: stagingSpec + unstagingSpec,
			staging:   podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Fail, Files: map[string]string{"error": "first"}}},
			unstaging: podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Fail, Files: map[string]string{"error": "second"}}},
			wantCode:  codes.Aborted, wantMsg: "undoing it failed too, pav retries: unstaging", wantUnstaging: 1},
		{name: "unstaging pod fails without /pav/error: staging's is not read as its own", spec: stagingSpec + unstagingSpec,
			staging:   podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Fail, Files: map[string]string{"error": "first"}}},
			unstaging: podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Fail, ExitCode: 7}},
			wantCode:  codes.Aborted, wantMsg: `exited with code 7`, wantUnstaging: 1, once: "/pav/error: first"},
		{name: "image pull failure fails fast", spec: stagingSpec,
			staging:  podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.ImagePullError, Reason: "ErrImagePull", Message: "not found"}},
			wantCode: codes.Internal, wantMsg: "ErrImagePull"},
		{name: "unschedulable", spec: stagingSpec,
			staging:  podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Unschedulable, Message: "0/1 nodes are available"}},
			wantCode: codes.Internal, wantMsg: "Unschedulable"},
		{name: "no /pav/volume", spec: stagingSpec + unstagingSpec,
			staging:  podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Succeed}},
			wantCode: codes.Internal, wantMsg: "did not provide /pav/volume", wantUnstaging: 1},
		{name: "/pav/volume escapes /pav", spec: stagingSpec + unstagingSpec,
			staging:  podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Succeed}, onStart: symlinkOut},
			wantCode: codes.Internal, wantMsg: "outside /pav", wantUnstaging: 1},
		{name: "/pav/volume a file for Filesystem", spec: stagingSpec,
			staging:  podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Succeed}, onStart: regularFile},
			wantCode: codes.Internal, wantMsg: "must be a directory for a Filesystem volume, found a regular file"},
		{name: "/pav/volume a directory for Block", spec: stagingSpec, block: true,
			staging:  podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Succeed}, onStart: makeVolumeDir("x")},
			wantCode: codes.Internal, wantMsg: "must be a block special file"},
		{name: "template error", spec: "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Mi}\n  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: \"{{ nope }}\"}]}}}\n",
			wantCode: codes.InvalidArgument, wantMsg: "spec.volumeStaging.podTemplate.spec.containers[0].image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.spec, map[v1alpha1.Phase]podAction{v1alpha1.PhaseStaging: tc.staging, v1alpha1.PhaseUnstaging: tc.unstaging})
			req := e.stageReq("vol-1", tc.block)
			_, err := e.srv.NodeStageVolume(e.ctx, req)
			if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("error = %v, want %v containing %q", err, tc.wantCode, tc.wantMsg)
			}
			if tc.once != "" && strings.Count(err.Error(), tc.once) != 1 {
				t.Fatalf("error = %v: %q should be there once", err, tc.once)
			}
			if n := e.count(v1alpha1.PhaseUnstaging); n != tc.wantUnstaging {
				t.Fatalf("%d unstaging pods, want %d", n, tc.wantUnstaging)
			}
			if mounted, _ := hostmount.IsMountPoint(req.StagingTargetPath); mounted {
				t.Fatal("staging path mounted after a failed stage")
			}
		})
	}
}

func TestDriverRestartAdoptsRunningStagingPod(t *testing.T) {
	release := make(chan struct{})
	e := newEnv(t, stagingSpec, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: func(dir string) error {
			<-release // the pod takes its time to become ready
			return makeVolumeDir("late")(dir)
		}},
	})
	req := e.stageReq("vol-1", false)
	ctx, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := e.srv.NodeStageVolume(ctx, req); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("first call: %v, want DeadlineExceeded (kubelet retries)", err)
	}
	restarted := e.newServer(e.srv.Source.(provisioner.Static).P)
	close(release)
	if _, err := restarted.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	if n := e.count(v1alpha1.PhaseStaging); n != 1 {
		t.Fatalf("%d staging pods after a restart, want 1 (adopted)", n)
	}
	if _, err := restarted.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: req.StagingTargetPath}); err != nil {
		t.Fatal(err)
	}
}

func TestStaticVolumeNeedsStaticMode(t *testing.T) {
	e := newEnv(t, stagingSpec, nil)
	req := e.stageReq("static-1", false)
	req.VolumeContext = map[string]string{"user": "attr"} // no pav keys: a static PV
	if _, err := e.srv.NodeStageVolume(e.ctx, req); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "does not allow static provisioning") {
		t.Fatalf("error = %v", err)
	}
}

func TestStaticValidation(t *testing.T) {
	spec := "  provisioningModes: [Static]\n  volumeValidation: {accessModes: [ReadOnlyMany]}\n  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: b}]}}}\n"
	e := newEnv(t, spec, map[v1alpha1.Phase]podAction{v1alpha1.PhaseStaging: {onStart: makeVolumeDir("x")}})
	req := e.stageReq("static-1", false)
	req.VolumeContext = map[string]string{}
	if _, err := e.srv.NodeStageVolume(e.ctx, req); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "no pod on node node-1 uses a PersistentVolume") {
		t.Fatalf("a static volume no pod on the node uses: %v", err)
	}
	e.staticVolume("static-1", corev1.ReadWriteOnce, node)
	if _, err := e.srv.NodeStageVolume(e.ctx, req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "access mode ReadWriteOnce is not supported") {
		t.Fatalf("error = %v", err)
	}
	if n := e.count(v1alpha1.PhaseStaging); n != 0 {
		t.Fatalf("staging ran %d times for an invalid static volume", n)
	}
}

func TestArgumentErrors(t *testing.T) {
	s := &Server{NodeID: node}
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"stage without id": func() error {
			_, err := s.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{StagingTargetPath: "/x"})
			return err
		},
		"stage without path": func() error { _, err := s.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v"}); return err },
		"stage without cap": func() error {
			_, err := s.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/x"})
			return err
		},
		"unstage without id": func() error {
			_, err := s.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{StagingTargetPath: "/x"})
			return err
		},
		"publish without target": func() error {
			_, err := s.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "v", StagingTargetPath: "/x"})
			return err
		},
		"unpublish without path": func() error {
			_, err := s.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "v"})
			return err
		},
	} {
		if err := call(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}

// loopVolume makes /pav/volume a block device of size bytes, detached when the
// test ends.
func loopVolume(t *testing.T, size int64) func(string) error {
	return func(dir string) error {
		dev, err := fakekubelet.AttachLoop(dir, size)
		if dev != "" {
			img := filepath.Join(dir, "backing.img")
			t.Cleanup(func() { fakekubelet.DetachFile(img) })
		}
		return err
	}
}

func TestStageBlock(t *testing.T) {
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("needs losetup")
	}
	for _, tc := range []struct {
		name    string
		size    int64
		wantMsg string
	}{
		{name: "size matches the capacity", size: 1 << 20},
		{name: "size differs from the capacity", size: 2 << 20, wantMsg: "block device of 2097152 bytes, but the volume's capacity is 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, stagingSpec, map[v1alpha1.Phase]podAction{
				v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Succeed}, onStart: loopVolume(t, tc.size)},
			})
			req := e.stageReq("blk", true)
			_, err := e.srv.NodeStageVolume(e.ctx, req)
			if tc.wantMsg != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantMsg) {
					t.Fatalf("error = %v, want %q", err, tc.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			target := filepath.Join(e.dir, "publish", "dev")
			if _, err := e.srv.NodePublishVolume(e.ctx, &csi.NodePublishVolumeRequest{VolumeId: "blk", StagingTargetPath: req.StagingTargetPath,
				TargetPath: target, VolumeCapability: req.VolumeCapability}); err != nil {
				t.Fatal(err)
			}
			if size, err := hostmount.BlockSize(target); err != nil || size != 1<<20 {
				t.Fatalf("published device size %d, %v", size, err)
			}
			stats, err := e.srv.NodeGetVolumeStats(e.ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "blk", VolumePath: target})
			if err != nil || stats.Usage[0].Total != 1<<20 {
				t.Fatalf("stats = %v, %v", stats, err)
			}
			if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "blk", TargetPath: target}); err != nil {
				t.Fatal(err)
			}
			if _, err := e.srv.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "blk", StagingTargetPath: req.StagingTargetPath}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMountedVolumeLeavesStagingPathFree: a staging pod that mounts a file
// system at /pav/volume (tmpfs here, FUSE in real life). kubelet refuses to
// unstage a staging path whose mount is referenced elsewhere, so nothing may be
// mounted there; publishing binds the mount itself, and unstaging leaves no
// mount behind.
func TestMountedVolumeLeavesStagingPathFree(t *testing.T) {
	e := newEnv(t, stagingSpec+unstagingSpec, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: func(dir string) error {
			v := filepath.Join(dir, "volume")
			if err := os.MkdirAll(v, 0o755); err != nil {
				return err
			}
			if err := unix.Mount("tmpfs", v, "tmpfs", 0, "size=1m"); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(v, "data"), []byte("in tmpfs"), 0o644)
		}},
	})
	req := e.stageReq("vol-tmpfs", false)
	if err := os.MkdirAll(req.StagingTargetPath, 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	if mounted, _ := hostmount.IsMountPoint(req.StagingTargetPath); mounted {
		t.Fatal("the staging path is a mount: kubelet would see a second reference and never unstage")
	}
	target := filepath.Join(e.dir, "pods-target", "t")
	if _, err := e.srv.NodePublishVolume(e.ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-tmpfs", StagingTargetPath: req.StagingTargetPath,
		TargetPath: target, VolumeCapability: req.VolumeCapability}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "in tmpfs" {
		t.Fatalf("published volume reads %q, %v", b, err)
	}
	if _, err := e.srv.NodePublishVolume(e.ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-tmpfs", StagingTargetPath: "/elsewhere",
		TargetPath: target + "2", VolumeCapability: req.VolumeCapability}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("publish from a staging path the volume is not staged at: %v", err)
	}
	if _, err := e.srv.NodeUnpublishVolume(e.ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-tmpfs", TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	dir := e.srv.volumeDir("vol-tmpfs")
	if _, err := e.srv.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-tmpfs", StagingTargetPath: req.StagingTargetPath}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(b), dir) {
		t.Fatalf("a mount under %s outlived unstaging", dir)
	}
}

// A clean-up that fails after the unstaging pod succeeded (here: the volume
// directory is still a mount point in the plugin's mount namespace, under
// another path, as a mount copied into a private mount of the plugin
// directory was on the cluster) is retried without running the unstaging pod
// again: its success is recorded before the pod is removed.
func TestUnstagingPodRunsOnceWhenCleanupFails(t *testing.T) {
	alt := filepath.Join(t.TempDir(), "alt")
	var busy string
	e := newEnv(t, stagingSpec+unstagingSpec, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {onStart: makeVolumeDir("hello")},
	})
	e.mu.Lock()
	e.actions[v1alpha1.PhaseUnstaging] = podAction{onStart: func(dir string) error {
		// dir is <state dir>/<volume>/pav: mount over its volume/ through a
		// private bind of the state directory, which mountinfo lists under alt.
		rel, err := filepath.Rel(e.srv.StateDir, filepath.Join(dir, "volume"))
		if err != nil {
			return err
		}
		if err := os.MkdirAll(alt, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(e.srv.StateDir, alt, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		if err := unix.Mount("", alt, "", unix.MS_PRIVATE, ""); err != nil {
			return err
		}
		busy = filepath.Join(alt, rel)
		return unix.Mount("tmpfs", busy, "tmpfs", 0, "size=1m")
	}}
	e.mu.Unlock()
	t.Cleanup(func() {
		_ = unix.Unmount(busy, unix.MNT_DETACH)
		_ = unix.Unmount(alt, unix.MNT_DETACH)
	})
	req := e.stageReq("vol-1", false)
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	unstage := &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: req.StagingTargetPath}
	if _, err := e.srv.NodeUnstageVolume(e.ctx, unstage); err == nil {
		t.Fatal("unstaging succeeded with the volume directory busy")
	}
	if err := unix.Unmount(busy, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.srv.NodeUnstageVolume(e.ctx, unstage); err != nil {
		t.Fatalf("retried unstaging: %v", err)
	}
	if n := e.count(v1alpha1.PhaseUnstaging); n != 1 {
		t.Fatalf("%d unstaging pods, want 1", n)
	}
	if _, err := os.Stat(e.srv.volumeDir("vol-1")); !os.IsNotExist(err) {
		t.Fatalf("volume directory left behind: %v", err)
	}
}
