// pav-report carries the /pav files of pav's controller-side pods to the
// driver (see internal/report). As their report sidecar it waits for SIGTERM,
// sent by the kubelet once the pod's other containers have exited, and writes
// what they left in /pav as its termination message. With --exec -- COMMAND
// (mounted into the pod's one container from an image volume) it runs the
// command as its child and writes the report itself when the command ends.
// With --check-ready it is the readiness probe of a KeepRunning pod: exit 0
// iff /pav/ready exists.
//
// It is a binary of its own, beside pav in the same image, because every
// controller-side pod starts one: linking only the standard library, it starts
// in about a millisecond and a megabyte, where pav's binary spends some 60 ms
// and 30 MB initialising packages the report never uses.
package main

import (
	"context"
	"os"

	"github.com/pods-as-volumes/pav/internal/report"
)

func main() {
	os.Exit(report.Command(context.Background(), os.Args[1:]))
}
