package controllerserver

// Snapshots: CreateSnapshot runs spec.snapshotCreation's pod, DeleteSnapshot
// spec.snapshotDeletion's, ListSnapshots reads the records. Each snapshot has
// a PavSnapshot record (internal/records), kept exactly as a volume's
// PavVolume is: created before any pod, every pod recorded (token, then UID)
// before it is asked for, its outcome recorded before it is removed, the
// record removed last. The record copies what the snapshot's contexts need of
// the source volume, so that the snapshot outlives the volume.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/podrunner"
)

// SnapshotRecords keeps the PavSnapshot records (records.SnapshotStore).
type SnapshotRecords interface {
	Get(ctx context.Context, snapshotName string) (*v1alpha1.PavSnapshot, error)
	ByHandle(ctx context.Context, handle string, live bool) ([]*v1alpha1.PavSnapshot, error)
	List() ([]*v1alpha1.PavSnapshot, error)
	Create(ctx context.Context, v *v1alpha1.PavSnapshot) (*v1alpha1.PavSnapshot, error)
	Update(ctx context.Context, v *v1alpha1.PavSnapshot) (*v1alpha1.PavSnapshot, error)
	Delete(ctx context.Context, v *v1alpha1.PavSnapshot) error
}

// csi-snapshotter's --extra-create-metadata parameters.
const (
	paramSnapshotName      = "csi.storage.k8s.io/volumesnapshot/name"
	paramSnapshotNamespace = "csi.storage.k8s.io/volumesnapshot/namespace"
	paramSnapshotContent   = "csi.storage.k8s.io/volumesnapshotcontent/name"
)

// Reasons of a failed snapshot creation (PavSnapshotStatus.Reason): the
// volume ones, as the same things went wrong.
const (
	reasonSnapshotFailed        = v1alpha1.ReasonCreationFailed
	reasonInvalidSnapshotOutput = v1alpha1.ReasonInvalidCreationOutput
)

// SnapshotKey is the in-flight key of CreateSnapshot, and the volume key of
// both pods of a snapshot: the CSI snapshot name, kept apart from volume names.
func SnapshotKey(name string) string { return "snapshot/" + name }

// snapshotDeletionKey is DeleteSnapshot's in-flight key for a handle.
func snapshotDeletionKey(handle string) string { return "delete-snapshot/" + handle }

// snapshotProvisioner is the provisioner, if it takes snapshots.
func (s *Server) snapshotProvisioner() (*v1alpha1.PavProvisioner, error) {
	p, err := s.Source.Get(true)
	if err != nil {
		return nil, err
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, err
	}
	if !f.Snapshots || s.Snapshots == nil {
		return nil, status.Errorf(codes.Unimplemented, "PavProvisioner %q takes no snapshots: add spec.snapshotCreation", p.Name)
	}
	if !p.Spec.HasMode(v1alpha1.Dynamic) {
		return nil, status.Errorf(codes.InvalidArgument, "PavProvisioner %q does not allow dynamic provisioning, which snapshots need: add Dynamic to spec.provisioningModes", p.Name)
	}
	return p, nil
}

// CreateSnapshot records the snapshot, runs its creation pod (resuming from
// the record on a retry) and returns the snapshot, ready to use.
func (s *Server) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	snap, err := s.createSnapshot(ctx, req)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	return &csi.CreateSnapshotResponse{Snapshot: snap}, nil
}

func (s *Server) createSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.Snapshot, error) {
	name, source := req.GetName(), req.GetSourceVolumeId()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot name is required")
	}
	if source == "" {
		return nil, status.Error(codes.InvalidArgument, "source volume id is required")
	}
	p, err := s.snapshotProvisioner()
	if err != nil {
		return nil, err
	}
	release, ok := s.busy.TryAcquire(SnapshotKey(name))
	if !ok {
		return nil, status.Errorf(codes.Aborted, "an operation on snapshot %s is already in progress", name)
	}
	defer release()

	rec, err := s.Snapshots.Get(ctx, name)
	if errors.Is(err, records.ErrOtherSnapshotOwner) {
		return nil, grpcerr.WithCode(codes.AlreadyExists, err)
	}
	if err != nil {
		return nil, err
	}
	if rec != nil && rec.Spec.SourceVolumeID != source {
		return nil, grpcerr.Errorf(codes.AlreadyExists, "snapshot %s already exists, of volume %s, not %s", name, rec.Spec.SourceVolumeID, source)
	}
	if rec == nil {
		if rec, err = s.recordSnapshot(ctx, p, req); err != nil {
			return nil, err
		}
	}
	return (&snapJob{s: s, p: p, v: rec}).resume(ctx)
}

// recordSnapshot creates a new snapshot's record, with what its contexts need
// of the source volume (read from the volume's record, never from anything a
// tenant writes). Nothing is written for a request the provisioner refuses.
func (s *Server) recordSnapshot(ctx context.Context, p *v1alpha1.PavProvisioner, req *csi.CreateSnapshotRequest) (*v1alpha1.PavSnapshot, error) {
	vol, err := s.byHandle(ctx, req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	if vol == nil || vol.Status.Phase != v1alpha1.VolumeCreated {
		return nil, grpcerr.Errorf(codes.NotFound, "source volume %s does not exist (pav has no record of a created volume with that handle)", req.GetSourceVolumeId())
	}
	params := req.GetParameters()
	sp := v1alpha1.PavSnapshotSpec{
		SnapshotName:          req.GetName(),
		SourceVolumeID:        req.GetSourceVolumeId(),
		SourceVolumeRecord:    vol.Name,
		Params:                volume.UserParams(params),
		VolumeSnapshotContent: params[paramSnapshotContent],
		Volume:                sourceVolume(vol),
	}
	if ns, n := params[paramSnapshotNamespace], params[paramSnapshotName]; ns != "" && n != "" {
		sp.VolumeSnapshot = ns + "/" + n
	}
	return s.createSnapshotRecord(ctx, p, sp)
}

// sourceVolume is the source volume's part of a snapshot's context, from its
// record.
func sourceVolume(vol *v1alpha1.PavVolume) v1alpha1.SnapshotSourceVolume {
	return v1alpha1.SnapshotSourceVolume{Handle: vol.Status.Handle, Capacity: vol.Status.Capacity,
		VolumeMode: vol.Spec.RequestedVolumeMode, Params: vol.Spec.Params, PVC: vol.Spec.PVC, SC: vol.Spec.SC}
}

// createSnapshotRecord evaluates spec.snapshotCreation for a new snapshot (a
// snapshot of its own, or a member of a group whose members are made by their
// own pods) and creates its record: Creating with its pod recorded, or Created
// when the spec has no pod.
func (s *Server) createSnapshotRecord(ctx context.Context, p *v1alpha1.PavProvisioner, sp v1alpha1.PavSnapshotSpec) (*v1alpha1.PavSnapshot, error) {
	v := &v1alpha1.PavSnapshot{Spec: sp}
	j := &snapJob{s: s, p: p, v: v}
	cfg, err := j.creation(ctx)
	if err != nil {
		return nil, err
	}
	if cfg.PodTemplate != nil {
		v.Status.Phase = v1alpha1.SnapshotCreating
		j.addPod(v1alpha1.PhaseSnapshotCreation, j.op(v1alpha1.PhaseSnapshotCreation, *cfg.PodTemplate))
	} else {
		// No pod: the snapshot is what the spec says (a backend whose
		// snapshots need no action, or a handle template).
		handle := orDefault(cfg.Handle, sp.SnapshotName)
		if err := j.checkHandle(ctx, handle); err != nil {
			return nil, err
		}
		now := metav1.Now()
		v.Status = v1alpha1.PavSnapshotStatus{Phase: v1alpha1.SnapshotCreated, Handle: handle, Size: sp.Volume.Capacity,
			CreationTime: &now, ReadyToUse: true}
	}
	created, err := s.Snapshots.Create(ctx, v)
	if apierrors.IsAlreadyExists(err) {
		return nil, grpcerr.Errorf(codes.Aborted, "the record of snapshot %s appeared meanwhile: %w", sp.SnapshotName, err)
	}
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("Recorded snapshot", "snapshot", sp.SnapshotName, "record", created.Name, "phase", created.Status.Phase)
	return created, nil
}

// snapJob is one call's work on one snapshot record.
type snapJob struct {
	s *Server
	p *v1alpha1.PavProvisioner
	v *v1alpha1.PavSnapshot
}

func (j *snapJob) creation(ctx context.Context) (*phase.SnapshotConfig, error) {
	vars, err := phase.SnapshotVars(&j.v.Spec)
	if err != nil {
		return nil, err
	}
	return j.s.Eval.SnapshotCreation(ctx, j.p, vars)
}

func (j *snapJob) deletion(ctx context.Context) (*phase.PodConfig, error) {
	st := &j.v.Status
	vars, err := phase.SnapshotDeletionVars(&j.v.Spec, orDefault(st.Handle, j.v.Spec.SnapshotName), st.Size)
	if err != nil {
		return nil, err
	}
	return j.s.Eval.SnapshotDeletion(ctx, j.p, vars)
}

func (j *snapJob) op(ph v1alpha1.Phase, t corev1.PodTemplateSpec) podrunner.Operation {
	return PodOperation(j.p.Name, ph, SnapshotKey(j.v.Spec.SnapshotName), t)
}

// addPod records a new pod entry with a fresh token (in memory: the caller's
// next write stores it, before the pod is asked for).
func (j *snapJob) addPod(ph v1alpha1.Phase, op podrunner.Operation) {
	j.v.Status.Pods = j.s.addPodEntry(j.v.Status.Pods, ph, op)
}

func (j *snapJob) save(ctx context.Context, mutate func(v *v1alpha1.PavSnapshot)) error {
	v := j.v.DeepCopy()
	mutate(v)
	got, err := j.s.Snapshots.Update(ctx, v)
	if err != nil {
		return err
	}
	j.v = got
	return nil
}

func (j *snapJob) pending(ph v1alpha1.Phase) *v1alpha1.VolumePod {
	return unfinished(j.v.Status.Pod(ph))
}

// run runs (or adopts) the pod of the phase's pending entry (runEntry).
func (j *snapJob) run(ctx context.Context, ph v1alpha1.Phase, op podrunner.Operation) (*podrunner.Result, error) {
	return j.s.runEntry(ctx, podLedger{
		what:    "snapshot " + j.v.Spec.SnapshotName,
		entries: j.v.Status.Pods,
		update: func(ctx context.Context, _ bool, mutate func(*[]v1alpha1.VolumePod)) error {
			return j.save(ctx, func(r *v1alpha1.PavSnapshot) { mutate(&r.Status.Pods) })
		},
	}, ph, op)
}

// removeDone removes every pod whose outcome is recorded (removeDonePods).
func (j *snapJob) removeDone(ctx context.Context) error {
	return j.s.removeDonePods(ctx, j.v.Status.Pods, func(e v1alpha1.VolumePod) podrunner.Operation {
		return PodOperation(j.p.Name, e.Phase, SnapshotKey(j.v.Spec.SnapshotName), corev1.PodTemplateSpec{})
	})
}

// resume carries a snapshot's creation on from its record's phase.
func (j *snapJob) resume(ctx context.Context) (*csi.Snapshot, error) {
	for {
		switch j.v.Status.Phase {
		case v1alpha1.SnapshotCreating:
			if err := j.create(ctx); err != nil {
				return nil, err
			}
		case v1alpha1.SnapshotCreated:
			if err := j.removeDone(ctx); err != nil {
				return nil, err
			}
			return csiSnapshot(j.v), nil
		case v1alpha1.SnapshotDeleting:
			if j.v.Status.Reason != "" {
				return nil, j.revert(ctx)
			}
			return nil, grpcerr.Errorf(codes.FailedPrecondition, "snapshot %s is being deleted", j.v.Spec.SnapshotName)
		default:
			return nil, fmt.Errorf("PavSnapshot %s has an unknown phase %q", j.v.Name, j.v.Status.Phase)
		}
	}
}

// csiSnapshot is a snapshot as CSI reports it; a member of a group snapshot
// names its group (group_snapshot_id).
func csiSnapshot(v *v1alpha1.PavSnapshot) *csi.Snapshot {
	st := &v.Status
	out := &csi.Snapshot{SnapshotId: st.Handle, SourceVolumeId: v.Spec.SourceVolumeID, SizeBytes: st.Size, ReadyToUse: st.ReadyToUse,
		GroupSnapshotId: v.Spec.GroupSnapshotHandle}
	if st.CreationTime != nil {
		out.CreationTime = timestamppb.New(st.CreationTime.Time)
	}
	return out
}

// create runs the creation pod and works out the handle (/pav/handle, else
// spec.snapshotCreation.handle, else the CSI name) and size (/pav/capacity,
// else the source volume's capacity). Success records Created before the pod
// is removed; a failure records Deleting with its reason, and reverts.
func (j *snapJob) create(ctx context.Context) error {
	cfg, err := j.creation(ctx)
	if err != nil {
		return err
	}
	if cfg.PodTemplate == nil {
		return grpcerr.Errorf(codes.FailedPrecondition, "snapshot %s is being created by a snapshotCreation pod, but spec.snapshotCreation no longer has a podTemplate; restore it", j.v.Spec.SnapshotName)
	}
	name := j.v.Spec.SnapshotName
	res, err := j.run(ctx, v1alpha1.PhaseSnapshotCreation, j.op(v1alpha1.PhaseSnapshotCreation, *cfg.PodTemplate))
	if errors.Is(err, podrunner.ErrForeignPod) {
		for _, e := range j.v.Status.Pods {
			if e.Phase == v1alpha1.PhaseSnapshotCreation && (e.UID != "" || e.Outcome == v1alpha1.PodLost) {
				// One of ours may have done half its work: keep the record.
				return grpcerr.WithCode(codes.Aborted, err)
			}
		}
		// Nothing of ours ran: nothing was made.
		if derr := j.s.Snapshots.Delete(ctx, j.v); derr != nil {
			return derr
		}
		return err
	}
	if _, ok := podrunner.IsPodFailure(err); ok {
		return j.fail(ctx, reasonSnapshotFailed, fmt.Errorf("snapshot creation failed: %w", err), orDefault(cfg.Handle, name), 0)
	}
	if err != nil {
		return err
	}
	handle, size, err := fromPodFiles(res.Files, cfg.Handle, j.v.Spec.Volume.Capacity)
	if err != nil {
		return j.fail(ctx, reasonInvalidSnapshotOutput, fmt.Errorf("snapshot creation: %w", err), orDefault(handle, name), 0)
	}
	handle = orDefault(handle, name)
	if err := j.checkHandle(ctx, handle); err != nil {
		// Never revert: the deletion pod would act on the other snapshot.
		if e := j.pending(v1alpha1.PhaseSnapshotCreation); e != nil {
			e.Outcome = v1alpha1.PodSucceeded // in memory: so that removeDone removes it
		}
		if rerr := j.removeDone(ctx); rerr != nil {
			return rerr
		}
		if derr := j.s.Snapshots.Delete(ctx, j.v); derr != nil {
			return derr
		}
		return err
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	if err := j.save(ctx, func(v *v1alpha1.PavSnapshot) {
		if e := v.Status.Pod(v1alpha1.PhaseSnapshotCreation); e != nil {
			e.Outcome = v1alpha1.PodSucceeded
		}
		v.Status.Phase, v.Status.Handle, v.Status.Size = v1alpha1.SnapshotCreated, handle, size
		v.Status.CreationTime, v.Status.ReadyToUse = &now, true
	}); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Snapshot created", "snapshot", name, "handle", handle, "size", size)
	return nil
}

// checkHandle refuses a handle another snapshot of this provisioner has
// (asking the API server): DeleteSnapshot of either would delete both.
func (j *snapJob) checkHandle(ctx context.Context, handle string) error {
	others, err := j.s.Snapshots.ByHandle(ctx, handle, true)
	if err != nil {
		return err
	}
	for _, o := range others {
		if o.Spec.SnapshotName != j.v.Spec.SnapshotName {
			return grpcerr.Errorf(codes.FailedPrecondition,
				"the created snapshot's handle %q is already the handle of snapshot %s (of volume %s): a handle must be unique; pav did not record this snapshot and did not run the snapshotDeletion pod, which would act on that snapshot",
				handle, o.Spec.SnapshotName, o.Spec.SourceVolumeID)
		}
	}
	return nil
}

// fail records a failed creation (Deleting, with its reason and the deletion
// pod to run) before the creation pod is removed, and reverts.
func (j *snapJob) fail(ctx context.Context, reason string, cause error, handle string, size int64) error {
	klog.FromContext(ctx).Info("Snapshot creation failed; reverting it", "snapshot", j.v.Spec.SnapshotName, "reason", reason, "err", cause.Error())
	probe := &snapJob{s: j.s, p: j.p, v: j.v.DeepCopy()}
	probe.v.Status.Handle, probe.v.Status.Size = handle, size
	cfg, cfgErr := probe.deletion(ctx)
	if err := j.save(ctx, func(v *v1alpha1.PavSnapshot) {
		if e := v.Status.Pod(v1alpha1.PhaseSnapshotCreation); e != nil && e.Outcome == v1alpha1.PodRunning {
			e.Outcome = v1alpha1.PodFailed
		}
		v.Status.Phase, v.Status.Reason, v.Status.Message = v1alpha1.SnapshotDeleting, reason, cause.Error()
		v.Status.Handle, v.Status.Size = handle, size
		if cfgErr == nil && cfg.PodTemplate != nil {
			(&snapJob{s: j.s, p: j.p, v: v}).addPod(v1alpha1.PhaseSnapshotDeletion, j.op(v1alpha1.PhaseSnapshotDeletion, *cfg.PodTemplate))
		}
	}); err != nil {
		return err
	}
	if err := j.removeDone(ctx); err != nil {
		return err
	}
	return j.revert(ctx)
}

// revert runs the deletion pod after a failed creation, removes the record
// and returns the creation's failure; a failed deletion pod keeps the record
// (ABORTED: csi-snapshotter retries, and the revert with it).
func (j *snapJob) revert(ctx context.Context) error {
	cause := errors.New(j.v.Status.Message)
	if err := j.deleteBackend(ctx); err != nil {
		return &grpcerr.RevertError{Cause: cause, Err: err}
	}
	if err := j.s.Snapshots.Delete(ctx, j.v); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Snapshot creation reverted", "snapshot", j.v.Spec.SnapshotName)
	return grpcerr.WithCode(codes.Internal, cause)
}

// deleteBackend runs the pending snapshotDeletion pod (if the spec has one)
// and removes it once it succeeded; a failed one is recorded and removed, and
// the retry runs a new one.
func (j *snapJob) deleteBackend(ctx context.Context) error {
	const ph = v1alpha1.PhaseSnapshotDeletion
	cfg, err := j.deletion(ctx)
	if j.pending(ph) == nil {
		last := j.v.Status.Pod(ph)
		if last != nil && last.Outcome == v1alpha1.PodSucceeded {
			return j.removeDone(ctx) // a restart came before the record went
		}
		if err != nil {
			return err
		}
		if cfg.PodTemplate == nil {
			if last == nil {
				return j.removeDone(ctx) // no deletion pod in the spec
			}
			return grpcerr.Errorf(codes.FailedPrecondition, "snapshot %s needs its snapshotDeletion pod to run again, but spec.snapshotDeletion no longer has a podTemplate; restore it", j.v.Spec.SnapshotName)
		}
		if err := j.save(ctx, func(v *v1alpha1.PavSnapshot) {
			(&snapJob{s: j.s, p: j.p, v: v}).addPod(ph, j.op(ph, *cfg.PodTemplate))
		}); err != nil {
			return err
		}
	}
	if err != nil {
		return err
	}
	if cfg.PodTemplate == nil {
		return grpcerr.Errorf(codes.FailedPrecondition, "snapshot %s is waiting for its snapshotDeletion pod, but spec.snapshotDeletion no longer has a podTemplate; restore it", j.v.Spec.SnapshotName)
	}
	_, err = j.run(ctx, ph, j.op(ph, *cfg.PodTemplate))
	if f, ok := podrunner.IsPodFailure(err); ok {
		if serr := j.save(ctx, func(v *v1alpha1.PavSnapshot) {
			if e := v.Status.Pod(ph); e != nil && e.Outcome == v1alpha1.PodRunning {
				e.Outcome = v1alpha1.PodFailed
			}
			if v.Status.Reason == "" {
				v.Status.Message = fmt.Sprintf("snapshot deletion failed: %v", f)
			}
		}); serr != nil {
			return serr
		}
		if rerr := j.removeDone(ctx); rerr != nil {
			klog.FromContext(ctx).Error(rerr, "Could not remove the failed snapshotDeletion pod; the retry will", "snapshot", j.v.Spec.SnapshotName)
		}
		return fmt.Errorf("snapshot deletion failed: %w", err)
	}
	if err != nil {
		return err
	}
	if err := j.save(ctx, func(v *v1alpha1.PavSnapshot) {
		v.Status.Pod(ph).Outcome = v1alpha1.PodSucceeded
	}); err != nil {
		return err
	}
	return j.removeDone(ctx)
}

// DeleteSnapshot runs the snapshotDeletion pod of a snapshot pav created and
// removes its record. An unknown snapshot id is OK, as CSI asks.
func (s *Server) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if err := s.deleteSnapshot(ctx, req.GetSnapshotId()); err != nil {
		return nil, grpcerr.Status(err)
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

func (s *Server) deleteSnapshot(ctx context.Context, handle string) error {
	if handle == "" {
		return status.Error(codes.InvalidArgument, "snapshot id is required")
	}
	if s.Snapshots == nil {
		return nil // no snapshot records at all: nothing to delete
	}
	p, err := s.Source.Get(false)
	if err != nil {
		return err
	}
	release, ok := s.busy.TryAcquire(snapshotDeletionKey(handle))
	if !ok {
		return status.Errorf(codes.Aborted, "an operation on snapshot %s is already in progress", handle)
	}
	defer release()

	vs, err := s.Snapshots.ByHandle(ctx, handle, false)
	if err != nil {
		return err
	}
	v, err := onlyRecord("PavSnapshots", handle, vs)
	if err != nil {
		return err
	}
	if v == nil {
		klog.FromContext(ctx).V(2).Info("DeleteSnapshot of a snapshot pav has no record of: nothing to do", "handle", handle)
		return nil
	}
	if err := s.memberOfBusyGroup(ctx, v); err != nil {
		return err
	}
	return s.deleteSnapshotRecord(ctx, p, v)
}

// deleteSnapshotRecord deletes a snapshot pav recorded: its snapshotDeletion
// pod (recorded first), then its record. DeleteSnapshot does it, and so does
// the deletion of a group snapshot whose members are deleted by their own pods.
func (s *Server) deleteSnapshotRecord(ctx context.Context, p *v1alpha1.PavProvisioner, rec *v1alpha1.PavSnapshot) error {
	j := &snapJob{s: s, p: p, v: rec}
	switch j.v.Status.Phase {
	case v1alpha1.SnapshotCreated:
		cfg, err := j.deletion(ctx)
		if err != nil {
			return err
		}
		if err := j.save(ctx, func(v *v1alpha1.PavSnapshot) {
			v.Status.Phase = v1alpha1.SnapshotDeleting
			if cfg.PodTemplate != nil {
				(&snapJob{s: s, p: p, v: v}).addPod(v1alpha1.PhaseSnapshotDeletion, j.op(v1alpha1.PhaseSnapshotDeletion, *cfg.PodTemplate))
			}
		}); err != nil {
			return err
		}
	case v1alpha1.SnapshotDeleting:
	default:
		return grpcerr.Errorf(codes.FailedPrecondition, "snapshot %s (handle %q) is still being created (%s)", j.v.Spec.SnapshotName, j.v.Status.Handle, j.v.Status.Phase)
	}
	if err := j.deleteBackend(ctx); err != nil {
		return err
	}
	// Listings of its blocks under way would outlive the record otherwise.
	if err := s.removeMetadataPods(ctx, p.Name, j.v); err != nil {
		return err
	}
	if err := s.Snapshots.Delete(ctx, j.v); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Snapshot deleted", "snapshot", j.v.Spec.SnapshotName, "handle", j.v.Status.Handle)
	return nil
}
