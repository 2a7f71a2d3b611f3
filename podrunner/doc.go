// Package podrunner is the one place where every pav phase (validation,
// creation, deletion, staging, unstaging) runs its pod: it builds the pod from
// the user's evaluated template, creates it under a deterministic name (or
// adopts the one an earlier attempt left), waits for its outcome through a pod
// informer, reads the files the pod left in /pav through a native "report"
// sidecar, and cleans up. See pav-spec.md §4 for the pod contract.
//
// # One pod per operation
//
// An Operation's (provisioner, phase, volume key) triple decides the pod name
// (PodName), so a retry, a concurrent call or a restarted driver always meets
// the same pod: creation returns AlreadyExists and the pod is adopted, but only
// if its labels and its AnnotationVolumeKey say it is this operation's
// (otherwise ErrForeignPod: PaV silently adopted pods across provisioners).
// An adopted pod that already finished gives its result, never a re-run; one
// being deleted before it finished is waited out, then replaced.
//
// # Waiting without polling
//
// A single informer per Runner (label selector on the provisioner, plus the
// node for node plugins) feeds event handlers that poke per-pod waiters; a
// waiter then re-reads the pod from the informer cache, which the informer
// updates before it calls handlers, so no transition is missed. The only
// timers are the pod timeout (counted from the pod's creationTimestamp, so a
// retry or a restart does not extend it) and the report wait below.
//
// # Reading /pav without node access
//
// Controller-side pods may run on any node, so their /pav is an emptyDir the
// driver cannot read. Every pod gets a native sidecar (an init container with
// restartPolicy Always, placed first so it outlives all user containers) that
// waits for SIGTERM and then writes handle/capacity/error as JSON to its
// termination message (Report). The kubelet stops sidecars only after all
// regular containers have exited, and its getPhase counts a running sidecar as
// running, so a Succeeded phase normally arrives together with the sidecar's
// termination. Not always: a failed regular init container fails the pod while
// the sidecar still runs, and the status may be published in between. So a
// finished pod whose sidecar is still running is waited for, bounded by
// Config.ReportWait (30 s); past that the outcome is used without the files,
// and logged. A finished pod whose sidecar never ran is not waited for.
//
// The kubelet keeps only the last 4096 bytes of a termination-log file, then
// cuts every message of the pod to 12 KiB / number of containers; BuildPod
// passes that budget to the sidecar (PAV_REPORT_MAX_BYTES) and Report fits its
// JSON in it by keeping the tail of error, and by dropping (never cutting) an
// oversized handle or capacity, which ParseReport then reports as an error.
//
// For KeepRunning (staging) pods, the sidecar's readiness probe runs
// `pav report --check-ready`, so "/pav/ready exists" becomes a container-ready
// watch event.
//
// # Cleaning up
//
// After an outcome (other than a KeepRunning pod becoming ready), Run deletes
// the pod (background propagation, UID precondition) and returns only once the
// informer has seen it gone, bounded by Config.DeleteWait (default: the pod's
// grace period + 60 s), even if the caller's context ended meanwhile: otherwise
// a retry could meet the stale finished pod. (If the bound passes, or the driver
// dies first, the retry adopts the finished pod and uses its result.) If the
// caller's context ends before an outcome, the pod is left alone, for the
// retry to adopt.
//
// # Metrics and logs
//
// pav_pod_operations_total{phase,result} and pav_pod_duration_seconds{phase}
// (RegisterMetrics, RegisterLegacyMetrics). Logs are structured (klog
// contextual logging) with pod, namespace and phase.
//
// # RBAC
//
// The driver needs pods: get, list, watch, create, delete (cluster-wide, or in
// the namespaces its templates use) and pods/log: get.
package podrunner
