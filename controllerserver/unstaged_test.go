package controllerserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
	"github.com/pods-as-volumes/pav/podrunner"
)

// DeleteVolume waits for the pods nodes run for the volume (unstaged.go), on
// the real pod runner's informer: only those of this volume, of a node
// phase, in pav's namespace or the claim's, ended or not; it goes on as soon as
// they are gone, and fails FAILED_PRECONDITION, having run nothing, if they
// stay.
func TestDeleteVolumeWaitsForNodePods(t *testing.T) {
	pvc, sc := claimObjects()
	handle := DefaultHandle(pvc) // claimSpec's creation writes no handle
	const other = "someone-else"
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		// goesAfter: the pod is deleted this long after the call (0: never).
		goesAfter time.Duration
		wantCode  codes.Code
		wantMsg   string
	}{
		{name: "a running staging pod in pav's namespace: waits, then fails naming it", pod: nodePod(podrunner.DefaultNamespace, "s1", "staging", handle+"@n1", corev1.PodRunning),
			wantCode: codes.FailedPrecondition, wantMsg: "still in use on node n1: its staging pod pav/s1 is still there"},
		{name: "an unstaging pod under way: the deletion goes on once it is gone", pod: nodePod(podrunner.DefaultNamespace, "u1", "unstaging", handle+"@n1", corev1.PodPending),
			goesAfter: 300 * time.Millisecond},
		{name: "a node expansion pod in the claim's namespace counts", pod: nodePod(pvc.Namespace, "x1", string(v1alpha1.PhaseNodeExpansion), handle+"@n1", corev1.PodRunning),
			wantCode: codes.FailedPrecondition, wantMsg: "its nodeexpansion pod ns1/x1"},
		{name: "a pod in another tenant's namespace is not pav's word", pod: nodePod(other, "s2", "staging", handle+"@n1", corev1.PodRunning)},
		{name: "another volume's pod (a handle with an @)", pod: nodePod(podrunner.DefaultNamespace, "s3", "staging", handle+"@n1@n1", corev1.PodRunning)},
		{name: "a staging pod that ended counts until it is gone", pod: nodePod(podrunner.DefaultNamespace, "s4", "staging", handle+"@n1", corev1.PodSucceeded),
			goesAfter: 300 * time.Millisecond},
		{name: "a controller phase's pod", pod: nodePod(podrunner.DefaultNamespace, "c1", "creation", handle+"@n1", corev1.PodRunning)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := newCluster(t, pvc, sc, tc.pod)
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Mi"})}}
			s := c.server(prov(t, claimSpec), runner)
			if _, err := s.CreateVolume(ctx, claimReq(pvc)); err != nil {
				t.Fatal(err)
			}
			s.SetNodePods(startNodePods(ctx, t, c))
			s.unstagedWait = time.Second
			if tc.goesAfter > 0 {
				time.AfterFunc(tc.goesAfter, func() {
					_ = c.client.CoreV1().Pods(tc.pod.Namespace).Delete(context.Background(), tc.pod.Name, metav1.DeleteOptions{})
				})
			}
			start := time.Now()
			_, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: handle})
			if took := time.Since(start); took < tc.goesAfter {
				t.Fatalf("DeleteVolume returned after %v, before the pod went (%v)", took, tc.goesAfter)
			}
			if status.Code(err) != tc.wantCode || tc.wantMsg != "" && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("error = %v, want %v %q", err, tc.wantCode, tc.wantMsg)
			}
			ran := strings.Join(runner.phases(), " ")
			if tc.wantCode != codes.OK {
				if v := c.volume(DefaultHandle(pvc)); ran != "creation" || v == nil || v.Status.Phase != v1alpha1.VolumeCreated {
					t.Fatalf("pods %q, record %+v: the refused deletion changed something", ran, v)
				}
				return
			}
			if ran != "creation deletion" || len(c.volumes()) != 0 {
				t.Fatalf("pods %q, %d records left", ran, len(c.volumes()))
			}
		})
	}
}

// After a staging pod goes, the unstaging pod its node creates next is waited
// for too (unstagingFollows), and then until it is gone: the deletion pod runs
// after both, also when DeleteVolume comes after the staging pod went and
// before the unstaging pod is there. Without an unstaging template, nothing
// is waited for once the staging pod is gone.
func TestDeleteVolumeWaitsForTheUnstagingThatFollows(t *testing.T) {
	const withUnstaging = "  volumeUnstaging: {podTemplate: {spec: {containers: [{name: u, image: busybox}]}}}\n"
	for _, tc := range []struct {
		name, spec string
		// The node plugin's unstaging, from DeleteVolume's call on: the
		// staging pod goes after stagingGoes (negative: before the call),
		// the unstaging pod comes unstagingAfter later and goes after
		// unstagingRuns; DeleteVolume must not return before minTook.
		stagingGoes, unstagingAfter, unstagingRuns, minTook time.Duration
	}{
		{name: "while the staging pod is there", spec: withUnstaging,
			stagingGoes: 200 * time.Millisecond, unstagingAfter: 500 * time.Millisecond, unstagingRuns: 500 * time.Millisecond, minTook: 1200 * time.Millisecond},
		{name: "between the staging pod's going and the unstaging pod's creation", spec: withUnstaging,
			stagingGoes: -100 * time.Millisecond, unstagingAfter: 600 * time.Millisecond, unstagingRuns: 500 * time.Millisecond, minTook: 1000 * time.Millisecond},
		{name: "no unstaging template: the staging pod's going is enough",
			stagingGoes: 200 * time.Millisecond, minTook: 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pvc, sc := claimObjects()
			handle := DefaultHandle(pvc)
			staging := nodePod(podrunner.DefaultNamespace, "s1", "staging", handle+"@n1", corev1.PodRunning)
			c := newCluster(t, pvc, sc, staging)
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Mi"})}}
			s := c.server(prov(t, claimSpec+tc.spec), runner)
			if _, err := s.CreateVolume(ctx, claimReq(pvc)); err != nil {
				t.Fatal(err)
			}
			nodePods := startNodePods(ctx, t, c)
			s.SetNodePods(nodePods)
			s.unstagedWait = 10 * time.Second
			pods := c.client.CoreV1().Pods(podrunner.DefaultNamespace)
			deleteStaging := func() {
				_ = pods.Delete(ctx, staging.Name, metav1.DeleteOptions{})
				// Seen gone by the informer, as DeleteVolume would.
				if err := nodePods.WaitGone(ctx, staging); err != nil {
					t.Error(err)
				}
			}
			if tc.stagingGoes < 0 {
				deleteStaging()
				time.Sleep(-tc.stagingGoes)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				if tc.stagingGoes > 0 {
					time.Sleep(tc.stagingGoes)
					deleteStaging()
				}
				if tc.unstagingAfter == 0 {
					return
				}
				time.Sleep(tc.unstagingAfter)
				unstaging := nodePod(podrunner.DefaultNamespace, podrunner.PodName("test", v1alpha1.PhaseUnstaging, handle+"@n1"), "unstaging", handle+"@n1", corev1.PodPending)
				_, _ = pods.Create(ctx, unstaging, metav1.CreateOptions{})
				time.Sleep(tc.unstagingRuns)
				_ = pods.Delete(ctx, unstaging.Name, metav1.DeleteOptions{})
			}()
			start := time.Now()
			if _, err := s.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: handle}); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			<-done
			if took < tc.minTook || tc.unstagingAfter == 0 && took > unstagingFollows/2 {
				t.Fatalf("DeleteVolume returned after %v, want at least %v", took, tc.minTook)
			}
			if ran := strings.Join(runner.phases(), " "); ran != "creation deletion" || len(c.volumes()) != 0 {
				t.Fatalf("pods %q, %d records left", ran, len(c.volumes()))
			}
		})
	}
}

// nodePod is a pod a node runs for a volume of provisioner "test" on node n1.
func nodePod(ns, name, phase, key string, podPhase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name),
		Labels:      map[string]string{podrunner.LabelProvisioner: "test", podrunner.LabelPhase: phase, podrunner.LabelNode: podrunner.NodeLabel("n1")},
		Annotations: map[string]string{podrunner.AnnotationVolumeKey: key}},
		Spec: corev1.PodSpec{NodeName: "n1"}, Status: corev1.PodStatus{Phase: podPhase}}
}

// startNodePods is the controller plugin's pod runner on c's pods, started.
func startNodePods(ctx context.Context, t *testing.T, c *cluster) *podrunner.Runner {
	t.Helper()
	r := podrunner.New(podrunner.Config{Client: kubetest.Wrap(c.client), Provisioner: "test", ReportImage: "pav:test"})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}
