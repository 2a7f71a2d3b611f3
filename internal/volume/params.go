package volume

import "strings"

// CSI parameter keys external-provisioner adds with --extra-create-metadata.
const (
	ParamPVCName      = "csi.storage.k8s.io/pvc/name"
	ParamPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	ParamPVName       = "csi.storage.k8s.io/pv/name"
	csiPrefix         = "csi.storage.k8s.io/"
	// storagePrefix: external-provisioner adds storage.kubernetes.io/csiProvisionerIdentity
	// to every PV's volumeAttributes.
	storagePrefix = "storage.kubernetes.io/"
)

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
