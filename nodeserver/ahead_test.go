package nodeserver

import (
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/apibudget"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
)

// boundVolume is dynamicVolume's PV and claim, the claim Bound as the PV
// controller leaves it; it returns the volume context and the claim's key.
func (e *env) boundVolume(handle string) (map[string]string, string) {
	e.t.Helper()
	vc := e.dynamicVolume(handle, corev1.PersistentVolumeFilesystem)
	pvcs := e.client.CoreV1().PersistentVolumeClaims("apps")
	pvc, err := pvcs.Get(e.ctx, "claim-"+handle, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pvc.Status.Phase = corev1.ClaimBound
	if _, err := pvcs.UpdateStatus(e.ctx, pvc, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return vc, "apps/claim-" + handle
}

// nodePods stands for the plugin's watch of its node's pods: they are the
// pods bound to the node.
func (e *env) nodePods(srv *Server, pods ...*corev1.Pod) cache.Indexer {
	e.t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{claimIndex: podClaims})
	for _, p := range pods {
		if err := idx.Add(p); err != nil {
			e.t.Fatal(err)
		}
	}
	srv.pods = idx
	return idx
}

func pendingPod(name string, claims ...string) *corev1.Pod {
	p := userPod(name, node, claims...)
	p.UID = types.UID("uid-" + name)
	p.Status.Phase = corev1.PodPending
	return p
}

func (e *env) state(handle string) *staged {
	e.t.Helper()
	st, err := readState(e.srv.volumeDir(handle))
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// stagedAhead makes handle's volume with its claim Bound, a Pending pod
// "user" of the node that uses it, and stages the volume ahead for it.
func (e *env) stagedAhead(handle string) (vc map[string]string, pod *corev1.Pod, idx cache.Indexer) {
	e.t.Helper()
	vc, claim := e.boundVolume(handle)
	pod = pendingPod("user", "claim-"+handle)
	idx = e.nodePods(e.srv, pod)
	if h := e.srv.stageAheadClaim(e.ctx, claim); h != handle {
		e.t.Fatalf("staged ahead %q, want %s", h, handle)
	}
	return vc, pod, idx
}

var keepRunningStaging = map[v1alpha1.Phase]podAction{
	v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: makeVolumeDir("x")},
}

// TestStageAheadAdopted: a volume staged ahead for a pod bound to the node
// is the kubelet's once its NodeStageVolume comes, with the kubelet's path:
// one staging pod, and the kubelet's unstaging.
func TestStageAheadAdopted(t *testing.T) {
	e := newEnv(t, stagingSpec+unstagingSpec, keepRunningStaging)
	vc, pod, idx := e.stagedAhead("vol-a")
	st := e.state("vol-a")
	if st == nil || !st.Staged || !st.Ahead || st.StagedAt != KubeletStagingPath("test", "vol-a") {
		t.Fatalf("after the staging ahead: %+v", st)
	}
	req := e.stageReq("vol-a", false)
	req.VolumeContext = vc
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	if st := e.state("vol-a"); st.Ahead || st.StagedAt != req.StagingTargetPath {
		t.Fatalf("after the kubelet's NodeStageVolume: ahead %v, staged at %s, want the kubelet's %s", st.Ahead, st.StagedAt, req.StagingTargetPath)
	}
	// The pod goes: the staging is the kubelet's to unstage.
	if err := idx.Delete(pod); err != nil {
		t.Fatal(err)
	}
	e.srv.podGone(e.ctx, pod)
	time.Sleep(200 * time.Millisecond)
	if e.state("vol-a") == nil {
		t.Fatal("the node plugin unstaged a staging the kubelet had adopted")
	}
	e.unstage(req)
	if n, u := e.count(v1alpha1.PhaseStaging), e.count(v1alpha1.PhaseUnstaging); n != 1 || u != 1 {
		t.Fatalf("staging pods %d, unstaging pods %d; want one each", n, u)
	}
}

// TestStageAheadAPIRequests: a staging ahead and its adoption cost what the
// kubelet's NodeStageVolume alone costs (apibudget.Stage), and the pod of a
// claim another provisioner made costs one read.
func TestStageAheadAPIRequests(t *testing.T) {
	e := newEnv(t, stagingSpec+unstagingSpec, keepRunningStaging)
	vc, claim := e.boundVolume("vol-c")
	e.nodePods(e.srv, pendingPod("user", "claim-vol-c"))
	ahead := e.requests(func() { e.srv.stageAheadClaim(e.ctx, claim) })
	if want := "create pods, get nodes, get persistentvolumeclaims, get persistentvolumes"; strings.Join(ahead, ", ") != want {
		t.Errorf("staging ahead made %v, want %s", ahead, want)
	}
	req := e.stageReq("vol-c", false)
	req.VolumeContext = vc
	if adopt := e.requests(func() {
		if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
			t.Fatal(err)
		}
	}); len(adopt) != 0 {
		t.Errorf("adopting the staging made %v, want none", adopt)
	}
	if len(ahead) > apibudget.Stage {
		t.Errorf("%d requests, over the staging budget (%d)", len(ahead), apibudget.Stage)
	}

	e.add(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "theirs", Namespace: "apps",
		Annotations: map[string]string{"volume.kubernetes.io/storage-provisioner": "other.example"}},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-theirs"}, Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}})
	if r := e.requests(func() { e.srv.stageAheadClaim(e.ctx, "apps/theirs") }); strings.Join(r, ", ") != "get persistentvolumeclaims" {
		t.Errorf("another provisioner's claim cost %v, want one claim read", r)
	}
}

// TestNodeStageWaitsForStagingAhead: the kubelet's NodeStageVolume that
// comes while the staging ahead runs waits for it (no Aborted, which the
// kubelet would retry only 0.5 s later) and adopts it.
func TestNodeStageWaitsForStagingAhead(t *testing.T) {
	e := newEnv(t, stagingSpec+unstagingSpec, map[v1alpha1.Phase]podAction{
		v1alpha1.PhaseStaging: {outcome: fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}, onStart: func(dir string) error {
			time.Sleep(500 * time.Millisecond)
			return makeVolumeDir("x")(dir)
		}},
	})
	vc, claim := e.boundVolume("vol-w")
	e.nodePods(e.srv, pendingPod("user", "claim-vol-w"))
	done := make(chan string)
	go func() { done <- e.srv.stageAheadClaim(e.ctx, claim) }()
	// Its staging pod is asked for once the staging ahead holds the volume.
	waitFor(t, "the staging ahead to start", func() bool { return e.count(v1alpha1.PhaseStaging) == 1 })

	req := e.stageReq("vol-w", false)
	req.VolumeContext = vc
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatalf("NodeStageVolume during the staging ahead: %v", err)
	}
	if h := <-done; h != "vol-w" {
		t.Fatalf("staged ahead %q", h)
	}
	if st := e.state("vol-w"); !st.Staged || st.Ahead || st.StagedAt != req.StagingTargetPath {
		t.Fatalf("not adopted: %+v", st)
	}
	if n := e.count(v1alpha1.PhaseStaging); n != 1 {
		t.Fatalf("%d staging pods, want 1", n)
	}

	// A call that meets another operation (not a staging ahead) is still refused.
	release, _ := e.srv.busy.TryAcquire("vol-w")
	defer release()
	if _, err := e.srv.NodeStageVolume(e.ctx, req); status.Code(err) != codes.Aborted {
		t.Fatalf("NodeStageVolume during another operation: %v, want Aborted", err)
	}
}

// TestStageAheadUndone: a staging made ahead that the kubelet never adopted
// is unstaged once no pod of the node that has not ended uses its claim, and
// only then.
func TestStageAheadUndone(t *testing.T) {
	for _, tc := range []struct {
		name string
		// after the staging ahead for pod "user"
		then func(e *env, idx cache.Indexer, pod *corev1.Pod)
		want bool // unstaged
	}{
		{"the pod is deleted", func(e *env, idx cache.Indexer, pod *corev1.Pod) {
			_ = idx.Delete(pod)
			e.srv.podGone(e.ctx, pod)
		}, true},
		{"the pod failed (the kubelet rejected it)", func(e *env, idx cache.Indexer, pod *corev1.Pod) {
			pod = pod.DeepCopy()
			pod.Status.Phase = corev1.PodFailed
			_ = idx.Update(pod)
			e.srv.podSeen(e.ctx, pod)
		}, true},
		{"the pod is deleted, another pod of the node uses the claim", func(e *env, idx cache.Indexer, pod *corev1.Pod) {
			_ = idx.Add(pendingPod("other", pod.Spec.Volumes[0].PersistentVolumeClaim.ClaimName))
			_ = idx.Delete(pod)
			e.srv.podGone(e.ctx, pod)
		}, false},
		{"the pod is being deleted", func(e *env, idx cache.Indexer, pod *corev1.Pod) {
			pod = pod.DeepCopy()
			pod.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			_ = idx.Update(pod)
			e.srv.podSeen(e.ctx, pod)
		}, false},
		{"the pod went while the node plugin was down", func(e *env, _ cache.Indexer, _ *corev1.Pod) {
			p, err := e.srv.Source.Get(false)
			if err != nil {
				e.t.Fatal(err)
			}
			e.srv = e.newServer(p)
			e.nodePods(e.srv)
			e.srv.undoUnadopted(e.ctx)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, stagingSpec+unstagingSpec, keepRunningStaging)
			_, pod, idx := e.stagedAhead("vol-u")
			tc.then(e, idx, pod)
			gone := func() bool { _, err := os.Stat(e.srv.volumeDir("vol-u")); return os.IsNotExist(err) }
			if tc.want {
				waitFor(t, "the staging ahead to be undone", gone)
				if n := e.count(v1alpha1.PhaseUnstaging); n != 1 {
					t.Fatalf("%d unstaging pods, want 1", n)
				}
				return
			}
			time.Sleep(300 * time.Millisecond)
			if gone() {
				t.Fatal("unstaged a staging a pod may still need")
			}
		})
	}
}

// TestAheadRequest: only what the kubelet would stage for a pod of the node
// is staged ahead, with the request the kubelet's NodeStageVolume makes.
func TestAheadRequest(t *testing.T) {
	fs, block := corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeBlock
	base := func() (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "apps", UID: "uid-c"},
			Spec:   corev1.PersistentVolumeClaimSpec{VolumeName: "pv-c"},
			Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}}
		pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-c"},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:    corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(1<<20, resource.BinarySI)},
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &fs,
				ClaimRef: &corev1.ObjectReference{Namespace: "apps", Name: "c", UID: "uid-c"},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
					Driver: "test", VolumeHandle: "h", VolumeAttributes: map[string]string{"a": "b"}}}}}
		return pvc, pv
	}
	affinity := func(zone string) *corev1.VolumeNodeAffinity {
		return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{zone}}}}}}}
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name   string
		edit   func(*corev1.PersistentVolumeClaim, *corev1.PersistentVolume)
		why    string // "" = staged ahead
		mode   corev1.PersistentVolumeMode
		access corev1.PersistentVolumeAccessMode
		ro     bool
	}{
		{"bound", nil, "", fs, corev1.ReadWriteOnce, false},
		{"block", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) { pv.Spec.VolumeMode = &block }, "", block, corev1.ReadWriteOnce, false},
		{"no volume mode", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) { pv.Spec.VolumeMode = nil }, "", fs, corev1.ReadWriteOnce, false},
		{"read-only many first", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) {
			pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany, corev1.ReadWriteOnce}
		}, "", fs, corev1.ReadOnlyMany, true},
		{"read-write once pod", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) {
			pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
		}, "", fs, corev1.ReadWriteOnce, false},
		{"node affinity admits the node", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) {
			pv.Spec.NodeAffinity = affinity("z1")
		}, "", fs, corev1.ReadWriteOnce, false},
		{"node affinity does not admit the node", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) {
			pv.Spec.NodeAffinity = affinity("z2")
		}, "node affinity", "", "", false},
		{"claim not bound yet", func(pvc *corev1.PersistentVolumeClaim, _ *corev1.PersistentVolume) {
			pvc.Status.Phase = corev1.ClaimPending
		}, "not bound", "", "", false},
		{"claim being deleted", func(pvc *corev1.PersistentVolumeClaim, _ *corev1.PersistentVolume) {
			pvc.DeletionTimestamp, pvc.Finalizers = &now, []string{"kubernetes.io/pvc-protection"}
		}, "claim is being deleted", "", "", false},
		{"PV being deleted", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) {
			pv.DeletionTimestamp, pv.Finalizers = &now, []string{"kubernetes.io/pv-protection"}
		}, "PersistentVolume is being deleted", "", "", false},
		{"PV of another driver", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) { pv.Spec.CSI.Driver = "other" }, "not a volume of this driver", "", "", false},
		{"not a CSI PV", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) {
			pv.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}
		}, "not a volume of this driver", "", "", false},
		{"PV bound to another claim of the name (a claim made again)", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) { pv.Spec.ClaimRef.UID = "uid-old" }, "not bound to the claim", "", "", false},
		{"claim names a PV bound elsewhere", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) {
			pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "other", Name: "c", UID: "uid-c"}
		}, "not bound to the claim", "", "", false},
		{"provisioned by this driver", func(pvc *corev1.PersistentVolumeClaim, _ *corev1.PersistentVolume) {
			pvc.Annotations = map[string]string{"volume.kubernetes.io/storage-provisioner": "test"}
		}, "", fs, corev1.ReadWriteOnce, false},
		{"provisioned by another provisioner", func(pvc *corev1.PersistentVolumeClaim, _ *corev1.PersistentVolume) {
			pvc.Annotations = map[string]string{"volume.beta.kubernetes.io/storage-provisioner": "other"}
		}, "another provisioner", "", "", false},
		{"staging secrets", func(_ *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) {
			pv.Spec.CSI.NodeStageSecretRef = &corev1.SecretReference{Namespace: "apps", Name: "s"}
		}, "secrets", "", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pvc, pv := base()
			if tc.edit != nil {
				tc.edit(pvc, pv)
			}
			objs := []runtime.Object{pvc, pv, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"zone": "z1"}}}}
			s := &Server{NodeID: node, Client: kubetest.Wrap(fake.NewClientset(objs...))}
			r, why, err := s.aheadRequest(t.Context(), "test", "apps/c")
			if err != nil {
				t.Fatal(err)
			}
			if tc.why != "" {
				if !strings.Contains(why, tc.why) {
					t.Fatalf("why = %q, want it to say %q", why, tc.why)
				}
				return
			}
			if why != "" {
				t.Fatalf("not staged ahead: %s", why)
			}
			want := stageRequest{handle: "h", target: KubeletStagingPath("test", "h"), mode: tc.mode, access: tc.access, readOnly: tc.ro,
				volumeContext: map[string]string{"a": "b"}, ahead: true}
			if r.handle != want.handle || r.target != want.target || r.mode != want.mode || r.access != want.access || r.readOnly != want.readOnly ||
				r.volumeContext["a"] != "b" || !r.ahead {
				t.Fatalf("request %+v, want %+v", r, want)
			}
			// What it read is the staging's context: not read again.
			if r.read.PV == nil || r.read.PV.Name != "pv-c" || r.read.PVC == nil || r.read.PVC.Name != "c" || (r.read.Node != nil) != (pv.Spec.NodeAffinity != nil) {
				t.Fatalf("objects read %+v", r.read)
			}
		})
	}
	t.Run("no such claim", func(t *testing.T) {
		s := &Server{NodeID: node, Client: kubetest.Wrap(fake.NewClientset())}
		if _, why, err := s.aheadRequest(t.Context(), "test", "apps/c"); err != nil || why != "no such claim" {
			t.Fatalf("why %q, err %v", why, err)
		}
	})
}

// TestKubeletStagingPath: the kubelet's staging target path of a CSI volume
// (pkg/volume/csi's makeDeviceMountPath): sha256 of the handle, hex.
func TestKubeletStagingPath(t *testing.T) {
	// printf vol-1 | sha256sum
	const want = "/var/lib/kubelet/plugins/kubernetes.io/csi/pav.example/d2e8363faaac7ae76def3b14091d8eb5755f6b92e9531627aeec833a8731cc49/globalmount"
	if got := KubeletStagingPath("pav.example", "vol-1"); got != want {
		t.Fatalf("KubeletStagingPath = %s, want %s", got, want)
	}
}

// TestTrimPod: the watch keeps of a pod its identity, node, claims and phase.
func TestTrimPod(t *testing.T) {
	now := metav1.Now()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "apps", UID: "u", ResourceVersion: "7", DeletionTimestamp: &now,
			Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"big": strings.Repeat("x", 1000)}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "i"}}, Volumes: []corev1.Volume{
			{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c1", ReadOnly: true}}},
			{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}},
			{Name: "eph", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{}}}},
		}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Message: "m"},
	}
	out, err := trimPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*corev1.Pod)
	if got.Name != "p" || got.Namespace != "apps" || got.UID != "u" || got.ResourceVersion != "7" || got.DeletionTimestamp == nil ||
		got.Spec.NodeName != node || got.Status.Phase != corev1.PodPending || got.Labels != nil || got.Annotations != nil ||
		got.Spec.Containers != nil || got.Status.Message != "" {
		t.Fatalf("trimmed pod %+v", got)
	}
	if c := claimsOf(got); strings.Join(c, ",") != "apps/c1,apps/p-eph" {
		t.Fatalf("claims of the trimmed pod: %v", c)
	}
}
