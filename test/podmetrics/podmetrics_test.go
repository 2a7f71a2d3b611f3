package podmetrics

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// A pod whose IP answers is read directly, without the API server.
func TestScrapeReadsThePodDirectly(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("up 1\n"))
	}))
	defer srv.Close()
	host, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset()
	p := &corev1.Pod{Status: corev1.PodStatus{PodIP: host}}
	got, err := Scrape(context.Background(), client, p, port)
	if err != nil || got != "up 1\n" {
		t.Fatalf("Scrape: %q, %v", got, err)
	}
	if n := len(client.Actions()); n != 0 {
		t.Errorf("%d API requests, want none", n)
	}
}
