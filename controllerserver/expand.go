package controllerserver

// ControllerExpandVolume: spec.volumeExpansion grows a volume pav created.
//
// An expansion is recorded in the volume's PavVolume (status.expansion, the
// request, and the expansion pod's entry in status.pods) in one write before
// the pod is asked for. A retry, after any restart, finishes the recorded
// expansion first, with the request its pod was given, adopting that pod by
// its recorded UID (or token); only then does it look at its own request. The
// outcome (the new status.capacity, or the failure) is recorded before the pod
// is removed, and the finished pod's entry is dropped once the pod is gone,
// so that the next, larger expansion runs a new pod under the same name, and
// DeleteVolume finds no expansion pods to remove.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/podrunner"
)

// ControllerExpandVolume grows a volume pav created: it runs the expansion pod
// of spec.volumeExpansion (if any) and records the new capacity, which it
// returns with node_expansion_required when spec.volumeNodeExpansion exists.
// A volume already as large as required is left alone (CSI idempotency).
func (s *Server) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	resp, err := s.expandVolume(ctx, req)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	return resp, nil
}

func (s *Server) expandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	handle := req.GetVolumeId()
	if handle == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	cr := req.GetCapacityRange()
	if cr == nil || cr.GetRequiredBytes() <= 0 && cr.GetLimitBytes() <= 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity_range is required, with required_bytes (the size the volume must grow to) and optionally limit_bytes")
	}
	if cr.GetRequiredBytes() < 0 || cr.GetLimitBytes() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "capacity range: required_bytes %d and limit_bytes %d must not be negative", cr.GetRequiredBytes(), cr.GetLimitBytes())
	}
	want := v1alpha1.VolumeExpansion{RequiredBytes: cr.GetRequiredBytes()}
	if lim := cr.GetLimitBytes(); lim > 0 {
		if lim < want.RequiredBytes {
			return nil, status.Errorf(codes.InvalidArgument, "capacity range: required_bytes %d exceed limit_bytes %d", want.RequiredBytes, lim)
		}
		want.LimitBytes = &lim
	}
	// Not Get(true): a provisioner being deleted still serves its volumes.
	p, err := s.Source.Get(false)
	if err != nil {
		return nil, err
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, err
	}
	if !f.Expansion {
		return nil, grpcerr.Errorf(codes.FailedPrecondition, "PavProvisioner %q has no spec.volumeExpansion: its volumes cannot grow (add spec.volumeExpansion, which may be just {})", p.Name)
	}
	// DeleteVolume's key: an expansion and a deletion of one volume never
	// run at once in this process (the record's resourceVersion catches
	// another process).
	release, ok := s.busy.TryAcquire(DeletionKey(handle))
	if !ok {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", handle)
	}
	defer release()

	v, err := s.byHandle(ctx, handle)
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, grpcerr.Errorf(codes.NotFound, "volume %q does not exist: pav has no record of it (pav grows only the volumes it created, not static ones)", handle)
	}
	switch v.Status.Phase {
	case v1alpha1.VolumeCreated:
	case v1alpha1.VolumeValidating, v1alpha1.VolumeCreating:
		return nil, grpcerr.Errorf(codes.Aborted, "volume %s (handle %q) is still being created (%s); retry once it is", v.Spec.VolumeName, handle, v.Status.Phase)
	default:
		return nil, grpcerr.Errorf(codes.FailedPrecondition, "volume %s (handle %q) cannot grow: it is %s", v.Spec.VolumeName, handle, v.Status.Phase)
	}
	j := &job{s: s, p: p, v: v}
	capacity, err := j.expand(ctx, want)
	if err != nil {
		return nil, err
	}
	if capacity > v.Status.Capacity {
		// A larger volume may take more space where it is.
		s.capacityChanged(v.Status.AccessibleTopology)
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: capacity, NodeExpansionRequired: f.NodeExpansion}, nil
}

// expand finishes a recorded expansion, then grows the volume as want asks
// if it is not large enough yet, and returns its capacity.
func (j *job) expand(ctx context.Context, want v1alpha1.VolumeExpansion) (int64, error) {
	if j.v.Status.Expansion != nil {
		// The retry of an earlier call (maybe with another request: the
		// claim was edited meanwhile). Its pod may be growing the backend
		// already: it finishes first, with the request it was given.
		if err := j.finishExpansion(ctx); err != nil {
			return 0, err
		}
	} else if err := j.removeExpansionPods(ctx); err != nil {
		// A restart came between an outcome and its pod's removal.
		return 0, err
	}
	cur := j.v.Status.Capacity
	if want.LimitBytes != nil && cur > *want.LimitBytes {
		return 0, grpcerr.Errorf(codes.OutOfRange, "volume %s already has %s, above the requested limit %s: volumes never shrink", j.v.Spec.VolumeName, phase.FormatBytes(cur), phase.FormatBytes(*want.LimitBytes))
	}
	if want.RequiredBytes <= cur {
		return cur, nil
	}
	if err := j.checkGrowth(ctx, want); err != nil {
		return 0, err
	}
	cfg, err := j.expansion(ctx, &want)
	if err != nil {
		return 0, err
	}
	if cfg.PodTemplate == nil {
		// Nothing to run: the capacity is what the spec (or the request) says.
		capacity, err := grownCapacity(nil, cfg.Capacity, want, cur)
		if err != nil {
			return 0, grpcerr.WithCode(codes.OutOfRange, err)
		}
		if err := j.save(ctx, func(v *v1alpha1.PavVolume) { v.Status.Capacity, v.Status.Message = capacity, "" }); err != nil {
			return 0, err
		}
		klog.FromContext(ctx).Info("Volume expanded", "volume", j.v.Spec.VolumeName, "capacity", capacity, "previous", cur)
		return capacity, nil
	}
	if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
		v.Status.Expansion = &want
		(&job{s: j.s, p: j.p, v: v}).addPod(v1alpha1.PhaseExpansion, j.op(v1alpha1.PhaseExpansion, *cfg.PodTemplate))
	}); err != nil {
		return 0, err
	}
	if err := j.finishExpansion(ctx); err != nil {
		return 0, err
	}
	return j.v.Status.Capacity, nil
}

// checkGrowth refuses, before anything runs, a growth past the provisioner's
// spec.volumeValidation.maxCapacity: that bound holds for the volume's whole
// life, not only at creation. It is evaluated with the recorded request,
// asking for the new size.
func (j *job) checkGrowth(ctx context.Context, want v1alpha1.VolumeExpansion) error {
	r := j.request()
	r.MinCapacity, r.MaxCapacity = want.RequiredBytes, want.LimitBytes
	vars, err := phase.ValidationVars(r, j.objects(), "")
	if err != nil {
		return err
	}
	cfg, err := j.s.Eval.Validation(ctx, j.p, vars)
	if err != nil {
		return err
	}
	if cfg.MaxCapacity != nil && want.RequiredBytes > *cfg.MaxCapacity {
		return grpcerr.Errorf(codes.OutOfRange, "requested capacity %s is above the provisioner's maximum %s (spec.volumeValidation.maxCapacity)",
			phase.FormatBytes(want.RequiredBytes), phase.FormatBytes(*cfg.MaxCapacity))
	}
	return nil
}

// expansion evaluates spec.volumeExpansion for a request, with the volume's
// current handle and capacity.
func (j *job) expansion(ctx context.Context, want *v1alpha1.VolumeExpansion) (*phase.ExpansionConfig, error) {
	st := &j.v.Status
	vars, err := phase.ExpansionVars(j.request(), j.objects(), j.v.Spec.DefaultHandle, orDefault(st.Handle, j.v.Spec.DefaultHandle),
		st.Capacity, want.RequiredBytes, want.LimitBytes)
	if err != nil {
		return nil, err
	}
	cfg, err := j.s.Eval.Expansion(ctx, j.p, vars)
	if err == nil && cfg == nil {
		err = grpcerr.Errorf(codes.FailedPrecondition, "PavProvisioner %q no longer has spec.volumeExpansion: volume %s cannot grow; restore it", j.p.Name, j.v.Spec.VolumeName)
	}
	return cfg, err
}

// finishExpansion runs (or adopts) the recorded expansion's pod and records
// its outcome: the new capacity, or the failure, which the caller gets. Either
// way the expansion is over, so that the next call starts a new one (in a new
// pod).
func (j *job) finishExpansion(ctx context.Context) error {
	want := *j.v.Status.Expansion
	if j.pending(v1alpha1.PhaseExpansion) == nil {
		// The entry and the request are written together, and the outcome
		// ends both: a record edited by hand. Nothing of ours can be running.
		klog.FromContext(ctx).Info("Dropping a recorded expansion that has no pending pod", "volume", j.v.Spec.VolumeName)
		return j.save(ctx, func(v *v1alpha1.PavVolume) { v.Status.Expansion = nil })
	}
	cfg, err := j.expansion(ctx, &want)
	if err != nil {
		return err
	}
	if cfg.PodTemplate == nil {
		return grpcerr.Errorf(codes.FailedPrecondition, "volume %s is being expanded by a pod, but spec.volumeExpansion no longer has a podTemplate; restore it", j.v.Spec.VolumeName)
	}
	prev := j.v.Status.Capacity
	res, err := j.run(ctx, v1alpha1.PhaseExpansion, j.op(v1alpha1.PhaseExpansion, *cfg.PodTemplate))
	var failure error
	switch _, failed := podrunner.IsPodFailure(err); {
	case failed:
		failure = fmt.Errorf("volume expansion failed: %w", err)
	case errors.Is(err, podrunner.ErrForeignPod):
		// Final until a human deletes that pod; the next call runs ours.
		failure = err
	case errors.Is(err, podrunner.ErrNamespaceGone):
		// Its pod was never created: nothing grew. Final until the
		// namespace exists again; a deletion goes on without it.
		failure = err
	case err != nil:
		// Still running, lost (a successor is recorded), or the API: the
		// retry goes on with the recorded expansion.
		return err
	}
	var capacity int64
	if failure == nil {
		if capacity, failure = grownCapacity(res.Files, cfg.Capacity, want, prev); failure != nil {
			failure = grpcerr.WithCode(codes.OutOfRange, failure)
		}
	}
	if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
		e := v.Status.Pod(v1alpha1.PhaseExpansion)
		v.Status.Expansion = nil
		if failure != nil {
			e.Outcome, v.Status.Message = v1alpha1.PodFailed, failure.Error()
			return
		}
		e.Outcome, v.Status.Capacity, v.Status.Message = v1alpha1.PodSucceeded, capacity, ""
	}); err != nil {
		return err
	}
	if err := j.removeExpansionPods(ctx); err != nil {
		if failure != nil {
			return fmt.Errorf("%w (and removing its pod: %v)", failure, err)
		}
		// The capacity is recorded: the next call (or DeleteVolume)
		// removes the pod.
		klog.FromContext(ctx).Error(err, "Could not remove the finished expansion pod; the next call will", "volume", j.v.Spec.VolumeName)
	}
	if failure != nil {
		return failure
	}
	klog.FromContext(ctx).Info("Volume expanded", "volume", j.v.Spec.VolumeName, "capacity", capacity, "previous", prev)
	return nil
}

// grownCapacity is a grown volume's capacity: /pav/capacity, else the spec's
// capacity, else what was asked for. It must be at least what was asked for
// and the current capacity, and at most the limit.
func grownCapacity(files map[string]string, specCapacity *int64, want v1alpha1.VolumeExpansion, cur int64) (int64, error) {
	capacity, from := want.RequiredBytes, "requested"
	if specCapacity != nil {
		capacity, from = *specCapacity, "spec.volumeExpansion.capacity"
	}
	if c, ok := files["capacity"]; ok {
		n, err := phase.ParseCapacity(strings.TrimSpace(c), phase.Floor)
		if err != nil {
			return 0, fmt.Errorf("the expansion pod wrote an invalid /pav/capacity %q: %v", c, err)
		}
		capacity, from = n, "/pav/capacity"
	}
	switch {
	case capacity < want.RequiredBytes:
		return 0, fmt.Errorf("the grown capacity %s (%s) is below the requested %s", phase.FormatBytes(capacity), from, phase.FormatBytes(want.RequiredBytes))
	case want.LimitBytes != nil && capacity > *want.LimitBytes:
		return 0, fmt.Errorf("the grown capacity %s (%s) is above the requested limit %s", phase.FormatBytes(capacity), from, phase.FormatBytes(*want.LimitBytes))
	case capacity < cur:
		return 0, fmt.Errorf("the grown capacity %s (%s) is below the current %s: volumes never shrink", phase.FormatBytes(capacity), from, phase.FormatBytes(cur))
	}
	return capacity, nil
}

// removeExpansionPods removes the pods of finished expansions (their outcome
// is recorded) and then drops their entries, so that the next expansion's pod
// may take the name and DeleteVolume has nothing to remove.
func (j *job) removeExpansionPods(ctx context.Context) error {
	return j.removeFinishedPods(ctx, v1alpha1.PhaseExpansion)
}

// settleExpansion, before a volume is deleted, finishes an expansion its
// caller gave up on (the claim was deleted meanwhile): its pod must not be
// left behind, and the deletion pod must see the capacity the backend may
// have grown to. Its failure is recorded and does not stop the deletion.
func (j *job) settleExpansion(ctx context.Context) error {
	if j.v.Status.Expansion == nil {
		return j.removeExpansionPods(ctx)
	}
	err := j.finishExpansion(ctx)
	if _, failed := podrunner.IsPodFailure(err); failed || grpcerr.Code(err) == codes.OutOfRange || errors.Is(err, podrunner.ErrForeignPod) ||
		errors.Is(err, podrunner.ErrNamespaceGone) {
		klog.FromContext(ctx).Info("The volume's last expansion failed; deleting it anyway", "volume", j.v.Spec.VolumeName, "err", err.Error())
		return nil
	}
	return err
}
