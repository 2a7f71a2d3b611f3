package lease

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// client-go's defaults; all timing runs on a fake clock.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
	// maxRetry is the longest a candidate waits between attempts.
	maxRetry = retryPeriod + time.Duration(JitterFactor*float64(retryPeriod))
	name     = "pav-manager"
)

// env is a fake clientset whose Leases behave like the API server's
// (resourceVersions, Conflicts) and a fake clock shared by its electors.
type env struct {
	t      *testing.T
	cs     *fake.Clientset
	leases Client
	clk    *clocktesting.FakeClock
}

func newEnv(t *testing.T) *env {
	cs := fake.NewClientset()
	// The fake tracker ignores resourceVersion; the API server's optimistic
	// concurrency is what makes two simultaneous takeovers impossible.
	// Reactors run under the Fake's lock, so check-and-write is atomic.
	cs.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		l.ResourceVersion = "1"
		return true, l, cs.Tracker().Create(a.GetResource(), l, a.GetNamespace())
	})
	cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		cur, err := cs.Tracker().Get(a.GetResource(), a.GetNamespace(), l.Name)
		if err != nil {
			return true, nil, err
		}
		rv := cur.(*coordinationv1.Lease).ResourceVersion
		if l.ResourceVersion != rv {
			return true, nil, apierrors.NewConflict(a.GetResource().GroupResource(), l.Name, errors.New("stale resourceVersion"))
		}
		n, _ := strconv.Atoi(rv)
		l.ResourceVersion = strconv.Itoa(n + 1)
		return true, l, cs.Tracker().Update(a.GetResource(), l, a.GetNamespace())
	})
	return &env{t: t, cs: cs, leases: cs.CoordinationV1().Leases("ns"),
		clk: clocktesting.NewFakeClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))}
}

func (v *env) config(id string) Config {
	return Config{Client: v.leases, Name: name, Identity: id, Clock: v.clk,
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		OnStartedLeading: func(context.Context) {}, OnStoppedLeading: func() {}}
}

// candidate is an Elector running in Run.
type candidate struct {
	*Elector
	cancel  context.CancelFunc
	started chan context.Context // OnStartedLeading's context
	stopped chan struct{}        // closed by OnStoppedLeading
	done    chan struct{}        // closed when Run returns

	mu      sync.Mutex
	leaders []string // as passed to OnNewLeader
}

func (v *env) start(id string, releaseOnCancel bool) *candidate {
	c := &candidate{started: make(chan context.Context, 1), stopped: make(chan struct{}), done: make(chan struct{})}
	cfg := v.config(id)
	cfg.ReleaseOnCancel = releaseOnCancel
	cfg.OnStartedLeading = func(ctx context.Context) { c.started <- ctx }
	cfg.OnStoppedLeading = func() { close(c.stopped) }
	cfg.OnNewLeader = func(l string) { c.mu.Lock(); c.leaders = append(c.leaders, l); c.mu.Unlock() }
	e, err := New(cfg)
	if err != nil {
		v.t.Fatal(err)
	}
	c.Elector = e
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() { defer close(c.done); e.Run(ctx) }()
	v.t.Cleanup(func() { cancel(); <-c.done })
	return c
}

func (c *candidate) reported(leader string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.leaders, leader)
}

// waitUntil polls cond in real time; generous, as -race on 2 busy cores is slow.
func (v *env) waitUntil(what string, cond func() bool) {
	v.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			v.t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// settle waits until n electors block on the fake clock, i.e. have finished
// what the last Step set off.
func (v *env) settle(n int) {
	v.t.Helper()
	v.waitUntil(strconv.Itoa(n)+" electors wait", func() bool { return v.clk.Waiters() >= n })
}

func (v *env) get() *coordinationv1.Lease {
	v.t.Helper()
	l, err := v.leases.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		v.t.Fatal(err)
	}
	return l
}

func closed[T any](ch <-chan T) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestNewValidates(t *testing.T) {
	v := newEnv(t)
	for _, tc := range []struct {
		field  string
		mutate func(*Config)
	}{
		{"Client", func(c *Config) { c.Client = nil }},
		{"Name", func(c *Config) { c.Name = "" }},
		{"Identity", func(c *Config) { c.Identity = "" }},
		{"LeaseDuration", func(c *Config) { c.LeaseDuration = 0 }},
		{"LeaseDuration", func(c *Config) { c.LeaseDuration = 999 * time.Millisecond }},
		{"LeaseDuration", func(c *Config) { c.LeaseDuration = renewDeadline }},
		{"RenewDeadline", func(c *Config) { c.RenewDeadline = -time.Second }},
		{"RenewDeadline", func(c *Config) { c.RenewDeadline = time.Duration(JitterFactor * float64(retryPeriod)) }},
		{"RetryPeriod", func(c *Config) { c.RetryPeriod = 0 }},
		{"OnStartedLeading", func(c *Config) { c.OnStartedLeading = nil }},
		{"OnStoppedLeading", func(c *Config) { c.OnStoppedLeading = nil }},
	} {
		cfg := v.config("a")
		tc.mutate(&cfg)
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: got error %v, want one naming the field", tc.field, err)
		}
	}
	if _, err := New(v.config("a")); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

func TestAcquireRenewRelease(t *testing.T) {
	for _, release := range []bool{true, false} {
		t.Run("ReleaseOnCancel="+strconv.FormatBool(release), func(t *testing.T) {
			v := newEnv(t)
			t0 := v.clk.Now()
			c := v.start("a", release)
			v.settle(1)
			l := v.get()
			if !c.IsLeader() || holder(&l.Spec) != "a" || *l.Spec.LeaseDurationSeconds != 15 ||
				*l.Spec.LeaseTransitions != 0 || !l.Spec.AcquireTime.Time.Equal(t0) || !l.Spec.RenewTime.Time.Equal(t0) {
				t.Fatalf("not leader (%v) or created Lease is wrong: %+v", c.IsLeader(), l.Spec)
			}
			var leading context.Context
			select {
			case leading = <-c.started:
			case <-time.After(20 * time.Second):
				t.Fatal("OnStartedLeading not called")
			}
			v.clk.Step(retryPeriod)
			v.settle(1)
			if l := v.get(); !l.Spec.RenewTime.Time.Equal(t0.Add(retryPeriod)) || !l.Spec.AcquireTime.Time.Equal(t0) {
				t.Fatalf("renewal: renewTime %v acquireTime %v", l.Spec.RenewTime, l.Spec.AcquireTime)
			}
			v.waitUntil("OnNewLeader reports a", func() bool { return c.reported("a") })

			c.cancel()
			v.waitUntil("Run returns", func() bool { return closed(c.done) })
			if !closed(c.stopped) || leading.Err() == nil {
				t.Fatal("OnStoppedLeading not called or leading context not cancelled")
			}
			l = v.get()
			if want := map[bool]string{true: "", false: "a"}[release]; holder(&l.Spec) != want {
				t.Fatalf("holder after cancel = %q, want %q", holder(&l.Spec), want)
			}
			if release && (*l.Spec.LeaseDurationSeconds != 1 || *l.Spec.LeaseTransitions != 0) {
				t.Fatalf("released Lease: %+v", l.Spec)
			}
		})
	}
}

// Run releases the Lease, and returns, only once OnStartedLeading (the work
// the Lease guards) has returned: a successor never works beside it.
func TestReleaseWaitsForTheWork(t *testing.T) {
	v := newEnv(t)
	working, finish := make(chan struct{}), make(chan struct{})
	cfg := v.config("a")
	cfg.ReleaseOnCancel = true
	cfg.OnStartedLeading = func(ctx context.Context) {
		close(working)
		<-ctx.Done()
		<-finish // still draining after its context ended
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Run(ctx) }()
	v.waitUntil("OnStartedLeading runs", func() bool { return closed(working) })
	cancel()
	time.Sleep(50 * time.Millisecond) // time enough to release, were Run not waiting
	if closed(done) || holder(&v.get().Spec) != "a" {
		t.Fatalf("Run returned (%v) or released the Lease (holder %q) while the work still ran", closed(done), holder(&v.get().Spec))
	}
	close(finish)
	v.waitUntil("Run returns", func() bool { return closed(done) })
	if h := holder(&v.get().Spec); h != "" {
		t.Fatalf("holder after the work stopped = %q, want released", h)
	}
}

func TestTwoElectorsHandOver(t *testing.T) {
	v := newEnv(t)
	a := v.start("a", true)
	v.settle(1)
	b := v.start("b", true)
	v.settle(2)
	// Longer than LeaseDuration: a's renewals keep b out.
	for elapsed := time.Duration(0); elapsed < 2*leaseDuration; elapsed += retryPeriod {
		if !a.IsLeader() || b.IsLeader() || b.GetLeader() != "a" {
			t.Fatalf("after %v: a leads %v, b leads %v (sees %q)", elapsed, a.IsLeader(), b.IsLeader(), b.GetLeader())
		}
		v.clk.Step(retryPeriod)
		v.settle(2)
	}
	a.cancel()
	v.waitUntil("a's Run returns", func() bool { return closed(a.done) })
	released := v.clk.Now()
	for !b.IsLeader() {
		if v.clk.Since(released) > maxRetry {
			t.Fatalf("b has not taken over a released Lease after %v", v.clk.Since(released))
		}
		v.clk.Step(time.Second)
		v.settle(1)
	}
	if l := v.get(); holder(&l.Spec) != "b" || *l.Spec.LeaseTransitions != 1 {
		t.Fatalf("after takeover: %+v", l.Spec)
	}
	v.waitUntil("b's OnNewLeader reports b", func() bool { return b.reported("a") && b.reported("b") })
}

// TestExpiryOnLocalClock: a Lease held elsewhere is taken only once it has
// not changed for LeaseDuration on our clock, whatever its renewTime says.
func TestExpiryOnLocalClock(t *testing.T) {
	for _, tc := range []struct {
		name      string
		renewTime time.Duration // relative to our clock: the holder's skew
		renewing  bool          // the holder keeps renewing
	}{
		{"holder renews", 0, true},
		{"holder renews, its clock is behind", -time.Hour, true},
		{"holder stopped, its clock is ahead", time.Hour, false},
		{"holder stopped, its clock is behind", -time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newEnv(t)
			t0 := v.clk.Now()
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{
				HolderIdentity: new("other"), LeaseDurationSeconds: new(int32(15)), LeaseTransitions: new(int32(3)),
				AcquireTime: new(metav1.NewMicroTime(t0.Add(tc.renewTime))), RenewTime: new(metav1.NewMicroTime(t0.Add(tc.renewTime))),
			}}
			if _, err := v.leases.Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			c := v.start("a", false)
			v.settle(1)
			for !c.IsLeader() {
				if v.clk.Since(t0) > 3*leaseDuration {
					if tc.renewing {
						return // never taken: as it should be
					}
					t.Fatal("a Lease whose holder stopped renewing was never taken")
				}
				if tc.renewing {
					l = v.get()
					l.Spec.RenewTime = new(metav1.NewMicroTime(v.clk.Now().Add(tc.renewTime)))
					if _, err := v.leases.Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				v.clk.Step(time.Second)
				v.settle(1)
			}
			if took := v.clk.Since(t0); tc.renewing || took < leaseDuration || took > leaseDuration+maxRetry {
				t.Fatalf("took the Lease after %v, want never if renewed, else after %v", took, leaseDuration)
			}
			if l := v.get(); *l.Spec.LeaseTransitions != 4 {
				t.Fatalf("leaseTransitions = %d, want 4", *l.Spec.LeaseTransitions)
			}
		})
	}
}

func TestRenewalFailureLosesLeadership(t *testing.T) {
	v := newEnv(t)
	c := v.start("a", true)
	v.settle(1)
	leading := <-c.started
	v.cs.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("etcd is unavailable")
	})
	failing := v.clk.Now()
	for !closed(c.done) {
		if v.clk.Since(failing) > renewDeadline+retryPeriod {
			t.Fatalf("still leading %v after renewals started failing", v.clk.Since(failing))
		}
		v.clk.Step(time.Second)
		v.waitUntil("a waits or returns", func() bool { return v.clk.Waiters() == 1 || closed(c.done) })
	}
	if lost := v.clk.Since(failing); lost < renewDeadline {
		t.Fatalf("gave up after %v, before RenewDeadline", lost)
	}
	if leading.Err() == nil || !closed(c.stopped) {
		t.Fatal("leading context not cancelled or OnStoppedLeading not called")
	}
	// Lost, not cancelled: no release attempt (it would fail here anyway).
	if holder(&v.get().Spec) != "a" {
		t.Fatal("holder changed")
	}
}

func TestRenewalCostsOneRequest(t *testing.T) {
	v := newEnv(t)
	c := v.start("a", false)
	v.settle(1)
	renew := func() []string {
		before := len(v.cs.Actions())
		v.clk.Step(retryPeriod)
		v.settle(1)
		var verbs []string
		for _, a := range v.cs.Actions()[before:] {
			verbs = append(verbs, a.GetVerb())
		}
		return verbs
	}
	for range 3 {
		if verbs := renew(); !slices.Equal(verbs, []string{"update"}) {
			t.Fatalf("steady-state renewal made requests %v, want one update", verbs)
		}
	}
	// Someone else wrote the Lease (a label): the optimistic update
	// conflicts and the renewal reads the Lease and retries.
	l := v.get()
	l.Labels = map[string]string{"touched": "yes"}
	if _, err := v.leases.Update(context.Background(), l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if verbs := renew(); !slices.Equal(verbs, []string{"update", "get", "update"}) || !c.IsLeader() {
		t.Fatalf("renewal after a foreign write made requests %v, leader %v", verbs, c.IsLeader())
	}
	if verbs := renew(); !slices.Equal(verbs, []string{"update"}) {
		t.Fatalf("next renewal made requests %v, want one update", verbs)
	}
}

func TestHealthzAdaptor(t *testing.T) {
	const timeout = 5 * time.Second
	for _, tc := range []struct {
		name    string
		held    bool          // the Lease is another's, so we do not lead
		step    time.Duration // time since our last renewal
		wantErr bool
	}{
		{"leader, just renewed", false, 0, false},
		{"leader, overdue within timeout", false, leaseDuration + timeout, false},
		{"leader, overdue beyond timeout", false, leaseDuration + timeout + time.Second, true},
		{"not leader", true, time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newEnv(t)
			a := NewHealthzAdaptor(timeout)
			if err := a.Check(nil); err != nil {
				t.Fatalf("no elector tied yet: %v", err)
			}
			if tc.held {
				l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: new("other"), LeaseDurationSeconds: new(int32(15))}}
				if _, err := v.leases.Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			cfg := v.config("a")
			cfg.WatchDog = a
			e, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := e.tryAcquireOrRenew(context.Background()); got == tc.held {
				t.Fatalf("tryAcquireOrRenew = %v", got)
			}
			v.clk.Step(tc.step)
			if err := a.Check(nil); (err != nil) != tc.wantErr {
				t.Fatalf("Check = %v, want error %v", err, tc.wantErr)
			}
		})
	}
}
