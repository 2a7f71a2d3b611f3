package nodeserver

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/phase"
)

// segment is this node's topology segment for a provisioner with
// spec.topology: the values of its nodeLabels on this node's Node object;
// phase.EveryNodeSegment for one with spec.storageCapacity and no
// spec.topology (the segment its CSIStorageCapacity objects select); else
// nil. kubelet asks for it when node-driver-registrar
// registers the plugin; an error fails the registration, and the registrar
// exits and retries on its restart, so a missing label is FAILED_PRECONDITION
// naming the node and the label: the operator sees it in the registrar's log
// and the plugin pod's restarts, labels the node, and the next attempt
// succeeds.
func (s *Server) segment(ctx context.Context) (map[string]string, error) {
	// The spec in force even while an edit is invalid: the node's topology
	// does not depend on the edit being valid.
	p, err := s.Source.Get(false)
	if err != nil {
		return nil, err
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, grpcerr.WithCode(codes.FailedPrecondition, err)
	}
	if len(f.TopologyKeys) == 0 {
		if f.Capacity {
			return phase.EveryNodeSegment(p.Name), nil
		}
		return nil, nil
	}
	if s.Client == nil {
		return nil, grpcerr.Errorf(codes.FailedPrecondition, "PavProvisioner %s has spec.topology, whose node labels the node plugin reads from the Kubernetes API: run it with API access", p.Name)
	}
	node, err := s.Client.Nodes().Get(ctx, s.NodeID, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading Node %s for its topology labels (spec.topology.nodeLabels): %w", s.NodeID, err)
	}
	seg, err := phase.NodeSegment(node.Name, node.Labels, f.TopologyKeys)
	if err != nil {
		return nil, grpcerr.WithCode(codes.FailedPrecondition, fmt.Errorf("PavProvisioner %s: %w", p.Name, err))
	}
	return seg, nil
}
