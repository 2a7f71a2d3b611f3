// Package csimode maps CSI volume capabilities to the Kubernetes volume mode and
// access modes that templates and spec.volumeValidation speak of.
package csimode

import (
	"fmt"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
)

// KubeAccessMode maps a CSI access mode to the Kubernetes one.
func KubeAccessMode(m csi.VolumeCapability_AccessMode_Mode) (corev1.PersistentVolumeAccessMode, error) {
	switch m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		return corev1.ReadWriteOnce, nil
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER:
		return corev1.ReadWriteOncePod, nil
	case csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:
		return corev1.ReadOnlyMany, nil
	case csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER:
		return corev1.ReadWriteMany, nil
	}
	return "", fmt.Errorf("access mode %v is not supported", m)
}

// Capabilities checks CSI volume capabilities and returns the volume mode and the
// Kubernetes access modes they ask for.
func Capabilities(caps []*csi.VolumeCapability) (corev1.PersistentVolumeMode, []corev1.PersistentVolumeAccessMode, error) {
	if len(caps) == 0 {
		return "", nil, fmt.Errorf("volume capabilities are required")
	}
	var mode corev1.PersistentVolumeMode
	var modes []corev1.PersistentVolumeAccessMode
	for _, c := range caps {
		m, err := VolumeMode(c)
		if err != nil {
			return "", nil, err
		}
		if mode != "" && mode != m {
			return "", nil, fmt.Errorf("a volume cannot be both Block and Filesystem")
		}
		mode = m
		am, err := KubeAccessMode(c.GetAccessMode().GetMode())
		if err != nil {
			return "", nil, err
		}
		if !slices.Contains(modes, am) {
			modes = append(modes, am)
		}
	}
	return mode, modes, nil
}

// VolumeMode returns Block or Filesystem for one capability.
func VolumeMode(c *csi.VolumeCapability) (corev1.PersistentVolumeMode, error) {
	switch {
	case c == nil:
		return "", fmt.Errorf("volume capability is required")
	case c.GetAccessMode() == nil:
		return "", fmt.Errorf("volume capability access mode is required")
	case c.GetBlock() != nil:
		return corev1.PersistentVolumeBlock, nil
	case c.GetMount() != nil:
		return corev1.PersistentVolumeFilesystem, nil
	}
	return "", fmt.Errorf("volume capability access type (block or mount) is required")
}

// IsReadOnly reports whether a capability's access mode only reads.
func IsReadOnly(c *csi.VolumeCapability) bool {
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:
		return true
	}
	return false
}
