// Command volume-data-source-validator is a TEST-ONLY stand-in for the Kubernetes CSI
// volume-data-source-validator (registry.k8s.io/sig-storage/volume-data-source-validator:v1.0.0),
// whose source the Go module proxy refuses to serve, so that Kubernetes' storage e2e spec
// "provisioning should provision storage with any volume data source" (make conformance) can
// deploy it on the local cluster, which has no registry. hack/images/build.sh builds it as the
// image e2e-volume-data-source-validator, under the upstream image's name.
//
// Like upstream (validator.go), it watches PersistentVolumeClaims and the cluster's
// VolumePopulators (populator.storage.k8s.io/v1beta1), and records a Warning event
// UnrecognizedDataSourceKind on a claim whose data source is of a kind no VolumePopulator
// registers (claims without a data source, with a core one such as a PVC, or with a
// VolumeSnapshot are left alone). It has upstream's flags:
//
//	--kubeconfig                 the API server, when not in a cluster
//	--resync-period              how often every claim is checked again (default 1m)
//	--worker-threads             claims checked at once (default 10)
//	--leader-election            run only while holding the Lease data-source-validator-leader
//	--leader-election-namespace  its namespace (default: the pod's)
//	--leader-election-lease-duration, --leader-election-renew-deadline,
//	--leader-election-retry-period
//	--http-endpoint, --metrics-path
//	                             optional address of /metrics (client-go's request and the
//	                             process's metrics, at --metrics-path) and /healthz
//	--version, --v               as upstream
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
	"time"

	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/kubeconfig"
	"github.com/pods-as-volumes/pav/test/standin"
)

// version is what --version prints: the upstream image this stands in for.
const version = "v1.0.0-pav-stand-in"

// leaseName is upstream's Lease.
const leaseName = "data-source-validator-leader"

// options are the flags, named as upstream names them.
type options struct {
	kubeconfig    string
	resyncPeriod  time.Duration
	showVersion   bool
	threads       int
	leaderElect   bool
	leNamespace   string
	leaseDuration time.Duration
	renewDeadline time.Duration
	retryPeriod   time.Duration
	httpEndpoint  string
	metricsPath   string
}

// parseFlags parses args (without the program name) as upstream would, klog's
// flags (--v) included.
func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("volume-data-source-validator", flag.ContinueOnError)
	klog.InitFlags(fs)
	o := &options{}
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Absolute path to the kubeconfig file. Required only when running out of cluster.")
	fs.DurationVar(&o.resyncPeriod, "resync-period", 60*time.Second, "Resync interval of the controller.")
	fs.BoolVar(&o.showVersion, "version", false, "Show version.")
	fs.IntVar(&o.threads, "worker-threads", 10, "Number of worker threads.")
	fs.BoolVar(&o.leaderElect, "leader-election", false, "Enables leader election.")
	fs.StringVar(&o.leNamespace, "leader-election-namespace", "", "The namespace where the leader election resource exists. Defaults to the pod namespace if not set.")
	fs.DurationVar(&o.leaseDuration, "leader-election-lease-duration", 15*time.Second, "Duration that non-leader candidates will wait to force acquire leadership.")
	fs.DurationVar(&o.renewDeadline, "leader-election-renew-deadline", 10*time.Second, "Duration that the acting leader will retry refreshing leadership before giving up.")
	fs.DurationVar(&o.retryPeriod, "leader-election-retry-period", 5*time.Second, "Duration the LeaderElector clients should wait between tries of actions.")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "The TCP network address where the HTTP server for metrics will listen (example: `:8080`). Empty: no server.")
	fs.StringVar(&o.metricsPath, "metrics-path", "/metrics", "The HTTP path where prometheus metrics will be exposed.")
	return o, fs.Parse(args)
}

func (o *options) validate() error {
	if o.threads < 1 {
		return fmt.Errorf("--worker-threads must be at least 1, got %d", o.threads)
	}
	if o.resyncPeriod < 0 {
		return fmt.Errorf("--resync-period must not be negative, got %s", o.resyncPeriod)
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
	klog.InfoS("Starting volume-data-source-validator", "version", version)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o); err != nil {
		klog.ErrorS(err, "volume-data-source-validator failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options) error {
	cfg, err := kubeconfig.Load(o.kubeconfig, kubeconfig.Rate{QPS: 5, Burst: 10}) // client-go's default rate, as upstream
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	cl, err := standin.NewClients(ctx, cfg, "data-source-validator")
	if err != nil {
		return err
	}
	defer cl.Shutdown()
	kube, dynClient, recorder := cl.Kube, cl.Dynamic, cl.Recorder
	if o.httpEndpoint != "" {
		go standin.ServeHTTP(ctx, o.httpEndpoint, o.metricsPath)
	}

	work := func(ctx context.Context) {
		f := informers.NewSharedInformerFactory(kube, o.resyncPeriod)
		dyn := dynamicinformer.NewDynamicSharedInformerFactory(dynClient, o.resyncPeriod)
		v, err := newValidator(f, dyn, recorder)
		if err != nil {
			klog.ErrorS(err, "Setting up the validator")
			return
		}
		f.Start(ctx.Done())
		dyn.Start(ctx.Done())
		v.run(ctx, o.threads)
		f.Shutdown()
		dyn.Shutdown()
	}
	if !o.leaderElect {
		work(ctx)
		return nil
	}
	ns := o.leNamespace
	if ns == "" {
		ns = podNamespace()
	}
	id, _ := os.Hostname()
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, leaseName,
		kube.CoreV1(), kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return err
	}
	lost := make(chan struct{})
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true,
		LeaseDuration: o.leaseDuration, RenewDeadline: o.renewDeadline, RetryPeriod: o.retryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: work,
			OnStoppedLeading: func() { close(lost) },
		},
	})
	select {
	case <-ctx.Done():
		return nil
	case <-lost:
		return errors.New("lost the leader election lease")
	}
}

// podNamespace is the namespace of the pod this runs in (its ServiceAccount's).
func podNamespace() string {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		if ns := strings.TrimSpace(string(b)); ns != "" {
			return ns
		}
	}
	return "default"
}
