package driver

import (
	"context"
	"flag"
	"io"
	"time"

	"github.com/pods-as-volumes/pav/internal/cli"
	"github.com/pods-as-volumes/pav/internal/compat"
	"github.com/pods-as-volumes/pav/internal/kubeconfig"
	"github.com/pods-as-volumes/pav/nodeserver"
)

// Main is the driver's command line, for the pav-driver binary the manager's
// workloads run and for `pav driver`: name is the command as its messages
// call it. It returns the exit code.
func Main(ctx context.Context, name string, args []string, stderr io.Writer, version string) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := Options{Version: version}
	// Errors about records or states a newer pav wrote name this release.
	compat.Release = version
	fs.StringVar(&o.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint: unix:///path/csi.sock or tcp://host:port")
	fs.StringVar(&o.Provisioner, "provisioner", "", "name of the PavProvisioner to serve (also the CSI driver name); read and watched through the API")
	fs.StringVar(&o.ProvisionerFile, "provisioner-file", "", "read the PavProvisioner from this file instead (tests, GitOps)")
	fs.StringVar(&o.NodeID, "node-id", "", "this node's name (node and all modes)")
	fs.StringVar(&o.Mode, "mode", ModeAll, "which CSI services to serve: controller, node or all")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	fs.DurationVar(&o.PodTimeout, "pod-timeout", 10*time.Minute, "fail an operation whose pod runs longer than this, counted from the pod's creation (0: no limit)")
	fs.StringVar(&o.HTTPEndpoint, "http-endpoint", "", "address for /livez, /readyz and /metrics, e.g. :8080 (default: none)")
	fs.StringVar(&o.PodNamespace, "pod-namespace", "", "where pods whose template names no namespace go (default: this pod's namespace, $POD_NAMESPACE, else pav)")
	fs.StringVar(&o.ReportImage, "report-image", "", "image of pav-report, which reports the /pav files of controller-side pods and the end of node pods (default: this pod's own pav image)")
	fs.StringVar(&o.PodReport, "pod-report", PodReportAuto, "how pods report: exec (pav-report, from an image volume of the report image, runs the command of a pod that has one container: it reports a controller-side pod's /pav files, and a node pod's exit code at once), sidecar (a native sidecar in every controller-side pod; node pods unwrapped), or auto (node plugins: exec; others: exec on Kubernetes 1.35 and later)")
	fs.DurationVar(&o.ForgottenGrace, "unstage-forgotten-after", nodeserver.DefaultForgottenGrace, "node: unstage a volume staged on this node that no pod uses and the kubelet will not unstage (it restarted during the unstaging) once the kubelet left it alone this long (0: never)")
	fs.BoolVar(&o.StageAhead, "stage-ahead", true, "node: start a volume's staging when a pod that uses it is bound to this node, before the kubelet's NodeStageVolume (which waits for it and adopts it); costs each node plugin a watch of its node's pods and a claim read per pod with claims")
	fs.StringVar(&o.StateDir, "state-dir", "", "node: host directory for per-volume state (default /var/lib/kubelet/plugins/NAME/volumes)")
	o.Rate = kubeconfig.DefaultRate
	o.Rate.AddFlags(fs)
	return cli.Serve(ctx, fs, args, "log verbosity: 2 logs every CSI call, 5 also requests and responses (secrets stripped)",
		o.Validate, func(ctx context.Context) error { return Run(ctx, o) })
}
