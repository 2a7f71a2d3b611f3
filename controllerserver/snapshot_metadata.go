package controllerserver

// Changed block tracking: the CSI SnapshotMetadata service (GetMetadataAllocated,
// GetMetadataDelta), which the external-snapshot-metadata sidecar serves to
// backup applications. spec.snapshotMetadata's pod lists the allocated blocks of
// a snapshot, or the blocks changed since a base snapshot of the same volume, in
// /pav/blocks (one "OFFSET LENGTH" range per line), which pav-report carries
// through the pod's log (a list outgrows a termination message); pav checks it
// (phase.ParseBlocks) and streams it in pages of max_results.
//
// One pod per (snapshot, base) at a time: concurrent calls wait for the same
// listing, and its result is kept for metadataResultTTL after its last use, so
// that a client resuming an interrupted stream at a later starting_offset is
// served without a new pod. Every pod is recorded in its snapshot's PavSnapshot
// (status.metadataListings: token, then UID) before it is asked for, and the
// entry goes once the pod has been removed: a restarted controller plugin adopts
// a listing's pod when the call is retried, and sweepMetadataListings removes
// those nobody asks for again. DeleteSnapshot removes a snapshot's listings'
// pods before its record.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/report"
	"github.com/pods-as-volumes/pav/podrunner"
)

const (
	// metadataResultTTL is how long a listing's result is kept after its
	// last use, and how long a recorded listing nobody asks for again may
	// keep its pod: the external-snapshot-metadata sidecar's default
	// --max-streaming-duration-min is 10 minutes.
	metadataResultTTL = 10 * time.Minute
	// metadataSweepInterval is how often expired results and unclaimed
	// listings are removed.
	metadataSweepInterval = time.Minute
	// defaultMaxResults is the page size when max_results is 0, and
	// maxPageResults the largest page sent whatever max_results says (a
	// BlockMetadata takes up to 22 bytes: 16,384 of them stay far below
	// gRPC's default 4 MiB message limit of the receiving sidecar).
	defaultMaxResults = 1024
	maxPageResults    = 16384
	// maxCachedListings bounds the results kept in memory (each up to
	// report.MaxLogFile of /pav/blocks).
	maxCachedListings = 16
	// maxMetadataListings bounds a snapshot's listings under way (the
	// CRD's maxItems of status.metadataListings).
	maxMetadataListings = 8
	// ReasonInvalidSnapshotMetadata is the Warning event on the
	// VolumeSnapshot whose snapshotMetadata pod wrote no or a bad /pav/blocks.
	ReasonInvalidSnapshotMetadata = "InvalidSnapshotMetadata"
)

// metadataState is the controller plugin's memory of its listings.
type metadataState struct {
	mu       sync.Mutex
	listings map[string]*listing // by listingKey
}

// listing is one run of a snapshotMetadata pod (or its adoption) and, once
// done is closed, its outcome.
type listing struct {
	from int64 // the starting offset the pod listed from
	done chan struct{}

	// Set before done is closed.
	ranges   []phase.BlockRange
	capacity int64
	fixed    bool // every range has the same length
	err      error
	used     time.Time // guarded by metadataState.mu once done
}

// listingKey identifies a listing: the snapshot's record and the base
// snapshot's handle ("" for the allocated blocks). A record name is a DNS
// subdomain (no "/"), so the key is unambiguous; it is also the pods' volume
// key, and so decides their names.
func listingKey(targetRecord, baseHandle string) string {
	return "snapshotmetadata/" + targetRecord + "/" + baseHandle
}

// SnapshotMetadataServer is the CSI SnapshotMetadata service of a controller
// plugin (registered beside its Controller service).
func (s *Server) SnapshotMetadataServer() csi.SnapshotMetadataServer { return metadataServer{s: s} }

type metadataServer struct {
	csi.UnimplementedSnapshotMetadataServer
	s *Server
}

// GetMetadataAllocated streams the allocated blocks of a snapshot.
func (m metadataServer) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, stream csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	ctx := stream.Context()
	if req.GetSnapshotId() == "" {
		return status.Error(codes.InvalidArgument, "snapshot_id is required")
	}
	l, err := m.s.blockListing(ctx, req.GetSnapshotId(), "", req.GetStartingOffset(), req.GetMaxResults())
	if err != nil {
		return grpcerr.Status(err)
	}
	return sendPages(l, req.GetStartingOffset(), req.GetMaxResults(), func(typ csi.BlockMetadataType, capacity int64, blocks []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataAllocatedResponse{BlockMetadataType: typ, VolumeCapacityBytes: capacity, BlockMetadata: blocks})
	})
}

// GetMetadataDelta streams the blocks of the target snapshot that changed
// since the base snapshot (of the same volume).
func (m metadataServer) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, stream csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	ctx := stream.Context()
	switch {
	case req.GetTargetSnapshotId() == "":
		return status.Error(codes.InvalidArgument, "target_snapshot_id is required")
	case req.GetBaseSnapshotId() == "":
		return status.Error(codes.InvalidArgument, "base_snapshot_id is required (for the allocated blocks of one snapshot, call GetMetadataAllocated)")
	}
	l, err := m.s.blockListing(ctx, req.GetTargetSnapshotId(), req.GetBaseSnapshotId(), req.GetStartingOffset(), req.GetMaxResults())
	if err != nil {
		return grpcerr.Status(err)
	}
	return sendPages(l, req.GetStartingOffset(), req.GetMaxResults(), func(typ csi.BlockMetadataType, capacity int64, blocks []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataDeltaResponse{BlockMetadataType: typ, VolumeCapacityBytes: capacity, BlockMetadata: blocks})
	})
}

// sendPages sends the ranges of l that end after offset, max (or
// defaultMaxResults, at most maxPageResults) to a message; a listing with
// nothing after offset is one message without ranges, which still tells the
// type and the capacity.
func sendPages(l *listing, offset int64, max int32, send func(csi.BlockMetadataType, int64, []*csi.BlockMetadata) error) error {
	typ := csi.BlockMetadataType_VARIABLE_LENGTH
	if l.fixed {
		typ = csi.BlockMetadataType_FIXED_LENGTH
	}
	n := int(max)
	if n <= 0 {
		n = defaultMaxResults
	}
	n = min(n, maxPageResults)
	i := sort.Search(len(l.ranges), func(i int) bool { return l.ranges[i].End() > offset })
	if i == len(l.ranges) {
		return send(typ, l.capacity, nil)
	}
	for i < len(l.ranges) {
		j := min(i+n, len(l.ranges))
		page := make([]*csi.BlockMetadata, 0, j-i)
		for _, r := range l.ranges[i:j] {
			page = append(page, &csi.BlockMetadata{ByteOffset: r.Offset, SizeBytes: r.Length})
		}
		if err := send(typ, l.capacity, page); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// metadataProvisioner is the provisioner, if it lists blocks.
func (s *Server) metadataProvisioner() (*v1alpha1.PavProvisioner, error) {
	// The spec in force: listing reads, so it goes on while the
	// provisioner is being deleted, as deletions do.
	p, err := s.Source.Get(false)
	if err != nil {
		return nil, err
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, err
	}
	if !f.SnapshotMetadata || s.Snapshots == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "PavProvisioner %q does not track changed blocks: add spec.snapshotMetadata (a pod that lists a snapshot's blocks)", p.Name)
	}
	return p, nil
}

// createdSnapshot is the created snapshot of a handle, or NOT_FOUND (what
// names it: "snapshot", "base snapshot").
func (s *Server) createdSnapshot(ctx context.Context, handle, what string) (*v1alpha1.PavSnapshot, error) {
	vs, err := s.Snapshots.ByHandle(ctx, handle, false)
	if err != nil {
		return nil, err
	}
	for _, v := range vs {
		if v.Status.Phase == v1alpha1.SnapshotCreated {
			return v, nil
		}
	}
	return nil, grpcerr.Errorf(codes.NotFound, "%s %s does not exist (pav has no created snapshot with that handle)", what, handle)
}

// snapshotCapacity is a snapshot's size, else its source volume's capacity.
func snapshotCapacity(v *v1alpha1.PavSnapshot) int64 {
	if v.Status.Size > 0 {
		return v.Status.Size
	}
	return v.Spec.Volume.Capacity
}

// blockListing checks a request and returns its listing, done: the kept
// result of an earlier call, that of a pod under way, or a new pod's.
func (s *Server) blockListing(ctx context.Context, targetID, baseID string, offset int64, maxResults int32) (*listing, error) {
	if maxResults < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "max_results must not be negative, got %d", maxResults)
	}
	if offset < 0 {
		return nil, status.Errorf(codes.OutOfRange, "starting_offset must not be negative, got %d", offset)
	}
	p, err := s.metadataProvisioner()
	if err != nil {
		return nil, err
	}
	what := "snapshot"
	if baseID != "" {
		what = "target snapshot"
	}
	target, err := s.createdSnapshot(ctx, targetID, what)
	if err != nil {
		return nil, err
	}
	capacity := snapshotCapacity(target)
	var base *v1alpha1.PavSnapshot
	if baseID != "" {
		if base, err = s.createdSnapshot(ctx, baseID, "base snapshot"); err != nil {
			return nil, err
		}
		if base.Spec.SourceVolumeID != target.Spec.SourceVolumeID {
			return nil, grpcerr.Errorf(codes.InvalidArgument,
				"base snapshot %s is of volume %s and target snapshot %s of volume %s: changed blocks are listed between two snapshots of one volume",
				baseID, base.Spec.SourceVolumeID, targetID, target.Spec.SourceVolumeID)
		}
	}
	if offset > capacity {
		return nil, status.Errorf(codes.OutOfRange, "starting_offset %d is beyond the snapshot's capacity of %d bytes", offset, capacity)
	}
	if base != nil && base.Name == target.Name {
		// Nothing changed between a snapshot and itself: no pod.
		return &listing{capacity: capacity}, nil
	}
	return s.listing(ctx, p, target, base, offset)
}

// listing returns the listing of (target, base) that covers offset: a kept
// result, the one a pod under way will give, or a new pod's. The pod runs
// apart from the call: a client that gives up leaves it to finish for the
// next call.
func (s *Server) listing(ctx context.Context, p *v1alpha1.PavProvisioner, target, base *v1alpha1.PavSnapshot, offset int64) (*listing, error) {
	baseHandle := ""
	if base != nil {
		baseHandle = base.Status.Handle
	}
	key := listingKey(target.Name, baseHandle)
	m := &s.metadata
	for {
		m.mu.Lock()
		if m.listings == nil {
			m.listings = map[string]*listing{}
		}
		l := m.listings[key]
		if l != nil {
			select {
			case <-l.done:
				if l.err == nil && l.from <= offset && time.Since(l.used) < metadataResultTTL {
					l.used = time.Now()
					m.mu.Unlock()
					return l, nil
				}
				// Failed (a new call runs a new pod), expired, or listed
				// from beyond offset: a new listing.
				l = nil
			default:
			}
		}
		if l == nil {
			m.evictLocked()
			l = &listing{from: offset, done: make(chan struct{})}
			m.listings[key] = l
			go s.runListing(context.WithoutCancel(ctx), p, target, base, key, l)
		}
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.done:
		}
		if l.err != nil {
			return nil, l.err
		}
		if l.from <= offset {
			m.mu.Lock()
			l.used = time.Now()
			m.mu.Unlock()
			return l, nil
		}
		// An adopted pod listed from beyond offset: once more, from offset.
	}
}

// evictLocked makes room for one more listing: expired results go, then the
// least recently used ones while there are maxCachedListings. Listings under
// way stay.
func (m *metadataState) evictLocked() {
	var done []string
	for k, l := range m.listings {
		select {
		case <-l.done:
			if time.Since(l.used) >= metadataResultTTL || l.err != nil {
				delete(m.listings, k)
				continue
			}
			done = append(done, k)
		default:
		}
	}
	sort.Slice(done, func(i, j int) bool { return m.listings[done[i]].used.Before(m.listings[done[j]].used) })
	for len(m.listings) >= maxCachedListings && len(done) > 0 {
		delete(m.listings, done[0])
		done = done[1:]
	}
}

// runListing runs the listing's pod and closes l.done with its outcome.
func (s *Server) runListing(ctx context.Context, p *v1alpha1.PavProvisioner, target, base *v1alpha1.PavSnapshot, key string, l *listing) {
	defer close(l.done)
	logger := klog.FromContext(ctx).WithValues("snapshot", target.Status.Handle, "listing", key)
	ctx = klog.NewContext(ctx, logger)
	ranges, capacity, from, err := s.runMetadataPod(ctx, p, target.Spec.SnapshotName, base, l.from)
	s.metadata.mu.Lock()
	l.ranges, l.capacity, l.from, l.err, l.used = ranges, capacity, from, err, time.Now()
	l.fixed = len(ranges) > 0
	for _, r := range ranges {
		if r.Length != ranges[0].Length {
			l.fixed = false
			break
		}
	}
	s.metadata.mu.Unlock()
	if err != nil {
		logger.Info("Listing the snapshot's blocks failed", "err", err.Error())
	} else {
		logger.Info("Listed the snapshot's blocks", "ranges", len(ranges), "from", from)
	}
}

// errNoChange makes updateSnapshot write nothing.
var errNoChange = errors.New("no change")

// updateSnapshot writes snapshot name's record after mutate, reading it
// afresh and trying again when another write came in between (a snapshot's
// listings, and DeleteSnapshot, write the same record). mutate may return
// errNoChange to write nothing.
func (s *Server) updateSnapshot(ctx context.Context, name string, mutate func(v *v1alpha1.PavSnapshot) error) (*v1alpha1.PavSnapshot, error) {
	for attempt := 0; ; attempt++ {
		v, err := s.Snapshots.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		if v == nil {
			return nil, grpcerr.Errorf(codes.NotFound, "snapshot %s does not exist any more", name)
		}
		v = v.DeepCopy()
		if err := mutate(v); errors.Is(err, errNoChange) {
			return v, nil
		} else if err != nil {
			return nil, err
		}
		got, err := s.Snapshots.Update(ctx, v)
		if apierrors.IsConflict(err) && attempt < 4 {
			continue
		}
		return got, err
	}
}

// metadataOp is the operation of a recorded listing's pod.
func metadataOp(provisioner, targetRecord string, e *v1alpha1.MetadataListing, t corev1.PodTemplateSpec) podrunner.Operation {
	op := PodOperation(provisioner, v1alpha1.PhaseSnapshotMetadata, listingKey(targetRecord, e.BaseHandle), t)
	op.LogFiles = []string{report.FileBlocks}
	return withIdentity(op, e.Pod)
}

// runMetadataPod runs the snapshotMetadata pod of snapshot name (and base)
// from offset, or adopts the one recorded, and returns the checked ranges,
// the snapshot's capacity and the offset the pod listed from. The pod is
// recorded before it is asked for, and removed (then its entry) once its
// outcome is read; an error that leaves the outcome unknown (the call's end
// aside, the API server) leaves both for a retry to adopt.
func (s *Server) runMetadataPod(ctx context.Context, p *v1alpha1.PavProvisioner, name string, base *v1alpha1.PavSnapshot, from int64) ([]phase.BlockRange, int64, int64, error) {
	baseHandle := ""
	var baseVar *phase.MetadataSnapshot
	if base != nil {
		baseHandle = base.Status.Handle
		baseVar = &phase.MetadataSnapshot{Spec: &base.Spec, Handle: base.Status.Handle, Capacity: snapshotCapacity(base)}
	}
	const maxLost = 3
	for lost := 0; ; lost++ {
		target, err := s.Snapshots.Get(ctx, name)
		if err != nil {
			return nil, 0, from, err
		}
		if target == nil || target.Status.Phase != v1alpha1.SnapshotCreated {
			return nil, 0, from, grpcerr.Errorf(codes.NotFound, "snapshot %s no longer exists", name)
		}
		capacity := snapshotCapacity(target)
		e := target.Status.MetadataListing(baseHandle)
		if e != nil {
			from = e.StartingOffset // adopted: the pod lists from where it was asked to
		}
		vars, err := phase.SnapshotMetadataVars(&phase.MetadataSnapshot{Spec: &target.Spec, Handle: target.Status.Handle, Capacity: capacity}, baseVar, from)
		if err != nil {
			return nil, 0, from, err
		}
		cfg, err := s.Eval.SnapshotMetadata(ctx, p, vars)
		if err != nil {
			return nil, 0, from, err
		}
		if cfg == nil || cfg.PodTemplate == nil {
			return nil, 0, from, status.Errorf(codes.FailedPrecondition, "PavProvisioner %q no longer has spec.snapshotMetadata", p.Name)
		}
		op := PodOperation(p.Name, v1alpha1.PhaseSnapshotMetadata, listingKey(target.Name, baseHandle), *cfg.PodTemplate)
		if e == nil {
			entry := v1alpha1.MetadataListing{BaseHandle: baseHandle, StartingOffset: from, Started: metav1.NewTime(time.Now().Truncate(time.Second)),
				Pod: v1alpha1.VolumePod{Phase: v1alpha1.PhaseSnapshotMetadata, Namespace: s.Pods.Namespace(op), Name: op.PodName(), Token: podrunner.NewToken()}}
			if _, err := s.updateSnapshot(ctx, name, func(v *v1alpha1.PavSnapshot) error {
				switch {
				case v.Status.Phase != v1alpha1.SnapshotCreated:
					return grpcerr.Errorf(codes.NotFound, "snapshot %s no longer exists (%s)", name, v.Status.Phase)
				case v.Status.MetadataListing(baseHandle) != nil:
					return grpcerr.Errorf(codes.Aborted, "another listing of snapshot %s was recorded meanwhile; retry", name)
				case len(v.Status.MetadataListings) >= maxMetadataListings:
					return grpcerr.Errorf(codes.ResourceExhausted, "%d listings of the blocks of snapshot %s are under way, the most pav runs at once: retry once one has ended", len(v.Status.MetadataListings), name)
				}
				v.Status.MetadataListings = append(v.Status.MetadataListings, entry)
				return nil
			}); err != nil {
				return nil, 0, from, err
			}
			e = &entry
		}
		token := e.Pod.Token
		op = metadataOp(p.Name, target.Name, e, *cfg.PodTemplate)
		op.Created = func(ctx context.Context, uid types.UID) error {
			_, err := s.updateSnapshot(ctx, name, func(v *v1alpha1.PavSnapshot) error {
				if e := v.Status.MetadataListing(baseHandle); e != nil && e.Pod.Token == token {
					e.Pod.UID = uid
					return nil
				}
				return errNoChange
			})
			return err
		}
		res, err := s.Pods.Run(ctx, op)
		if errors.Is(err, podrunner.ErrPodDeleted) && lost < maxLost {
			// Its outcome is unknown (deleted by someone else, or removed
			// by a process that did not live to remove its entry): run a
			// new one.
			klog.FromContext(ctx).Info("The listing's pod is gone; running a new one", "pod", e.Pod.Name, "err", err.Error())
			if err := s.forgetListing(ctx, name, baseHandle, token); err != nil {
				return nil, 0, from, err
			}
			continue
		}
		if f, ok := podrunner.IsPodFailure(err); ok {
			if rerr := s.removeListing(ctx, op, name, baseHandle, token); rerr != nil {
				return nil, 0, from, rerr
			}
			return nil, 0, from, fmt.Errorf("listing the blocks of snapshot %s: %w", target.Status.Handle, f)
		}
		if err != nil {
			return nil, 0, from, err
		}
		ranges, perr := metadataResult(res, capacity)
		// The result is read: the pod and its entry go, whatever it says.
		if err := s.removeListing(ctx, op, name, baseHandle, token); err != nil {
			return nil, 0, from, err
		}
		if perr != nil {
			perr = fmt.Errorf("snapshotMetadata pod %s/%s of snapshot %s: %w", res.Namespace, res.Pod, target.Status.Handle, perr)
			s.snapshotEvent(target, corev1.EventTypeWarning, ReasonInvalidSnapshotMetadata, perr.Error())
			return nil, 0, from, grpcerr.WithCode(codes.Internal, perr)
		}
		return ranges, capacity, from, nil
	}
}

// metadataResult reads and checks /pav/blocks.
func metadataResult(res *podrunner.Result, capacity int64) ([]phase.BlockRange, error) {
	blocks, ok := res.Files[report.FileBlocks]
	if !ok {
		return nil, errors.New("wrote no /pav/blocks: it must list the ranges there (an empty file when there are none), one \"OFFSET LENGTH\" in bytes per line")
	}
	return phase.ParseBlocks(blocks, capacity)
}

// removeListing removes a listing's pod, then its entry.
func (s *Server) removeListing(ctx context.Context, op podrunner.Operation, name, baseHandle, token string) error {
	if err := s.Pods.Delete(ctx, op); err != nil {
		return fmt.Errorf("removing the snapshotMetadata pod %s/%s: %w", op.Namespace(""), op.PodName(), err)
	}
	return s.forgetListing(ctx, name, baseHandle, token)
}

// forgetListing removes the entry of a listing whose pod is gone.
func (s *Server) forgetListing(ctx context.Context, name, baseHandle, token string) error {
	_, err := s.updateSnapshot(ctx, name, func(v *v1alpha1.PavSnapshot) error {
		l := v.Status.MetadataListings
		for i := range l {
			if l[i].BaseHandle == baseHandle && l[i].Pod.Token == token {
				v.Status.MetadataListings = append(l[:i:i], l[i+1:]...)
				return nil
			}
		}
		return errNoChange
	})
	if grpcerr.Code(err) == codes.NotFound {
		return nil // the record went, and the entry with it
	}
	return err
}

// removeMetadataPods removes the pods of a snapshot's listings (DeleteSnapshot,
// before the record goes).
func (s *Server) removeMetadataPods(ctx context.Context, provisioner string, v *v1alpha1.PavSnapshot) error {
	for i := range v.Status.MetadataListings {
		e := &v.Status.MetadataListings[i]
		op := metadataOp(provisioner, v.Name, e, corev1.PodTemplateSpec{})
		if err := s.Pods.Delete(ctx, op); err != nil {
			return fmt.Errorf("removing the snapshotMetadata pod %s/%s of snapshot %s: %w", e.Pod.Namespace, e.Pod.Name, v.Spec.SnapshotName, err)
		}
	}
	return nil
}

// SweepMetadataListings runs until ctx ends: every metadataSweepInterval it
// drops the results nobody used for metadataResultTTL, and removes the pods
// (then the entries) of recorded listings that no call of this process runs
// and that were started more than metadataResultTTL ago: those of a process
// that died, which no client came back for.
func (s *Server) SweepMetadataListings(ctx context.Context) {
	t := time.NewTicker(metadataSweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sweepMetadataListings(ctx, time.Now())
	}
}

func (s *Server) sweepMetadataListings(ctx context.Context, now time.Time) {
	m := &s.metadata
	running := map[string]bool{}
	m.mu.Lock()
	for k, l := range m.listings {
		select {
		case <-l.done:
			if now.Sub(l.used) >= metadataResultTTL {
				delete(m.listings, k)
			}
		default:
			running[k] = true
		}
	}
	m.mu.Unlock()
	if s.Snapshots == nil {
		return
	}
	all, err := s.Snapshots.List()
	if err != nil {
		return
	}
	logger := klog.FromContext(ctx)
	for _, v := range all {
		for i := range v.Status.MetadataListings {
			e := v.Status.MetadataListings[i]
			if running[listingKey(v.Name, e.BaseHandle)] || now.Sub(e.Started.Time) < metadataResultTTL {
				continue
			}
			op := metadataOp(s.Source.Name(), v.Name, &e, corev1.PodTemplateSpec{})
			logger.Info("Removing a listing of a snapshot's blocks that nobody asked for again", "snapshot", v.Status.Handle, "pod", klog.KRef(e.Pod.Namespace, e.Pod.Name))
			if err := s.removeListing(ctx, op, v.Spec.SnapshotName, e.BaseHandle, e.Pod.Token); err != nil {
				logger.Error(err, "Could not remove an unclaimed listing; the next sweep tries again", "snapshot", v.Status.Handle)
			}
		}
	}
}

// snapshotEvent puts an event on the snapshot's VolumeSnapshot, when
// csi-snapshotter's --extra-create-metadata named it: where the backup
// application's user looks.
func (s *Server) snapshotEvent(v *v1alpha1.PavSnapshot, eventtype, reason, msg string) {
	ns, name, ok := strings.Cut(v.Spec.VolumeSnapshot, "/")
	if s.Recorder == nil || !ok {
		return
	}
	s.Recorder.Event(&corev1.ObjectReference{APIVersion: "snapshot.storage.k8s.io/v1", Kind: "VolumeSnapshot", Namespace: ns, Name: name},
		eventtype, reason, msg)
}
