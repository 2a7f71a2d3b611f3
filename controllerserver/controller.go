// Package controllerserver is the CSI Controller service of pav: CreateVolume runs
// the provisioner's validation and creation pods, DeleteVolume its deletion pod.
// The stock external-provisioner sidecar turns PVCs into these calls and the
// results into PVs; this package never touches PVs itself.
package controllerserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/csimode"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/inflight"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/pvindex"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/podrunner"
)

// PodRunner runs and removes phase pods (podrunner.Runner).
type PodRunner interface {
	Run(ctx context.Context, op podrunner.Operation) (*podrunner.Result, error)
	Delete(ctx context.Context, op podrunner.Operation) error
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

// Server implements csi.ControllerServer.
type Server struct {
	csi.UnimplementedControllerServer

	Source provisioner.Source
	Eval   *phase.Evaluator
	Pods   PodRunner
	Client kubernetes.Interface // PVCs and StorageClasses; nil when only CSI requests are known
	PVs    pvindex.Lookup       // nil: DeleteVolume knows only what this process created

	busy    inflight.Set
	mu      sync.Mutex
	created map[string]*record // by CSI volume name
	// pods holds the token and UID of every pod this server runs, recorded
	// before the pod is asked for. In memory for now: the PavVolume record
	// takes it over (issue 12), so that a restarted driver can prove the pods
	// it finds are its own.
	pods *podIdentities
}

// podIdentities is the identity (podrunner token and UID) of each phase pod in
// flight, by pod name.
type podIdentities struct {
	mu  sync.Mutex
	ids map[string]*podIdentity
}

type podIdentity struct {
	token string
	uid   types.UID
}

// operation returns op with the recorded identity of its pod, recording a new
// token if there is none yet.
func (s *Server) operation(op podrunner.Operation) podrunner.Operation {
	s.mu.Lock()
	if s.pods == nil {
		s.pods = &podIdentities{}
	}
	ids := s.pods
	s.mu.Unlock()
	ids.mu.Lock()
	defer ids.mu.Unlock()
	if ids.ids == nil {
		ids.ids = map[string]*podIdentity{}
	}
	name := op.PodName()
	id := ids.ids[name]
	if id == nil {
		id = &podIdentity{token: podrunner.NewToken()}
		ids.ids[name] = id
	}
	op.Token, op.UID = id.token, id.uid
	op.Created = func(_ context.Context, uid types.UID) error {
		ids.mu.Lock()
		defer ids.mu.Unlock()
		if cur := ids.ids[name]; cur == id {
			id.uid = uid
		}
		return nil
	}
	return op
}

// forgetPod drops the identity of an operation's pod: once it is removed, or
// when it was deleted before it finished (the retry runs a new pod, with a new
// token).
func (s *Server) forgetPod(op podrunner.Operation) {
	s.mu.Lock()
	ids := s.pods
	s.mu.Unlock()
	if ids == nil {
		return
	}
	ids.mu.Lock()
	defer ids.mu.Unlock()
	delete(ids.ids, op.PodName())
}

// runPod runs an operation's pod under its recorded identity. Once the pod has
// an outcome (success or a pod failure) it is removed: the outcome is in hand,
// and nothing else depends on the pod. A pod deleted before it finished is
// forgotten, so that the retry runs a new one.
func (s *Server) runPod(ctx context.Context, op podrunner.Operation) (*podrunner.Result, error) {
	op = s.operation(op)
	res, err := s.Pods.Run(ctx, op)
	var pf *podrunner.PodFailure
	switch {
	case err == nil:
		op.UID = res.UID
	case errors.As(err, &pf):
		op.UID = pf.UID
	case errors.Is(err, podrunner.ErrPodDeleted):
		s.forgetPod(op)
		return nil, err
	default:
		return nil, err
	}
	if derr := s.Pods.Delete(ctx, op); derr != nil {
		// The outcome is known; the pod stays for the retry to read again.
		return nil, fmt.Errorf("removing the finished %s pod: %w", op.Phase, derr)
	}
	s.forgetPod(op)
	return res, err
}

// record is a volume this process created, for idempotent repeats and for a
// DeleteVolume that cannot find a PV (no Kubernetes, e.g. csi-sanity).
type record struct {
	name     string
	resp     *csi.Volume
	mode     corev1.PersistentVolumeMode
	params   map[string]string
	claim    *volume.Claim
	capacity int64
}

// ControllerGetCapabilities advertises CREATE_DELETE_VOLUME only: pav volumes are
// not attached (attachRequired: false) and have no snapshots or expansion yet.
func (s *Server) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{
			Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		}},
	}}}, nil
}

// CreateVolume validates the request, runs the validation and creation pods, and
// returns the volume's handle and capacity.
func (s *Server) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume name is required")
	}
	mode, accessModes, err := csimode.Capabilities(req.GetVolumeCapabilities())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "pav volumes cannot be created from a snapshot or another volume")
	}
	p, err := s.Source.Get(true)
	if err != nil {
		return nil, err
	}
	if !p.Spec.HasMode(v1alpha1.Dynamic) {
		return nil, status.Errorf(codes.InvalidArgument, "PavProvisioner %q does not allow dynamic provisioning: add Dynamic to spec.provisioningModes, or create PVs statically", p.Name)
	}
	release, ok := s.busy.TryAcquire(req.GetName())
	if !ok {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", req.GetName())
	}
	defer release()

	r, claim, pvc, err := s.request(ctx, req, mode, accessModes)
	if err != nil {
		return nil, err
	}
	if vol, err := s.existing(req, r, pvc); vol != nil || err != nil {
		return &csi.CreateVolumeResponse{Volume: vol}, err
	}

	objs := phase.Objects{PVC: claim.PVC, SC: claim.SC}
	if err := s.validate(ctx, p, req.GetName(), r, objs); err != nil {
		return nil, err
	}
	vol, err := s.create(ctx, p, req.GetName(), r, claim)
	if err != nil {
		return nil, err
	}
	s.remember(&record{name: req.GetName(), resp: vol, mode: mode, params: r.Params, claim: claim, capacity: vol.CapacityBytes})
	if pvc != nil {
		s.annotate(ctx, pvc, volume.Created{Name: req.GetName(), Handle: vol.VolumeId, Capacity: vol.CapacityBytes})
	}
	return &csi.CreateVolumeResponse{Volume: vol}, nil
}

// request gathers what the volume asks for. With external-provisioner's
// --extra-create-metadata the PVC and its StorageClass are read and their values
// used (PaV's contexts are defined on them); without, the CSI request alone.
func (s *Server) request(ctx context.Context, req *csi.CreateVolumeRequest, mode corev1.PersistentVolumeMode, accessModes []corev1.PersistentVolumeAccessMode) (phase.Request, *volume.Claim, *corev1.PersistentVolumeClaim, error) {
	r := phase.Request{
		VolumeMode:  mode,
		AccessModes: accessModes,
		MinCapacity: req.GetCapacityRange().GetRequiredBytes(),
		Params:      volume.UserParams(req.GetParameters()),
	}
	if lim := req.GetCapacityRange().GetLimitBytes(); lim > 0 {
		r.MaxCapacity = &lim
	}
	if r.MaxCapacity != nil && r.MinCapacity > *r.MaxCapacity {
		return r, nil, nil, status.Errorf(codes.InvalidArgument, "capacity range: required bytes %d exceed limit bytes %d", r.MinCapacity, *r.MaxCapacity)
	}
	claim := &volume.Claim{DefaultHandle: req.GetName()}
	name, ns := req.GetParameters()[volume.ParamPVCName], req.GetParameters()[volume.ParamPVCNamespace]
	if name == "" || ns == "" || s.Client == nil {
		s.fillClaim(claim, r)
		return r, claim, nil, nil
	}
	pvc, err := s.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return r, nil, nil, grpcerr.Status(fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", ns, name, err))
	}
	claim.PVC = pvc.DeepCopy()
	volume.Snapshot(&claim.PVC.ObjectMeta)
	// PaV's default handle is pvc-<uid>; external-provisioner's volume name is the
	// same by default, but a --volume-name-prefix may differ.
	claim.DefaultHandle = DefaultHandle(pvc)
	r = phase.FromClaim(r, pvc)
	if sc := pvc.Spec.StorageClassName; sc != nil && *sc != "" {
		obj, err := s.Client.StorageV1().StorageClasses().Get(ctx, *sc, metav1.GetOptions{})
		if err != nil {
			return r, nil, nil, grpcerr.Status(fmt.Errorf("reading StorageClass %s of PVC %s/%s: %w", *sc, ns, name, err))
		}
		claim.SC = obj.DeepCopy()
		volume.Snapshot(&claim.SC.ObjectMeta)
	}
	s.fillClaim(claim, r)
	return r, claim, pvc, nil
}

func (s *Server) fillClaim(c *volume.Claim, r phase.Request) {
	c.RequestedVolumeMode, c.RequestedAccessModes = r.VolumeMode, r.AccessModes
	c.RequestedMinCapacity, c.RequestedMaxCapacity = r.MinCapacity, r.MaxCapacity
}

// existing returns the volume a previous call already created under this name,
// or ALREADY_EXISTS when the new request does not fit it (CSI idempotency).
func (s *Server) existing(req *csi.CreateVolumeRequest, r phase.Request, pvc *corev1.PersistentVolumeClaim) (*csi.Volume, error) {
	s.mu.Lock()
	rec := s.created[req.GetName()]
	s.mu.Unlock()
	if rec == nil && pvc != nil {
		// The driver restarted after creating the volume but before the sidecar got
		// the answer: the PVC remembers it.
		var c volume.Created
		if a := pvc.Annotations[volume.AnnotationCreated]; a != "" && json.Unmarshal([]byte(a), &c) == nil && c.Name == req.GetName() {
			vc, err := volume.Context(r.Params, c.Capacity, nil)
			if err != nil {
				return nil, status.Error(codes.Internal, err.Error())
			}
			rec = &record{name: c.Name, mode: r.VolumeMode, params: r.Params, capacity: c.Capacity,
				resp: &csi.Volume{VolumeId: c.Handle, CapacityBytes: c.Capacity, VolumeContext: vc}}
		}
	}
	if rec == nil {
		return nil, nil
	}
	switch {
	case rec.capacity < r.MinCapacity || r.MaxCapacity != nil && rec.capacity > *r.MaxCapacity:
		return nil, status.Errorf(codes.AlreadyExists, "volume %s already exists with capacity %d bytes, outside the requested range", req.GetName(), rec.capacity)
	case rec.mode != r.VolumeMode:
		return nil, status.Errorf(codes.AlreadyExists, "volume %s already exists as a %s volume", req.GetName(), rec.mode)
	case !maps.Equal(rec.params, r.Params):
		return nil, status.Errorf(codes.AlreadyExists, "volume %s already exists with other parameters", req.GetName())
	}
	return rec.resp, nil
}

// validate checks the request against spec.volumeValidation and runs the
// validation pod, if any.
func (s *Server) validate(ctx context.Context, p *v1alpha1.PavProvisioner, name string, r phase.Request, objs phase.Objects) error {
	vars, err := phase.ValidationVars(r, objs, "")
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	cfg, err := s.Eval.Validation(ctx, p, vars)
	if err != nil {
		return grpcerr.Status(err)
	}
	if err := cfg.CheckRequest(r); err != nil {
		return grpcerr.Status(err)
	}
	if cfg.PodTemplate == nil {
		return nil
	}
	_, err = s.runPod(ctx, PodOperation(p.Name, v1alpha1.PhaseValidation, name, *cfg.PodTemplate))
	if err != nil {
		return grpcerr.Status(fmt.Errorf("volume validation failed: %w", err))
	}
	return nil
}

// create evaluates spec.volumeCreation, runs the creation pod, and works out the
// handle and capacity. Whatever goes wrong after the creation pod ran, the
// deletion pod runs to revert it.
func (s *Server) create(ctx context.Context, p *v1alpha1.PavProvisioner, name string, r phase.Request, claim *volume.Claim) (*csi.Volume, error) {
	objs := phase.Objects{PVC: claim.PVC, SC: claim.SC}
	vars, err := phase.CreationVars(r, objs, claim.DefaultHandle)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	cfg, err := s.Eval.Creation(ctx, p, vars)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	handle, capacity := cfg.Handle, int64(0)
	if cfg.Capacity != nil {
		capacity = *cfg.Capacity
	}
	if cfg.PodTemplate != nil {
		res, err := s.runPod(ctx, PodOperation(p.Name, v1alpha1.PhaseCreation, name, *cfg.PodTemplate))
		if err != nil {
			if isFinal(err) {
				err = s.revert(ctx, p, name, r, claim, orDefault(handle, claim.DefaultHandle), capacity, fmt.Errorf("volume creation failed: %w", err))
			}
			return nil, grpcerr.Status(err)
		}
		handle, capacity, err = fromPodFiles(res.Files, handle, capacity)
		if err != nil {
			return nil, grpcerr.Status(s.revert(ctx, p, name, r, claim, orDefault(handle, claim.DefaultHandle), capacity, grpcerr.WithCode(codes.Internal, err)))
		}
	}
	handle = orDefault(handle, claim.DefaultHandle)
	var rangeErr error
	switch {
	case capacity == 0:
		rangeErr = fmt.Errorf("the volume's capacity is unknown: set spec.volumeCreation.capacity or have the creation pod write /pav/capacity")
	case capacity < r.MinCapacity:
		rangeErr = fmt.Errorf("the created volume's capacity %s is below the requested %s", phase.FormatBytes(capacity), phase.FormatBytes(r.MinCapacity))
	case r.MaxCapacity != nil && capacity > *r.MaxCapacity:
		rangeErr = fmt.Errorf("the created volume's capacity %s is above the requested limit %s", phase.FormatBytes(capacity), phase.FormatBytes(*r.MaxCapacity))
	}
	if rangeErr != nil {
		if cfg.PodTemplate != nil {
			rangeErr = s.revert(ctx, p, name, r, claim, handle, capacity, rangeErr)
		}
		return nil, grpcerr.Status(grpcerr.WithCode(codes.OutOfRange, rangeErr))
	}
	vc, err := volume.Context(r.Params, capacity, claim)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.Volume{VolumeId: handle, CapacityBytes: capacity, VolumeContext: vc}, nil
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

// revert runs the deletion pod after a failed creation and returns cause, with
// the deletion's own failure added when it fails too.
func (s *Server) revert(ctx context.Context, p *v1alpha1.PavProvisioner, name string, r phase.Request, claim *volume.Claim, handle string, capacity int64, cause error) error {
	if err := s.runDeletion(ctx, p, name, r, claim, handle, capacity); err != nil {
		klog.ErrorS(err, "deletion pod after a failed creation failed too; the volume may need manual clean-up", "volume", name, "handle", handle)
		return &grpcerr.RevertError{Cause: cause, Err: fmt.Errorf("the deletion pod: %w", err)}
	}
	return cause
}

func (s *Server) runDeletion(ctx context.Context, p *v1alpha1.PavProvisioner, key string, r phase.Request, claim *volume.Claim, handle string, capacity int64) error {
	vars, err := phase.DeletionVars(r, phase.Objects{PVC: claim.PVC, SC: claim.SC}, claim.DefaultHandle, handle, capacity)
	if err != nil {
		return err
	}
	cfg, err := s.Eval.Deletion(ctx, p, vars)
	if err != nil || cfg.PodTemplate == nil {
		return err
	}
	_, err = s.runPod(ctx, PodOperation(p.Name, v1alpha1.PhaseDeletion, key, *cfg.PodTemplate))
	return err
}

// DeleteVolume runs the deletion pod of a volume pav created. An unknown handle
// is already deleted (OK, as CSI asks).
func (s *Server) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	handle := req.GetVolumeId()
	if handle == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	p, err := s.Source.Get(false)
	if err != nil {
		return nil, err
	}
	release, ok := s.busy.TryAcquire(DeletionKey(handle))
	if !ok {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", handle)
	}
	defer release()

	rec, err := s.lookup(handle)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		klog.V(2).InfoS("DeleteVolume of an unknown volume: nothing to delete", "handle", handle)
		return &csi.DeleteVolumeResponse{}, nil
	}
	claim := rec.claim
	if claim == nil {
		claim = &volume.Claim{DefaultHandle: rec.name}
	}
	r := phase.Request{VolumeMode: claim.RequestedVolumeMode, AccessModes: claim.RequestedAccessModes,
		MinCapacity: claim.RequestedMinCapacity, MaxCapacity: claim.RequestedMaxCapacity, Params: rec.params}
	if err := s.runDeletion(ctx, p, DeletionKey(handle), r, claim, handle, rec.capacity); err != nil {
		return nil, grpcerr.Status(fmt.Errorf("volume deletion failed: %w", err))
	}
	s.forget(handle)
	return &csi.DeleteVolumeResponse{}, nil
}

// lookup finds what DeleteVolume needs: the PV (informer index) or, without
// Kubernetes, this process's record.
func (s *Server) lookup(handle string) (*record, error) {
	if s.PVs != nil {
		pv, err := s.PVs.ByHandle(handle)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if pv != nil {
			if pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimRetain {
				return nil, status.Errorf(codes.FailedPrecondition, "PersistentVolume %s has reclaim policy Retain: its volume is never deleted", pv.Name)
			}
			capacity, claim, ours, err := volume.ParseContext(pv.Spec.CSI.VolumeAttributes)
			if err != nil {
				return nil, status.Error(codes.Internal, err.Error())
			}
			if !ours {
				// A static PV: its storage belongs to whoever created it.
				return nil, nil
			}
			if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
				capacity = q.Value()
			}
			name := pv.Name
			if claim != nil {
				name = claim.DefaultHandle
			}
			return &record{name: name, params: volume.UserParams(pv.Spec.CSI.VolumeAttributes), claim: claim, capacity: capacity}, nil
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rec := range s.created {
		if rec.resp.VolumeId == handle {
			return rec, nil
		}
	}
	return nil, nil
}

func (s *Server) remember(rec *record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.created == nil {
		s.created = map[string]*record{}
	}
	s.created[rec.name] = rec
}

func (s *Server) forget(handle string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, rec := range s.created {
		if rec.resp.VolumeId == handle {
			delete(s.created, name)
		}
	}
}

// annotate records the created volume on the PVC; failing to is not fatal (only a
// retry after a restart loses the shortcut), so it is logged.
func (s *Server) annotate(ctx context.Context, pvc *corev1.PersistentVolumeClaim, c volume.Created) {
	b, _ := json.Marshal(c)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{volume.AnnotationCreated: string(b)}}})
	_, err := s.Client.CoreV1().PersistentVolumeClaims(pvc.Namespace).Patch(ctx, pvc.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		klog.ErrorS(err, "could not record the created volume on its PVC", "pvc", klog.KObj(pvc))
	}
}

// ValidateVolumeCapabilities confirms capabilities against spec.volumeValidation
// for a volume that exists.
func (s *Server) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
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
	rec, err := s.lookup(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, status.Errorf(codes.NotFound, "volume %s does not exist", req.GetVolumeId())
	}
	r := phase.Request{VolumeMode: mode, AccessModes: modes, MinCapacity: rec.capacity, MaxCapacity: &rec.capacity, Params: rec.params}
	var objs phase.Objects
	if rec.claim != nil {
		objs = phase.Objects{PVC: rec.claim.PVC, SC: rec.claim.SC}
	}
	vars, err := phase.ValidationVars(r, objs, "")
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	cfg, err := s.Eval.Validation(ctx, p, vars)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	if err := cfg.CheckRequest(r); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// isFinal tells a pod that ended (failed, unschedulable, timed out) from a call
// that ran out of time while its pod still runs; only the former is reverted.
func isFinal(err error) bool {
	var pf *podrunner.PodFailure
	return errors.As(err, &pf)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
