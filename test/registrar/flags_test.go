package main

import (
	"testing"

	"github.com/pods-as-volumes/pav/internal/sidecarargs"
)

// The stand-in accepts every argument the manager gives
// node-driver-registrar, as the real one does.
func TestParsesTheArgumentsOfNodeDriverRegistrar(t *testing.T) {
	args := sidecarargs.Of(t, "../../examples/hello-world/provisioner.yaml", "node-driver-registrar")
	o, err := parseFlags(args)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	if err := o.validate(); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}
