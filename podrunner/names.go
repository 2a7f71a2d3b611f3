package podrunner

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/report"
)

const (
	// LabelProvisioner holds the provisioner name; the informer selects on it.
	LabelProvisioner = "pav.albertofaria.github.io/provisioner"
	// LabelPhase holds the phase (v1alpha1.Phases: validation, creation, ...).
	LabelPhase = "pav.albertofaria.github.io/phase"
	// LabelVolume holds a label-safe hash of the operation's VolumeKey (see VolumeLabel).
	LabelVolume = "pav.albertofaria.github.io/volume"
	// LabelNode is set on staging/unstaging pods (see NodeLabel); node plugins select on it.
	LabelNode = "pav.albertofaria.github.io/node"
	// AnnotationVolumeKey holds the full VolumeKey: a pod is adopted only if it matches.
	AnnotationVolumeKey = "pav.albertofaria.github.io/volume-key"
	// AnnotationToken holds the Operation.Token the caller recorded before the
	// pod was created: with the recorded UID, the only proof that pav made it.
	AnnotationToken = "pav.albertofaria.github.io/token"
	// AnnotationEnded holds the report of a wrapped controller-side pod's
	// successful command, as the node plugin of its node relays it from
	// /pav/.pav-ended (internal/endrelay), before the kubelet publishes the
	// container's end. Taken only on pods in the driver's own namespace.
	AnnotationEnded = "pav.albertofaria.github.io/ended"
	// ReportContainer is the native sidecar that reports the /pav files.
	ReportContainer = "pav-report"
	// VolumeName is the injected volume, mounted at MountPath in every container.
	VolumeName = "pav"
	// MountPath is where the pav volume is mounted.
	MountPath = report.Dir
	// ReportVolume is the image volume (the report image) that brings
	// pav-report into the container it wraps (ReportExec), mounted read-only
	// at ReportDir.
	ReportVolume = "pav-report"
	ReportDir    = "/.pav-report"
	// ReportExecPath is pav-report in a wrapped container: the report image
	// keeps it in /usr/local/bin.
	ReportExecPath = ReportDir + "/usr/local/bin/" + ReportCommand
)

const (
	podNamePrefix = "pav-"
	// nameHashLen hex digits (64 bits) of the operation hash end every pod name.
	nameHashLen = 16
	// maxPhaseLen bounds the phase part of a name: PaV's phases fit (validation,
	// unstaging); pav's longer ones (nodeexpansion, snapshotcreation,
	// groupsnapshotcreation and groupsnapshotdeletion, which share their first 12
	// characters) are cut, and the hash, which covers the whole phase, keeps
	// their names apart.
	maxPhaseLen = 12
	// maxTokenLen bounds Operation.Token (NewToken makes 32 hex digits).
	maxTokenLen = 256
)

// NodeVolumeKey is the volume key of a node operation (staging, unstaging,
// node expansion) of a volume handle on a node.
func NodeVolumeKey(handle, node string) string { return handle + "@" + node }

// SplitNodeVolumeKey is NodeVolumeKey undone. A handle may hold "@"; a node
// name (a DNS subdomain) cannot, so the last "@" splits them.
func SplitNodeVolumeKey(key string) (handle, node string, ok bool) {
	i := strings.LastIndex(key, "@")
	if i < 0 {
		return "", "", false
	}
	return key[:i], key[i+1:], true
}

// PodName is the deterministic name of an operation's pod:
// pav-<provisioner, truncated>-<phase>-<16 hex digits>. It is at most 63
// characters, so it is a DNS label: a valid pod name, label value and hostname.
//
// The hash covers the whole triple (not just volumeKey) so two provisioners whose
// names share a truncated prefix never collide; the adoption check
// (AnnotationVolumeKey) catches whatever collision remains.
func PodName(provisioner string, phase v1alpha1.Phase, volumeKey string) string {
	sum := sha256.Sum256([]byte(provisioner + "\x00" + string(phase) + "\x00" + volumeKey))
	hash := hex.EncodeToString(sum[:])[:nameHashLen]
	ph := sanitize(string(phase))
	if len(ph) > maxPhaseLen {
		ph = ph[:maxPhaseLen]
	}
	room := validation.DNS1123LabelMaxLength - len(podNamePrefix) - len(ph) - nameHashLen - 2
	prov := sanitize(provisioner)
	if len(prov) > room {
		prov = prov[:room]
	}
	return podNamePrefix + prov + "-" + ph + "-" + hash
}

// VolumeLabel is the value of LabelVolume for a VolumeKey: VolumeKeys (handles,
// "handle@node") are not label-safe, so the label holds 32 hex digits of their
// SHA-256, and the full key goes to AnnotationVolumeKey.
func VolumeLabel(volumeKey string) string {
	sum := sha256.Sum256([]byte(volumeKey))
	return hex.EncodeToString(sum[:16])
}

// NodeLabel is the value of LabelNode for a node name. Node names are DNS
// subdomains of up to 253 characters but label values stop at 63, so longer (or
// otherwise label-unsafe) names are truncated and suffixed with a hash.
func NodeLabel(node string) string {
	if len(validation.IsValidLabelValue(node)) == 0 {
		return node
	}
	sum := sha256.Sum256([]byte(node))
	hash := hex.EncodeToString(sum[:])[:nameHashLen]
	prefix := strings.Trim(sanitize(node), "-")
	if max := validation.LabelValueMaxLength - nameHashLen - 1; len(prefix) > max {
		prefix = strings.Trim(prefix[:max], "-")
	}
	if prefix == "" {
		return hash
	}
	return prefix + "-" + hash
}

// sanitize lower-cases s and replaces anything but [a-z0-9-] with '-'.
func sanitize(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			b[i] = '-'
		}
	}
	return string(b)
}
