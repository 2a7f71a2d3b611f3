package main

import (
	"context"

	"github.com/pods-as-volumes/pav/podrunner"
)

// runReport is the report sidecar pav adds to its pods: it hands the /pav files a
// pod wrote to the driver through its termination message, so the controller
// plugin reads them without access to the node the pod ran on.
func runReport(ctx context.Context, args []string) int {
	return podrunner.ReportCommand(ctx, args)
}
