// pav-driver is the CSI driver of one PavProvisioner (internal/driver), the
// program of the controller plugin's and the node plugin's `pav` container:
// the same as `pav driver`, in a binary of its own.
//
// Why a binary of its own: a cluster runs two driver processes per
// provisioner and node, so their idle memory is what pav costs at rest. The
// pav binary also holds the manager, whose client-go clientset registers every
// API group's types when the program starts, whichever command runs: that kept
// some 15 MiB of k8s.io/api's code and data resident in every driver process.
// This binary links no clientset (internal/kube instead; main_test.go checks
// it).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pods-as-volumes/pav/internal/driver"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0".
var version = "v0.2.0-dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := driver.Main(ctx, "pav-driver", os.Args[1:], os.Stderr, version)
	stop()
	os.Exit(code)
}
