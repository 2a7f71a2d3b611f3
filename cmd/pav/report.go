package main

import (
	"context"

	"github.com/pods-as-volumes/pav/internal/report"
)

// runReport is `pav report`, what the report sidecar of pods made by pav up to
// v0.2.0 runs: pods made since run the lighter pav-report binary of the same
// image (cmd/pav-report), and a driver upgrade must not fail a pod already
// running with the old command.
func runReport(ctx context.Context, args []string) int {
	return report.Command(ctx, args)
}
