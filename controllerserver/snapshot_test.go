package controllerserver

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

// snapSpec is a provisioner that takes snapshots; creation is what the
// volumeCreation object says (with or without contentSources), and the
// snapshot pods echo their context in their command.
func snapSpec(creation, snapshotCreation string) string {
	return "  provisioningModes: [Dynamic]\n  volumeCreation: " + creation + "\n  volumeDeletion: " + fmt.Sprintf(pod, "rm") +
		"\n  volumeStaging: " + fmt.Sprintf(pod, "true") +
		"\n  snapshotCreation: " + snapshotCreation +
		"\n  snapshotDeletion: " + fmt.Sprintf(pod, "rm {{ handle }} {{ capacity or '-' }} {{ volume.handle }} {{ snapshotName }}") + "\n"
}

var (
	plainCreation   = fmt.Sprintf(pod, "create {{ source.kind ~ ':' ~ source.handle ~ ':' ~ source.capacity ~ ':' ~ (source.volumeHandle or '-') if source else 'empty' }}")
	snapshotPod     = fmt.Sprintf(pod, "snap {{ snapshotName }} {{ defaultHandle }} {{ volume.handle }} {{ volume.capacity }} {{ volume.volumeMode }} {{ volume.params.color }} {{ params.kind }}")
	volumeAnswer    = files(map[string]string{"capacity": "1Gi"})
	snapshotRequest = func(name, source string) *csi.CreateSnapshotRequest {
		return &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: source, Parameters: map[string]string{"kind": "fast",
			"csi.storage.k8s.io/volumesnapshot/name": "daily", "csi.storage.k8s.io/volumesnapshot/namespace": "team-a"}}
	}
)

// snapshots is every PavSnapshot, read from the API.
func (c *cluster) snapshots() []*v1alpha1.PavSnapshot {
	c.t.Helper()
	l, err := c.records.Resource(v1alpha1.SnapshotGroupVersionResource).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	var out []*v1alpha1.PavSnapshot
	for i := range l.Items {
		v := &v1alpha1.PavSnapshot{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(l.Items[i].Object, v); err != nil {
			c.t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

// newVolume creates volume name (handle = name, 1 GiB).
func newVolume(t *testing.T, s *Server, name string) {
	t.Helper()
	if _, err := s.CreateVolume(context.Background(), createReq(name, 1, 0)); err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
}

func TestCreateSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name         string
		snapshotSpec string // spec.snapshotCreation
		answer       func(podrunner.Operation) (*podrunner.Result, error)
		req          *csi.CreateSnapshotRequest
		wantCode     codes.Code
		wantErr      string
		wantHandle   string
		wantSize     int64
		wantPod      string // the creation pod's command; "" = no pod
	}{
		{name: "pod writes handle and size", snapshotSpec: snapshotPod, answer: files(map[string]string{"handle": "backend-snap", "capacity": "512Mi"}),
			req: snapshotRequest("s1", "v1"), wantHandle: "backend-snap", wantSize: 512 << 20,
			wantPod: "sh -c snap s1 s1 v1 1073741824 Filesystem blue fast"},
		{name: "defaults: the CSI name and the volume's capacity", snapshotSpec: snapshotPod,
			req: snapshotRequest("s1", "v1"), wantHandle: "s1", wantSize: 1 << 30, wantPod: "sh -c snap s1 s1 v1 1073741824 Filesystem blue fast"},
		{name: "handle from the spec", snapshotSpec: `{handle: "{{ volume.handle }}@{{ snapshotName }}", podTemplate: {spec: {containers: [{name: c, image: busybox}]}}}`,
			req: snapshotRequest("s1", "v1"), wantHandle: "v1@s1", wantSize: 1 << 30, wantPod: " "},
		{name: "no pod at all", snapshotSpec: `{handle: "cow-{{ snapshotName }}"}`,
			req: snapshotRequest("s1", "v1"), wantHandle: "cow-s1", wantSize: 1 << 30},
		{name: "/pav/handle wins over the spec", snapshotSpec: `{handle: "spec", podTemplate: {spec: {containers: [{name: c, image: busybox}]}}}`,
			answer: files(map[string]string{"handle": "pod"}), req: snapshotRequest("s1", "v1"), wantHandle: "pod", wantSize: 1 << 30, wantPod: " "},
		{name: "no name", snapshotSpec: snapshotPod, req: snapshotRequest("", "v1"), wantCode: codes.InvalidArgument, wantErr: "snapshot name is required"},
		{name: "no source", snapshotSpec: snapshotPod, req: snapshotRequest("s1", ""), wantCode: codes.InvalidArgument, wantErr: "source volume id is required"},
		{name: "unknown source", snapshotSpec: snapshotPod, req: snapshotRequest("s1", "nope"), wantCode: codes.NotFound, wantErr: "source volume nope does not exist"},
		{name: "invalid /pav/capacity: reverted", snapshotSpec: snapshotPod, answer: files(map[string]string{"capacity": "lots"}),
			req: snapshotRequest("s1", "v1"), wantCode: codes.Internal, wantErr: "invalid /pav/capacity", wantPod: "sh -c snap s1 s1 v1 1073741824 Filesystem blue fast"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prov(t, snapSpec(plainCreation, tc.snapshotSpec))
			c := newCluster(t)
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseSnapshotCreation: tc.answer}}
			s := c.server(p, runner)
			newVolume(t, s, "v1")
			resp, err := s.CreateSnapshot(context.Background(), tc.req)
			if got := runner.command(v1alpha1.PhaseSnapshotCreation); got != tc.wantPod && !(tc.wantPod == " " && got == "") {
				t.Errorf("creation pod %q, want %q", got, tc.wantPod)
			}
			if tc.wantCode != codes.OK {
				if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %s with %q", err, tc.wantCode, tc.wantErr)
				}
				if n := len(c.snapshots()); n != 0 {
					t.Errorf("%d records left after a failure", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			sn := resp.Snapshot
			if sn.SnapshotId != tc.wantHandle || sn.SizeBytes != tc.wantSize || sn.SourceVolumeId != "v1" || !sn.ReadyToUse || sn.CreationTime == nil {
				t.Fatalf("snapshot %+v", sn)
			}
			recs := c.snapshots()
			if len(recs) != 1 || recs[0].Status.Phase != v1alpha1.SnapshotCreated || recs[0].Spec.VolumeSnapshot != "team-a/daily" ||
				recs[0].Spec.Params["kind"] != "fast" || len(recs[0].Spec.Params) != 1 || recs[0].Spec.SourceVolumeRecord != "v1" {
				t.Fatalf("records %+v", recs)
			}
			if runner.live() != 0 {
				t.Errorf("%d pods left", runner.live())
			}
		})
	}
}

func TestSnapshotsUnsupported(t *testing.T) {
	p := prov(t, "  provisioningModes: [Dynamic]\n  volumeCreation: "+plainCreation+"\n  volumeStaging: "+fmt.Sprintf(pod, "true")+"\n")
	c := newCluster(t)
	s := c.server(p, &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer}})
	newVolume(t, s, "v1")
	_, err := s.CreateSnapshot(context.Background(), snapshotRequest("s1", "v1"))
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "spec.snapshotCreation") {
		t.Fatalf("error %v", err)
	}
	caps, err := s.ControllerGetCapabilities(context.Background(), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil || len(caps.Capabilities) != 1 {
		t.Fatalf("capabilities %v, %v: want CREATE_DELETE_VOLUME only", caps, err)
	}
}

func TestSnapshotCapabilities(t *testing.T) {
	for _, tc := range []struct {
		creation string
		want     []csi.ControllerServiceCapability_RPC_Type
	}{
		{plainCreation, []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
			csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT, csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS, csi.ControllerServiceCapability_RPC_GET_SNAPSHOT}},
		{`{contentSources: [Volume], podTemplate: {spec: {containers: [{name: c, image: busybox}]}}}`, []csi.ControllerServiceCapability_RPC_Type{
			csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME, csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
			csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS, csi.ControllerServiceCapability_RPC_GET_SNAPSHOT, csi.ControllerServiceCapability_RPC_CLONE_VOLUME}},
	} {
		p := prov(t, snapSpec(tc.creation, snapshotPod))
		resp, err := newCluster(t).server(p, &fakeRunner{}).ControllerGetCapabilities(context.Background(), &csi.ControllerGetCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var got []csi.ControllerServiceCapability_RPC_Type
		for _, c := range resp.Capabilities {
			got = append(got, c.GetRpc().GetType())
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: capabilities %v, want %v", tc.creation, got, tc.want)
		}
	}
}

// TestCreateSnapshotIdempotent: the same name and source give the same
// snapshot (one pod); the same name of another volume is ALREADY_EXISTS; a
// record of the name that another provisioner owns (or forged) is never used.
func TestCreateSnapshotIdempotent(t *testing.T) {
	p := prov(t, snapSpec(plainCreation, snapshotPod))
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseSnapshotCreation: files(map[string]string{"handle": "h1"})}}
	s := c.server(p, runner)
	newVolume(t, s, "v1")
	newVolume(t, s, "v2")
	first, err := s.CreateSnapshot(context.Background(), snapshotRequest("s1", "v1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.server(p, runner).CreateSnapshot(context.Background(), snapshotRequest("s1", "v1"))
	if err != nil || again.Snapshot.SnapshotId != "h1" || !again.Snapshot.CreationTime.AsTime().Equal(first.Snapshot.CreationTime.AsTime()) {
		t.Fatalf("repeat: %v, %v", again, err)
	}
	if got := strings.Join(runner.phases(), " "); got != "creation creation snapshotcreation" {
		t.Fatalf("pods %q", got)
	}
	if _, err := s.CreateSnapshot(context.Background(), snapshotRequest("s1", "v2")); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("other source: %v", err)
	}
	forged := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": v1alpha1.SnapshotKind,
		"metadata": map[string]any{"name": "s2", "labels": map[string]any{v1alpha1.LabelVolumeProvisioner: "other"}},
		"spec":     map[string]any{"provisioner": "other", "snapshotName": "s2", "sourceVolumeID": "v1"},
		"status":   map[string]any{"phase": "Created", "handle": "h1"},
	}}
	if _, err := c.records.Resource(v1alpha1.SnapshotGroupVersionResource).Create(context.Background(), forged, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateSnapshot(context.Background(), snapshotRequest("s2", "v1")); status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), `provisioner "other"`) {
		t.Fatalf("another provisioner's record: %v", err)
	}
}

// TestSnapshotRestartBetweenPodAndRecord: the write that records Created fails
// (a restart there is the same): the pod stays, and the retry adopts it by its
// recorded UID; the snapshot is cut once.
func TestSnapshotRestartBetweenPodAndRecord(t *testing.T) {
	p := prov(t, snapSpec(plainCreation, snapshotPod))
	c := newCluster(t)
	failed := false
	c.records.PrependReactor("update", v1alpha1.SnapshotResource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		if ph, _, _ := unstructuredPhase(a); ph == string(v1alpha1.SnapshotCreated) && !failed {
			failed = true
			return true, nil, apierrors.NewServiceUnavailable("etcd leader changed")
		}
		return false, nil, nil
	})
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseSnapshotCreation: files(map[string]string{"handle": "h"})}}
	newVolume(t, c.server(p, runner), "v1")
	if _, err := c.server(p, runner).CreateSnapshot(context.Background(), snapshotRequest("s1", "v1")); status.Code(err) != codes.Unavailable {
		t.Fatalf("first call: %v, want Unavailable", err)
	}
	if runner.live() != 1 {
		t.Fatal("the finished pod was removed before its outcome was recorded")
	}
	resp, err := c.server(p, runner).CreateSnapshot(context.Background(), snapshotRequest("s1", "v1"))
	if err != nil || resp.Snapshot.SnapshotId != "h" {
		t.Fatalf("retry: %v, %v", resp, err)
	}
	if runner.created != 2 || runner.live() != 0 { // the volume's pod and the snapshot's
		t.Fatalf("%d pods created, %d left; want 2, 0", runner.created, runner.live())
	}
	if last := runner.ops[len(runner.ops)-1]; last.UID == "" {
		t.Error("the retry did not adopt the pod by its recorded UID")
	}
}

// TestSnapshotPodFailure: a failed creation pod is reverted by the
// snapshotDeletion pod; if that fails too the record stays (ABORTED) and the
// retry finishes the revert and returns the creation's failure.
func TestSnapshotPodFailure(t *testing.T) {
	p := prov(t, snapSpec(plainCreation, snapshotPod))
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseSnapshotCreation: podFails("no space for snapshots"),
		v1alpha1.PhaseSnapshotDeletion: podFails("backend down")}}
	newVolume(t, c.server(p, runner), "v1")
	if _, err := c.server(p, runner).CreateSnapshot(context.Background(), snapshotRequest("s1", "v1")); status.Code(err) != codes.Aborted {
		t.Fatalf("first call: %v", err)
	}
	if recs := c.snapshots(); len(recs) != 1 || recs[0].Status.Phase != v1alpha1.SnapshotDeleting || recs[0].Status.Reason != v1alpha1.ReasonCreationFailed {
		t.Fatalf("records %+v", recs)
	}
	runner.answers[v1alpha1.PhaseSnapshotDeletion] = nil
	_, err := c.server(p, runner).CreateSnapshot(context.Background(), snapshotRequest("s1", "v1"))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "no space for snapshots") {
		t.Fatalf("retry: %v, want the creation's failure", err)
	}
	if got := strings.Join(runner.phases(), " "); got != "creation snapshotcreation snapshotdeletion snapshotdeletion" {
		t.Fatalf("pods %q", got)
	}
	if got := runner.command(v1alpha1.PhaseSnapshotDeletion); got != "sh -c rm s1 - v1 s1" {
		t.Errorf("revert's deletion pod %q: the default handle, no size", got)
	}
	if len(c.snapshots()) != 0 || runner.live() != 0 {
		t.Fatalf("left: %d records, %d pods", len(c.snapshots()), runner.live())
	}
}

// TestSnapshotHandleCollision: a creation pod that reports another snapshot's
// handle gets no record and no deletion pod (it would delete the other).
func TestSnapshotHandleCollision(t *testing.T) {
	p := prov(t, snapSpec(plainCreation, snapshotPod))
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseSnapshotCreation: files(map[string]string{"handle": "shared"})}}
	s := c.server(p, runner)
	newVolume(t, s, "v1")
	if _, err := s.CreateSnapshot(context.Background(), snapshotRequest("s1", "v1")); err != nil {
		t.Fatal(err)
	}
	_, err := s.CreateSnapshot(context.Background(), snapshotRequest("s2", "v1"))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `handle "shared" is already the handle of snapshot s1`) {
		t.Fatalf("error %v", err)
	}
	if got := strings.Join(runner.phases(), " "); got != "creation snapshotcreation snapshotcreation" {
		t.Fatalf("pods %q: no deletion pod may run", got)
	}
	if recs := c.snapshots(); len(recs) != 1 || recs[0].Spec.SnapshotName != "s1" || runner.live() != 0 {
		t.Fatalf("records %d, pods %d", len(recs), runner.live())
	}
}

// TestDeleteSnapshot: the deletion pod gets the snapshot's handle and size and
// the source volume's data from the snapshot's record, even once the volume is
// gone; unknown ids are OK.
func TestDeleteSnapshot(t *testing.T) {
	p := prov(t, snapSpec(plainCreation, snapshotPod))
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseSnapshotCreation: files(map[string]string{"handle": "h1", "capacity": "100"})}}
	s := c.server(p, runner)
	newVolume(t, s, "v1")
	if _, err := s.CreateSnapshot(context.Background(), snapshotRequest("s1", "v1")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: "v1"}); err != nil {
		t.Fatalf("deleting a volume with a snapshot: %v", err)
	}
	for _, tc := range []struct {
		id       string
		wantCode codes.Code
	}{{"", codes.InvalidArgument}, {"unknown", codes.OK}, {"h1", codes.OK}, {"h1", codes.OK}} {
		if _, err := c.server(p, runner).DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: tc.id}); status.Code(err) != tc.wantCode {
			t.Fatalf("DeleteSnapshot(%q): %v, want %s", tc.id, err, tc.wantCode)
		}
	}
	if got := runner.command(v1alpha1.PhaseSnapshotDeletion); got != "sh -c rm h1 100 v1 s1" {
		t.Errorf("deletion pod %q", got)
	}
	if got := strings.Join(runner.phases(), " "); got != "creation snapshotcreation deletion snapshotdeletion" {
		t.Fatalf("pods %q", got)
	}
	if len(c.snapshots()) != 0 || runner.live() != 0 {
		t.Fatalf("left: %d records, %d pods", len(c.snapshots()), runner.live())
	}
}

func TestListSnapshots(t *testing.T) {
	p := prov(t, snapSpec(plainCreation, snapshotPod))
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer}}
	s := c.server(p, runner)
	newVolume(t, s, "v1")
	newVolume(t, s, "v2")
	for i, src := range []string{"v1", "v2", "v1", "v1", "v2"} {
		if _, err := s.CreateSnapshot(context.Background(), snapshotRequest(fmt.Sprintf("s%d", i), src)); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(r *csi.ListSnapshotsResponse) string {
		var out []string
		for _, e := range r.Entries {
			out = append(out, e.Snapshot.SnapshotId+"<"+e.Snapshot.SourceVolumeId)
		}
		return strings.Join(out, " ")
	}
	for _, tc := range []struct {
		name      string
		req       *csi.ListSnapshotsRequest
		want      string
		wantToken string
		wantCode  codes.Code
	}{
		{name: "all", req: &csi.ListSnapshotsRequest{}, want: "s0<v1 s1<v2 s2<v1 s3<v1 s4<v2"},
		{name: "by id", req: &csi.ListSnapshotsRequest{SnapshotId: "s3"}, want: "s3<v1"},
		{name: "unknown id", req: &csi.ListSnapshotsRequest{SnapshotId: "s9"}, want: ""},
		{name: "by source", req: &csi.ListSnapshotsRequest{SourceVolumeId: "v2"}, want: "s1<v2 s4<v2"},
		{name: "unknown source", req: &csi.ListSnapshotsRequest{SourceVolumeId: "v9"}, want: ""},
		{name: "id of another source", req: &csi.ListSnapshotsRequest{SnapshotId: "s3", SourceVolumeId: "v2"}, want: ""},
		{name: "first page", req: &csi.ListSnapshotsRequest{MaxEntries: 2}, want: "s0<v1 s1<v2", wantToken: "2"},
		{name: "middle page", req: &csi.ListSnapshotsRequest{MaxEntries: 2, StartingToken: "2"}, want: "s2<v1 s3<v1", wantToken: "4"},
		{name: "last page", req: &csi.ListSnapshotsRequest{MaxEntries: 2, StartingToken: "4"}, want: "s4<v2"},
		{name: "the rest", req: &csi.ListSnapshotsRequest{StartingToken: "2"}, want: "s2<v1 s3<v1 s4<v2"},
		{name: "filtered page", req: &csi.ListSnapshotsRequest{SourceVolumeId: "v1", MaxEntries: 2}, want: "s0<v1 s2<v1", wantToken: "2"},
		{name: "invalid token", req: &csi.ListSnapshotsRequest{StartingToken: "x"}, wantCode: codes.Aborted},
		{name: "token past the end", req: &csi.ListSnapshotsRequest{StartingToken: "6"}, wantCode: codes.Aborted},
		{name: "negative max", req: &csi.ListSnapshotsRequest{MaxEntries: -1}, wantCode: codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := s.ListSnapshots(context.Background(), tc.req)
			if status.Code(err) != tc.wantCode {
				t.Fatalf("error %v, want %s", err, tc.wantCode)
			}
			if err != nil {
				return
			}
			if got := ids(resp); got != tc.want || resp.NextToken != tc.wantToken {
				t.Fatalf("got %q (next %q), want %q (next %q)", got, resp.NextToken, tc.want, tc.wantToken)
			}
		})
	}
	// A deleted snapshot is gone from the list at once.
	if _, err := s.DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: "s0"}); err != nil {
		t.Fatal(err)
	}
	if resp, err := s.ListSnapshots(context.Background(), &csi.ListSnapshotsRequest{}); err != nil || ids(resp) != "s1<v2 s2<v1 s3<v1 s4<v2" {
		t.Fatalf("after delete: %v, %v", resp, err)
	}
}

// TestGetSnapshot: one created snapshot by its handle, from the records.
func TestGetSnapshot(t *testing.T) {
	p := prov(t, snapSpec(plainCreation, snapshotPod))
	c := newCluster(t)
	s := c.server(p, &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer}})
	newVolume(t, s, "v1")
	for _, name := range []string{"s0", "s1"} {
		if _, err := s.CreateSnapshot(context.Background(), snapshotRequest(name, "v1")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: "s0"}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id       string
		wantCode codes.Code
	}{
		{id: "s1"},
		{id: "", wantCode: codes.InvalidArgument},
		{id: "s0", wantCode: codes.NotFound}, // deleted
		{id: "s9", wantCode: codes.NotFound},
	} {
		resp, err := s.GetSnapshot(context.Background(), &csi.GetSnapshotRequest{SnapshotId: tc.id})
		if status.Code(err) != tc.wantCode {
			t.Fatalf("GetSnapshot(%q): %v, want %s", tc.id, err, tc.wantCode)
		}
		if err == nil && (resp.Snapshot.SnapshotId != tc.id || resp.Snapshot.SourceVolumeId != "v1" || !resp.Snapshot.ReadyToUse || resp.Snapshot.SizeBytes == 0) {
			t.Fatalf("GetSnapshot(%q) = %v", tc.id, resp.Snapshot)
		}
	}
}

// TestCreateVolumeFromSource: restores and clones, gated by
// spec.volumeCreation.contentSources; the creation pod sees `source`, the
// record keeps it, the response carries it back.
func TestCreateVolumeFromSource(t *testing.T) {
	snapSrc := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "snap-h"}}}
	volSrc := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "v1"}}}
	missingSnap := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "nope"}}}
	missingVol := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "nope"}}}
	withSources := func(srcs string) string {
		if srcs == "" {
			return plainCreation // the default: no sources
		}
		return fmt.Sprintf(`{contentSources: %s, podTemplate: {spec: {containers: [{name: c, image: busybox, command: [sh, -c, "create {{ source.kind ~ ':' ~ source.handle ~ ':' ~ source.capacity ~ ':' ~ (source.volumeHandle or '-') if source else 'empty' }}"]}]}}}`, srcs)
	}
	for _, tc := range []struct {
		name     string
		sources  string
		src      *csi.VolumeContentSource
		limit    int64
		wantCode codes.Code
		wantErr  string
		wantPod  string
	}{
		{name: "restore", sources: "[Snapshot]", src: snapSrc, wantPod: "create Snapshot:snap-h:536870912:v1"},
		{name: "clone", sources: "[Volume]", src: volSrc, wantPod: "create Volume:v1:1073741824:-"},
		{name: "both allowed, clone", sources: "[Snapshot, Volume]", src: volSrc, wantPod: "create Volume:v1:1073741824:-"},
		{name: "restore not allowed", sources: "[Volume]", src: snapSrc, wantCode: codes.InvalidArgument, wantErr: "spec.volumeCreation.contentSources"},
		{name: "clone not allowed", sources: "[Snapshot]", src: volSrc, wantCode: codes.InvalidArgument, wantErr: "spec.volumeCreation.contentSources"},
		{name: "no sources allowed", sources: "", src: volSrc, wantCode: codes.InvalidArgument, wantErr: "spec.volumeCreation.contentSources"},
		{name: "unknown snapshot", sources: "[Snapshot]", src: missingSnap, wantCode: codes.NotFound, wantErr: "source snapshot nope"},
		{name: "unknown volume", sources: "[Volume]", src: missingVol, wantCode: codes.NotFound, wantErr: "source volume nope"},
		{name: "source above the limit", sources: "[Volume]", src: volSrc, limit: 1 << 20, wantCode: codes.OutOfRange, wantErr: "above the requested limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prov(t, snapSpec(withSources(tc.sources), snapshotPod))
			c := newCluster(t)
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer,
				v1alpha1.PhaseSnapshotCreation: files(map[string]string{"handle": "snap-h", "capacity": "512Mi"})}}
			s := c.server(p, runner)
			newVolume(t, s, "v1")
			if _, err := s.CreateSnapshot(context.Background(), snapshotRequest("s1", "v1")); err != nil {
				t.Fatal(err)
			}
			req := createReq("v2", 1, tc.limit)
			req.VolumeContentSource = tc.src
			resp, err := s.CreateVolume(context.Background(), req)
			if tc.wantCode != codes.OK {
				if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %s with %q", err, tc.wantCode, tc.wantErr)
				}
				if c.volume("v2") != nil {
					t.Error("a refused volume was recorded")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if resp.Volume.ContentSource == nil || fmt.Sprint(resp.Volume.ContentSource) != fmt.Sprint(tc.src) {
				t.Errorf("content_source %v, want %v", resp.Volume.ContentSource, tc.src)
			}
			var cmds []string
			for _, op := range runner.ops {
				if op.Phase == v1alpha1.PhaseCreation && op.VolumeKey == "v2" {
					cmds = append(cmds, strings.Join(op.Template.Spec.Containers[0].Command[2:], " "))
				}
			}
			if len(cmds) == 0 || cmds[0] != tc.wantPod {
				t.Errorf("creation pod %q, want %q", cmds, tc.wantPod)
			}
			if v := c.volume("v2"); v == nil || v.Spec.Source == nil || v.Spec.Source.Handle != requestedSource(tc.src).Handle {
				t.Fatalf("record %+v", v)
			}
			// A retry with another source (or none) is another volume.
			again := createReq("v2", 1, tc.limit)
			if _, err := s.CreateVolume(context.Background(), again); status.Code(err) != codes.AlreadyExists {
				t.Errorf("retry without the source: %v, want AlreadyExists", err)
			}
			again.VolumeContentSource = tc.src
			if r, err := s.CreateVolume(context.Background(), again); err != nil || r.Volume.ContentSource == nil {
				t.Errorf("retry: %v, %v", r, err)
			}
		})
	}
}

// TestDeleteSnapshotPodFailure: a failed snapshotDeletion pod is recorded and
// removed, the record stays Deleting with the failure, and the retry runs a
// new pod (new token) and finishes.
func TestDeleteSnapshotPodFailure(t *testing.T) {
	p := prov(t, snapSpec(plainCreation, snapshotPod))
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseSnapshotDeletion: podFails("backend down")}}
	newVolume(t, c.server(p, runner), "v1")
	if _, err := c.server(p, runner).CreateSnapshot(context.Background(), snapshotRequest("s1", "v1")); err != nil {
		t.Fatal(err)
	}
	_, err := c.server(p, runner).DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: "s1"})
	if err == nil || !strings.Contains(err.Error(), "backend down") {
		t.Fatalf("first call: %v", err)
	}
	recs := c.snapshots()
	if len(recs) != 1 || recs[0].Status.Phase != v1alpha1.SnapshotDeleting || !strings.Contains(recs[0].Status.Message, "backend down") ||
		recs[0].Status.Pod(v1alpha1.PhaseSnapshotDeletion).Outcome != v1alpha1.PodFailed || runner.live() != 0 {
		t.Fatalf("records %+v, %d pods", recs, runner.live())
	}
	runner.answers[v1alpha1.PhaseSnapshotDeletion] = nil
	if _, err := c.server(p, runner).DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: "s1"}); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := strings.Join(runner.phases(), " "); got != "creation snapshotcreation snapshotdeletion snapshotdeletion" {
		t.Fatalf("pods %q", got)
	}
	if len(c.snapshots()) != 0 || runner.live() != 0 {
		t.Fatalf("left: %d records, %d pods", len(c.snapshots()), runner.live())
	}
}
