package controllerserver

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/phase"
)

// contentSource checks CreateVolume's volume_content_source against
// spec.volumeCreation.contentSources and reads the source's record: nil
// without a source. What it returns is recorded in the new volume's spec,
// so retries and every later context see the same source.
func (s *Server) contentSource(ctx context.Context, p *v1alpha1.PavProvisioner, cs *csi.VolumeContentSource, maxCapacity *int64) (*v1alpha1.VolumeSource, error) {
	if cs == nil {
		return nil, nil
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, err
	}
	var src *v1alpha1.VolumeSource
	switch {
	case cs.GetSnapshot() != nil:
		if !f.Restores() || s.Snapshots == nil {
			return nil, grpcerr.Errorf(codes.InvalidArgument, "PavProvisioner %q cannot create volumes from snapshots: add Snapshot to spec.volumeCreation.contentSources (the creation pod restores `source`)", p.Name)
		}
		id := cs.GetSnapshot().GetSnapshotId()
		if id == "" {
			return nil, grpcerr.Errorf(codes.InvalidArgument, "volume_content_source.snapshot.snapshot_id is required")
		}
		snaps, err := s.Snapshots.ByHandle(ctx, id, false)
		if err != nil {
			return nil, err
		}
		if len(snaps) != 1 || snaps[0].Status.Phase != v1alpha1.SnapshotCreated {
			return nil, grpcerr.Errorf(codes.NotFound, "source snapshot %s does not exist (pav has no record of a created snapshot with that handle)", id)
		}
		sn := snaps[0]
		src = &v1alpha1.VolumeSource{Kind: v1alpha1.SourceKindSnapshot, Handle: id, Capacity: sn.Status.Size, VolumeHandle: sn.Spec.SourceVolumeID}
	case cs.GetVolume() != nil:
		if !f.Clones() {
			return nil, grpcerr.Errorf(codes.InvalidArgument, "PavProvisioner %q cannot clone volumes: add Volume to spec.volumeCreation.contentSources (the creation pod copies `source`)", p.Name)
		}
		id := cs.GetVolume().GetVolumeId()
		if id == "" {
			return nil, grpcerr.Errorf(codes.InvalidArgument, "volume_content_source.volume.volume_id is required")
		}
		v, err := s.byHandle(ctx, id)
		if err != nil {
			return nil, err
		}
		if v == nil || v.Status.Phase != v1alpha1.VolumeCreated {
			return nil, grpcerr.Errorf(codes.NotFound, "source volume %s does not exist (pav has no record of a created volume with that handle)", id)
		}
		src = &v1alpha1.VolumeSource{Kind: v1alpha1.SourceKindVolume, Handle: id, Capacity: v.Status.Capacity}
	default:
		return nil, grpcerr.Errorf(codes.InvalidArgument, "volume_content_source names neither a snapshot nor a volume")
	}
	if maxCapacity != nil && src.Capacity > *maxCapacity {
		return nil, grpcerr.WithCode(codes.OutOfRange, fmt.Errorf("the source %s %s has %s, above the requested limit %s",
			src.Kind, src.Handle, phase.FormatBytes(src.Capacity), phase.FormatBytes(*maxCapacity)))
	}
	return src, nil
}

// csiContentSource is the content_source CreateVolume answers with.
func csiContentSource(src *v1alpha1.VolumeSource) *csi.VolumeContentSource {
	switch {
	case src == nil:
		return nil
	case src.Kind == v1alpha1.SourceKindSnapshot:
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: src.Handle}}}
	default:
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.Handle}}}
	}
}

// sameSource reports whether a repeated CreateVolume names the recorded source.
func sameSource(a, b *v1alpha1.VolumeSource) bool {
	return a == nil && b == nil || a != nil && b != nil && a.Kind == b.Kind && a.Handle == b.Handle
}

// requestedSource is the kind and handle a CreateVolume request names (nil:
// none), to compare with a recorded source.
func requestedSource(cs *csi.VolumeContentSource) *v1alpha1.VolumeSource {
	switch {
	case cs.GetSnapshot() != nil:
		return &v1alpha1.VolumeSource{Kind: v1alpha1.SourceKindSnapshot, Handle: cs.GetSnapshot().GetSnapshotId()}
	case cs.GetVolume() != nil:
		return &v1alpha1.VolumeSource{Kind: v1alpha1.SourceKindVolume, Handle: cs.GetVolume().GetVolumeId()}
	}
	return nil
}
