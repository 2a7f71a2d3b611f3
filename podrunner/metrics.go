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

// Outcome label values of pav_phase_duration_seconds: how a phase's pod
// ended. A small bounded set, coarser than the results above: a chart of
// phase durations wants the usual case apart from failures, and timeouts
// apart from both, since a timeout's duration is the pod timeout itself.
// Operations that ended with ResultCanceled or ResultError are not observed:
// their pod had no outcome yet (a canceled caller's retry adopts the pod and
// observes it, from its creation, once it has one) or its state is unknown.
const (
	OutcomeSuccess = "success" // ResultSuccess, ResultRunning: the phase's work is done
	OutcomeFailure = "failure" // ResultFailure, ResultUnschedulable, ResultImageError
	OutcomeTimeout = "timeout" // ResultTimeout: the pod outlived PodTimeout
)

// outcomes is the outcome of each observed result.
var outcomes = map[string]string{
	ResultSuccess: OutcomeSuccess, ResultRunning: OutcomeSuccess,
	ResultFailure: OutcomeFailure, ResultUnschedulable: OutcomeFailure, ResultImageError: OutcomeFailure,
	ResultTimeout: OutcomeTimeout,
}

var (
	operationsTotal = metrics.NewCounterVec(&metrics.CounterOpts{
		Name:           "pav_pod_operations_total",
		Help:           "Pod operations run (or adopted) by pav, by phase and result.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"phase", "result"})

	// phaseDuration replaced pav_pod_duration_seconds{phase}: the same
	// observations but for canceled calls and API errors (which it counted
	// too, and a retry adopting the pod counted again), with buckets up to
	// 10 min instead of 2.3 h; `sum without (provisioner, outcome)` charts
	// what it did. The phase is the PavProvisioner's (v1alpha1.Phase:
	// validation, creation, deletion, staging, unstaging, expansion,
	// nodeexpansion, snapshotcreation, snapshotdeletion).
	phaseDuration = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Name: "pav_phase_duration_seconds",
		Help: "Time from a pav pod's creation to its outcome (completion or readiness, failure, timeout), by provisioner, phase and outcome.",
		// 0.5 s .. 10 min: a pod starts in one to a few seconds, hence
		// the finer steps there; a script may take minutes. A longer
		// data copy falls in +Inf only (_sum still adds it).
		Buckets:        []float64{0.5, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 30, 60, 120, 300, 600},
		StabilityLevel: metrics.ALPHA,
	}, []string{"provisioner", "phase", "outcome"})

	legacyOnce sync.Once
)

// RegisterMetrics registers the pod runner's metrics in r. Metrics are
// package-wide (all Runners of a process share them) and record nothing until
// registered somewhere.
func RegisterMetrics(r metrics.KubeRegistry) {
	r.MustRegister(operationsTotal, phaseDuration)
}

// RegisterLegacyMetrics registers the metrics in the component-base legacy
// registry (what `legacyregistry.Handler()` serves); safe to call repeatedly.
func RegisterLegacyMetrics() {
	legacyOnce.Do(func() { legacyregistry.MustRegister(operationsTotal, phaseDuration) })
}
