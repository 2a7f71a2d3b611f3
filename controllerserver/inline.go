package controllerserver

// Inline ephemeral volumes: the creation and deletion of CreateVolume and
// DeleteVolume, run by the node plugin for a pod's `csi` volume.
//
// The node plugin of the pod's node holds a Server of its own (with its pod
// runner, which sees only its node's pods, and a records.NodeStore) and calls
// CreateInline from NodePublishVolume and DeleteInline from
// NodeUnpublishVolume. Everything else is CreateVolume's and DeleteVolume's:
// the record written before any pod, validation and creation pods adopted by
// recorded identity, a failed creation reverted by the deletion pod, the
// capacity checked, the record removed last. What differs:
//
//   - the record says spec.ephemeral (node and pod), and every pod of the
//     volume runs on that node (job.podOp);
//   - the request is fixed: Filesystem, ReadWriteOnce, the minimum
//     capacity volumeValidation.minCapacity (1 byte by default), no maximum;
//     `params` are the pod's volumeAttributes, written by the pod's author:
//     tenant input;
//   - the handle is always the CSI volume id (the kubelet's csi-<sha256 of
//     the pod's UID and the volume's name>): volumeCreation.handle and
//     /pav/handle may only repeat it. A tenant who could choose an inline
//     volume's handle could make it another volume's, and its deletion pod
//     would then delete that volume's data;
//   - without volumeCreation, the staging pod alone makes the volume, whose
//     capacity is the requested minimum.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/records"
)

// InlineVolume is an inline ephemeral volume as its node plugin asks for it.
type InlineVolume struct {
	// ID is the CSI volume id: the volume's name, record name and handle.
	ID string
	// Node is the node the volume and all its pods are on.
	Node string
	// Pod is the pod whose volume it is (the kubelet's podInfoOnMount).
	Pod v1alpha1.EphemeralPod
	// Params are the pod's volumeAttributes, without the kubelet's keys.
	Params map[string]string
}

// CreateInline creates an inline ephemeral volume, or carries its creation on
// from its record, and returns the record once the volume is Created. Like
// CreateVolume, it answers a final error only when nothing of the volume is
// left (refused before a pod ran, or reverted); otherwise the record stays
// for the retry (or DeleteInline) to finish.
func (s *Server) CreateInline(ctx context.Context, p *v1alpha1.PavProvisioner, iv InlineVolume) (*v1alpha1.PavVolume, error) {
	switch {
	case iv.ID == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case iv.Node == "":
		return nil, status.Error(codes.InvalidArgument, "an inline volume needs its node (a pav bug)")
	case !p.Spec.HasMode(v1alpha1.Ephemeral):
		return nil, grpcerr.Errorf(codes.InvalidArgument, "PavProvisioner %q does not allow inline ephemeral volumes (a pod's csi volume): add Ephemeral to its spec.provisioningModes, or use a PersistentVolumeClaim", p.Name)
	}
	release, ok := s.busy.TryAcquire(iv.ID)
	if !ok {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", iv.ID)
	}
	defer release()

	eph := &v1alpha1.EphemeralVolume{Node: iv.Node, Pod: iv.Pod}
	rec, err := s.Records.Get(ctx, iv.ID)
	if errors.Is(err, records.ErrOtherOwner) {
		return nil, grpcerr.WithCode(codes.AlreadyExists, err)
	}
	if err != nil {
		return nil, err
	}
	if rec == nil {
		r, err := InlineRequest(ctx, s.Eval, p, iv)
		if err != nil {
			return nil, err
		}
		if rec, err = s.record(ctx, p, iv.ID, iv.Params, r, eph); err != nil || rec == nil {
			return nil, err
		}
	} else if err := fitsInline(rec, iv); err != nil {
		return nil, err
	}
	j := &job{s: s, p: p, v: rec}
	if _, err := j.resume(ctx); err != nil {
		return nil, err
	}
	return j.v, nil
}

// InlineRequest is what an inline volume asks for: a Filesystem volume,
// ReadWriteOnce (one pod), of at least volumeValidation.minCapacity (1 byte
// by default; a minCapacity template sees requestedMinCapacity 1), with no
// maximum. `pav render` shows the same.
func InlineRequest(ctx context.Context, eval *phase.Evaluator, p *v1alpha1.PavProvisioner, iv InlineVolume) (phase.Request, error) {
	pod := iv.Pod
	r := phase.Request{VolumeMode: corev1.PersistentVolumeFilesystem, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		MinCapacity: 1, Params: iv.Params, Pod: &pod}
	vars, err := phase.ValidationVars(r, phase.Objects{}, "")
	if err != nil {
		return r, err
	}
	cfg, err := eval.Validation(ctx, p, vars)
	if err != nil {
		return r, err
	}
	r.MinCapacity = cfg.MinCapacity
	return r, nil
}

// InlineVolumeID is the kubelet's CSI volume id of a pod's inline volume:
// csi-<hex SHA-256 of the pod's UID and the volume's name> (unique per pod
// and volume; pkg/volume/csi's makeVolumeHandle).
func InlineVolumeID(podUID types.UID, volumeName string) string {
	sum := sha256.Sum256([]byte(string(podUID) + volumeName))
	return "csi-" + hex.EncodeToString(sum[:])
}

// fitsInline checks that a repeated creation asks for the volume recorded
// under its id: the same pod and attributes (a pod's volumes cannot change,
// so anything else is another pod's volume under a colliding id).
func fitsInline(v *v1alpha1.PavVolume, iv InlineVolume) error {
	e := v.Spec.Ephemeral
	switch {
	case e == nil:
		return grpcerr.Errorf(codes.AlreadyExists, "volume %s exists and is not an inline ephemeral volume", iv.ID)
	case e.Node != iv.Node || e.Pod.UID != iv.Pod.UID:
		return grpcerr.Errorf(codes.AlreadyExists, "inline volume %s exists for pod %s/%s (uid %s) on node %s, not for pod %s/%s (uid %s) on node %s",
			iv.ID, e.Pod.Namespace, e.Pod.Name, e.Pod.UID, e.Node, iv.Pod.Namespace, iv.Pod.Name, iv.Pod.UID, iv.Node)
	case !maps.Equal(v.Spec.Params, iv.Params):
		return grpcerr.Errorf(codes.AlreadyExists, "inline volume %s exists with other volumeAttributes", iv.ID)
	}
	return nil
}

// DeleteInline deletes an inline ephemeral volume of this node, whatever its
// creation got to, and removes its record; a volume without a record is
// deleted already. A validation under way is abandoned (its pod removed:
// validation changes nothing); a creation under way is finished first (its
// pod may have made something), then undone by the deletion pod, as a
// created volume is.
func (s *Server) DeleteInline(ctx context.Context, p *v1alpha1.PavProvisioner, id string) error {
	if id == "" {
		return status.Error(codes.InvalidArgument, "volume id is required")
	}
	release, ok := s.busy.TryAcquire(id)
	if !ok {
		return status.Errorf(codes.Aborted, "an operation on volume %s is already in progress", id)
	}
	defer release()
	for {
		v, err := s.Records.Get(ctx, id)
		if err != nil || v == nil {
			return err
		}
		if v.Spec.Ephemeral == nil {
			return grpcerr.Errorf(codes.FailedPrecondition, "volume %s is not an inline ephemeral volume: not the node plugin's to delete", id)
		}
		j := &job{s: s, p: p, v: v, key: DeletionKey(id)}
		switch v.Status.Phase {
		case v1alpha1.VolumeValidating:
			if e := j.pending(v1alpha1.PhaseValidation); e != nil {
				e.Outcome = v1alpha1.PodFailed // in memory: refused removes it
			}
			klog.FromContext(ctx).Info("Inline volume deleted during its validation", "volume", id)
			return j.refused(ctx, nil)
		case v1alpha1.VolumeCreating:
			// Created (then deleted below), or failed and reverted.
			err = j.create(ctx)
		case v1alpha1.VolumeReverting:
			err = j.revert(ctx)
		case v1alpha1.VolumeCreated, v1alpha1.VolumeDeleting:
			if err := s.deleteRecorded(ctx, j); err != nil {
				return err
			}
			klog.FromContext(ctx).Info("Inline volume deleted", "volume", id, "pod", v.Spec.Ephemeral.Pod.Namespace+"/"+v.Spec.Ephemeral.Pod.Name)
			return nil
		default:
			return fmt.Errorf("PavVolume %s has an unknown phase %q", v.Name, v.Status.Phase)
		}
		if err != nil {
			// A creation that failed for good was reverted and its record
			// removed: that failure is not the deletion's. Anything else
			// (the pod still runs, a revert failed) is retried.
			if v, gerr := s.Records.Get(ctx, id); gerr == nil && v == nil {
				return nil
			}
			return err
		}
		// Created: deleted on the next turn.
	}
}

// inlineHandle refuses, for an inline volume, a handle other than its CSI
// volume id (what names it: field, the spec field or the pod file).
func (j *job) inlineHandle(handle, field string) error {
	id := j.v.Spec.VolumeName
	if j.v.Spec.Ephemeral == nil || handle == "" || handle == id {
		return nil
	}
	fix := "write it only when not ephemeral"
	if field != "/pav/handle" {
		fix = "leave it out for them (write volumeCreation as a YAML template with {% if not ephemeral %}handle: ...{% endif %})"
	}
	return grpcerr.Errorf(codes.InvalidArgument,
		"%s is %q, but the handle of an inline ephemeral volume is always its CSI volume id %s (a pod's author must never choose it: another volume's handle would have that volume's data deleted with the pod): %s",
		field, handle, id, fix)
}

// ephemeralPod is the contexts' pod of a record, nil for a persistent volume.
func ephemeralPod(e *v1alpha1.EphemeralVolume) *v1alpha1.EphemeralPod {
	if e == nil {
		return nil
	}
	pod := e.Pod
	return &pod
}

// hasPhase says whether the spec has the phase's object.
func hasPhase(p *v1alpha1.PavProvisioner, ph v1alpha1.Phase) bool {
	v := p.Spec.Phase(ph)
	return v != nil && v.Data != nil
}

// InlineRecord is an inline volume's record, or nil.
func (s *Server) InlineRecord(ctx context.Context, id string) (*v1alpha1.PavVolume, error) {
	return s.Records.Get(ctx, id)
}
