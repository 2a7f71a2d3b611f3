package manager

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestMetricsEndpoint: the manager's /metrics counts its API requests
// (client-go's request metrics) and reports its memory.
func TestMetricsEndpoint(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"pav"}}`))
	}))
	defer api.Close()
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Namespaces().Get(context.Background(), "pav", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	healthServer(":0", nil, nil, nil).Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	host := strings.TrimPrefix(api.URL, "http://")
	for _, want := range []string{`rest_client_requests_total{code="200",host="` + host + `",method="GET"} 1`, "process_resident_memory_bytes"} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics (%d) lacks %s", rec.Code, want)
		}
	}
}
