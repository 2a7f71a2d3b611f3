// Package volume holds what the controller and node plugins share about a pav
// volume: the keys pav keeps in its volume_context (PV volumeAttributes), CSI ↔
// Kubernetes mode mapping, and the lookups of PVs by handle.
package volume

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

const (
	// KeyPrefix marks pav's own volume_context keys; they are hidden from the
	// `params` templates see, which hold only the StorageClass parameters.
	KeyPrefix = v1alpha1.GroupName + "/"
	// KeyCapacity holds the created volume's capacity in bytes; its presence marks a
	// dynamically provisioned volume (a static PV's attributes are the user's).
	KeyCapacity = KeyPrefix + "capacity"
	// KeyClaim holds the Claim snapshot that the deletion phase's context needs
	// after the PVC itself is gone.
	KeyClaim = KeyPrefix + "claim"
	// AnnotationCreated, on a PVC, records a finished CreateVolume so that a retry
	// after a lost response (or a driver restart) returns the same volume instead
	// of running the creation pod again.
	AnnotationCreated = KeyPrefix + "created-volume"

	// CSI parameter keys external-provisioner adds with --extra-create-metadata.
	ParamPVCName      = "csi.storage.k8s.io/pvc/name"
	ParamPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	ParamPVName       = "csi.storage.k8s.io/pv/name"
	csiPrefix         = "csi.storage.k8s.io/"
	// storagePrefix: external-provisioner adds storage.kubernetes.io/csiProvisionerIdentity
	// to every PV's volumeAttributes.
	storagePrefix = "storage.kubernetes.io/"
)

// Claim is what a dynamically provisioned volume was created from.
type Claim struct {
	PVC                  *corev1.PersistentVolumeClaim       `json:"pvc,omitempty"`
	SC                   *storagev1.StorageClass             `json:"sc,omitempty"`
	RequestedVolumeMode  corev1.PersistentVolumeMode         `json:"requestedVolumeMode"`
	RequestedAccessModes []corev1.PersistentVolumeAccessMode `json:"requestedAccessModes"`
	RequestedMinCapacity int64                               `json:"requestedMinCapacity"`
	RequestedMaxCapacity *int64                              `json:"requestedMaxCapacity,omitempty"`
	DefaultHandle        string                              `json:"defaultHandle"`
}

// Created is the record of a finished CreateVolume (PVC annotation).
type Created struct {
	Name     string `json:"name"`
	Handle   string `json:"handle"`
	Capacity int64  `json:"capacity"`
}

// UserParams returns the parameters templates see as `params`: the map without
// pav's own keys and the keys the sidecars add (csi.storage.k8s.io/,
// storage.kubernetes.io/), so `params` holds what the user wrote.
func UserParams(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		if strings.HasPrefix(k, KeyPrefix) || strings.HasPrefix(k, csiPrefix) || strings.HasPrefix(k, storagePrefix) {
			continue
		}
		out[k] = v
	}
	return out
}

// Context builds the volume_context of a created volume.
func Context(params map[string]string, capacity int64, claim *Claim) (map[string]string, error) {
	out := UserParams(params)
	out[KeyCapacity] = strconv.FormatInt(capacity, 10)
	if claim != nil {
		b, err := json.Marshal(claim)
		if err != nil {
			return nil, err
		}
		out[KeyClaim] = string(b)
	}
	return out, nil
}

// ParseContext reads pav's keys back. ok is false for a volume pav did not create
// (static provisioning).
func ParseContext(vc map[string]string) (capacity int64, claim *Claim, ok bool, err error) {
	s, ok := vc[KeyCapacity]
	if !ok {
		return 0, nil, false, nil
	}
	if capacity, err = strconv.ParseInt(s, 10, 64); err != nil {
		return 0, nil, true, fmt.Errorf("volume context key %s: %w", KeyCapacity, err)
	}
	if c, ok := vc[KeyClaim]; ok {
		claim = &Claim{}
		if err := json.Unmarshal([]byte(c), claim); err != nil {
			return 0, nil, true, fmt.Errorf("volume context key %s: %w", KeyClaim, err)
		}
	}
	return capacity, claim, true, nil
}

// Snapshot trims an object's metadata to what templates use, so the volume
// context stays small: managedFields and kubectl's last-applied copy go.
func Snapshot(m *metav1.ObjectMeta) {
	m.ManagedFields = nil
	if _, ok := m.Annotations[corev1.LastAppliedConfigAnnotation]; ok {
		a := make(map[string]string, len(m.Annotations))
		for k, v := range m.Annotations {
			if k != corev1.LastAppliedConfigAnnotation {
				a[k] = v
			}
		}
		m.Annotations = a
	}
}

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
		m, err := CapabilityMode(c)
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

// CapabilityMode returns Block or Filesystem for one capability.
func CapabilityMode(c *csi.VolumeCapability) (corev1.PersistentVolumeMode, error) {
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
