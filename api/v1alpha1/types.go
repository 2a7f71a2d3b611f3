// Package v1alpha1 holds the PavProvisioner API (group pav.albertofaria.github.io,
// kept from PaV so that existing PavProvisioner YAML works unchanged) and
// PavVolume, the record pav keeps of each volume it provisions.
//
// Every phase object (volumeValidation, volumeCreation, ...) and every field inside
// it may be a Jinja template string instead of its literal value, so the phases are
// kept as untyped JSON here and only turned into typed configs when a phase is
// evaluated for one volume (package phase).
package v1alpha1

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

const (
	// GroupName is the API group of PavProvisioner.
	GroupName = "pav.albertofaria.github.io"
	// Version is the only served and stored version.
	Version = "v1alpha1"
	// Kind, Resource and ShortName name the custom resource.
	Kind      = "PavProvisioner"
	Resource  = "pavprovisioners"
	ShortName = "pav"
)

// SchemeGroupVersion and Resource for clients (dynamic client, informers).
var (
	SchemeGroupVersion   = schema.GroupVersion{Group: GroupName, Version: Version}
	GroupVersionResource = SchemeGroupVersion.WithResource(Resource)
	GroupVersionKind     = SchemeGroupVersion.WithKind(Kind)
)

// ProvisioningMode is Dynamic, Static or Ephemeral.
type ProvisioningMode string

const (
	Dynamic ProvisioningMode = "Dynamic"
	Static  ProvisioningMode = "Static"
	// Ephemeral opts in to CSI ephemeral inline volumes: a pod names the
	// volume (its volumeAttributes are the params), no claim.
	Ephemeral ProvisioningMode = "Ephemeral"
)

// ProvisioningModes lists the provisioning modes, in the order docs give them.
var ProvisioningModes = []ProvisioningMode{Dynamic, Static, Ephemeral}

// Phase names one of the five templated subtrees of the spec.
type Phase string

const (
	PhaseValidation Phase = "validation"
	PhaseCreation   Phase = "creation"
	PhaseDeletion   Phase = "deletion"
	PhaseStaging    Phase = "staging"
	PhaseUnstaging  Phase = "unstaging"

	// Beyond PaV (additive; docs/beyond-pav.md).

	// PhaseExpansion grows a volume, controller side (ControllerExpandVolume).
	PhaseExpansion Phase = "expansion"
	// PhaseNodeExpansion grows a staged volume on its node (NodeExpandVolume).
	PhaseNodeExpansion Phase = "nodeexpansion"
	// PhaseSnapshotCreation and PhaseSnapshotDeletion make and remove a
	// snapshot of a volume (CreateSnapshot, DeleteSnapshot).
	PhaseSnapshotCreation Phase = "snapshotcreation"
	PhaseSnapshotDeletion Phase = "snapshotdeletion"
	// PhaseCapacity reports the free capacity of a topology segment
	// (GetCapacity; storage capacity tracking).
	PhaseCapacity Phase = "capacity"
	// PhaseModification changes the mutable parameters of a volume
	// (ControllerModifyVolume; VolumeAttributesClass).
	PhaseModification Phase = "modification"
	// PhaseGroupSnapshotCreation and PhaseGroupSnapshotDeletion make and
	// remove a snapshot of several volumes at once (CreateVolumeGroupSnapshot,
	// DeleteVolumeGroupSnapshot).
	PhaseGroupSnapshotCreation Phase = "groupsnapshotcreation"
	PhaseGroupSnapshotDeletion Phase = "groupsnapshotdeletion"
	// PhaseSnapshotMetadata lists the allocated or changed blocks of
	// snapshots (the SnapshotMetadata service; changed block tracking).
	PhaseSnapshotMetadata Phase = "snapshotmetadata"
)

// Phases lists the phases in lifecycle order: PaV's five, then pav's own.
var Phases = []Phase{PhaseValidation, PhaseCreation, PhaseDeletion, PhaseStaging, PhaseUnstaging,
	PhaseExpansion, PhaseNodeExpansion, PhaseSnapshotCreation, PhaseSnapshotDeletion,
	PhaseCapacity, PhaseModification, PhaseGroupSnapshotCreation, PhaseGroupSnapshotDeletion,
	PhaseSnapshotMetadata}

// Field is the spec field that holds the phase ("volumeValidation", ...).
func (p Phase) Field() string {
	switch p {
	case PhaseValidation:
		return "volumeValidation"
	case PhaseCreation:
		return "volumeCreation"
	case PhaseDeletion:
		return "volumeDeletion"
	case PhaseStaging:
		return "volumeStaging"
	case PhaseUnstaging:
		return "volumeUnstaging"
	case PhaseExpansion:
		return "volumeExpansion"
	case PhaseNodeExpansion:
		return "volumeNodeExpansion"
	case PhaseSnapshotCreation:
		return "snapshotCreation"
	case PhaseSnapshotDeletion:
		return "snapshotDeletion"
	case PhaseCapacity:
		return "storageCapacity"
	case PhaseModification:
		return "volumeModification"
	case PhaseGroupSnapshotCreation:
		return "groupSnapshotCreation"
	case PhaseGroupSnapshotDeletion:
		return "groupSnapshotDeletion"
	case PhaseSnapshotMetadata:
		return "snapshotMetadata"
	}
	return ""
}

// PavProvisioner implements one volume provisioner (and one CSI driver of the same
// name) whose volume operations are pods instantiated from templates.
type PavProvisioner struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PavProvisionerSpec   `json:"spec"`
	Status PavProvisionerStatus `json:"status,omitempty"`
}

// PavProvisionerSpec is the user's provisioner. Each phase is a JSON value: an
// object, or a template string that evaluates (usually through `yaml`) to one.
type PavProvisionerSpec struct {
	ProvisioningModes []ProvisioningMode `json:"provisioningModes"`

	VolumeValidation *Value `json:"volumeValidation,omitempty"`
	VolumeCreation   *Value `json:"volumeCreation,omitempty"`
	VolumeDeletion   *Value `json:"volumeDeletion,omitempty"`
	VolumeStaging    *Value `json:"volumeStaging,omitempty"`
	VolumeUnstaging  *Value `json:"volumeUnstaging,omitempty"`

	// Beyond PaV: optional, additive phases (same templating and /pav contract).

	// VolumeExpansion (controller side) grows volumes: ControllerExpandVolume
	// runs its pod, if any. Its presence advertises EXPAND_VOLUME.
	VolumeExpansion *Value `json:"volumeExpansion,omitempty"`
	// VolumeNodeExpansion grows a staged volume on its node (NodeExpandVolume,
	// e.g. resize2fs or losetup -c); it needs VolumeExpansion.
	VolumeNodeExpansion *Value `json:"volumeNodeExpansion,omitempty"`
	// SnapshotCreation and SnapshotDeletion make and remove snapshots
	// (CreateSnapshot, DeleteSnapshot, ListSnapshots); Dynamic only.
	SnapshotCreation *Value `json:"snapshotCreation,omitempty"`
	SnapshotDeletion *Value `json:"snapshotDeletion,omitempty"`
	// Topology makes volumes topology-aware: never templated, since the node
	// plugin reports it before any volume exists.
	Topology *Topology `json:"topology,omitempty"`

	// MaxVolumesPerNode is the most volumes of this provisioner a node takes
	// (NodeGetInfo's max_volumes_per_node; the scheduler stops there). A
	// literal integer >= 1, never a template; nil: no limit.
	MaxVolumesPerNode *int64 `json:"maxVolumesPerNode,omitempty"`
	// StorageCapacity reports the free capacity of each topology segment
	// (GetCapacity, CSIStorageCapacity objects). Its refreshInterval is a
	// literal; its podTemplate is required.
	StorageCapacity *Value `json:"storageCapacity,omitempty"`
	// VolumeModification changes the mutable parameters of volumes, which a
	// VolumeAttributesClass sets (ControllerModifyVolume, CreateVolume's
	// mutable_parameters); Dynamic only. Its mutableParameters is a literal.
	VolumeModification *Value `json:"volumeModification,omitempty"`
	// GroupSnapshotCreation and GroupSnapshotDeletion make and remove
	// snapshots of several volumes at once (the GroupController service);
	// Dynamic only, with SnapshotCreation. Without their pod templates, each
	// member's snapshot pod runs.
	GroupSnapshotCreation *Value `json:"groupSnapshotCreation,omitempty"`
	GroupSnapshotDeletion *Value `json:"groupSnapshotDeletion,omitempty"`
	// SnapshotMetadata lists the allocated or changed blocks of snapshots
	// (the SnapshotMetadata service); needs SnapshotCreation.
	SnapshotMetadata *Value `json:"snapshotMetadata,omitempty"`
}

// Topology names the node labels that make up a node's topology segment
// (NodeGetInfo's accessible_topology), e.g. [topology.kubernetes.io/zone] for
// zonal storage or [kubernetes.io/hostname] for node-local storage.
type Topology struct {
	NodeLabels []string `json:"nodeLabels"`
}

// Phase returns the raw (unevaluated) subtree of a phase, or nil when absent.
func (s *PavProvisionerSpec) Phase(p Phase) *Value {
	switch p {
	case PhaseValidation:
		return s.VolumeValidation
	case PhaseCreation:
		return s.VolumeCreation
	case PhaseDeletion:
		return s.VolumeDeletion
	case PhaseStaging:
		return s.VolumeStaging
	case PhaseUnstaging:
		return s.VolumeUnstaging
	case PhaseExpansion:
		return s.VolumeExpansion
	case PhaseNodeExpansion:
		return s.VolumeNodeExpansion
	case PhaseSnapshotCreation:
		return s.SnapshotCreation
	case PhaseSnapshotDeletion:
		return s.SnapshotDeletion
	case PhaseCapacity:
		return s.StorageCapacity
	case PhaseModification:
		return s.VolumeModification
	case PhaseGroupSnapshotCreation:
		return s.GroupSnapshotCreation
	case PhaseGroupSnapshotDeletion:
		return s.GroupSnapshotDeletion
	case PhaseSnapshotMetadata:
		return s.SnapshotMetadata
	}
	return nil
}

// HasMode reports whether the provisioner allows a provisioning mode.
func (s *PavProvisionerSpec) HasMode(m ProvisioningMode) bool {
	for _, x := range s.ProvisioningModes {
		if x == m {
			return true
		}
	}
	return false
}

// PavProvisionerStatus is written by the pav manager (`pav manager`) only.
type PavProvisionerStatus struct {
	// ObservedGeneration is the generation the conditions describe.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: ConditionValid, ConditionReady, ConditionTerminating and,
	// with spec.snapshotMetadata, ConditionSnapshotMetadata.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Volumes counts the PersistentVolumes of this provisioner's CSI driver (a
	// pointer so that 0 shows).
	Volumes *int32 `json:"volumes,omitempty"`
	// LastValidGeneration is the generation LastValidSpec was copied from.
	LastValidGeneration int64 `json:"lastValidGeneration,omitempty"`
	// LastValidSpec is the newest spec that passed phase.Check. The drivers delete
	// and unstage existing volumes with it while the current spec is invalid, also
	// after a restart (spec §6: an invalid edit never blocks that).
	LastValidSpec *PavProvisionerSpec `json:"lastValidSpec,omitempty"`
}

// Condition types of PavProvisionerStatus.
const (
	// ConditionValid: the spec's literal values and template syntax check out.
	ConditionValid = "Valid"
	// ConditionReady: the controller plugin has a ready replica and every
	// scheduled node plugin pod is available.
	ConditionReady = "Ready"
	// ConditionTerminating: the object is being deleted; the message says what the
	// deletion waits for.
	ConditionTerminating = "Terminating"
	// ConditionSnapshotMetadata (only with spec.snapshotMetadata): backup
	// applications can find the csi-snapshot-metadata sidecar through the
	// SnapshotMetadataService object named after the driver; the message says
	// where, or what is missing (the CRD, say).
	ConditionSnapshotMetadata = "SnapshotMetadata"
)

// WhenNamespaceGone is spec.volumeDeletion.whenNamespaceGone (and the value of
// AnnotationWhenNamespaceGone): what a volume's deletion means once the
// namespace its deletion pod must run in is gone or being deleted, so that the
// pod can never be created.
type WhenNamespaceGone string

const (
	// NamespaceGoneRetry (the default) keeps the volume's record and PV and
	// retries, reporting why (PavVolume reason DeletionNamespaceGone, a
	// Warning event on the PV): the deletion pod runs once the namespace
	// exists again, or a human decides to forget the volume.
	NamespaceGoneRetry WhenNamespaceGone = "Retry"
	// NamespaceGoneForget says that the namespace held the volume's data
	// (the examples keep it on a claim of that namespace), which went with
	// it: pav records the decision and drops the record without any pod, and
	// the PV goes. pav deletes nothing: whatever the deletion pod would have
	// removed elsewhere stays.
	NamespaceGoneForget WhenNamespaceGone = "Forget"
)

// FinalizerVolumes keeps a PavProvisioner while anything still needs its drivers
// (spec §6); the pav manager adds and removes it.
const FinalizerVolumes = GroupName + "/volumes"

// Value is an arbitrary JSON value (object, list, string, number, bool) kept in
// the form encoding/json decodes it to: map[string]any, []any, string, float64,
// bool, nil. Use templating.Normalize before evaluating it, so integers stay
// integers.
type Value struct {
	Data any `json:"-"`
}

// MarshalJSON writes the held value.
func (v Value) MarshalJSON() ([]byte, error) { return json.Marshal(v.Data) }

// UnmarshalJSON keeps whatever JSON value is given.
func (v *Value) UnmarshalJSON(b []byte) error {
	var d any
	if err := json.Unmarshal(b, &d); err != nil {
		return err
	}
	v.Data = d
	return nil
}

// PavProvisionerList is a list of PavProvisioners.
type PavProvisionerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PavProvisioner `json:"items"`
}

// DeepCopyObject implements runtime.Object.
func (p *PavProvisioner) DeepCopyObject() runtime.Object { return p.DeepCopy() }

// DeepCopy copies the object through JSON: the phases are untyped trees and the
// object is small, so a generated deep-copy would buy nothing.
func (p *PavProvisioner) DeepCopy() *PavProvisioner {
	return jsonCopy(p)
}

// DeepCopyObject implements runtime.Object.
func (l *PavProvisionerList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	return jsonCopy(l)
}
