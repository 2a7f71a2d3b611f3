package phase

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// Features is what a provisioner can do beyond PaV's create/delete/stage, read
// from the literal parts of its spec: the CSI capabilities pav advertises
// (before any volume exists, so none of it may hide in a template).
type Features struct {
	// Expansion: spec.volumeExpansion is set (EXPAND_VOLUME, controller);
	// OnlineExpansion its `online` (PluginCapability ONLINE, else OFFLINE).
	Expansion, OnlineExpansion bool
	// NodeExpansion: spec.volumeNodeExpansion is set (EXPAND_VOLUME, node;
	// ControllerExpandVolume answers node_expansion_required).
	NodeExpansion bool
	// Snapshots: spec.snapshotCreation is set (CREATE_DELETE_SNAPSHOT,
	// LIST_SNAPSHOTS).
	Snapshots bool
	// ContentSources: spec.volumeCreation.contentSources ("Snapshot" restores
	// snapshots, "Volume" clones volumes: CLONE_VOLUME).
	ContentSources []string
	// TopologyKeys: spec.topology.nodeLabels (VOLUME_ACCESSIBILITY_CONSTRAINTS).
	TopologyKeys []string
}

// Clones reports whether volumes may be created from other volumes.
func (f Features) Clones() bool { return slices.Contains(f.ContentSources, SourceVolume) }

// Restores reports whether volumes may be created from snapshots.
func (f Features) Restores() bool { return slices.Contains(f.ContentSources, SourceSnapshot) }

// FeaturesOf reads a spec's features, and says what is wrong with the literals
// that declare them (Check runs it too).
func FeaturesOf(s *v1alpha1.PavProvisionerSpec) (Features, error) {
	var f Features
	present := func(v *v1alpha1.Value) bool { return v != nil && v.Data != nil }
	if present(s.VolumeExpansion) {
		f.Expansion, f.OnlineExpansion = true, true
		if m, ok := templating.Normalize(s.VolumeExpansion.Data).(map[string]any); ok && m["online"] != nil {
			b, ok := m["online"].(bool)
			if !ok {
				return f, fieldErr("spec.volumeExpansion.online", "must be a literal boolean (true: volumes grow while in use; false: only while unused), got %s: it is advertised before any volume exists", describe(m["online"]))
			}
			f.OnlineExpansion = b
		}
	}
	if present(s.VolumeNodeExpansion) {
		if !f.Expansion {
			return f, fieldErr("spec.volumeNodeExpansion", "needs spec.volumeExpansion (which may be just {}): the controller side grows the volume first, then the node side")
		}
		f.NodeExpansion = true
	}
	f.Snapshots = present(s.SnapshotCreation)
	if present(s.SnapshotDeletion) && !f.Snapshots {
		return f, fieldErr("spec.snapshotDeletion", "needs spec.snapshotCreation: there are no snapshots to delete without it")
	}
	if present(s.VolumeCreation) {
		if m, ok := templating.Normalize(s.VolumeCreation.Data).(map[string]any); ok && m["contentSources"] != nil {
			srcs, err := contentSources(m["contentSources"], "spec.volumeCreation.contentSources")
			if err != nil {
				return f, err
			}
			f.ContentSources = srcs
		}
	}
	if f.Restores() && !f.Snapshots {
		return f, fieldErr("spec.volumeCreation.contentSources", "lists Snapshot, which needs spec.snapshotCreation: without it there are no snapshots to restore")
	}
	if t := s.Topology; t != nil {
		const path = "spec.topology.nodeLabels"
		if len(t.NodeLabels) == 0 {
			return f, fieldErr(path, "must name at least one node label (e.g. topology.kubernetes.io/zone, or kubernetes.io/hostname for node-local volumes); omit spec.topology otherwise")
		}
		for i, k := range t.NodeLabels {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				return f, fieldErr(fmt.Sprintf("%s[%d]", path, i), "%q is not a label key: %s", k, errs[0])
			}
			if slices.Contains(t.NodeLabels[:i], k) {
				return f, fieldErr(fmt.Sprintf("%s[%d]", path, i), "%q is listed twice", k)
			}
		}
		f.TopologyKeys = slices.Clone(t.NodeLabels)
	}
	return f, nil
}

// TopologySegments checks an evaluated list of topology segments (each a map
// of topology key to value, as CSI's Topology), e.g. what /pav/topology or
// volumeCreation.accessibleTopology say; a single map is one segment.
func TopologySegments(v any, path string) ([]map[string]string, error) {
	var items []any
	switch x := v.(type) {
	case map[string]any:
		items = []any{x}
	case []any:
		items = x
	default:
		return nil, fieldErr(path, "must be a list of topology segments (maps of topology key to value), got %s", typeName(v))
	}
	out := make([]map[string]string, 0, len(items))
	for i, it := range items {
		m, ok := it.(map[string]any)
		if !ok || len(m) == 0 {
			return nil, fieldErr(fmt.Sprintf("%s[%d]", path, i), "must be a non-empty map of topology key to value, got %s", typeName(it))
		}
		seg := make(map[string]string, len(m))
		for k, val := range m {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				return nil, fieldErr(fmt.Sprintf("%s[%d]", path, i), "%q is not a topology key: %s", k, errs[0])
			}
			s, ok := val.(string)
			if !ok {
				return nil, fieldErr(fmt.Sprintf("%s[%d].%s", path, i, k), "must be a string, got %s", typeName(val))
			}
			if errs := validation.IsValidLabelValue(s); len(errs) > 0 {
				return nil, fieldErr(fmt.Sprintf("%s[%d].%s", path, i, k), "%q is not a valid topology value: %s", s, errs[0])
			}
			seg[k] = s
		}
		out = append(out, seg)
	}
	return out, nil
}

// contentSources checks volumeCreation.contentSources: a literal list of
// Snapshot and Volume, each once (the API server's schema makes it a set).
func contentSources(v any, path string) ([]string, error) {
	if isTemplate(v) {
		return nil, fieldErr(path, "must be a literal list, not a template: it is advertised (CLONE_VOLUME) before any volume exists")
	}
	srcs, err := enumList(v, path, false, SourceSnapshot, SourceVolume)
	if err != nil {
		return nil, err
	}
	// enumList drops repeats; the API server (a set) refuses them.
	if l := v.([]any); len(srcs) < len(l) {
		for i := range l {
			if slices.Contains(l[:i], l[i]) {
				return nil, fieldErr(fmt.Sprintf("%s[%d]", path, i), "%s is listed twice", describe(l[i]))
			}
		}
	}
	return srcs, nil
}
