package controllerserver

// ControllerModifyVolume: spec.volumeModification changes the mutable
// parameters of a volume pav created (Kubernetes' VolumeAttributesClass:
// external-resizer calls it when a claim's volumeAttributesClassName changes).
//
// A modification is recorded in the volume's PavVolume (status.modification,
// the new parameters, and the modification pod's entry in status.pods) in one
// write before the pod is asked for. A retry, after any restart, finishes the
// recorded modification first, with the parameters its pod was given,
// adopting that pod by its recorded UID (or token); only then does it look at
// its own request. The outcome (the new status.mutableParams, or the failure)
// is recorded before the pod is removed, and the finished pod's entry is
// dropped once the pod is gone, so that the next modification runs a new pod
// under the same name and DeleteVolume finds no modification pod to remove.
// The same shape as expansion (expand.go).
//
// The keys are checked before anything is read or written: a key the
// provisioner does not declare in spec.volumeModification.mutableParameters
// is INVALID_ARGUMENT, which external-resizer reports as an Infeasible
// modification (the claim's events and status name the key), and CSI's "the
// SP MUST NOT have applied any modification" holds.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/podrunner"
)

// ControllerModifyVolume changes the mutable parameters of a volume pav
// created: it runs the modification pod of spec.volumeModification (if it has
// one) and records the new parameters, which every later phase sees as
// mutableParams. Parameters equal to the current ones, or none at all, change
// nothing (CSI idempotency; CSI also says that absent keys must not cause a
// change).
func (s *Server) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if err := s.modifyVolume(ctx, req); err != nil {
		return nil, grpcerr.Status(err)
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}

func (s *Server) modifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) error {
	handle := req.GetVolumeId()
	if handle == "" {
		return status.Error(codes.InvalidArgument, "volume id is required")
	}
	// Not Get(true): a provisioner being deleted still serves its volumes.
	p, err := s.Source.Get(false)
	if err != nil {
		return err
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return err
	}
	want := mutableParams(req.GetMutableParameters())
	if err := checkMutableParams(p, f, want, "ControllerModifyVolume's mutable_parameters"); err != nil {
		return err
	}
	// DeleteVolume's key, as expansion's: a modification, an expansion and a
	// deletion of one volume never run at once in this process (the record's
	// resourceVersion catches another process).
	release, ok := s.busy.TryAcquire(DeletionKey(handle))
	if !ok {
		return status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", handle)
	}
	defer release()

	v, err := s.byHandle(ctx, handle)
	if err != nil {
		return err
	}
	if v == nil {
		return grpcerr.Errorf(codes.NotFound, "volume %q does not exist: pav has no record of it (pav modifies only the volumes it created, not static ones)", handle)
	}
	switch v.Status.Phase {
	case v1alpha1.VolumeCreated:
	case v1alpha1.VolumeValidating, v1alpha1.VolumeCreating:
		return grpcerr.Errorf(codes.Aborted, "volume %s (handle %q) is still being created (%s); retry once it is", v.Spec.VolumeName, handle, v.Status.Phase)
	default:
		return grpcerr.Errorf(codes.FailedPrecondition, "volume %s (handle %q) cannot be modified: it is %s", v.Spec.VolumeName, handle, v.Status.Phase)
	}
	return (&job{s: s, p: p, v: v}).modify(ctx, want)
}

// mutableParams are the parameters a caller sent, less the keys the sidecars
// add for themselves (csi.storage.k8s.io/..., e.g. external-resizer's
// --extra-modify-metadata): a provisioner never declares those
// (phase.ReservedParameterPrefix), as they are never in `params` either.
func mutableParams(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		if !strings.HasPrefix(k, phase.ReservedParameterPrefix) {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// checkMutableParams refuses, with INVALID_ARGUMENT, mutable parameters the
// provisioner does not declare (CSI's code for a parameter not supported), and
// any at all when it has no spec.volumeModification. field names where they
// came from.
func checkMutableParams(p *v1alpha1.PavProvisioner, f phase.Features, m map[string]string, field string) error {
	if len(m) == 0 {
		return nil
	}
	keys := slices.Sorted(maps.Keys(m))
	if !f.Modification {
		return grpcerr.Errorf(codes.InvalidArgument,
			"%s has %s, but PavProvisioner %q has no spec.volumeModification: its volumes have no mutable parameters, so no VolumeAttributesClass applies to them (add spec.volumeModification with mutableParameters, or leave volumeAttributesClassName out of the claim)",
			field, quoted(keys), p.Name)
	}
	for _, k := range keys {
		if !slices.Contains(f.MutableParameters, k) {
			return grpcerr.Errorf(codes.InvalidArgument,
				"%s: parameter %q is not mutable: PavProvisioner %q declares %s in spec.volumeModification.mutableParameters (remove %q from the VolumeAttributesClass, or declare it there)",
				field, k, p.Name, quoted(f.MutableParameters), k)
		}
	}
	return nil
}

// quoted is a list of keys as people read it: ["a", "b"].
func quoted(keys []string) string {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = fmt.Sprintf("%q", k)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// modify finishes a recorded modification, then changes the volume's mutable
// parameters to want if they are not that already.
func (j *job) modify(ctx context.Context, want map[string]string) error {
	if j.v.Status.Modification != nil {
		// The retry of an earlier call (maybe of another class: the claim
		// was edited meanwhile). Its pod may be changing the volume
		// already: it finishes first, with the parameters it was given.
		if err := j.finishModification(ctx); err != nil {
			return err
		}
	} else if err := j.removeFinishedPods(ctx, v1alpha1.PhaseModification); err != nil {
		// A restart came between an outcome and its pod's removal.
		return err
	}
	cur := j.v.CurrentMutableParams()
	if len(want) == 0 || maps.Equal(want, cur) {
		return nil
	}
	cfg, err := j.modification(ctx, want)
	if err != nil {
		return err
	}
	if cfg.PodTemplate == nil {
		// Nothing to run: the new parameters are what later phases see.
		if err := j.save(ctx, func(v *v1alpha1.PavVolume) { v.Status.MutableParams, v.Status.Message = maps.Clone(want), "" }); err != nil {
			return err
		}
		klog.FromContext(ctx).Info("Volume modified", "volume", j.v.Spec.VolumeName, "mutableParams", want, "previous", cur)
		return nil
	}
	if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
		v.Status.Modification = &v1alpha1.VolumeModification{MutableParams: maps.Clone(want)}
		(&job{s: j.s, p: j.p, v: v}).addPod(v1alpha1.PhaseModification, j.op(v1alpha1.PhaseModification, *cfg.PodTemplate))
	}); err != nil {
		return err
	}
	return j.finishModification(ctx)
}

// modification evaluates spec.volumeModification for the new parameters,
// with the volume's current handle, capacity and mutable parameters.
func (j *job) modification(ctx context.Context, next map[string]string) (*phase.ModificationConfig, error) {
	st := &j.v.Status
	vars, err := phase.ModificationVars(j.request(), j.objects(), j.v.Spec.DefaultHandle, orDefault(st.Handle, j.v.Spec.DefaultHandle), st.Capacity, next)
	if err != nil {
		return nil, err
	}
	cfg, err := j.s.Eval.Modification(ctx, j.p, vars)
	if err == nil && cfg == nil {
		err = grpcerr.Errorf(codes.FailedPrecondition, "PavProvisioner %q no longer has spec.volumeModification: volume %s is being modified; restore it", j.p.Name, j.v.Spec.VolumeName)
	}
	return cfg, err
}

// finishModification runs (or adopts) the recorded modification's pod and
// records its outcome: the new mutable parameters, or the failure, which the
// caller gets (INTERNAL, with the pod's reason and /pav/error). Either way
// the modification is over, so that the next call (external-resizer retries
// a failure) starts a new one, in a new pod.
func (j *job) finishModification(ctx context.Context) error {
	want := j.v.Status.Modification.MutableParams
	if j.pending(v1alpha1.PhaseModification) == nil {
		// The entry and the parameters are written together, and the
		// outcome ends both: a record edited by hand. Nothing of ours can be
		// running.
		klog.FromContext(ctx).Info("Dropping a recorded modification that has no pending pod", "volume", j.v.Spec.VolumeName)
		return j.save(ctx, func(v *v1alpha1.PavVolume) { v.Status.Modification = nil })
	}
	cfg, err := j.modification(ctx, want)
	if err != nil {
		return err
	}
	if cfg.PodTemplate == nil {
		return grpcerr.Errorf(codes.FailedPrecondition, "volume %s is being modified by a pod, but spec.volumeModification no longer has a podTemplate; restore it", j.v.Spec.VolumeName)
	}
	prev := j.v.CurrentMutableParams()
	_, err = j.run(ctx, v1alpha1.PhaseModification, j.op(v1alpha1.PhaseModification, *cfg.PodTemplate))
	var failure error
	switch _, failed := podrunner.IsPodFailure(err); {
	case failed:
		failure = fmt.Errorf("volume modification failed: %w", err)
	case errors.Is(err, podrunner.ErrForeignPod):
		// Final until a human deletes that pod; the next call runs ours.
		failure = err
	case errors.Is(err, podrunner.ErrNamespaceGone):
		// A template put the pod in a namespace that is gone: it was never
		// created, nothing changed. Final until the namespace exists again;
		// a deletion goes on without it.
		failure = err
	case err != nil:
		// Still running, lost (a successor is recorded), or the API: the
		// retry goes on with the recorded modification.
		return err
	}
	if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
		e := v.Status.Pod(v1alpha1.PhaseModification)
		v.Status.Modification = nil
		if failure != nil {
			e.Outcome, v.Status.Message = v1alpha1.PodFailed, failure.Error()
			return
		}
		e.Outcome, v.Status.MutableParams, v.Status.Message = v1alpha1.PodSucceeded, maps.Clone(want), ""
	}); err != nil {
		return err
	}
	if err := j.removeFinishedPods(ctx, v1alpha1.PhaseModification); err != nil {
		if failure != nil {
			return fmt.Errorf("%w (and removing its pod: %v)", failure, err)
		}
		// The parameters are recorded: the next call (or DeleteVolume)
		// removes the pod.
		klog.FromContext(ctx).Error(err, "Could not remove the finished modification pod; the next call will", "volume", j.v.Spec.VolumeName)
	}
	if failure != nil {
		return failure
	}
	klog.FromContext(ctx).Info("Volume modified", "volume", j.v.Spec.VolumeName, "mutableParams", want, "previous", prev)
	return nil
}

// settleModification, before a volume is deleted, finishes a modification its
// caller gave up on (the claim was deleted meanwhile): its pod must not be
// left behind, nor act on the backend while the deletion pod does. Its
// failure is recorded and does not stop the deletion.
func (j *job) settleModification(ctx context.Context) error {
	if j.v.Status.Modification == nil {
		return j.removeFinishedPods(ctx, v1alpha1.PhaseModification)
	}
	err := j.finishModification(ctx)
	if _, failed := podrunner.IsPodFailure(err); failed || errors.Is(err, podrunner.ErrForeignPod) || errors.Is(err, podrunner.ErrNamespaceGone) {
		klog.FromContext(ctx).Info("The volume's last modification failed; deleting it anyway", "volume", j.v.Spec.VolumeName, "err", err.Error())
		return nil
	}
	return err
}

// removeFinishedPods removes the pods of a phase's finished runs (their
// outcome is recorded) and then drops their entries, so that the phase's next
// pod may take the name and DeleteVolume has nothing to remove: expansions
// and modifications, which a volume may have any number of.
func (j *job) removeFinishedPods(ctx context.Context, ph v1alpha1.Phase) error {
	done := false
	for _, e := range j.v.Status.Pods {
		if e.Phase != ph || e.Outcome == v1alpha1.PodRunning {
			continue
		}
		done = true
		if e.Outcome == v1alpha1.PodLost {
			continue
		}
		op := withIdentity(PodOperation(j.p.Name, e.Phase, j.keyOf(e), corev1.PodTemplateSpec{}), e)
		if err := j.s.Pods.Delete(ctx, op); err != nil {
			return fmt.Errorf("removing the finished %s pod %s/%s: %w", ph, e.Namespace, e.Name, err)
		}
	}
	if !done {
		return nil
	}
	return j.save(ctx, func(v *v1alpha1.PavVolume) {
		pods := v.Status.Pods[:0]
		for _, e := range v.Status.Pods {
			if e.Phase != ph || e.Outcome == v1alpha1.PodRunning {
				pods = append(pods, e)
			}
		}
		v.Status.Pods = pods
	})
}
