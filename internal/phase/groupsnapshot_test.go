package phase

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

func groupMembers() []GroupMember {
	return []GroupMember{
		{SnapshotName: "g-0", Volume: &v1alpha1.SnapshotSourceVolume{Handle: "vol-a", Capacity: 1 << 20, VolumeMode: corev1.PersistentVolumeFilesystem,
			Params: map[string]string{"color": "blue"}, PVC: &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data-0", Namespace: "ns"}}}},
		{SnapshotName: "g-1", Volume: &v1alpha1.SnapshotSourceVolume{Handle: "vol-b", Capacity: 2 << 20, VolumeMode: corev1.PersistentVolumeBlock}},
	}
}

// The group snapshot phases' contexts (design-35.md): `params`,
// `groupSnapshotName`, `volumes` (each as snapshotCreation's `volume`, with
// pvc/sc when recorded and the member's default handle); deletion adds the
// group's `handle` and `snapshots`.
func TestGroupSnapshotContexts(t *testing.T) {
	asJSON := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	create, err := GroupSnapshotVars("g", map[string]string{"kind": "fast"}, groupMembers())
	if err != nil {
		t.Fatal(err)
	}
	m := groupMembers()
	del, err := GroupSnapshotDeletionVars("g", nil, m, "G", []GroupMemberSnapshot{{Member: m[1], Handle: "snap-b", Size: 0}, {Member: m[0], Handle: "snap-a", Size: 5}})
	if err != nil {
		t.Fatal(err)
	}
	vols := create["volumes"].([]any)
	for _, tc := range []struct {
		name string
		got  any
		want string
	}{
		{"groupSnapshotName", create["groupSnapshotName"], `"g"`},
		{"defaultHandle", create["defaultHandle"], `"g"`},
		{"params", create["params"], `{"kind":"fast"}`},
		{"volumes, in order", len(vols), `2`},
		{"a member without pvc", vols[1], `{"capacity":2097152,"defaultHandle":"g-1","handle":"vol-b","params":{},"snapshotName":"g-1","volumeMode":"Block"}`},
		{"a member's pvc", vols[0].(map[string]any)["pvc"].(map[string]any)["metadata"].(map[string]any)["name"], `"data-0"`},
		{"creation has no handle", create["handle"], `null`},
		{"deletion: the group's handle", del["handle"], `"G"`},
		{"deletion: params never null", del["params"], `{}`},
		{"deletion: snapshots, capacity null when unknown", del["snapshots"].([]any)[0].(map[string]any)["capacity"], `null`},
		{"deletion: a snapshot's handle and volume", []any{del["snapshots"].([]any)[1].(map[string]any)["handle"], del["snapshots"].([]any)[1].(map[string]any)["capacity"],
			del["snapshots"].([]any)[1].(map[string]any)["volume"].(map[string]any)["handle"]}, `["snap-a",5,"vol-a"]`},
		{"deletion keeps volumes", len(del["volumes"].([]any)), `2`},
	} {
		if got := asJSON(tc.got); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestReadGroupSnapshots: /pav/snapshots, YAML or JSON, keyed by source volume
// handle; every field optional, with defaults; anything else an error that
// names the file, the entry and the fix.
func TestReadGroupSnapshots(t *testing.T) {
	ptr := func(s string) *string { return &s }
	for _, tc := range []struct {
		name        string
		reported    *string
		wantHandles string
		wantSizes   string
		wantErr     string
	}{
		{name: "no file: defaults", wantHandles: "g-0 g-1", wantSizes: "[1048576,2097152]"},
		{name: "empty file: defaults", reported: ptr(" \n"), wantHandles: "g-0 g-1", wantSizes: "[1048576,2097152]"},
		{name: "YAML, some fields", reported: ptr("vol-b: {handle: ' b ', capacity: 1Mi}\n"), wantHandles: "g-0 b", wantSizes: "[1048576,1048576]"},
		{name: "JSON, all fields", reported: ptr(`{"vol-a": {"handle": "a", "capacity": 7}, "vol-b": {"handle": "b", "capacity": "2Ki"}}`), wantHandles: "a b", wantSizes: "[7,2048]"},
		{name: "null entry: defaults", reported: ptr("vol-a:\nvol-b: null\n"), wantHandles: "g-0 g-1", wantSizes: "[1048576,2097152]"},
		{name: "null document", reported: ptr("null"), wantHandles: "g-0 g-1", wantSizes: "[1048576,2097152]"},
		{name: "not YAML", reported: ptr("{["), wantErr: "the groupSnapshotCreation pod wrote an invalid /pav/snapshots"},
		{name: "a scalar", reported: ptr("42"), wantErr: "it is a number, not a map"},
		{name: "unknown volume", reported: ptr("vol-z: {}"), wantErr: `"vol-z" is not the handle of a member's source volume (the members' are "vol-a", "vol-b")`},
		{name: "unknown field", reported: ptr("vol-a: {size: 1}"), wantErr: `the entry of "vol-a" has an unknown field "size"`},
		{name: "a number handle", reported: ptr("vol-a: {handle: 7}"), wantErr: `has handle number: a member's handle must be a non-empty string (leave it out for the default "g-0")`},
		{name: "zero capacity", reported: ptr("vol-a: {capacity: 0}"), wantErr: `the entry of "vol-a" has capacity number`},
		{name: "duplicate handles", reported: ptr("vol-a: {handle: x}\nvol-b: {handle: x}"), wantErr: `the members of volumes "vol-a" and "vol-b" both have handle "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := ReadGroupSnapshots(tc.reported, groupMembers())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "/pav/snapshots") {
					t.Fatalf("error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			sizes, _ := json.Marshal(res.Sizes)
			if got := strings.Join(res.Handles, " "); got != tc.wantHandles || string(sizes) != tc.wantSizes {
				t.Fatalf("handles %q sizes %s, want %q %s", got, sizes, tc.wantHandles, tc.wantSizes)
			}
		})
	}
}

func TestGroupMemberName(t *testing.T) {
	if got := GroupMemberName("groupsnapshot-0f7c1b7e-5b8e-4d3a-9e2b-1c2d3e4f5a6b", 2); got != "groupsnapshot-0f7c1b7e-5b8e-4d3a-9e2b-1c2d3e4f5a6b-2" {
		t.Errorf("GroupMemberName = %q", got)
	}
}
