// Package cli is the command-line shape of pav's long-running commands (the
// manager, the driver): their flags plus klog's --v, no positional argument,
// a validation whose error is an exit code 2, and a run whose error is
// logged as the reason the command stopped.
package cli

import (
	"context"
	"flag"
	"fmt"

	"k8s.io/klog/v2"
)

// Serve parses args into fs, with --v (klog's verbosity, described by
// verbosity) added, then validates and runs. Messages go to fs.Output() under
// fs.Name(). It returns the exit code: 2 for bad arguments, 1 when run fails,
// 0 when it returns nil.
func Serve(ctx context.Context, fs *flag.FlagSet, args []string, verbosity string,
	validate func() error, run func(context.Context) error) int {
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.Var(klogFlags.Lookup("v").Value, "v", verbosity)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return 2
	}
	if err := validate(); err != nil {
		fmt.Fprintf(fs.Output(), "%s: %v\n", fs.Name(), err)
		return 2
	}
	defer klog.Flush()
	if err := run(ctx); err != nil {
		klog.ErrorS(err, fs.Name()+" stopped")
		return 1
	}
	return 0
}
