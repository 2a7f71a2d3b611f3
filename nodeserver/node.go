// Package nodeserver is the CSI Node service of pav. NodeStageVolume runs the
// provisioner's staging pod on this node with a per-volume host directory at
// /pav and checks the /pav/volume it exposes; NodeUnstageVolume stops that pod
// and runs the unstaging pod on the same directory. NodePublish/Unpublish
// bind-mount /pav/volume into pods. NodeExpandVolume runs the node expansion
// pod on that directory too (expand.go).
//
// Nothing is mounted at the staging path: when /pav/volume is itself a mount
// (a tmpfs, a FUSE file system), a bind of it at the staging path would be a
// second reference to that mount, and kubelet refuses to unstage a staging path
// whose mount has references elsewhere (GetDeviceMountRefs) — the volume would
// never be unstaged. Publishing straight from /pav/volume avoids that and one
// mount per volume.
//
// # Staging verifies itself
//
// state.json (state.go) records, besides what unstaging needs, the node's boot
// ID, the staging pod's identity and whether it keeps running, and what
// /pav/volume resolved to (hostmount.Identity). Before a staged volume is
// trusted (NodeStage, NodePublish, NodeGetVolumeStats) verify checks all
// three: a reboot, a KeepRunning staging pod that ended, or a /pav/volume that
// is a bare directory where a mount was, or a device node whose device was
// detached or given to another volume, makes the staging stale. A stale
// staging is cleaned up (the unstaging pod runs first, unless the node
// rebooted) and staged afresh, in NodePublishVolume too, since kubelet does not
// call NodeStage again for a volume its pods still use. The runner's pod events
// tell at once when a KeepRunning staging pod ends (a Warning event on the
// PVC); NodeGetVolumeStats reports the volume's condition.
//
// # Errors
//
// Every error goes through internal/grpcerr. kubelet never calls
// NodeUnstageVolume after a final NodeStageVolume error, so NodeStage only
// returns a final code once nothing of the staging is left on the node
// (stageFailed).
//
// # API cost
//
// A staging reads the volume's PV (by the name in its volume context), its PVC
// and this Node, and creates the staging pod (and removes it if it completes);
// an unstaging reads nothing (the context is in state.json) and removes the
// staging pod, creates the unstaging pod and removes it. The watches are the
// runner's, on this node's pav pods of this provisioner, and StageAhead's, on
// the pods bound to this node (trimmed to their claims), which reads a
// Pending pod's claims and their PVs once: nothing the node plugin holds or
// reads grows with the cluster (see lookup).
//
// # Staging ahead
//
// The kubelet's NodeStageVolume comes about 0.3 s after a pod is bound to the
// node; the node plugin starts the same staging when the pod is bound, and the
// kubelet's call waits for it and adopts it (ahead.go).
package nodeserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/csimode"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/internal/inflight"
	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/provisioner"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/podrunner"
)

// PodRunner runs and removes phase pods (podrunner.Runner).
type PodRunner interface {
	Run(ctx context.Context, op podrunner.Operation) (*podrunner.Result, error)
	Delete(ctx context.Context, op podrunner.Operation) error
	// Discard asks for the pod's deletion without waiting for it to go.
	Discard(ctx context.Context, op podrunner.Operation) error
	Namespace(op podrunner.Operation) string
	// Cached is the runner's informer cache of this node's pav pods.
	Cached(namespace, name string) (*corev1.Pod, error)
}

// Server implements csi.NodeServer.
type Server struct {
	csi.UnimplementedNodeServer

	NodeID   string
	StateDir string // host directory for per-volume state; must be the same path in and out of the plugin's container
	Source   provisioner.Source
	Eval     *phase.Evaluator
	Pods     PodRunner
	Client   kube.Interface // nil: no Kubernetes (csi-sanity); contexts then lack pv, pvc and node
	// Inline creates and deletes this node's inline ephemeral volumes
	// (inline.go); nil: none (no Kubernetes API to keep their records).
	Inline InlineVolumes
	// Recorder gets the events about volumes (on their PVC); nil = logs only.
	Recorder record.EventRecorder
	// BootID is the node's boot ID; "" = the kernel's (tests simulate a reboot
	// by changing it).
	BootID string
	// ForgottenGrace is how long a staging no pod uses must have been left
	// alone by the kubelet before the node plugin unstages it itself, the
	// kubelet having forgotten it (forgotten.go); 0: never. WatchNode
	// starts the checks.
	ForgottenGrace time.Duration
	// Clock is the time (tests); nil: time.Now.
	Clock func() time.Time
	// Mounts and Unmount stand for the node's mount table and unmounts
	// (tests); nil: hostmount's.
	Mounts  func() ([]hostmount.Mount, error)
	Unmount func(path string) error

	busy     inflight.Set
	bootOnce sync.Once
	bootErr  error

	// For UnstageForgotten: when its checks began, and when the kubelet last
	// called for each volume (handle → time.Time).
	watchedSince time.Time
	touched      sync.Map
	// For ReleaseStaleSubPaths: the subPath mounts being stat'ed (path → true).
	statting sync.Map

	// For StageAhead (ahead.go): this node's pods (indexed by claim), the
	// pods already looked at (UID → true) and the claims whose volume was
	// staged ahead (claim → handle). A staging ahead under way holds its
	// volume in busy as a waitable operation.
	pods        cache.Indexer
	aheadPods   sync.Map
	aheadClaims sync.Map
}

// runPod runs op's pod under the identity recorded in *slot, recording a fresh
// one in state.json first if there is none, and the pod's UID as soon as it is
// known. A pod deleted before it finished has its identity dropped, so that
// the retry runs a new pod with a new token.
func (s *Server) runPod(ctx context.Context, dir string, st *staged, slot **podID, op podrunner.Operation) (*podrunner.Result, error) {
	if *slot == nil {
		*slot = &podID{Namespace: s.Pods.Namespace(op), Name: op.PodName(), Token: podrunner.NewToken()}
		if err := os.MkdirAll(filepath.Join(dir, "pav"), 0o750); err != nil {
			return nil, err
		}
		if op.HostPath != "" {
			// A new pod under a new token: its outcome must be read from its
			// own files, not from those the pods before it (staging, an
			// earlier attempt) left in the same /pav. A retry that adopts the
			// recorded pod comes with *slot set and keeps them.
			if err := podrunner.ClearHostReport(op.HostPath); err != nil {
				*slot = nil
				return nil, err
			}
		}
		if err := writeState(dir, st); err != nil {
			return nil, err
		}
	}
	id := *slot
	op = withID(op, id)
	op.Created = func(_ context.Context, uid types.UID) error {
		id.UID = uid
		if op.Phase == v1alpha1.PhaseStaging {
			st.Began = true
		}
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
	if id := *slot; id.Deleting && id.UID != "" {
		// Discarded: the informer, which had it, is the judge of its end.
		if p, err := s.Pods.Cached(id.Namespace, id.Name); err == nil && (p == nil || p.UID != id.UID) {
			return s.dropPod(dir, st, slot)
		}
	}
	if err := s.Pods.Delete(ctx, withID(op, *slot)); err != nil {
		return fmt.Errorf("removing the %s pod %s: %w", op.Phase, *slot, err)
	}
	return s.dropPod(dir, st, slot)
}

// discardPod asks for the deletion of the pod recorded in *slot, whose
// command has ended, without waiting for it to go: the kubelet may not even
// have published its end yet, and then removes it on a graceful deletion's
// round trip. Its identity stays recorded (Deleting) until removePod finds
// it gone, so that no pod of its name is created before.
func (s *Server) discardPod(ctx context.Context, dir string, st *staged, slot **podID, op podrunner.Operation) error {
	if *slot == nil {
		return nil
	}
	if err := s.Pods.Discard(ctx, withID(op, *slot)); err != nil {
		return fmt.Errorf("removing the %s pod %s: %w", op.Phase, *slot, err)
	}
	(*slot).Deleting = true
	return writeState(dir, st)
}

// dropPod forgets the pod recorded in *slot, which is gone.
func (s *Server) dropPod(dir string, st *staged, slot **podID) error {
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
// ph of the volume handle: staging, unstaging and node expansion pods get the
// volume's directory under stateDir at /pav (and a staging pod may keep
// running); a
// static validation pod runs on the node with an emptyDir. The volume key
// (handle@node: the same handle staged on two nodes has two staging pods)
// decides the pod's name. `pav render` builds its pods here too, so it shows
// the names and paths the driver uses.
func PodOperation(nodeID, stateDir, provisioner string, ph v1alpha1.Phase, handle string, t corev1.PodTemplateSpec) podrunner.Operation {
	op := podrunner.Operation{Provisioner: provisioner, Phase: ph, VolumeKey: podrunner.NodeVolumeKey(handle, nodeID), Template: t, NodeName: nodeID}
	if ph == v1alpha1.PhaseStaging || ph == v1alpha1.PhaseUnstaging || ph == v1alpha1.PhaseNodeExpansion {
		op.HostPath = filepath.Join(VolumeDir(stateDir, handle), "pav")
		op.KeepRunning = ph == v1alpha1.PhaseStaging
	}
	return op
}

// podOperation is PodOperation on this node.
func (s *Server) podOperation(provisioner string, ph v1alpha1.Phase, handle string, t corev1.PodTemplateSpec) podrunner.Operation {
	return PodOperation(s.NodeID, s.StateDir, provisioner, ph, handle, t)
}

// NodeGetInfo names the node and, for a provisioner with spec.topology, its
// topology segment (topology.go), and with spec.maxVolumesPerNode the most
// volumes of the provisioner the node takes: the kubelet puts it in the
// node's CSINode (allocatable.count), and the scheduler places no pod that
// would bring the node's volumes of the driver above it. The kubelet reads
// it when the node plugin registers: the manager restarts the node plugins
// when it changes.
func (s *Server) NodeGetInfo(ctx context.Context, _ *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	seg, err := s.segment(ctx)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	resp := &csi.NodeGetInfoResponse{NodeId: s.NodeID}
	if seg != nil {
		resp.AccessibleTopology = &csi.Topology{Segments: seg}
	}
	// The spec in force, as segment reads it (the same checks passed there).
	p, err := s.Source.Get(false)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, grpcerr.Status(grpcerr.WithCode(codes.FailedPrecondition, err))
	}
	// 0 (no spec.maxVolumesPerNode) is CSI's "no limit".
	resp.MaxVolumesPerNode = f.MaxVolumesPerNode
	return resp, nil
}

// NodeGetCapabilities advertises staging, stats and health, and EXPAND_VOLUME
// when the current spec has volumeNodeExpansion.
func (s *Server) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	rpcs := []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		capVolumeCondition,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
	}
	if s.Source != nil {
		f, err := s.features()
		if err != nil {
			return nil, grpcerr.Status(err)
		}
		if f.NodeExpansion {
			rpcs = append(rpcs, csi.NodeServiceCapability_RPC_EXPAND_VOLUME)
		}
	}
	var caps []*csi.NodeServiceCapability
	for _, c := range rpcs {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: c}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// capVolumeCondition is VOLUME_CONDITION (4), the capability by which kubelet
// (up to 1.36 at least, which speaks CSI 1.9) knows to read the volume
// condition that NodeGetVolumeStats returns. CSI 1.13, which pav compiles
// against, removed it (and reserved the response's field 2) in favour of
// GET_VOLUME_HEALTH and NodeGetVolumeHealth, which no kubelet calls yet: pav
// speaks both.
const capVolumeCondition = csi.NodeServiceCapability_RPC_Type(4)

// NodeGetVolumeStats reports a published volume's usage, so that kubelet's
// kubelet_volume_stats_* metrics cover pav volumes (bytes and inodes of a
// file system, the size of a block device), and its condition: abnormal, with
// the reason, when its staging no longer holds on this node (its KeepRunning
// staging pod ended, the node rebooted, /pav/volume is no longer what staging
// made), so that kubelet with the CSIVolumeHealth feature gate puts a
// VolumeConditionAbnormal event on the pods using it.
func (s *Server) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
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
	why, err := s.healthOf(ctx, req.GetVolumeId())
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	resp := &csi.NodeGetVolumeStatsResponse{}
	if !fi.IsDir() {
		size, err := hostmount.BlockSize(req.GetVolumePath())
		if err == nil {
			resp.Usage = []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}
		} else if why == "" {
			return nil, status.Error(codes.Internal, err.Error())
		}
	} else if u, err := hostmount.Usage(req.GetVolumePath()); err == nil {
		resp.Usage = []*csi.VolumeUsage{
			{Unit: csi.VolumeUsage_BYTES, Total: u.Bytes, Available: u.BytesFree, Used: u.Bytes - u.BytesFree},
			{Unit: csi.VolumeUsage_INODES, Total: u.Inodes, Available: u.InodesFree, Used: u.Inodes - u.InodesFree},
		}
	} else if why == "" {
		// A dead FUSE daemon fails statfs: the condition says why.
		return nil, status.Error(codes.Internal, err.Error())
	}
	setVolumeCondition(resp, why != "", why)
	return resp, nil
}

// setVolumeCondition puts a VolumeCondition {abnormal = 1; message = 2} in
// field 2 of a NodeGetVolumeStatsResponse, as CSI 1.9 (which kubelet speaks)
// defines it: CSI 1.13's Go types no longer have the field, so it goes in as
// wire bytes, which kubelet decodes as the field it knows.
func setVolumeCondition(resp *csi.NodeGetVolumeStatsResponse, abnormal bool, message string) {
	var cond []byte
	cond = protowire.AppendTag(cond, 1, protowire.VarintType)
	cond = protowire.AppendVarint(cond, protowire.EncodeBool(abnormal))
	if message != "" {
		cond = protowire.AppendTag(cond, 2, protowire.BytesType)
		cond = protowire.AppendString(cond, message)
	}
	var field []byte
	field = protowire.AppendTag(field, 2, protowire.BytesType)
	field = protowire.AppendBytes(field, cond)
	resp.ProtoReflect().SetUnknown(field)
}

// NodeGetVolumeHealth (CSI 1.13) reports what NodeGetVolumeStats' condition
// says: INACCESSIBLE from this node, with the reason, when the volume's
// staging no longer holds here.
func (s *Server) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	why, err := s.healthOf(ctx, req.GetVolumeId())
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	h := &csi.VolumeHealth{VolumeId: req.GetVolumeId()}
	if why != "" {
		h.HealthStatuses = []*csi.VolumeHealth_VolumeHealthEntry{{
			Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "StagingLost", Message: why,
		}}
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// stageRequest is what staging a volume needs, from NodeStageVolume or, to
// stage a lost staging again, from NodePublishVolume.
type stageRequest struct {
	handle, target string
	mode           corev1.PersistentVolumeMode
	access         corev1.PersistentVolumeAccessMode
	readOnly       bool
	volumeContext  map[string]string
	// inline: an inline ephemeral volume, created already (inline.go): its
	// capacity and pod; it has no PV, claim or static validation.
	inline *inlineStage
	// ahead: staged by the node plugin ahead of the kubelet (ahead.go), not
	// by a CSI call; read: the objects of the staging context it read
	// already (the PV and the claim, and the Node if it needed it).
	ahead bool
	read  phase.Objects
}

// inlineStage is what staging an inline volume takes from its creation.
type inlineStage struct {
	capacity int64
	pod      v1alpha1.EphemeralPod
}

func newStageRequest(handle, target string, c *csi.VolumeCapability, vc map[string]string) (stageRequest, error) {
	r := stageRequest{handle: handle, target: target, volumeContext: vc, readOnly: csimode.IsReadOnly(c)}
	var err error
	if r.mode, err = csimode.VolumeMode(c); err != nil {
		return r, status.Error(codes.InvalidArgument, err.Error())
	}
	if r.access, err = csimode.KubeAccessMode(c.GetAccessMode().GetMode()); err != nil {
		return r, status.Error(codes.InvalidArgument, err.Error())
	}
	return r, nil
}

// NodeStageVolume makes the volume available on this node by running the
// staging pod with the volume's directory at /pav. A volume already staged is
// checked first (verify): a staging that no longer holds (the node rebooted,
// the KeepRunning staging pod ended, /pav/volume is not what staging made) is
// cleaned up and staged afresh, never trusted because state.json says so.
func (s *Server) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	handle, target := req.GetVolumeId(), req.GetStagingTargetPath()
	switch {
	case handle == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case target == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	}
	s.touch(handle) // before the volume is taken: see forgotten.go
	r, err := newStageRequest(handle, target, req.GetVolumeCapability(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	p, err := s.Source.Get(true)
	if err != nil {
		return nil, err
	}
	release, ok := s.busy.TryAcquire(handle)
	if !ok {
		// A staging made ahead of this call (ahead.go) is waited for, and
		// adopted below: the kubelet would retry only 0.5 s later.
		if waited, err := s.busy.Await(ctx, handle); err != nil {
			return nil, status.FromContextError(err).Err()
		} else if waited {
			release, ok = s.busy.TryAcquire(handle)
		}
		if !ok {
			return nil, status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", handle)
		}
	}
	defer release()

	dir := s.volumeDir(handle)
	if m, err := s.readMarker(handle); err != nil {
		return nil, grpcerr.Status(err)
	} else if m != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is an inline ephemeral volume of pod %s/%s on node %s: a persistent volume cannot have its handle", handle, m.Pod.Namespace, m.Pod.Name, s.NodeID)
	}
	// A request that contradicts the staging in place is refused as it is,
	// finally: it made nothing.
	if st, err := readState(dir); err != nil {
		return nil, grpcerr.Status(err)
	} else if st != nil && st.Staged {
		if st.StagedAt != target && !st.Ahead {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is already staged at %s", handle, st.StagedAt)
		}
		if st.VolumeMode != r.mode {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is staged as a %s volume", handle, st.VolumeMode)
		}
	}
	if err := s.stage(ctx, p, r); err != nil {
		return nil, s.stageFailed(dir, err)
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// stageFailed is the gRPC error of a failed staging. kubelet never calls
// NodeUnstageVolume after a final NodeStageVolume error (it then counts the
// volume as not staged), so a final code is only returned once nothing is
// left of the staging on this node; while anything is (the volume's directory
// with the recorded pods), the error becomes ABORTED, which kubelet treats as
// "uncertain": it retries NodeStage, and calls NodeUnstage when the pods go.
func (s *Server) stageFailed(dir string, err error) error {
	err = grpcerr.Status(err)
	st, _ := status.FromError(err)
	if !nonFinal(st.Code()) {
		if _, serr := os.Stat(dir); serr == nil {
			return status.Errorf(codes.Aborted, "%s (%s; pav keeps what this staging made on node %s until a retry succeeds or NodeUnstageVolume removes it)",
				st.Message(), st.Code(), s.NodeID)
		}
	}
	return err
}

// nonFinal are the codes after which kubelet keeps a staging "uncertain" (and
// external-provisioner keeps retrying): CANCELED, DEADLINE_EXCEEDED,
// UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED (see internal/grpcerr).
func nonFinal(c codes.Code) bool {
	switch c {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return true
	}
	return false
}

// stage stages a volume on this node, or checks that its staging still
// holds. The caller holds the volume's lock.
func (s *Server) stage(ctx context.Context, p *v1alpha1.PavProvisioner, r stageRequest) error {
	logger := klog.FromContext(ctx).WithValues("handle", r.handle)
	dir := s.volumeDir(r.handle)
	boot, err := s.boot()
	if err != nil {
		return err
	}
	prev, err := readState(dir)
	if err != nil {
		return err
	}
	restaged := ""
	if prev != nil {
		rebooted := prev.BootID != "" && prev.BootID != boot
		switch {
		case prev.Staged:
			why, err := s.verify(dir, prev)
			if err != nil {
				return err
			}
			if why == "" {
				if prev.Ahead && !r.ahead {
					// The kubelet's call adopts a staging made ahead of it:
					// its path, and its unstaging, are the kubelet's now.
					prev.Ahead, prev.StagedAt = false, r.target
					return writeState(dir, prev)
				}
				return nil
			}
			s.eventf(prev, corev1.EventTypeWarning, ReasonStagingLost, "Volume %s must be staged again on node %s: %s", r.handle, s.NodeID, why)
			if err := s.discard(ctx, p, prev, dir, rebooted); err != nil {
				return err
			}
			prev, restaged = nil, why
		case rebooted:
			// A staging (or unstaging) under way when the node went down:
			// whatever its pods did is gone with the boot.
			logger.Info("The node rebooted during the volume's staging; starting over", "stagedUnder", prev.BootID)
			if err := s.discard(ctx, p, prev, dir, rebooted); err != nil {
				return err
			}
			prev = nil
		}
	}

	st := &staged{Handle: r.handle, VolumeMode: r.mode, Access: []corev1.PersistentVolumeAccessMode{r.access},
		Params: volume.UserParams(r.volumeContext), StagedAt: r.target, ReadOnly: r.readOnly, BootID: boot, Ahead: r.ahead}
	if prev != nil && prev.Unstaging {
		// An unstaging was under way (the revert of a failed staging, the
		// clean-up of a lost one): finish it before staging again.
		if err := s.discard(ctx, p, prev, dir, prev.BootID != "" && prev.BootID != boot); err != nil {
			return err
		}
		prev = nil
	}
	if prev != nil {
		// A retry of a staging that did not finish: its pods are the ones recorded.
		st.ValidationPod, st.StagingPod, st.UnstagingPod, st.Began = prev.ValidationPod, prev.StagingPod, prev.UnstagingPod, prev.Began
	}
	var objs phase.Objects
	if r.inline != nil {
		// Its context: the pod, no PV or claim, this Node; no
		// VolumeAttributesClass (mutableParams {}).
		pod := r.inline.pod
		st.Capacity, st.Pod = r.inline.capacity, &pod
		if objs, err = s.nodeObjects(ctx); err != nil {
			return err
		}
		st.setObjects(objs)
	} else {
		capacity, dynamic, err := volume.ParseContext(r.volumeContext)
		if err != nil {
			return grpcerr.WithCode(codes.InvalidArgument, err)
		}
		st.Capacity = capacity
		if objs, err = s.contextObjects(ctx, p.Name, r); err != nil {
			return err
		}
		st.apply(objs)
		// Read at each staging: a restage sees the class the volume was
		// modified to since.
		if st.MutableParams, err = s.mutableParams(ctx, p.Name, objs.PV); err != nil {
			return err
		}
		if !dynamic {
			if err := s.validateStatic(ctx, p, st, objs, dir); err != nil {
				return err
			}
		}
	}
	vars, err := phase.StagingVars(st.vars(), objs)
	if err != nil {
		return err
	}
	cfg, err := s.Eval.Staging(ctx, p, vars)
	if err != nil {
		return err
	}
	op := s.podOperation(p.Name, v1alpha1.PhaseStaging, r.handle, *cfg.PodTemplate)
	// A completed staging pod is discarded, not waited for (below): its end
	// may be taken from its command's exit code.
	op.EndAtExit = true
	// The state (with the staging pod's identity) goes down before the pod
	// starts: kubelet calls NodeUnstageVolume for a staging whose outcome it
	// does not know (a timed-out call), and that call must find the pod and
	// the directory.
	res, err := s.runPod(ctx, dir, st, &st.StagingPod, op)
	switch {
	case errors.Is(err, podrunner.ErrForeignPod):
		// Our token never reached a pod: nothing of ours ran under it.
		st.StagingPod = nil
		return s.revertStaging(ctx, p, st, dir, err)
	case err != nil:
		if _, ok := podrunner.IsPodFailure(err); ok {
			return s.revertStaging(ctx, p, st, dir, fmt.Errorf("volume staging failed: %w", err))
		}
		return err
	}
	src, err := checkVolume(dir, st)
	if err == nil {
		var id hostmount.Identity
		if id, err = hostmount.Identify(src); err == nil {
			st.Volume = &id
		}
	}
	if err != nil {
		return s.revertStaging(ctx, p, st, dir, grpcerr.WithCode(codes.Internal, err))
	}
	st.Staged, st.KeepRunning = true, res.Running
	if err := writeState(dir, st); err != nil {
		return err
	}
	if !res.Running {
		// A staging pod that completed has nothing more to do; NodeUnstage
		// would remove it anyway, by the identity recorded. Its command has
		// ended, but its status may not say so yet (a wrapped command's exit
		// code is seen before the kubelet's relist): the client pod need not
		// wait for its removal.
		if err := s.discardPod(ctx, dir, st, &st.StagingPod, op); err != nil {
			logger.Error(err, "Could not remove the completed staging pod; unstaging will")
		}
	}
	if restaged != "" {
		s.eventf(st, corev1.EventTypeNormal, ReasonRestaged, "Volume %s staged again on node %s", r.handle, s.NodeID)
	}
	logger.V(2).Info("Volume staged", "stagingTargetPath", r.target, "mode", r.mode, "keepRunning", res.Running, "restaged", restaged != "")
	return nil
}

// discard removes a staging that no longer holds, so that the volume can be
// staged afresh: its pods go (by recorded identity), the unstaging pod runs
// to let the provider release what is left, unless the node rebooted since
// (nothing the staging set up survives a reboot, and an unstaging script that
// acts on device numbers saved before it could hit another volume's device),
// and the directory is unmounted and cleared.
func (s *Server) discard(ctx context.Context, p *v1alpha1.PavProvisioner, st *staged, dir string, rebooted bool) error {
	if err := s.unstage(ctx, p, st, dir, !rebooted); err != nil {
		return &grpcerr.RevertError{Cause: fmt.Errorf("the staging of volume %s on node %s no longer holds", st.Handle, s.NodeID),
			Err: fmt.Errorf("cleaning it up before staging it again: %w", err)}
	}
	return nil
}

// apply fills st from the objects of the staging context and snapshots them.
func (st *staged) apply(objs phase.Objects) {
	if pv := objs.PV; pv != nil {
		st.PV = pv.Name
		if q, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
			st.Capacity = q.Value()
		}
		if pv.Spec.CSI != nil && pv.Spec.CSI.ReadOnly {
			st.ReadOnly = true
		}
	}
	if objs.PVC != nil {
		st.Access = objs.PVC.Spec.AccessModes
	}
	st.setObjects(objs)
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
		if st.Capacity > 0 && size != st.Capacity && !st.growingTo(size) {
			return "", fmt.Errorf("/pav/volume is a block device of %d bytes, but the volume's capacity is %d bytes", size, st.Capacity)
		}
		return src, nil
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("/pav/volume must be a directory for a Filesystem volume, found %s", describeMode(fi.Mode()))
	}
	return src, nil
}

// revertStaging undoes a failed staging (unstage) and returns cause, or, if
// undoing it failed too, a RevertError: a non-final code, so that kubelet
// calls NodeUnstageVolume (or NodeStage again) and the revert is retried.
func (s *Server) revertStaging(ctx context.Context, p *v1alpha1.PavProvisioner, st *staged, dir string, cause error) error {
	if err := s.unstage(ctx, p, st, dir, true); err != nil {
		klog.FromContext(ctx).Error(err, "Unstaging after a failed staging failed too", "handle", st.Handle)
		return &grpcerr.RevertError{Cause: cause, Err: fmt.Errorf("unstaging: %w", err)}
	}
	return cause
}

// unstage removes the volume's pods on this node (by recorded identity),
// runs the unstaging pod (if any, if a staging pod ever ran, and if
// runUnstaging) on the same /pav directory, and only then detaches leftover
// mounts and removes the directory. Every step is recorded as it finishes, so
// a retry after a failure or a restart goes on where this one stopped; a
// failed unstaging pod keeps the directory for the retry.
func (s *Server) unstage(ctx context.Context, p *v1alpha1.PavProvisioner, st *staged, dir string, runUnstaging bool) error {
	// A staging pod may have run if one was ever recorded.
	began := st.Began || st.Staged || st.StagingPod != nil || st.UnstagingPod != nil
	if !st.Unstaging {
		// From here on the volume is not staged (its staging pod is going:
		// that is no loss to report), and a retry must finish this first.
		st.Staged, st.Unstaging, st.Began = false, true, began
		if _, err := os.Stat(dir); err == nil {
			if err := writeState(dir, st); err != nil {
				return err
			}
		}
	}
	if err := s.removePod(ctx, dir, st, &st.ValidationPod, s.podOperation(p.Name, v1alpha1.PhaseValidation, st.Handle, corev1.PodTemplateSpec{})); err != nil {
		return err
	}
	if err := s.removePod(ctx, dir, st, &st.StagingPod, s.podOperation(p.Name, v1alpha1.PhaseStaging, st.Handle, corev1.PodTemplateSpec{})); err != nil {
		return err
	}
	// A node expansion cut short: its pod must not act on what goes next.
	if err := s.removePod(ctx, dir, st, &st.NodeExpansionPod, s.podOperation(p.Name, v1alpha1.PhaseNodeExpansion, st.Handle, corev1.PodTemplateSpec{})); err != nil {
		return err
	}
	if began && runUnstaging && !st.Unstaged {
		vars, err := phase.StagingVars(st.vars(), st.objects())
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
			if _, ok := podrunner.IsPodFailure(err); ok {
				// The retry runs the unstaging pod again: remove this one.
				if derr := s.removePod(ctx, dir, st, &st.UnstagingPod, op); derr != nil {
					klog.FromContext(ctx).Error(derr, "Could not remove the failed unstaging pod", "handle", st.Handle)
				}
			}
			if err != nil {
				return fmt.Errorf("volume unstaging failed: %w", err)
			}
			// Recorded before the pod goes: it must not run again.
			st.Unstaged = true
			if err := writeState(dir, st); err != nil {
				return err
			}
		}
	}
	// An unstaging pod that ran (or one recorded before a reboot).
	if err := s.removePod(ctx, dir, st, &st.UnstagingPod, s.podOperation(p.Name, v1alpha1.PhaseUnstaging, st.Handle, corev1.PodTemplateSpec{})); err != nil {
		return err
	}
	if err := hostmount.UnmountAll(dir); err != nil {
		return err
	}
	// Never through a mount UnmountAll missed: it may be a backend.
	return hostmount.RemoveAll(dir)
}

// unstageRecorded unstages a volume from its recorded state, with the spec in
// force, as NodeUnstageVolume does (and a staging the kubelet forgot): after a
// reboot without the unstaging pod (see discard).
func (s *Server) unstageRecorded(ctx context.Context, st *staged, dir string) error {
	p, err := s.Source.Get(false)
	if err != nil {
		return err
	}
	boot, err := s.boot()
	if err != nil {
		return grpcerr.WithCode(codes.Internal, err)
	}
	rebooted := st.BootID != "" && st.BootID != boot
	if rebooted {
		klog.FromContext(ctx).Info("The node rebooted since the volume was staged: not running the unstaging pod", "handle", st.Handle)
	}
	return s.unstage(ctx, p, st, dir, !rebooted)
}

// NodeUnstageVolume undoes NodeStageVolume. An unknown volume is already
// unstaged. It runs with the staging's recorded context (no API reads); after
// a reboot it does not run the unstaging pod (see discard).
func (s *Server) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	handle, target := req.GetVolumeId(), req.GetStagingTargetPath()
	switch {
	case handle == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case target == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	}
	s.touch(handle) // the kubelet still means to unstage it: see forgotten.go
	release, ok := s.busy.TryAcquire(handle)
	if !ok {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", handle)
	}
	defer release()

	dir := s.volumeDir(handle)
	st, err := readState(dir)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	if st == nil {
		s.touched.Delete(handle)
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if err := s.unstageRecorded(ctx, st, dir); err != nil {
		return nil, grpcerr.Status(err)
	}
	s.touched.Delete(handle)
	klog.FromContext(ctx).V(2).Info("Volume unstaged", "handle", handle)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staged volume at the target path: a
// directory for Filesystem volumes, a file for Block volumes. It verifies the
// staging first, and stages the volume again in place if it no longer holds:
// kubelet never calls NodeStageVolume again for a volume it believes staged
// (a client pod still uses it), so this is where a new pod gets it back after
// its staging pod died. It never publishes a bare directory or a device that
// is not the volume's.
func (s *Server) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if req.GetVolumeContext()[volume.KeyEphemeral] == "true" {
		return s.publishInline(ctx, req)
	}
	handle, staging, target := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetTargetPath()
	switch {
	case handle == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case staging == "":
		return nil, status.Errorf(codes.InvalidArgument, "staging target path is required: pav stages persistent volumes (an inline ephemeral volume comes with %s=true, which the kubelet sends only for a CSIDriver with podInfoOnMount, as the pav manager makes it for a PavProvisioner with Ephemeral in spec.provisioningModes)", volume.KeyEphemeral)
	case target == "":
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	s.touch(handle) // see forgotten.go
	r, err := newStageRequest(handle, staging, req.GetVolumeCapability(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	dir := s.volumeDir(handle)
	st, err := readState(dir)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	if st != nil && st.Staged {
		if st.StagedAt != staging {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s but at %s", handle, staging, st.StagedAt)
		}
		if st.VolumeMode != r.mode {
			return nil, status.Errorf(codes.InvalidArgument, "volume %s was staged as a %s volume", handle, st.VolumeMode)
		}
	}
	src, why, err := s.published(handle, dir, st)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	if why != "" {
		if src, err = s.restage(ctx, r, why); err != nil {
			return nil, err
		}
	}
	if mounted, err := hostmount.IsMountPoint(target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if mounted {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if r.mode == corev1.PersistentVolumeBlock {
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

// published is the host path to publish for a staged volume, or why its
// staging does not hold.
func (s *Server) published(handle, dir string, st *staged) (src, why string, err error) {
	if st == nil || !st.Staged {
		return "", fmt.Sprintf("volume %s is not staged on node %s", handle, s.NodeID), nil
	}
	if why, err = s.verify(dir, st); why != "" || err != nil {
		return "", why, err
	}
	// Resolved again: the staging pod may have replaced /pav/volume since
	// (verify checked it is still what staging made).
	src, err = checkVolume(dir, st)
	return src, "", err
}

// restage stages a volume again from NodePublishVolume, under its lock.
func (s *Server) restage(ctx context.Context, r stageRequest, why string) (string, error) {
	klog.FromContext(ctx).Info("Staging the volume again before publishing it", "handle", r.handle, "reason", why)
	p, err := s.Source.Get(true)
	if err != nil {
		return "", err
	}
	release, ok := s.busy.TryAcquire(r.handle)
	if !ok {
		return "", status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", r.handle)
	}
	defer release()
	dir := s.volumeDir(r.handle)
	if err := s.stage(ctx, p, r); err != nil {
		return "", s.stageFailed(dir, err)
	}
	st, err := readState(dir)
	if err != nil {
		return "", grpcerr.Status(err)
	}
	src, why, err := s.published(r.handle, dir, st)
	switch {
	case err != nil:
		return "", grpcerr.Status(err)
	case why != "":
		return "", status.Errorf(codes.Aborted, "volume %s was staged again but does not hold: %s", r.handle, why)
	}
	return src, nil
}

// NodeUnpublishVolume unmounts and removes the target path; for an inline
// ephemeral volume it then unstages and deletes the volume (inline.go).
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
	// An inline volume goes with its pod: unstaged, deleted (inline.go).
	if err := s.unpublishInline(ctx, req.GetVolumeId(), req.GetTargetPath()); err != nil {
		return nil, grpcerr.Status(err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// validateStatic runs spec.volumeValidation for a statically provisioned PV
// before it is staged (PaV documented this but never ran it). A validation
// that fails leaves nothing behind.
func (s *Server) validateStatic(ctx context.Context, p *v1alpha1.PavProvisioner, st *staged, objs phase.Objects, dir string) error {
	if !p.Spec.HasMode(v1alpha1.Static) {
		return status.Errorf(codes.FailedPrecondition, "PavProvisioner %q does not allow static provisioning: add Static to spec.provisioningModes, or provision through a StorageClass", p.Name)
	}
	if objs.PV == nil && s.Client != nil {
		return status.Errorf(codes.NotFound, "no pod on node %s uses a PersistentVolume of driver %s with volume handle %q", s.NodeID, p.Name, st.Handle)
	}
	capacity := st.Capacity
	r := phase.Request{VolumeMode: st.VolumeMode, AccessModes: st.Access, MinCapacity: capacity, MaxCapacity: &capacity, Params: st.Params,
		MutableParams: st.MutableParams}
	if objs.PV != nil {
		r.AccessModes = objs.PV.Spec.AccessModes
	}
	vars, err := phase.ValidationVars(r, phase.Objects{PV: objs.PV, PVC: objs.PVC}, st.Handle)
	if err != nil {
		return err
	}
	cfg, err := s.Eval.Validation(ctx, p, vars)
	if err != nil {
		return err
	}
	if err := cfg.CheckRequest(r); err != nil {
		return err
	}
	if cfg.PodTemplate == nil {
		return nil
	}
	op := s.podOperation(p.Name, v1alpha1.PhaseValidation, st.Handle, *cfg.PodTemplate)
	_, err = s.runPod(ctx, dir, st, &st.ValidationPod, op)
	if _, failed := podrunner.IsPodFailure(err); err != nil && !failed {
		return fmt.Errorf("static volume validation: %w", err)
	}
	// The outcome is in hand: the pod goes.
	if derr := s.removePod(ctx, dir, st, &st.ValidationPod, op); derr != nil {
		return derr
	}
	if err != nil {
		return s.revertStaging(ctx, p, st, dir, fmt.Errorf("static volume validation failed: %w", err))
	}
	return nil
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
