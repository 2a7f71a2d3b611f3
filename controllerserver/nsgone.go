package controllerserver

// A deletion pod whose namespace is gone.
//
// A template may put the deletion pod in the claim's own namespace (the
// encryption and encrypted-fs examples, in annotation mode, do: their data is
// on a claim of that namespace), or in any other. Once that namespace is
// deleted, the pod can never be created: the API server refuses it (403
// Forbidden with cause NamespaceTerminating while the namespace is being
// deleted, 404 NotFound of the namespace once it is gone; podrunner turns
// exactly these answers, and nothing guessed, into a *NamespaceGoneError).
// Retrying cannot help, and until something changes the PV stays Released
// and the record stays for ever.
//
// What the deletion then means is the provisioner author's word, or a
// cluster administrator's, never a tenant's (v1alpha1.WhenNamespaceGone):
//
//   - Retry (the default): the record and the PV stay, and pav says why,
//     every time external-provisioner retries: status.reason
//     DeletionNamespaceGone with a message that names the namespace, what put
//     the pod there and the ways out (`kubectl get pavvol` shows the reason),
//     a Warning event DeletionNamespaceGone on the PV, and the same message
//     as DeleteVolume's FAILED_PRECONDITION, which external-provisioner puts
//     on the PV as VolumeFailedDelete. The deletion pod runs if a namespace
//     of that name exists again (its entry is kept: the pod is asked for
//     under the same identity).
//   - Forget: that namespace held the volume's data, which went with it.
//     pav records the decision (status.reason Forgotten) and only then
//     removes the record, without any pod; a retry after a restart finishes
//     forgetting whatever the namespace has become. A Normal event
//     VolumeForgotten on the PV says so. pav deletes nothing.
//
// The decision comes from the PavVolume's annotation
// v1alpha1.AnnotationWhenNamespaceGone (an administrator's, per volume: only
// administrators and pav may write PavVolumes), else from the provisioner's
// literal spec.volumeDeletion.whenNamespaceGone. The provisioner's Forget
// never applies to pav's own namespace, which holds pav, never a volume's
// data; an annotation does, since an administrator wrote it for that volume.

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/podrunner"
)

// Reasons of the events the controller plugin puts on a volume's PV.
const (
	// EventDeletionNamespaceGone (Warning): the volume's deletion pod cannot
	// be created because its namespace is gone; pav retries.
	EventDeletionNamespaceGone = v1alpha1.ReasonDeletionNamespaceGone
	// EventVolumeForgotten (Normal): pav forgot the volume without its
	// deletion pod, as whenNamespaceGone Forget says.
	EventVolumeForgotten = "VolumeForgotten"
)

// troubleshooting is where the ways out are documented.
const troubleshooting = "docs/operations.md#a-released-pv-stays-its-deletion-pods-namespace-is-gone"

// whenNamespaceGone decides what the volume's deletion means now that the
// deletion pod's namespace ns is gone, and says who decided (by), and what was
// ignored, if anything (note).
func (j *job) whenNamespaceGone(ns string) (when v1alpha1.WhenNamespaceGone, by, note string) {
	if a, ok := j.v.Annotations[v1alpha1.AnnotationWhenNamespaceGone]; ok {
		switch w := v1alpha1.WhenNamespaceGone(a); w {
		case v1alpha1.NamespaceGoneForget, v1alpha1.NamespaceGoneRetry:
			return w, "the PavVolume's annotation " + v1alpha1.AnnotationWhenNamespaceGone, ""
		}
		// Never forget on a word pav does not know.
		return v1alpha1.NamespaceGoneRetry, "the PavVolume's annotation " + v1alpha1.AnnotationWhenNamespaceGone,
			fmt.Sprintf("its value %q is neither Forget nor Retry, so pav retries", a)
	}
	const field = "spec.volumeDeletion.whenNamespaceGone"
	w, err := phase.WhenNamespaceGoneOf(&j.p.Spec)
	if err != nil {
		return v1alpha1.NamespaceGoneRetry, field, err.Error()
	}
	if w == v1alpha1.NamespaceGoneForget && ns == j.s.Pods.Namespace(podrunner.Operation{}) {
		return v1alpha1.NamespaceGoneRetry, field, fmt.Sprintf("Forget does not apply to pav's own namespace %q, which never holds a volume's data", ns)
	}
	return w, field, ""
}

// namespaceGone answers a deletion pod (of DeleteVolume, or of the revert of a
// failed creation) that cannot be created because its namespace is gone:
// it records the report, or the decision to forget the volume, before it
// acts on it. nil means: forgotten, the caller removes the record.
func (j *job) namespaceGone(ctx context.Context, gone *podrunner.NamespaceGoneError, cfg *phase.DeletionConfig) error {
	logger := klog.FromContext(ctx).WithValues("volume", j.v.Spec.VolumeName, "namespace", gone.Namespace, "terminating", gone.Terminating)
	when, by, note := j.whenNamespaceGone(gone.Namespace)
	state := "no longer exists"
	if gone.Terminating {
		state = "is being deleted"
	}
	where := fmt.Sprintf("namespace %q, which %s (%s)", gone.Namespace, state, namespaceOrigin(j.p.Name, gone.Namespace, cfg))
	if note != "" {
		note = " (" + by + ": " + note + ")"
	}
	if when == v1alpha1.NamespaceGoneForget {
		msg := fmt.Sprintf("volume %s was forgotten without its deletion pod, which cannot run in %s: %s says Forget, that is, "+
			"the namespace held the volume's data, which went with it. pav deleted nothing; whatever of the volume is left outside that namespace stays",
			j.v.Spec.VolumeName, where, by)
		if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
			v.Status.Reason, v.Status.Message = v1alpha1.ReasonForgotten, msg
		}); err != nil {
			return err
		}
		logger.Info("Forgetting the volume: its deletion pod's namespace is gone", "by", by)
		j.s.volumeEvent(ctx, j.v, corev1.EventTypeNormal, EventVolumeForgotten, msg)
		return j.removeDone(ctx)
	}

	what := fmt.Sprintf("volume %s cannot be deleted", j.v.Spec.VolumeName)
	keeps := "pav keeps its PV and its PavVolume"
	if j.v.Status.Phase == v1alpha1.VolumeReverting {
		what = fmt.Sprintf("the failed creation of volume %s cannot be undone", j.v.Spec.VolumeName)
		keeps = "pav keeps its PavVolume"
	}
	report := fmt.Sprintf("%s: its deletion pod cannot be created in %s. %s and retries, as %s says (Retry)%s. "+
		"If that namespace held the volume's data, tell pav to forget the volume without a pod: "+
		"kubectl annotate pavvolume %s %s=%s; otherwise create the namespace again (once it is gone) with what the deletion pod needs. See %s",
		what, where, keeps, by, note, j.v.Name, v1alpha1.AnnotationWhenNamespaceGone, v1alpha1.NamespaceGoneForget, troubleshooting)
	st := &j.v.Status
	if st.Reason != v1alpha1.ReasonDeletionNamespaceGone || st.Phase == v1alpha1.VolumeDeleting && st.Message != report {
		// (Written once, not at every retry.)
		if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
			v.Status.Reason = v1alpha1.ReasonDeletionNamespaceGone
			if v.Status.Phase == v1alpha1.VolumeDeleting {
				// (Reverting keeps the creation's failure: the caller gets
				// it once the revert is done.)
				v.Status.Message = report
			}
		}); err != nil {
			return err
		}
	}
	logger.Info("The deletion pod cannot be created: its namespace is gone; retrying", "by", by)
	j.s.volumeEvent(ctx, j.v, corev1.EventTypeWarning, EventDeletionNamespaceGone, report)
	return grpcerr.WithCode(codes.FailedPrecondition, &reportError{msg: report, err: gone})
}

// reportError is a message for people that keeps the error it explains in
// the chain.
type reportError struct {
	msg string
	err error
}

func (e *reportError) Error() string { return e.msg }
func (e *reportError) Unwrap() error { return e.err }

// namespaceOrigin says what put the deletion pod in namespace ns.
func namespaceOrigin(provisioner, ns string, cfg *phase.DeletionConfig) string {
	field := fmt.Sprintf("spec.volumeDeletion.podTemplate.metadata.namespace of PavProvisioner %s", provisioner)
	switch {
	case cfg == nil || cfg.PodTemplate == nil:
		return "where the deletion pod was recorded"
	case cfg.PodTemplate.Namespace == "":
		return fmt.Sprintf("recorded when the deletion pod was asked for; %s now names none: pav's own namespace", field)
	case cfg.PodTemplate.Namespace != ns:
		return fmt.Sprintf("recorded when the deletion pod was asked for; %s now gives %q", field, cfg.PodTemplate.Namespace)
	}
	return "from " + field
}

// clearNamespaceGone takes back the report once the deletion pod could be
// created (its namespace exists again). A Reverting record's reason was the
// creation's failure; which one is not kept, and CreationFailed stands for it
// (only the revert's final code could differ, for a claim that cannot be
// waiting for it: the namespace its pods ran in went away).
func clearNamespaceGone(v *v1alpha1.PavVolume) {
	if v.Status.Reason != v1alpha1.ReasonDeletionNamespaceGone {
		return
	}
	if v.Status.Phase == v1alpha1.VolumeReverting {
		v.Status.Reason = v1alpha1.ReasonCreationFailed
		return
	}
	v.Status.Reason, v.Status.Message = "", ""
}

// volumeEvent puts an event on the volume's PersistentVolume, if the
// controller plugin has a recorder and the PV is there and is this volume's
// (its driver and handle). external-provisioner names the PV after the CSI
// volume name; an adopted volume's record names its PV.
func (s *Server) volumeEvent(ctx context.Context, v *v1alpha1.PavVolume, eventtype, reason, msg string) {
	if s.Recorder == nil || s.Client == nil {
		return
	}
	name := v.Spec.VolumeName
	if v.Spec.Adopted != nil {
		name = v.Spec.Adopted.PersistentVolume
	}
	pv, err := s.Client.PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		klog.FromContext(ctx).V(2).Info("No event on the volume's PV", "pv", name, "reason", reason, "err", err)
		return
	}
	if c := pv.Spec.CSI; c == nil || c.Driver != v.Spec.Provisioner || c.VolumeHandle != v.Status.Handle {
		return
	}
	s.Recorder.Event(pv, eventtype, reason, msg)
}

// namespaceGoneBeforeAnyPod ends a validation or creation whose pod cannot be
// created because its namespace is gone (the claim's namespace, being
// deleted with the claim): if no pod of the phase can have run, nothing was
// made, so the record goes and the error is final; a creation pod of ours
// that did run (its UID was recorded, or it was lost) may have done half its
// work, which the revert undoes.
func (j *job) namespaceGoneBeforeAnyPod(ctx context.Context, ph v1alpha1.Phase, err error) (bool, error) {
	if _, ok := podrunner.IsNamespaceGone(err); !ok {
		return false, nil
	}
	for _, e := range j.v.Status.Pods {
		if e.Phase == ph && (e.UID != "" || e.Outcome == v1alpha1.PodLost) {
			return false, nil
		}
	}
	return true, j.refused(ctx, err)
}
