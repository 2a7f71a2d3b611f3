//go:build tools

// Package tools pins the helm CLI built by hack/build-tools.sh.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
