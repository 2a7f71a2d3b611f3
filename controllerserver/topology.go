package controllerserver

import (
	"maps"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/phase"
)

// topologyRequirement copies CreateVolume's accessibility requirements into
// the record's form; nil without any (no topology, or csi-sanity).
func topologyRequirement(t *csi.TopologyRequirement) *v1alpha1.TopologyRequirement {
	if len(t.GetRequisite()) == 0 && len(t.GetPreferred()) == 0 {
		return nil
	}
	out := &v1alpha1.TopologyRequirement{}
	for _, s := range t.GetRequisite() {
		out.Requisite = append(out.Requisite, maps.Clone(s.GetSegments()))
	}
	for _, s := range t.GetPreferred() {
		out.Preferred = append(out.Preferred, maps.Clone(s.GetSegments()))
	}
	return out
}

// csiTopology is CreateVolume's accessible_topology of recorded segments.
func csiTopology(segs []map[string]string) []*csi.Topology {
	var out []*csi.Topology
	for _, s := range segs {
		out = append(out, &csi.Topology{Segments: maps.Clone(s)})
	}
	return out
}

// accessibleTopology is where the volume being created is reachable from:
// /pav/topology (reported, nil when the pod wrote none), else
// spec.volumeCreation.accessibleTopology, else, with spec.topology, the
// first preferred segment of the recorded request (phase.AccessibleTopology).
// Only a reported topology can be wrong.
func (j *job) accessibleTopology(reported *string, cfg *phase.CreationConfig) ([]map[string]string, error) {
	// The driver only uses specs that pass phase.Check, which runs FeaturesOf.
	f, _ := phase.FeaturesOf(&j.p.Spec)
	return phase.AccessibleTopology(reported, cfg.AccessibleTopology, f.TopologyKeys, j.v.Spec.AccessibilityRequirements)
}
