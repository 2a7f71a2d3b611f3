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

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
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

// Leader election timing (variables for the tests): client-go's usual values (csi-lib-utils' defaults,
// but for RetryPeriod, 5 s there). A new leader takes over at most
// LeaseDuration after the old one stopped renewing; a leader that could not
// renew for RenewDeadline stops its workers and campaigns again.
var (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// Run is `pav manager`: it reconciles until ctx ends. With leader election it
// reconciles only while it holds the Lease (see elect), and returns once its
// workers have stopped and it released the Lease.
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
		hs := healthServer(o.HTTPEndpoint, c, &kube.APICheck{Client: core}, leaderHealth)
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

// elector runs the election until shutdown.
type elector interface{ Run() error }

// elect prepares client-go's leader election on Lease o.Namespace/o.LeaseName
// to run work while this manager holds the Lease, and returns it with its
// health check (fails once the leader has not renewed the Lease for 20 s past
// its expiry).
//
// A lost Lease stops the workers; once they have returned the manager
// campaigns again, with its informers' caches kept: an API server outage
// longer than the renew deadline costs the Lease, not the process (a
// manager that exited on it, as csi-lib-utils' election does, restarted
// during the outage, relisted everything after it and waited a full lease
// duration for its own old Lease: 60 s after a 5-minute outage on the local
// cluster). The same identity campaigns in every round, so that after an
// outage in which nobody else took the Lease it takes it back at once.
//
// On shutdown the Lease is released, so that a rolling update hands over at
// once instead of after LeaseDuration, but only once the workers have
// stopped, so that a successor never works beside this manager.
func elect(ctx context.Context, cs kubernetes.Interface, o Options, work func(context.Context)) (elector, http.Handler) {
	id := os.Getenv("POD_NAME")
	if id == "" {
		id, _ = os.Hostname()
	}
	// A restarted container is a new candidate: it does not take over the
	// Lease that its predecessor, perhaps still working, holds.
	id += "-" + rand.String(8)
	e := &election{ctx: ctx, work: work, health: leaderelection.NewLeaderHealthzAdaptor(leaderHealthTimeout),
		lock: &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.LeaseName},
			Client: cs.CoordinationV1(), LockConfig: resourcelock.ResourceLockConfig{Identity: id}}}
	health := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := e.health.Check(r); err != nil {
			http.Error(w, fmt.Sprintf("internal server error: %v", err), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return e, health
}

// leaderHealthTimeout is how long past its Lease's expiry a leader that has
// not renewed it still passes /healthz (csi-lib-utils' DefaultHealthCheckTimeout).
const leaderHealthTimeout = 20 * time.Second

type election struct {
	ctx    context.Context // shutdown
	work   func(context.Context)
	lock   *resourcelock.LeaseLock
	health *leaderelection.HealthzAdaptor
}

// Run campaigns, works while leading, and campaigns again after a lost
// Lease, until shutdown.
func (e *election) Run() error {
	for {
		led, err := e.round()
		if err != nil {
			return err
		}
		if e.ctx.Err() != nil {
			if led {
				e.release()
			}
			return nil
		}
		klog.InfoS("lost the Lease: workers stopped, campaigning again", "identity", e.lock.Identity())
	}
}

// round is one term: it campaigns, and once elected works until the Lease
// is lost or the manager shuts down; it returns once the workers have
// stopped, saying whether it held the Lease.
func (e *election) round() (bool, error) {
	var t term
	t.stopped = make(chan struct{})
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: e.lock, Name: e.lock.LeaseMeta.Name,
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		// Released by Run, after the workers have stopped: the library
		// would release as soon as the term ends, while they may still be
		// reconciling.
		ReleaseOnCancel: false,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lease context.Context) {
				if !t.begin() { // the term ended as it took the Lease
					return
				}
				defer close(t.stopped)
				if e.ctx.Err() != nil { // shut down as it took the Lease
					return
				}
				klog.InfoS("became the leader", "identity", e.lock.Identity())
				// The workers stop on shutdown or at the end of the term
				// (lease: a lost Lease, or shutdown).
				wctx, stop := context.WithCancel(e.ctx)
				defer stop()
				context.AfterFunc(lease, stop)
				e.work(wctx)
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return false, err
	}
	e.health.SetLeaderElection(le)
	le.Run(e.ctx) // returns at the end of the term, or on shutdown while campaigning
	if t.end() {
		<-t.stopped
		klog.InfoS("workers stopped", "identity", e.lock.Identity())
		return true, nil
	}
	// Elected just as the term ended, before the workers began (the
	// library starts them in a goroutine of its own): they never will.
	return le.IsLeader(), nil
}

// term tells the library's goroutine that starts the workers and the round
// that waits for them apart: the workers begin only while the term lasts.
type term struct {
	mu           sync.Mutex
	began, ended bool
	stopped      chan struct{} // closed once workers that began have returned
}

func (t *term) begin() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return false
	}
	t.began = true
	return true
}

// end ends the term and says whether the workers began.
func (t *term) end() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended = true
	return t.began
}

// release gives the Lease up if this manager still holds it, as client-go's
// ReleaseOnCancel does: an empty holder, expiring in a second.
func (e *election) release() {
	ctx, cancel := context.WithTimeout(context.Background(), renewDeadline)
	defer cancel()
	rec, _, err := e.lock.Get(ctx)
	if err != nil || rec.HolderIdentity != e.lock.Identity() {
		return
	}
	now := metav1.NewTime(time.Now())
	if err := e.lock.Update(ctx, resourcelock.LeaderElectionRecord{LeaderTransitions: rec.LeaderTransitions,
		LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now}); err != nil {
		klog.ErrorS(err, "Failed to release the Lease", "lease", e.lock.Describe())
		return
	}
	klog.InfoS("released the Lease", "identity", e.lock.Identity())
}

// healthServer: /healthz (alive; with leader election, leaderHealth: fails
// when the leader stopped renewing its Lease), /readyz (informers synced, and
// the API server answers: kube.APICheck, as the drivers' readiness) and
// /metrics (client-go's request metrics: the manager's API requests; process
// and Go runtime).
func healthServer(addr string, c *Controller, api *kube.APICheck, leaderHealth http.Handler) *http.Server {
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
		if api != nil {
			if err := api.Check(r.Context()); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}
