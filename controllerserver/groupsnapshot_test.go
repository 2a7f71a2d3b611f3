package controllerserver

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

// groupSpec is snapSpec's provisioner with group snapshots: groupCreation is
// spec.groupSnapshotCreation, groupDeletion spec.groupSnapshotDeletion ("":
// absent).
func groupSpec(groupCreation, groupDeletion string) string {
	s := snapSpec(plainCreation, snapshotPod) + "  groupSnapshotCreation: " + groupCreation + "\n"
	if groupDeletion != "" {
		s += "  groupSnapshotDeletion: " + groupDeletion + "\n"
	}
	return s
}

var (
	groupPod    = fmt.Sprintf(pod, "group {{ groupSnapshotName }} {{ defaultHandle }} {{ params.kind }}{% for v in volumes %} {{ v.handle }}={{ v.defaultHandle }}:{{ v.capacity }}:{{ v.volumeMode }}:{{ v.params.color }}{% endfor %}")
	groupDelPod = fmt.Sprintf(pod, "ungroup {{ handle }} {{ groupSnapshotName }}{% for s in snapshots %} {{ s.handle }}:{{ s.capacity or '-' }}:{{ s.volume.handle }}{% endfor %}")
)

func groupReq(name string, ids ...string) *csi.CreateVolumeGroupSnapshotRequest {
	return &csi.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: ids, Parameters: map[string]string{"kind": "fast",
		paramGroupSnapshotName: "nightly", paramGroupSnapshotNamespace: "team-a", paramGroupSnapshotContent: "groupsnapcontent-1"}}
}

// groups is every PavGroupSnapshot, read from the API.
func (c *cluster) groups() []*v1alpha1.PavGroupSnapshot {
	c.t.Helper()
	l, err := c.records.Resource(v1alpha1.GroupSnapshotGroupVersionResource).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	var out []*v1alpha1.PavGroupSnapshot
	for i := range l.Items {
		v := &v1alpha1.PavGroupSnapshot{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(l.Items[i].Object, v); err != nil {
			c.t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

// commands lists the commands (after sh -c) of the pods of a phase that were
// created, sorted.
func (f *fakeRunner) commands(ph v1alpha1.Phase) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, op := range f.ops {
		if k := op.PodName() + op.Token; op.Phase == ph && !seen[k] {
			seen[k] = true
			out = append(out, strings.Join(op.Template.Spec.Containers[0].Command[2:], " "))
		}
	}
	slices.Sort(out)
	return out
}

// count is how many pods of a phase were created.
func (f *fakeRunner) count(ph v1alpha1.Phase) int {
	n := 0
	for _, p := range f.phases() {
		if p == string(ph) {
			n++
		}
	}
	return n
}

// snapshotsOf is a group's snapshots as "source>handle:size@group", in order.
func snapshotsOf(g *csi.VolumeGroupSnapshot) string {
	var out []string
	for _, sn := range g.Snapshots {
		out = append(out, fmt.Sprintf("%s>%s:%d@%s", sn.SourceVolumeId, sn.SnapshotId, sn.SizeBytes, sn.GroupSnapshotId))
		if !sn.ReadyToUse || sn.CreationTime == nil {
			return "not ready: " + sn.String()
		}
	}
	return strings.Join(out, " ")
}

func newVolumes(t *testing.T, s *Server, names ...string) {
	t.Helper()
	for _, n := range names {
		newVolume(t, s, n)
	}
}

func (c *cluster) leftovers(runner *fakeRunner) string {
	c.t.Helper()
	var out []string
	for _, g := range c.groups() {
		out = append(out, "group "+g.Name+" ("+string(g.Status.Phase)+")")
	}
	for _, s := range c.snapshots() {
		out = append(out, "snapshot "+s.Name+" ("+string(s.Status.Phase)+")")
	}
	if n := runner.live(); n > 0 {
		out = append(out, fmt.Sprintf("%d pods", n))
	}
	return strings.Join(out, ", ")
}

// TestGroupSnapshotByMemberPods: without a groupSnapshotCreation podTemplate,
// each member's snapshotCreation pod makes it (its context is a snapshot's,
// with the group's class parameters and the member's name); the members are
// ordinary snapshots that name their group (ListSnapshots, GetSnapshot); the
// call is idempotent; DeleteVolumeGroupSnapshot checks snapshot_ids and runs
// each member's snapshotDeletion pod.
func TestGroupSnapshotByMemberPods(t *testing.T) {
	ctx := context.Background()
	p := prov(t, groupSpec("{}", ""))
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer}}
	s := c.server(p, runner)
	newVolumes(t, s, "v1", "v2", "v3")
	resp, err := s.CreateVolumeGroupSnapshot(ctx, groupReq("g1", "v3", "v1", "v2"))
	if err != nil {
		t.Fatal(err)
	}
	g := resp.GroupSnapshot
	const want = "v3>g1-0:1073741824@g1 v1>g1-1:1073741824@g1 v2>g1-2:1073741824@g1"
	if g.GroupSnapshotId != "g1" || !g.ReadyToUse || g.CreationTime == nil || snapshotsOf(g) != want {
		t.Fatalf("group %v: snapshots %q, want %q", g, snapshotsOf(g), want)
	}
	if got := runner.commands(v1alpha1.PhaseSnapshotCreation); !slices.Equal(got, []string{
		"snap g1-0 g1-0 v3 1073741824 Filesystem blue fast", "snap g1-1 g1-1 v1 1073741824 Filesystem blue fast", "snap g1-2 g1-2 v2 1073741824 Filesystem blue fast"}) {
		t.Errorf("member pods %q", got)
	}
	gs := c.groups()
	if len(gs) != 1 || gs[0].Status.Phase != v1alpha1.SnapshotCreated || gs[0].Spec.VolumeGroupSnapshot != "team-a/nightly" ||
		gs[0].Spec.VolumeGroupSnapshotContent != "groupsnapcontent-1" || len(gs[0].Spec.Params) != 1 || len(gs[0].Status.Pods) != 0 {
		t.Fatalf("group records %+v", gs)
	}
	for _, r := range c.snapshots() {
		if r.Spec.GroupSnapshotName != "g1" || r.Spec.GroupSnapshotHandle != "g1" || r.Status.Phase != v1alpha1.SnapshotCreated {
			t.Errorf("member record %s: %+v %+v", r.Name, r.Spec, r.Status)
		}
	}
	// Members are snapshots like any other, which name their group.
	list, err := s.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SourceVolumeId: "v1"})
	if err != nil || len(list.Entries) != 1 || list.Entries[0].Snapshot.GroupSnapshotId != "g1" || list.Entries[0].Snapshot.SnapshotId != "g1-1" {
		t.Fatalf("ListSnapshots: %v, %v", list, err)
	}
	if got, err := s.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: "g1-2"}); err != nil || got.Snapshot.GroupSnapshotId != "g1" {
		t.Fatalf("GetSnapshot: %v, %v", got, err)
	}
	// Idempotent, in any order of the volumes; ALREADY_EXISTS for other volumes or parameters.
	again, err := c.server(p, runner).CreateVolumeGroupSnapshot(ctx, groupReq("g1", "v1", "v2", "v3"))
	if err != nil || snapshotsOf(again.GroupSnapshot) != want || !again.GroupSnapshot.CreationTime.AsTime().Equal(g.CreationTime.AsTime()) {
		t.Fatalf("repeat: %v, %v", again, err)
	}
	if n := runner.count(v1alpha1.PhaseSnapshotCreation); n != 3 {
		t.Fatalf("%d member pods after the repeat, want 3", n)
	}
	if _, err := s.CreateVolumeGroupSnapshot(ctx, groupReq("g1", "v1", "v2")); status.Code(err) != codes.AlreadyExists {
		t.Errorf("other volumes: %v", err)
	}
	other := groupReq("g1", "v1", "v2", "v3")
	other.Parameters["kind"] = "slow"
	if _, err := s.CreateVolumeGroupSnapshot(ctx, other); status.Code(err) != codes.AlreadyExists {
		t.Errorf("other parameters: %v", err)
	}
	// Get and Delete check snapshot_ids.
	if got, err := s.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "g1", SnapshotIds: []string{"g1-2", "g1-0", "g1-1"}}); err != nil || snapshotsOf(got.GroupSnapshot) != want {
		t.Fatalf("GetVolumeGroupSnapshot: %v, %v", got, err)
	}
	for _, ids := range [][]string{{"g1-0", "g1-1"}, {"g1-0", "g1-1", "g1-9"}, {"g1-0", "g1-1", "g1-2", "g1-2"}} {
		if _, err := s.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "g1", SnapshotIds: ids}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Get with snapshot_ids %v: %v, want InvalidArgument", ids, err)
		}
		if _, err := s.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "g1", SnapshotIds: ids}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Delete with snapshot_ids %v: %v, want InvalidArgument", ids, err)
		}
	}
	if _, err := s.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("Get of an unknown group: %v", err)
	}
	var d *Server
	for i := 0; i < 2; i++ {
		d = c.server(p, runner)
		if _, err := d.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "g1", SnapshotIds: []string{"g1-0", "g1-1", "g1-2"}}); err != nil {
			t.Fatalf("DeleteVolumeGroupSnapshot #%d: %v", i, err)
		}
	}
	if got := runner.commands(v1alpha1.PhaseSnapshotDeletion); !slices.Equal(got, []string{"rm g1-0 1073741824 v3 g1-0", "rm g1-1 1073741824 v1 g1-1", "rm g1-2 1073741824 v2 g1-2"}) {
		t.Errorf("member deletion pods %q", got)
	}
	if left := c.leftovers(runner); left != "" {
		t.Fatalf("left: %s", left)
	}
	// Through the server that deleted it: s's cache may not have seen the
	// deletion yet (each server here is a process of its own).
	if _, err := d.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: "g1"}); status.Code(err) != codes.NotFound {
		t.Errorf("Get after delete: %v", err)
	}
}

// TestGroupSnapshotByGroupPod: one groupSnapshotCreation pod sees every member
// and reports the group's handle and the members' in /pav/handle and
// /pav/snapshots (defaults for what it leaves out); deletion is one
// groupSnapshotDeletion pod, or each member's snapshotDeletion pod without one.
func TestGroupSnapshotByGroupPod(t *testing.T) {
	for _, tc := range []struct {
		name          string
		groupDeletion string
		wantDeletion  []string // the deletion pods' commands
		wantPhase     v1alpha1.Phase
	}{
		{name: "groupSnapshotDeletion pod", groupDeletion: groupDelPod, wantPhase: v1alpha1.PhaseGroupSnapshotDeletion,
			wantDeletion: []string{"ungroup G g2 s-one:1048576:v1 g2-1:2097152:v2 g2-2:1073741824:v3"}},
		{name: "members' snapshotDeletion pods", wantPhase: v1alpha1.PhaseSnapshotDeletion,
			wantDeletion: []string{"rm g2-1 2097152 v2 g2-1", "rm g2-2 1073741824 v3 g2-2", "rm s-one 1048576 v1 g2-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			p := prov(t, groupSpec(groupPod, tc.groupDeletion))
			c := newCluster(t)
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer,
				v1alpha1.PhaseGroupSnapshotCreation: files(map[string]string{"handle": " G\n", "snapshots": "v1: {handle: s-one, capacity: 1Mi}\nv2: {capacity: 2097152}\nv3:\n"})}}
			s := c.server(p, runner)
			newVolumes(t, s, "v1", "v2", "v3")
			resp, err := s.CreateVolumeGroupSnapshot(ctx, groupReq("g2", "v1", "v2", "v3"))
			if err != nil {
				t.Fatal(err)
			}
			if got, want := snapshotsOf(resp.GroupSnapshot), "v1>s-one:1048576@G v2>g2-1:2097152@G v3>g2-2:1073741824@G"; resp.GroupSnapshot.GroupSnapshotId != "G" || got != want {
				t.Fatalf("group %s: %q, want %q", resp.GroupSnapshot.GroupSnapshotId, got, want)
			}
			if got := runner.commands(v1alpha1.PhaseGroupSnapshotCreation); !slices.Equal(got, []string{
				"group g2 g2 fast v1=g2-0:1073741824:Filesystem:blue v2=g2-1:1073741824:Filesystem:blue v3=g2-2:1073741824:Filesystem:blue"}) {
				t.Errorf("group pod %q", got)
			}
			if n := runner.count(v1alpha1.PhaseSnapshotCreation); n != 0 {
				t.Errorf("%d member pods beside the group pod", n)
			}
			recs := c.snapshots()
			if len(recs) != 3 || runner.live() != 0 {
				t.Fatalf("%d member records, %d pods", len(recs), runner.live())
			}
			for _, r := range recs {
				if r.Spec.GroupSnapshotHandle != "G" || r.Status.Phase != v1alpha1.SnapshotCreated || len(r.Status.Pods) != 0 {
					t.Errorf("member %s: %+v", r.Name, r.Status)
				}
			}
			if _, err := s.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "G", SnapshotIds: []string{"s-one", "g2-1", "g2-2"}}); err != nil {
				t.Fatal(err)
			}
			if got := runner.commands(tc.wantPhase); !slices.Equal(got, tc.wantDeletion) {
				t.Errorf("deletion pods %q, want %q", got, tc.wantDeletion)
			}
			if n := runner.count(v1alpha1.PhaseSnapshotDeletion) + runner.count(v1alpha1.PhaseGroupSnapshotDeletion); n != len(tc.wantDeletion) {
				t.Errorf("%d deletion pods, want %d", n, len(tc.wantDeletion))
			}
			if left := c.leftovers(runner); left != "" {
				t.Fatalf("left: %s", left)
			}
		})
	}
}

// TestGroupSnapshotBadGroupPod: a group pod that fails, or writes what pav
// cannot take, is undone before the error: by the groupSnapshotDeletion pod,
// or each member's snapshotDeletion pod, with the default handles (the
// parsed /pav/handle, if any) and unknown sizes; nothing is left.
func TestGroupSnapshotBadGroupPod(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  func(podrunner.Operation) (*podrunner.Result, error)
		wantErr string
		handle  string // the handle the undoing sees
	}{
		{name: "pod fails", answer: podFails("cannot quiesce"), wantErr: "cannot quiesce", handle: "g3"},
		{name: "not YAML", answer: files(map[string]string{"snapshots": "{["}), wantErr: "invalid /pav/snapshots", handle: "g3"},
		{name: "a list", answer: files(map[string]string{"snapshots": "- v1\n"}), wantErr: "it is a list, not a map", handle: "g3"},
		{name: "not a member", answer: files(map[string]string{"handle": "G", "snapshots": "v9: {handle: x}"}),
			wantErr: `"v9" is not the handle of a member's source volume (the members' are "v1", "v2")`, handle: "G"},
		{name: "unknown field", answer: files(map[string]string{"snapshots": "v1: {name: x}"}), wantErr: `unknown field "name"`, handle: "g3"},
		{name: "entry not a map", answer: files(map[string]string{"snapshots": "v1: x"}), wantErr: `the entry of "v1" is a string`, handle: "g3"},
		{name: "duplicate handles", answer: files(map[string]string{"snapshots": "v1: {handle: x}\nv2: {handle: x}"}), wantErr: `both have handle "x"`, handle: "g3"},
		{name: "a member takes another's default", answer: files(map[string]string{"snapshots": "v2: {handle: g3-0}"}), wantErr: `both have handle "g3-0"`, handle: "g3"},
		{name: "empty member handle", answer: files(map[string]string{"snapshots": "v1: {handle: ''}"}), wantErr: "must be a non-empty string", handle: "g3"},
		{name: "bad capacity", answer: files(map[string]string{"snapshots": "v1: {capacity: lots}"}), wantErr: `has capacity "lots"`, handle: "g3"},
		{name: "empty /pav/handle", answer: files(map[string]string{"handle": " \n"}), wantErr: "empty /pav/handle", handle: "g3"},
	} {
		for _, del := range []string{"group pod", "member pods"} {
			t.Run(tc.name+", undone by "+del, func(t *testing.T) {
				ctx := context.Background()
				groupDeletion, wantPhase := groupDelPod, v1alpha1.PhaseGroupSnapshotDeletion
				want := []string{"ungroup " + tc.handle + " g3 g3-0:-:v1 g3-1:-:v2"}
				if del == "member pods" {
					groupDeletion, wantPhase = "", v1alpha1.PhaseSnapshotDeletion
					want = []string{"rm g3-0 - v1 g3-0", "rm g3-1 - v2 g3-1"}
				}
				p := prov(t, groupSpec(groupPod, groupDeletion))
				c := newCluster(t)
				runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseGroupSnapshotCreation: tc.answer}}
				s := c.server(p, runner)
				newVolumes(t, s, "v1", "v2")
				_, err := s.CreateVolumeGroupSnapshot(ctx, groupReq("g3", "v1", "v2"))
				if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want Internal with %q", err, tc.wantErr)
				}
				if got := runner.commands(wantPhase); !slices.Equal(got, want) {
					t.Errorf("undoing pods %q, want %q", got, want)
				}
				if left := c.leftovers(runner); left != "" {
					t.Fatalf("left: %s", left)
				}
			})
		}
	}
}

// TestGroupSnapshotMemberFails: one member's snapshotCreation pod fails; that
// member is reverted by its own deletion pod, the others (made meanwhile) are
// deleted, and the error names the member.
func TestGroupSnapshotMemberFails(t *testing.T) {
	ctx := context.Background()
	p := prov(t, groupSpec("{}", ""))
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseSnapshotCreation: func(op podrunner.Operation) (*podrunner.Result, error) {
		if op.VolumeKey == SnapshotKey("g4-1") {
			return podFails("disk full")(op)
		}
		return files(nil)(op)
	}}}
	s := c.server(p, runner)
	newVolumes(t, s, "v1", "v2", "v3")
	_, err := s.CreateVolumeGroupSnapshot(ctx, groupReq("g4", "v1", "v2", "v3"))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "member snapshot g4-1 of volume v2") || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("error %v", err)
	}
	if got := runner.commands(v1alpha1.PhaseSnapshotDeletion); !slices.Equal(got, []string{"rm g4-0 1073741824 v1 g4-0", "rm g4-1 - v2 g4-1", "rm g4-2 1073741824 v3 g4-2"}) {
		t.Errorf("deletion pods %q", got)
	}
	if left := c.leftovers(runner); left != "" {
		t.Fatalf("left: %s", left)
	}
}

// TestGroupSnapshotUndoRetried: the pod that undoes a failed group fails too:
// ABORTED, the group stays Deleting with its reason, and a member cannot be
// deleted on its own meanwhile; the retry finishes the undoing and returns
// the creation's failure.
func TestGroupSnapshotUndoRetried(t *testing.T) {
	ctx := context.Background()
	p := prov(t, groupSpec(groupPod, groupDelPod))
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseGroupSnapshotCreation: podFails("cannot quiesce"),
		v1alpha1.PhaseGroupSnapshotDeletion: podFails("backend down")}}
	newVolumes(t, c.server(p, runner), "v1", "v2")
	if _, err := c.server(p, runner).CreateVolumeGroupSnapshot(ctx, groupReq("g5", "v1", "v2")); status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "backend down") {
		t.Fatalf("first call: %v", err)
	}
	if gs := c.groups(); len(gs) != 1 || gs[0].Status.Phase != v1alpha1.SnapshotDeleting || gs[0].Status.Reason != v1alpha1.ReasonCreationFailed ||
		!strings.Contains(gs[0].Status.Message, "cannot quiesce") || runner.live() != 0 {
		t.Fatalf("groups %+v, %d pods", gs, runner.live())
	}
	runner.answers[v1alpha1.PhaseGroupSnapshotDeletion] = nil
	_, err := c.server(p, runner).CreateVolumeGroupSnapshot(ctx, groupReq("g5", "v1", "v2"))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "cannot quiesce") {
		t.Fatalf("retry: %v, want the creation's failure", err)
	}
	if got := strings.Join(runner.phases(), " "); got != "creation creation groupsnapshotcreation groupsnapshotdeletion groupsnapshotdeletion" {
		t.Errorf("pods %q", got)
	}
	if left := c.leftovers(runner); left != "" {
		t.Fatalf("left: %s", left)
	}
}

// TestGroupSnapshotRefused: requests refused before anything is recorded.
func TestGroupSnapshotRefused(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		req      *csi.CreateVolumeGroupSnapshotRequest
		wantCode codes.Code
		wantErr  string
	}{
		{name: "no name", req: groupReq("", "v1"), wantCode: codes.InvalidArgument, wantErr: "name is required"},
		{name: "no volumes", req: groupReq("g"), wantCode: codes.InvalidArgument, wantErr: "source_volume_ids is required"},
		{name: "empty volume id", req: groupReq("g", "v1", ""), wantCode: codes.InvalidArgument, wantErr: "source_volume_ids[1] is empty"},
		{name: "a volume twice", req: groupReq("g", "v1", "v1"), wantCode: codes.InvalidArgument, wantErr: "lists volume v1 twice"},
		{name: "a volume pav did not make (another provisioner's)", req: groupReq("g", "v1", "theirs"), wantCode: codes.NotFound,
			wantErr: `source volume theirs does not exist: PavProvisioner "test" has no created volume with that handle`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := prov(t, groupSpec("{}", ""))
			c := newCluster(t)
			runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer}}
			s := c.server(p, runner)
			newVolume(t, s, "v1")
			_, err := s.CreateVolumeGroupSnapshot(ctx, tc.req)
			if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want %s with %q", err, tc.wantCode, tc.wantErr)
			}
			if left := c.leftovers(runner); left != "" || runner.count(v1alpha1.PhaseSnapshotCreation) != 0 {
				t.Fatalf("left: %s", left)
			}
		})
	}
}

// TestGroupSnapshotCapabilities: the GroupController service's capability
// follows spec.groupSnapshotCreation; without it, its calls are UNIMPLEMENTED.
func TestGroupSnapshotCapabilities(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		spec string
		want bool
	}{{groupSpec("{}", ""), true}, {groupSpec(groupPod, groupDelPod), true}, {snapSpec(plainCreation, snapshotPod), false}} {
		s := newCluster(t).server(prov(t, tc.spec), &fakeRunner{})
		resp, err := s.GroupControllerGetCapabilities(ctx, &csi.GroupControllerGetCapabilitiesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		got := len(resp.Capabilities) == 1 && resp.Capabilities[0].GetRpc().GetType() == csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT
		if got != tc.want || !tc.want && len(resp.Capabilities) != 0 {
			t.Errorf("capabilities %v, want the group snapshot capability: %v", resp.Capabilities, tc.want)
		}
		if !tc.want {
			if _, err := s.CreateVolumeGroupSnapshot(ctx, groupReq("g", "v1")); status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "spec.groupSnapshotCreation") {
				t.Errorf("CreateVolumeGroupSnapshot without groupSnapshotCreation: %v", err)
			}
		}
	}
}

// TestGroupSnapshotRestartBetweenPodAndRecord: the write that records the
// group pod's result fails (a restart there is the same): the pod stays, and
// the retry adopts it by its recorded UID; the group is cut once.
func TestGroupSnapshotRestartBetweenPodAndRecord(t *testing.T) {
	ctx := context.Background()
	p := prov(t, groupSpec(groupPod, ""))
	c := newCluster(t)
	failed := false
	c.records.PrependReactor("update", v1alpha1.GroupSnapshotResource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		u := a.(k8stesting.UpdateAction).GetObject().(interface{ UnstructuredContent() map[string]any }).UnstructuredContent()
		st, _ := u["status"].(map[string]any)
		if st["snapshots"] != nil && st["phase"] == string(v1alpha1.SnapshotCreating) && !failed {
			failed = true
			return true, nil, apierrors.NewServiceUnavailable("etcd leader changed")
		}
		return false, nil, nil
	})
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseGroupSnapshotCreation: files(nil)}}
	newVolumes(t, c.server(p, runner), "v1", "v2")
	if _, err := c.server(p, runner).CreateVolumeGroupSnapshot(ctx, groupReq("g6", "v1", "v2")); status.Code(err) != codes.Unavailable {
		t.Fatalf("first call: %v, want Unavailable", err)
	}
	if runner.live() != 1 || len(c.snapshots()) != 0 {
		t.Fatalf("%d pods, %d member records: the pod must stay until its result is recorded, the members after it", runner.live(), len(c.snapshots()))
	}
	resp, err := c.server(p, runner).CreateVolumeGroupSnapshot(ctx, groupReq("g6", "v1", "v2"))
	if err != nil || snapshotsOf(resp.GroupSnapshot) != "v1>g6-0:1073741824@g6 v2>g6-1:1073741824@g6" {
		t.Fatalf("retry: %v, %v", resp, err)
	}
	if runner.created != 3 || runner.live() != 0 { // the volumes' pods and the group's
		t.Fatalf("%d pods created, %d left; want 3, 0", runner.created, runner.live())
	}
	if last := runner.ops[len(runner.ops)-1]; last.UID == "" {
		t.Error("the retry did not adopt the pod by its recorded UID")
	}
}

// TestGroupSnapshotMemberDeletedAlone: a member of a created group may be
// deleted on its own (a pre-provisioned group's members may be); the group's
// deletion still takes the original snapshot_ids and deletes the others once.
// While the group is being deleted, a member's own deletion is ABORTED.
func TestGroupSnapshotMemberDeletedAlone(t *testing.T) {
	ctx := context.Background()
	p := prov(t, groupSpec("{}", groupDelPod))
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseGroupSnapshotDeletion: podFails("backend down")}}
	s := c.server(p, runner)
	newVolumes(t, s, "v1", "v2", "v3")
	if _, err := s.CreateVolumeGroupSnapshot(ctx, groupReq("g7", "v1", "v2", "v3")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "g7-1"}); err != nil {
		t.Fatalf("a member's own deletion: %v", err)
	}
	ids := []string{"g7-0", "g7-1", "g7-2"}
	if _, err := s.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "g7", SnapshotIds: ids}); err == nil || !strings.Contains(err.Error(), "backend down") {
		t.Fatalf("group deletion: %v", err)
	}
	if _, err := s.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: "g7-2"}); status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "being deleted") {
		t.Fatalf("a member's own deletion while its group is deleted: %v", err)
	}
	runner.answers[v1alpha1.PhaseGroupSnapshotDeletion] = nil
	if _, err := s.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: "g7", SnapshotIds: ids}); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := runner.commands(v1alpha1.PhaseGroupSnapshotDeletion); len(got) != 2 || got[0] != got[1] || got[0] != "ungroup g7 g7 g7-0:1073741824:v1 g7-2:1073741824:v3" {
		t.Errorf("group deletion pods %q", got)
	}
	if got := runner.commands(v1alpha1.PhaseSnapshotDeletion); !slices.Equal(got, []string{"rm g7-1 1073741824 v2 g7-1"}) {
		t.Errorf("member deletion pods %q", got)
	}
	if left := c.leftovers(runner); left != "" {
		t.Fatalf("left: %s", left)
	}
}

// TestGroupSnapshotHandleCollision: a group pod that reports another
// snapshot's handle for a member gets no record and no deletion pod (it would
// delete the other snapshot).
func TestGroupSnapshotHandleCollision(t *testing.T) {
	ctx := context.Background()
	p := prov(t, groupSpec(groupPod, groupDelPod))
	c := newCluster(t)
	runner := &fakeRunner{answers: answers{v1alpha1.PhaseCreation: volumeAnswer, v1alpha1.PhaseSnapshotCreation: files(map[string]string{"handle": "taken"}),
		v1alpha1.PhaseGroupSnapshotCreation: files(map[string]string{"snapshots": "v2: {handle: taken}"})}}
	s := c.server(p, runner)
	newVolumes(t, s, "v1", "v2")
	if _, err := s.CreateSnapshot(ctx, snapshotRequest("s1", "v1")); err != nil {
		t.Fatal(err)
	}
	_, err := s.CreateVolumeGroupSnapshot(ctx, groupReq("g8", "v1", "v2"))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `member handle "taken" (of volume v2) is already the handle of snapshot s1`) {
		t.Fatalf("error %v", err)
	}
	if n := runner.count(v1alpha1.PhaseGroupSnapshotDeletion) + runner.count(v1alpha1.PhaseSnapshotDeletion); n != 0 {
		t.Errorf("%d deletion pods ran", n)
	}
	if left := c.leftovers(runner); left != "snapshot s1 (Created)" {
		t.Fatalf("left: %s, want only s1", left)
	}
}
