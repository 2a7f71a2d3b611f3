package nodeserver

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/apibudget"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
)

// requests runs f and returns the API requests it made, as "verb resource"
// (sorted), leaving out what informers do on their own.
func (e *env) requests(f func()) []string {
	e.t.Helper()
	before := len(e.client.Actions())
	f()
	var out []string
	for _, a := range e.client.Actions()[before:] {
		if a.GetVerb() == "watch" {
			continue
		}
		r := a.GetResource().Resource
		if a.GetSubresource() != "" {
			r += "/" + a.GetSubresource()
		}
		s := a.GetVerb() + " " + r
		if l, ok := a.(k8stesting.ListAction); ok && !l.GetListRestrictions().Fields.Empty() {
			s += " (" + l.GetListRestrictions().Fields.String() + ")"
		}
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// crowd fills the cluster with what a large cluster has and a node plugin
// must not pay for: other nodes' pods and their claims and volumes.
func (e *env) crowd(n int) {
	for i := range n {
		e.dynamicVolume(fmt.Sprintf("other-%d", i), corev1.PersistentVolumeFilesystem)
		e.add(userPod(fmt.Sprintf("other-%d", i), fmt.Sprintf("node-%d", i+2), fmt.Sprintf("claim-other-%d", i)))
		e.staticVolume(fmt.Sprintf("elsewhere-%d", i), corev1.ReadWriteOnce, fmt.Sprintf("node-%d", i+2))
	}
}

// TestAPIRequestsPerOperation is the node plugin's API budget: what one
// staging and one unstaging cost, for a volume pav created (its PV named in
// the volume context) and a static one (found through this node's pods), and
// proof that the cost does not grow with the cluster. Print the figures with
//
//	go test ./nodeserver -run TestAPIRequestsPerOperation -v
func TestAPIRequestsPerOperation(t *testing.T) {
	spec := "  provisioningModes: [Dynamic, Static]\n  volumeCreation: {capacity: 1Mi}\n" +
		"  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: b}]}}}\n" + unstagingSpec
	for _, tc := range []struct {
		name        string
		keepRunning bool
		static      bool
		wrapped     bool // the staging template states its command
		stage       []string
		unstage     []string
	}{
		{name: "dynamic, KeepRunning staging pod", keepRunning: true,
			stage:   []string{"create pods", "get nodes", "get persistentvolumeclaims", "get persistentvolumes"},
			unstage: []string{"create pods", "delete pods", "delete pods"}},
		{name: "dynamic, staging pod completes",
			stage:   []string{"create pods", "delete pods", "get nodes", "get persistentvolumeclaims", "get persistentvolumes"},
			unstage: []string{"create pods", "delete pods"}},
		// Its end is read from /pav/.pav-exit, and its pod discarded
		// without waiting: it is gone long before the unstaging, which
		// then asks nothing about it.
		{name: "dynamic, wrapped staging pod completes", wrapped: true,
			stage:   []string{"create pods", "delete pods", "get nodes", "get persistentvolumeclaims", "get persistentvolumes"},
			unstage: []string{"create pods", "delete pods"}},
		{name: "static, found through this node's pods", keepRunning: true, static: true,
			stage: []string{"create pods", "get nodes", "get persistentvolumeclaims", "get persistentvolumes",
				"list pods (spec.nodeName=node-1)"},
			unstage: []string{"create pods", "delete pods", "delete pods"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outcome := fakekubelet.Outcome{Kind: fakekubelet.Succeed}
			if tc.keepRunning {
				outcome = fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}
			}
			spec := spec
			if tc.wrapped {
				spec = strings.Replace(spec, "{name: s, image: b}", "{name: s, image: b, command: [stage]}", 1)
			}
			e := newEnv(t, spec, map[v1alpha1.Phase]podAction{v1alpha1.PhaseStaging: {outcome: outcome, onStart: makeVolumeDir("x")}})
			measure := func(handle string) (stage, unstage []string) {
				req := e.stageReq(handle, false)
				if tc.static {
					e.staticVolume(handle, corev1.ReadWriteOnce, node)
					req.VolumeContext = map[string]string{"color": "blue"}
				} else {
					req.VolumeContext = e.dynamicVolume(handle, corev1.PersistentVolumeFilesystem)
				}
				stage = e.requests(func() {
					if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
						t.Fatal(err)
					}
				})
				// Checking a staged volume costs nothing.
				if r := e.requests(func() {
					if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
						t.Fatal(err)
					}
				}); len(r) != 0 {
					t.Errorf("NodeStage of a staged volume made requests %v", r)
				}
				if !tc.keepRunning {
					// A completed staging pod is discarded without waiting: in real
					// life it is long gone when the unstaging comes, which then asks
					// nothing about it. Under load the informer may see its deletion
					// late, and the unstaging would delete it once more.
					e.waitStagingPodGone(handle)
				}
				unstage = e.requests(func() { e.unstage(req) })
				return stage, unstage
			}
			stage, unstage := measure("small-cluster")
			t.Logf("NodeStageVolume: %d requests %v", len(stage), stage)
			t.Logf("NodeUnstageVolume: %d requests %v", len(unstage), unstage)
			if !equal(stage, tc.stage) || !equal(unstage, tc.unstage) {
				t.Fatalf("stage %v, unstage %v; want %v and %v", stage, unstage, tc.stage, tc.unstage)
			}
			// The first volume's pod is gone from the node.
			_ = e.client.CoreV1().Pods("apps").Delete(e.ctx, "user-small-cluster", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			e.crowd(200)
			bigStage, bigUnstage := measure("big-cluster")
			if !equal(bigStage, stage) || !equal(bigUnstage, unstage) {
				t.Fatalf("with 200 more nodes' pods, claims and volumes: stage %v, unstage %v; the cost grew with the cluster", bigStage, bigUnstage)
			}
		})
	}
}

// waitStagingPodGone waits until the node plugin's informer no longer has
// the discarded staging pod of handle, whose identity state.json keeps.
func (e *env) waitStagingPodGone(handle string) {
	e.t.Helper()
	st, err := readState(e.srv.volumeDir(handle))
	if err != nil || st == nil || st.StagingPod == nil || !st.StagingPod.Deleting {
		e.t.Fatalf("state %+v (%v): want the completed staging pod recorded as being deleted", st, err)
	}
	id := st.StagingPod
	err = wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		p, err := e.srv.Pods.Cached(id.Namespace, id.Name)
		return err == nil && p == nil, nil
	})
	if err != nil {
		e.t.Fatalf("the discarded staging pod %s is still there: %v", id, err)
	}
}

func equal(a, b []string) bool { return strings.Join(a, "|") == strings.Join(b, "|") }

// TestStaticPVLookup: the PV of a static volume is the one a pod on this node
// uses; two with one handle is refused, naming both.
func TestStaticPVLookup(t *testing.T) {
	spec := "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: b}]}}}\n"
	e := newEnv(t, spec, map[v1alpha1.Phase]podAction{v1alpha1.PhaseStaging: {onStart: makeVolumeDir("x")}})
	req := e.stageReq("nfs-1", false)
	req.VolumeContext = map[string]string{}
	// A pod on another node uses it: not this node's business.
	e.staticVolume("nfs-1", corev1.ReadWriteOnce, "node-2")
	if _, err := e.srv.NodeStageVolume(e.ctx, req); status.Code(err) != codes.NotFound {
		t.Fatalf("no pod here uses it: %v", err)
	}
	e.add(userPod("here", node, "static-nfs-1"))
	if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
		t.Fatal(err)
	}
	st, _ := readState(e.srv.volumeDir("nfs-1"))
	if st.PV != "static-pv-nfs-1" || st.PVObject == nil || st.NodeObject == nil {
		t.Fatalf("state %+v: the PV found and the context's objects recorded", st)
	}
	e.unstage(req)

	// A copy of the PV with the same handle, used on this node too.
	dup, _ := e.client.CoreV1().PersistentVolumes().Get(e.ctx, "static-pv-nfs-1", metav1.GetOptions{})
	dup = dup.DeepCopy()
	dup.Name, dup.ResourceVersion = "static-pv-nfs-1-copy", ""
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "copy", Namespace: "apps"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeName: dup.Name}}
	e.add(dup, claim, userPod("copy-user", node, "copy"))
	_, err := e.srv.NodeStageVolume(e.ctx, req)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "static-pv-nfs-1, static-pv-nfs-1-copy") {
		t.Fatalf("two PVs with one handle: %v", err)
	}
}

// TestVolumeContextPVMustMatch: the PV named in the volume context must be
// this driver's volume of that handle.
func TestVolumeContextPVMustMatch(t *testing.T) {
	e := newEnv(t, stagingSpec, map[v1alpha1.Phase]podAction{v1alpha1.PhaseStaging: {onStart: makeVolumeDir("x")}})
	vc := e.dynamicVolume("vol-a", corev1.PersistentVolumeFilesystem)
	for name, mutate := range map[string]func(map[string]string){
		"another volume's PV": func(m map[string]string) {
			e.dynamicVolume("vol-b", corev1.PersistentVolumeFilesystem)
			m["pav.albertofaria.github.io/pv"] = "pv-vol-b"
		},
		"no such PV": func(m map[string]string) { m["pav.albertofaria.github.io/pv"] = "pv-nope" },
	} {
		t.Run(name, func(t *testing.T) {
			req := e.stageReq("vol-a", false)
			req.VolumeContext = map[string]string{}
			for k, v := range vc {
				req.VolumeContext[k] = v
			}
			mutate(req.VolumeContext)
			_, err := e.srv.NodeStageVolume(e.ctx, req)
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("error %v, want FailedPrecondition", err)
			}
			if n := e.count(v1alpha1.PhaseStaging); n != 0 {
				t.Fatalf("%d staging pods", n)
			}
		})
	}
}

// BenchmarkAPIRequestsPerVolume is the node side of pav's API budget
// (internal/apibudget): the requests of one NodeStageVolume and one
// NodeUnstageVolume of a volume pav created, with a staging pod that keeps
// running and one that completes, reported per operation; above the budget it
// fails. TestAPIRequestsPerOperation says which requests they are.
//
//	go test ./nodeserver -run '^$' -bench APIRequests
func BenchmarkAPIRequestsPerVolume(b *testing.B) {
	spec := "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Mi}\n" +
		"  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: b}]}}}\n" + unstagingSpec
	for _, tc := range []struct {
		name    string
		outcome fakekubelet.Outcome
	}{
		{"KeepRunning", fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}},
		{"Completes", fakekubelet.Outcome{Kind: fakekubelet.Succeed}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := newEnv(b, spec, map[v1alpha1.Phase]podAction{v1alpha1.PhaseStaging: {outcome: tc.outcome, onStart: makeVolumeDir("x")}})
			var stages, unstages int
			b.ResetTimer()
			for i := range b.N {
				req := e.stageReq(fmt.Sprintf("bench-%d", i), false)
				req.VolumeContext = e.dynamicVolume(req.VolumeId, corev1.PersistentVolumeFilesystem)
				stage := e.requests(func() {
					if _, err := e.srv.NodeStageVolume(e.ctx, req); err != nil {
						b.Fatal(err)
					}
				})
				unstage := e.requests(func() { e.unstage(req) })
				stages += len(stage)
				unstages += len(unstage)
				if len(stage) > apibudget.Stage || len(unstage) > apibudget.Unstage {
					b.Fatalf("NodeStageVolume made %d requests %v (budget %d), NodeUnstageVolume %d %v (budget %d)",
						len(stage), stage, apibudget.Stage, len(unstage), unstage, apibudget.Unstage)
				}
			}
			b.ReportMetric(float64(stages)/float64(b.N), "stage-requests/op")
			b.ReportMetric(float64(unstages)/float64(b.N), "unstage-requests/op")
		})
	}
}
