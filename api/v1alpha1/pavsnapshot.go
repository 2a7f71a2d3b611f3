package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// PavSnapshot names the record pav keeps of each snapshot.
const (
	SnapshotKind      = "PavSnapshot"
	SnapshotResource  = "pavsnapshots"
	SnapshotShortName = "pavsnap"

	// LabelSnapshotSourceVolume, on a PavSnapshot, is HandleLabel of the
	// source volume's handle: ListSnapshots filters on it. (The provisioner
	// and handle labels are LabelVolumeProvisioner and LabelVolumeHandle.)
	LabelSnapshotSourceVolume = GroupName + "/source-volume"
)

// SnapshotGroupVersionResource and SnapshotGroupVersionKind are PavSnapshot's.
var (
	SnapshotGroupVersionResource = SchemeGroupVersion.WithResource(SnapshotResource)
	SnapshotGroupVersionKind     = SchemeGroupVersion.WithKind(SnapshotKind)
)

// PavSnapshot is pav's record of one snapshot, as PavVolume is of a volume:
// cluster-scoped, written only by pav's controller ServiceAccount, from the
// start of CreateSnapshot until DeleteSnapshot has finished. It holds what the
// snapshot's pods need of the source volume, so a snapshot outlives its
// volume (and the volume's record).
type PavSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PavSnapshotSpec   `json:"spec"`
	Status PavSnapshotStatus `json:"status,omitempty"`
}

// PavSnapshotSpec is what CreateSnapshot saw, written once.
type PavSnapshotSpec struct {
	// Provisioner is the PavProvisioner (and CSI driver) that owns the snapshot.
	Provisioner string `json:"provisioner"`
	// SnapshotName is the CSI snapshot name (csi-snapshotter's snapshot-<uid>).
	SnapshotName string `json:"snapshotName"`
	// SourceVolumeID is the handle of the volume the snapshot was taken of,
	// SourceVolumeRecord the name of that volume's PavVolume.
	SourceVolumeID     string `json:"sourceVolumeID"`
	SourceVolumeRecord string `json:"sourceVolumeRecord"`
	// Params are the VolumeSnapshotClass parameters (no sidecar keys).
	Params map[string]string `json:"params,omitempty"`
	// VolumeSnapshot is "namespace/name" and VolumeSnapshotContent the name of
	// the Kubernetes objects, when csi-snapshotter's --extra-create-metadata
	// gave them (for people: kubectl get).
	VolumeSnapshot        string `json:"volumeSnapshot,omitempty"`
	VolumeSnapshotContent string `json:"volumeSnapshotContent,omitempty"`
	// Volume is the source volume as the snapshot's contexts see it.
	Volume SnapshotSourceVolume `json:"volume"`
	// GroupSnapshotName is the CSI name of the group snapshot (its
	// PavGroupSnapshot) the snapshot was made as a member of, and
	// GroupSnapshotHandle the group's handle (the CSI group_snapshot_id that
	// ListSnapshots and GetSnapshot report); both empty for a snapshot of its
	// own. (An older pav ignores them: it has no group snapshots, and takes a
	// member for a snapshot of its own.)
	GroupSnapshotName   string `json:"groupSnapshotName,omitempty"`
	GroupSnapshotHandle string `json:"groupSnapshotHandle,omitempty"`
	// FormatVersion is the version of the record's format, as PavVolume's
	// (records.SnapshotFormat when pav writes it; 0: written before records
	// had one).
	FormatVersion int `json:"formatVersion,omitempty"`
}

// SnapshotSourceVolume is the source volume's part of a snapshot's context,
// copied from its PavVolume when the snapshot was recorded.
type SnapshotSourceVolume struct {
	Handle     string                        `json:"handle"`
	Capacity   int64                         `json:"capacity"`
	VolumeMode corev1.PersistentVolumeMode   `json:"volumeMode"`
	Params     map[string]string             `json:"params,omitempty"`
	PVC        *corev1.PersistentVolumeClaim `json:"pvc,omitempty"`
	SC         *storagev1.StorageClass       `json:"sc,omitempty"`
}

// SnapshotPhase is how far a snapshot's life has come.
type SnapshotPhase string

const (
	// SnapshotCreating: the snapshotCreation pod runs (or is about to).
	SnapshotCreating SnapshotPhase = "Creating"
	// SnapshotCreated: the snapshot exists; status.handle and size are final.
	SnapshotCreated SnapshotPhase = "Created"
	// SnapshotDeleting: the snapshotDeletion pod runs: DeleteSnapshot, or the
	// revert of a failed creation (status.reason set).
	SnapshotDeleting SnapshotPhase = "Deleting"
)

// PavSnapshotStatus is the state of a snapshot's life.
type PavSnapshotStatus struct {
	Phase SnapshotPhase `json:"phase,omitempty"`
	// Handle (the CSI snapshot id) and Size (bytes), once known.
	Handle string `json:"handle,omitempty"`
	Size   int64  `json:"size,omitempty"`
	// CreationTime is when the snapshot was cut (the creation pod's success).
	CreationTime *metav1.Time `json:"creationTime,omitempty"`
	ReadyToUse   bool         `json:"readyToUse,omitempty"`
	// Reason is why creation failed, while a failed creation is reverted;
	// Message the last failure.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Pods are the pods pav ran or runs for the snapshot, recorded before
	// each pod is asked for.
	Pods []VolumePod `json:"pods,omitempty"`
	// MetadataListings are the spec.snapshotMetadata pods under way for this
	// snapshot (the target of GetMetadataDelta, or GetMetadataAllocated's
	// snapshot), each recorded before its pod is asked for and removed once
	// the pod is gone.
	MetadataListings []MetadataListing `json:"metadataListings,omitempty"`
}

// MetadataListing is one spec.snapshotMetadata pod: the allocated blocks of
// the snapshot (no base), or the blocks changed since a base snapshot.
type MetadataListing struct {
	// BaseHandle is the base snapshot's handle; empty: the allocated blocks.
	BaseHandle string `json:"baseHandle,omitempty"`
	// StartingOffset is where the pod was asked to list from (bytes).
	StartingOffset int64 `json:"startingOffset"`
	// Started is when the listing was recorded: a listing nobody asked for
	// again within the result's lifetime is removed, with its pod.
	Started metav1.Time `json:"started"`
	// Pod is the listing's pod (phase snapshotmetadata).
	Pod VolumePod `json:"pod"`
}

// MetadataListing returns the listing of a base handle ("": allocated), or nil.
func (s *PavSnapshotStatus) MetadataListing(base string) *MetadataListing {
	for i := range s.MetadataListings {
		if s.MetadataListings[i].BaseHandle == base {
			return &s.MetadataListings[i]
		}
	}
	return nil
}

// Pod returns the last pod entry of a phase, or nil.
func (s *PavSnapshotStatus) Pod(ph Phase) *VolumePod { return LastPod(s.Pods, ph) }

// SnapshotRecordName is the PavSnapshot name of a CSI snapshot name: the name
// itself when it is a DNS subdomain (csi-snapshotter's snapshot-<uid>), else
// s-<32 hex digits of its SHA-256>.
func SnapshotRecordName(snapshotName string) string {
	if len(validation.NameIsDNSSubdomain(snapshotName, false)) == 0 {
		return snapshotName
	}
	sum := sha256.Sum256([]byte(snapshotName))
	return "s-" + hex.EncodeToString(sum[:16])
}

// PavSnapshotList is a list of PavSnapshots.
type PavSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PavSnapshot `json:"items"`
}

// DeepCopyObject implements runtime.Object.
func (s *PavSnapshot) DeepCopyObject() runtime.Object { return s.DeepCopy() }

// DeepCopy copies the record through JSON, as PavVolume does.
func (s *PavSnapshot) DeepCopy() *PavSnapshot {
	return jsonCopy(s)
}

// DeepCopyObject implements runtime.Object.
func (l *PavSnapshotList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	return jsonCopy(l)
}
