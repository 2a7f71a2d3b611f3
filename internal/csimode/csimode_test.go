package csimode

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
)

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

func TestIsReadOnly(t *testing.T) {
	for mode, want := range map[csi.VolumeCapability_AccessMode_Mode]bool{
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:  true,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY: true,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:      false,
		csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER: false,
		csi.VolumeCapability_AccessMode_UNKNOWN:                 false,
	} {
		c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
		if got := IsReadOnly(c); got != want {
			t.Errorf("IsReadOnly(%v) = %v, want %v", mode, got, want)
		}
	}
	if IsReadOnly(nil) {
		t.Error("IsReadOnly(nil) = true")
	}
}
