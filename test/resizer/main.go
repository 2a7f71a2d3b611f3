// Command resizer is a TEST-ONLY stand-in for the Kubernetes CSI external-resizer
// sidecar (registry.k8s.io/sig-storage/csi-resizer, v2), whose source the Go module
// proxy refuses to serve, so that the local e2e cluster (hack/cluster,
// test/e2e/install) can expand pav volumes. Production deployments use the real
// csi-resizer image (deploy/provisioner/controller.yaml names it; the e2e install
// swaps in this one through the manager's images.csiResizer).
//
// It does what external-resizer v2 does for the cases pav needs, with the same flags
// (--csi-address, --timeout, --leader-election, --leader-election-namespace,
// --http-endpoint, --kubeconfig, --kube-api-qps, --kube-api-burst, --v; --workers;
// a test parses the arguments deploy/provisioner gives the real one):
//
//   - at start it asks the driver its name (GetPluginInfo) and exits non-zero unless
//     it serves ControllerExpandVolume (EXPAND_VOLUME), as the real sidecar does;
//   - it watches PVCs, PVs and StorageClasses (informers, no polling); a bound claim
//     whose PV is this driver's, whose StorageClass allows expansion and whose
//     spec.resources.requests.storage exceeds status.capacity is expanded following
//     Kubernetes' resize protocol with RecoverVolumeExpansionFailure:
//     status.allocatedResourceStatuses[storage]=ControllerResizeInProgress and
//     status.allocatedResources[storage]=<size>, ControllerExpandVolume, the PV's
//     spec.capacity, then NodeResizePending (node_expansion_required: the kubelet
//     calls NodeExpandVolume and finishes the claim) or the claim finished
//     (status.capacity, the status cleared);
//   - a driver error is an event (VolumeResizeFailed) and a retry with backoff; a
//     final one is recorded on the claim (condition ControllerResizeError, and
//     ControllerResizeInfeasible for InvalidArgument/OutOfRange/NotFound, tried again
//     only every few minutes at that size).
//
// Not done (pav does not need it): the trivial node-only resizer, secrets
// (csi.storage.k8s.io/controller-expand-secret-*), --handle-volume-inuse-error,
// VolumeAttributesClass modification, metrics.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/kubeconfig"
)

// options are the flags, named as external-resizer names them.
type options struct {
	csiAddress     string
	timeout        time.Duration
	leaderElection bool
	leNamespace    string
	httpEndpoint   string
	kubeconfigPath string
	rate           kubeconfig.Rate
	workers        int
}

// parseFlags parses args (without the program name) as external-resizer
// would, klog's flags (--v) included.
func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("csi-resizer", flag.ContinueOnError)
	klog.InitFlags(fs)
	o := &options{}
	fs.StringVar(&o.csiAddress, "csi-address", "/run/csi/socket", "Path of the CSI driver socket.")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "Timeout of each CSI call.")
	fs.BoolVar(&o.leaderElection, "leader-election", false, "Run only while holding a Lease (one active replica).")
	fs.StringVar(&o.leNamespace, "leader-election-namespace", "", "Namespace of the Lease (default: the pod's).")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "If set, serve /healthz on this address.")
	fs.StringVar(&o.kubeconfigPath, "kubeconfig", "", "Kubeconfig file; in-cluster configuration when empty.")
	// external-resizer's defaults, not pav's.
	o.rate = kubeconfig.Rate{QPS: 5, Burst: 10}
	o.rate.AddFlags(fs)
	fs.IntVar(&o.workers, "workers", 10, "Claims resized at once.")
	return o, fs.Parse(args)
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, o); err != nil {
		klog.ErrorS(err, "resizer failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options) error {
	cfg, err := kubeconfig.Load(o.kubeconfigPath, o.rate)
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	target := o.csiAddress
	if !strings.HasPrefix(target, "unix:") {
		target = "unix://" + target
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("CSI socket %s: %w", o.csiAddress, err)
	}
	defer conn.Close()
	driver, err := probe(ctx, conn, o.timeout)
	if err != nil {
		return err
	}
	klog.InfoS("CSI driver serves ControllerExpandVolume", "driver", driver)

	if o.httpEndpoint != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
		srv := &http.Server{Addr: o.httpEndpoint, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "http endpoint")
			}
		}()
		defer srv.Close()
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "external-resizer " + driver})

	work := func(ctx context.Context) {
		f := informers.NewSharedInformerFactory(kube, 10*time.Minute)
		r := newResizer(driver, kube, csi.NewControllerClient(conn), f, recorder, o.timeout)
		f.Start(ctx.Done())
		r.run(ctx, o.workers)
		f.Shutdown()
	}
	if !o.leaderElection {
		work(ctx)
		return nil
	}
	leNamespace := o.leNamespace
	if leNamespace == "" {
		leNamespace = os.Getenv("POD_NAMESPACE")
	}
	id, _ := os.Hostname()
	// The Lease is named like external-resizer's: external-resizer-<driver, / as ->.
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, leNamespace,
		"external-resizer-"+strings.NewReplacer("/", "-", ".", "-").Replace(driver),
		kube.CoreV1(), kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return err
	}
	lost := make(chan struct{})
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true,
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 5 * time.Second,
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

// probe waits for the driver and returns its name; it fails when the driver does
// not serve ControllerExpandVolume (the real sidecar exits then too).
func probe(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) (string, error) {
	id := csi.NewIdentityClient(conn)
	var name string
	for {
		c, cancel := context.WithTimeout(ctx, timeout)
		info, err := id.GetPluginInfo(c, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil {
			name = info.Name
			break
		}
		klog.InfoS("waiting for the CSI driver", "err", err)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
	c, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	caps, err := csi.NewControllerClient(conn).ControllerGetCapabilities(c, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		return "", fmt.Errorf("ControllerGetCapabilities of %s: %w", name, err)
	}
	for _, cp := range caps.GetCapabilities() {
		if cp.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_EXPAND_VOLUME {
			return name, nil
		}
	}
	return "", fmt.Errorf("CSI driver %s does not support controller resize (no EXPAND_VOLUME controller capability): its PavProvisioner has no spec.volumeExpansion, or the pav image predates expansion", name)
}
