package nodeserver

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
)

// forgottenEnv is a node plugin with ForgottenGrace and a clock the test moves
// (which also runs in real time: a case that must stay within the grace
// leaves half of it to spare).
type forgottenEnv struct {
	*env
	offset atomic.Int64 // the plugin's clock: the real time plus this
}

func newForgottenEnv(t *testing.T, actions map[v1alpha1.Phase]podAction) *forgottenEnv {
	e := &forgottenEnv{env: newEnv(t, stagingSpec+unstagingSpec, actions)}
	e.srv.ForgottenGrace = DefaultForgottenGrace
	e.srv.Clock = e.now
	return e
}

func (e *forgottenEnv) now() time.Time { return time.Now().Add(time.Duration(e.offset.Load())) }

// later moves the plugin's clock d ahead.
func (e *forgottenEnv) later(d time.Duration) { e.offset.Add(int64(d)) }

// useClaim puts a pod on nodeName that uses the claim of dynamicVolume(handle).
func (e *forgottenEnv) useClaim(pod, nodeName, handle string) {
	e.add(userPod(pod, nodeName, "claim-"+handle))
}

// stageDynamic stages a volume pav created, whose PV is "pv-"+handle.
func (e *forgottenEnv) stageDynamic(handle string) *csi.NodeStageVolumeRequest {
	e.t.Helper()
	req := e.stageReq(handle, false)
	req.VolumeContext = e.dynamicVolume(handle, corev1.PersistentVolumeFilesystem)
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		e.t.Fatal(err)
	}
	return req
}

func (e *forgottenEnv) staged(handle string) bool {
	_, err := os.Stat(e.srv.volumeDir(handle))
	return err == nil
}

// TestForgottenStaging: a staging that no pod uses, which the kubelet left
// alone for the grace, is unstaged by the node plugin, and only then; never
// while the kubelet may still use it.
func TestForgottenStaging(t *testing.T) {
	const grace = DefaultForgottenGrace
	for _, tc := range []struct {
		name string
		// after staging: what the kubelet did, and how much time passed
		setup func(e *forgottenEnv, req *csi.NodeStageVolumeRequest)
		want  bool // unstaged
	}{
		{"left alone past the grace", func(e *forgottenEnv, _ *csi.NodeStageVolumeRequest) {
			e.later(grace + time.Second)
		}, true},
		{"within the grace", func(e *forgottenEnv, _ *csi.NodeStageVolumeRequest) {
			e.later(grace / 2)
		}, false},
		{"a pod on the node uses the claim", func(e *forgottenEnv, req *csi.NodeStageVolumeRequest) {
			e.useClaim("user", node, req.VolumeId)
			e.later(grace + time.Second)
		}, false},
		{"a pod on the node uses it as a generic ephemeral volume", func(e *forgottenEnv, req *csi.NodeStageVolumeRequest) {
			// The claim of a generic ephemeral volume is named <pod>-<volume>.
			e.add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "apps"}, Spec: corev1.PodSpec{NodeName: node,
				Volumes: []corev1.Volume{{Name: req.VolumeId, VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}}}}})
			e.later(grace + time.Second)
		}, false},
		{"only a pod on another node uses the claim", func(e *forgottenEnv, req *csi.NodeStageVolumeRequest) {
			e.useClaim("elsewhere", "node-2", req.VolumeId)
			e.later(grace + time.Second)
		}, true},
		{"staged again since (the kubelet's NodeStage)", func(e *forgottenEnv, req *csi.NodeStageVolumeRequest) {
			e.later(grace)
			if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
				t.Fatal(err)
			}
			e.later(grace / 2)
		}, false},
		{"published (a pod's mount names the PV)", func(e *forgottenEnv, req *csi.NodeStageVolumeRequest) {
			target := filepath.Join(e.dir, "pods", "uid", "volumes", "kubernetes.io~csi", "pv-"+req.VolumeId, "mount")
			if err := e.publish(req, target); err != nil {
				t.Fatal(err)
			}
			e.later(grace + time.Second)
		}, false},
		{"the kubelet's NodeUnstage failed a moment ago (it retries)", func(e *forgottenEnv, req *csi.NodeStageVolumeRequest) {
			e.later(grace + time.Second)
			e.failUnstaging(req)
			e.later(grace / 2)
		}, false},
		{"the kubelet's NodeUnstage failed, and it never came back (it restarted)", func(e *forgottenEnv, req *csi.NodeStageVolumeRequest) {
			e.failUnstaging(req)
			e.later(grace + time.Second)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newForgottenEnv(t, map[v1alpha1.Phase]podAction{
				v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("x")},
			})
			req := e.stageDynamic("vol-f")
			tc.setup(e, req)
			unstagings := e.count(v1alpha1.PhaseUnstaging)
			e.srv.UnstageForgotten(e.ctx)
			if got := !e.staged(req.VolumeId); got != tc.want {
				t.Fatalf("unstaged: %v, want %v", got, tc.want)
			}
			events := e.drainEvents()
			if !tc.want {
				mustNotHave(t, events, ReasonForgottenUnstaged)
				return
			}
			if n := e.count(v1alpha1.PhaseUnstaging) - unstagings; n != 1 {
				t.Errorf("%d unstaging pods ran, want 1", n)
			}
			found := false
			for _, ev := range events {
				found = found || (strings.Contains(ev, ReasonForgottenUnstaged) && strings.Contains(ev, "node "+node))
			}
			if !found {
				t.Errorf("no %s event naming the node; events: %q", ReasonForgottenUnstaged, events)
			}
			pods, err := e.client.CoreV1().Pods("pav").List(e.ctx, metav1.ListOptions{})
			if err != nil || len(pods.Items) != 0 {
				t.Errorf("pav pods left: %d (%v)", len(pods.Items), err)
			}
			// The kubelet's own NodeUnstageVolume, should it come after all, finds nothing to do.
			if _, err := e.srv.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: req.VolumeId, StagingTargetPath: req.StagingTargetPath}); err != nil {
				t.Fatalf("NodeUnstageVolume after the plugin unstaged: %v", err)
			}
		})
	}
}

// failUnstaging is the kubelet's NodeUnstageVolume whose unstaging pod fails.
func (e *forgottenEnv) failUnstaging(req *csi.NodeStageVolumeRequest) {
	e.t.Helper()
	e.setAction(v1alpha1.PhaseUnstaging, podAction{outcome: fakekubelet.Outcome{Kind: fakekubelet.Fail}})
	if _, err := e.srv.NodeUnstageVolume(e.ctx, &csi.NodeUnstageVolumeRequest{VolumeId: req.VolumeId, StagingTargetPath: req.StagingTargetPath}); err == nil {
		e.t.Fatal("the unstaging pod failed, and NodeUnstageVolume succeeded")
	}
	e.setAction(v1alpha1.PhaseUnstaging, podAction{})
}

// TestForgottenStagingLookedAtOncePerGrace: a staging the kubelet left alone
// but a pod on the node still wants is asked about (one pod list) once per
// grace, not at every check.
func TestForgottenStagingLookedAtOncePerGrace(t *testing.T) {
	e := newForgottenEnv(t, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("x")},
	})
	req := e.stageDynamic("vol-w")
	e.useClaim("user", node, req.VolumeId)
	lists := func() int {
		n := 0
		for _, a := range e.client.Actions() {
			if a.GetVerb() == "list" && a.GetResource().Resource == "pods" && a.GetNamespace() == "apps" {
				n++
			}
		}
		return n
	}
	e.later(DefaultForgottenGrace + time.Second)
	for i := 0; i < 3; i++ {
		e.srv.UnstageForgotten(e.ctx)
	}
	if n := lists(); n != 1 {
		t.Fatalf("%d pod lists in three checks within a grace, want 1", n)
	}
	e.later(DefaultForgottenGrace + time.Second)
	e.srv.UnstageForgotten(e.ctx)
	if n := lists(); n != 2 {
		t.Fatalf("%d pod lists after a second grace, want 2", n)
	}
	if !e.staged(req.VolumeId) {
		t.Fatal("unstaged while a pod on the node uses its claim")
	}
}

// TestForgottenStagingHeldByAnOperation: a volume another operation holds is
// left to it.
func TestForgottenStagingHeldByAnOperation(t *testing.T) {
	e := newForgottenEnv(t, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("x")},
	})
	req := e.stageDynamic("vol-h")
	e.later(DefaultForgottenGrace + time.Second)
	release, ok := e.srv.busy.TryAcquire(req.VolumeId)
	if !ok {
		t.Fatal("volume busy")
	}
	e.srv.UnstageForgotten(e.ctx)
	release()
	if !e.staged(req.VolumeId) {
		t.Fatal("unstaged while another operation held the volume")
	}
	e.srv.UnstageForgotten(e.ctx)
	if e.staged(req.VolumeId) {
		t.Fatal("not unstaged once the volume was free")
	}
}
