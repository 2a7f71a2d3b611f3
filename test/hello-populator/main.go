// Command hello-populator is a TEST-ONLY stand-in for lib-volume-populator's example
// hello-populator (registry.k8s.io/sig-storage/hello-populator:v1.0.1), whose source the Go
// module proxy refuses to serve, so that Kubernetes' storage e2e spec "provisioning should
// provision storage with any volume data source" (make conformance) can run on the local
// cluster, which has no registry. hack/images/build.sh builds it as the image
// e2e-hello-populator, under the upstream image's name.
//
// It re-implements the populator flow of lib-volume-populator's populator-machinery for
// the one kind the example handles, hello.example.com/v1alpha1 Hello (spec.fileName,
// spec.fileContents), with the example's flags:
//
//	--mode           controller or populate
//	--namespace      the populator's own namespace, where it makes its prime PVCs and
//	                 pods (default hello; the e2e spec sets it)
//	--image-name     the image of the populator pods (this one)
//	--file-name, --file-contents
//	                 populate mode: the file to write and what to write into it
//	--http-endpoint  optional address of /metrics (client-go's request and the process's
//	                 metrics, at --metrics-path) and /healthz; upstream serves its own
//	                 populator metrics there, which this stand-in does not record
//	--kubeconfig, --master
//	                 the API server, when not in a cluster
//	--version, --v   as upstream
//
// Controller mode (controller.go) watches claims whose spec.dataSourceRef names a Hello,
// makes a "prime" claim in --namespace like the original one, runs a pod of this image in
// --mode=populate with the prime claim mounted at /mnt (or, for a Block claim, as the
// device /dev/block) on the original claim's selected node, then hands the populated
// volume to the original claim by pointing its PV's claimRef at it, and cleans up.
// Populate mode writes --file-contents (ending in a newline) to --file-name and exits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/kubeconfig"
)

// version is what --version prints: the upstream image this stands in for.
const version = "v1.0.1-pav-stand-in"

// options are the flags, named as the upstream example names them.
type options struct {
	mode         string
	fileName     string
	fileContents string
	kubeconfig   string
	master       string
	imageName    string
	httpEndpoint string
	metricsPath  string
	showVersion  bool
	namespace    string
}

// parseFlags parses args (without the program name) as the upstream example
// would, klog's flags (--v) included.
func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("hello-populator", flag.ContinueOnError)
	klog.InitFlags(fs)
	o := &options{}
	fs.StringVar(&o.mode, "mode", "", "Mode to run in (controller, populate)")
	fs.StringVar(&o.fileName, "file-name", "", "File name to populate")
	fs.StringVar(&o.fileContents, "file-contents", "", "Contents to populate file with")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig. Only required if out-of-cluster.")
	fs.StringVar(&o.master, "master", "", "The address of the Kubernetes API server. Overrides any value in kubeconfig. Only required if out-of-cluster.")
	fs.StringVar(&o.imageName, "image-name", "", "Image to use for populating")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "The TCP network address where the HTTP server for metrics will listen (example: `:8080`). Empty: no server.")
	fs.StringVar(&o.metricsPath, "metrics-path", "/metrics", "The HTTP path where prometheus metrics will be exposed.")
	fs.BoolVar(&o.showVersion, "version", false, "display the version string")
	fs.StringVar(&o.namespace, "namespace", "hello", "Namespace to deploy controller")
	return o, fs.Parse(args)
}

// validate checks what the mode needs, as upstream does before it starts.
func (o *options) validate() error {
	switch o.mode {
	case "controller":
		if o.imageName == "" {
			return errors.New("--image-name is required in controller mode")
		}
		if o.namespace == "" {
			return errors.New("--namespace must not be empty")
		}
	case "populate":
		if o.fileName == "" || o.fileContents == "" {
			return errors.New("missing required arg: --file-name and --file-contents")
		}
	default:
		return fmt.Errorf("invalid mode: %q (controller or populate)", o.mode)
	}
	return nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		os.Exit(2)
	}
	if o.showVersion {
		fmt.Println(os.Args[0], version)
		return
	}
	if err := o.validate(); err != nil {
		klog.ErrorS(err, "Invalid flags")
		os.Exit(2)
	}
	switch o.mode {
	case "populate":
		if err := populate(o.fileName, o.fileContents); err != nil {
			klog.ErrorS(err, "Populating failed")
			os.Exit(1)
		}
	case "controller":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if err := runController(ctx, o); err != nil {
			klog.ErrorS(err, "Populator controller failed")
			os.Exit(1)
		}
	}
}

// populate writes contents, with a newline at its end, to fileName (a file on the
// mounted volume, or the Block device).
func populate(fileName, contents string) error {
	if !strings.HasSuffix(contents, "\n") {
		contents += "\n"
	}
	f, err := os.Create(fileName)
	if err != nil {
		return fmt.Errorf("creating %s: %w", fileName, err)
	}
	if _, err := f.WriteString(contents); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", fileName, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("syncing %s: %w", fileName, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", fileName, err)
	}
	klog.InfoS("Populated", "file", fileName, "bytes", len(contents))
	return nil
}

// restConfig is the API server's configuration: --master and --kubeconfig as
// clientcmd reads them, else the in-cluster one.
func restConfig(o *options) (*rest.Config, error) {
	// client-go's default rate, which upstream keeps.
	rate := kubeconfig.Rate{QPS: 5, Burst: 10}
	if o.master != "" {
		cfg, err := clientcmd.BuildConfigFromFlags(o.master, o.kubeconfig)
		if err != nil {
			return nil, err
		}
		cfg.QPS, cfg.Burst = float32(rate.QPS), rate.Burst
		return cfg, nil
	}
	return kubeconfig.Load(o.kubeconfig, rate)
}
