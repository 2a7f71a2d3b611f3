// Package standin holds what the test-only stand-ins of upstream images (test/hello-populator,
// test/volume-data-source-validator) share.
package standin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/kubeconfig"
)

// ServeHTTP serves /healthz, and the process's and client-go's metrics on metricsPath, on
// addr until ctx ends: the upstream images' --http-endpoint and --metrics-path.
func ServeHTTP(ctx context.Context, addr, metricsPath string) {
	mux := http.NewServeMux()
	mux.Handle(metricsPath, metrics.HandlerFor(kubeconfig.Gatherer(), metrics.HandlerOpts{ErrorHandling: metrics.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		klog.ErrorS(err, "HTTP endpoint failed", "address", addr)
	}
}
