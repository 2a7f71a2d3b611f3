// Package standin holds what the test-only stand-ins of upstream images (test/hello-populator,
// test/volume-data-source-validator) share.
package standin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
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

// Clients are a stand-in's API clients and its event recorder.
type Clients struct {
	Kube     kubernetes.Interface
	Dynamic  dynamic.Interface
	Recorder record.EventRecorder
	// Shutdown stops the recorder's broadcaster (events still queued are sent first).
	Shutdown func()
}

// NewClients makes the clients of cfg and a recorder of events from component, as the
// upstream controllers do.
func NewClients(ctx context.Context, cfg *rest.Config, component string) (*Clients, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartStructuredLogging(0)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	return &Clients{Kube: kube, Dynamic: dyn, Shutdown: broadcaster.Shutdown,
		Recorder: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component})}, nil
}
