package phase

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

func TestParseBlocks(t *testing.T) {
	const capacity = 1 << 20
	for _, tc := range []struct {
		name, in string
		want     []BlockRange
		err      string
	}{
		{name: "empty", in: "", want: nil},
		{name: "ranges", in: "0 4096\n8192 4096\n", want: []BlockRange{{0, 4096}, {8192, 4096}}},
		{name: "adjacent, blanks, comments, no final newline", in: "# allocated\n0 4096\n\n  4096\t4096  \n1044480 4096",
			want: []BlockRange{{0, 4096}, {4096, 4096}, {1044480, 4096}}},
		{name: "unsorted", in: "8192 4096\n0 4096\n", err: `line 2 ("0 4096"): not sorted: it starts before the range above it (8192 4096)`},
		{name: "overlapping", in: "0 8192\n4096 4096\n", err: `line 2 ("4096 4096"): it overlaps the range above it (0 8192, which ends at byte 8192)`},
		{name: "the same range twice", in: "0 4096\n0 4096\n", err: "line 2"},
		{name: "beyond the capacity", in: "1044480 8192\n", err: "ends at byte 1052672, beyond the snapshot's capacity of 1048576 bytes"},
		{name: "overflow", in: "1 9223372036854775807\n", err: "beyond the snapshot's capacity"},
		{name: "one field", in: "0\n", err: "want 2 fields, OFFSET and LENGTH, got 1"},
		{name: "three fields", in: "0 1 2\n", err: "got 3"},
		{name: "negative offset", in: "-1 4096\n", err: `the offset "-1" is not a non-negative integer`},
		{name: "zero length", in: "0 0\n", err: `the length "0" is not a positive integer`},
		{name: "a quantity", in: "0 4Ki\n", err: `the length "4Ki" is not a positive integer`},
		{name: "hex", in: "0x0 4096\n", err: "not a non-negative integer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBlocks(tc.in, capacity)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "/pav/blocks") || !strings.Contains(err.Error(), blocksFix) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// The snapshotMetadata context, and a template that uses every variable.
func TestSnapshotMetadataContext(t *testing.T) {
	sp := &v1alpha1.PavSnapshotSpec{SnapshotName: "snapshot-2", Params: map[string]string{"kind": "fast"},
		Volume: v1alpha1.SnapshotSourceVolume{Handle: "vol-1.node-a", Capacity: 1 << 30, VolumeMode: corev1.PersistentVolumeBlock,
			Params: map[string]string{"color": "blue"}, PVC: &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "ns"}}}}
	target := &MetadataSnapshot{Spec: sp, Handle: "snapshot-2.node-a", Capacity: 1 << 30}
	base := &MetadataSnapshot{Spec: sp, Handle: "snapshot-1.node-a", Capacity: 512 << 20}
	delta, err := SnapshotMetadataVars(target, base, 4096)
	if err != nil {
		t.Fatal(err)
	}
	allocated, err := SnapshotMetadataVars(target, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	asJSON := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name string
		got  any
		want string
	}{
		{"snapshot", delta["snapshot"], `{"capacity":1073741824,"handle":"snapshot-2.node-a","volume":{"capacity":1073741824,"handle":"vol-1.node-a","params":{"color":"blue"},"volumeMode":"Block"}}`},
		{"baseSnapshot", delta["baseSnapshot"].(map[string]any)["handle"], `"snapshot-1.node-a"`},
		{"base capacity", delta["baseSnapshot"].(map[string]any)["capacity"], `536870912`},
		{"startingOffset", delta["startingOffset"], `4096`},
		{"params", delta["params"], `{"kind":"fast"}`},
		{"pvc of the source volume", delta["pvc"].(map[string]any)["metadata"].(map[string]any)["name"], `"data"`},
		{"no base", allocated["baseSnapshot"], `null`},
	} {
		if got := asJSON(tc.got); got != tc.want {
			t.Errorf("%s = %s, want %s", tc.name, got, tc.want)
		}
	}
	if _, ok := allocated["baseSnapshot"]; !ok {
		t.Error("baseSnapshot must be defined (null) for the allocated blocks, so templates can test it")
	}
	p := &v1alpha1.PavProvisioner{Spec: v1alpha1.PavProvisionerSpec{SnapshotMetadata: &v1alpha1.Value{Data: map[string]any{
		"podTemplate": map[string]any{"spec": map[string]any{
			"nodeName": "{{ snapshot.handle.split('.', 1)[1] }}",
			"containers": []any{map[string]any{"name": "list", "image": "busybox",
				"command": []any{"sh", "-c", "list {{ snapshot.handle }} {{ baseSnapshot.handle if baseSnapshot else '-' }} {{ startingOffset }} {{ params.kind }}"}}}}}}}}}
	for _, tc := range []struct {
		vars map[string]any
		want string
	}{{delta, "list snapshot-2.node-a snapshot-1.node-a 4096 fast"}, {allocated, "list snapshot-2.node-a - 0 fast"}} {
		cfg, err := NewEvaluator(nil).SnapshotMetadata(context.Background(), p, tc.vars)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.PodTemplate.Spec.Containers[0].Command[2]; got != tc.want || cfg.PodTemplate.Spec.NodeName != "node-a" {
			t.Errorf("command %q on %q, want %q on node-a", got, cfg.PodTemplate.Spec.NodeName, tc.want)
		}
	}
}
