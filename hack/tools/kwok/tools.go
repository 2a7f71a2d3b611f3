//go:build tools

// Package tools pins the kwok controller built by hack/build-tools.sh.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
