// Package volume holds what the controller and node plugins share about a pav
// volume: pav's keys in its volume_context (PV volumeAttributes, context.go),
// the parameters templates see as `params` (params.go), and the trimming of the
// claim and StorageClass snapshots the PavVolume record carries (snapshot.go).
package volume

import (
	"fmt"
	"strconv"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

const (
	// KeyPrefix marks pav's own volume_context keys; they are hidden from the
	// `params` templates see, which hold only the StorageClass parameters.
	KeyPrefix = v1alpha1.GroupName + "/"
	// KeyCapacity holds the created volume's capacity in bytes; its presence marks a
	// dynamically provisioned volume (a static PV's attributes are the user's).
	KeyCapacity = KeyPrefix + "capacity"
	// KeyPV holds the name of the volume's PersistentVolume (external-provisioner's
	// csi.storage.k8s.io/pv/name), so that the node plugin can read its PV with
	// one GET instead of watching every PV of the cluster.
	KeyPV = KeyPrefix + "pv"
)

// Context builds the volume_context of a created volume: the StorageClass
// parameters, the capacity and the PV name (if known). What later phases need
// of the claim lives in the volume's PavVolume record, which only pav can
// write, not here: PV attributes are copied around, and were once forgeable
// through a PVC annotation.
func Context(params map[string]string, capacity int64, pvName string) map[string]string {
	out := UserParams(params)
	out[KeyCapacity] = strconv.FormatInt(capacity, 10)
	if pvName != "" {
		out[KeyPV] = pvName
	}
	return out
}

// ParseContext reads pav's keys back. ok is false for a volume pav did not create
// (static provisioning).
func ParseContext(vc map[string]string) (capacity int64, ok bool, err error) {
	s, ok := vc[KeyCapacity]
	if !ok {
		return 0, false, nil
	}
	if capacity, err = strconv.ParseInt(s, 10, 64); err != nil {
		return 0, true, fmt.Errorf("volume context key %s: %w", KeyCapacity, err)
	}
	return capacity, true, nil
}
