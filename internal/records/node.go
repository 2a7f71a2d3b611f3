package records

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// NodeStore reads and writes the PavVolumes of the inline ephemeral volumes
// of one node (spec.ephemeral.node), for that node's plugin. It has no
// informer and lists nothing: the node plugin may get, create, update and
// delete PavVolumes, never list or watch them (deploy/base/rbac.yaml), and an
// admission policy lets it write only the inline volumes of its own node
// (deploy/crd/pavvolumes-policy.yaml). An inline volume's record is named
// after its CSI volume id (VolumeRecordName), which is also its handle, so
// one GET finds it by name or by handle.
//
// Every read is an API read: a node plugin's records are its few inline
// volumes, read a handful of times per volume, and a read that lags behind
// its own writes would run a phase twice.
type NodeStore struct {
	s    store[*v1alpha1.PavVolume]
	node string
}

// NewNodeStore returns the store of provisioner's inline volumes on node.
func NewNodeStore(client dynamic.Interface, provisioner, node string) *NodeStore {
	n := &NodeStore{node: node}
	n.s.kind, n.s.client, n.s.provisioner = &volumes, client.Resource(volumes.gvr), provisioner
	return n
}

// Get returns the record of a CSI volume id (an inline volume's name), or nil.
// A record of that name that is not an inline volume of this provisioner and
// node is an error naming it (ErrOtherOwner): never this node's to act on.
func (n *NodeStore) Get(ctx context.Context, volumeName string) (*v1alpha1.PavVolume, error) {
	name := v1alpha1.VolumeRecordName(volumeName)
	u, err := n.s.client.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading PavVolume %s: %w", name, err)
	}
	v, err := n.s.fromUnstructured(u)
	if err != nil {
		return nil, err
	}
	if v, err = n.s.check(v, volumeName); err != nil {
		return nil, err
	}
	if e := v.Spec.Ephemeral; e == nil || e.Node != n.node {
		where := "not an inline volume"
		if e != nil {
			where = "an inline volume of node " + e.Node
		}
		return nil, fmt.Errorf("%w: PavVolume %s is %s, not an inline volume of node %s", ErrOtherOwner, name, where, n.node)
	}
	return v, nil
}

// ByHandle returns the record whose handle is handle: an inline volume's
// handle is its CSI volume id, so this is Get of that name (live is
// implied: every read is an API read).
func (n *NodeStore) ByHandle(ctx context.Context, handle string, _ bool) ([]*v1alpha1.PavVolume, error) {
	v, err := n.Get(ctx, handle)
	if err != nil || v == nil || v.Status.Handle != handle {
		return nil, err
	}
	return []*v1alpha1.PavVolume{v}, nil
}

// Create writes a new inline volume's record: name, labels (provisioner,
// handle, node) and spec.provisioner are set here. It must be an inline
// volume of this node.
func (n *NodeStore) Create(ctx context.Context, v *v1alpha1.PavVolume) (*v1alpha1.PavVolume, error) {
	if err := n.ours(v); err != nil {
		return nil, err
	}
	v = v.DeepCopy()
	v.Name = v1alpha1.VolumeRecordName(v.Spec.VolumeName)
	v.Spec.Provisioner = n.s.provisioner
	n.s.setLabels(v)
	u, err := n.s.toUnstructured(v)
	if err != nil {
		return nil, err
	}
	got, err := n.s.client.Create(ctx, u, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil {
		return nil, fmt.Errorf("creating PavVolume %s: %w", v.Name, err)
	}
	return n.s.fromUnstructured(got)
}

// Update writes v, read at its resourceVersion (a Conflict is returned as is).
func (n *NodeStore) Update(ctx context.Context, v *v1alpha1.PavVolume) (*v1alpha1.PavVolume, error) {
	if err := n.ours(v); err != nil {
		return nil, err
	}
	if v.ResourceVersion == "" {
		return nil, fmt.Errorf("updating PavVolume %s: no resourceVersion (read it first)", v.Name)
	}
	v = v.DeepCopy()
	n.s.setLabels(v)
	u, err := n.s.toUnstructured(v)
	if err != nil {
		return nil, err
	}
	got, err := n.s.client.Update(ctx, u, metav1.UpdateOptions{FieldManager: fieldManager})
	if err != nil {
		return nil, fmt.Errorf("updating PavVolume %s: %w", v.Name, err)
	}
	return n.s.fromUnstructured(got)
}

// Delete removes the record read as v (UID precondition); one already gone is
// not an error.
func (n *NodeStore) Delete(ctx context.Context, v *v1alpha1.PavVolume) error {
	if err := n.ours(v); err != nil {
		return err
	}
	opts := metav1.DeleteOptions{}
	if uid := v.UID; uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	if err := n.s.client.Delete(ctx, v.Name, opts); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting PavVolume %s: %w", v.Name, err)
	}
	return nil
}

// ours refuses to write a record that is not an inline volume of this node
// (the admission policy would refuse it too; this says why first).
func (n *NodeStore) ours(v *v1alpha1.PavVolume) error {
	if e := v.Spec.Ephemeral; e == nil || e.Node != n.node {
		return fmt.Errorf("the node plugin of node %s writes only the PavVolumes of its own inline volumes, not that of volume %s (a pav bug)", n.node, v.Spec.VolumeName)
	}
	return nil
}
