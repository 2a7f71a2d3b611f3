package controllerserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

// nsSpec is a provisioner whose pods run in the claim's namespace (as the
// encrypted-fs example's do in annotation mode), with whenNamespaceGone set
// to when ("": absent); deletionNS is the deletion template's namespace
// ("": none, pav's own).
func nsSpec(when, deletionNS string) string {
	w := ""
	if when != "" {
		w = "whenNamespaceGone: " + when + ", "
	}
	meta := ""
	if deletionNS != "" {
		meta = fmt.Sprintf("metadata: {namespace: %q}, ", deletionNS)
	}
	return `  provisioningModes: [Dynamic]
  volumeValidation: {accessModes: [ReadWriteOncePod]}
  volumeCreation:
    podTemplate: {metadata: {namespace: "{{ pvc.metadata.namespace }}"}, spec: {containers: [{name: c, image: busybox, command: [init]}]}}
  volumeDeletion: {` + w + `podTemplate: {` + meta + `spec: {containers: [{name: d, image: busybox, command: [rm]}]}}}
  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: busybox}]}}}
`
}

const claimNS = "{{ pvc.metadata.namespace }}"

// The API server's answers to a pod created in a namespace that is being
// deleted, or that does not exist (podrunner tells them apart).
func nsTerminating(ns string) *podrunner.NamespaceGoneError {
	err := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("unable to create new content in namespace "+ns+" because it is being terminated"))
	return &podrunner.NamespaceGoneError{Phase: "deletion", Namespace: ns, Terminating: true, Err: err}
}

func nsMissing(ns string) *podrunner.NamespaceGoneError {
	return &podrunner.NamespaceGoneError{Phase: "deletion", Namespace: ns, Err: apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, ns)}
}

// refuseIn makes the fake API server refuse the creation of pods of a phase
// (any phase if ph is "") with err.
func refuseIn(ph v1alpha1.Phase, err func(ns string) *podrunner.NamespaceGoneError) func(op podrunner.Operation) error {
	return func(op podrunner.Operation) error {
		if ph != "" && op.Phase != ph {
			return nil
		}
		e := err(op.Namespace(podrunner.DefaultNamespace))
		e.Phase = string(op.Phase)
		return e
	}
}

// events records the events put on objects.
type events struct {
	mu  sync.Mutex
	got []string // "Kind/name type reason: message"
}

func (r *events) Event(obj runtime.Object, eventtype, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	kind := fmt.Sprintf("%T", obj)
	if pv, ok := obj.(*corev1.PersistentVolume); ok {
		kind = "PersistentVolume/" + pv.Name
	}
	r.got = append(r.got, fmt.Sprintf("%s %s %s: %s", kind, eventtype, reason, message))
}

func (r *events) Eventf(obj runtime.Object, eventtype, reason, format string, args ...any) {
	r.Event(obj, eventtype, reason, fmt.Sprintf(format, args...))
}

func (r *events) AnnotatedEventf(obj runtime.Object, _ map[string]string, eventtype, reason, format string, args ...any) {
	r.Eventf(obj, eventtype, reason, format, args...)
}

func (r *events) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// nsVolume creates the claim's volume (pvc-uid-1, in namespace ns1) and its
// PV as external-provisioner makes it, has an administrator annotate its
// record (annotation "": not), and returns a fresh server (a restarted
// controller plugin) with an event recorder.
func nsVolume(t *testing.T, spec string, runner *fakeRunner, annotation string) (*cluster, *Server, *events) {
	t.Helper()
	pvc, sc := claimObjects()
	c := newCluster(t, pvc, sc)
	p := prov(t, spec)
	runner.answers = answers{v1alpha1.PhaseCreation: files(map[string]string{"capacity": "1Mi"})}
	resp, err := c.server(p, runner).CreateVolume(context.Background(), claimReq(pvc))
	if err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-uid-1"},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
			CSI: &corev1.CSIPersistentVolumeSource{Driver: p.Name, VolumeHandle: resp.Volume.VolumeId}}}}
	if _, err := c.client.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if annotation != "" {
		c.annotate("pvc-uid-1", annotation)
	}
	s := c.server(p, runner)
	ev := &events{}
	s.Recorder = ev
	return c, s, ev
}

// annotate sets the administrator's annotation on the volume's record.
func (c *cluster) annotate(name, value string) {
	c.t.Helper()
	res := c.records.Resource(v1alpha1.VolumeGroupVersionResource)
	u, err := res.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	a := u.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[v1alpha1.AnnotationWhenNamespaceGone] = value
	u.SetAnnotations(a)
	if _, err := res.Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

func deleteReq(handle string) *csi.DeleteVolumeRequest {
	return &csi.DeleteVolumeRequest{VolumeId: handle}
}

// TestDeleteVolumeNamespaceGone: a deletion pod whose namespace is gone or
// being deleted (as the API server answers the pod's creation) is reported,
// or the volume forgotten without a pod, as whenNamespaceGone (the volume's
// annotation, else the provisioner's) says; other refusals are not taken for
// it.
func TestDeleteVolumeNamespaceGone(t *testing.T) {
	quota := func(op podrunner.Operation) error {
		if op.Phase != v1alpha1.PhaseDeletion {
			return nil
		}
		return fmt.Errorf("creating deletion pod: %w", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("exceeded quota: team-a")))
	}
	for _, tc := range []struct {
		name       string
		spec       string
		annotation string // on the PavVolume ("": none)
		refuse     func(op podrunner.Operation) error
		wantCode   codes.Code
		want       []string // in the error, the record's message and the event
		// wantReason is the record's reason left; "gone": no record left.
		wantReason string
		wantEvent  string // "Warning DeletionNamespaceGone", "Normal VolumeForgotten", "" (none)
	}{
		{name: "being deleted, whenNamespaceGone absent: Retry, reported", spec: nsSpec("", claimNS), refuse: refuseIn(v1alpha1.PhaseDeletion, nsTerminating),
			wantCode: codes.FailedPrecondition, wantReason: v1alpha1.ReasonDeletionNamespaceGone, wantEvent: "Warning DeletionNamespaceGone",
			want: []string{`volume pvc-uid-1 cannot be deleted: its deletion pod cannot be created in namespace "ns1", which is being deleted (from spec.volumeDeletion.podTemplate.metadata.namespace of PavProvisioner test)`,
				"pav keeps its PV and its PavVolume and retries, as spec.volumeDeletion.whenNamespaceGone says (Retry)",
				"kubectl annotate pavvolume pvc-uid-1 pav.albertofaria.github.io/when-namespace-gone=Forget",
				"docs/operations.md#a-released-pv-stays-its-deletion-pods-namespace-is-gone"}},
		{name: "missing, Retry: reported", spec: nsSpec("Retry", claimNS), refuse: refuseIn(v1alpha1.PhaseDeletion, nsMissing),
			wantCode: codes.FailedPrecondition, wantReason: v1alpha1.ReasonDeletionNamespaceGone, wantEvent: "Warning DeletionNamespaceGone",
			want: []string{`namespace "ns1", which no longer exists`}},
		{name: "being deleted, Forget: forgotten without a pod", spec: nsSpec("Forget", claimNS), refuse: refuseIn(v1alpha1.PhaseDeletion, nsTerminating),
			wantReason: "gone", wantEvent: "Normal VolumeForgotten",
			want: []string{`volume pvc-uid-1 was forgotten without its deletion pod, which cannot run in namespace "ns1", which is being deleted`,
				"spec.volumeDeletion.whenNamespaceGone says Forget", "pav deleted nothing"}},
		{name: "missing, Forget: forgotten without a pod", spec: nsSpec("Forget", claimNS), refuse: refuseIn(v1alpha1.PhaseDeletion, nsMissing),
			wantReason: "gone", wantEvent: "Normal VolumeForgotten", want: []string{"which no longer exists"}},
		{name: "Forget never applies to pav's own namespace", spec: nsSpec("Forget", ""), refuse: refuseIn(v1alpha1.PhaseDeletion, nsTerminating),
			wantCode: codes.FailedPrecondition, wantReason: v1alpha1.ReasonDeletionNamespaceGone, wantEvent: "Warning DeletionNamespaceGone",
			want: []string{`namespace "pav", which is being deleted`, `Forget does not apply to pav's own namespace "pav"`,
				"spec.volumeDeletion.podTemplate.metadata.namespace of PavProvisioner test now names none"}},
		{name: "the volume's annotation Forget overrides Retry", spec: nsSpec("Retry", claimNS), annotation: "Forget", refuse: refuseIn(v1alpha1.PhaseDeletion, nsMissing),
			wantReason: "gone", wantEvent: "Normal VolumeForgotten", want: []string{"the PavVolume's annotation pav.albertofaria.github.io/when-namespace-gone says Forget"}},
		{name: "the volume's annotation Forget applies to pav's own namespace", spec: nsSpec("", ""), annotation: "Forget", refuse: refuseIn(v1alpha1.PhaseDeletion, nsMissing),
			wantReason: "gone", wantEvent: "Normal VolumeForgotten"},
		{name: "the volume's annotation Retry overrides Forget", spec: nsSpec("Forget", claimNS), annotation: "Retry", refuse: refuseIn(v1alpha1.PhaseDeletion, nsTerminating),
			wantCode: codes.FailedPrecondition, wantReason: v1alpha1.ReasonDeletionNamespaceGone, wantEvent: "Warning DeletionNamespaceGone",
			want: []string{"as the PavVolume's annotation pav.albertofaria.github.io/when-namespace-gone says (Retry)"}},
		{name: "an annotation pav does not know is Retry", spec: nsSpec("Forget", claimNS), annotation: "forget please", refuse: refuseIn(v1alpha1.PhaseDeletion, nsTerminating),
			wantCode: codes.FailedPrecondition, wantReason: v1alpha1.ReasonDeletionNamespaceGone, wantEvent: "Warning DeletionNamespaceGone",
			want: []string{`its value "forget please" is neither Forget nor Retry, so pav retries`}},
		{name: "another refusal is not the namespace gone", spec: nsSpec("Forget", claimNS), refuse: quota,
			wantCode: codes.PermissionDenied, want: []string{"exceeded quota"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runner := &fakeRunner{}
			c, s, ev := nsVolume(t, tc.spec, runner, tc.annotation)
			runner.refuse = tc.refuse
			created := runner.created
			_, err := s.DeleteVolume(context.Background(), deleteReq("pvc-uid-1"))
			if status.Code(err) != tc.wantCode {
				t.Fatalf("DeleteVolume = %v, want %v", err, tc.wantCode)
			}
			if runner.created != created {
				t.Errorf("%d deletion pods created, want none", runner.created-created)
			}
			v := c.volume("pvc-uid-1")
			switch {
			case tc.wantReason == "gone" && v != nil:
				t.Fatalf("record left: %+v", v.Status)
			case tc.wantReason != "gone" && (v == nil || v.Status.Reason != tc.wantReason || v.Status.Phase != v1alpha1.VolumeDeleting):
				t.Fatalf("record %+v, want Deleting with reason %q", v, tc.wantReason)
			}
			got := ev.list()
			if tc.wantEvent == "" && len(got) > 0 || tc.wantEvent != "" && (len(got) != 1 || !strings.HasPrefix(got[0], "PersistentVolume/pvc-uid-1 "+tc.wantEvent+": ")) {
				t.Fatalf("events %q, want one %q on the PV", got, tc.wantEvent)
			}
			for _, w := range tc.want {
				if err != nil && !strings.Contains(status.Convert(err).Message(), w) {
					t.Errorf("error %q lacks %q", status.Convert(err).Message(), w)
				}
				if v != nil && tc.wantReason != "" && !strings.Contains(v.Status.Message, w) {
					t.Errorf("record's message %q lacks %q", v.Status.Message, w)
				}
				if tc.wantEvent != "" && !strings.Contains(got[0], w) {
					t.Errorf("event %q lacks %q", got[0], w)
				}
			}
			if err != nil && v != nil && tc.wantReason == v1alpha1.ReasonDeletionNamespaceGone && status.Convert(err).Message() != v.Status.Message {
				t.Errorf("the error and the record say different things:\n%s\n%s", status.Convert(err).Message(), v.Status.Message)
			}
		})
	}
}

// TestNamespaceGoneWayOut: the report is written once, however often
// external-provisioner retries; an administrator's annotation then has the
// volume forgotten, and that decision is recorded before the record goes, so
// that a controller plugin restarted in between finishes forgetting, even
// once a namespace of that name exists again, and never runs the pod.
func TestNamespaceGoneWayOut(t *testing.T) {
	runner := &fakeRunner{}
	c, s, ev := nsVolume(t, nsSpec("", claimNS), runner, "")
	runner.refuse = refuseIn(v1alpha1.PhaseDeletion, nsTerminating)
	writes := 0
	c.records.PrependReactor("update", v1alpha1.VolumeResource, func(k8stesting.Action) (bool, runtime.Object, error) {
		writes++
		return false, nil, nil
	})
	for range 3 {
		if _, err := s.DeleteVolume(context.Background(), deleteReq("pvc-uid-1")); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("DeleteVolume = %v", err)
		}
	}
	if v := c.volume("pvc-uid-1"); v.Status.Reason != v1alpha1.ReasonDeletionNamespaceGone || writes != 2 {
		// Created → Deleting with the deletion pod's entry, then the report.
		t.Fatalf("reason %q after %d writes, want %q after 2", v.Status.Reason, writes, v1alpha1.ReasonDeletionNamespaceGone)
	}
	if n := len(ev.list()); n != 3 {
		t.Errorf("%d events, want one per attempt (the recorder aggregates them)", n)
	}

	// The administrator says Forget; the record's deletion fails once (the
	// controller plugin dies there).
	c.annotate("pvc-uid-1", "Forget")
	failed := false
	c.records.PrependReactor("delete", v1alpha1.VolumeResource, func(k8stesting.Action) (bool, runtime.Object, error) {
		if !failed {
			failed = true
			return true, nil, apierrors.NewServiceUnavailable("etcd leader changed")
		}
		return false, nil, nil
	})
	p, _ := s.Source.Get(false)
	if _, err := c.server(p, runner).DeleteVolume(context.Background(), deleteReq("pvc-uid-1")); status.Code(err) != codes.Unavailable {
		t.Fatalf("DeleteVolume = %v, want Unavailable", err)
	}
	v := c.volume("pvc-uid-1")
	if v == nil || v.Status.Reason != v1alpha1.ReasonForgotten || !strings.Contains(v.Status.Message, "the PavVolume's annotation pav.albertofaria.github.io/when-namespace-gone says Forget") {
		t.Fatalf("record %+v: the decision must be recorded before the record goes", v)
	}

	// Restarted; the namespace exists again, and the annotation is gone:
	// the recorded decision stands.
	runner.refuse = nil
	c.annotate("pvc-uid-1", "")
	if _, err := c.server(p, runner).DeleteVolume(context.Background(), deleteReq("pvc-uid-1")); err != nil {
		t.Fatal(err)
	}
	if c.volume("pvc-uid-1") != nil || runner.created != 1 || runner.live() != 0 {
		t.Fatalf("record left %v, %d pods created (want only the creation pod), %d left", c.volume("pvc-uid-1") != nil, runner.created, runner.live())
	}
	// And a retry of the DeleteVolume now finds nothing: OK.
	if _, err := c.server(p, runner).DeleteVolume(context.Background(), deleteReq("pvc-uid-1")); err != nil {
		t.Fatal(err)
	}
}

// TestNamespaceBack: once a namespace of that name exists again, the
// deletion pod recorded for it runs (the same entry), and the report goes as
// soon as it is created: a later failure of the pod is reported as such.
func TestNamespaceBack(t *testing.T) {
	runner := &fakeRunner{}
	c, s, _ := nsVolume(t, nsSpec("Retry", claimNS), runner, "")
	runner.refuse = refuseIn(v1alpha1.PhaseDeletion, nsMissing)
	if _, err := s.DeleteVolume(context.Background(), deleteReq("pvc-uid-1")); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("DeleteVolume = %v", err)
	}
	token := c.volume("pvc-uid-1").Status.Pod(v1alpha1.PhaseDeletion).Token
	runner.refuse = nil
	runner.answers[v1alpha1.PhaseDeletion] = podFails("backend down")
	if _, err := s.DeleteVolume(context.Background(), deleteReq("pvc-uid-1")); status.Code(err) != codes.Internal {
		t.Fatalf("DeleteVolume = %v, want the pod's failure", err)
	}
	v := c.volume("pvc-uid-1")
	if v.Status.Reason != "" || !strings.Contains(v.Status.Message, "backend down") || v.Status.Pods[len(v.Status.Pods)-1].Token != token {
		t.Fatalf("record %+v: want the report replaced by the pod's failure, the recorded pod run", v.Status)
	}
	runner.answers[v1alpha1.PhaseDeletion] = nil
	if _, err := s.DeleteVolume(context.Background(), deleteReq("pvc-uid-1")); err != nil || c.volume("pvc-uid-1") != nil {
		t.Fatalf("DeleteVolume = %v; record left: %v", err, c.volume("pvc-uid-1") != nil)
	}
}

// TestCreationNamespaceGone: a validation or creation pod whose namespace is
// gone (the claim was deleted with its namespace) ends the creation: with
// nothing made, the record goes and the error is final; after a creation pod
// of ours ran (it was killed with its namespace), the revert is due, and its
// deletion pod meets the same namespace: Forget ends it, Retry keeps it,
// reported.
func TestCreationNamespaceGone(t *testing.T) {
	validated := strings.Replace(nsSpec("", claimNS), "volumeValidation: {accessModes: [ReadWriteOncePod]}",
		`volumeValidation: {accessModes: [ReadWriteOncePod], podTemplate: {metadata: {namespace: "{{ pvc.metadata.namespace }}"}, spec: {containers: [{name: v, image: busybox}]}}}`, 1)
	for _, tc := range []struct {
		name        string
		spec        string
		creationRan bool // a creation pod of ours ran, and was killed with the namespace
		wantCode    codes.Code
		wantRecord  v1alpha1.VolumePhase
		wantReason  string
	}{
		{name: "validation pod: nothing made, the record goes", spec: validated, wantCode: codes.FailedPrecondition},
		{name: "creation pod never ran: nothing made, the record goes", spec: nsSpec("", claimNS), wantCode: codes.FailedPrecondition},
		{name: "creation pod killed, revert with Forget: the record goes", spec: nsSpec("Forget", claimNS), creationRan: true, wantCode: codes.Internal},
		{name: "creation pod killed, revert with Retry: reported, retried", spec: nsSpec("", claimNS), creationRan: true,
			wantCode: codes.Aborted, wantRecord: v1alpha1.VolumeReverting, wantReason: v1alpha1.ReasonDeletionNamespaceGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pvc, sc := claimObjects()
			c := newCluster(t, pvc, sc)
			p := prov(t, tc.spec)
			runner := &fakeRunner{answers: answers{}}
			if tc.creationRan {
				runner.answers[v1alpha1.PhaseCreation] = func(podrunner.Operation) (*podrunner.Result, error) { return nil, context.DeadlineExceeded }
				if _, err := c.server(p, runner).CreateVolume(context.Background(), claimReq(pvc)); status.Code(err) != codes.DeadlineExceeded {
					t.Fatalf("first call: %v", err)
				}
				runner.mu.Lock()
				runner.pods = map[string]fakePod{} // the namespace's deletion kills it
				runner.mu.Unlock()
				if _, err := c.server(p, runner).CreateVolume(context.Background(), claimReq(pvc)); status.Code(err) != codes.Aborted {
					t.Fatalf("pod lost: %v", err)
				}
			}
			runner.refuse = refuseIn("", nsTerminating)
			_, err := c.server(p, runner).CreateVolume(context.Background(), claimReq(pvc))
			if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), `namespace "ns1"`) {
				t.Fatalf("CreateVolume = %v, want %v naming the namespace", err, tc.wantCode)
			}
			v := c.volume("pvc-uid-1")
			var left v1alpha1.VolumePhase
			if v != nil {
				left = v.Status.Phase
			}
			if left != tc.wantRecord || v != nil && v.Status.Reason != tc.wantReason {
				t.Fatalf("record %+v, want phase %q reason %q", v, tc.wantRecord, tc.wantReason)
			}
			if v != nil && !strings.Contains(v.Status.Message, "volume creation failed: the creation pod cannot be created") {
				t.Errorf("the record's message %q lost the creation's failure", v.Status.Message)
			}
			if tc.wantRecord == v1alpha1.VolumeReverting && !strings.Contains(err.Error(), "kubectl annotate pavvolume pvc-uid-1") {
				t.Errorf("error %q does not say the way out", err)
			}
			if runner.live() != 0 {
				t.Errorf("%d pods left", runner.live())
			}
		})
	}
}

// TestExpansionNamespaceGone: an expansion under way whose pod's namespace
// went (its claim was deleted with it) does not hold the deletion up: its
// failure is recorded, and the deletion meets the same namespace.
func TestExpansionNamespaceGone(t *testing.T) {
	spec := strings.Replace(nsSpec("Forget", claimNS), "  volumeStaging:",
		`  volumeExpansion: {podTemplate: {metadata: {namespace: "{{ pvc.metadata.namespace }}"}, spec: {containers: [{name: g, image: busybox}]}}}`+"\n  volumeStaging:", 1)
	runner := &fakeRunner{}
	c, s, ev := nsVolume(t, spec, runner, "")
	runner.answers[v1alpha1.PhaseExpansion] = func(podrunner.Operation) (*podrunner.Result, error) { return nil, context.DeadlineExceeded }
	if _, err := s.ControllerExpandVolume(context.Background(), expandReq("pvc-uid-1", 2<<20, 0)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("expansion: %v", err)
	}
	runner.mu.Lock()
	runner.pods = map[string]fakePod{} // killed with its namespace
	runner.mu.Unlock()
	runner.refuse = refuseIn("", nsTerminating)
	if _, err := s.DeleteVolume(context.Background(), deleteReq("pvc-uid-1")); status.Code(err) != codes.Aborted {
		// The lost expansion pod is recorded first (ABORTED), as any.
		t.Fatalf("DeleteVolume = %v, want Aborted", err)
	}
	if _, err := s.DeleteVolume(context.Background(), deleteReq("pvc-uid-1")); err != nil {
		t.Fatalf("DeleteVolume = %v", err)
	}
	if c.volume("pvc-uid-1") != nil || runner.live() != 0 {
		t.Fatal("the volume was not forgotten")
	}
	if got := ev.list(); len(got) != 1 || !strings.Contains(got[0], "Normal VolumeForgotten") {
		t.Fatalf("events %q", got)
	}
}
