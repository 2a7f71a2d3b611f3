package phase

import (
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// Request is what a volume asks for, whatever it comes from: a PVC (dynamic
// provisioning through external-provisioner), a PV (static provisioning), or a
// bare CSI request (csi-sanity, another CO).
type Request struct {
	VolumeMode  corev1.PersistentVolumeMode
	AccessModes []corev1.PersistentVolumeAccessMode
	MinCapacity int64  // bytes
	MaxCapacity *int64 // bytes, nil when unbounded
	Params      map[string]string
	// Topology is CreateVolume's accessibility requirements; nil without
	// (static provisioning, a CO without topology).
	Topology *v1alpha1.TopologyRequirement
	// Source is what the volume is created from (nil: nothing): the
	// validation and creation contexts' `source`.
	Source *v1alpha1.VolumeSource
	// MutableParams are the volume's mutable parameters (the parameters of
	// its VolumeAttributesClass): CreateVolume's mutable_parameters for
	// validation and creation, the current ones for the later phases
	// (PavVolume.CurrentMutableParams). The contexts' `mutableParams`, {}
	// when nil.
	MutableParams map[string]string
	// Pod is, for an inline ephemeral volume, the pod whose volume it is
	// (`pod`, and `ephemeral` true); nil for a persistent volume.
	Pod *v1alpha1.EphemeralPod
}

// FromClaim overrides base with what a PVC asks for: its volume mode, access
// modes, requests.storage (the minimum) and limits.storage (the maximum). PaV's
// contexts are defined on the claim; the controller and `pav render` both use
// this, so that render shows what the driver will do.
func FromClaim(base Request, pvc *corev1.PersistentVolumeClaim) Request {
	r := base
	if pvc.Spec.VolumeMode != nil {
		r.VolumeMode = *pvc.Spec.VolumeMode
	}
	if len(pvc.Spec.AccessModes) > 0 {
		r.AccessModes = pvc.Spec.AccessModes
	}
	if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
		r.MinCapacity = q.Value()
	}
	if q, ok := pvc.Spec.Resources.Limits[corev1.ResourceStorage]; ok {
		v := q.Value()
		r.MaxCapacity = &v
	}
	return r
}

// Objects are the API objects a context may include; nil ones are left out.
type Objects struct {
	PVC  *corev1.PersistentVolumeClaim
	SC   *storagev1.StorageClass
	PV   *corev1.PersistentVolume
	Node *corev1.Node
}

// ValidationVars is the context of spec.volumeValidation for dynamic provisioning
// (pvc and sc when known) and, with objs.PV and handle set, for static
// provisioning (spec §3). Both have requisiteTopology, preferredTopology and
// selectedNode (docs/beyond-pav.md, "Topology"), empty without r.Topology,
// and mutableParams (docs/beyond-pav.md, "VolumeAttributesClass"), {}
// without r.MutableParams.
func ValidationVars(r Request, objs Objects, handle string) (templating.Vars, error) {
	v := templating.Vars{
		"requestedVolumeMode":  string(r.VolumeMode),
		"requestedAccessModes": accessModes(r.AccessModes),
		"requestedMinCapacity": r.MinCapacity,
		"requestedMaxCapacity": nil,
		"params":               params(r.Params),
		"source":               sourceVar(r.Source),
		"mutableParams":        params(r.MutableParams),
	}
	if r.MaxCapacity != nil {
		v["requestedMaxCapacity"] = *r.MaxCapacity
	}
	if handle != "" {
		v["handle"] = handle
	}
	maps.Copy(v, topologyVars(r.Topology))
	ephemeralVars(v, r.Pod)
	return v, addObjects(v, Objects{PVC: objs.PVC, SC: objs.SC, PV: objs.PV})
}

// ephemeralVars sets `ephemeral` (every volume context has it: false for a
// persistent volume) and, for an inline ephemeral volume, `pod`.
func ephemeralVars(v templating.Vars, pod *v1alpha1.EphemeralPod) {
	v["ephemeral"] = pod != nil
	if pod != nil {
		v["pod"] = map[string]any{"name": pod.Name, "namespace": pod.Namespace, "uid": string(pod.UID),
			"serviceAccountName": pod.ServiceAccountName}
	}
}

// CreationVars is the context of spec.volumeCreation: the dynamic validation
// context plus defaultHandle.
func CreationVars(r Request, objs Objects, defaultHandle string) (templating.Vars, error) {
	v, err := ValidationVars(r, Objects{PVC: objs.PVC, SC: objs.SC}, "")
	if err != nil {
		return nil, err
	}
	v["defaultHandle"] = defaultHandle
	return v, nil
}

// DeletionVars is the context of spec.volumeDeletion: the creation context plus
// the real handle and capacity of the volume (PaV could not see a handle the
// creation pod exported; pav can). capacity 0 means unknown (null).
func DeletionVars(r Request, objs Objects, defaultHandle, handle string, capacity int64) (templating.Vars, error) {
	v, err := CreationVars(r, objs, defaultHandle)
	if err != nil {
		return nil, err
	}
	v["handle"] = handle
	v["capacity"] = nil
	if capacity > 0 {
		v["capacity"] = capacity
	}
	return v, nil
}

// ExpansionVars is the context of spec.volumeExpansion: the volume's deletion
// context (capacity = its current capacity) plus requestedCapacity (the bytes
// it must grow to) and requestedCapacityLimit (bytes, or null without a limit).
func ExpansionVars(r Request, objs Objects, defaultHandle, handle string, capacity, required int64, limit *int64) (templating.Vars, error) {
	v, err := DeletionVars(r, objs, defaultHandle, handle, capacity)
	if err != nil {
		return nil, err
	}
	v["requestedCapacity"] = required
	v["requestedCapacityLimit"] = nil
	if limit != nil {
		v["requestedCapacityLimit"] = *limit
	}
	return v, nil
}

// ModificationVars is the context of spec.volumeModification: the volume's
// deletion context (capacity = its current capacity, mutableParams = r's, its
// current mutable parameters) with mutableParams replaced by the new set
// (next: the VolumeAttributesClass's parameters, the whole set: a key it
// lacks goes back to the provisioner's default) and previousMutableParams,
// the current set ({} if none).
func ModificationVars(r Request, objs Objects, defaultHandle, handle string, capacity int64, next map[string]string) (templating.Vars, error) {
	v, err := DeletionVars(r, objs, defaultHandle, handle, capacity)
	if err != nil {
		return nil, err
	}
	v["previousMutableParams"] = params(r.MutableParams)
	v["mutableParams"] = params(next)
	return v, nil
}

// Staged describes a volume being staged or unstaged on a node.
type Staged struct {
	VolumeMode  corev1.PersistentVolumeMode
	AccessModes []corev1.PersistentVolumeAccessMode // the PVC's
	Capacity    int64
	Params      map[string]string // pv.spec.csi.volumeAttributes, pav's own keys removed
	Handle      string
	ReadOnly    bool
	// MutableParams are the parameters of the PV's VolumeAttributesClass
	// (spec.volumeAttributesClassName) when the volume was staged; nil
	// without one.
	MutableParams map[string]string
	// Pod is the pod of an inline ephemeral volume; nil for a persistent one.
	Pod *v1alpha1.EphemeralPod
}

// StagingVars is the context of spec.volumeStaging and spec.volumeUnstaging.
func StagingVars(s Staged, objs Objects) (templating.Vars, error) {
	v := templating.Vars{
		"volumeMode":    string(s.VolumeMode),
		"accessModes":   accessModes(s.AccessModes),
		"capacity":      s.Capacity,
		"params":        params(s.Params),
		"handle":        s.Handle,
		"readOnly":      s.ReadOnly,
		"mutableParams": params(s.MutableParams),
	}
	ephemeralVars(v, s.Pod)
	return v, addObjects(v, objs)
}

// NodeExpansionVars is the context of spec.volumeNodeExpansion: the staging
// context of the staged volume, whose capacity is the new one, plus
// previousCapacity (what it was staged, or last grown, with).
func NodeExpansionVars(s Staged, objs Objects, previous int64) (templating.Vars, error) {
	v, err := StagingVars(s, objs)
	if err != nil {
		return nil, err
	}
	v["previousCapacity"] = previous
	return v, nil
}

// CapacityVars is the context of spec.storageCapacity: segment, the topology
// segment whose free capacity is asked for (topology key -> value; {} for a
// provisioner without spec.topology, or a request for no segment in
// particular), and params, the StorageClass parameters as the creation
// context has them (csi.storage.k8s.io/ keys removed).
func CapacityVars(segment, p map[string]string) templating.Vars {
	return templating.Vars{"segment": params(segment), "params": params(p)}
}

func addObjects(v templating.Vars, objs Objects) error {
	for name, obj := range map[string]runtime.Object{"pvc": objs.PVC, "sc": objs.SC, "pv": objs.PV, "node": objs.Node} {
		m, err := ObjectVar(obj)
		if err != nil {
			return fmt.Errorf("context variable %s: %w", name, err)
		}
		if m != nil {
			v[name] = m
		}
	}
	return nil
}

// ObjectVar turns an API object into the camelCase JSON map templates see (as the
// API returns it). A nil object (typed or not) gives nil.
func ObjectVar(obj runtime.Object) (map[string]any, error) {
	// Typed clients drop apiVersion and kind; templates see objects as the API
	// serves them, so put them back.
	var apiVersion, kind string
	switch o := obj.(type) {
	case nil:
		return nil, nil
	case *corev1.PersistentVolumeClaim:
		if o == nil {
			return nil, nil
		}
		apiVersion, kind = "v1", "PersistentVolumeClaim"
	case *corev1.PersistentVolume:
		if o == nil {
			return nil, nil
		}
		apiVersion, kind = "v1", "PersistentVolume"
	case *storagev1.StorageClass:
		if o == nil {
			return nil, nil
		}
		apiVersion, kind = "storage.k8s.io/v1", "StorageClass"
	case *corev1.Node:
		if o == nil {
			return nil, nil
		}
		apiVersion, kind = "v1", "Node"
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	if m["apiVersion"] == nil && apiVersion != "" {
		m["apiVersion"], m["kind"] = apiVersion, kind
	}
	return templating.Normalize(m).(map[string]any), nil
}

func accessModes(l []corev1.PersistentVolumeAccessMode) []any {
	out := make([]any, 0, len(l))
	for _, m := range l {
		out = append(out, string(m))
	}
	return out
}

func params(p map[string]string) map[string]any {
	out := make(map[string]any, len(p))
	for k, v := range p {
		out[k] = v
	}
	return out
}

// MetadataSnapshot is a snapshot as the snapshotMetadata context sees it: its
// record's spec (the source volume, as snapshotCreation saw it), handle and
// size.
type MetadataSnapshot struct {
	Spec     *v1alpha1.PavSnapshotSpec
	Handle   string
	Capacity int64 // the snapshot's size in bytes
}

func metadataSnapshotVar(s *MetadataSnapshot) any {
	if s == nil {
		return nil
	}
	src := &s.Spec.Volume
	return map[string]any{
		"handle":   s.Handle,
		"capacity": s.Capacity,
		"volume": map[string]any{
			"handle":     src.Handle,
			"capacity":   src.Capacity,
			"volumeMode": string(src.VolumeMode),
			"params":     params(src.Params),
		},
	}
}

// SnapshotMetadataVars is the context of spec.snapshotMetadata: `snapshot`
// ({handle, capacity, volume}: the snapshot to list, its size, and its source
// volume as snapshotCreation's `volume`), `baseSnapshot` (the same for
// GetMetadataDelta's base snapshot; null for GetMetadataAllocated),
// `startingOffset` (bytes: ranges that end at or before it are not needed),
// `params` (the snapshot's VolumeSnapshotClass parameters, as recorded) and
// the source volume's `pvc` and `sc` when pav recorded them.
func SnapshotMetadataVars(target *MetadataSnapshot, base *MetadataSnapshot, startingOffset int64) (templating.Vars, error) {
	v := templating.Vars{
		"snapshot":       metadataSnapshotVar(target),
		"baseSnapshot":   metadataSnapshotVar(base),
		"startingOffset": startingOffset,
		"params":         params(target.Spec.Params),
	}
	return v, addObjects(v, Objects{PVC: target.Spec.Volume.PVC, SC: target.Spec.Volume.SC})
}
