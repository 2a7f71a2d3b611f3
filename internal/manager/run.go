package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/leaderelection"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/kube/managerapi"
	"github.com/pods-as-volumes/pav/internal/kubeconfig"
)

// Options are `pav manager`'s flags.
type Options struct {
	Kubeconfig   string // "" = in-cluster
	Namespace    string // the manager's namespace: workloads and the Lease
	ConfigFile   string // settings (ConfigMap pav-manager); "" = none
	Overrides    Overrides
	HTTPEndpoint string // /healthz, /readyz and /metrics; "" = none
	LeaderElect  bool
	LeaseName    string
	Workers      int
	// Rate limits the manager's API requests (--kube-api-qps, --kube-api-burst).
	Rate    kubeconfig.Rate
	Version string
}

// Validate names the flag to fix.
func (o *Options) Validate() error {
	switch {
	case o.Namespace == "":
		return errors.New("--namespace is required (default: $POD_NAMESPACE)")
	case o.Workers < 1:
		return fmt.Errorf("--workers must be at least 1, got %d", o.Workers)
	case o.LeaderElect && o.LeaseName == "":
		return errors.New("--lease-name is required with --leader-elect")
	case o.Rate != (kubeconfig.Rate{}):
		return o.Rate.Validate()
	}
	return nil
}

// Leader election timing: client-go's usual values (csi-lib-utils' defaults,
// but for RetryPeriod, 5 s there). A new leader takes over at most
// LeaseDuration after the old one stopped renewing; a leader that could not
// renew for RenewDeadline stops.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// Run is `pav manager`: it reconciles until ctx ends. With leader election it
// reconciles only while it holds the Lease, and does not return: the election
// library exits the process when the election ends (see elect).
func Run(ctx context.Context, o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	var settings Settings
	if o.ConfigFile != "" {
		s, err := LoadSettings(o.ConfigFile)
		if err != nil {
			return err
		}
		settings = s
	}
	settings, err := o.Overrides.Apply(settings)
	if err != nil {
		return fmt.Errorf("flags: %w", err)
	}
	cfg, err := kubeconfig.Load(o.Kubeconfig, o.Rate)
	if err != nil {
		return err
	}
	cfg.UserAgent = "pav-manager/" + o.Version
	core, err := kube.NewForConfig(cfg)
	if err != nil {
		return err
	}
	apps, err := managerapi.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(core.EventSink())
	defer broadcaster.Shutdown()
	// Events are about PavProvisioners, whose kind toProvisioner sets.
	recorder := broadcaster.NewRecorder(managerapi.Scheme, corev1.EventSource{Component: FieldManager})

	c, err := New(Config{Kube: core, Apps: apps, Dynamic: dyn, Namespace: o.Namespace, Settings: settings, Recorder: recorder,
		Resync: 10 * time.Minute})
	if err != nil {
		return err
	}
	work := func(ctx context.Context) { c.Run(ctx, o.Workers) }
	var le elector
	var leaderHealth http.Handler
	if o.LeaderElect {
		// client-go's leader election takes the clientset: its Lease lock
		// and the events it records about the Lease. Same rate limiter as
		// the manager's other clients: one token bucket per process.
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		le, leaderHealth = elect(ctx, cs, o, work)
	}
	if o.HTTPEndpoint != "" {
		hs := healthServer(o.HTTPEndpoint, c, leaderHealth)
		go func() {
			if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "HTTP endpoint failed", "address", o.HTTPEndpoint)
			}
		}()
		defer hs.Close()
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	shown, _ := json.Marshal(settings)
	klog.InfoS("pav manager started", "version", o.Version, "namespace", o.Namespace, "settings", string(shown))
	if le == nil {
		work(ctx)
		return nil
	}
	return le.Run()
}

// elector is csi-lib-utils' leader election, whose type is unexported.
type elector interface{ Run() error }

// elect prepares csi-lib-utils' leader election (client-go's, on Lease
// o.Namespace/o.LeaseName) to run work while this manager holds the Lease,
// and returns it with its health check (fails once the leader has not renewed
// the Lease for 20 s past its expiry).
//
// The election's Run does not return once it has started: the library exits
// the process (klog.FlushAndExit, code 1) when it stops leading, and so when
// it stops campaigning, on shutdown too. After a lost Lease that stops the
// workers at once, and the restart campaigns again.
//
// On shutdown the Lease is released (ReleaseOnCancel: a rolling update hands
// over at once instead of after LeaseDuration), but only once the workers have
// stopped, so that a successor never works beside this manager. The library
// releases as soon as the context it runs with ends, while the workers, which
// it runs in a goroutine of its own, may still be reconciling: so it runs with
// a context of its own, which ends on shutdown once work has returned, or at
// once if this manager is not leading.
func elect(ctx context.Context, cs kubernetes.Interface, o Options, work func(context.Context)) (elector, http.Handler) {
	id := os.Getenv("POD_NAME")
	if id == "" {
		id, _ = os.Hostname()
	}
	// A restarted container is a new candidate: it does not take over the
	// Lease that its predecessor, perhaps still working, holds.
	id += "-" + rand.String(8)

	election, endElection := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	leading := false
	context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !leading {
			endElection() // no workers to wait for
		}
	})
	le := leaderelection.NewLeaderElection(cs, o.LeaseName, func(lease context.Context) {
		mu.Lock()
		if ctx.Err() != nil { // shut down as it took the Lease
			mu.Unlock()
			endElection()
			return
		}
		leading = true
		mu.Unlock()
		klog.InfoS("became the leader", "identity", id)
		// The workers stop on shutdown (ctx) or a lost Lease (lease).
		wctx, stop := context.WithCancel(ctx)
		defer stop()
		context.AfterFunc(lease, stop)
		work(wctx)
		klog.InfoS("workers stopped: releasing the Lease", "identity", id)
		endElection()
	})
	le.WithIdentity(id)
	le.WithNamespace(o.Namespace)
	le.WithLeaseDuration(leaseDuration)
	le.WithRenewDeadline(renewDeadline)
	le.WithRetryPeriod(retryPeriod)
	le.WithReleaseOnCancel(true)
	le.WithContext(election)
	var health http.Handler
	le.PrepareHealthCheck(serverFunc(func(_ string, h http.Handler) { health = h }), leaderelection.DefaultHealthCheckTimeout)
	return le, health
}

// serverFunc is a leaderelection.Server that hands the health check it is
// given to a function: the manager serves it at /healthz, where its
// Deployment's liveness probe asks, instead of the library's
// /healthz/leader-election.
type serverFunc func(pattern string, h http.Handler)

func (f serverFunc) Handle(pattern string, h http.Handler) { f(pattern, h) }

// healthServer: /healthz (alive; with leader election, leaderHealth: fails
// when the leader stopped renewing its Lease), /readyz (informers synced) and
// /metrics (client-go's request metrics: the manager's API requests; process
// and Go runtime).
func healthServer(addr string, c *Controller, leaderHealth http.Handler) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.HandlerFor(kubeconfig.Gatherer(), metrics.HandlerOpts{ErrorHandling: metrics.ContinueOnError}))
	if leaderHealth == nil {
		leaderHealth = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	}
	mux.Handle("/healthz", leaderHealth)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !c.HasSynced() {
			http.Error(w, "informers not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}
