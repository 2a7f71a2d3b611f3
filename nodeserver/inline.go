package nodeserver

// CSI inline ephemeral volumes: a pod's `csi` volume, which the kubelet
// publishes (NodePublishVolume with csi.storage.k8s.io/ephemeral=true, no
// staging target path) and unpublishes when the pod goes, and never stages.
//
// NodePublishVolume makes the whole volume on this node: creation (the
// validation and creation pods, through controllerserver's CreateInline,
// recorded in the volume's PavVolume), staging (the staging pod, recorded in
// its state.json, as NodeStageVolume does), then the bind mount of
// /pav/volume at the target. NodeUnpublishVolume undoes it all: the bind
// mount, the staging (the unstaging pod), the volume (the deletion pod) and
// its record. Every pod runs on this node.
//
// # Resumable
//
// Each step is recorded before it acts: first a marker in the state
// directory (inline/<hash>.json: the volume id, its target and pod), which
// says that the volume id is an inline volume of this node, and lasts until
// its record is gone; then the record (before any creation pod); then
// state.json (before the staging pod). A call that a restart cut short
// (of the node plugin or the kubelet) is resumed from them by the next
// NodePublishVolume of the volume, or undone by its NodeUnpublishVolume, which
// the kubelet calls for a pod that is gone, and retries until it succeeds.
//
// A failed NodePublishVolume answers a final code only once nothing of the
// volume is left (no record, no state, no marker): the kubelet calls
// NodeUnpublishVolume after a final error only for a volume it mounted, so
// while anything is left the answer is ABORTED, which the kubelet counts as
// "maybe mounted": it retries the publish while the pod exists, and
// unpublishes it when the pod goes. The message is pav's, and the kubelet
// puts it in the pod's FailedMount event.
//
// # Input
//
// The volume's attributes are the pod's volumeAttributes, which the pod's
// author wrote: they are the contexts' `params`, and nothing else of them is
// taken (the handle is the CSI volume id, the pod pav's namespace or the
// template's). The pod's identity comes from the kubelet (podInfoOnMount),
// which overrides keys of those names in the attributes.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/controllerserver"
	"github.com/pods-as-volumes/pav/internal/csimode"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/volume"
)

// InlineVolumes creates and deletes inline volumes with the controller
// plugin's machinery (a controllerserver.Server of this node, with this
// node's pod runner and records.NodeStore).
type InlineVolumes interface {
	CreateInline(ctx context.Context, p *v1alpha1.PavProvisioner, iv controllerserver.InlineVolume) (*v1alpha1.PavVolume, error)
	DeleteInline(ctx context.Context, p *v1alpha1.PavProvisioner, id string) error
	// InlineRecord is the volume's record, or nil.
	InlineRecord(ctx context.Context, id string) (*v1alpha1.PavVolume, error)
}

// inlineMarker says that a volume id is an inline volume of this node, from
// before its record is written until after it is removed.
type inlineMarker struct {
	VolumeID string                `json:"volumeID"`
	Target   string                `json:"targetPath"`
	Pod      v1alpha1.EphemeralPod `json:"pod"`
}

// markerPath is the marker of volume id: inline/<the name of its volume
// directory>.json, beside the volume directories (which the node plugin's
// sweeps read: a directory without state.json is none of theirs).
func (s *Server) markerPath(id string) string {
	return filepath.Join(s.StateDir, "inline", filepath.Base(s.volumeDir(id))+".json")
}

func (s *Server) readMarker(id string) (*inlineMarker, error) {
	b, err := os.ReadFile(s.markerPath(id))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	m := &inlineMarker{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("%s: %w", s.markerPath(id), err)
	}
	if m.VolumeID != id {
		return nil, fmt.Errorf("%s is the marker of inline volume %s, not %s (a hash collision)", s.markerPath(id), m.VolumeID, id)
	}
	return m, nil
}

// writeMarker writes a marker atomically (write, then rename).
func (s *Server) writeMarker(m *inlineMarker) error {
	path := s.markerPath(m.VolumeID)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

func (s *Server) removeMarker(id string) error {
	if err := os.Remove(s.markerPath(id)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// inlineVolume reads an inline volume's request from NodePublishVolume's
// volume_context: the pod (the kubelet's keys) and the params (the rest).
func (s *Server) inlineVolume(id string, vc map[string]string) (controllerserver.InlineVolume, error) {
	iv := controllerserver.InlineVolume{ID: id, Node: s.NodeID, Pod: v1alpha1.EphemeralPod{
		Namespace: vc[volume.KeyPodNamespace], Name: vc[volume.KeyPodName], UID: types.UID(vc[volume.KeyPodUID]),
		ServiceAccountName: vc[volume.KeyServiceAccountName]}}
	if iv.Pod.Namespace == "" || iv.Pod.Name == "" || iv.Pod.UID == "" {
		return iv, status.Errorf(codes.InvalidArgument, "inline volume %s: the volume context lacks the pod (%s, %s, %s), which the kubelet adds for a CSIDriver with podInfoOnMount: the pav manager sets it for a PavProvisioner with Ephemeral in spec.provisioningModes",
			id, volume.KeyPodNamespace, volume.KeyPodName, volume.KeyPodUID)
	}
	params, err := volume.InlineParams(vc)
	if err != nil {
		return iv, status.Error(codes.InvalidArgument, err.Error())
	}
	iv.Params = params
	return iv, nil
}

// publishInline is NodePublishVolume of an inline ephemeral volume: it is
// created, staged and published, or resumed where a call before stopped.
func (s *Server) publishInline(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	switch {
	case id == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case target == "":
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	case req.GetStagingTargetPath() != "":
		return nil, status.Errorf(codes.InvalidArgument, "volume %s is an inline ephemeral volume (%s=true), which is never staged by the caller, but the request has a staging target path", id, volume.KeyEphemeral)
	}
	if mode, err := csimode.VolumeMode(req.GetVolumeCapability()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	} else if mode != corev1.PersistentVolumeFilesystem {
		return nil, status.Errorf(codes.InvalidArgument, "inline ephemeral volume %s: pav's inline volumes are file systems (a mount capability), not %s", id, mode)
	}
	if s.Inline == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "inline ephemeral volume %s: this node plugin runs without the Kubernetes API, where inline volumes keep their records", id)
	}
	iv, err := s.inlineVolume(id, req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	release, ok := s.busy.TryAcquire(id)
	if !ok {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", id)
	}
	defer release()
	logger := klog.FromContext(ctx).WithValues("volume", id, "pod", klog.KRef(iv.Pod.Namespace, iv.Pod.Name))
	ctx = klog.NewContext(ctx, logger)

	dir := s.volumeDir(id)
	m, err := s.readMarker(id)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	if m != nil && (m.Pod.UID != iv.Pod.UID || m.Target != target) {
		return nil, status.Errorf(codes.AlreadyExists, "inline volume %s of pod %s/%s (uid %s) is published at %s on node %s, not for pod %s/%s (uid %s) at %s",
			id, m.Pod.Namespace, m.Pod.Name, m.Pod.UID, m.Target, s.NodeID, iv.Pod.Namespace, iv.Pod.Name, iv.Pod.UID, target)
	}
	// Published already (a repeated call, a kubelet restart): so be it if
	// the staging still holds.
	mounted, err := hostmount.IsMountPoint(target)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if mounted && m != nil {
		st, err := readState(dir)
		if err != nil {
			return nil, grpcerr.Status(err)
		}
		if _, why, err := s.published(id, dir, st); err != nil {
			return nil, grpcerr.Status(err)
		} else if why == "" {
			return &csi.NodePublishVolumeResponse{}, nil
		}
	}
	p, err := s.Source.Get(true)
	if err != nil {
		return nil, s.inlineFailed(ctx, id, err)
	}
	if m == nil {
		// Before anything of the volume exists: NodeUnpublishVolume finds
		// whatever comes next through it.
		if err := s.writeMarker(&inlineMarker{VolumeID: id, Target: target, Pod: iv.Pod}); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	v, err := s.Inline.CreateInline(ctx, p, iv)
	if err != nil {
		return nil, s.inlineFailed(ctx, id, err)
	}
	r := stageRequest{handle: id, mode: corev1.PersistentVolumeFilesystem, access: corev1.ReadWriteOnce, readOnly: req.GetReadonly(),
		volumeContext: req.GetVolumeContext(), inline: &inlineStage{capacity: v.Status.Capacity, pod: iv.Pod}}
	if err := s.stage(ctx, p, r); err != nil {
		return nil, s.inlineFailed(ctx, id, err)
	}
	st, err := readState(dir)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	src, why, err := s.published(id, dir, st)
	switch {
	case err != nil:
		return nil, s.inlineFailed(ctx, id, err)
	case why != "":
		return nil, status.Errorf(codes.Aborted, "inline volume %s was staged but does not hold: %s", id, why)
	}
	if mounted {
		// What it was bound to no longer holds (it was staged again).
		if err := hostmount.Unmount(target); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := hostmount.Bind(src, target, req.GetReadonly() || csimode.IsReadOnly(req.GetVolumeCapability())); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	logger.V(2).Info("Inline volume published", "target", target, "capacity", v.Status.Capacity)
	return &csi.NodePublishVolumeResponse{}, nil
}

// inlineFailed is the gRPC error of a failed inline publish: final only once
// nothing of the volume is left on the node or in the API (the marker then
// goes too), else ABORTED, so that the kubelet calls NodeUnpublishVolume when
// the pod goes (see the file comment).
func (s *Server) inlineFailed(ctx context.Context, id string, err error) error {
	err = grpcerr.Status(err)
	st, _ := status.FromError(err)
	if nonFinal(st.Code()) {
		return err
	}
	left := ""
	if _, serr := os.Stat(s.volumeDir(id)); serr == nil {
		left = "its staging directory"
	} else if v, rerr := s.Inline.InlineRecord(ctx, id); rerr != nil || v != nil {
		left = "its PavVolume"
		if rerr != nil {
			left = fmt.Sprintf("perhaps its PavVolume (%v)", rerr)
		}
	}
	if left == "" {
		if rerr := s.removeMarker(id); rerr != nil {
			left = "its marker"
		}
	}
	if left == "" {
		return err
	}
	return status.Errorf(codes.Aborted, "%s (%s; pav keeps %s on node %s until a retry succeeds or the pod's deletion removes it)", st.Message(), st.Code(), left, s.NodeID)
}

// unpublishInline is the rest of NodeUnpublishVolume for an inline volume
// (whose target is unmounted already): its staging is undone, then the
// volume and its record, then its marker. A volume id without a marker is
// not an inline volume of this node, or one that is gone: nothing to do.
func (s *Server) unpublishInline(ctx context.Context, id, target string) error {
	m, err := s.readMarker(id)
	if err != nil || m == nil {
		return err
	}
	if m.Target != target {
		// Not its target: a persistent volume with the inline volume's
		// handle? Never delete the inline volume for it.
		klog.FromContext(ctx).Info("Unpublished a target that is not the inline volume's: the volume stays", "volume", id, "target", target, "inlineTarget", m.Target)
		return nil
	}
	if s.Inline == nil {
		return grpcerr.Errorf(codes.FailedPrecondition, "inline ephemeral volume %s: this node plugin runs without the Kubernetes API, where inline volumes keep their records", id)
	}
	release, ok := s.busy.TryAcquire(id)
	if !ok {
		return status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", id)
	}
	defer release()
	p, err := s.Source.Get(false)
	if err != nil {
		return err
	}
	dir := s.volumeDir(id)
	st, err := readState(dir)
	if err != nil {
		return err
	}
	if st != nil {
		if err := s.unstageRecorded(ctx, st, dir); err != nil {
			return fmt.Errorf("unstaging inline volume %s: %w", id, err)
		}
	}
	if err := s.Inline.DeleteInline(ctx, p, id); err != nil {
		return fmt.Errorf("deleting inline volume %s: %w", id, err)
	}
	if err := s.removeMarker(id); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Inline volume deleted with its pod", "volume", id, "pod", klog.KRef(m.Pod.Namespace, m.Pod.Name))
	return nil
}

// nodeObjects are the objects of an inline volume's staging context: this
// Node (without an API, none).
func (s *Server) nodeObjects(ctx context.Context) (phase.Objects, error) {
	var objs phase.Objects
	if s.Client == nil {
		return objs, nil
	}
	node, err := s.Client.Nodes().Get(ctx, s.NodeID, metav1.GetOptions{})
	if err != nil {
		return objs, fmt.Errorf("reading Node %s: %w", s.NodeID, err)
	}
	objs.Node = node
	return objs, nil
}
