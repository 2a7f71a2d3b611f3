// Package podrunner is the one place where every pav phase (validation,
// creation, deletion, staging, unstaging) runs its pod: it builds the pod from
// the user's evaluated template, creates it under a deterministic name (or
// adopts the one an earlier attempt left), waits for its outcome through a pod
// informer, reads the files the pod left in /pav (on the node, or through
// pav-report's termination message), and removes it when the caller has
// recorded the outcome (Delete).
// See pav-spec.md §4 for the pod contract.
//
// # One pod per operation, and only pav's own
//
// An Operation's (provisioner, phase, volume key) triple decides the pod name
// (PodName), so a retry, a concurrent call or a restarted driver always meets
// the same pod. Names are predictable, so anyone who may create pods in the
// namespace could pre-create one; labels and annotations prove nothing. So
// every pod carries AnnotationToken = Operation.Token, a random value the
// caller recorded where only pav can write before asking for the pod, and
// Operation.Created hands the caller the pod's UID to record as soon as the pod
// exists. An existing pod of that name is adopted only if it has the recorded
// UID, or, while no UID is recorded yet, the recorded token (a token can be
// read by whoever can read the pod; a UID cannot be chosen). Anything else is
// ErrForeignPod: never adopted, never deleted, and a Warning event
// (ReasonForeignPod) on the pod says so. An adopted pod that already finished
// gives its result, never a re-run; one of ours that is deleted before it
// finished has an unknown outcome (ErrPodDeleted, once it is gone): the
// caller retries with a new token.
//
// Pods go to the template's metadata.namespace, else Config.DefaultNamespace
// (the driver's own namespace, which tenants cannot use), else DefaultNamespace.
// A template that chooses a tenant's namespace (PaV's encryption example uses
// the PVC's) makes its pods visible to, and deletable and exec-able by, that
// namespace's users: pav then relies on the recorded UID and token to never
// adopt a pod they made, and whatever such a pod reports through /pav is only
// as trustworthy as the namespace.
//
// Such a namespace may be deleted under its volumes. A pod the API server
// refuses because its namespace is being deleted (403 with cause
// NamespaceTerminating) or does not exist (404 of the namespace) is a
// *NamespaceGoneError (ErrNamespaceGone), told from that answer alone; a pod
// of the operation already there (a namespace being deleted refuses even the
// creation of an existing pod) is adopted as any other. The caller decides
// what the phase then means (controllerserver's nsgone.go).
//
// # Waiting without polling
//
// A single informer per Runner (label selector on the provisioner, plus the
// node for node plugins) feeds event handlers that poke per-pod waiters; a
// waiter then re-reads the pod from the informer cache, which the informer
// updates before it calls handlers, so no transition is missed. Callers may
// add their own handlers (OnPodEvent) and read the cache (Cached) to follow a
// pod between operations without a second watch. The only
// timers are the pod timeout (counted from the pod's creationTimestamp, so a
// retry or a restart does not extend it), the report wait below, and the
// grace of an unschedulable pod: a pod the scheduler cannot place yet (the
// nodes are full until other pods end) waits in its queue like any pod, and
// fails its operation with the scheduler's message only once it has been
// unschedulable for Config.UnschedulableGrace (2 minutes), counted from its
// PodScheduled condition.
//
// # Reading /pav without node access
//
// Node pods (staging, unstaging, node expansion: Operation.HostPath) have their
// /pav in the node plugin's own directory: it reads the files itself once the
// pod has finished, and watches for /pav/ready with inotify, so these pods get
// no sidecar (hostdir.go says what that saves, and how the files are read
// safely). A pod its caller discards once it ends (Operation.EndAtExit:
// staging) has its command wrapped by pav-report, which writes the command's
// exit code to /pav/.pav-exit as it ends: a success is seen through inotify,
// before the kubelet publishes the pod's end.
//
// Controller-side pods may run on any node, so their /pav is an emptyDir the
// driver cannot read: pav-report (cmd/pav-report) carries its files out as a
// termination message, which the API publishes with the container's end.
//
// With Config.Report = ReportExec, a pod with one container whose command the
// template states (the common shape) has that command wrapped: an image
// volume of the report image (ReportVolume) is mounted read-only at ReportDir,
// and the container runs `pav-report --exec -- COMMAND` (report.Exec), which
// runs the command as its child and writes the report to the container's own
// termination message when it ends, with its exit code. The pod is then a bare
// pod plus one mount, and costs the kubelet nothing more. Its success is taken
// as soon as the container's end is published with that message: the kubelet
// publishes the terminal phase only after it has stopped the pod's sandbox,
// about a second later (a failure still waits for it: it says why). Sooner
// still: on success pav-report also copies the report to /pav/.pav-ended, which
// the node plugin of the pod's node sees through inotify and puts on the pod as
// AnnotationEnded (internal/endrelay); the container's end itself is published
// only at the kubelet's next relist (up to 1 s). The annotation is taken for the
// pod's end only on pods in the driver's own namespace (Config.DefaultNamespace),
// where tenants cannot write pods, and only if it is a readable report; such a
// pod is then deleted with grace 0, as one whose containers have all ended
// (a pod that mounts a claim excepted). Which container
// reports is read from the pod's spec (Wrapped), so a pod adopted from a
// driver in the other mode is read right. The image's entrypoint is known only
// on the node, so a template without a command, or with more than one
// container, or with a sidecar of its own, or a KeepRunning pod, gets the
// sidecar below. An API server that refuses the image volume (Kubernetes
// before 1.35, or the ImageVolume gate off), or a node that cannot start the
// wrapped container (StartError: a runtime without image volumes, or one that
// mounts them noexec), makes the Runner give its next pods the sidecar; a
// refused pod is created again at once, a failed start fails that one pod with
// the runtime's message.
//
// Otherwise the pod gets a native sidecar (an init container with
// restartPolicy Always, placed first so it outlives all user containers) that
// waits for SIGTERM and then writes handle/capacity/error as JSON to its
// termination message (internal/report's Run). The kubelet stops sidecars only after all
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
// passes that budget to the sidecar (PAV_REPORT_MAX_BYTES) and report.Message fits its
// JSON in it by keeping the tail of error, and by dropping (never cutting) an
// oversized handle or capacity, which report.Parse then reports as an error.
//
// A file too large for any termination message (a snapshotMetadata pod's
// /pav/blocks, Operation.LogFiles) goes through the reporting container's log
// instead: pav-report, once the command has ended, prints it between two
// marker lines carrying a nonce it draws then, and the report carries the
// nonce, size and SHA-256 of what it printed. Run reads the log (pods/log),
// takes exactly those bytes and checks them (report.ReadLogFile); a copy the
// log does not hold (the kubelet rotated it) fails the pod with
// ReasonInvalidReport. Such a file is bounded by report.MaxLogFile (4 MiB).
//
// For KeepRunning pods on an emptyDir, the sidecar's readiness probe runs
// `pav-report --check-ready`, so "/pav/ready exists" becomes a container-ready
// watch event.
//
// # Cleaning up
//
// Run never deletes the pod. The caller first records the outcome (handle,
// capacity, failure) and then removes the pod with Delete, which checks the
// same identity, never deletes a pod pav did not create, and waits until the
// informer has seen the pod gone. A pod whose containers have all ended while
// its phase is not yet terminal is deleted with grace 0, so that the API
// server removes it at once rather than wait for the kubelet to stop a pod
// that runs nothing (it does so for a terminal pod anyway); not one that
// mounts a claim, which must stay in use while the kubelet unmounts it. So a driver that dies between a pod's end
// and the record finds the finished pod again and reads its result, instead
// of running the phase twice. If the caller's context ends before an outcome,
// the pod is left alone, for the retry to adopt. Discard is Delete without the
// wait, for a pod whose command has ended but whose end the kubelet may not
// have published yet (deleting it then takes the kubelet a graceful
// deletion's round trip): the caller keeps its identity until the informer no
// longer has it.
//
// # Metrics and logs
//
// pav_pod_operations_total{phase,result} and
// pav_phase_duration_seconds{provisioner,phase,outcome}, outcome success,
// failure or timeout (RegisterMetrics, RegisterLegacyMetrics). Logs are
// structured (klog contextual logging) with pod, namespace and phase.
//
// # RBAC
//
// The driver needs pods: get, list, watch, create, delete (cluster-wide, or in
// the namespaces its templates use), pods/log: get, and events: create, patch
// (for Config.Recorder).
package podrunner
