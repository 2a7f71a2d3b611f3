package controllerserver

// Group snapshots: the GroupController service. CreateVolumeGroupSnapshot
// snapshots several volumes of this provisioner together, by one
// spec.groupSnapshotCreation pod that sees every member (so that a backend can
// quiesce once), or, without its podTemplate, by each member's
// snapshotCreation pod, all at once; DeleteVolumeGroupSnapshot deletes them by
// one spec.groupSnapshotDeletion pod, or by each member's snapshotDeletion pod.
//
// The records: the group is a PavGroupSnapshot (its members' contexts, its
// pods, its handle and phase), and each member an ordinary PavSnapshot that
// names its group (spec.groupSnapshotName and groupSnapshotHandle), so that
// restores, ListSnapshots, GetSnapshot and DeleteSnapshot work on members as on
// any snapshot. As everywhere in pav, every step is recorded before its pod
// runs and every outcome before the pod is removed; the group's record is
// created first and removed last.
//
// Creation by a group pod: the group is recorded (Creating, with its pod);
// the pod's /pav/snapshots and /pav/handle are read and recorded (the pod
// entry Succeeded, status.snapshots), then the members' PavSnapshots are
// created (Created), then the group is Created. Creation by member pods: the
// group is recorded (Creating, its handle the CSI name), then each member's
// PavSnapshot (Creating, with its pod), then every member's pod runs at once,
// each resumed from its own record; once all are Created, the group is.
//
// A failed creation is undone before the error is returned: the group goes
// Deleting with a reason, and its members' snapshots are deleted (by the
// groupSnapshotDeletion pod, or by each member's snapshotDeletion pod, the
// members a failed group pod reported being recorded for that first), then the
// group's record. If the undoing fails, the answer is ABORTED and the retry
// finishes it.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
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
	"github.com/pods-as-volumes/pav/internal/report"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/podrunner"
)

// GroupSnapshotRecords keeps the PavGroupSnapshot records
// (records.GroupSnapshotStore).
type GroupSnapshotRecords interface {
	Get(ctx context.Context, groupSnapshotName string) (*v1alpha1.PavGroupSnapshot, error)
	ByHandle(ctx context.Context, handle string, live bool) ([]*v1alpha1.PavGroupSnapshot, error)
	Create(ctx context.Context, v *v1alpha1.PavGroupSnapshot) (*v1alpha1.PavGroupSnapshot, error)
	Update(ctx context.Context, v *v1alpha1.PavGroupSnapshot) (*v1alpha1.PavGroupSnapshot, error)
	Delete(ctx context.Context, v *v1alpha1.PavGroupSnapshot) error
}

// csi-snapshotter's --extra-create-metadata parameters of a group snapshot.
const (
	paramGroupSnapshotName      = "csi.storage.k8s.io/volumegroupsnapshot/name"
	paramGroupSnapshotNamespace = "csi.storage.k8s.io/volumegroupsnapshot/namespace"
	paramGroupSnapshotContent   = "csi.storage.k8s.io/volumegroupsnapshotcontent/name"
)

// GroupSnapshotKey is the in-flight key of CreateVolumeGroupSnapshot, and the
// volume key of both pods of a group: the CSI group snapshot name, kept apart
// from volume and snapshot names.
func GroupSnapshotKey(name string) string { return "groupsnapshot/" + name }

// groupSnapshotDeletionKey is DeleteVolumeGroupSnapshot's in-flight key.
func groupSnapshotDeletionKey(handle string) string { return "delete-groupsnapshot/" + handle }

// GroupControllerGetCapabilities advertises CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT
// when the spec has groupSnapshotCreation (the plugin capability
// GROUP_CONTROLLER_SERVICE follows the same spec, identity.go).
func (s *Server) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	p, err := s.Source.Get(false)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	resp := &csi.GroupControllerGetCapabilitiesResponse{}
	if f.GroupSnapshots && s.groupsKept() {
		resp.Capabilities = []*csi.GroupControllerServiceCapability{{Type: &csi.GroupControllerServiceCapability_Rpc{
			Rpc: &csi.GroupControllerServiceCapability_RPC{Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT}}}}
	}
	return resp, nil
}

// groupsKept reports whether this process keeps the records group snapshots need.
func (s *Server) groupsKept() bool { return s.Snapshots != nil && s.GroupSnapshots != nil }

// groupProvisioner is the provisioner, if it takes group snapshots.
func (s *Server) groupProvisioner() (*v1alpha1.PavProvisioner, error) {
	p, err := s.snapshotProvisioner()
	if err != nil {
		return nil, err
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, err
	}
	if !f.GroupSnapshots || !s.groupsKept() {
		return nil, status.Errorf(codes.Unimplemented, "PavProvisioner %q takes no group snapshots: add spec.groupSnapshotCreation", p.Name)
	}
	return p, nil
}

// CreateVolumeGroupSnapshot records the group, makes its members' snapshots
// (resuming from the records on a retry) and returns the group, ready to use.
func (s *Server) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	g, err := s.createGroupSnapshot(ctx, req)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: g}, nil
}

func (s *Server) createGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.VolumeGroupSnapshot, error) {
	name, ids := req.GetName(), req.GetSourceVolumeIds()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "group snapshot name is required")
	}
	if len(ids) == 0 {
		return nil, status.Error(codes.InvalidArgument, "source_volume_ids is required: a group snapshot needs at least one volume")
	}
	for i, id := range ids {
		if id == "" {
			return nil, status.Errorf(codes.InvalidArgument, "source_volume_ids[%d] is empty", i)
		}
		if slices.Contains(ids[:i], id) {
			return nil, status.Errorf(codes.InvalidArgument, "source_volume_ids lists volume %s twice", id)
		}
	}
	p, err := s.groupProvisioner()
	if err != nil {
		return nil, err
	}
	release, ok := s.busy.TryAcquire(GroupSnapshotKey(name))
	if !ok {
		return nil, status.Errorf(codes.Aborted, "an operation on group snapshot %s is already in progress", name)
	}
	defer release()

	params := volume.UserParams(req.GetParameters())
	rec, err := s.GroupSnapshots.Get(ctx, name)
	if errors.Is(err, records.ErrOtherGroupSnapshotOwner) {
		return nil, grpcerr.WithCode(codes.AlreadyExists, err)
	}
	if err != nil {
		return nil, err
	}
	if rec != nil {
		if err := sameGroup(rec, ids, params); err != nil {
			return nil, err
		}
	} else if rec, err = s.recordGroupSnapshot(ctx, p, req, params); err != nil {
		return nil, err
	}
	j := &groupJob{s: s, p: p, g: rec}
	unlock, err := j.lockMembers()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return j.resume(ctx)
}

// sameGroup checks that a repeated CreateVolumeGroupSnapshot asks for the
// group recorded under its name: the same volumes (in any order) and
// parameters (CSI idempotency); anything else is ALREADY_EXISTS.
func sameGroup(g *v1alpha1.PavGroupSnapshot, ids []string, params map[string]string) error {
	recorded := make([]string, 0, len(g.Spec.Members))
	for _, m := range g.Spec.Members {
		recorded = append(recorded, m.SourceVolumeID)
	}
	asked := slices.Clone(ids)
	slices.Sort(recorded)
	slices.Sort(asked)
	switch {
	case !slices.Equal(recorded, asked):
		return grpcerr.Errorf(codes.AlreadyExists, "group snapshot %s already exists, of volumes %s, not %s", g.Spec.GroupSnapshotName,
			strings.Join(recorded, ", "), strings.Join(asked, ", "))
	case !maps.Equal(g.Spec.Params, params):
		return grpcerr.Errorf(codes.AlreadyExists, "group snapshot %s already exists with other parameters", g.Spec.GroupSnapshotName)
	}
	return nil
}

// recordGroupSnapshot creates a new group's record, with what its contexts
// need of each member's source volume (from the volumes' records). Nothing is
// written for a request the provisioner refuses: a volume it has no created
// volume of (another provisioner's, whose handle means nothing here, or an
// unknown one) is NOT_FOUND, and the templates are evaluated first.
func (s *Server) recordGroupSnapshot(ctx context.Context, p *v1alpha1.PavProvisioner, req *csi.CreateVolumeGroupSnapshotRequest, params map[string]string) (*v1alpha1.PavGroupSnapshot, error) {
	name := req.GetName()
	sp := v1alpha1.PavGroupSnapshotSpec{GroupSnapshotName: name, Params: params}
	for i, id := range req.GetSourceVolumeIds() {
		vol, err := s.byHandle(ctx, id)
		if err != nil {
			return nil, err
		}
		if vol == nil || vol.Status.Phase != v1alpha1.VolumeCreated {
			return nil, grpcerr.Errorf(codes.NotFound,
				"source volume %s does not exist: PavProvisioner %q has no created volume with that handle (a group snapshot's volumes must all be volumes of this provisioner)", id, p.Name)
		}
		member := v1alpha1.GroupSnapshotMember{SnapshotName: phase.GroupMemberName(name, i), SourceVolumeID: id, SourceVolumeRecord: vol.Name,
			Volume: sourceVolume(vol)}
		// A member's name must be free: a snapshot of that name that is not
		// this group's would be taken for a member.
		other, err := s.Snapshots.Get(ctx, member.SnapshotName)
		if errors.Is(err, records.ErrOtherSnapshotOwner) {
			return nil, grpcerr.WithCode(codes.AlreadyExists, err)
		}
		if err != nil {
			return nil, err
		}
		if other != nil {
			return nil, grpcerr.Errorf(codes.AlreadyExists, "the snapshot name %s of group snapshot %s's member %d is taken by a snapshot of volume %s", member.SnapshotName, name, i, other.Spec.SourceVolumeID)
		}
		sp.Members = append(sp.Members, member)
	}
	raw := req.GetParameters()
	sp.VolumeGroupSnapshotContent = raw[paramGroupSnapshotContent]
	if ns, n := raw[paramGroupSnapshotNamespace], raw[paramGroupSnapshotName]; ns != "" && n != "" {
		sp.VolumeGroupSnapshot = ns + "/" + n
	}
	g := &v1alpha1.PavGroupSnapshot{Spec: sp, Status: v1alpha1.PavGroupSnapshotStatus{Phase: v1alpha1.SnapshotCreating}}
	j := &groupJob{s: s, p: p, g: g}
	cfg, err := j.creation(ctx)
	if err != nil {
		return nil, err
	}
	if cfg.PodTemplate != nil {
		j.addPod(v1alpha1.PhaseGroupSnapshotCreation, j.op(v1alpha1.PhaseGroupSnapshotCreation, *cfg.PodTemplate))
	} else {
		// The members' own pods, whose templates are checked now too; the
		// group's handle is its CSI name.
		for i := range sp.Members {
			if _, err := (&snapJob{s: s, p: p, v: &v1alpha1.PavSnapshot{Spec: j.memberSpec(i, name)}}).creation(ctx); err != nil {
				return nil, err
			}
		}
		g.Status.Handle = name
		if err := j.checkGroupHandle(ctx, name); err != nil {
			return nil, err
		}
	}
	created, err := s.GroupSnapshots.Create(ctx, g)
	if apierrors.IsAlreadyExists(err) {
		return nil, grpcerr.Errorf(codes.Aborted, "the record of group snapshot %s appeared meanwhile: %w", name, err)
	}
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("Recorded group snapshot", "groupSnapshot", name, "record", created.Name, "members", len(sp.Members),
		"byGroupPod", cfg.PodTemplate != nil)
	return created, nil
}

// groupJob is one call's work on one group snapshot record.
type groupJob struct {
	s *Server
	p *v1alpha1.PavProvisioner
	g *v1alpha1.PavGroupSnapshot
}

func (j *groupJob) name() string { return j.g.Spec.GroupSnapshotName }

// byGroupPod reports whether the group was (or is being) made by a
// groupSnapshotCreation pod: decided when it was recorded, whatever the spec
// says since.
func (j *groupJob) byGroupPod() bool {
	return j.g.Status.Pod(v1alpha1.PhaseGroupSnapshotCreation) != nil
}

func (j *groupJob) members() []phase.GroupMember {
	out := make([]phase.GroupMember, len(j.g.Spec.Members))
	for i := range j.g.Spec.Members {
		m := &j.g.Spec.Members[i]
		out[i] = phase.GroupMember{SnapshotName: m.SnapshotName, Volume: &m.Volume}
	}
	return out
}

// memberSpec is the PavSnapshot spec of member i, whose group's handle is handle.
func (j *groupJob) memberSpec(i int, handle string) v1alpha1.PavSnapshotSpec {
	m := j.g.Spec.Members[i]
	return v1alpha1.PavSnapshotSpec{SnapshotName: m.SnapshotName, SourceVolumeID: m.SourceVolumeID, SourceVolumeRecord: m.SourceVolumeRecord,
		Params: j.g.Spec.Params, Volume: m.Volume, GroupSnapshotName: j.name(), GroupSnapshotHandle: handle}
}

// creation evaluates spec.groupSnapshotCreation; a config without a
// PodTemplate means the members' own pods.
func (j *groupJob) creation(ctx context.Context) (*phase.PodConfig, error) {
	vars, err := phase.GroupSnapshotVars(j.name(), j.g.Spec.Params, j.members())
	if err != nil {
		return nil, err
	}
	cfg, err := j.s.Eval.GroupSnapshotCreation(ctx, j.p, vars)
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		cfg = &phase.PodConfig{}
	}
	return cfg, nil
}

// deletion evaluates spec.groupSnapshotDeletion for the given member
// snapshots; a config without a PodTemplate means the members' own pods.
func (j *groupJob) deletion(ctx context.Context, targets []phase.GroupMemberSnapshot) (*phase.PodConfig, error) {
	vars, err := phase.GroupSnapshotDeletionVars(j.name(), j.g.Spec.Params, j.members(), orDefault(j.g.Status.Handle, j.name()), targets)
	if err != nil {
		return nil, err
	}
	cfg, err := j.s.Eval.GroupSnapshotDeletion(ctx, j.p, vars)
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		cfg = &phase.PodConfig{}
	}
	return cfg, nil
}

func (j *groupJob) op(ph v1alpha1.Phase, t corev1.PodTemplateSpec) podrunner.Operation {
	return PodOperation(j.p.Name, ph, GroupSnapshotKey(j.name()), t)
}

// addPod records a new pod entry with a fresh token (in memory: the caller's
// next write stores it, before the pod is asked for).
func (j *groupJob) addPod(ph v1alpha1.Phase, op podrunner.Operation) {
	j.g.Status.Pods = j.s.addPodEntry(j.g.Status.Pods, ph, op)
}

func (j *groupJob) save(ctx context.Context, mutate func(g *v1alpha1.PavGroupSnapshot)) error {
	g := j.g.DeepCopy()
	mutate(g)
	got, err := j.s.GroupSnapshots.Update(ctx, g)
	if err != nil {
		return err
	}
	j.g = got
	return nil
}

func (j *groupJob) pending(ph v1alpha1.Phase) *v1alpha1.VolumePod {
	return unfinished(j.g.Status.Pod(ph))
}

// run runs (or adopts) the pod of the phase's pending entry (runEntry).
func (j *groupJob) run(ctx context.Context, ph v1alpha1.Phase, op podrunner.Operation) (*podrunner.Result, error) {
	return j.s.runEntry(ctx, podLedger{
		what:    "group snapshot " + j.name(),
		entries: j.g.Status.Pods,
		update: func(ctx context.Context, _ bool, mutate func(*[]v1alpha1.VolumePod)) error {
			return j.save(ctx, func(r *v1alpha1.PavGroupSnapshot) { mutate(&r.Status.Pods) })
		},
	}, ph, op)
}

// removeDone removes every pod whose outcome is recorded (removeDonePods).
func (j *groupJob) removeDone(ctx context.Context) error {
	return j.s.removeDonePods(ctx, j.g.Status.Pods, func(e v1alpha1.VolumePod) podrunner.Operation {
		return PodOperation(j.p.Name, e.Phase, GroupSnapshotKey(j.name()), corev1.PodTemplateSpec{})
	})
}

// lockMembers takes the in-flight keys of the group's members (their
// CreateSnapshot names and, once known, their DeleteSnapshot handles), so that
// no call on a member runs beside the group's; ABORTED if one does.
func (j *groupJob) lockMembers() (func(), error) {
	var keys []string
	for _, m := range j.g.Spec.Members {
		keys = append(keys, SnapshotKey(m.SnapshotName))
	}
	for _, sn := range j.g.Status.Snapshots {
		keys = append(keys, snapshotDeletionKey(sn.Handle))
	}
	var releases []func()
	unlock := func() {
		for _, r := range releases {
			r()
		}
	}
	for _, k := range keys {
		r, ok := j.s.busy.TryAcquire(k)
		if !ok {
			unlock()
			return nil, status.Errorf(codes.Aborted, "an operation on a member of group snapshot %s (%s) is already in progress", j.name(), k)
		}
		releases = append(releases, r)
	}
	return unlock, nil
}

// resume carries a group's creation on from its record's phase.
func (j *groupJob) resume(ctx context.Context) (*csi.VolumeGroupSnapshot, error) {
	for {
		switch j.g.Status.Phase {
		case v1alpha1.SnapshotCreating:
			var err error
			if j.byGroupPod() {
				err = j.createByGroupPod(ctx)
			} else {
				err = j.createByMembers(ctx)
			}
			if err != nil {
				return nil, err
			}
		case v1alpha1.SnapshotCreated:
			if err := j.removeDone(ctx); err != nil {
				return nil, err
			}
			return csiGroupSnapshot(j.g), nil
		case v1alpha1.SnapshotDeleting:
			if j.g.Status.Reason != "" {
				return nil, j.revert(ctx)
			}
			return nil, grpcerr.Errorf(codes.FailedPrecondition, "group snapshot %s is being deleted", j.name())
		default:
			return nil, fmt.Errorf("PavGroupSnapshot %s has an unknown phase %q", j.g.Name, j.g.Status.Phase)
		}
	}
}

// csiGroupSnapshot is a created group as CSI reports it.
func csiGroupSnapshot(g *v1alpha1.PavGroupSnapshot) *csi.VolumeGroupSnapshot {
	st := &g.Status
	out := &csi.VolumeGroupSnapshot{GroupSnapshotId: st.Handle, ReadyToUse: st.ReadyToUse}
	if st.CreationTime != nil {
		out.CreationTime = timestamppb.New(st.CreationTime.Time)
	}
	for _, sn := range st.Snapshots {
		out.Snapshots = append(out.Snapshots, &csi.Snapshot{SnapshotId: sn.Handle, SourceVolumeId: sn.SourceVolumeID, SizeBytes: sn.Size,
			CreationTime: out.CreationTime, ReadyToUse: st.ReadyToUse, GroupSnapshotId: st.Handle})
	}
	return out
}

// createByGroupPod runs the groupSnapshotCreation pod and records what it
// made (its /pav/handle, else the CSI name; each member's handle and size
// from /pav/snapshots, else the defaults), then the members' records. A failed
// pod, or one that wrote something invalid, is undone.
func (j *groupJob) createByGroupPod(ctx context.Context) error {
	const ph = v1alpha1.PhaseGroupSnapshotCreation
	if e := j.g.Status.Pod(ph); e != nil && e.Outcome == v1alpha1.PodSucceeded {
		// The pod's result is recorded: a restart came before the members'.
		return j.recordMembers(ctx)
	}
	cfg, err := j.creation(ctx)
	if err != nil {
		return err
	}
	if cfg.PodTemplate == nil {
		return grpcerr.Errorf(codes.FailedPrecondition, "group snapshot %s is being created by a groupSnapshotCreation pod, but spec.groupSnapshotCreation no longer has a podTemplate; restore it", j.name())
	}
	res, err := j.run(ctx, ph, j.op(ph, *cfg.PodTemplate))
	if errors.Is(err, podrunner.ErrForeignPod) {
		for _, e := range j.g.Status.Pods {
			if e.Phase == ph && (e.UID != "" || e.Outcome == v1alpha1.PodLost) {
				return grpcerr.WithCode(codes.Aborted, err) // one of ours may have done half its work
			}
		}
		if derr := j.s.GroupSnapshots.Delete(ctx, j.g); derr != nil {
			return derr
		}
		return err
	}
	defaults := j.defaultSnapshots()
	if _, ok := podrunner.IsPodFailure(err); ok {
		return j.fail(ctx, v1alpha1.ReasonCreationFailed, fmt.Errorf("group snapshot creation failed: %w", err), j.name(), defaults)
	}
	if err != nil {
		return err
	}
	handle := j.name()
	if h, ok := res.Files[report.FileHandle]; ok {
		if handle = strings.TrimSpace(h); handle == "" {
			return j.fail(ctx, v1alpha1.ReasonInvalidCreationOutput, errors.New("group snapshot creation: the groupSnapshotCreation pod wrote an empty /pav/handle (leave it out for the default, the group snapshot's name)"), j.name(), defaults)
		}
	}
	var reported *string
	if s, ok := res.Files[report.FileSnapshots]; ok {
		reported = &s
	}
	result, err := phase.ReadGroupSnapshots(reported, j.members())
	if err != nil {
		return j.fail(ctx, v1alpha1.ReasonInvalidCreationOutput, fmt.Errorf("group snapshot creation: %w", err), handle, defaults)
	}
	snaps := make([]v1alpha1.GroupMemberSnapshot, len(j.g.Spec.Members))
	for i, m := range j.g.Spec.Members {
		snaps[i] = v1alpha1.GroupMemberSnapshot{SourceVolumeID: m.SourceVolumeID, Handle: result.Handles[i], Size: result.Sizes[i]}
	}
	if err := j.checkHandles(ctx, handle, snaps); err != nil {
		// Never undone: the deletion pods would act on the other snapshots.
		// What the pod made is the provisioner's to find; the message says
		// whose handle it reused.
		if e := j.pending(ph); e != nil {
			e.Outcome = v1alpha1.PodSucceeded // in memory: so that removeDone removes it
		}
		if rerr := j.removeDone(ctx); rerr != nil {
			return rerr
		}
		if derr := j.s.GroupSnapshots.Delete(ctx, j.g); derr != nil {
			return derr
		}
		return err
	}
	if err := j.save(ctx, func(g *v1alpha1.PavGroupSnapshot) {
		g.Status.Pod(ph).Outcome = v1alpha1.PodSucceeded
		g.Status.Handle, g.Status.Snapshots = handle, snaps
	}); err != nil {
		return err
	}
	return j.recordMembers(ctx)
}

// defaultSnapshots are the members' snapshots a failed group pod is taken to
// have made (what a failed snapshotCreation pod is: the default handles, size
// unknown), for the groupSnapshotDeletion (or members' snapshotDeletion) pods
// that undo it.
func (j *groupJob) defaultSnapshots() []v1alpha1.GroupMemberSnapshot {
	out := make([]v1alpha1.GroupMemberSnapshot, len(j.g.Spec.Members))
	for i, m := range j.g.Spec.Members {
		out[i] = v1alpha1.GroupMemberSnapshot{SourceVolumeID: m.SourceVolumeID, Handle: m.SnapshotName}
	}
	return out
}

// checkGroupHandle refuses a group handle another group of this provisioner
// has (asking the API server): deleting either would delete both.
func (j *groupJob) checkGroupHandle(ctx context.Context, handle string) error {
	others, err := j.s.GroupSnapshots.ByHandle(ctx, handle, true)
	if err != nil {
		return err
	}
	for _, o := range others {
		if o.Spec.GroupSnapshotName != j.name() {
			return grpcerr.Errorf(codes.FailedPrecondition,
				"the created group snapshot's handle %q is already the handle of group snapshot %s: a handle must be unique; pav did not record this group and ran no deletion pod, which would act on that group",
				handle, o.Spec.GroupSnapshotName)
		}
	}
	return nil
}

// checkHandles refuses a group or member handle that another group or
// snapshot of this provisioner has.
func (j *groupJob) checkHandles(ctx context.Context, handle string, snaps []v1alpha1.GroupMemberSnapshot) error {
	if err := j.checkGroupHandle(ctx, handle); err != nil {
		return err
	}
	for i, sn := range snaps {
		others, err := j.s.Snapshots.ByHandle(ctx, sn.Handle, true)
		if err != nil {
			return err
		}
		for _, o := range others {
			if o.Spec.SnapshotName != j.g.Spec.Members[i].SnapshotName {
				return grpcerr.Errorf(codes.FailedPrecondition,
					"the group snapshot's member handle %q (of volume %s) is already the handle of snapshot %s (of volume %s): a handle must be unique; pav did not record this group and ran no deletion pod, which would act on that snapshot",
					sn.Handle, sn.SourceVolumeID, o.Spec.SnapshotName, o.Spec.SourceVolumeID)
			}
		}
	}
	return nil
}

// recordMembers creates the members' PavSnapshots of a group its pod made
// (Created, from status.snapshots), then records the group Created.
func (j *groupJob) recordMembers(ctx context.Context) error {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	for i, m := range j.g.Spec.Members {
		rec, err := j.memberRecord(ctx, i)
		if err != nil {
			return err
		}
		if rec != nil {
			continue // recorded before a restart
		}
		sn := j.g.Status.Snapshots[i]
		v := &v1alpha1.PavSnapshot{Spec: j.memberSpec(i, j.g.Status.Handle), Status: v1alpha1.PavSnapshotStatus{
			Phase: v1alpha1.SnapshotCreated, Handle: sn.Handle, Size: sn.Size, CreationTime: &now, ReadyToUse: true}}
		if _, err := j.s.Snapshots.Create(ctx, v); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return grpcerr.Errorf(codes.Aborted, "the record of snapshot %s appeared meanwhile: %w", m.SnapshotName, err)
			}
			return err
		}
	}
	return j.created(ctx, now)
}

// memberRecord is member i's PavSnapshot, or nil; a record of the name that
// is not this group's is an error (it was checked free when the group was
// recorded).
func (j *groupJob) memberRecord(ctx context.Context, i int) (*v1alpha1.PavSnapshot, error) {
	m := j.g.Spec.Members[i]
	rec, err := j.s.Snapshots.Get(ctx, m.SnapshotName)
	if errors.Is(err, records.ErrOtherSnapshotOwner) {
		return nil, grpcerr.WithCode(codes.FailedPrecondition, err)
	}
	if err != nil {
		return nil, err
	}
	if rec != nil && rec.Spec.GroupSnapshotName != j.name() {
		return nil, grpcerr.Errorf(codes.FailedPrecondition, "PavSnapshot %s (snapshot %s) is not a member of group snapshot %s: a human must tell which is right", rec.Name, m.SnapshotName, j.name())
	}
	return rec, nil
}

// created records the group Created, ready to use, and removes its pod.
func (j *groupJob) created(ctx context.Context, at metav1.Time) error {
	if err := j.save(ctx, func(g *v1alpha1.PavGroupSnapshot) {
		g.Status.Phase, g.Status.CreationTime, g.Status.ReadyToUse = v1alpha1.SnapshotCreated, &at, true
		g.Status.Message = ""
	}); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Group snapshot created", "groupSnapshot", j.name(), "handle", j.g.Status.Handle, "members", len(j.g.Status.Snapshots))
	return j.removeDone(ctx)
}

// createByMembers makes the members by their own snapshotCreation pods, all
// at once: each member is recorded first (in the members' order), then every
// member resumes from its record. Once all are Created, so is the group; if
// one failed for good (its own revert ran, or runs), the group is undone.
func (j *groupJob) createByMembers(ctx context.Context) error {
	recs := make([]*v1alpha1.PavSnapshot, len(j.g.Spec.Members))
	for i := range j.g.Spec.Members {
		rec, err := j.memberRecord(ctx, i)
		if err != nil {
			return err
		}
		if rec == nil {
			if rec, err = j.s.createSnapshotRecord(ctx, j.p, j.memberSpec(i, j.g.Status.Handle)); err != nil {
				return err
			}
		}
		recs[i] = rec
	}
	errs := make([]error, len(recs))
	var wg sync.WaitGroup
	for i, rec := range recs {
		if rec.Status.Phase == v1alpha1.SnapshotCreated {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = (&snapJob{s: j.s, p: j.p, v: rec}).resume(ctx)
		}()
	}
	wg.Wait()

	// Where each member stands now: Created; failed for good (its record
	// gone, or Deleting while its revert is retried); or still Creating (a
	// pod to wait for, an API error: retried).
	var failed, pending error
	var latest metav1.Time
	snaps := make([]v1alpha1.GroupMemberSnapshot, len(recs))
	for i, m := range j.g.Spec.Members {
		rec, err := j.memberRecord(ctx, i)
		if err != nil {
			return err
		}
		cause := errs[i]
		if re := (*grpcerr.RevertError)(nil); errors.As(cause, &re) {
			cause = re.Cause // the member's undoing is the group's to retry
		}
		switch {
		case rec == nil || rec.Status.Phase == v1alpha1.SnapshotDeleting:
			if cause == nil {
				cause = errors.New("its record is gone")
			}
			if failed == nil {
				failed = fmt.Errorf("member snapshot %s of volume %s: %w", m.SnapshotName, m.SourceVolumeID, cause)
			}
		case rec.Status.Phase == v1alpha1.SnapshotCreated:
			snaps[i] = v1alpha1.GroupMemberSnapshot{SourceVolumeID: m.SourceVolumeID, Handle: rec.Status.Handle, Size: rec.Status.Size}
			if t := rec.Status.CreationTime; t != nil && t.After(latest.Time) {
				latest = *t
			}
		default:
			if pending == nil {
				pending = cause
				if pending == nil {
					pending = grpcerr.Errorf(codes.Aborted, "member snapshot %s of group snapshot %s is still being created", m.SnapshotName, j.name())
				}
			}
		}
	}
	if failed == nil && pending == nil {
		seen := map[string]string{}
		for _, sn := range snaps {
			if other, dup := seen[sn.Handle]; dup {
				failed = fmt.Errorf("the snapshots of volumes %s and %s both have handle %q: each member's handle must be unique", other, sn.SourceVolumeID, sn.Handle)
				break
			}
			seen[sn.Handle] = sn.SourceVolumeID
		}
	}
	switch {
	case failed != nil:
		return j.fail(ctx, v1alpha1.ReasonCreationFailed, fmt.Errorf("group snapshot creation failed: %w", failed), j.g.Status.Handle, nil)
	case pending != nil:
		return pending
	}
	if err := j.save(ctx, func(g *v1alpha1.PavGroupSnapshot) { g.Status.Snapshots = snaps }); err != nil {
		return err
	}
	if latest.IsZero() {
		latest = metav1.NewTime(time.Now().Truncate(time.Second))
	}
	return j.created(ctx, latest)
}

// fail records a failed creation (Deleting, with its reason, and the member
// snapshots a failed group pod is taken to have made) before the group pod is
// removed, and undoes the group.
func (j *groupJob) fail(ctx context.Context, reason string, cause error, handle string, snaps []v1alpha1.GroupMemberSnapshot) error {
	klog.FromContext(ctx).Info("Group snapshot creation failed; undoing it", "groupSnapshot", j.name(), "reason", reason, "err", cause.Error())
	if err := j.save(ctx, func(g *v1alpha1.PavGroupSnapshot) {
		if e := g.Status.Pod(v1alpha1.PhaseGroupSnapshotCreation); e != nil && e.Outcome == v1alpha1.PodRunning {
			e.Outcome = v1alpha1.PodFailed
		}
		g.Status.Phase, g.Status.Reason, g.Status.Message = v1alpha1.SnapshotDeleting, reason, cause.Error()
		g.Status.Handle = handle
		if snaps != nil {
			g.Status.Snapshots = snaps
		}
	}); err != nil {
		return err
	}
	if err := j.removeDone(ctx); err != nil {
		return err
	}
	return j.revert(ctx)
}

// revert deletes what a failed creation made, then the group's record, and
// returns the creation's failure (final); if the deletion fails, the record
// stays and the answer is ABORTED: csi-snapshotter retries, and the revert
// with it.
func (j *groupJob) revert(ctx context.Context) error {
	cause := errors.New(j.g.Status.Message)
	if err := j.deleteMembers(ctx); err != nil {
		return &grpcerr.RevertError{Cause: cause, Err: err}
	}
	if err := j.s.GroupSnapshots.Delete(ctx, j.g); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Group snapshot creation undone", "groupSnapshot", j.name())
	return grpcerr.WithCode(codes.Internal, cause)
}

// deleteMembers deletes the group's member snapshots that exist: the members'
// records that are left, and, when a failed group pod is undone, the members
// it is taken to have made (which have no records). With a
// groupSnapshotDeletion podTemplate one pod deletes them all (recorded in the
// group's record first), then their records go; otherwise each member's
// snapshotDeletion pod runs, at once, from the member's own record (made
// first, Deleting, for the members of a failed group pod). A member being
// deleted on its own finishes its own deletion; one still being created
// (members made by their own pods) finishes its creation first.
func (j *groupJob) deleteMembers(ctx context.Context) error {
	recs := make([]*v1alpha1.PavSnapshot, len(j.g.Spec.Members))
	var creating []int
	for i := range j.g.Spec.Members {
		rec, err := j.memberRecord(ctx, i)
		if err != nil {
			return err
		}
		recs[i] = rec
		if rec != nil && rec.Status.Phase == v1alpha1.SnapshotCreating {
			creating = append(creating, i)
		}
	}
	if len(creating) > 0 {
		errs := j.each(creating, func(i int) error {
			_, err := (&snapJob{s: j.s, p: j.p, v: recs[i]}).resume(ctx)
			return err
		})
		for _, i := range creating {
			rec, err := j.memberRecord(ctx, i)
			if err != nil {
				return err
			}
			if rec != nil && rec.Status.Phase == v1alpha1.SnapshotCreating {
				return fmt.Errorf("member snapshot %s is still being created: %w", j.g.Spec.Members[i].SnapshotName, errors.Join(errs...))
			}
			recs[i] = rec
		}
	}
	// What is left to delete, and how.
	unrecorded := j.g.Status.Reason != "" && j.byGroupPod() // a failed group pod's members
	var targets []phase.GroupMemberSnapshot
	var byOwnDeletion []int // members already being deleted on their own
	for i, rec := range recs {
		m := phase.GroupMember{SnapshotName: j.g.Spec.Members[i].SnapshotName, Volume: &j.g.Spec.Members[i].Volume}
		switch {
		case rec == nil && unrecorded && i < len(j.g.Status.Snapshots):
			sn := j.g.Status.Snapshots[i]
			targets = append(targets, phase.GroupMemberSnapshot{Member: m, Handle: sn.Handle, Size: sn.Size})
		case rec == nil:
		case rec.Status.Phase == v1alpha1.SnapshotCreated:
			targets = append(targets, phase.GroupMemberSnapshot{Member: m, Handle: rec.Status.Handle, Size: rec.Status.Size})
		default:
			byOwnDeletion = append(byOwnDeletion, i)
		}
	}
	const ph = v1alpha1.PhaseGroupSnapshotDeletion
	last := j.g.Status.Pod(ph)
	done := last != nil && last.Outcome == v1alpha1.PodSucceeded
	cfg, err := j.deletion(ctx, targets)
	if err != nil && !done {
		return err
	}
	if done || j.pending(ph) != nil || cfg.PodTemplate != nil {
		if err := j.deleteByGroupPod(ctx, cfg, targets); err != nil {
			return err
		}
		// The pod deleted the targets' snapshots: their records go.
		for i, rec := range recs {
			if rec != nil && rec.Status.Phase == v1alpha1.SnapshotCreated {
				if err := j.s.Snapshots.Delete(ctx, rec); err != nil {
					return err
				}
				recs[i] = nil
			}
		}
	} else {
		// Each member's own pod: the members a failed group pod made get
		// a record first (Deleting, with their snapshotDeletion pod).
		for i, rec := range recs {
			if rec == nil && unrecorded && i < len(j.g.Status.Snapshots) {
				v, err := j.recordForDeletion(ctx, i)
				if err != nil {
					return err
				}
				recs[i] = v
			}
			if recs[i] != nil && !slices.Contains(byOwnDeletion, i) {
				byOwnDeletion = append(byOwnDeletion, i)
			}
		}
	}
	errs := j.each(byOwnDeletion, func(i int) error { return j.s.deleteSnapshotRecord(ctx, j.p, recs[i]) })
	return errors.Join(errs...)
}

// deleteByGroupPod runs the groupSnapshotDeletion pod for the targets (recording
// it first), unless it already succeeded; a failed pod is recorded and
// removed, and the retry runs a new one.
func (j *groupJob) deleteByGroupPod(ctx context.Context, cfg *phase.PodConfig, targets []phase.GroupMemberSnapshot) error {
	const ph = v1alpha1.PhaseGroupSnapshotDeletion
	if j.pending(ph) == nil {
		if last := j.g.Status.Pod(ph); last != nil && last.Outcome == v1alpha1.PodSucceeded {
			return j.removeDone(ctx) // it succeeded, and a restart came before the records went
		}
		if len(targets) == 0 {
			return nil // nothing left for a pod to delete
		}
		if cfg.PodTemplate == nil {
			return grpcerr.Errorf(codes.FailedPrecondition, "group snapshot %s needs its groupSnapshotDeletion pod to run again, but spec.groupSnapshotDeletion no longer has a podTemplate; restore it", j.name())
		}
		if err := j.save(ctx, func(g *v1alpha1.PavGroupSnapshot) {
			(&groupJob{s: j.s, p: j.p, g: g}).addPod(ph, j.op(ph, *cfg.PodTemplate))
		}); err != nil {
			return err
		}
	}
	if cfg.PodTemplate == nil {
		return grpcerr.Errorf(codes.FailedPrecondition, "group snapshot %s is waiting for its groupSnapshotDeletion pod, but spec.groupSnapshotDeletion no longer has a podTemplate; restore it", j.name())
	}
	_, err := j.run(ctx, ph, j.op(ph, *cfg.PodTemplate))
	if f, ok := podrunner.IsPodFailure(err); ok {
		if serr := j.save(ctx, func(g *v1alpha1.PavGroupSnapshot) {
			if e := g.Status.Pod(ph); e != nil && e.Outcome == v1alpha1.PodRunning {
				e.Outcome = v1alpha1.PodFailed
			}
			if g.Status.Reason == "" {
				g.Status.Message = fmt.Sprintf("group snapshot deletion failed: %v", f)
			}
		}); serr != nil {
			return serr
		}
		if rerr := j.removeDone(ctx); rerr != nil {
			klog.FromContext(ctx).Error(rerr, "Could not remove the failed groupSnapshotDeletion pod; the retry will", "groupSnapshot", j.name())
		}
		return fmt.Errorf("group snapshot deletion failed: %w", err)
	}
	if err != nil {
		return err
	}
	if err := j.save(ctx, func(g *v1alpha1.PavGroupSnapshot) {
		g.Status.Pod(ph).Outcome = v1alpha1.PodSucceeded
	}); err != nil {
		return err
	}
	return j.removeDone(ctx)
}

// recordForDeletion records member i of a failed group pod (which has no
// record) Deleting, with its snapshotDeletion pod, so that the member's own
// deletion (deleteSnapshotRecord) undoes it.
func (j *groupJob) recordForDeletion(ctx context.Context, i int) (*v1alpha1.PavSnapshot, error) {
	sn := j.g.Status.Snapshots[i]
	v := &v1alpha1.PavSnapshot{Spec: j.memberSpec(i, j.g.Status.Handle), Status: v1alpha1.PavSnapshotStatus{
		Phase: v1alpha1.SnapshotDeleting, Handle: sn.Handle, Size: sn.Size,
		Message: fmt.Sprintf("undoing the failed group snapshot %s", j.name())}}
	sj := &snapJob{s: j.s, p: j.p, v: v}
	cfg, err := sj.deletion(ctx)
	if err != nil {
		return nil, err
	}
	if cfg.PodTemplate != nil {
		sj.addPod(v1alpha1.PhaseSnapshotDeletion, sj.op(v1alpha1.PhaseSnapshotDeletion, *cfg.PodTemplate))
	}
	created, err := j.s.Snapshots.Create(ctx, v)
	if apierrors.IsAlreadyExists(err) {
		return nil, grpcerr.Errorf(codes.Aborted, "the record of snapshot %s appeared meanwhile: %w", v.Spec.SnapshotName, err)
	}
	return created, err
}

// each runs f for each index at once and returns their errors.
func (j *groupJob) each(indices []int, f func(i int) error) []error {
	errs := make([]error, len(indices))
	var wg sync.WaitGroup
	for k, i := range indices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = f(i)
		}()
	}
	wg.Wait()
	return errs
}

// checkSnapshotIDs compares a request's snapshot_ids with the group's members
// (as a set): a mismatch is INVALID_ARGUMENT, as CSI asks. An empty list is
// taken as "not given" (csi-snapshotter always gives it).
func checkSnapshotIDs(g *v1alpha1.PavGroupSnapshot, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	want := make([]string, 0, len(g.Status.Snapshots))
	for _, sn := range g.Status.Snapshots {
		want = append(want, sn.Handle)
	}
	got := slices.Clone(ids)
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		return grpcerr.Errorf(codes.InvalidArgument, "snapshot_ids %s do not match the snapshots of group snapshot %s: %s",
			strings.Join(ids, ", "), g.Status.Handle, strings.Join(want, ", "))
	}
	return nil
}

// groupByHandle is the group record of a handle, or nil.
func (s *Server) groupByHandle(ctx context.Context, handle string) (*v1alpha1.PavGroupSnapshot, error) {
	gs, err := s.GroupSnapshots.ByHandle(ctx, handle, false)
	if err != nil {
		return nil, err
	}
	return onlyRecord("PavGroupSnapshots", handle, gs)
}

// DeleteVolumeGroupSnapshot deletes a group pav made: its members'
// snapshots, then its record. An unknown group is OK, as CSI asks.
func (s *Server) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	if err := s.deleteGroupSnapshot(ctx, req.GetGroupSnapshotId(), req.GetSnapshotIds()); err != nil {
		return nil, grpcerr.Status(err)
	}
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}

func (s *Server) deleteGroupSnapshot(ctx context.Context, handle string, ids []string) error {
	if handle == "" {
		return status.Error(codes.InvalidArgument, "group snapshot id is required")
	}
	if !s.groupsKept() {
		return nil // no group records at all: nothing to delete
	}
	p, err := s.Source.Get(false)
	if err != nil {
		return err
	}
	release, ok := s.busy.TryAcquire(groupSnapshotDeletionKey(handle))
	if !ok {
		return status.Errorf(codes.Aborted, "an operation on group snapshot %s is already in progress", handle)
	}
	defer release()
	g, err := s.groupByHandle(ctx, handle)
	if err != nil {
		return err
	}
	if g == nil {
		klog.FromContext(ctx).V(2).Info("DeleteVolumeGroupSnapshot of a group pav has no record of: nothing to do", "handle", handle)
		return nil
	}
	if err := checkSnapshotIDs(g, ids); err != nil {
		return err
	}
	j := &groupJob{s: s, p: p, g: g}
	switch g.Status.Phase {
	case v1alpha1.SnapshotCreated, v1alpha1.SnapshotDeleting:
	default:
		return grpcerr.Errorf(codes.FailedPrecondition, "group snapshot %s (handle %q) is still being created (%s)", g.Spec.GroupSnapshotName, handle, g.Status.Phase)
	}
	unlock, err := j.lockMembers()
	if err != nil {
		return err
	}
	defer unlock()
	if g.Status.Phase == v1alpha1.SnapshotCreated {
		if err := j.save(ctx, func(g *v1alpha1.PavGroupSnapshot) { g.Status.Phase = v1alpha1.SnapshotDeleting }); err != nil {
			return err
		}
	}
	if err := j.deleteMembers(ctx); err != nil {
		return err
	}
	if err := s.GroupSnapshots.Delete(ctx, j.g); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Group snapshot deleted", "groupSnapshot", j.name(), "handle", handle)
	return nil
}

// GetVolumeGroupSnapshot answers a created group's current state by its
// handle, from the records; a handle pav has no created group of is NOT_FOUND.
func (s *Server) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	g, err := s.getGroupSnapshot(ctx, req.GetGroupSnapshotId(), req.GetSnapshotIds())
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: g}, nil
}

func (s *Server) getGroupSnapshot(ctx context.Context, handle string, ids []string) (*csi.VolumeGroupSnapshot, error) {
	if handle == "" {
		return nil, status.Error(codes.InvalidArgument, "group snapshot id is required")
	}
	if !s.groupsKept() {
		return nil, grpcerr.Errorf(codes.NotFound, "group snapshot %s does not exist", handle)
	}
	g, err := s.groupByHandle(ctx, handle)
	if err != nil {
		return nil, err
	}
	if g == nil || g.Status.Phase != v1alpha1.SnapshotCreated {
		return nil, grpcerr.Errorf(codes.NotFound, "group snapshot %s does not exist", handle)
	}
	if err := checkSnapshotIDs(g, ids); err != nil {
		return nil, err
	}
	return csiGroupSnapshot(g), nil
}

// memberOfBusyGroup refuses DeleteSnapshot of a group's member while the
// group is being created or deleted (ABORTED: the group's call deletes it, or
// the retry finds it Created); a member of a created group is deleted on its
// own, as CSI allows (a pre-provisioned group's members may be).
func (s *Server) memberOfBusyGroup(ctx context.Context, rec *v1alpha1.PavSnapshot) error {
	if rec.Spec.GroupSnapshotName == "" || s.GroupSnapshots == nil {
		return nil
	}
	g, err := s.GroupSnapshots.Get(ctx, rec.Spec.GroupSnapshotName)
	if err != nil || g == nil || g.Status.Phase == v1alpha1.SnapshotCreated {
		return err
	}
	return grpcerr.Errorf(codes.Aborted, "snapshot %s is a member of group snapshot %s, which is being %s", rec.Spec.SnapshotName, rec.Spec.GroupSnapshotName,
		map[v1alpha1.SnapshotPhase]string{v1alpha1.SnapshotCreating: "created", v1alpha1.SnapshotDeleting: "deleted"}[g.Status.Phase])
}
