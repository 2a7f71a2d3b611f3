package manager

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// electCase is the variable that makes this test binary, run again, one
// case of TestElect.
const electCase = "PAV_TEST_ELECT"

// TestElect: on shutdown a leading manager's workers stop before it releases
// its Lease; a manager that is not leading stops at once. csi-lib-utils exits
// the process when the election ends (code 1), so each case runs in a child
// process, this test binary run again, which prints what it sees.
func TestElect(t *testing.T) {
	if c := os.Getenv(electCase); c != "" {
		electChild(c)
		return
	}
	for _, tc := range []struct {
		name, want string
	}{
		{"leading", "leading\nworkers stopped, Lease held: true\nreleased\n"},
		{"standby", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestElect$")
			cmd.Env = append(os.Environ(), electCase+"="+tc.name)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			start := time.Now()
			out, err := cmd.Output()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 1 {
				t.Errorf("the child ended with %v, want exit code 1 (the library's)\n%s", err, stderr.String())
			}
			if string(out) != tc.want {
				t.Errorf("the child printed %q, want %q\n%s", out, tc.want, stderr.String())
			}
			// Stopping does not wait for a Lease to expire.
			if d := time.Since(start); d > leaseDuration {
				t.Errorf("the child took %v", d)
			}
		})
	}
}

// electChild is one case of TestElect; it does not return.
func electChild(c string) {
	cs := kubefake.NewClientset()
	lease := func() *coordinationv1.Lease {
		l, err := cs.CoordinationV1().Leases(ns).Get(context.Background(), "pav-manager", metav1.GetOptions{})
		if err != nil {
			panic(err)
		}
		return l
	}
	if c == "standby" {
		now := metav1.NewMicroTime(time.Now())
		if _, err := cs.CoordinationV1().Leases(ns).Create(context.Background(), &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: "pav-manager", Namespace: ns},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("another"), LeaseDurationSeconds: ptr.To(int32(3600)),
				AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{}); err != nil {
			panic(err)
		}
	}
	cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease); ptr.Deref(l.Spec.HolderIdentity, "") == "" {
			fmt.Println("released")
		}
		return false, nil, nil
	})
	ctx, shutdown := context.WithCancel(context.Background())
	le, _ := elect(ctx, cs, Options{Namespace: ns, LeaseName: "pav-manager"}, func(ctx context.Context) {
		fmt.Println("leading")
		shutdown()
		<-ctx.Done()
		time.Sleep(300 * time.Millisecond) // a reconcile ending
		held := ptr.Deref(lease().Spec.HolderIdentity, "")
		fmt.Printf("workers stopped, Lease held: %v\n", held != "" && held != "another")
	})
	if c == "standby" {
		time.AfterFunc(300*time.Millisecond, shutdown)
	}
	fmt.Println("Run returned", le.Run())
	os.Exit(0)
}

// The manager's /healthz is the election's check, which passes until the
// manager leads and then while it renews its Lease; without election it
// always passes.
func TestHealthz(t *testing.T) {
	_, check := elect(t.Context(), kubefake.NewClientset(), Options{Namespace: ns, LeaseName: "pav-manager"}, func(context.Context) {})
	for name, h := range map[string]http.Handler{"elected": check, "no election": nil} {
		rec := httptest.NewRecorder()
		healthServer(":0", nil, h).Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Body.String(), "ok") {
			t.Errorf("%s: /healthz %d %q", name, rec.Code, rec.Body.String())
		}
	}
}
