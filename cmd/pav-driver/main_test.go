package main

import (
	"testing"

	"github.com/pods-as-volumes/pav/internal/linkcheck"
)

// TestLinksNoClientset keeps the driver's binary off client-go's clientset
// and every API group the driver does not use (see internal/linkcheck).
func TestLinksNoClientset(t *testing.T) {
	linkcheck.NoClientset(t, "pav-driver", "k8s.io/api/core/v1", "k8s.io/api/storage/v1")
}
