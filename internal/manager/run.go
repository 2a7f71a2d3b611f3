package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/kube/managerapi"
	"github.com/pods-as-volumes/pav/internal/kubeconfig"
	"github.com/pods-as-volumes/pav/internal/lease"
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

// Leader election timing (client-go's usual values): a new leader takes over
// at most LeaseDuration after the old one stopped renewing.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// Run is `pav manager`: it reconciles until ctx ends (or leadership is lost,
// which is an error: the process exits and its restart campaigns again).
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
	watchdog := lease.NewHealthzAdaptor(20 * time.Second)
	if o.HTTPEndpoint != "" {
		hs := healthServer(o.HTTPEndpoint, c, watchdog)
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
	if !o.LeaderElect {
		c.Run(ctx, o.Workers)
		return nil
	}

	id := os.Getenv("POD_NAME")
	if id == "" {
		id, _ = os.Hostname()
	}
	id += "_" + rand.String(8)
	// On shutdown (ctx) or a lost Lease the workers stop, and lease.Run
	// returns, and releases the Lease, only once they have: a successor never
	// works beside this manager.
	le, err := lease.New(lease.Config{
		Client: apps.Leases(o.Namespace), Name: o.LeaseName, Identity: id, WatchDog: watchdog,
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		// A rolling update hands over at once instead of after LeaseDuration.
		ReleaseOnCancel: true,
		OnStartedLeading: func(leading context.Context) {
			klog.InfoS("became the leader", "identity", id)
			c.Run(leading, o.Workers)
		},
		OnStoppedLeading: func() { klog.InfoS("stopped leading", "identity", id) },
		OnNewLeader: func(leader string) {
			if leader != id {
				klog.InfoS("another manager leads", "leader", leader)
			}
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx)
	if ctx.Err() == nil {
		return errors.New("lost the leader election Lease: exiting so that a restart campaigns again")
	}
	return nil
}

// healthServer: /healthz (alive; fails when the leader stopped renewing its
// Lease), /readyz (informers synced) and /metrics (client-go's request
// metrics: the manager's API requests; process and Go runtime).
func healthServer(addr string, c *Controller, watchdog *lease.HealthzAdaptor) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.HandlerFor(kubeconfig.Gatherer(), metrics.HandlerOpts{ErrorHandling: metrics.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := watchdog.Check(r); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !c.HasSynced() {
			http.Error(w, "informers not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}
