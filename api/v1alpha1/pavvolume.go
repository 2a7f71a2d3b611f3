package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// PavVolume names the record pav keeps of each dynamically provisioned volume.
const (
	VolumeKind      = "PavVolume"
	VolumeResource  = "pavvolumes"
	VolumeShortName = "pavvol"

	// LabelVolumeProvisioner, on a PavVolume, is the provisioner that owns it
	// (a driver's informer selects its own records on it).
	LabelVolumeProvisioner = GroupName + "/provisioner"
	// LabelVolumeHandle, on a PavVolume, is HandleLabel(status.handle), set
	// once the handle is known: DeleteVolume finds the record by it.
	LabelVolumeHandle = GroupName + "/handle"
	// LabelVolumeNode, on the PavVolume of an inline ephemeral volume, is
	// its node (spec.ephemeral.node; hashed like podrunner.NodeLabel when
	// the name is not a label value), so that `kubectl get pavvol -l` finds a
	// node's inline volumes.
	LabelVolumeNode = GroupName + "/node"

	// AnnotationWhenNamespaceGone, on a PavVolume, is a cluster
	// administrator's word for that one volume, overriding its provisioner's
	// spec.volumeDeletion.whenNamespaceGone: Forget or Retry. Only
	// administrators (and pav's controller ServiceAccount; a node plugin
	// only its node's inline volumes') may write PavVolumes; a tenant never can, so no tenant can have a deletion
	// skipped. It counts only while the volume's deletion pod cannot be
	// created because its namespace is gone (ReasonDeletionNamespaceGone).
	AnnotationWhenNamespaceGone = GroupName + "/when-namespace-gone"
)

// VolumeGroupVersionResource and VolumeGroupVersionKind are PavVolume's.
var (
	VolumeGroupVersionResource = SchemeGroupVersion.WithResource(VolumeResource)
	VolumeGroupVersionKind     = SchemeGroupVersion.WithKind(VolumeKind)
)

// PavVolume is pav's record of one dynamically provisioned volume: what it was
// created from and every later phase needs (spec, written once), and how far
// its life has come (status). It is cluster-scoped and only pav's controller
// ServiceAccount may write it, unlike a PVC annotation, which any tenant who
// may edit the claim can forge. It exists from the start of CreateVolume until
// DeleteVolume (or the revert of a failed creation) has finished.
//
// There is no status subresource: pav is the only writer, and each transition
// is one Update guarded by resourceVersion.
type PavVolume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PavVolumeSpec   `json:"spec"`
	Status PavVolumeStatus `json:"status,omitempty"`
}

// PavVolumeSpec is the snapshot CreateVolume took: the CSI request and, with
// external-provisioner's --extra-create-metadata, the claim and its
// StorageClass. Deletion and reverts evaluate their templates on it, so they
// see what creation saw, whether or not the PVC or StorageClass still exist.
type PavVolumeSpec struct {
	// Provisioner is the PavProvisioner (and CSI driver) that owns the volume.
	Provisioner string `json:"provisioner"`
	// VolumeName is the CSI volume name (external-provisioner's pvc-<uid>).
	VolumeName string `json:"volumeName"`
	// Claim is "namespace/name" of the PVC, if known (for people: kubectl get).
	Claim string `json:"claim,omitempty"`

	RequestedVolumeMode  corev1.PersistentVolumeMode         `json:"requestedVolumeMode"`
	RequestedAccessModes []corev1.PersistentVolumeAccessMode `json:"requestedAccessModes,omitempty"`
	RequestedMinCapacity int64                               `json:"requestedMinCapacity"`
	RequestedMaxCapacity *int64                              `json:"requestedMaxCapacity,omitempty"`
	// Params are the StorageClass parameters the user wrote (no sidecar keys).
	Params map[string]string `json:"params,omitempty"`
	// DefaultHandle is pvc-<PVC uid> (or the volume name without a PVC).
	DefaultHandle string `json:"defaultHandle"`
	// PVC and SC are the claim and StorageClass as creation saw them, trimmed
	// of managedFields and kubectl's last-applied annotation.
	PVC *corev1.PersistentVolumeClaim `json:"pvc,omitempty"`
	SC  *storagev1.StorageClass       `json:"sc,omitempty"`
	// AccessibilityRequirements are CreateVolume's, as first asked: a retry
	// after a reschedule may ask for another node, but the volume's pods and
	// topology follow what creation started with.
	AccessibilityRequirements *TopologyRequirement `json:"accessibilityRequirements,omitempty"`
	// Source is what the volume is created from (CSI volume_content_source),
	// nil for an empty volume.
	Source *VolumeSource `json:"source,omitempty"`
	// MutableParams are CreateVolume's mutable_parameters: the parameters of
	// the claim's VolumeAttributesClass when the volume was created (keys
	// spec.volumeModification.mutableParameters declares), nil without one.
	// A later ControllerModifyVolume records the current ones in
	// status.mutableParams.
	MutableParams map[string]string `json:"mutableParams,omitempty"`
	// FormatVersion is the version of the record's format (records.VolumeFormat
	// when pav writes it; 0: written before records had one). A pav that reads
	// an older version migrates it, and refuses a newer one (a downgrade)
	// instead of misreading it. The only field of spec a later write changes.
	FormatVersion int `json:"formatVersion,omitempty"`
	// Adopted is set when the record was not made by CreateVolume but built
	// from the PersistentVolume of a volume an older pav created without a
	// record (v0.2.0), so that it is expanded, snapshotted and deleted as any
	// other.
	Adopted *VolumeAdoption `json:"adopted,omitempty"`
	// Ephemeral is set for a CSI inline ephemeral volume (a pod's `csi`
	// volume): its node and pod. Its record is written by the node plugin of
	// that node (an admission policy lets it write no other), and is named
	// after the CSI volume id, which is also its handle. Immutable.
	Ephemeral *EphemeralVolume `json:"ephemeral,omitempty"`
}

// EphemeralVolume says where an inline ephemeral volume lives: every pod pav
// runs for it runs on Node, and it goes with Pod.
type EphemeralVolume struct {
	// Node is the node whose node plugin created the volume and writes the
	// record.
	Node string `json:"node"`
	// Pod is the pod whose volume it is, as the kubelet told the node plugin
	// (CSIDriver podInfoOnMount).
	Pod EphemeralPod `json:"pod"`
}

// EphemeralPod is the pod of an inline ephemeral volume: the contexts' `pod`.
type EphemeralPod struct {
	Namespace          string    `json:"namespace"`
	Name               string    `json:"name"`
	UID                types.UID `json:"uid"`
	ServiceAccountName string    `json:"serviceAccountName,omitempty"`
}

// VolumeAdoption says where an adopted record came from.
type VolumeAdoption struct {
	// PersistentVolume is the PV the record was built from: its CSI volume
	// attributes, written by the older pav, and its claim reference and
	// capacity, written by external-provisioner and Kubernetes. Never a PVC
	// annotation, which tenants can write.
	PersistentVolume string `json:"persistentVolume"`
	// Release is the pav release whose format the PV's attributes have.
	Release string `json:"release"`
	// Time is when pav adopted the volume.
	Time metav1.Time `json:"time"`
}

// TopologyRequirement is CSI's TopologyRequirement: the segments (maps of
// topology key to value) a volume must be reachable from one of (requisite),
// and those to favour, in order (preferred; with WaitForFirstConsumer the
// first is the selected node's).
type TopologyRequirement struct {
	Requisite []map[string]string `json:"requisite,omitempty"`
	Preferred []map[string]string `json:"preferred,omitempty"`
}

// Kinds of VolumeSource.
const (
	SourceKindSnapshot = "Snapshot"
	SourceKindVolume   = "Volume"
)

// VolumeSource is the snapshot or volume a volume is created from, as the
// validation and creation contexts see it (`source`), read from that
// snapshot's or volume's record when the volume was recorded.
type VolumeSource struct {
	Kind     string `json:"kind"`
	Handle   string `json:"handle"`
	Capacity int64  `json:"capacity"`
	// VolumeHandle is, for a snapshot, the volume it was taken of.
	VolumeHandle string `json:"volumeHandle,omitempty"`
}

// VolumePhase is how far a volume's life has come.
type VolumePhase string

const (
	// VolumeValidating: the validation pod runs (or is about to).
	VolumeValidating VolumePhase = "Validating"
	// VolumeCreating: validation passed; the creation pod runs.
	VolumeCreating VolumePhase = "Creating"
	// VolumeCreated: the volume exists; status.handle and capacity are final.
	VolumeCreated VolumePhase = "Created"
	// VolumeReverting: creation failed for good; the deletion pod undoes it.
	VolumeReverting VolumePhase = "Reverting"
	// VolumeDeleting: DeleteVolume runs the deletion pod.
	VolumeDeleting VolumePhase = "Deleting"
)

// Reasons of a failed creation (PavVolumeStatus.Reason).
const (
	// ReasonCreationFailed: the creation pod failed (or timed out, or could
	// not be scheduled or pull its image).
	ReasonCreationFailed = "CreationFailed"
	// ReasonInvalidCreationOutput: the creation pod succeeded but left an
	// unusable /pav/handle or /pav/capacity.
	ReasonInvalidCreationOutput = "InvalidCreationOutput"
	// ReasonCapacityOutOfRange: the created volume's capacity is unknown or
	// outside the requested range.
	ReasonCapacityOutOfRange = "CapacityOutOfRange"
	// ReasonOutsideRequisiteTopology: the created volume is reachable from
	// none of the requisite topology segments (the creation pod's
	// /pav/topology, or volumeCreation.accessibleTopology, put it elsewhere).
	ReasonOutsideRequisiteTopology = "OutsideRequisiteTopology"
)

// Reasons of a deletion (or revert) that cannot go on by itself.
const (
	// ReasonDeletionNamespaceGone: the deletion pod cannot be created because
	// the namespace it must run in no longer exists or is being deleted (the
	// API server said so). pav keeps the record and retries; the message
	// names the namespace, what put the pod there, and the ways out
	// (WhenNamespaceGone).
	ReasonDeletionNamespaceGone = "DeletionNamespaceGone"
	// ReasonForgotten: the deletion pod's namespace is gone and
	// WhenNamespaceGone Forget applies. Recorded before the record is
	// deleted without any pod, so that a retry after a restart finishes
	// forgetting instead of deciding again.
	ReasonForgotten = "Forgotten"
)

// PodOutcome is what became of a pod pav ran for a volume.
type PodOutcome string

const (
	// PodRunning: no outcome recorded yet (the pod runs, or is about to).
	PodRunning PodOutcome = ""
	// PodSucceeded and PodFailed: the recorded outcome of a finished pod.
	PodSucceeded PodOutcome = "Succeeded"
	PodFailed    PodOutcome = "Failed"
	// PodLost: the pod was deleted by someone else before it finished; its
	// outcome is unknown and the phase ran again, in a new pod.
	PodLost PodOutcome = "Lost"
)

// PavVolumeStatus is the state of a volume's life.
type PavVolumeStatus struct {
	Phase VolumePhase `json:"phase,omitempty"`
	// Handle and Capacity (bytes) of the created volume, once known (Created,
	// and Reverting when creation got that far).
	Handle   string `json:"handle,omitempty"`
	Capacity int64  `json:"capacity,omitempty"`
	// AccessibleTopology is where the created volume can be reached from
	// (CreateVolume's accessible_topology); empty: everywhere.
	AccessibleTopology []map[string]string `json:"accessibleTopology,omitempty"`
	// Reason is why creation failed, while the volume is Reverting (one of
	// the Reason* constants): the failure the caller gets once the revert is
	// done, whatever restarts come in between. While the volume is Deleting
	// or Reverting it is ReasonDeletionNamespaceGone when the deletion pod
	// cannot be created because its namespace is gone, and ReasonForgotten
	// once pav has decided to forget the volume without it.
	Reason string `json:"reason,omitempty"`
	// Message is the last failure, as the user saw it in the PVC's events.
	Message string `json:"message,omitempty"`
	// Pods are the pods pav ran or runs for the volume, one entry per pod,
	// recorded before each pod is asked for.
	Pods []VolumePod `json:"pods,omitempty"`
	// Expansion is the growth under way (ControllerExpandVolume), recorded
	// with its pod's entry before the pod is asked for, so that a retry
	// (after any restart) finishes it with the request the pod was given;
	// nil when none is.
	Expansion *VolumeExpansion `json:"expansion,omitempty"`
	// MutableParams are the volume's mutable parameters once a
	// ControllerModifyVolume changed them (the whole set its
	// VolumeAttributesClass gave, never empty); nil until then, when
	// spec.mutableParams holds (CurrentMutableParams).
	MutableParams map[string]string `json:"mutableParams,omitempty"`
	// Modification is the change of mutable parameters under way
	// (ControllerModifyVolume), recorded with its pod's entry before the
	// pod is asked for, so that a retry (after any restart) finishes it
	// with the parameters that pod was given; nil when none is.
	Modification *VolumeModification `json:"modification,omitempty"`
}

// VolumeModification is a change of a volume's mutable parameters under way:
// MutableParams is the new set (the VolumeAttributesClass's parameters).
type VolumeModification struct {
	MutableParams map[string]string `json:"mutableParams"`
}

// CurrentMutableParams are the volume's mutable parameters now: the last
// modification's (status.mutableParams), else CreateVolume's
// (spec.mutableParams); nil when it never had any.
func (v *PavVolume) CurrentMutableParams() map[string]string {
	if v.Status.MutableParams != nil {
		return v.Status.MutableParams
	}
	return v.Spec.MutableParams
}

// VolumeExpansion is the request of a growth under way (CSI's capacity
// range): the volume must grow to at least RequiredBytes, and to at most
// LimitBytes when set.
type VolumeExpansion struct {
	RequiredBytes int64  `json:"requiredBytes"`
	LimitBytes    *int64 `json:"limitBytes,omitempty"`
}

// VolumePod is the identity of one pod pav ran for a volume: only a pod with
// this UID (or, until the UID is recorded, this token) is ever adopted or
// deleted as this phase's pod.
type VolumePod struct {
	Phase     Phase      `json:"phase"`
	Namespace string     `json:"namespace"`
	Name      string     `json:"name"`
	Token     string     `json:"token"`
	UID       types.UID  `json:"uid,omitempty"`
	Outcome   PodOutcome `json:"outcome,omitempty"`
}

// Pod returns the last pod entry of a phase, or nil.
func (s *PavVolumeStatus) Pod(ph Phase) *VolumePod { return LastPod(s.Pods, ph) }

// LastPod is the last entry of a phase in a record's pod entries, or nil:
// the one its phase runs or ran last (earlier ones failed or were lost).
func LastPod(pods []VolumePod, ph Phase) *VolumePod {
	for i := len(pods) - 1; i >= 0; i-- {
		if pods[i].Phase == ph {
			return &pods[i]
		}
	}
	return nil
}

// VolumeRecordName is the PavVolume name of a CSI volume name: the name itself
// when it is a DNS subdomain (external-provisioner's pvc-<uid>, so that
// `kubectl get pavvol` lines up with `kubectl get pv`), else v-<32 hex digits of
// its SHA-256>.
func VolumeRecordName(volumeName string) string {
	if len(validation.NameIsDNSSubdomain(volumeName, false)) == 0 {
		return volumeName
	}
	sum := sha256.Sum256([]byte(volumeName))
	return "v-" + hex.EncodeToString(sum[:16])
}

// HandleLabel is the value of LabelVolumeHandle for a handle: handles are
// arbitrary strings, label values are not.
func HandleLabel(handle string) string {
	sum := sha256.Sum256([]byte(handle))
	return hex.EncodeToString(sum[:16])
}

// PavVolumeList is a list of PavVolumes.
type PavVolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PavVolume `json:"items"`
}

// DeepCopyObject implements runtime.Object.
func (v *PavVolume) DeepCopyObject() runtime.Object { return v.DeepCopy() }

// DeepCopy copies the record through JSON, as PavProvisioner does: the record
// holds whole API objects, and it is copied once per transition.
func (v *PavVolume) DeepCopy() *PavVolume {
	return jsonCopy(v)
}

// DeepCopyObject implements runtime.Object.
func (l *PavVolumeList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	return jsonCopy(l)
}
