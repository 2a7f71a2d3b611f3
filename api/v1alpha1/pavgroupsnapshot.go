package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"

	"k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// PavGroupSnapshot names the record pav keeps of each group snapshot.
const (
	GroupSnapshotKind      = "PavGroupSnapshot"
	GroupSnapshotResource  = "pavgroupsnapshots"
	GroupSnapshotShortName = "pavgsnap"
)

// GroupSnapshotGroupVersionResource and GroupSnapshotGroupVersionKind are
// PavGroupSnapshot's.
var (
	GroupSnapshotGroupVersionResource = SchemeGroupVersion.WithResource(GroupSnapshotResource)
	GroupSnapshotGroupVersionKind     = SchemeGroupVersion.WithKind(GroupSnapshotKind)
)

// PavGroupSnapshot is pav's record of one group snapshot (a VolumeGroupSnapshot:
// CreateVolumeGroupSnapshot), kept as PavSnapshot is: cluster-scoped, written
// only by pav's controller ServiceAccount, from the start of
// CreateVolumeGroupSnapshot until DeleteVolumeGroupSnapshot (or the revert of a
// failed creation) has finished. Its members are ordinary PavSnapshots (so
// that restores, ListSnapshots and DeleteSnapshot work on them), which name the
// group (spec.groupSnapshotName, spec.groupSnapshotHandle); the group's own
// record holds what a member cannot: the group's pods, its handle, the members'
// contexts for the group's pods, and its phase.
type PavGroupSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PavGroupSnapshotSpec   `json:"spec"`
	Status PavGroupSnapshotStatus `json:"status,omitempty"`
}

// PavGroupSnapshotSpec is what CreateVolumeGroupSnapshot saw, written once.
type PavGroupSnapshotSpec struct {
	// Provisioner is the PavProvisioner (and CSI driver) that owns the group.
	Provisioner string `json:"provisioner"`
	// GroupSnapshotName is the CSI group snapshot name (csi-snapshotter's
	// groupsnapshot-<uid>).
	GroupSnapshotName string `json:"groupSnapshotName"`
	// Params are the VolumeGroupSnapshotClass parameters (no sidecar keys).
	Params map[string]string `json:"params,omitempty"`
	// VolumeGroupSnapshot is "namespace/name" and VolumeGroupSnapshotContent
	// the name of the Kubernetes objects, when csi-snapshotter's
	// --extra-create-metadata gave them (for people: kubectl get).
	VolumeGroupSnapshot        string `json:"volumeGroupSnapshot,omitempty"`
	VolumeGroupSnapshotContent string `json:"volumeGroupSnapshotContent,omitempty"`
	// Members are the group's snapshots, in the order of the first request's
	// source_volume_ids: the member's CSI snapshot name and its source
	// volume, as the group's contexts see it.
	Members []GroupSnapshotMember `json:"members"`
	// FormatVersion is the version of the record's format
	// (records.GroupSnapshotFormat when pav writes it).
	FormatVersion int `json:"formatVersion,omitempty"`
}

// GroupSnapshotMember is one member of a group snapshot, as recorded before
// any of its pods ran.
type GroupSnapshotMember struct {
	// SnapshotName is the member's CSI snapshot name, <group name>-<index>:
	// its PavSnapshot's spec.snapshotName, and its default handle.
	SnapshotName string `json:"snapshotName"`
	// SourceVolumeID is the handle of the volume it is a snapshot of,
	// SourceVolumeRecord the name of that volume's PavVolume.
	SourceVolumeID     string `json:"sourceVolumeID"`
	SourceVolumeRecord string `json:"sourceVolumeRecord"`
	// Volume is the source volume as the contexts see it (copied from its
	// PavVolume, so that the group outlives its volumes).
	Volume SnapshotSourceVolume `json:"volume"`
}

// PavGroupSnapshotStatus is the state of a group snapshot's life. Its phases
// are a PavSnapshot's: Creating → Created → Deleting; Creating → Deleting with
// a reason when creation failed and is undone.
type PavGroupSnapshotStatus struct {
	Phase SnapshotPhase `json:"phase,omitempty"`
	// Handle is the group's handle (the CSI group_snapshot_id), once known.
	Handle string `json:"handle,omitempty"`
	// CreationTime is when the group was cut; ReadyToUse once every member is.
	CreationTime *metav1.Time `json:"creationTime,omitempty"`
	ReadyToUse   bool         `json:"readyToUse,omitempty"`
	// Snapshots are the members' handles and sizes, in spec.members' order,
	// once known: what the groupSnapshotCreation pod reported (recorded before
	// the members' PavSnapshots are), or the members' own once each was made.
	// DeleteVolumeGroupSnapshot and GetVolumeGroupSnapshot check their
	// snapshot_ids against these handles, also after a member was deleted on
	// its own.
	Snapshots []GroupMemberSnapshot `json:"snapshots,omitempty"`
	// Reason is why creation failed, while a failed creation is undone;
	// Message the last failure.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Pods are the group's own pods (groupSnapshotCreation,
	// groupSnapshotDeletion), recorded before each is asked for. The
	// members' pods, when the group has none, are in their PavSnapshots.
	Pods []VolumePod `json:"pods,omitempty"`
}

// GroupMemberSnapshot is one member's snapshot: its handle and size (bytes;
// 0: unknown).
type GroupMemberSnapshot struct {
	SourceVolumeID string `json:"sourceVolumeID"`
	Handle         string `json:"handle"`
	Size           int64  `json:"size,omitempty"`
}

// Pod returns the last pod entry of a phase, or nil.
func (s *PavGroupSnapshotStatus) Pod(ph Phase) *VolumePod { return LastPod(s.Pods, ph) }

// GroupSnapshotRecordName is the PavGroupSnapshot name of a CSI group
// snapshot name: the name itself when it is a DNS subdomain
// (csi-snapshotter's groupsnapshot-<uid>), else g-<32 hex digits of its
// SHA-256>.
func GroupSnapshotRecordName(name string) string {
	if len(validation.NameIsDNSSubdomain(name, false)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "g-" + hex.EncodeToString(sum[:16])
}

// PavGroupSnapshotList is a list of PavGroupSnapshots.
type PavGroupSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PavGroupSnapshot `json:"items"`
}

// DeepCopyObject implements runtime.Object.
func (s *PavGroupSnapshot) DeepCopyObject() runtime.Object { return s.DeepCopy() }

// DeepCopy copies the record through JSON, as PavVolume does.
func (s *PavGroupSnapshot) DeepCopy() *PavGroupSnapshot { return jsonCopy(s) }

// DeepCopyObject implements runtime.Object.
func (l *PavGroupSnapshotList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	return jsonCopy(l)
}
