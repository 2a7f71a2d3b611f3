package volume

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestContextRoundTrip(t *testing.T) {
	max := int64(10)
	claim := &Claim{PVC: &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, RequestedMinCapacity: 1, RequestedMaxCapacity: &max, DefaultHandle: "pvc-1"}
	vc, err := Context(map[string]string{"a": "b", ParamPVCName: "c", KeyPrefix + "x": "y", "storage.kubernetes.io/csiProvisionerIdentity": "1-2-x"}, 5, claim)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := vc[ParamPVCName]; ok {
		t.Fatal("sidecar keys leak into the volume context")
	}
	if p := UserParams(vc); len(p) != 1 || p["a"] != "b" {
		t.Fatalf("UserParams = %v", p)
	}
	capacity, got, ours, err := ParseContext(vc)
	if err != nil || !ours || capacity != 5 || got.PVC.Name != "c" || *got.RequestedMaxCapacity != 10 {
		t.Fatalf("ParseContext = %d %+v %v %v", capacity, got, ours, err)
	}
	if _, _, ours, _ := ParseContext(map[string]string{"user": "x"}); ours {
		t.Fatal("a static PV's attributes read as pav's")
	}
	if _, _, _, err := ParseContext(map[string]string{KeyCapacity: "lots"}); err == nil {
		t.Fatal("bad capacity accepted")
	}
}

func TestCapabilities(t *testing.T) {
	mount := func(m csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
		return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}, AccessMode: &csi.VolumeCapability_AccessMode{Mode: m}}
	}
	block := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}, AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	for _, tc := range []struct {
		name    string
		caps    []*csi.VolumeCapability
		mode    corev1.PersistentVolumeMode
		modes   []corev1.PersistentVolumeAccessMode
		wantErr bool
	}{
		{"rwo", []*csi.VolumeCapability{mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}, "Filesystem", []corev1.PersistentVolumeAccessMode{"ReadWriteOnce"}, false},
		{"rwop", []*csi.VolumeCapability{mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER)}, "Filesystem", []corev1.PersistentVolumeAccessMode{"ReadWriteOncePod"}, false},
		{"rox+rwx dedup", []*csi.VolumeCapability{mount(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY), mount(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER), mount(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)}, "Filesystem", []corev1.PersistentVolumeAccessMode{"ReadOnlyMany", "ReadWriteMany"}, false},
		{"block", []*csi.VolumeCapability{block}, "Block", []corev1.PersistentVolumeAccessMode{"ReadWriteOnce"}, false},
		{"block and mount", []*csi.VolumeCapability{block, mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}, "", nil, true},
		{"none", nil, "", nil, true},
		{"no access type", []*csi.VolumeCapability{{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}, "", nil, true},
		{"unknown mode", []*csi.VolumeCapability{mount(csi.VolumeCapability_AccessMode_UNKNOWN)}, "", nil, true},
	} {
		mode, modes, err := Capabilities(tc.caps)
		if (err != nil) != tc.wantErr || mode != tc.mode || len(modes) != len(tc.modes) {
			t.Errorf("%s: %v %v %v", tc.name, mode, modes, err)
			continue
		}
		for i := range modes {
			if modes[i] != tc.modes[i] {
				t.Errorf("%s: modes %v, want %v", tc.name, modes, tc.modes)
			}
		}
	}
}
