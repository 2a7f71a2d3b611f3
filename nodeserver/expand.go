package nodeserver

// NodeExpandVolume: spec.volumeNodeExpansion grows a staged volume on its node
// (losetup -c, resize2fs), in a pod that gets the staging pod's /pav directory.
//
// The growth is recorded in state.json (nodeExpansion: the new and the
// previous capacity) with the pod's identity before the pod is asked for; a
// retry, after any restart, finishes it with the capacity its pod was given,
// adopting that pod. Once the pod succeeded and /pav/volume checks out, the new
// capacity, and what /pav/volume now is (a grown block device has a new size),
// are recorded, and only then is the pod removed: the staging's verification
// (verify) then takes the grown volume for the one staging made.

import (
	"context"
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
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/podrunner"
)

// features are what the provisioner's current spec can do beyond PaV.
func (s *Server) features() (phase.Features, error) {
	p, err := s.Source.Get(false)
	if err != nil {
		return phase.Features{}, err
	}
	return phase.FeaturesOf(&p.Spec)
}

// growingTo says whether a node expansion to size bytes is under way: until
// it is recorded, /pav/volume may already have that size.
func (st *staged) growingTo(size int64) bool {
	return st.NodeExpansion != nil && st.NodeExpansion.Capacity == size
}

// NodeExpandVolume grows a volume staged on this node to the required
// capacity with the node expansion pod, and returns the new capacity. A volume
// already as large (state.json's capacity) is left alone.
func (s *Server) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	handle := req.GetVolumeId()
	switch {
	case handle == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetVolumePath() == "":
		return nil, status.Error(codes.InvalidArgument, "volume path is required")
	}
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
	if st == nil || !st.Staged {
		return nil, status.Errorf(codes.NotFound, "volume %s is not staged on node %s", handle, s.NodeID)
	}
	cr := req.GetCapacityRange()
	switch {
	case cr.GetRequiredBytes() <= 0:
		return nil, status.Error(codes.InvalidArgument, "capacity_range.required_bytes is required: the node expansion pod grows the staged volume to the size it is given")
	case cr.GetLimitBytes() > 0 && cr.GetLimitBytes() < cr.GetRequiredBytes():
		return nil, status.Errorf(codes.InvalidArgument, "capacity range: required_bytes %d exceed limit_bytes %d", cr.GetRequiredBytes(), cr.GetLimitBytes())
	}
	p, err := s.Source.Get(false)
	if err != nil {
		return nil, err
	}
	capacity, err := s.expand(ctx, p, st, dir, cr.GetRequiredBytes(), cr.GetLimitBytes())
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: capacity}, nil
}

// expand finishes a recorded node expansion, then grows the volume to
// required bytes if it is not that large yet, and returns its capacity.
func (s *Server) expand(ctx context.Context, p *v1alpha1.PavProvisioner, st *staged, dir string, required, limit int64) (int64, error) {
	if st.NodeExpansion != nil {
		// The retry of an earlier call: its pod may be growing the volume
		// already, to the capacity it was given.
		if err := s.finishNodeExpansion(ctx, p, st, dir); err != nil {
			return 0, err
		}
	} else if st.NodeExpansionPod != nil {
		// Its outcome is recorded; a restart came before it was removed.
		if err := s.removePod(ctx, dir, st, &st.NodeExpansionPod, s.podOperation(p.Name, v1alpha1.PhaseNodeExpansion, st.Handle, corev1.PodTemplateSpec{})); err != nil {
			return 0, err
		}
	}
	if limit > 0 && st.Capacity > limit {
		return 0, grpcerr.Errorf(codes.OutOfRange, "volume %s already has %s on node %s, above the requested limit %s: volumes never shrink",
			st.Handle, phase.FormatBytes(st.Capacity), s.NodeID, phase.FormatBytes(limit))
	}
	if required <= st.Capacity {
		return st.Capacity, nil
	}
	// A staging that no longer holds is not grown: it is staged afresh (at
	// the PV's new capacity) when a pod mounts it next.
	if why, err := s.verify(dir, st); err != nil {
		return 0, err
	} else if why != "" {
		return 0, grpcerr.Errorf(codes.FailedPrecondition, "the staging of volume %s on node %s no longer holds (%s): it is not grown; a pod that mounts it there next gets it staged again", st.Handle, s.NodeID, why)
	}
	grow := &nodeExpansion{Capacity: required, Previous: st.Capacity}
	cfg, err := s.nodeExpansion(ctx, p, st, grow)
	if err != nil {
		return 0, err
	}
	st.NodeExpansion = grow
	// runPod records the growth with the pod's identity, in one write,
	// before the pod is asked for.
	if err := s.runNodeExpansion(ctx, p, st, dir, cfg); err != nil {
		return 0, err
	}
	return st.Capacity, nil
}

// nodeExpansion evaluates spec.volumeNodeExpansion for a growth of the staged
// volume: its staging context, with the new capacity, and previousCapacity.
func (s *Server) nodeExpansion(ctx context.Context, p *v1alpha1.PavProvisioner, st *staged, grow *nodeExpansion) (*phase.PodConfig, error) {
	v := st.vars()
	v.Capacity = grow.Capacity
	// The class the volume has now: it may have been modified since it was
	// staged (unstaging, by contrast, undoes what staging saw).
	m, err := s.currentMutableParams(ctx, p.Name, st)
	if err != nil {
		return nil, err
	}
	v.MutableParams = m
	vars, err := phase.NodeExpansionVars(v, st.objects(), grow.Previous)
	if err != nil {
		return nil, err
	}
	cfg, err := s.Eval.NodeExpansion(ctx, p, vars)
	if err == nil && cfg == nil {
		err = grpcerr.Errorf(codes.FailedPrecondition, "PavProvisioner %q has no spec.volumeNodeExpansion: volume %s cannot grow on node %s", p.Name, st.Handle, s.NodeID)
	}
	return cfg, err
}

// currentMutableParams are the parameters of the VolumeAttributesClass the
// staged volume's PV names now; what staging recorded without a client or a
// known PV (or once the PV is gone).
func (s *Server) currentMutableParams(ctx context.Context, driver string, st *staged) (map[string]string, error) {
	if s.Client == nil || st.PV == "" {
		return st.MutableParams, nil
	}
	pv, err := s.Client.PersistentVolumes().Get(ctx, st.PV, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return st.MutableParams, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading PersistentVolume %s: %w", st.PV, err)
	}
	return s.mutableParams(ctx, driver, pv)
}

// finishNodeExpansion runs (or adopts) the recorded node expansion's pod.
func (s *Server) finishNodeExpansion(ctx context.Context, p *v1alpha1.PavProvisioner, st *staged, dir string) error {
	cfg, err := s.nodeExpansion(ctx, p, st, st.NodeExpansion)
	if err != nil {
		return err
	}
	return s.runNodeExpansion(ctx, p, st, dir, cfg)
}

// runNodeExpansion runs the pod of st.NodeExpansion and records its outcome:
// the new capacity, or nothing (a failure: the retry runs a new pod). Either
// way the growth is over before the pod is removed.
func (s *Server) runNodeExpansion(ctx context.Context, p *v1alpha1.PavProvisioner, st *staged, dir string, cfg *phase.PodConfig) error {
	grow := *st.NodeExpansion
	op := s.podOperation(p.Name, v1alpha1.PhaseNodeExpansion, st.Handle, *cfg.PodTemplate)
	_, err := s.runPod(ctx, dir, st, &st.NodeExpansionPod, op)
	var failure error
	switch _, failed := podrunner.IsPodFailure(err); {
	case failed:
		failure = fmt.Errorf("volume node expansion failed: %w", err)
	case errors.Is(err, podrunner.ErrForeignPod):
		// Our token never reached a pod: nothing of ours ran under it.
		st.NodeExpansionPod, failure = nil, err
	case err != nil:
		// Still running, or lost (the retry runs a new pod), or the API.
		return err
	default:
		var id hostmount.Identity
		if id, failure = s.grown(dir, st, grow.Capacity); failure == nil {
			st.Capacity, st.Volume = grow.Capacity, &id
		}
	}
	st.NodeExpansion = nil
	if err := writeState(dir, st); err != nil {
		return err
	}
	if rerr := s.removePod(ctx, dir, st, &st.NodeExpansionPod, op); rerr != nil {
		if failure != nil {
			return fmt.Errorf("%w (and removing its pod: %v)", failure, rerr)
		}
		// The capacity is recorded; the next call, or unstaging, removes it.
		klog.FromContext(ctx).Error(rerr, "Could not remove the finished node expansion pod", "handle", st.Handle)
	}
	if failure != nil {
		return failure
	}
	klog.FromContext(ctx).Info("Volume expanded on the node", "handle", st.Handle, "capacity", grow.Capacity, "previous", grow.Previous)
	return nil
}

// grown checks /pav/volume after a node expansion pod succeeded: still what
// staging made (a grown block device keeps its device number and disk
// sequence number: it was grown in place, as the published device files need),
// and for a Block volume exactly the new capacity. It returns what
// /pav/volume now is, for state.json.
func (s *Server) grown(dir string, st *staged, capacity int64) (hostmount.Identity, error) {
	src, err := hostmount.Resolve(filepath.Join(dir, "pav"), podrunner.MountPath, podVolume)
	if err != nil {
		return hostmount.Identity{}, grpcerr.WithCode(codes.Internal, fmt.Errorf("after the node expansion pod, /pav/volume: %w", err))
	}
	if _, err := os.Stat(src); err != nil {
		return hostmount.Identity{}, grpcerr.WithCode(codes.Internal, fmt.Errorf("after the node expansion pod, /pav/volume: %w", err))
	}
	cur, err := hostmount.Identify(src)
	if err != nil {
		return hostmount.Identity{}, grpcerr.WithCode(codes.Internal, fmt.Errorf("after the node expansion pod, /pav/volume cannot be checked: %w", err))
	}
	if st.Volume != nil {
		rec := *st.Volume
		rec.Size = cur.Size
		if why := rec.Compare(cur); why != "" {
			return cur, grpcerr.Errorf(codes.Internal, "after the node expansion pod, /pav/volume is not what staging made (%s): it must grow the volume in place (e.g. losetup -c), since pods use the device staging made", why)
		}
	}
	if st.VolumeMode == corev1.PersistentVolumeBlock && cur.Size != capacity {
		return cur, grpcerr.Errorf(codes.Internal, "after the node expansion pod, /pav/volume is a block device of %d bytes, but the volume's new capacity is %d bytes", cur.Size, capacity)
	}
	return cur, nil
}
