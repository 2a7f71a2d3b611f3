package main

import (
	"testing"

	"github.com/pods-as-volumes/pav/internal/linkcheck"
)

// TestLinksNoClientset keeps the manager's binary off client-go's clientset,
// apply configurations and leader election, and every API group the manager
// and the drivers do not use (see internal/linkcheck): with them the manager
// idled at 57 MiB RSS, without them at 38.
func TestLinksNoClientset(t *testing.T) {
	linkcheck.NoClientset(t, "pav", "k8s.io/api/core/v1", "k8s.io/api/storage/v1",
		"k8s.io/api/apps/v1", "k8s.io/api/coordination/v1")
}
