package controllerserver

import (
	"context"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
)

// ListSnapshots lists the created snapshots from the records (the informer's
// cache, with pav's own latest writes), filtered by snapshot_id and
// source_volume_id. Pages are positions in the list sorted by record name:
// starting_token is where the page starts.
func (s *Server) ListSnapshots(_ context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	resp, err := s.listSnapshots(req)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	return resp, nil
}

func (s *Server) listSnapshots(req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "max_entries must not be negative, got %d", req.GetMaxEntries())
	}
	var all []*v1alpha1.PavSnapshot
	if s.Snapshots != nil {
		var err error
		if all, err = s.Snapshots.List(); err != nil {
			return nil, err
		}
	}
	var entries []*csi.ListSnapshotsResponse_Entry
	for _, v := range all {
		switch {
		case v.Status.Phase != v1alpha1.SnapshotCreated,
			req.GetSnapshotId() != "" && v.Status.Handle != req.GetSnapshotId(),
			req.GetSourceVolumeId() != "" && v.Spec.SourceVolumeID != req.GetSourceVolumeId():
			continue
		}
		entries = append(entries, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(v)})
	}
	start := 0
	if t := req.GetStartingToken(); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 || n > len(entries) {
			// ABORTED, as CSI asks for a token the plugin cannot use (the
			// list may have shrunk since it was handed out).
			return nil, status.Errorf(codes.Aborted, "starting_token %q is not a position in the %d snapshots: start again without it", t, len(entries))
		}
		start = n
	}
	resp := &csi.ListSnapshotsResponse{}
	end := len(entries)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
		resp.NextToken = strconv.Itoa(end)
	}
	resp.Entries = entries[start:end]
	return resp, nil
}

// GetSnapshot answers one created snapshot's current state by its handle,
// from the records like ListSnapshots (csi-snapshotter and CSI 1.12's
// GET_SNAPSHOT); a handle pav has no created snapshot of is NOT_FOUND.
func (s *Server) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	snap, err := s.getSnapshot(ctx, req.GetSnapshotId())
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	return &csi.GetSnapshotResponse{Snapshot: snap}, nil
}

func (s *Server) getSnapshot(ctx context.Context, handle string) (*csi.Snapshot, error) {
	if handle == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot id is required")
	}
	if s.Snapshots == nil {
		return nil, grpcerr.Errorf(codes.NotFound, "snapshot %s does not exist", handle)
	}
	vs, err := s.Snapshots.ByHandle(ctx, handle, false)
	if err != nil {
		return nil, err
	}
	for _, v := range vs {
		if v.Status.Phase == v1alpha1.SnapshotCreated {
			return csiSnapshot(v), nil
		}
	}
	return nil, grpcerr.Errorf(codes.NotFound, "snapshot %s does not exist", handle)
}
