package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/kubeconfig"

	"github.com/pods-as-volumes/pav/internal/driver"
)

func runDriver(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("pav driver", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := driver.Options{Version: version}
	fs.StringVar(&o.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint: unix:///path/csi.sock or tcp://host:port")
	fs.StringVar(&o.Provisioner, "provisioner", "", "name of the PavProvisioner to serve (also the CSI driver name); read and watched through the API")
	fs.StringVar(&o.ProvisionerFile, "provisioner-file", "", "read the PavProvisioner from this file instead (tests, GitOps)")
	fs.StringVar(&o.NodeID, "node-id", "", "this node's name (node and all modes)")
	fs.StringVar(&o.Mode, "mode", driver.ModeAll, "which CSI services to serve: controller, node or all")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	fs.DurationVar(&o.PodTimeout, "pod-timeout", 10*time.Minute, "fail an operation whose pod runs longer than this, counted from the pod's creation (0: no limit)")
	fs.StringVar(&o.HTTPEndpoint, "http-endpoint", "", "address for /livez, /readyz and /metrics, e.g. :8080 (default: none)")
	fs.StringVar(&o.PodNamespace, "pod-namespace", "", "where pods whose template names no namespace go (default: this pod's namespace, $POD_NAMESPACE, else pav)")
	fs.StringVar(&o.ReportImage, "report-image", "", "image of the report sidecar added to every pod (default: this pod's own pav image)")
	fs.StringVar(&o.StateDir, "state-dir", "", "node: host directory for per-volume state (default /var/lib/kubelet/plugins/NAME/volumes)")
	o.Rate = kubeconfig.DefaultRate
	o.Rate.AddFlags(fs)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.Var(klogFlags.Lookup("v").Value, "v", "log verbosity: 2 logs every CSI call, 5 also requests and responses (secrets stripped)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pav driver: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(stderr, "pav driver: %v\n", err)
		return 2
	}
	defer klog.Flush()
	if err := driver.Run(ctx, o); err != nil {
		klog.ErrorS(err, "pav driver stopped")
		return 1
	}
	return 0
}
