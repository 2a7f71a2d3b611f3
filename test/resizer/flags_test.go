package main

import (
	"testing"

	"github.com/pods-as-volumes/pav/internal/sidecarargs"
)

// The stand-in accepts every argument the manager gives external-resizer
// (loop-block expands volumes, so its controller has the resizer), and uses
// the client rate it is given.
func TestParsesTheArgumentsOfExternalResizer(t *testing.T) {
	args := sidecarargs.Of(t, "../../examples/loop-block/provisioner.yaml", "csi-resizer")
	o, err := parseFlags(args)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	if o.rate.QPS != 50 || o.rate.Burst != 100 {
		t.Errorf("--kube-api-qps %v, --kube-api-burst %v from %v; want 50 and 100 (deploy/provisioner/controller.yaml)", o.rate.QPS, o.rate.Burst, args)
	}
}
