// Package volume holds what the controller and node plugins share about a pav
// volume: the record pav keeps in its volume_context (PV volumeAttributes) and
// the PVC annotation of a finished CreateVolume (context.go), the parameters
// templates see as `params` (params.go), and the trimming of the objects that
// record carries (snapshot.go).
package volume

import (
	"encoding/json"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

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
