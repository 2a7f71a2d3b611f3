// pav-driver is the CSI driver of one PavProvisioner (internal/driver), the
// program of the controller plugin's and the node plugin's `pav` container:
// the same as `pav driver`, in a binary of its own.
//
// Why a binary of its own: a cluster runs two driver processes per
// provisioner and node, so their idle memory is what pav costs at rest. The
// pav binary also holds the manager (with the apps/v1 and coordination/v1 API
// groups it applies and elects with) and the offline tools, whose package
// initialisation would run in every driver process too. This binary links the
// driver alone and, like pav, no client-go clientset (internal/kube instead;
// main_test.go checks it).
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
