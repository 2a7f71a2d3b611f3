// Package nodeserver is the CSI Node service of pav. NodeStageVolume runs the
// provisioner's staging pod on this node with a per-volume host directory at
// /pav and checks the /pav/volume it exposes; NodeUnstageVolume stops that pod
// and runs the unstaging pod on the same directory. NodePublish/Unpublish
// bind-mount /pav/volume into pods.
//
// Nothing is mounted at the staging path: when /pav/volume is itself a mount
// (a tmpfs, a FUSE file system), a bind of it at the staging path would be a
// second reference to that mount, and kubelet refuses to unstage a staging path
// whose mount has references elsewhere (GetDeviceMountRefs) — the volume would
// never be unstaged. Publishing straight from /pav/volume avoids that and one
// mount per volume.
package nodeserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
	"github.com/pods-as-volumes/pav/internal/hostmount"
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
	Namespace(op podrunner.Operation) string
}

// Server implements csi.NodeServer.
type Server struct {
	csi.UnimplementedNodeServer

	NodeID   string
	StateDir string // host directory for per-volume state; must be the same path in and out of the plugin's container
	Source   provisioner.Source
	Eval     *phase.Evaluator
	Pods     PodRunner
	Client   kubernetes.Interface // nil: no Kubernetes (csi-sanity); contexts then lack pv, pvc and node
	PVs      pvindex.Lookup       // nil without Kubernetes

	busy inflight.Set
}

// staged is what NodeStageVolume leaves for NodeUnstageVolume, which gets
// neither the volume context nor the capability.
type staged struct {
	Handle     string                              `json:"handle"`
	VolumeMode corev1.PersistentVolumeMode         `json:"volumeMode"`
	Access     []corev1.PersistentVolumeAccessMode `json:"accessModes"`
	Capacity   int64                               `json:"capacity"`
	Params     map[string]string                   `json:"params"`
	ReadOnly   bool                                `json:"readOnly"`
	PV         string                              `json:"pv,omitempty"`
	StagedAt   string                              `json:"stagingTargetPath"`
	// The pods pav runs for the volume on this node, recorded before each is
	// asked for: only a pod with the recorded UID (or, until it is known, the
	// recorded token) is ever adopted or deleted.
	ValidationPod *podID `json:"validationPod,omitempty"`
	StagingPod    *podID `json:"stagingPod,omitempty"`
	UnstagingPod  *podID `json:"unstagingPod,omitempty"`
	// Staged: the staging pod is done (or ready) and /pav/volume checked out.
	Staged bool `json:"staged"`
}

// podID is the identity of one pod pav runs: where it is, the token it
// carries, and its UID once known.
type podID struct {
	Namespace string    `json:"namespace"`
	Token     string    `json:"token"`
	UID       types.UID `json:"uid,omitempty"`
}

// withID returns op carrying id's identity.
func withID(op podrunner.Operation, id *podID) podrunner.Operation {
	op.Token, op.UID = id.Token, id.UID
	if op.Template.Namespace == "" {
		op.Template.Namespace = id.Namespace
	}
	return op
}

// runPod runs op's pod under the identity recorded in *slot, recording a fresh
// one in state.json first if there is none, and the pod's UID as soon as it is
// known. A pod deleted before it finished has its identity dropped, so that
// the retry runs a new pod with a new token.
func (s *Server) runPod(ctx context.Context, dir string, st *staged, slot **podID, op podrunner.Operation) (*podrunner.Result, error) {
	if *slot == nil {
		*slot = &podID{Namespace: s.Pods.Namespace(op), Token: podrunner.NewToken()}
		if err := os.MkdirAll(filepath.Join(dir, "pav"), 0o750); err != nil {
			return nil, err
		}
		if err := writeState(dir, st); err != nil {
			return nil, err
		}
	}
	id := *slot
	op = withID(op, id)
	op.Created = func(_ context.Context, uid types.UID) error {
		id.UID = uid
		return writeState(dir, st)
	}
	res, err := s.Pods.Run(ctx, op)
	if errors.Is(err, podrunner.ErrPodDeleted) {
		*slot = nil
		if werr := writeState(dir, st); werr != nil {
			return nil, fmt.Errorf("%w (and recording it: %v)", err, werr)
		}
	}
	return res, err
}

// removePod deletes the pod recorded in *slot (never a pod pav did not
// create) and then drops its identity.
func (s *Server) removePod(ctx context.Context, dir string, st *staged, slot **podID, op podrunner.Operation) error {
	if *slot == nil {
		return nil
	}
	if err := s.Pods.Delete(ctx, withID(op, *slot)); err != nil {
		return fmt.Errorf("removing the %s pod: %w", op.Phase, err)
	}
	*slot = nil
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		return nil
	}
	return writeState(dir, st)
}

const podVolume = podrunner.MountPath + "/volume"

// volumeDir is the per-volume directory on this node: state.json and pav/ (the
// /pav of the staging and unstaging pods). Hashing the handle keeps arbitrary
// handles (slashes, length) out of path names.
func (s *Server) volumeDir(handle string) string { return VolumeDir(s.StateDir, handle) }

// VolumeDir is the per-volume directory of handle under a node's state directory.
func VolumeDir(stateDir, handle string) string {
	sum := sha256.Sum256([]byte(handle))
	return filepath.Join(stateDir, hex.EncodeToString(sum[:12]))
}

// PodOperation is the operation whose pod the node plugin nodeID runs for phase
// ph of the volume handle: staging and unstaging pods get the volume's
// directory under stateDir at /pav (and a staging pod may keep running); a
// static validation pod runs on the node with an emptyDir. The volume key
// (handle@node: the same handle staged on two nodes has two staging pods)
// decides the pod's name. `pav render` builds its pods here too, so it shows
// the names and paths the driver uses.
func PodOperation(nodeID, stateDir, provisioner string, ph v1alpha1.Phase, handle string, t corev1.PodTemplateSpec) podrunner.Operation {
	op := podrunner.Operation{Provisioner: provisioner, Phase: ph, VolumeKey: handle + "@" + nodeID, Template: t, NodeName: nodeID}
	if ph == v1alpha1.PhaseStaging || ph == v1alpha1.PhaseUnstaging {
		op.HostPath = filepath.Join(VolumeDir(stateDir, handle), "pav")
		op.KeepRunning = ph == v1alpha1.PhaseStaging
	}
	return op
}

// podOperation is PodOperation on this node.
func (s *Server) podOperation(provisioner string, ph v1alpha1.Phase, handle string, t corev1.PodTemplateSpec) podrunner.Operation {
	return PodOperation(s.NodeID, s.StateDir, provisioner, ph, handle, t)
}

func (s *Server) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: s.NodeID}, nil
}

func (s *Server) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, c := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: c}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeGetVolumeStats reports a published volume's usage, so that kubelet's
// kubelet_volume_stats_* metrics cover pav volumes: bytes and inodes of a file
// system, the size of a block device.
func (s *Server) NodeGetVolumeStats(_ context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetVolumePath() == "":
		return nil, status.Error(codes.InvalidArgument, "volume path is required")
	}
	fi, err := os.Stat(req.GetVolumePath())
	if os.IsNotExist(err) {
		return nil, status.Errorf(codes.NotFound, "volume path %s does not exist", req.GetVolumePath())
	} else if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if mounted, err := hostmount.IsMountPoint(req.GetVolumePath()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if !mounted {
		return nil, status.Errorf(codes.NotFound, "volume %s is not published at %s", req.GetVolumeId(), req.GetVolumePath())
	}
	if !fi.IsDir() {
		size, err := hostmount.BlockSize(req.GetVolumePath())
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	u, err := hostmount.Usage(req.GetVolumePath())
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: u.Bytes, Available: u.BytesFree, Used: u.Bytes - u.BytesFree},
		{Unit: csi.VolumeUsage_INODES, Total: u.Inodes, Available: u.InodesFree, Used: u.Inodes - u.InodesFree},
	}}, nil
}

// NodeStageVolume makes the volume available at the staging path by running the
// staging pod on this node.
func (s *Server) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	handle, target := req.GetVolumeId(), req.GetStagingTargetPath()
	switch {
	case handle == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case target == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	}
	mode, err := csimode.VolumeMode(req.GetVolumeCapability())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	accessMode, err := csimode.KubeAccessMode(req.GetVolumeCapability().GetAccessMode().GetMode())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	p, err := s.Source.Get(true)
	if err != nil {
		return nil, err
	}
	release, ok := s.busy.TryAcquire(handle)
	if !ok {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", handle)
	}
	defer release()

	dir := s.volumeDir(handle)
	if done, err := s.alreadyStaged(dir, target, mode); done || err != nil {
		return &csi.NodeStageVolumeResponse{}, err
	}
	prev, err := readState(dir)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}

	st := &staged{Handle: handle, VolumeMode: mode, Access: []corev1.PersistentVolumeAccessMode{accessMode},
		Params: volume.UserParams(req.GetVolumeContext()), StagedAt: target,
		ReadOnly: csimode.IsReadOnly(req.GetVolumeCapability())}
	if prev != nil {
		// A retry of a staging that did not finish: its pods are the ones recorded.
		st.ValidationPod, st.StagingPod, st.UnstagingPod = prev.ValidationPod, prev.StagingPod, prev.UnstagingPod
	}
	capacity, dynamic, err := volume.ParseContext(req.GetVolumeContext())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	st.Capacity = capacity
	objs, err := s.objects(ctx, handle, st)
	if err != nil {
		return nil, err
	}
	if !dynamic {
		if err := s.validateStatic(ctx, p, st, objs, dir); err != nil {
			return nil, err
		}
	}
	vars, err := phase.StagingVars(st.vars(), objs)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	cfg, err := s.Eval.Staging(ctx, p, vars)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	op := s.podOperation(p.Name, v1alpha1.PhaseStaging, handle, *cfg.PodTemplate)
	// The state (with the staging pod's identity) goes down before the pod
	// starts: kubelet calls NodeUnstageVolume for a staging whose outcome it
	// does not know (a timed-out call), and that call must find the pod and
	// the directory.
	res, err := s.runPod(ctx, dir, st, &st.StagingPod, op)
	if err != nil {
		var pf *podrunner.PodFailure
		if errors.As(err, &pf) {
			err = s.revertStaging(ctx, p, st, objs, dir, fmt.Errorf("volume staging failed: %w", err))
		}
		return nil, grpcerr.Status(err)
	}
	if _, err := checkVolume(dir, st); err != nil {
		return nil, grpcerr.Status(s.revertStaging(ctx, p, st, objs, dir, grpcerr.WithCode(codes.Internal, err)))
	}
	st.Staged = true
	if err := writeState(dir, st); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if !res.Running {
		// A staging pod that completed has nothing more to do; NodeUnstage
		// would remove it anyway, by the identity recorded.
		if err := s.removePod(ctx, dir, st, &st.StagingPod, op); err != nil {
			klog.FromContext(ctx).Error(err, "Could not remove the completed staging pod; unstaging will", "handle", handle)
		}
	}
	klog.V(2).InfoS("volume staged", "handle", handle, "stagingTargetPath", target, "mode", mode)
	return &csi.NodeStageVolumeResponse{}, nil
}

// alreadyStaged makes a repeated NodeStageVolume succeed without a second pod.
func (s *Server) alreadyStaged(dir, target string, mode corev1.PersistentVolumeMode) (bool, error) {
	st, err := readState(dir)
	if err != nil || st == nil || !st.Staged {
		return false, err
	}
	if st.StagedAt != target {
		return false, status.Errorf(codes.FailedPrecondition, "volume %s is already staged at %s", st.Handle, st.StagedAt)
	}
	if st.VolumeMode != mode {
		return false, status.Errorf(codes.AlreadyExists, "volume %s is staged as a %s volume", st.Handle, st.VolumeMode)
	}
	return true, nil
}

// checkVolume resolves /pav/volume on the host and checks it is what the volume
// mode needs: a directory, or a block device of exactly the volume's size.
func checkVolume(dir string, st *staged) (string, error) {
	src, err := hostmount.Resolve(filepath.Join(dir, "pav"), podrunner.MountPath, podVolume)
	if err != nil {
		return "", fmt.Errorf("the staging pod did not provide /pav/volume: %w", err)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return "", fmt.Errorf("the staging pod did not provide /pav/volume: %w", err)
	}
	if st.VolumeMode == corev1.PersistentVolumeBlock {
		if fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
			return "", fmt.Errorf("/pav/volume must be a block special file for a Block volume, found %s", describeMode(fi.Mode()))
		}
		size, err := hostmount.BlockSize(src)
		if err != nil {
			return "", err
		}
		if st.Capacity > 0 && size != st.Capacity {
			return "", fmt.Errorf("/pav/volume is a block device of %d bytes, but the volume's capacity is %d bytes", size, st.Capacity)
		}
		return src, nil
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("/pav/volume must be a directory for a Filesystem volume, found %s", describeMode(fi.Mode()))
	}
	return src, nil
}

// revertStaging stops the staging pod, runs the unstaging pod on the same
// directory, and returns cause (plus what failed in reverting).
func (s *Server) revertStaging(ctx context.Context, p *v1alpha1.PavProvisioner, st *staged, objs phase.Objects, dir string, cause error) error {
	if err := s.unstage(ctx, p, st, objs, dir); err != nil {
		klog.ErrorS(err, "unstaging after a failed staging failed too", "handle", st.Handle)
		return &grpcerr.RevertError{Cause: cause, Err: fmt.Errorf("unstaging: %w", err)}
	}
	return cause
}

// unstage removes the staging pod, runs the unstaging pod (if any) on the same
// /pav directory, and only then detaches leftover mounts and removes the
// directory: a failed unstaging keeps the directory for the retry.
func (s *Server) unstage(ctx context.Context, p *v1alpha1.PavProvisioner, st *staged, objs phase.Objects, dir string) error {
	began := st.StagingPod != nil || st.Staged || st.UnstagingPod != nil
	if err := s.removePod(ctx, dir, st, &st.ValidationPod, s.podOperation(p.Name, v1alpha1.PhaseValidation, st.Handle, corev1.PodTemplateSpec{})); err != nil {
		return err
	}
	if err := s.removePod(ctx, dir, st, &st.StagingPod, s.podOperation(p.Name, v1alpha1.PhaseStaging, st.Handle, corev1.PodTemplateSpec{})); err != nil {
		return err
	}
	// Only a staging that began has something for the unstaging pod to undo.
	if began {
		vars, err := phase.StagingVars(st.vars(), objs)
		if err != nil {
			return err
		}
		cfg, err := s.Eval.Unstaging(ctx, p, vars)
		if err != nil {
			return err
		}
		if cfg.PodTemplate != nil {
			op := s.podOperation(p.Name, v1alpha1.PhaseUnstaging, st.Handle, *cfg.PodTemplate)
			_, err := s.runPod(ctx, dir, st, &st.UnstagingPod, op)
			var pf *podrunner.PodFailure
			if errors.As(err, &pf) {
				// The retry runs the unstaging pod again: remove this one.
				if derr := s.removePod(ctx, dir, st, &st.UnstagingPod, op); derr != nil {
					klog.FromContext(ctx).Error(derr, "Could not remove the failed unstaging pod", "handle", st.Handle)
				}
			}
			if err != nil {
				return fmt.Errorf("volume unstaging failed: %w", err)
			}
			if err := s.removePod(ctx, dir, st, &st.UnstagingPod, op); err != nil {
				return err
			}
		}
	}
	if err := hostmount.UnmountAll(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// NodeUnstageVolume undoes NodeStageVolume. An unknown volume is already unstaged.
func (s *Server) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	handle, target := req.GetVolumeId(), req.GetStagingTargetPath()
	switch {
	case handle == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case target == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	}
	release, ok := s.busy.TryAcquire(handle)
	if !ok {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", handle)
	}
	defer release()

	dir := s.volumeDir(handle)
	st, err := readState(dir)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if st == nil {
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	p, err := s.Source.Get(false)
	if err != nil {
		return nil, err
	}
	objs, err := s.objects(ctx, handle, st)
	if err != nil {
		return nil, err
	}
	if err := s.unstage(ctx, p, st, objs, dir); err != nil {
		return nil, grpcerr.Status(err)
	}
	klog.V(2).InfoS("volume unstaged", "handle", handle)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staged volume at the target path: a
// directory for Filesystem volumes, a file for Block volumes.
func (s *Server) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	staging, target := req.GetStagingTargetPath(), req.GetTargetPath()
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case staging == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path is required (pav stages volumes)")
	case target == "":
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	mode, err := csimode.VolumeMode(req.GetVolumeCapability())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	dir := s.volumeDir(req.GetVolumeId())
	st, err := readState(dir)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if st == nil || !st.Staged || st.StagedAt != staging {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", req.GetVolumeId(), staging)
	}
	if st.VolumeMode != mode {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s was staged as a %s volume", req.GetVolumeId(), st.VolumeMode)
	}
	// Resolved again: the staging pod may have replaced /pav/volume since.
	src, err := checkVolume(dir, st)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if mounted, err := hostmount.IsMountPoint(target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if mounted {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if mode == corev1.PersistentVolumeBlock {
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if err := touch(target); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	} else if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	readOnly := req.GetReadonly() || csimode.IsReadOnly(req.GetVolumeCapability())
	if err := hostmount.Bind(src, target, readOnly); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume unmounts and removes the target path.
func (s *Server) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	if err := hostmount.Unmount(req.GetTargetPath()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := os.Remove(req.GetTargetPath()); err != nil && !os.IsNotExist(err) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// objects reads the PV (by handle), its bound PVC and this Node for the
// templates, and fills what the volume context cannot give.
func (s *Server) objects(ctx context.Context, handle string, st *staged) (phase.Objects, error) {
	var objs phase.Objects
	if s.Client == nil || s.PVs == nil {
		return objs, nil
	}
	pv, err := s.PVs.ByHandle(handle)
	if err != nil {
		return objs, status.Error(codes.Internal, err.Error())
	}
	if pv != nil {
		objs.PV = pv
		st.PV = pv.Name
		if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
			st.Capacity = q.Value()
		}
		if pv.Spec.CSI != nil && pv.Spec.CSI.ReadOnly {
			st.ReadOnly = true
		}
		if ref := pv.Spec.ClaimRef; ref != nil {
			pvc, err := s.Client.CoreV1().PersistentVolumeClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			switch {
			case err == nil && pvc.UID == ref.UID:
				objs.PVC = pvc
				st.Access = pvc.Spec.AccessModes
			case err != nil && !apierrors.IsNotFound(err):
				return objs, grpcerr.Status(fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", ref.Namespace, ref.Name, err))
			}
		}
	}
	node, err := s.Client.CoreV1().Nodes().Get(ctx, s.NodeID, metav1.GetOptions{})
	if err != nil {
		return objs, grpcerr.Status(fmt.Errorf("reading Node %s: %w", s.NodeID, err))
	}
	objs.Node = node
	return objs, nil
}

// validateStatic runs spec.volumeValidation for a statically provisioned PV
// before its first staging (PaV documented this but never ran it).
func (s *Server) validateStatic(ctx context.Context, p *v1alpha1.PavProvisioner, st *staged, objs phase.Objects, dir string) error {
	if !p.Spec.HasMode(v1alpha1.Static) {
		return status.Errorf(codes.FailedPrecondition, "PavProvisioner %q does not allow static provisioning: add Static to spec.provisioningModes, or provision through a StorageClass", p.Name)
	}
	if objs.PV == nil && s.PVs != nil {
		return status.Errorf(codes.NotFound, "no PersistentVolume of driver %s has volume handle %q", p.Name, st.Handle)
	}
	capacity := st.Capacity
	r := phase.Request{VolumeMode: st.VolumeMode, AccessModes: st.Access, MinCapacity: capacity, MaxCapacity: &capacity, Params: st.Params}
	if objs.PV != nil {
		r.AccessModes = objs.PV.Spec.AccessModes
	}
	vars, err := phase.ValidationVars(r, phase.Objects{PV: objs.PV, PVC: objs.PVC}, st.Handle)
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
	op := s.podOperation(p.Name, v1alpha1.PhaseValidation, st.Handle, *cfg.PodTemplate)
	_, err = s.runPod(ctx, dir, st, &st.ValidationPod, op)
	var pf *podrunner.PodFailure
	if err != nil && !errors.As(err, &pf) {
		return grpcerr.Status(fmt.Errorf("static volume validation: %w", err))
	}
	// The outcome is in hand: the pod goes.
	if derr := s.removePod(ctx, dir, st, &st.ValidationPod, op); derr != nil {
		return grpcerr.Status(derr)
	}
	if err != nil {
		if st.StagingPod == nil && st.UnstagingPod == nil {
			// Nothing else was made for the volume on this node.
			if rerr := os.RemoveAll(dir); rerr != nil {
				return status.Error(codes.Internal, rerr.Error())
			}
		}
		return grpcerr.Status(fmt.Errorf("static volume validation failed: %w", err))
	}
	return nil
}

func (st *staged) vars() phase.Staged {
	return phase.Staged{VolumeMode: st.VolumeMode, AccessModes: st.Access, Capacity: st.Capacity,
		Params: st.Params, Handle: st.Handle, ReadOnly: st.ReadOnly}
}

func writeState(dir string, st *staged) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "state.json"))
}

func readState(dir string) (*staged, error) {
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	st := &staged{}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("%s/state.json: %w", dir, err)
	}
	return st, nil
}

func touch(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

func describeMode(m os.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m&os.ModeDevice != 0:
		return "a device"
	case m&os.ModeSymlink != 0:
		return "a symbolic link"
	}
	return m.Type().String()
}
