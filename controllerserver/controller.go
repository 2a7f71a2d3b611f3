// Package controllerserver is the CSI Controller service of pav: CreateVolume runs
// the provisioner's validation and creation pods, DeleteVolume its deletion pod.
// The stock external-provisioner sidecar turns PVCs into these calls and the
// results into PVs; this package never touches PVs itself.
//
// # The record
//
// Every dynamically provisioned volume has a PavVolume (internal/records),
// which only pav's controller ServiceAccount may write: created at the start
// of CreateVolume, before any pod, and deleted when DeleteVolume (or the revert
// of a failed creation) has finished. It holds what creation saw (the request,
// the claim and StorageClass snapshot), the outcome (handle, capacity), and the
// identity of every pod pav runs for the volume, recorded before the pod is
// asked for. Each transition is one Update, and a finished pod is removed only
// once its outcome is in the record, so every call resumes where the last one
// stopped, after any restart, and no phase runs twice: a retry adopts the
// recorded pod (by UID, or token until the UID is known) and reads its result
// again. Nothing a tenant can write (PVC annotations, pods in their namespace)
// is ever taken for a record.
//
// The lifecycle (status.phase): Validating → Creating → Created → Deleting, and
// Creating → Reverting when creation fails for good (the deletion pod undoes
// it, then the record goes and the caller gets the creation's failure). A
// Created volume may grow (ControllerExpandVolume, expand.go): the growth
// under way is status.expansion, and the volume stays Created throughout; and
// its mutable parameters may change (ControllerModifyVolume, modify.go): the
// change under way is status.modification.
// A deletion (or revert) whose pod cannot be created because its namespace
// is gone stays Deleting (or Reverting) with reason DeletionNamespaceGone, or
// is forgotten (reason Forgotten, then the record goes): nsgone.go.
package controllerserver

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
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/csimode"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/inflight"
	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/report"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/podrunner"
)

// PodRunner runs and removes phase pods (podrunner.Runner).
type PodRunner interface {
	Run(ctx context.Context, op podrunner.Operation) (*podrunner.Result, error)
	Delete(ctx context.Context, op podrunner.Operation) error
	Namespace(op podrunner.Operation) string
}

// Records keeps the PavVolume records (records.Store).
type Records interface {
	Get(ctx context.Context, volumeName string) (*v1alpha1.PavVolume, error)
	ByHandle(ctx context.Context, handle string, live bool) ([]*v1alpha1.PavVolume, error)
	Create(ctx context.Context, v *v1alpha1.PavVolume) (*v1alpha1.PavVolume, error)
	Update(ctx context.Context, v *v1alpha1.PavVolume) (*v1alpha1.PavVolume, error)
	Delete(ctx context.Context, v *v1alpha1.PavVolume) error
}

// PodOperation is the operation whose pod the controller plugin runs for phase
// ph of a volume. key is the CSI volume name for validation and creation (and
// for the deletion that reverts a failed creation), DeletionKey(handle) for
// DeleteVolume. The key decides the pod's name, so that a retried call finds
// its pod; `pav render` builds its pods here too, so it shows the names the
// driver uses.
func PodOperation(provisioner string, ph v1alpha1.Phase, key string, t corev1.PodTemplateSpec) podrunner.Operation {
	return podrunner.Operation{Provisioner: provisioner, Phase: ph, VolumeKey: key, Template: t}
}

// DeletionKey is DeleteVolume's volume key (and in-flight key) for a handle,
// kept apart from the CSI volume names CreateVolume uses as keys.
func DeletionKey(handle string) string { return "delete/" + handle }

// DefaultHandle is PaV's default handle of a claim's volume, pvc-<uid>. It is
// also the CSI volume name external-provisioner gives the claim's volume with
// its default --volume-name-prefix.
func DefaultHandle(pvc *corev1.PersistentVolumeClaim) string { return "pvc-" + string(pvc.UID) }

// Server implements csi.ControllerServer and csi.GroupControllerServer.
type Server struct {
	csi.UnimplementedControllerServer
	// The GroupController service (groupsnapshot.go).
	csi.UnimplementedGroupControllerServer

	Source  provisioner.Source
	Eval    *phase.Evaluator
	Pods    PodRunner
	Records Records
	// Snapshots keeps the PavSnapshot records; nil: no snapshots.
	Snapshots SnapshotRecords
	Client    kube.Interface // PVCs and StorageClasses; nil when only CSI requests are known
	// Recorder, if set, gets the events pav puts on volumes' PVs (nsgone.go)
	// and the Warning events on the PavProvisioner (a capacity report that
	// failed).
	Recorder record.EventRecorder
	// Self is the controller plugin's own pod, if known: the capacity pods
	// in its namespace are owned by it, so that the garbage collector
	// removes them with it (a rollout, the provisioner's deletion).
	Self *corev1.ObjectReference
	// Background is the process's context, for work that outlives the call
	// that started it (capacity pods serve every caller of their segment);
	// nil: context.Background().
	Background context.Context

	// GroupSnapshots keeps the PavGroupSnapshot records; nil: no group
	// snapshots.
	GroupSnapshots GroupSnapshotRecords

	// The pods nodes run for volumes (SetNodePods; nil: none known):
	// DeleteVolume waits for a volume's to go (unstaged.go), unstagedWait at
	// most (0: DefaultUnstagedWait).
	nodePods     NodePods
	gone         goneStagings
	unstagedWait time.Duration

	busy inflight.Set

	// capacity keeps the reports of spec.storageCapacity (capacity.go),
	// made at its first use.
	capacityOnce sync.Once
	capacity     *capacityReporter
	// capacityInterval, if set, replaces refreshInterval (tests).
	capacityInterval time.Duration
	// metadata: the listings of snapshots' blocks (snapshot_metadata.go).
	metadata metadataState

	// legacyRefused: the handles of volumes v0.2.0 created that pav did not
	// adopt, and why (adopt.go).
	legacyMu      sync.Mutex
	legacyRefused map[string]error
}

// maxPodEntries bounds status.pods: a phase runs again only after its pod was
// lost (deleted by someone else) or failed, and the oldest such entries go.
const maxPodEntries = 12

// ControllerGetCapabilities advertises CREATE_DELETE_VOLUME, and what the
// current spec declares (phase.FeaturesOf): EXPAND_VOLUME with
// spec.volumeExpansion, CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS and GET_SNAPSHOT with
// spec.snapshotCreation, CLONE_VOLUME with Volume in
// spec.volumeCreation.contentSources, MODIFY_VOLUME with
// spec.volumeModification, GET_CAPACITY with spec.storageCapacity. pav
// volumes are not attached (attachRequired: false).
func (s *Server) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	rpcs := []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}
	p, err := s.Source.Get(false)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	if f.Expansion {
		rpcs = append(rpcs, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME)
	}
	if f.Snapshots && s.Snapshots != nil {
		rpcs = append(rpcs, csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT, csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
			csi.ControllerServiceCapability_RPC_GET_SNAPSHOT)
	}
	if f.Clones() {
		rpcs = append(rpcs, csi.ControllerServiceCapability_RPC_CLONE_VOLUME)
	}
	if f.Modification {
		rpcs = append(rpcs, csi.ControllerServiceCapability_RPC_MODIFY_VOLUME)
	}
	if f.Capacity {
		rpcs = append(rpcs, csi.ControllerServiceCapability_RPC_GET_CAPACITY)
	}
	caps := make([]*csi.ControllerServiceCapability, 0, len(rpcs))
	for _, c := range rpcs {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// CreateVolume checks the request, records the volume, runs the validation and
// creation pods (resuming from the record on a retry), and returns the
// volume's handle and capacity.
func (s *Server) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	vol, err := s.createVolume(ctx, req)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	return &csi.CreateVolumeResponse{Volume: vol}, nil
}

func (s *Server) createVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.Volume, error) {
	name := req.GetName()
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "volume name is required")
	}
	mode, accessModes, err := csimode.Capabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	r := phase.Request{
		VolumeMode:  mode,
		AccessModes: accessModes,
		MinCapacity: req.GetCapacityRange().GetRequiredBytes(),
		Params:      volume.UserParams(req.GetParameters()),
		Source:      requestedSource(req.GetVolumeContentSource()),
	}
	if lim := req.GetCapacityRange().GetLimitBytes(); lim > 0 {
		r.MaxCapacity = &lim
	}
	r.Topology = topologyRequirement(req.GetAccessibilityRequirements())
	if r.MaxCapacity != nil && r.MinCapacity > *r.MaxCapacity {
		return nil, status.Errorf(codes.InvalidArgument, "capacity range: required bytes %d exceed limit bytes %d", r.MinCapacity, *r.MaxCapacity)
	}
	p, err := s.Source.Get(true)
	if err != nil {
		return nil, err
	}
	if !p.Spec.HasMode(v1alpha1.Dynamic) {
		return nil, status.Errorf(codes.InvalidArgument, "PavProvisioner %q does not allow dynamic provisioning: add Dynamic to spec.provisioningModes, or create PVs statically", p.Name)
	}
	// The VolumeAttributesClass's parameters, checked before anything is
	// written.
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, err
	}
	r.MutableParams = mutableParams(req.GetMutableParameters())
	if err := checkMutableParams(p, f, r.MutableParams, "CreateVolume's mutable_parameters"); err != nil {
		return nil, err
	}
	release, ok := s.busy.TryAcquire(name)
	if !ok {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", name)
	}
	defer release()

	rec, err := s.Records.Get(ctx, name)
	if errors.Is(err, records.ErrOtherOwner) {
		return nil, grpcerr.WithCode(codes.AlreadyExists, err)
	}
	if err != nil {
		return nil, err
	}
	// A repeated call for a volume made earlier changes nothing.
	existed := rec != nil && rec.Status.Phase == v1alpha1.VolumeCreated
	if rec == nil {
		// The source is read (and checked) once, before the record: retries
		// use what the record says of it.
		if r.Source, err = s.contentSource(ctx, p, req.GetVolumeContentSource(), r.MaxCapacity); err != nil {
			return nil, err
		}
		if rec, err = s.record(ctx, p, name, req.GetParameters(), r, nil); err != nil || rec == nil {
			return nil, err
		}
	} else if rec.Spec.Ephemeral != nil {
		return nil, grpcerr.Errorf(codes.AlreadyExists, "volume name %s is that of an inline ephemeral volume of node %s", name, rec.Spec.Ephemeral.Node)
	} else if err := fits(rec, r); err != nil {
		return nil, err
	}
	j := &job{s: s, p: p, v: rec, pvName: req.GetParameters()[volume.ParamPVName]}
	vol, err := j.resume(ctx)
	if err == nil && !existed {
		// The volume takes space where it is: the capacity reports there
		// are stale (external-provisioner asks for them next).
		s.capacityChanged(j.v.Status.AccessibleTopology)
	}
	return vol, err
}

// fits checks that a repeated CreateVolume asks for the volume recorded under
// its name (CSI idempotency); anything else is ALREADY_EXISTS.
func fits(v *v1alpha1.PavVolume, r phase.Request) error {
	sp := &v.Spec
	switch {
	case sp.RequestedVolumeMode != r.VolumeMode:
		return grpcerr.Errorf(codes.AlreadyExists, "volume %s already exists as a %s volume", sp.VolumeName, sp.RequestedVolumeMode)
	case !maps.Equal(sp.Params, r.Params):
		return grpcerr.Errorf(codes.AlreadyExists, "volume %s already exists with other parameters", sp.VolumeName)
	case !maps.Equal(sp.MutableParams, r.MutableParams):
		// CSI: a volume of the name must be compatible with the request's
		// mutable_parameters. The claim's volumeAttributesClassName changed
		// before it was bound: creating the volume anew would leave the
		// first one behind, and taking it as it is would make the PV name
		// a class whose parameters it does not have.
		return grpcerr.Errorf(codes.AlreadyExists, "volume %s already exists with other mutable parameters (its VolumeAttributesClass's) %s, not %s: set the claim's volumeAttributesClassName back to the class it was created with, and change it once the claim is bound",
			sp.VolumeName, describeParams(sp.MutableParams), describeParams(r.MutableParams))
	case !sameSource(sp.Source, r.Source):
		return grpcerr.Errorf(codes.AlreadyExists, "volume %s already exists with another content source", sp.VolumeName)
	case v.Status.Phase == v1alpha1.VolumeCreated:
		c := v.Status.Capacity
		if c < r.MinCapacity || r.MaxCapacity != nil && c > *r.MaxCapacity {
			return grpcerr.Errorf(codes.AlreadyExists, "volume %s already exists with capacity %d bytes, outside the requested range", sp.VolumeName, c)
		}
	case sp.RequestedMinCapacity != r.MinCapacity || !equalPtr(sp.RequestedMaxCapacity, r.MaxCapacity):
		return grpcerr.Errorf(codes.AlreadyExists, "volume %s is being created for another capacity range", sp.VolumeName)
	}
	return nil
}

// describeParams is a parameter map as people read it: {a: "1", b: "2"},
// sorted; {} for none.
func describeParams(m map[string]string) string {
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %q", k, m[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func equalPtr(a, b *int64) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

// record checks a new volume's request against the provisioner (nothing is
// written for a request it refuses) and creates its record. With
// external-provisioner's --extra-create-metadata the PVC and its StorageClass
// are read, once: later phases use the record's snapshot, so a claim deleted
// meanwhile does not matter.
//
// An inline ephemeral volume (eph set, inline.go) has no claim: its
// parameters are its pod's volumeAttributes.
func (s *Server) record(ctx context.Context, p *v1alpha1.PavProvisioner, volumeName string, params map[string]string, r phase.Request, eph *v1alpha1.EphemeralVolume) (*v1alpha1.PavVolume, error) {
	sp := v1alpha1.PavVolumeSpec{VolumeName: volumeName, DefaultHandle: volumeName, Ephemeral: eph}
	if name, ns := params[volume.ParamPVCName], params[volume.ParamPVCNamespace]; eph == nil && name != "" && ns != "" && s.Client != nil {
		pvc, err := s.Client.PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			// Nothing was made: final.
			return nil, grpcerr.Errorf(codes.FailedPrecondition, "PersistentVolumeClaim %s/%s no longer exists", ns, name)
		}
		if err != nil {
			return nil, fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", ns, name, err)
		}
		sp.PVC = pvc.DeepCopy()
		volume.Snapshot(&sp.PVC.ObjectMeta)
		sp.Claim = ns + "/" + name
		// PaV's default handle is pvc-<uid>; external-provisioner's volume name is the
		// same by default, but a --volume-name-prefix may differ.
		sp.DefaultHandle = DefaultHandle(pvc)
		r = phase.FromClaim(r, pvc)
		if sc := pvc.Spec.StorageClassName; sc != nil && *sc != "" {
			obj, err := s.Client.StorageClasses().Get(ctx, *sc, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("reading StorageClass %s of PersistentVolumeClaim %s/%s: %w", *sc, ns, name, err)
			}
			sp.SC = obj.DeepCopy()
			volume.Snapshot(&sp.SC.ObjectMeta)
		}
	}
	sp.RequestedVolumeMode, sp.RequestedAccessModes = r.VolumeMode, r.AccessModes
	sp.RequestedMinCapacity, sp.RequestedMaxCapacity, sp.Params = r.MinCapacity, r.MaxCapacity, r.Params
	sp.AccessibilityRequirements, sp.Source = r.Topology, r.Source
	sp.MutableParams = r.MutableParams
	v := &v1alpha1.PavVolume{Spec: sp}

	// The static checks and every template, before anything is written.
	j := &job{s: s, p: p, v: v}
	vcfg, err := j.validation(ctx)
	if err != nil {
		return nil, err
	}
	if err := vcfg.CheckRequest(r); err != nil {
		return nil, err
	}
	ccfg, err := j.creation(ctx)
	if err != nil {
		return nil, err
	}
	if err := j.inlineHandle(ccfg.Handle, "spec.volumeCreation.handle"); err != nil {
		return nil, err
	}
	switch {
	case vcfg.PodTemplate != nil:
		v.Status.Phase = v1alpha1.VolumeValidating
		j.addPod(v1alpha1.PhaseValidation, j.op(v1alpha1.PhaseValidation, *vcfg.PodTemplate))
	case ccfg.PodTemplate != nil:
		v.Status.Phase = v1alpha1.VolumeCreating
		j.addPod(v1alpha1.PhaseCreation, j.op(v1alpha1.PhaseCreation, *ccfg.PodTemplate))
	default:
		// No pod at all: the volume is what the spec says, or nothing.
		handle, capacity := orDefault(ccfg.Handle, sp.DefaultHandle), int64(0)
		if ccfg.Capacity != nil {
			capacity = *ccfg.Capacity
		}
		if err := checkCapacity(capacity, r); err != nil {
			return nil, grpcerr.WithCode(codes.OutOfRange, err)
		}
		if err := j.checkHandle(ctx, handle); err != nil {
			return nil, err
		}
		topology, err := j.accessibleTopology(nil, ccfg)
		if errors.Is(err, phase.ErrOutsideRequisiteTopology) {
			return nil, grpcerr.WithCode(codes.ResourceExhausted, err)
		}
		if err != nil {
			return nil, err
		}
		v.Status = v1alpha1.PavVolumeStatus{Phase: v1alpha1.VolumeCreated, Handle: handle, Capacity: capacity, AccessibleTopology: topology}
	}
	created, err := s.Records.Create(ctx, v)
	if apierrors.IsAlreadyExists(err) {
		// Written meanwhile (the cache lagged, or another driver process):
		// the retry resumes from it.
		return nil, grpcerr.Errorf(codes.Aborted, "the record of volume %s appeared meanwhile: %w", volumeName, err)
	}
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("Recorded volume", "volume", volumeName, "record", created.Name, "phase", created.Status.Phase)
	return created, nil
}

// job is one call's work on one record.
type job struct {
	s      *Server
	p      *v1alpha1.PavProvisioner
	v      *v1alpha1.PavVolume
	pvName string // the PV's name (CreateVolume with --extra-create-metadata)
	// key is the volume key of the deletion pod: the volume name when
	// reverting a creation, DeletionKey(handle) in DeleteVolume.
	key string
}

func (j *job) request() phase.Request {
	sp := &j.v.Spec
	return phase.Request{VolumeMode: sp.RequestedVolumeMode, AccessModes: sp.RequestedAccessModes,
		MinCapacity: sp.RequestedMinCapacity, MaxCapacity: sp.RequestedMaxCapacity, Params: sp.Params,
		Topology: sp.AccessibilityRequirements, Source: sp.Source, Pod: ephemeralPod(sp.Ephemeral),
		// Validation and creation see CreateVolume's; every later phase the
		// current ones.
		MutableParams: j.v.CurrentMutableParams()}
}

func (j *job) objects() phase.Objects { return phase.Objects{PVC: j.v.Spec.PVC, SC: j.v.Spec.SC} }

func (j *job) validation(ctx context.Context) (*phase.ValidationConfig, error) {
	vars, err := phase.ValidationVars(j.request(), j.objects(), "")
	if err != nil {
		return nil, err
	}
	return j.s.Eval.Validation(ctx, j.p, vars)
}

func (j *job) creation(ctx context.Context) (*phase.CreationConfig, error) {
	if j.v.Spec.Ephemeral != nil && !hasPhase(j.p, v1alpha1.PhaseCreation) {
		// An inline volume of a provisioner whose staging pod alone makes
		// the volume: it has the capacity it asked for (inline.go).
		capacity := j.v.Spec.RequestedMinCapacity
		return &phase.CreationConfig{Capacity: &capacity}, nil
	}
	vars, err := phase.CreationVars(j.request(), j.objects(), j.v.Spec.DefaultHandle)
	if err != nil {
		return nil, err
	}
	return j.s.Eval.Creation(ctx, j.p, vars)
}

func (j *job) deletion(ctx context.Context) (*phase.DeletionConfig, error) {
	st := &j.v.Status
	vars, err := phase.DeletionVars(j.request(), j.objects(), j.v.Spec.DefaultHandle, orDefault(st.Handle, j.v.Spec.DefaultHandle), st.Capacity)
	if err != nil {
		return nil, err
	}
	return j.s.Eval.Deletion(ctx, j.p, vars)
}

// op is the operation of a phase's pod; the deletion pod's key depends on
// whether it reverts a creation or deletes a created volume.
func (j *job) op(ph v1alpha1.Phase, t corev1.PodTemplateSpec) podrunner.Operation {
	key := j.v.Spec.VolumeName
	if ph == v1alpha1.PhaseDeletion && j.key != "" {
		key = j.key
	}
	return j.podOp(ph, key, t)
}

// podOp is PodOperation for this job's volume: an inline ephemeral volume's
// pods all run on its node (inline.go), where its node plugin runs them.
func (j *job) podOp(ph v1alpha1.Phase, key string, t corev1.PodTemplateSpec) podrunner.Operation {
	op := PodOperation(j.p.Name, ph, key, t)
	if e := j.v.Spec.Ephemeral; e != nil {
		op.NodeName = e.Node
	}
	return op
}

// addPod records a new pod for a phase, with a fresh token (in memory: the
// caller's next write stores it, before the pod is asked for).
func (j *job) addPod(ph v1alpha1.Phase, op podrunner.Operation) {
	j.v.Status.Pods = j.s.addPodEntry(j.v.Status.Pods, ph, op)
}

// addPodEntry appends an entry with a fresh token for op's pod to a record's
// pod entries (PavVolume's or PavSnapshot's), dropping the oldest finished
// ones beyond maxPodEntries.
func (s *Server) addPodEntry(pods []v1alpha1.VolumePod, ph v1alpha1.Phase, op podrunner.Operation) []v1alpha1.VolumePod {
	for len(pods) >= maxPodEntries {
		i := 0
		for i < len(pods)-1 && pods[i].Outcome == v1alpha1.PodRunning {
			i++
		}
		pods = append(pods[:i], pods[i+1:]...)
	}
	return append(pods, v1alpha1.VolumePod{Phase: ph, Namespace: s.Pods.Namespace(op), Name: op.PodName(), Token: podrunner.NewToken()})
}

// save writes the record after mutate, in one Update.
func (j *job) save(ctx context.Context, mutate func(v *v1alpha1.PavVolume)) error {
	v := j.v.DeepCopy()
	mutate(v)
	got, err := j.s.Records.Update(ctx, v)
	if err != nil {
		return err
	}
	j.v = got
	return nil
}

// pending is the phase's pod entry that has no outcome yet, or nil.
func (j *job) pending(ph v1alpha1.Phase) *v1alpha1.VolumePod { return unfinished(j.v.Status.Pod(ph)) }

// unfinished is a phase's last pod entry e if it has no outcome yet, or nil.
func unfinished(e *v1alpha1.VolumePod) *v1alpha1.VolumePod {
	if e != nil && e.Outcome == v1alpha1.PodRunning {
		return e
	}
	return nil
}

// run runs (or adopts) the pod of the phase's pending entry (runEntry).
func (j *job) run(ctx context.Context, ph v1alpha1.Phase, op podrunner.Operation) (*podrunner.Result, error) {
	return j.s.runEntry(ctx, podLedger{
		what:    "volume " + j.v.Spec.VolumeName,
		entries: j.v.Status.Pods,
		update: func(ctx context.Context, created bool, mutate func(*[]v1alpha1.VolumePod)) error {
			return j.save(ctx, func(v *v1alpha1.PavVolume) {
				mutate(&v.Status.Pods)
				if created {
					// The pod exists: its namespace is no longer gone.
					clearNamespaceGone(v)
				}
			})
		},
	}, ph, op)
}

// withIdentity is op naming the pod of entry e.
func withIdentity(op podrunner.Operation, e v1alpha1.VolumePod) podrunner.Operation {
	op.Token, op.UID = e.Token, e.UID
	op.Template.Namespace = e.Namespace
	return op
}

// removeDone removes every pod whose outcome is recorded (removeDonePods).
func (j *job) removeDone(ctx context.Context) error {
	return j.s.removeDonePods(ctx, j.v.Status.Pods, func(e v1alpha1.VolumePod) podrunner.Operation {
		op := j.podOp(e.Phase, "", corev1.PodTemplateSpec{})
		op.VolumeKey = j.keyOf(e)
		return op
	})
}

// keyOf is the volume key of a recorded pod: the one whose PodName it has.
func (j *job) keyOf(e v1alpha1.VolumePod) string {
	if e.Phase == v1alpha1.PhaseDeletion && j.v.Status.Handle != "" &&
		podrunner.PodName(j.p.Name, e.Phase, DeletionKey(j.v.Status.Handle)) == e.Name {
		return DeletionKey(j.v.Status.Handle)
	}
	return j.v.Spec.VolumeName
}

// resume carries a volume's creation on from its record's phase.
func (j *job) resume(ctx context.Context) (*csi.Volume, error) {
	for {
		switch j.v.Status.Phase {
		case v1alpha1.VolumeValidating:
			if err := j.validate(ctx); err != nil {
				return nil, err
			}
		case v1alpha1.VolumeCreating:
			if err := j.create(ctx); err != nil {
				return nil, err
			}
		case v1alpha1.VolumeReverting:
			return nil, j.revert(ctx)
		case v1alpha1.VolumeCreated:
			if err := j.removeDone(ctx); err != nil {
				return nil, err
			}
			st := &j.v.Status
			return &csi.Volume{VolumeId: st.Handle, CapacityBytes: st.Capacity,
				VolumeContext:      volume.Context(j.v.Spec.Params, st.Capacity, j.pvName),
				AccessibleTopology: csiTopology(st.AccessibleTopology),
				ContentSource:      csiContentSource(j.v.Spec.Source)}, nil
		case v1alpha1.VolumeDeleting:
			return nil, grpcerr.Errorf(codes.FailedPrecondition, "volume %s is being deleted", j.v.Spec.VolumeName)
		default:
			return nil, fmt.Errorf("PavVolume %s has an unknown phase %q", j.v.Name, j.v.Status.Phase)
		}
	}
}

// validate runs the validation pod. Success moves the record to Creating (and
// records the creation pod) before the validation pod is removed; a refusal is
// recorded, then the pod and the record are removed (nothing else was made),
// and it is final.
func (j *job) validate(ctx context.Context) error {
	e := j.v.Status.Pod(v1alpha1.PhaseValidation)
	switch {
	case e == nil || e.Outcome == v1alpha1.PodSucceeded:
		// Success moves to Creating in the same write.
		return fmt.Errorf("PavVolume %s is Validating without a validation pod to run (a pav bug)", j.v.Name)
	case e.Outcome == v1alpha1.PodFailed:
		// Refused before a restart: finish the cleanup.
		return j.refused(ctx, grpcerr.Errorf(codes.InvalidArgument, "%s", j.v.Status.Message))
	}
	cfg, err := j.validation(ctx)
	if err != nil {
		return err
	}
	if cfg.PodTemplate == nil {
		return grpcerr.Errorf(codes.FailedPrecondition, "volume %s is waiting for its validation pod, but spec.volumeValidation no longer has a podTemplate; restore it, or delete the claim", j.v.Spec.VolumeName)
	}
	_, err = j.run(ctx, v1alpha1.PhaseValidation, j.op(v1alpha1.PhaseValidation, *cfg.PodTemplate))
	if errors.Is(err, podrunner.ErrForeignPod) || errors.Is(err, podrunner.ErrNamespaceGone) {
		// Validation pods change nothing: the volume starts over once the
		// pod is gone (or once its namespace exists).
		return j.refused(ctx, err)
	}
	if _, ok := podrunner.IsPodFailure(err); ok {
		failure := fmt.Errorf("volume validation failed: %w", err)
		if serr := j.save(ctx, func(v *v1alpha1.PavVolume) {
			v.Status.Pod(v1alpha1.PhaseValidation).Outcome = v1alpha1.PodFailed
			v.Status.Message = failure.Error()
		}); serr != nil {
			return serr
		}
		return j.refused(ctx, failure)
	}
	if err != nil {
		return err
	}
	ccfg, err := j.creation(ctx)
	if err != nil {
		return err
	}
	if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
		v.Status.Pod(v1alpha1.PhaseValidation).Outcome = v1alpha1.PodSucceeded
		v.Status.Phase = v1alpha1.VolumeCreating
		if ccfg.PodTemplate != nil {
			(&job{s: j.s, p: j.p, v: v}).addPod(v1alpha1.PhaseCreation, j.op(v1alpha1.PhaseCreation, *ccfg.PodTemplate))
		}
	}); err != nil {
		return err
	}
	return j.removeDone(ctx)
}

// refused ends a volume before anything was made (the validation pod refused
// it, or a foreign pod holds a pod name): pav's pods and the record go.
func (j *job) refused(ctx context.Context, failure error) error {
	if err := j.removeDone(ctx); err != nil {
		return err
	}
	if err := j.s.Records.Delete(ctx, j.v); err != nil {
		return err
	}
	return failure
}

// create runs the creation pod (if any) and works out the handle and capacity:
// /pav files, else the spec, else the default handle. Success records Created
// before the pod is removed. A final failure records Reverting.
func (j *job) create(ctx context.Context) error {
	cfg, err := j.creation(ctx)
	if err != nil {
		return err
	}
	if err := j.inlineHandle(cfg.Handle, "spec.volumeCreation.handle"); err != nil {
		return err
	}
	handle, capacity := cfg.Handle, int64(0)
	if cfg.Capacity != nil {
		capacity = *cfg.Capacity
	}
	var topology []map[string]string
	ran := j.v.Status.Pod(v1alpha1.PhaseCreation) != nil
	if ran {
		if cfg.PodTemplate == nil {
			return grpcerr.Errorf(codes.FailedPrecondition, "volume %s is being created by a creation pod, but spec.volumeCreation no longer has a podTemplate; restore it", j.v.Spec.VolumeName)
		}
		op := j.op(v1alpha1.PhaseCreation, *cfg.PodTemplate)
		res, err := j.run(ctx, v1alpha1.PhaseCreation, op)
		if errors.Is(err, podrunner.ErrForeignPod) {
			return j.foreignCreation(ctx, err)
		}
		if done, rerr := j.namespaceGoneBeforeAnyPod(ctx, v1alpha1.PhaseCreation, err); done {
			return rerr
		}
		if errors.Is(err, podrunner.ErrNamespaceGone) {
			// A creation pod of ours ran, and its namespace went before it
			// finished: what it made is undone, as for any failed creation.
			return j.fail(ctx, v1alpha1.ReasonCreationFailed, fmt.Errorf("volume creation failed: %w", err), orDefault(handle, j.v.Spec.DefaultHandle), capacity)
		}
		if _, ok := podrunner.IsPodFailure(err); ok {
			return j.fail(ctx, v1alpha1.ReasonCreationFailed, fmt.Errorf("volume creation failed: %w", err), orDefault(handle, j.v.Spec.DefaultHandle), capacity)
		}
		if err != nil {
			return err
		}
		if handle, capacity, err = fromPodFiles(res.Files, handle, capacity); err != nil {
			return j.fail(ctx, v1alpha1.ReasonInvalidCreationOutput, err, orDefault(handle, j.v.Spec.DefaultHandle), capacity)
		}
		if err := j.inlineHandle(handle, "/pav/handle"); err != nil {
			// Undone with the handle the volume must have: never one the
			// pod (and perhaps its tenant) chose.
			return j.fail(ctx, v1alpha1.ReasonInvalidCreationOutput, err, j.v.Spec.DefaultHandle, capacity)
		}
		var reported *string
		if t, ok := res.Files[report.FileTopology]; ok {
			reported = &t
		}
		if topology, err = j.accessibleTopology(reported, cfg); err != nil {
			reason := v1alpha1.ReasonInvalidCreationOutput
			if errors.Is(err, phase.ErrOutsideRequisiteTopology) {
				reason = v1alpha1.ReasonOutsideRequisiteTopology
			}
			return j.fail(ctx, reason, err, orDefault(handle, j.v.Spec.DefaultHandle), capacity)
		}
	} else if topology, err = j.accessibleTopology(nil, cfg); err != nil {
		if errors.Is(err, phase.ErrOutsideRequisiteTopology) {
			// Nothing was made: the record goes with the requirements it
			// holds, so that a call after a reschedule starts afresh.
			if derr := j.s.Records.Delete(ctx, j.v); derr != nil {
				return derr
			}
			return grpcerr.WithCode(codes.ResourceExhausted, err)
		}
		return err
	}
	handle = orDefault(handle, j.v.Spec.DefaultHandle)
	if err := checkCapacity(capacity, j.request()); err != nil {
		if !ran {
			// Nothing was made: nothing to revert.
			if derr := j.s.Records.Delete(ctx, j.v); derr != nil {
				return derr
			}
			return grpcerr.WithCode(codes.OutOfRange, err)
		}
		return j.fail(ctx, v1alpha1.ReasonCapacityOutOfRange, err, handle, capacity)
	}
	if err := j.checkHandle(ctx, handle); err != nil {
		// Never revert: the deletion pod would act on the other volume's
		// backend. The backend volume this pod made, if any, is the
		// provisioner's to find; the message says whose handle it reused.
		if e := j.pending(v1alpha1.PhaseCreation); e != nil {
			e.Outcome = v1alpha1.PodSucceeded // in memory: so that removeDone removes it
		}
		if rerr := j.removeDone(ctx); rerr != nil {
			return rerr
		}
		if derr := j.s.Records.Delete(ctx, j.v); derr != nil {
			return derr
		}
		return err
	}
	if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
		if e := v.Status.Pod(v1alpha1.PhaseCreation); e != nil {
			e.Outcome = v1alpha1.PodSucceeded
		}
		v.Status.Phase, v.Status.Handle, v.Status.Capacity = v1alpha1.VolumeCreated, handle, capacity
		v.Status.AccessibleTopology = topology
	}); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Volume created", "volume", j.v.Spec.VolumeName, "handle", handle, "capacity", capacity)
	return nil
}

// foreignCreation handles a creation pod name taken by a pod pav did not
// create. If no creation pod of ours can have run, nothing was made: the
// record goes and the error is final (a human deletes the pod; the PVC's retry
// starts over). If one of ours did exist (someone replaced it), its work may
// be half done: the record stays, and the answer is non-final so that
// external-provisioner keeps retrying until the pod is gone, and the revert
// or the creation then finishes.
func (j *job) foreignCreation(ctx context.Context, err error) error {
	for _, e := range j.v.Status.Pods {
		if e.Phase == v1alpha1.PhaseCreation && (e.UID != "" || e.Outcome == v1alpha1.PodLost) {
			return grpcerr.WithCode(codes.Aborted, err)
		}
	}
	return j.refused(ctx, err)
}

// checkHandle refuses a handle another volume of this provisioner already has
// (asking the API server, not the cache): two PVs with one handle would let
// either claim reach, and delete, the other's data.
func (j *job) checkHandle(ctx context.Context, handle string) error {
	if err := j.s.legacyRefusal(handle); err != nil {
		// The handle of volumes v0.2.0 made, which pav could not adopt.
		return grpcerr.Errorf(codes.FailedPrecondition, "the created volume's handle %q is taken: %w", handle, err)
	}
	others, err := j.s.Records.ByHandle(ctx, handle, true)
	if err != nil {
		return err
	}
	for _, o := range others {
		if o.Spec.VolumeName != j.v.Spec.VolumeName {
			return grpcerr.Errorf(codes.FailedPrecondition,
				"the created volume's handle %q is already the handle of volume %s (claim %s): a handle must be unique; pav did not record this volume and did not run the deletion pod, which would act on that volume",
				handle, o.Spec.VolumeName, orDefault(o.Spec.Claim, "unknown"))
		}
	}
	return nil
}

// fail records a final creation failure (Reverting, with the deletion pod to
// run) before the creation pod is removed, and reverts.
func (j *job) fail(ctx context.Context, reason string, cause error, handle string, capacity int64) error {
	klog.FromContext(ctx).Info("Volume creation failed; reverting it", "volume", j.v.Spec.VolumeName, "reason", reason, "err", cause.Error())
	// Evaluated now so that the Reverting write also records the deletion
	// pod; if it fails, revert evaluates it again (and says why).
	cfg, cfgErr := j.deletionAfter(ctx, handle, capacity)
	if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
		if e := v.Status.Pod(v1alpha1.PhaseCreation); e != nil && e.Outcome == v1alpha1.PodRunning {
			e.Outcome = v1alpha1.PodFailed
		}
		v.Status.Phase, v.Status.Reason, v.Status.Message = v1alpha1.VolumeReverting, reason, cause.Error()
		v.Status.Handle, v.Status.Capacity = handle, capacity
		if cfgErr == nil && cfg.PodTemplate != nil {
			(&job{s: j.s, p: j.p, v: v}).addPod(v1alpha1.PhaseDeletion, j.op(v1alpha1.PhaseDeletion, *cfg.PodTemplate))
		}
	}); err != nil {
		return err
	}
	if err := j.removeDone(ctx); err != nil {
		return err
	}
	return j.revert(ctx)
}

// deletionAfter evaluates spec.volumeDeletion for the handle and capacity creation got to.
func (j *job) deletionAfter(ctx context.Context, handle string, capacity int64) (*phase.DeletionConfig, error) {
	v := j.v.DeepCopy()
	v.Status.Handle, v.Status.Capacity = handle, capacity
	return (&job{s: j.s, p: j.p, v: v, key: j.key}).deletion(ctx)
}

// revert runs the deletion pod with the context creation had, then removes the
// record and returns the creation's failure (final). If the deletion pod fails
// the record stays, and the answer is ABORTED: external-provisioner keeps
// retrying, even once the PVC is gone, and so the revert is retried.
func (j *job) revert(ctx context.Context) error {
	st := &j.v.Status
	cause := errors.New(st.Message)
	var code codes.Code
	switch st.Reason {
	case v1alpha1.ReasonCapacityOutOfRange:
		code = codes.OutOfRange
	case v1alpha1.ReasonOutsideRequisiteTopology:
		// CSI: "unable to provision in accessible_topology". With a selected
		// node (WaitForFirstConsumer), external-provisioner then has the pod
		// scheduled again, perhaps where the volume can be made.
		code = codes.ResourceExhausted
	default:
		code = codes.Internal
	}
	if err := j.deleteBackend(ctx); err != nil {
		// Whatever the deletion's failure, the revert must be retried.
		return &grpcerr.RevertError{Cause: cause, Err: err}
	}
	if err := j.s.Records.Delete(ctx, j.v); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Volume creation reverted", "volume", j.v.Spec.VolumeName)
	return grpcerr.WithCode(code, cause)
}

// deleteBackend runs the pending deletion pod (if the spec has one), with the
// claim snapshot's context and the volume's handle and capacity, and removes it
// once it succeeded. A failed deletion pod is removed too, with a successor
// entry recorded, so that the retry runs it again.
func (j *job) deleteBackend(ctx context.Context) error {
	if j.v.Status.Reason == v1alpha1.ReasonForgotten {
		// Decided and recorded before a restart (nsgone.go): finish
		// forgetting, whatever the namespace has become since.
		return j.removeDone(ctx)
	}
	cfg, err := j.deletion(ctx)
	if j.pending(v1alpha1.PhaseDeletion) == nil {
		last := j.v.Status.Pod(v1alpha1.PhaseDeletion)
		if last != nil && last.Outcome == v1alpha1.PodSucceeded {
			// It succeeded, and a restart came before the record went.
			return j.removeDone(ctx)
		}
		if err != nil {
			return err
		}
		if cfg.PodTemplate == nil {
			if last == nil {
				// The spec has no deletion pod: nothing to run.
				return j.removeDone(ctx)
			}
			return grpcerr.Errorf(codes.FailedPrecondition, "volume %s needs its deletion pod to run again, but spec.volumeDeletion no longer has a podTemplate; restore it", j.v.Spec.VolumeName)
		}
		// The first deletion pod, or a new one after a failed or lost one.
		if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
			(&job{s: j.s, p: j.p, v: v, key: j.key}).addPod(v1alpha1.PhaseDeletion, j.op(v1alpha1.PhaseDeletion, *cfg.PodTemplate))
		}); err != nil {
			return err
		}
	}
	if err != nil {
		return err
	}
	if cfg.PodTemplate == nil {
		return grpcerr.Errorf(codes.FailedPrecondition, "volume %s is waiting for its deletion pod, but spec.volumeDeletion no longer has a podTemplate; restore it", j.v.Spec.VolumeName)
	}
	op := j.op(v1alpha1.PhaseDeletion, *cfg.PodTemplate)
	_, err = j.run(ctx, v1alpha1.PhaseDeletion, op)
	if gone, ok := podrunner.IsNamespaceGone(err); ok {
		return j.namespaceGone(ctx, gone, cfg)
	}
	if f, ok := podrunner.IsPodFailure(err); ok {
		// Record the failure, then remove the failed pod: the retry runs a
		// new one under a new entry.
		if serr := j.save(ctx, func(v *v1alpha1.PavVolume) {
			if e := v.Status.Pod(v1alpha1.PhaseDeletion); e != nil && e.Outcome == v1alpha1.PodRunning {
				e.Outcome = v1alpha1.PodFailed
			}
			if v.Status.Phase == v1alpha1.VolumeDeleting {
				// (Reverting keeps the creation's failure: the caller
				// gets it once the revert is done.)
				v.Status.Message = fmt.Sprintf("volume deletion failed: %v", f)
			}
		}); serr != nil {
			return serr
		}
		if rerr := j.removeDone(ctx); rerr != nil {
			klog.FromContext(ctx).Error(rerr, "Could not remove the failed deletion pod; the retry will", "volume", j.v.Spec.VolumeName)
		}
		return fmt.Errorf("volume deletion failed: %w", err)
	}
	if err != nil {
		return err
	}
	if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
		v.Status.Pod(v1alpha1.PhaseDeletion).Outcome = v1alpha1.PodSucceeded
	}); err != nil {
		return err
	}
	return j.removeDone(ctx)
}

func checkCapacity(capacity int64, r phase.Request) error {
	switch {
	case capacity == 0:
		return fmt.Errorf("the volume's capacity is unknown: set spec.volumeCreation.capacity or have the creation pod write /pav/capacity")
	case capacity < r.MinCapacity:
		return fmt.Errorf("the created volume's capacity %s is below the requested %s", phase.FormatBytes(capacity), phase.FormatBytes(r.MinCapacity))
	case r.MaxCapacity != nil && capacity > *r.MaxCapacity:
		return fmt.Errorf("the created volume's capacity %s is above the requested limit %s", phase.FormatBytes(capacity), phase.FormatBytes(*r.MaxCapacity))
	}
	return nil
}

// fromPodFiles applies /pav/handle and /pav/capacity, which win over the spec.
func fromPodFiles(files map[string]string, handle string, capacity int64) (string, int64, error) {
	if h, ok := files["handle"]; ok {
		h = strings.TrimSpace(h)
		if h == "" {
			return handle, capacity, fmt.Errorf("the creation pod wrote an empty /pav/handle")
		}
		handle = h
	}
	if c, ok := files["capacity"]; ok {
		n, err := phase.ParseCapacity(strings.TrimSpace(c), phase.Floor)
		if err != nil {
			return handle, capacity, fmt.Errorf("the creation pod wrote an invalid /pav/capacity %q: %v", c, err)
		}
		capacity = n
	}
	return handle, capacity, nil
}

// DeleteVolume runs the deletion pod of a volume pav created, with the context
// its creation had, whether or not the PV still exists and after any restart.
// A handle without a record (unknown, static, or already deleted) is OK, as
// CSI asks; volumes v0.2.0 created have one, adopted when the controller
// plugin started (adopt.go).
func (s *Server) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if err := s.deleteVolume(ctx, req.GetVolumeId()); err != nil {
		return nil, grpcerr.Status(err)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *Server) deleteVolume(ctx context.Context, handle string) error {
	if handle == "" {
		return status.Error(codes.InvalidArgument, "volume id is required")
	}
	p, err := s.Source.Get(false)
	if err != nil {
		return err
	}
	release, ok := s.busy.TryAcquire(DeletionKey(handle))
	if !ok {
		return status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", handle)
	}
	defer release()

	v, err := s.byHandle(ctx, handle)
	if err != nil || v == nil {
		if v == nil && err == nil {
			klog.FromContext(ctx).V(2).Info("DeleteVolume of a volume pav has no record of (unknown, static, or deleted): nothing to do", "handle", handle)
		}
		return err
	}
	if err := s.deleteRecorded(ctx, &job{s: s, p: p, v: v, key: DeletionKey(handle)}); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Volume deleted", "volume", v.Spec.VolumeName, "handle", handle)
	return nil
}

// deleteRecorded deletes a Created (or Deleting) volume: its deletion pod,
// recorded first, then its record.
func (s *Server) deleteRecorded(ctx context.Context, j *job) error {
	p, v, handle := j.p, j.v, j.v.Status.Handle
	switch v.Status.Phase {
	case v1alpha1.VolumeCreated:
		// Before anything of the deletion: a node may still stage it.
		if err := s.awaitUnstaged(ctx, p, v); err != nil {
			return err
		}
		if err := j.settleExpansion(ctx); err != nil {
			return err
		}
		if err := j.settleModification(ctx); err != nil {
			return err
		}
		cfg, err := j.deletion(ctx)
		if err != nil {
			return err
		}
		if err := j.save(ctx, func(v *v1alpha1.PavVolume) {
			v.Status.Phase = v1alpha1.VolumeDeleting
			if cfg.PodTemplate != nil {
				(&job{s: s, p: p, v: v, key: j.key}).addPod(v1alpha1.PhaseDeletion, j.op(v1alpha1.PhaseDeletion, *cfg.PodTemplate))
			}
		}); err != nil {
			return err
		}
	case v1alpha1.VolumeDeleting:
	default:
		return grpcerr.Errorf(codes.FailedPrecondition, "volume %s (handle %q) is still being created (%s)", v.Spec.VolumeName, handle, v.Status.Phase)
	}
	if err := j.deleteBackend(ctx); err != nil {
		return err
	}
	if err := s.Records.Delete(ctx, j.v); err != nil {
		return err
	}
	s.capacityChanged(j.v.Status.AccessibleTopology)
	return nil
}

// byHandle is the record of a handle, or nil; an error for a handle whose
// adoption was refused (legacyRefusal).
func (s *Server) byHandle(ctx context.Context, handle string) (*v1alpha1.PavVolume, error) {
	if err := s.legacyRefusal(handle); err != nil {
		return nil, err
	}
	all, err := s.Records.ByHandle(ctx, handle, false)
	if err != nil {
		return nil, err
	}
	// An inline ephemeral volume is its node plugin's: no controller RPC
	// (a PV's deletion, expansion, snapshot) acts on it.
	var vs []*v1alpha1.PavVolume
	for _, v := range all {
		if v.Spec.Ephemeral == nil {
			vs = append(vs, v)
		}
	}
	return onlyRecord("PavVolumes", handle, vs)
}

// ValidateVolumeCapabilities confirms capabilities against spec.volumeValidation
// for a volume pav created.
func (s *Server) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	resp, err := s.validateVolumeCapabilities(ctx, req)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	return resp, nil
}

func (s *Server) validateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	mode, modes, err := csimode.Capabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	p, err := s.Source.Get(false)
	if err != nil {
		return nil, err
	}
	v, err := s.byHandle(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if v == nil || v.Status.Phase != v1alpha1.VolumeCreated {
		return nil, grpcerr.Errorf(codes.NotFound, "volume %s does not exist", req.GetVolumeId())
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, err
	}
	if err := checkMutableParams(p, f, mutableParams(req.GetMutableParameters()), "mutable_parameters"); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	c := v.Status.Capacity
	r := phase.Request{VolumeMode: mode, AccessModes: modes, MinCapacity: c, MaxCapacity: &c, Params: v.Spec.Params, Source: v.Spec.Source,
		MutableParams: v.CurrentMutableParams()}
	vars, err := phase.ValidationVars(r, phase.Objects{PVC: v.Spec.PVC, SC: v.Spec.SC}, "")
	if err != nil {
		return nil, err
	}
	cfg, err := s.Eval.Validation(ctx, p, vars)
	if err != nil {
		return nil, err
	}
	if err := cfg.CheckRequest(r); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
		MutableParameters:  req.GetMutableParameters(),
	}}, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
