package phase

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// The contexts the design names: `source` in volumeValidation/volumeCreation,
// and the snapshot phases' variables.
func TestSnapshotContexts(t *testing.T) {
	sp := &v1alpha1.PavSnapshotSpec{SnapshotName: "snapshot-1", Params: map[string]string{"kind": "fast"},
		Volume: v1alpha1.SnapshotSourceVolume{Handle: "vol-1", Capacity: 1 << 30, VolumeMode: corev1.PersistentVolumeBlock,
			Params: map[string]string{"color": "blue"}, PVC: &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "ns"}}}}
	asJSON := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	del, err := SnapshotDeletionVars(sp, "snap-h", 0)
	if err != nil {
		t.Fatal(err)
	}
	create, err := SnapshotVars(sp)
	if err != nil {
		t.Fatal(err)
	}
	val, err := ValidationVars(Request{VolumeMode: "Filesystem", Source: &v1alpha1.VolumeSource{Kind: "Snapshot", Handle: "snap-h", Capacity: 5, VolumeHandle: "vol-1"}}, Objects{}, "")
	if err != nil {
		t.Fatal(err)
	}
	clone, err := CreationVars(Request{VolumeMode: "Filesystem", Source: &v1alpha1.VolumeSource{Kind: "Volume", Handle: "vol-1", Capacity: 5}}, Objects{}, "d")
	if err != nil {
		t.Fatal(err)
	}
	empty, err := CreationVars(Request{VolumeMode: "Filesystem"}, Objects{}, "d")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		got  any
		want string
	}{
		{"snapshotName", create["snapshotName"], `"snapshot-1"`},
		{"defaultHandle", create["defaultHandle"], `"snapshot-1"`},
		{"params", create["params"], `{"kind":"fast"}`},
		{"volume", create["volume"], `{"capacity":1073741824,"handle":"vol-1","params":{"color":"blue"},"volumeMode":"Block"}`},
		{"pvc of the source volume", create["pvc"].(map[string]any)["metadata"].(map[string]any)["name"], `"data"`},
		{"sc unknown: absent", create["sc"], `null`},
		{"creation has no handle", create["handle"], `null`},
		{"deletion handle", del["handle"], `"snap-h"`},
		{"deletion capacity unknown", del["capacity"], `null`},
		{"restore source", val["source"], `{"capacity":5,"handle":"snap-h","kind":"Snapshot","volumeHandle":"vol-1"}`},
		{"clone source", clone["source"], `{"capacity":5,"handle":"vol-1","kind":"Volume"}`},
		{"no source", empty["source"], `null`},
	} {
		if got := asJSON(tc.got); got != tc.want {
			t.Errorf("%s = %s, want %s", tc.name, got, tc.want)
		}
	}
	if _, ok := empty["source"]; !ok {
		t.Error("source must be defined (null) without a source, so templates can test it")
	}
}
