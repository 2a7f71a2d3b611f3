// Package v1beta1 is the SnapshotMetadataService type (cbt.storage.k8s.io/v1beta1) as
// external-snapshot-metadata's pkg/iterator reads it: see ../../../go.mod.
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SchemeGroupVersion is the API group and version of SnapshotMetadataServices.
var SchemeGroupVersion = schema.GroupVersion{Group: "cbt.storage.k8s.io", Version: "v1beta1"}

// SnapshotMetadataService advertises a CSI driver's SnapshotMetadata gRPC
// service (cluster-scoped, named after the driver).
type SnapshotMetadataService struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SnapshotMetadataServiceSpec `json:"spec"`
}

// SnapshotMetadataServiceSpec: where the service is, the CA that vouches for
// it, and the audience of the tokens it accepts.
type SnapshotMetadataServiceSpec struct {
	Address  string `json:"address"`
	CACert   []byte `json:"caCert"`
	Audience string `json:"audience"`
}
