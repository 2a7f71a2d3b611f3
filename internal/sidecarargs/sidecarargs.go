// Package sidecarargs is a test helper: the arguments the manager gives a
// stock sidecar, so that a test-only stand-in (test/registrar, test/resizer)
// can check it accepts every one of them, as the real sidecar does. A flag the
// manifests add for the real sidecar and the stand-in does not know would
// otherwise crash-loop the stand-in in the local e2e only.
package sidecarargs

import (
	"testing"

	"github.com/pods-as-volumes/pav/internal/manager"
	"github.com/pods-as-volumes/pav/internal/provisioner"
)

// Of returns the arguments of the container named container in the
// workloads the manager renders for the example provisioner at
// provisionerFile (one that needs that sidecar).
func Of(t *testing.T, provisionerFile, container string) []string {
	t.Helper()
	p, err := provisioner.LoadFile(provisionerFile)
	if err != nil {
		t.Fatal(err)
	}
	o, err := manager.Render(p, "pav", manager.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(o.Controller.Spec.Template.Spec.Containers, o.Node.Spec.Template.Spec.Containers...) {
		if c.Name == container {
			if len(c.Args) == 0 {
				t.Fatalf("container %s of %s's workloads has no arguments", container, p.Name)
			}
			return c.Args
		}
	}
	t.Fatalf("%s's workloads have no container %s", p.Name, container)
	return nil
}
