package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/kubeconfig"

	"github.com/pods-as-volumes/pav/internal/manager"
)

func runManager(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("pav manager", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := manager.Options{Version: version}
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = "pav"
	}
	fs.StringVar(&o.Namespace, "namespace", ns, "the manager's namespace, where it deploys the drivers' workloads and keeps its Lease (default: $POD_NAMESPACE, else pav)")
	fs.StringVar(&o.ConfigFile, "config", "", "settings file (the config.yaml of ConfigMap pav-manager; see deploy/manager/config.yaml)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	fs.StringVar(&o.HTTPEndpoint, "http-endpoint", "", "address for /healthz and /readyz, e.g. :8080 (default: none)")
	fs.BoolVar(&o.LeaderElect, "leader-elect", true, "take the Lease before acting, so that only one manager acts at a time")
	fs.StringVar(&o.LeaseName, "lease-name", "pav-manager", "name of the leader election Lease in --namespace")
	fs.IntVar(&o.Workers, "workers", 2, "PavProvisioners reconciled at the same time")
	fs.StringVar(&o.Overrides.PavImage, "pav-image", "", "override images.pav: the image of the drivers (and of their pods' report sidecar)")
	fs.StringVar(&o.Overrides.CSIProvisionerImage, "csi-provisioner-image", "", "override images.csiProvisioner")
	fs.StringVar(&o.Overrides.NodeDriverRegistrarImage, "node-driver-registrar-image", "", "override images.nodeDriverRegistrar")
	fs.StringVar(&o.Overrides.ImagePullPolicy, "image-pull-policy", "", "override imagePullPolicy: Always, IfNotPresent or Never")
	fs.IntVar(&o.Overrides.LogLevel, "log-level", -1, "override logLevel: the drivers' and sidecars' --v")
	fs.DurationVar(&o.Overrides.PodTimeout, "pod-timeout", -1, "override podTimeout: the drivers' --pod-timeout")
	o.Rate = kubeconfig.DefaultRate
	o.Rate.AddFlags(fs)
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	fs.Var(klogFlags.Lookup("v").Value, "v", "the manager's own log verbosity: 2 logs every apply and deletion")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "pav manager: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintf(stderr, "pav manager: %v\n", err)
		return 2
	}
	defer klog.Flush()
	if err := manager.Run(ctx, o); err != nil {
		klog.ErrorS(err, "pav manager stopped")
		return 1
	}
	return 0
}
