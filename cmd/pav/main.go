// Command pav is Pods-as-Volumes: one binary for the manager that deploys every
// PavProvisioner (`pav manager`), the CSI driver (`pav driver`, which the
// plugins run as the pav-driver binary: see cmd/pav-driver), the report
// sidecar of pods made by older versions (`pav report`; pav-report now), and the offline tools that
// show a provisioner author what their templates produce (`pav template`,
// `pav render`).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0".
var version = "v0.2.0-dev"

const usage = `pav — Pods-as-Volumes: volume provisioners written as pod templates.

Usage:
  pav manager  [--config FILE] [flags]                                  deploy every PavProvisioner's drivers, guard deletion, write status
  pav driver   --provisioner NAME --mode controller|node|all [flags]   serve the CSI driver (as pav-driver does)
  pav render   -f provisioner.yaml --phase PHASE [inputs]               show a phase's pod as pav would submit it
  pav template [FILE|-] [--vars FILE]                                   evaluate every string of a YAML document
  pav report   --dir /pav [--check-ready]                               the report sidecar of pods made by pav up to v0.2.0 (now pav-report)
  pav version

Run 'pav COMMAND -h' for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "manager":
		return runManager(ctx, args[1:], stderr)
	case "driver":
		return runDriver(ctx, args[1:], stderr)
	case "render":
		return runRender(ctx, args[1:], stdin, stdout, stderr)
	case "template":
		return runTemplate(ctx, args[1:], stdin, stdout, stderr)
	case "report":
		return runReport(ctx, args[1:])
	case "version", "--version":
		fmt.Fprintln(stdout, version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "pav: unknown command %q\n\n%s", args[0], usage)
	return 2
}
