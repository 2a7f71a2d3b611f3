package main

import (
	"context"
	"flag"
	"io"
	"os"

	"github.com/pods-as-volumes/pav/internal/cli"
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
	return cli.Serve(ctx, fs, args, "the manager's own log verbosity: 2 logs every apply and deletion",
		o.Validate, func(ctx context.Context) error { return manager.Run(ctx, o) })
}
