package phase

import (
	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// sourceVar is a volume's `source`: null, or {kind, handle, capacity} and,
// for a snapshot, volumeHandle.
func sourceVar(s *v1alpha1.VolumeSource) any {
	if s == nil {
		return nil
	}
	m := map[string]any{"kind": s.Kind, "handle": s.Handle, "capacity": s.Capacity}
	if s.Kind == v1alpha1.SourceKindSnapshot {
		m["volumeHandle"] = s.VolumeHandle
	}
	return m
}

// SnapshotVars is the context of spec.snapshotCreation: `params` (the
// VolumeSnapshotClass parameters), `snapshotName` and `defaultHandle` (both
// the CSI snapshot name), `volume` (the source volume's handle, capacity,
// volumeMode and params) and the source volume's `pvc` and `sc` when pav
// recorded them.
func SnapshotVars(sp *v1alpha1.PavSnapshotSpec) (templating.Vars, error) {
	src := &sp.Volume
	v := templating.Vars{
		"params":        params(sp.Params),
		"snapshotName":  sp.SnapshotName,
		"defaultHandle": sp.SnapshotName,
		"volume": map[string]any{
			"handle":     src.Handle,
			"capacity":   src.Capacity,
			"volumeMode": string(src.VolumeMode),
			"params":     params(src.Params),
		},
	}
	return v, addObjects(v, Objects{PVC: src.PVC, SC: src.SC})
}

// SnapshotDeletionVars is the context of spec.snapshotDeletion: the creation
// context plus the snapshot's `handle` and `capacity` (its size; null when
// unknown).
func SnapshotDeletionVars(sp *v1alpha1.PavSnapshotSpec, handle string, size int64) (templating.Vars, error) {
	v, err := SnapshotVars(sp)
	if err != nil {
		return nil, err
	}
	v["handle"] = handle
	v["capacity"] = nil
	if size > 0 {
		v["capacity"] = size
	}
	return v, nil
}
