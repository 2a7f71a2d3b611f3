package controllerserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

// metadataSpec is a provisioner that takes snapshots and lists their blocks
// with a pod that echoes its context.
var metadataSpec = snapSpec(plainCreation, fmt.Sprintf(pod, "snap")) +
	"  snapshotMetadata: " + fmt.Sprintf(pod, "list {{ snapshot.handle }} {{ snapshot.capacity }} {{ snapshot.volume.handle }} {{ baseSnapshot.handle if baseSnapshot else '-' }} {{ startingOffset }} {{ params.kind }}") + "\n"

// metadataClient serves s's SnapshotMetadata service on a unix socket, as
// the driver does, and returns a client of it.
func metadataClient(t *testing.T, s *Server) csi.SnapshotMetadataClient {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "csi.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterSnapshotMetadataServer(srv, s.SnapshotMetadataServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return csi.NewSnapshotMetadataClient(conn)
}

// stream is what one call received: each message's ranges, the type and
// capacity of every message, and the error that ended it (nil: io.EOF).
type stream struct {
	pages      [][]string // "OFFSET+LENGTH"
	types      []csi.BlockMetadataType
	capacities []int64
	err        error
}

func (s stream) ranges() string {
	var all []string
	for _, p := range s.pages {
		all = append(all, p...)
	}
	return strings.Join(all, " ")
}

type recv[T any] interface{ Recv() (T, error) }

func collect[T interface {
	GetBlockMetadataType() csi.BlockMetadataType
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csi.BlockMetadata
}](st recv[T], err error) stream {
	var out stream
	if err != nil {
		out.err = err
		return out
	}
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			out.err = err
			return out
		}
		var page []string
		for _, b := range m.GetBlockMetadata() {
			page = append(page, fmt.Sprintf("%d+%d", b.ByteOffset, b.SizeBytes))
		}
		out.pages = append(out.pages, page)
		out.types = append(out.types, m.GetBlockMetadataType())
		out.capacities = append(out.capacities, m.GetVolumeCapacityBytes())
	}
}

func allocated(t *testing.T, c csi.SnapshotMetadataClient, id string, offset int64, max int32) stream {
	t.Helper()
	st, err := c.GetMetadataAllocated(context.Background(), &csi.GetMetadataAllocatedRequest{SnapshotId: id, StartingOffset: offset, MaxResults: max})
	return collect(st, err)
}

func delta(t *testing.T, c csi.SnapshotMetadataClient, base, target string, offset int64, max int32) stream {
	t.Helper()
	st, err := c.GetMetadataDelta(context.Background(), &csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target, StartingOffset: offset, MaxResults: max})
	return collect(st, err)
}

// metadataFixture: volumes v1 and v2, snapshots s1 and s2 of v1 and o1 of v2.
func metadataFixture(t *testing.T, spec string, answer func(podrunner.Operation) (*podrunner.Result, error)) (*cluster, *fakeRunner, *Server) {
	t.Helper()
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseSnapshotMetadata: answer}}
	s := c.server(prov(t, spec), runner)
	newVolume(t, s, "v1")
	newVolume(t, s, "v2")
	for _, sn := range []struct{ name, volume string }{{"s1", "v1"}, {"s2", "v1"}, {"o1", "v2"}} {
		if _, err := s.CreateSnapshot(context.Background(), snapshotRequest(sn.name, sn.volume)); err != nil {
			t.Fatal(err)
		}
	}
	return c, runner, s
}

// metadataPods counts the snapshotMetadata pods created.
func (f *fakeRunner) metadataPods() int {
	n := 0
	for _, ph := range f.phases() {
		if ph == string(v1alpha1.PhaseSnapshotMetadata) {
			n++
		}
	}
	return n
}

func TestGetMetadataAllocated(t *testing.T) {
	const gib = 1 << 30
	blocks := "0 4096\n8192 4096\n1048576 4096\n1073737728 4096\n"
	_, runner, s := metadataFixture(t, metadataSpec, files(map[string]string{"blocks": blocks}))
	c := metadataClient(t, s)

	got := allocated(t, c, "s1", 0, 3)
	if got.err != nil {
		t.Fatal(got.err)
	}
	if want := "0+4096 8192+4096 1048576+4096 | 1073737728+4096"; strings.Join([]string{strings.Join(got.pages[0], " "), strings.Join(got.pages[1], " ")}, " | ") != want || len(got.pages) != 2 {
		t.Errorf("pages %v, want %s", got.pages, want)
	}
	for i := range got.types {
		if got.types[i] != csi.BlockMetadataType_FIXED_LENGTH || got.capacities[i] != gib {
			t.Errorf("message %d: %s, capacity %d", i, got.types[i], got.capacities[i])
		}
	}
	if cmd := runner.command(v1alpha1.PhaseSnapshotMetadata); cmd != "sh -c list s1 1073741824 v1 - 0 fast" {
		t.Errorf("pod command %q", cmd)
	}
	// Resumed at a later offset, with the default page size: the same
	// listing, no new pod; a range that spans the offset is sent whole.
	for _, tc := range []struct {
		offset int64
		want   string
	}{
		{4096, "8192+4096 1048576+4096 1073737728+4096"},
		{10000, "8192+4096 1048576+4096 1073737728+4096"},
		{12288, "1048576+4096 1073737728+4096"},
		{gib, ""},
	} {
		got := allocated(t, c, "s1", tc.offset, 0)
		if got.err != nil || got.ranges() != tc.want || len(got.pages) != 1 || got.capacities[0] != gib {
			t.Errorf("from %d: %v (%d messages, err %v), want %q", tc.offset, got.ranges(), len(got.pages), got.err, tc.want)
		}
	}
	if n := runner.metadataPods(); n != 1 {
		t.Errorf("%d snapshotMetadata pods, want 1", n)
	}
	if n := runner.live(); n != 0 {
		t.Errorf("%d pods left", n)
	}
	// Requests that need no pod.
	for _, tc := range []struct {
		name   string
		req    *csi.GetMetadataAllocatedRequest
		code   codes.Code
		substr string
	}{
		{"no snapshot", &csi.GetMetadataAllocatedRequest{}, codes.InvalidArgument, "snapshot_id is required"},
		{"unknown snapshot", &csi.GetMetadataAllocatedRequest{SnapshotId: "nope"}, codes.NotFound, "snapshot nope does not exist"},
		{"negative offset", &csi.GetMetadataAllocatedRequest{SnapshotId: "s1", StartingOffset: -1}, codes.OutOfRange, "must not be negative"},
		{"beyond the capacity", &csi.GetMetadataAllocatedRequest{SnapshotId: "s1", StartingOffset: gib + 1}, codes.OutOfRange, "beyond the snapshot's capacity of 1073741824 bytes"},
		{"negative max_results", &csi.GetMetadataAllocatedRequest{SnapshotId: "s1", MaxResults: -1}, codes.InvalidArgument, "max_results"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := c.GetMetadataAllocated(context.Background(), tc.req)
			got := collect(st, err)
			if status.Code(got.err) != tc.code || !strings.Contains(got.err.Error(), tc.substr) {
				t.Errorf("error %v, want %s with %q", got.err, tc.code, tc.substr)
			}
		})
	}
	if n := runner.metadataPods(); n != 1 {
		t.Errorf("%d snapshotMetadata pods, want 1", n)
	}
}

func TestGetMetadataDelta(t *testing.T) {
	cl, runner, s := metadataFixture(t, metadataSpec, files(map[string]string{"blocks": "4096 4096\n65536 131072\n"}))
	c := metadataClient(t, s)
	got := delta(t, c, "s1", "s2", 0, 0)
	if got.err != nil || got.ranges() != "4096+4096 65536+131072" || got.types[0] != csi.BlockMetadataType_VARIABLE_LENGTH {
		t.Fatalf("delta %v %v (%v)", got.ranges(), got.types, got.err)
	}
	if cmd := runner.command(v1alpha1.PhaseSnapshotMetadata); cmd != "sh -c list s2 1073741824 v1 s1 0 fast" {
		t.Errorf("pod command %q", cmd)
	}
	for _, tc := range []struct {
		name, base, target string
		code               codes.Code
		substr             string
	}{
		{"a base of another volume", "o1", "s2", codes.InvalidArgument, "base snapshot o1 is of volume v2 and target snapshot s2 of volume v1"},
		{"unknown base", "nope", "s2", codes.NotFound, "base snapshot nope does not exist"},
		{"unknown target", "s1", "nope", codes.NotFound, "target snapshot nope does not exist"},
		{"no base", "", "s2", codes.InvalidArgument, "base_snapshot_id is required"},
		{"no target", "s1", "", codes.InvalidArgument, "target_snapshot_id is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := delta(t, c, tc.base, tc.target, 0, 0)
			if status.Code(got.err) != tc.code || !strings.Contains(got.err.Error(), tc.substr) {
				t.Errorf("error %v, want %s with %q", got.err, tc.code, tc.substr)
			}
		})
	}
	// A snapshot against itself: nothing changed, no pod.
	if got := delta(t, c, "s2", "s2", 0, 0); got.err != nil || got.ranges() != "" || len(got.pages) != 1 {
		t.Errorf("s2 against itself: %v", got)
	}
	if n := runner.metadataPods(); n != 1 {
		t.Errorf("%d snapshotMetadata pods, want 1", n)
	}
	for _, v := range cl.snapshots() {
		if len(v.Status.MetadataListings) > 0 {
			t.Errorf("snapshot %s keeps listings %+v", v.Spec.SnapshotName, v.Status.MetadataListings)
		}
	}
}

// A pod's bad /pav/blocks fails the call with the line and the fix, and
// leaves nothing; the next call runs a new pod.
func TestMetadataBadOutput(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(podrunner.Operation) (*podrunner.Result, error)
		code   codes.Code
		substr string
	}{
		{"unsorted", files(map[string]string{"blocks": "8192 4096\n0 4096\n"}), codes.Internal,
			`/pav/blocks line 2 ("0 4096"): not sorted: it starts before the range above it (8192 4096): write one range per line`},
		{"beyond the capacity", files(map[string]string{"blocks": "1073741824 4096\n"}), codes.Internal, "beyond the snapshot's capacity of 1073741824 bytes"},
		{"no /pav/blocks", files(map[string]string{}), codes.Internal, "wrote no /pav/blocks"},
		{"the pod fails", podFails("no backing file"), codes.Internal, "no backing file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, runner, s := metadataFixture(t, metadataSpec, tc.answer)
			c := metadataClient(t, s)
			for i := range 2 {
				got := allocated(t, c, "s1", 0, 0)
				if status.Code(got.err) != tc.code || !strings.Contains(got.err.Error(), tc.substr) {
					t.Fatalf("call %d: error %v, want %s with %q", i, got.err, tc.code, tc.substr)
				}
			}
			if n := runner.metadataPods(); n != 2 {
				t.Errorf("%d pods for two calls, want 2 (a failure is not kept)", n)
			}
			if n := runner.live(); n != 0 {
				t.Errorf("%d pods left", n)
			}
			for _, v := range cl.snapshots() {
				if len(v.Status.MetadataListings) > 0 {
					t.Errorf("listings left %+v", v.Status.MetadataListings)
				}
			}
		})
	}
}

func TestMetadataNeedsTheSpec(t *testing.T) {
	_, _, s := metadataFixture(t, snapSpec(plainCreation, fmt.Sprintf(pod, "snap")), nil)
	got := allocated(t, metadataClient(t, s), "s1", 0, 0)
	if status.Code(got.err) != codes.FailedPrecondition || !strings.Contains(got.err.Error(), "add spec.snapshotMetadata") {
		t.Errorf("error %v", got.err)
	}
}

// The pod is recorded in the snapshot's record before it runs; concurrent
// calls share it.
func TestMetadataRecordedAndShared(t *testing.T) {
	release := make(chan struct{})
	var cl *cluster
	var seen []v1alpha1.MetadataListing
	var mu sync.Mutex
	cl, runner, s := metadataFixture(t, metadataSpec, func(op podrunner.Operation) (*podrunner.Result, error) {
		for _, v := range cl.snapshots() {
			if v.Spec.SnapshotName == "s2" {
				mu.Lock()
				seen = v.Status.MetadataListings
				mu.Unlock()
			}
		}
		<-release
		return &podrunner.Result{Files: map[string]string{"blocks": "0 512\n"}}, nil
	})
	c := metadataClient(t, s)
	var wg sync.WaitGroup
	results := make([]stream, 3)
	for i := range results {
		wg.Go(func() { results[i] = delta(t, c, "s1", "s2", 0, 0) })
	}
	time.Sleep(200 * time.Millisecond)
	close(release)
	wg.Wait()
	for i, r := range results {
		if r.err != nil || r.ranges() != "0+512" {
			t.Errorf("call %d: %v %v", i, r.ranges(), r.err)
		}
	}
	if n := runner.metadataPods(); n != 1 {
		t.Errorf("%d pods for three calls at once, want 1", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0].BaseHandle != "s1" || seen[0].Pod.Token == "" || seen[0].Pod.UID == "" || seen[0].Pod.Phase != v1alpha1.PhaseSnapshotMetadata {
		t.Errorf("the record held %+v while the pod ran, want its entry with token and UID", seen)
	}
}

// A controller plugin that restarts while the pod runs: the retried call
// adopts the recorded pod (no second pod); one nobody asks for again is
// removed by the sweep; DeleteSnapshot removes those under way.
func TestMetadataAcrossRestarts(t *testing.T) {
	running := true
	var mu sync.Mutex
	answer := func(op podrunner.Operation) (*podrunner.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		if running {
			return nil, context.DeadlineExceeded // still running
		}
		return &podrunner.Result{Files: map[string]string{"blocks": "0 4096\n"}}, nil
	}
	cl, runner, s := metadataFixture(t, metadataSpec, answer)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	st, err := metadataClient(t, s).GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: "s1"})
	if got := collect(st, err); got.err == nil {
		t.Fatal("a call whose pod is still running ended")
	}
	waitFor(t, func() bool { return len(snapshotNamed(cl, "s1").Status.MetadataListings) == 1 })

	// A new process; the pod has finished meanwhile.
	mu.Lock()
	running = false
	mu.Unlock()
	pv, err := s.Source.Get(false)
	if err != nil {
		t.Fatal(err)
	}
	s2 := cl.server(pv, runner)
	if got := allocated(t, metadataClient(t, s2), "s1", 0, 0); got.err != nil || got.ranges() != "0+4096" {
		t.Fatalf("after the restart: %v %v", got.ranges(), got.err)
	}
	if n := runner.metadataPods(); n != 1 {
		t.Errorf("%d pods, want the one adopted", n)
	}
	if n := len(snapshotNamed(cl, "s1").Status.MetadataListings); n != 0 || runner.live() != 0 {
		t.Errorf("%d listings, %d pods left", n, runner.live())
	}

	// Unclaimed: recorded by a process that died, never asked for again.
	mu.Lock()
	running = true
	mu.Unlock()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	dst, err := metadataClient(t, s2).GetMetadataDelta(ctx2, &csi.GetMetadataDeltaRequest{BaseSnapshotId: "s1", TargetSnapshotId: "s2"})
	_ = collect(dst, err)
	waitFor(t, func() bool { return len(snapshotNamed(cl, "s2").Status.MetadataListings) == 1 })
	s3 := cl.server(pv, runner)
	s3.sweepMetadataListings(context.Background(), time.Now())
	if n := len(snapshotNamed(cl, "s2").Status.MetadataListings); n != 1 {
		t.Fatalf("a fresh listing was swept (%d left)", n)
	}
	s3.sweepMetadataListings(context.Background(), time.Now().Add(metadataResultTTL+time.Second))
	if n := len(snapshotNamed(cl, "s2").Status.MetadataListings); n != 0 || runner.live() != 0 {
		t.Errorf("after the sweep: %d listings, %d pods", n, runner.live())
	}

	// Under way when the snapshot is deleted: the pod goes with it.
	ctx3, cancel3 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel3()
	st, err = metadataClient(t, s3).GetMetadataAllocated(ctx3, &csi.GetMetadataAllocatedRequest{SnapshotId: "s2"})
	_ = collect(st, err)
	waitFor(t, func() bool { return runner.live() == 1 })
	if _, err := s3.DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: "s2"}); err != nil {
		t.Fatal(err)
	}
	if runner.live() != 0 {
		t.Errorf("%d pods left after DeleteSnapshot", runner.live())
	}
}

func snapshotNamed(c *cluster, name string) *v1alpha1.PavSnapshot {
	for _, v := range c.snapshots() {
		if v.Spec.SnapshotName == name {
			return v
		}
	}
	return &v1alpha1.PavSnapshot{}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
