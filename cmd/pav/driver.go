package main

import (
	"context"
	"io"

	"github.com/pods-as-volumes/pav/internal/driver"
)

// runDriver is `pav driver`, the same command as the pav-driver binary the
// manager's workloads run (which idles in less memory: see cmd/pav-driver).
func runDriver(ctx context.Context, args []string, stderr io.Writer) int {
	return driver.Main(ctx, "pav driver", args, stderr, version)
}
