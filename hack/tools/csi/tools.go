//go:build tools

// Package tools pins the CSI commands built by hack/build-tools.sh.
package tools

import (
	_ "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity"
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
)
