// Package deploy holds pav's Kubernetes manifests. The PavProvisioner CRD and its
// companion ValidatingAdmissionPolicy, and the PavVolume CRD, are embedded here so
// that other packages and tests can install or inspect them.
package deploy

import _ "embed"

// CRDYAML is the PavProvisioner CustomResourceDefinition (crd/pavprovisioners.yaml).
//
//go:embed crd/pavprovisioners.yaml
var CRDYAML []byte

// PolicyYAML is the ValidatingAdmissionPolicy and its binding (two YAML documents,
// crd/pavprovisioners-policy.yaml) that check the parts of a PavProvisioner the CRD
// schema cannot: inside the template-or-value fields. It needs Kubernetes 1.30+.
//
//go:embed crd/pavprovisioners-policy.yaml
var PolicyYAML []byte

// VolumeCRDYAML is the PavVolume CustomResourceDefinition (crd/pavvolumes.yaml):
// pav's record of each dynamically provisioned volume.
//
//go:embed crd/pavvolumes.yaml
var VolumeCRDYAML []byte

// VolumePolicyYAML is the ValidatingAdmissionPolicy and its binding (two YAML
// documents, crd/pavvolumes-policy.yaml) that let a node plugin write only the
// PavVolumes of its own node's inline ephemeral volumes.
//
//go:embed crd/pavvolumes-policy.yaml
var VolumePolicyYAML []byte

// PodsPolicyYAML is the ValidatingAdmissionPolicy and its binding (two YAML
// documents, base/pods-policy.yaml) that let a node plugin only add the
// annotation that relays a controller-side pod's end, to its own node's pods.
//
//go:embed base/pods-policy.yaml
var PodsPolicyYAML []byte

// SnapshotCRDYAML is the PavSnapshot CustomResourceDefinition
// (crd/pavsnapshots.yaml): pav's record of each snapshot.
//
//go:embed crd/pavsnapshots.yaml
var SnapshotCRDYAML []byte

// GroupSnapshotCRDYAML is the PavGroupSnapshot CustomResourceDefinition
// (crd/pavgroupsnapshots.yaml): pav's record of each group snapshot.
//
//go:embed crd/pavgroupsnapshots.yaml
var GroupSnapshotCRDYAML []byte
