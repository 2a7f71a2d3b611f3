package driver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/internal/kubeconfig"
)

// TestAPIRequestMetrics: a request made through the clients the driver builds
// is counted on the driver's /metrics, next to the CSI metrics, so the API
// requests per volume can be read from a running driver (make bench-e2e).
func TestAPIRequestMetrics(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"metrics-test"}}`))
	}))
	defer api.Close()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+api.URL+`"}}]
users: [{name: u, user: {}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	kube, _, err := NewClients(kc, kubeconfig.Rate{}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.Pods("metrics-test").Get(context.Background(), "p", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}

	var built atomic.Pointer[Services]
	mm := NewMetricsManager("demo")
	mm.RecordMetrics("/csi.v1.Controller/CreateVolume", nil, time.Second)
	mux := healthMux(mm, &built)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics = %d %s", rec.Code, rec.Body)
	}
	body := rec.Body.String()
	host := strings.TrimPrefix(api.URL, "http://")
	for _, want := range []string{
		`rest_client_requests_total{code="200",host="` + host + `",method="GET"} 1`,
		`rest_client_request_duration_seconds_count{host="` + host + `",verb="GET"} 1`,
		"csi_plugin_operations_seconds",
		"process_resident_memory_bytes",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if n := strings.Count(body, "# TYPE process_start_time_seconds "); n != 1 {
		t.Errorf("process_start_time_seconds declared %d times, want 1", n)
	}
}
