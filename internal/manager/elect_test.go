package manager

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/version"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/pods-as-volumes/pav/internal/kube"
)

// fastElection shortens the election's timing for a test.
func fastElection(t *testing.T) {
	l, r, p := leaseDuration, renewDeadline, retryPeriod
	leaseDuration, renewDeadline, retryPeriod = 1500*time.Millisecond, time.Second, 100*time.Millisecond
	t.Cleanup(func() { leaseDuration, renewDeadline, retryPeriod = l, r, p })
}

func holder(t *testing.T, cs *kubefake.Clientset) string {
	t.Helper()
	l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), "pav-manager", metav1.GetOptions{})
	if err != nil {
		t.Error(err) // from the workers' goroutine too: no Fatal
		return ""
	}
	return ptr.Deref(l.Spec.HolderIdentity, "")
}

// runElection runs elect's election in the background; done closes when Run
// returns (its error in *err).
func runElection(t *testing.T, ctx context.Context, cs *kubefake.Clientset, work func(context.Context)) (done chan struct{}, err *error) {
	le, _ := elect(ctx, cs, Options{Namespace: ns, LeaseName: "pav-manager"}, work)
	done, err = make(chan struct{}), new(error)
	go func() {
		defer close(done)
		*err = le.Run()
	}()
	return done, err
}

// On shutdown a leading manager's workers stop before it releases its Lease,
// and Run returns.
func TestElectShutdownWhileLeading(t *testing.T) {
	fastElection(t)
	cs := kubefake.NewClientset()
	ctx, shutdown := context.WithCancel(context.Background())
	var heldWhenStopped atomic.Bool
	var id string
	done, err := runElection(t, ctx, cs, func(wctx context.Context) {
		id = holder(t, cs)
		shutdown()
		<-wctx.Done()
		time.Sleep(300 * time.Millisecond) // a reconcile ending
		heldWhenStopped.Store(holder(t, cs) == id)
	})
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after shutdown")
	}
	if *err != nil {
		t.Errorf("Run: %v", *err)
	}
	if !heldWhenStopped.Load() {
		t.Error("the Lease was released before the workers stopped")
	}
	if h := holder(t, cs); h != "" {
		t.Errorf("after shutdown the Lease is held by %q, want released", h)
	}
}

// A manager that is not leading stops at once and leaves the Lease alone.
func TestElectShutdownOnStandby(t *testing.T) {
	fastElection(t)
	cs := kubefake.NewClientset()
	now := metav1.NewMicroTime(time.Now())
	if _, err := cs.CoordinationV1().Leases(ns).Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "pav-manager", Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("another"), LeaseDurationSeconds: ptr.To(int32(3600)),
			AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, shutdown := context.WithCancel(context.Background())
	done, _ := runElection(t, ctx, cs, func(context.Context) { t.Error("a manager on standby worked") })
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	shutdown()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after shutdown")
	}
	if d := time.Since(start); d > leaseDuration {
		t.Errorf("stopping took %v", d)
	}
	if h := holder(t, cs); h != "another" {
		t.Errorf("the Lease is held by %q, want another's still", h)
	}
}

// An API server outage longer than the renew deadline costs the Lease, not
// the process: the workers stop, the manager campaigns again with the same
// identity and, once the API server answers, takes the Lease back at once
// and works again; the process (its caches) lives on.
func TestElectSurvivesALostLease(t *testing.T) {
	fastElection(t)
	cs := kubefake.NewClientset()
	var down atomic.Bool
	cs.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, errors.New("dial tcp 10.0.0.1:443: connect: connection refused")
		}
		return false, nil, nil
	})
	ctx, shutdown := context.WithCancel(context.Background())
	defer shutdown()
	var mu sync.Mutex
	var terms []string // holder at each term's start, and "stopped" at each end
	began := make(chan struct{}, 4)
	done, err := runElection(t, ctx, cs, func(wctx context.Context) {
		mu.Lock()
		terms = append(terms, holder(t, cs))
		mu.Unlock()
		began <- struct{}{}
		<-wctx.Done()
		mu.Lock()
		terms = append(terms, "stopped")
		mu.Unlock()
	})
	<-began
	down.Store(true)
	time.Sleep(renewDeadline + time.Second) // the outage: the renewals fail past the deadline
	mu.Lock()
	stoppedInOutage := len(terms) == 2 && terms[1] == "stopped"
	mu.Unlock()
	if !stoppedInOutage {
		t.Errorf("the workers did not stop on the lost Lease: %q", terms)
	}
	back := time.Now()
	down.Store(false)
	select {
	case <-began:
	case <-time.After(5 * time.Second):
		t.Fatal("the manager did not lead again after the outage")
	}
	if d := time.Since(back); d > leaseDuration {
		t.Errorf("leading again took %v after the API server's return: it waited for its own Lease to expire", d)
	}
	shutdown()
	<-done
	if *err != nil {
		t.Errorf("Run: %v", *err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(terms) != 4 || terms[0] == "" || terms[2] != terms[0] || terms[3] != "stopped" {
		t.Errorf("terms %q: want two, of one identity, each stopped", terms)
	}
}

// The manager's /healthz is the election's check, which passes until the
// manager leads and then while it renews its Lease; without election it
// always passes.
func TestHealthz(t *testing.T) {
	_, check := elect(t.Context(), kubefake.NewClientset(), Options{Namespace: ns, LeaseName: "pav-manager"}, func(context.Context) {})
	for name, h := range map[string]http.Handler{"elected": check, "no election": nil} {
		rec := httptest.NewRecorder()
		healthServer(":0", nil, nil, h).Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Body.String(), "ok") {
			t.Errorf("%s: /healthz %d %q", name, rec.Code, rec.Body.String())
		}
	}
}

type versionAnswer struct{ err error }

func (v versionAnswer) ServerVersion(context.Context) (*version.Info, error) {
	return &version.Info{GitVersion: "v1.36.3"}, v.err
}

// /readyz: the informers synced and the API server answering, as the
// drivers' readiness: not ready during an outage, ready at its end.
func TestReadyz(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"API server answers", nil, http.StatusOK},
		{"API server down", errors.New("waiting for the API server: context deadline exceeded"), http.StatusServiceUnavailable},
	} {
		rec := httptest.NewRecorder()
		healthServer(":0", &Controller{}, &kube.APICheck{Client: versionAnswer{tc.err}}, nil).Handler.ServeHTTP(rec,
			httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if rec.Code != tc.want || (tc.err != nil && !strings.Contains(rec.Body.String(), "the Kubernetes API is not reachable")) {
			t.Errorf("%s: /readyz %d %q, want %d", tc.name, rec.Code, rec.Body.String(), tc.want)
		}
	}
}
