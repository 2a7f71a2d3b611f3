package volume

import (
	"fmt"
	"strings"
)

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

// The keys the kubelet adds to the volume_context of NodePublishVolume when
// the CSIDriver has podInfoOnMount (it overrides any a pod author wrote), and
// KeyEphemeral "true" marks a CSI inline ephemeral volume (a pod's csi
// volume, whose other keys are the pod's volumeAttributes).
const (
	KeyEphemeral          = csiPrefix + "ephemeral"
	KeyPodName            = csiPrefix + "pod.name"
	KeyPodNamespace       = csiPrefix + "pod.namespace"
	KeyPodUID             = csiPrefix + "pod.uid"
	KeyServiceAccountName = csiPrefix + "serviceAccount.name"
)

// kubeletKeys are the keys the kubelet itself puts in a NodePublishVolume's
// volume_context: the pod information, and the service account tokens of a
// CSIDriver with tokenRequests (which pav's have not).
var kubeletKeys = map[string]bool{KeyEphemeral: true, KeyPodName: true, KeyPodNamespace: true, KeyPodUID: true,
	KeyServiceAccountName: true, csiPrefix + "serviceAccount.tokens": true}

// InlineParams returns the `params` of an inline ephemeral volume: its pod's
// volumeAttributes, which the pod's author wrote. A key of a reserved prefix
// (csi.storage.k8s.io/ other than the kubelet's own, pav's, or
// storage.kubernetes.io/) is refused rather than dropped: the author meant
// something by it, and pav's own keys must never come from a tenant.
func InlineParams(vc map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(vc))
	for k, v := range vc {
		switch {
		case kubeletKeys[k]:
		case strings.HasPrefix(k, KeyPrefix), strings.HasPrefix(k, csiPrefix), strings.HasPrefix(k, storagePrefix):
			return nil, fmt.Errorf("volumeAttributes key %q is reserved (keys starting with %s, %s or %s are Kubernetes' and pav's own): remove it from the pod's csi volume",
				k, csiPrefix, KeyPrefix, storagePrefix)
		default:
			out[k] = v
		}
	}
	return out, nil
}
