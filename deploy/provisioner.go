package deploy

import _ "embed"

// The per-provisioner manifests of the deploy/provisioner kustomize component: the
// pav manager's only source for what it deploys for a PavProvisioner, so that the
// component (for clusters without the manager) and the manager never drift apart.
// Each is one YAML document; ProvisionerPlaceholder stands for the PavProvisioner's
// name wherever the component's replacements put it.
var (
	//go:embed provisioner/csidriver.yaml
	CSIDriverYAML []byte
	//go:embed provisioner/controller.yaml
	ControllerYAML []byte
	//go:embed provisioner/node.yaml
	NodeYAML []byte
)

// ProvisionerPlaceholder is replaced by the PavProvisioner's name.
const ProvisionerPlaceholder = "PROVISIONER_NAME"
