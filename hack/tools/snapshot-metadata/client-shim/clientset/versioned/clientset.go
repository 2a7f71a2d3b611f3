// Package versioned is the part of the SnapshotMetadataService clientset that
// external-snapshot-metadata's pkg/iterator uses (Get of one object), on
// client-go's dynamic client: see ../../go.mod.
package versioned

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/kubernetes-csi/external-snapshot-metadata/client/apis/snapshotmetadataservice/v1beta1"
)

// Interface is the clientset.
type Interface interface {
	CbtV1beta1() CbtV1beta1Interface
}

// CbtV1beta1Interface is the cbt.storage.k8s.io/v1beta1 group.
type CbtV1beta1Interface interface {
	SnapshotMetadataServices() SnapshotMetadataServiceInterface
}

// SnapshotMetadataServiceInterface reads SnapshotMetadataServices.
type SnapshotMetadataServiceInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1beta1.SnapshotMetadataService, error)
}

// Clientset serves Interface.
type Clientset struct {
	dyn dynamic.Interface
}

// NewForConfig returns a Clientset of the API server of c.
func NewForConfig(c *rest.Config) (*Clientset, error) {
	dyn, err := dynamic.NewForConfig(c)
	if err != nil {
		return nil, err
	}
	return &Clientset{dyn: dyn}, nil
}

func (c *Clientset) CbtV1beta1() CbtV1beta1Interface { return c }

func (c *Clientset) SnapshotMetadataServices() SnapshotMetadataServiceInterface { return c }

// Get reads one SnapshotMetadataService.
func (c *Clientset) Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1beta1.SnapshotMetadataService, error) {
	u, err := c.dyn.Resource(v1beta1.SchemeGroupVersion.WithResource("snapshotmetadataservices")).Get(ctx, name, opts)
	if err != nil {
		return nil, err
	}
	out := &v1beta1.SnapshotMetadataService{}
	return out, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out)
}
