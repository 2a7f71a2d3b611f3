package podrunner

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// Result label values of pav_pod_operations_total.
const (
	ResultSuccess       = "success"       // the pod completed
	ResultRunning       = "running"       // a KeepRunning pod signalled ready
	ResultFailure       = "failure"       // the pod failed
	ResultTimeout       = "timeout"       // the pod outlived PodTimeout
	ResultUnschedulable = "unschedulable" // the pod could not be scheduled
	ResultImageError    = "image_error"   // an image could not be pulled or a container not created
	ResultCanceled      = "canceled"      // the caller's context ended first (the pod is left running)
	ResultError         = "error"         // anything else (API errors, refused adoption, ...)
)

var (
	operationsTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Name:           "pav_pod_operations_total",
		Help:           "Pod operations run (or adopted) by pav, by phase and result.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"phase", "result"})

	podDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Name: "pav_pod_duration_seconds",
		Help: "Time from a pav pod's creation to its outcome (completion, failure or readiness), by phase.",
		// 0.5 s .. ~2.3 h: pods range from quick scripts to long data copies.
		Buckets:        metrics.ExponentialBuckets(0.5, 2, 15),
		StabilityLevel: metrics.ALPHA,
	}, []string{"phase"})

	legacyOnce sync.Once
)

// RegisterMetrics registers the pod runner's metrics in r. Metrics are
// package-wide (all Runners of a process share them) and record nothing until
// registered somewhere.
func RegisterMetrics(r metrics.KubeRegistry) {
	r.MustRegister(operationsTotal, podDuration)
}

// RegisterLegacyMetrics registers the metrics in the component-base legacy
// registry (what `legacyregistry.Handler()` serves); safe to call repeatedly.
func RegisterLegacyMetrics() {
	legacyOnce.Do(func() { legacyregistry.MustRegister(operationsTotal, podDuration) })
}
