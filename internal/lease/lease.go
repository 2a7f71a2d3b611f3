// Package lease implements leader election on a coordination.k8s.io Lease.
//
// It exists instead of client-go's tools/leaderelection because that package
// imports resourcelock, which imports client-go's typed clientset and with it
// k8s.io/client-go/kubernetes/scheme: linking it registers every built-in API
// group at program start, about 10 MiB of RSS for a manager that needs three
// Lease calls (see Client).
//
// The algorithm is client-go's, so a pav manager behaves like, and can share a
// Lease with, any client-go elector:
//   - candidates campaign every RetryPeriod (with jitter); the leader renews
//     every RetryPeriod and gives up when no renewal succeeded for
//     RenewDeadline;
//   - a Lease held by another identity is taken over only once it has not
//     changed for the holder's leaseDurationSeconds as measured on the LOCAL
//     clock (since this process last saw it change), never by comparing the
//     Lease's renewTime with our clock, so clock skew between nodes is
//     harmless;
//   - an empty holderIdentity means released: it may be taken at once;
//   - the leader renews by updating the Lease it last wrote without reading
//     it first (one request per renewal) and falls back to Get+Update when
//     that fails, e.g. on a Conflict;
//   - OnStoppedLeading is called whenever Run returns, even if this process
//     never led (client-go documents the same; callers must not assume that
//     it follows OnStartedLeading).
//
// Deliberate differences from client-go:
//   - LeaseDuration must be at least 1s: the Lease stores whole seconds, and
//     client-go would advertise 0s, letting any candidate take over at once.
//   - Run returns, and releases the Lease, only after OnStartedLeading has
//     returned: a successor never works beside this process's leftovers.
//     client-go returns at once, and its callers drain on a context of
//     their own.
//   - ReleaseOnCancel releases only when Run's context was cancelled, not
//     after a failed renewal, and only if the Lease as read back still names
//     this process (client-go trusts its cached view and could blank a
//     successor's Lease).
//   - Updates leave spec.strategy and spec.preferredHolder (coordinated
//     election, unsupported here) as they are instead of clearing them.
//   - Changes are detected by comparing the whole spec at the precision the
//     API returns, where client-go compares a JSON copy with whole seconds.
//   - The leader does not renew right after acquiring (client-go does): the
//     Lease was just written.
package lease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// JitterFactor is client-go's: a candidate waits between RetryPeriod and
// RetryPeriod*(1+JitterFactor) between attempts, so that candidates started
// together do not keep colliding.
const JitterFactor = 1.2

// Client is the part of a Lease client the election uses; client-go's typed
// coordinationv1.LeaseInterface satisfies it.
type Client interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
}

// Config configures an Elector; the fields mean what they mean in client-go's
// LeaderElectionConfig and LeaderCallbacks.
type Config struct {
	Client   Client
	Name     string // the Lease's name (its namespace is the Client's)
	Identity string

	// LeaseDuration is how long candidates wait, after they last saw the
	// Lease change, before taking it over. RenewDeadline is how long the
	// leader keeps retrying a renewal before it gives up leading.
	// RetryPeriod is the wait between attempts.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// ReleaseOnCancel clears the Lease's holder when Run's context is
	// cancelled, so that a successor takes over without waiting for
	// LeaseDuration.
	ReleaseOnCancel bool

	// OnStartedLeading runs in its own goroutine; its context ends when
	// leadership is lost or Run's context ends, and it must then return:
	// Run waits for it, so that the Lease is released (and Run returns) only
	// once the work it guards has stopped.
	OnStartedLeading func(ctx context.Context)
	// OnStoppedLeading is called when Run returns, whether or not it led.
	OnStoppedLeading func()
	// OnNewLeader (optional) is called in a goroutine with each holder this
	// process observes, including the first and "" for a released Lease.
	OnNewLeader func(identity string)

	WatchDog *HealthzAdaptor // optional; New ties it to the Elector
	Clock    clock.Clock     // nil means the real clock; set by tests
}

// Elector campaigns for, and holds, one Lease.
type Elector struct {
	cfg   Config
	clock clock.Clock

	// lease is the object as last read or written: the fast renewal path
	// updates it without a Get. reportedLeader is the holder last passed to
	// OnNewLeader. Both belong to Run's goroutine.
	lease          *coordinationv1.Lease
	reportedLeader string

	mu           sync.RWMutex
	observed     coordinationv1.LeaseSpec // the record as last seen
	observedTime time.Time                // local time it was last seen to change
}

// New validates cfg, naming the offending field, and returns an Elector.
func New(cfg Config) (*Elector, error) {
	var err error
	switch {
	case cfg.Client == nil:
		err = errors.New("Client must not be nil")
	case cfg.Name == "":
		err = errors.New("Name must not be empty")
	case cfg.Identity == "":
		err = errors.New("Identity must not be empty")
	case cfg.LeaseDuration < time.Second:
		err = fmt.Errorf("LeaseDuration must be at least 1s, as a Lease stores whole seconds, got %v", cfg.LeaseDuration)
	case cfg.RenewDeadline <= 0:
		err = fmt.Errorf("RenewDeadline must be greater than zero, got %v", cfg.RenewDeadline)
	case cfg.RetryPeriod <= 0:
		err = fmt.Errorf("RetryPeriod must be greater than zero, got %v", cfg.RetryPeriod)
	case cfg.LeaseDuration <= cfg.RenewDeadline:
		err = fmt.Errorf("LeaseDuration (%v) must be greater than RenewDeadline (%v)", cfg.LeaseDuration, cfg.RenewDeadline)
	case cfg.RenewDeadline <= time.Duration(JitterFactor*float64(cfg.RetryPeriod)):
		err = fmt.Errorf("RenewDeadline (%v) must be greater than RetryPeriod (%v) * JitterFactor (%v)", cfg.RenewDeadline, cfg.RetryPeriod, JitterFactor)
	case cfg.OnStartedLeading == nil:
		err = errors.New("OnStartedLeading must not be nil")
	case cfg.OnStoppedLeading == nil:
		err = errors.New("OnStoppedLeading must not be nil")
	}
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	e := &Elector{cfg: cfg, clock: cfg.Clock}
	if e.clock == nil {
		e.clock = clock.RealClock{}
	}
	if cfg.WatchDog != nil {
		cfg.WatchDog.elector.Store(e)
	}
	return e, nil
}

// Run campaigns until it leads or ctx ends, then renews until ctx ends or a
// renewal has failed for RenewDeadline, then waits for OnStartedLeading to
// return (and releases the Lease, with ReleaseOnCancel). It returns only then.
func (e *Elector) Run(ctx context.Context) {
	defer e.cfg.OnStoppedLeading()
	if !e.acquire(ctx) {
		return
	}
	leading, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.cfg.OnStartedLeading(leading)
	}()
	e.renew(ctx)
	cancel()
	<-done
	if e.cfg.ReleaseOnCancel && ctx.Err() != nil {
		e.release(ctx)
	}
}

// IsLeader reports whether the last observed holder is this process.
func (e *Elector) IsLeader() bool { return e.GetLeader() == e.cfg.Identity }

// GetLeader returns the last observed holder, "" if none was observed.
func (e *Elector) GetLeader() string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return holder(&e.observed)
}

func (e *Elector) acquire(ctx context.Context) bool {
	klog.InfoS("attempting to acquire lease", "lease", e.cfg.Name, "identity", e.cfg.Identity)
	for ctx.Err() == nil {
		ok := e.tryAcquireOrRenew(ctx)
		e.reportTransition()
		if ok {
			klog.InfoS("successfully acquired lease", "lease", e.cfg.Name, "identity", e.cfg.Identity)
			return true
		}
		klog.V(4).InfoS("failed to acquire lease", "lease", e.cfg.Name, "holder", e.GetLeader())
		jittered := e.cfg.RetryPeriod + time.Duration(rand.Float64()*JitterFactor*float64(e.cfg.RetryPeriod))
		if !e.sleep(ctx, jittered) {
			return false
		}
	}
	return false
}

// renew renews every RetryPeriod until ctx ends or a renewal fails.
func (e *Elector) renew(ctx context.Context) {
	for e.sleep(ctx, e.cfg.RetryPeriod) {
		if !e.renewWithin(ctx) {
			if ctx.Err() == nil {
				klog.InfoS("failed to renew lease: leadership lost", "lease", e.cfg.Name, "identity", e.cfg.Identity, "renewDeadline", e.cfg.RenewDeadline)
			}
			return
		}
		klog.V(5).InfoS("successfully renewed lease", "lease", e.cfg.Name)
	}
}

// renewWithin retries a renewal every RetryPeriod until one succeeds or
// RenewDeadline has passed (then it returns false), as client-go's
// PollUntilContextTimeout does.
func (e *Elector) renewWithin(ctx context.Context) bool {
	deadline := e.clock.Now().Add(e.cfg.RenewDeadline)
	for {
		left := deadline.Sub(e.clock.Now())
		if left <= 0 {
			return false
		}
		// A hung request must not keep us leading past the deadline either.
		reqCtx, cancel := context.WithTimeout(ctx, left)
		ok := e.tryAcquireOrRenew(reqCtx)
		cancel()
		e.reportTransition()
		if ok {
			return true
		}
		if !e.sleep(ctx, min(e.cfg.RetryPeriod, deadline.Sub(e.clock.Now()))) {
			return false
		}
	}
}

// sleep waits d on e.clock; it returns false if ctx ended first.
func (e *Elector) sleep(ctx context.Context, d time.Duration) bool {
	t := e.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// tryAcquireOrRenew makes one attempt to take or renew the Lease and
// reports whether we hold it now (client-go's function of the same name).
func (e *Elector) tryAcquireOrRenew(ctx context.Context) bool {
	now := e.clock.Now()

	// Fast path: while we hold a Lease we have not seen expire, update the
	// object we wrote last without reading it first. If someone else wrote
	// it meanwhile its resourceVersion makes this a Conflict, and the slow
	// path below finds out what happened.
	if e.IsLeader() && e.valid(now) && e.lease != nil {
		l := e.lease.DeepCopy()
		e.claim(&l.Spec, now)
		got, err := e.cfg.Client.Update(ctx, l, metav1.UpdateOptions{})
		if err == nil {
			e.wrote(got)
			return true
		}
		klog.V(2).InfoS("failed to renew lease optimistically, falling back to reading it", "lease", e.cfg.Name, "err", err)
	}

	cur, err := e.cfg.Client.Get(ctx, e.cfg.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: e.cfg.Name}}
		e.claim(&l.Spec, now)
		l.Spec.AcquireTime = new(metav1.NewMicroTime(now))
		l.Spec.LeaseTransitions = new(int32(0))
		got, err := e.cfg.Client.Create(ctx, l, metav1.CreateOptions{})
		if err != nil {
			klog.ErrorS(err, "failed to create lease", "lease", e.cfg.Name)
			return false
		}
		e.wrote(got)
		return true
	}
	if err != nil {
		klog.ErrorS(err, "failed to get lease", "lease", e.cfg.Name)
		return false
	}
	e.lease = cur
	// Expiry counts from when we saw the record change, on our clock.
	e.mu.RLock()
	changed := !equality.Semantic.DeepEqual(cur.Spec, e.observed)
	e.mu.RUnlock()
	if changed {
		e.observe(&cur.Spec)
	}
	if h := holder(&cur.Spec); h != "" && !e.IsLeader() && e.valid(now) {
		klog.V(4).InfoS("lease is held by another candidate and has not expired", "lease", e.cfg.Name, "holder", h)
		return false
	}

	l := cur.DeepCopy()
	if !e.IsLeader() { // taking it over; a renewal keeps both
		l.Spec.AcquireTime = new(metav1.NewMicroTime(now))
		l.Spec.LeaseTransitions = new(ptr.Deref(cur.Spec.LeaseTransitions, 0) + 1)
	}
	e.claim(&l.Spec, now)
	got, err := e.cfg.Client.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		// A Conflict means another candidate wrote the Lease since our Get.
		klog.ErrorS(err, "failed to update lease", "lease", e.cfg.Name)
		return false
	}
	e.wrote(got)
	return true
}

// claim makes spec name us as holder, renewed at now.
func (e *Elector) claim(spec *coordinationv1.LeaseSpec, now time.Time) {
	spec.HolderIdentity = new(e.cfg.Identity)
	spec.LeaseDurationSeconds = new(int32(e.cfg.LeaseDuration / time.Second))
	spec.RenewTime = new(metav1.NewMicroTime(now))
}

// release clears the holder if the Lease still names us, so that another
// candidate may take it at once; the spec is client-go's released record.
func (e *Elector) release(ctx context.Context) {
	if !e.IsLeader() {
		return
	}
	// Run's ctx is already cancelled: give the release its own deadline.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RenewDeadline)
	defer cancel()
	cur, err := e.cfg.Client.Get(ctx, e.cfg.Name, metav1.GetOptions{})
	if err != nil {
		klog.ErrorS(err, "failed to get lease to release it", "lease", e.cfg.Name)
		return
	}
	if h := holder(&cur.Spec); h != e.cfg.Identity {
		klog.InfoS("not releasing lease held by another candidate", "lease", e.cfg.Name, "holder", h)
		return
	}
	now := e.clock.Now()
	l := cur.DeepCopy()
	l.Spec.HolderIdentity = new("")
	l.Spec.LeaseDurationSeconds = new(int32(1))
	l.Spec.AcquireTime = new(metav1.NewMicroTime(now))
	l.Spec.RenewTime = new(metav1.NewMicroTime(now))
	got, err := e.cfg.Client.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		klog.ErrorS(err, "failed to release lease", "lease", e.cfg.Name)
		return
	}
	e.wrote(got)
	klog.InfoS("released lease", "lease", e.cfg.Name, "identity", e.cfg.Identity)
}

// wrote keeps the Lease as the API server returned it from our write: the
// next renewal's base, and the record as seen now.
func (e *Elector) wrote(l *coordinationv1.Lease) {
	e.lease = l
	e.observe(&l.Spec)
}

// observe records spec as seen now.
func (e *Elector) observe(spec *coordinationv1.LeaseSpec) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.observed = *spec.DeepCopy()
	e.observedTime = e.clock.Now()
}

// valid reports whether the observed record has not expired at now: its
// holder's leaseDurationSeconds have not passed since we saw it change.
func (e *Elector) valid(now time.Time) bool {
	e.mu.RLock()
	defer e.mu.RUnlock()
	d := time.Duration(ptr.Deref(e.observed.LeaseDurationSeconds, 0)) * time.Second
	return e.observedTime.Add(d).After(now)
}

func (e *Elector) reportTransition() {
	h := e.GetLeader()
	if h == e.reportedLeader {
		return
	}
	e.reportedLeader = h
	if e.cfg.OnNewLeader != nil {
		go e.cfg.OnNewLeader(h)
	}
}

func holder(spec *coordinationv1.LeaseSpec) string {
	if spec.HolderIdentity == nil {
		return ""
	}
	return *spec.HolderIdentity
}

// HealthzAdaptor is a /healthz check that fails when this process leads but
// has not renewed its Lease for longer than LeaseDuration plus a timeout:
// it should have stopped leading by then, so it is stuck (e.g. deadlocked)
// and the kubelet had better restart it. It exists before the Elector so
// that the health endpoint can be served first; New ties the two.
type HealthzAdaptor struct {
	timeout time.Duration
	elector atomic.Pointer[Elector]
}

// NewHealthzAdaptor returns a check tolerating timeout beyond LeaseDuration,
// like client-go's NewLeaderHealthzAdaptor.
func NewHealthzAdaptor(timeout time.Duration) *HealthzAdaptor {
	return &HealthzAdaptor{timeout: timeout}
}

// Check returns an error when the leader's renewal is overdue; nil when no
// Elector is tied yet or this process does not lead.
func (a *HealthzAdaptor) Check(_ *http.Request) error {
	e := a.elector.Load()
	if e == nil || !e.IsLeader() {
		return nil
	}
	e.mu.RLock()
	last := e.observedTime
	e.mu.RUnlock()
	if since := e.clock.Since(last); since > e.cfg.LeaseDuration+a.timeout {
		return fmt.Errorf("leader has not renewed lease %s for %v", e.cfg.Name, since.Round(time.Second))
	}
	return nil
}
