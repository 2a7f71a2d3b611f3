package phase

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// HostnameKey is the node label external-provisioner's WaitForFirstConsumer
// puts first in the preferred topology when the driver reports it: the
// selected node.
const HostnameKey = "kubernetes.io/hostname"

// EveryNodeKeyPrefix starts the topology key of a provisioner that tracks
// capacity (spec.storageCapacity) without spec.topology: see EveryNodeSegment.
const EveryNodeKeyPrefix = "capacity.pav.albertofaria.github.io/"

// EveryNodeSegment is the topology segment the node plugin of a provisioner
// with spec.storageCapacity and no spec.topology reports: one key of its own,
// "true" on every node it runs on. Its volumes are reachable from every node,
// so its capacity is one figure; but external-provisioner's capacity
// controller (v6.3.0) cannot keep the CSIStorageCapacity object of an empty
// segment: it writes nodeTopology {matchLabels: {}}, reads back {} and
// deletes its own object as obsolete, over and over, so the scheduler finds
// no capacity for the class. The KEP has central capacity tracking rely on
// drivers reporting a topology; this one selects exactly the nodes where the
// provisioner's node plugin registered (the kubelet labels the Node with
// it). The driver does not advertise VOLUME_ACCESSIBILITY_CONSTRAINTS for
// it, so volumes get no accessibility requirements and PVs no node
// affinity: only the CSIStorageCapacity objects select by it.
func EveryNodeSegment(provisioner string) map[string]string {
	return map[string]string{EveryNodeKeyPrefix + provisioner: "true"}
}

// NodeSegment is a node's topology segment (NodeGetInfo's accessible
// topology): the values of its labels keys. A node that lacks one cannot be
// placed, so that is an error naming the node and the label.
func NodeSegment(node string, labels map[string]string, keys []string) (map[string]string, error) {
	seg := make(map[string]string, len(keys))
	for _, k := range keys {
		v, ok := labels[k]
		if !ok {
			return nil, fmt.Errorf("node %s has no label %s, which spec.topology.nodeLabels lists: label the node (kubectl label node %s %s=...) or take the label out of spec.topology.nodeLabels", node, k, node, k)
		}
		seg[k] = v
	}
	return seg, nil
}

// topologyVars are the topology variables of the validation and creation
// contexts: requisiteTopology and preferredTopology ([] without requirements)
// and selectedNode (null unless the first preferred segment names a host).
func topologyVars(t *v1alpha1.TopologyRequirement) map[string]any {
	var req, pref []map[string]string
	if t != nil {
		req, pref = t.Requisite, t.Preferred
	}
	v := map[string]any{"requisiteTopology": segmentsVar(req), "preferredTopology": segmentsVar(pref), "selectedNode": nil}
	if n := SelectedNode(t); n != "" {
		v["selectedNode"] = n
	}
	return v
}

// SelectedNode is the node WaitForFirstConsumer picked: the hostname of the
// first preferred segment, else "".
func SelectedNode(t *v1alpha1.TopologyRequirement) string {
	if t == nil || len(t.Preferred) == 0 {
		return ""
	}
	return t.Preferred[0][HostnameKey]
}

func segmentsVar(segs []map[string]string) []any {
	out := make([]any, 0, len(segs))
	for _, s := range segs {
		m := make(map[string]any, len(s))
		for k, v := range s {
			m[k] = v
		}
		out = append(out, m)
	}
	return out
}

// AccessibleTopology decides where a created volume is reachable from, first
// found wins: what the creation pod wrote to /pav/topology (reported, nil when
// it wrote nothing), spec.volumeCreation.accessibleTopology (configured),
// and, for a provisioner with spec.topology (keys), the first preferred (else
// requisite) segment of the request restricted to those keys. nil: everywhere.
func AccessibleTopology(reported *string, configured []map[string]string, keys []string, req *v1alpha1.TopologyRequirement) ([]map[string]string, error) {
	segs, err := accessibleTopology(reported, configured, keys, req)
	if err != nil || req == nil || len(req.Requisite) == 0 || len(segs) == 0 {
		return segs, err
	}
	// CSI: the volume MUST be accessible from at least one requisite segment;
	// a volume the pod put elsewhere would bind a claim no allowed node can use.
	for _, seg := range segs {
		for _, r := range req.Requisite {
			if fits(seg, r) {
				return segs, nil
			}
		}
	}
	return nil, fmt.Errorf("the volume's accessible topology %v is reachable from none of the requisite topology segments %v (it must lie where the claim may be used): %w", segs, req.Requisite, ErrOutsideRequisiteTopology)
}

// ErrOutsideRequisiteTopology is wrapped by AccessibleTopology's error for a
// volume that no requisite segment reaches: the volume cannot be made where
// the claim may be used (CSI's RESOURCE_EXHAUSTED, "unable to provision in
// accessible_topology"), which may be different on another node.
var ErrOutsideRequisiteTopology = errors.New("not provisionable in the requisite topology")

// fits reports whether a volume reachable from segment seg is reachable from
// the requisite segment r: they share a key, and agree on every key they share.
func fits(seg, r map[string]string) bool {
	shared := false
	for k, v := range seg {
		if rv, ok := r[k]; ok {
			if rv != v {
				return false
			}
			shared = true
		}
	}
	return shared
}

func accessibleTopology(reported *string, configured []map[string]string, keys []string, req *v1alpha1.TopologyRequirement) ([]map[string]string, error) {
	if reported != nil {
		// The YAML of a template's `yaml` output (PyYAML's), so that a
		// segment means the same in /pav/topology as in accessibleTopology.
		v, err := templating.ParseYAML(*reported)
		if err != nil {
			return nil, fmt.Errorf("the creation pod wrote an invalid /pav/topology (want YAML or JSON): %v", err)
		}
		segs, err := TopologySegments(v, "/pav/topology")
		if err != nil {
			return nil, fmt.Errorf("the creation pod wrote an invalid /pav/topology: %w", err)
		}
		return segs, nil
	}
	if configured != nil {
		return configured, nil
	}
	if len(keys) == 0 || req == nil {
		return nil, nil
	}
	first := req.Preferred
	if len(first) == 0 {
		first = req.Requisite
	}
	if len(first) == 0 {
		return nil, nil
	}
	seg := maps.Clone(first[0])
	maps.DeleteFunc(seg, func(k, _ string) bool { return !slices.Contains(keys, k) })
	if len(seg) == 0 {
		return nil, nil
	}
	return []map[string]string{seg}, nil
}
