package managerapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/pods-as-volumes/pav/internal/kube/managerapi"
)

// apiServer answers every request with an object named x and records
// "METHOD path?query content-type".
type apiServer struct {
	mu   sync.Mutex
	seen []string
}

func (a *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	line := r.Method + " " + r.URL.Path
	if r.URL.RawQuery != "" {
		line += "?" + r.URL.RawQuery
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && r.Method != http.MethodGet {
		line += " " + ct
	}
	a.mu.Lock()
	a.seen = append(a.seen, line)
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"metadata":{"name":"x","resourceVersion":"1"}}`))
}

// Every call the manager makes goes to the path, with the method and the
// body type, that client-go's typed clients use.
func TestRequests(t *testing.T) {
	api := &apiServer{}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	c, err := managerapi.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	apply := metav1.PatchOptions{FieldManager: "pav-manager", Force: ptr.To(true)}
	const applyType = "application/apply-patch+yaml"
	for _, tc := range []struct {
		call func() error
		want string
	}{
		{func() error {
			_, err := c.CSIDrivers().Patch(ctx, "x", types.ApplyPatchType, []byte(`{}`), apply)
			return err
		}, "PATCH /apis/storage.k8s.io/v1/csidrivers/x?fieldManager=pav-manager&force=true " + applyType},
		{func() error {
			_, err := c.StatefulSets("pav").Patch(ctx, "x", types.ApplyPatchType, []byte(`{}`), apply)
			return err
		}, "PATCH /apis/apps/v1/namespaces/pav/statefulsets/x?fieldManager=pav-manager&force=true " + applyType},
		{func() error {
			_, err := c.DaemonSets("pav").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
			return err
		}, "GET /apis/apps/v1/namespaces/pav/daemonsets?resourceVersion=0"},
		{func() error { return c.DaemonSets("pav").Delete(ctx, "x", metav1.DeleteOptions{}) },
			"DELETE /apis/apps/v1/namespaces/pav/daemonsets/x application/vnd.kubernetes.protobuf"},
		{func() error {
			_, err := c.Services("pav").Patch(ctx, "x", types.ApplyPatchType, []byte(`{}`), apply)
			return err
		}, "PATCH /api/v1/namespaces/pav/services/x?fieldManager=pav-manager&force=true " + applyType},
		{func() error {
			_, err := c.Secrets("pav").List(ctx, metav1.ListOptions{LabelSelector: "a=b"})
			return err
		}, "GET /api/v1/namespaces/pav/secrets?labelSelector=a%3Db"},
		{func() error { return c.Secrets("pav").Delete(ctx, "x", metav1.DeleteOptions{}) },
			"DELETE /api/v1/namespaces/pav/secrets/x application/vnd.kubernetes.protobuf"},
	} {
		api.mu.Lock()
		api.seen = nil
		api.mu.Unlock()
		if err := tc.call(); err != nil {
			t.Errorf("%s: %v", tc.want, err)
			continue
		}
		api.mu.Lock()
		if !slices.Equal(api.seen, []string{tc.want}) {
			t.Errorf("requests %q, want %q", api.seen, tc.want)
		}
		api.mu.Unlock()
	}
}
