package podrunner

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/pods-as-volumes/pav/internal/report"
)

// PodFailure reasons set by pav itself (others come from the pod or its containers).
const (
	ReasonTimeout       = "Timeout"       // the pod outlived Config.PodTimeout
	ReasonUnschedulable = "Unschedulable" // PodScheduled=False, reason Unschedulable
	ReasonInvalidReport = "InvalidReport" // the pod succeeded but its report is unusable
)

// imageErrorReasons are the container waiting reasons that fail an operation at
// once: the kubelet would retry them forever (or until PodTimeout), while they
// almost always need a fix to the template or the cluster.
var imageErrorReasons = map[string]bool{
	"ErrImagePull":               true,
	"ImagePullBackOff":           true,
	"ErrImageNeverPull":          true,
	"InvalidImageName":           true,
	"CreateContainerConfigError": true,
	"CreateContainerError":       true,
}

// Result is the outcome of a successful Run.
type Result struct {
	Pod       string
	Namespace string
	UID       types.UID
	// Files is what the pod left in /pav: "handle", "capacity", "topology",
	// "error" and the Operation's LogFiles (only those present).
	Files map[string]string
	// Running: a KeepRunning operation whose pod signalled ready and is still running.
	Running bool
}

// PodFailure is the error when the pod failed, could not be scheduled, could not
// pull its image, or outlived the timeout. Error() reads like
//
//	creation pod default/pav-hello-creation-3f2a… failed (phase Failed, reason Error): container "main" exited with code 3; /pav/error: disk quota exceeded
//
// or ends with "; log tail: <last lines>" when there is no /pav/error.
type PodFailure struct {
	Phase, Pod, Namespace string
	UID                   types.UID
	PodPhase              corev1.PodPhase
	Reason, Message       string
	ExitCodes             map[string]int32 // container → exit code (failed containers only)
	ErrorFile             string           // /pav/error contents
	LogTail               string
}

func (f *PodFailure) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s pod %s/%s failed (phase %s, reason %s)", f.Phase, f.Namespace, f.Pod, f.PodPhase, f.Reason)
	var parts []string
	if m := strings.TrimSpace(f.Message); m != "" {
		parts = append(parts, m)
	}
	for _, c := range slices.Sorted(maps.Keys(f.ExitCodes)) {
		parts = append(parts, fmt.Sprintf("container %q exited with code %d", c, f.ExitCodes[c]))
	}
	if e := strings.TrimSpace(f.ErrorFile); e != "" {
		parts = append(parts, "/pav/error: "+e)
	} else if l := strings.TrimSpace(f.LogTail); l != "" {
		parts = append(parts, "log tail: "+l)
	}
	if len(parts) > 0 {
		b.WriteString(": ")
		b.WriteString(strings.Join(parts, "; "))
	}
	return b.String()
}

// IsPodFailure returns the PodFailure in err's chain, if any.
func IsPodFailure(err error) (*PodFailure, bool) {
	var f *PodFailure
	ok := errors.As(err, &f)
	return f, ok
}

// verdict is what evaluate makes of one observation of a pod.
type verdict struct {
	done    bool
	result  *Result
	failure *PodFailure
	// awaitingReport: the pod is finished but its report sidecar has not yet been
	// recorded as terminated; wait (bounded) for it.
	awaitingReport bool
	// reportProblem: the report was missing or partly unusable (logged).
	reportProblem error
	// execUnsupported: the node could not start pav-report in the container
	// it wraps (ReportExec); the runner then builds pods with the sidecar.
	execUnsupported bool
	// recheckAt: the pod is unschedulable, which fails the operation once it
	// has lasted the grace: look again then.
	recheckAt time.Time
}

// evaluate decides what one observed state of an operation's pod means. It is a
// pure function of the pod (a shared informer object: it must not be mutated),
// of two flags set by timers: reportExpired (stop waiting for the report of a
// finished pod) and timedOut (the pod outlived timeout), and of the time now
// against grace, how long a pod the scheduler places may stay unschedulable
// (negative: not at all).
//
// trustEnded says whether pod's AnnotationEnded may be taken for its end: only
// in the driver's own namespace, where no tenant can write a pod.
func evaluate(op *Operation, pod *corev1.Pod, reportExpired, timedOut, trustEnded bool, timeout, grace time.Duration, now time.Time) verdict {
	sidecar := containerStatus(pod.Status.InitContainerStatuses, ReportContainer)
	wrappedName, isWrapped := Wrapped(pod)

	if op.HostPath == "" && len(op.LogFiles) == 0 && !Finished(pod) {
		// The node plugin of the pod's node saw pav-report's copy of a
		// successful report (/pav/.pav-ended) and relayed it: a relist (up
		// to 1 s) before the kubelet publishes the container's end.
		if files, ok := relayedEnd(pod, trustEnded); ok {
			return finishedVerdict(op, pod, true, files, nil)
		}
	}

	if op.HostPath != "" && op.EndAtExit && isWrapped && !Finished(pod) {
		// pav-report wrote the command's exit code on the host as it ended
		// (report.ExecNode): a success needs no wait for the kubelet's
		// relist. A failure waits for the pod's status, which says why.
		if code, ok := report.ReadExit(op.HostPath); ok && code == 0 {
			files, perr := report.Read(op.HostPath, report.MaxMessage)
			return finishedVerdict(op, pod, true, files, perr)
		}
	}

	if op.HostPath == "" && isWrapped && !Finished(pod) && endedInFact(pod) {
		// The kubelet publishes a pod's terminal phase only once it has
		// stopped the pod's sandbox, a relist or so after its containers
		// ended (about a second, measured); the wrapped container's end,
		// with pav-report's report, is published first. Every container
		// of a restartPolicy Never pod has ended: nothing can run again,
		// so a success is taken now. A failure waits for the pod's
		// status, which says why.
		if s := containerStatus(pod.Status.ContainerStatuses, wrappedName); s.State.Terminated.ExitCode == 0 && wrapperFailedToStart(s) == nil {
			files, perr := report.Parse(s.State.Terminated.Message)
			return finishedVerdict(op, pod, true, files, perr)
		}
	}

	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		succeeded := pod.Status.Phase == corev1.PodSucceeded
		if op.HostPath != "" {
			// A node pod: no sidecar, the node plugin reads /pav itself.
			files, perr := report.Read(op.HostPath, report.MaxMessage)
			return finishedVerdict(op, pod, succeeded, files, perr)
		}
		msg, have := "", false
		if isWrapped {
			// pav-report wrote the report as it ended, with the container.
			s := containerStatus(pod.Status.ContainerStatuses, wrappedName)
			if t := wrapperFailedToStart(s); t != nil {
				f := podFailed(op, pod)
				f.Reason = t.Reason
				f.Message = fmt.Sprintf("pav-report (from image volume %s of the report image) could not start in container %q: %s; "+
					"pav gives the next pods the report sidecar instead", ReportVolume, wrappedName, strings.TrimSpace(t.Message))
				return verdict{done: true, failure: f, execUnsupported: true}
			}
			if s != nil && s.State.Terminated != nil {
				msg, have = s.State.Terminated.Message, true
			}
		} else if sidecar != nil && sidecar.State.Terminated != nil {
			msg, have = sidecar.State.Terminated.Message, true
		}
		// Wait for the report only if it can still come: the sidecar is running
		// and about to be stopped. (getPhase in the kubelet counts a running
		// sidecar as running, so a Succeeded phase usually comes with the
		// sidecar's termination; but a failed init container fails the pod while
		// the sidecar still runs, and a pod rejected at admission has no running
		// sidecar at all: no need to wait for it.)
		if !have && !reportExpired && sidecar != nil && sidecar.State.Running != nil {
			return verdict{awaitingReport: true}
		}
		var files map[string]string
		var perr error
		if have {
			files, perr = report.Parse(msg)
		} else {
			files, perr = map[string]string{}, report.ErrNoReport
		}
		return finishedVerdict(op, pod, succeeded, files, perr)
	}

	if op.KeepRunning && pod.Status.Phase == corev1.PodRunning && signalledReady(op, sidecar) && allRunning(pod) {
		return verdict{done: true, result: &Result{
			Pod: pod.Name, Namespace: pod.Namespace, Files: map[string]string{}, Running: true,
		}}
	}

	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			// Counted from the condition, so that a retry or a restarted
			// driver does not extend it. A node pod names its node: nothing
			// will place it elsewhere.
			since := c.LastTransitionTime.Time
			if since.IsZero() {
				since = pod.CreationTimestamp.Time
			}
			if until := since.Add(grace); op.NodeName == "" && grace > 0 && !timedOut && now.Before(until) {
				return verdict{recheckAt: until}
			}
			f := newFailure(op, pod)
			f.Reason, f.Message = ReasonUnschedulable, c.Message
			return verdict{done: true, failure: f}
		}
	}

	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range list {
			if w := s.State.Waiting; w != nil && imageErrorReasons[w.Reason] {
				f := newFailure(op, pod)
				f.Reason = w.Reason
				f.Message = fmt.Sprintf("container %q (image %s): %s", s.Name, s.Image, w.Message)
				// A runtime without image volumes cannot create the
				// wrapped container: the sidecar may do better.
				unsupported := isWrapped && s.Name == wrappedName && w.Reason == "CreateContainerError"
				return verdict{done: true, failure: f, execUnsupported: unsupported}
			}
		}
	}

	// Our own sidecar failing to run means a broken report image (no pav
	// binary, wrong architecture): the user's containers would never start, since
	// a sidecar must start before the init containers after it. Fail now rather
	// than at PodTimeout (or never, without one).
	if sidecar != nil && sidecar.State.Waiting != nil &&
		(sidecar.State.Waiting.Reason == "CrashLoopBackOff" || sidecar.State.Waiting.Reason == "RunContainerError") {
		f := newFailure(op, pod)
		f.Reason = sidecar.State.Waiting.Reason
		f.Message = fmt.Sprintf("the pav report sidecar (image %s) cannot run: %s", sidecar.Image, sidecar.State.Waiting.Message)
		if t := sidecar.LastTerminationState.Terminated; t != nil {
			f.Message += fmt.Sprintf(" (last exit code %d: %s)", t.ExitCode, strings.TrimSpace(t.Message))
		}
		return verdict{done: true, failure: f}
	}

	if timedOut {
		f := newFailure(op, pod)
		f.Reason = ReasonTimeout
		if op.KeepRunning {
			f.Message = fmt.Sprintf("the pod neither finished nor became ready within %s of its creation", timeout)
		} else {
			f.Message = fmt.Sprintf("the pod did not finish within %s of its creation", timeout)
		}
		return verdict{done: true, failure: f}
	}
	return verdict{}
}

// finishedVerdict is the outcome of a finished pod, given whether it
// succeeded, the files it left in /pav and the problem reading them, if any.
func finishedVerdict(op *Operation, pod *corev1.Pod, succeeded bool, files map[string]string, perr error) verdict {
	if succeeded {
		if perr != nil && !errors.Is(perr, report.ErrNoReport) {
			// Succeeding with a handle or capacity we could not read would
			// silently fall back to the template's values: fail instead.
			f := newFailure(op, pod)
			f.Reason, f.Message = ReasonInvalidReport, perr.Error()
			return verdict{done: true, failure: f}
		}
		return verdict{done: true, reportProblem: perr, result: &Result{
			Pod: pod.Name, Namespace: pod.Namespace, Files: files,
		}}
	}
	f := podFailed(op, pod)
	f.ErrorFile = files[report.FileError]
	return verdict{done: true, failure: f, reportProblem: perr}
}

// relayedEnd is the report the node plugin relayed for pod (AnnotationEnded),
// if it may be trusted (see evaluate) and can be read; one that cannot is
// ignored, for the pod's status to tell.
func relayedEnd(pod *corev1.Pod, trustEnded bool) (map[string]string, bool) {
	msg, ok := pod.Annotations[AnnotationEnded]
	if !ok || !trustEnded {
		return nil, false
	}
	if _, _, relayable := EndedFile(pod); !relayable {
		return nil, false
	}
	files, err := report.Parse(msg)
	return files, err == nil
}

// wrapperFailedToStart is the termination of a wrapped container whose first
// process, pav-report, never ran (the runtime's StartError: an image volume
// mounted noexec, say), if it is one. A command pav-report could not start is
// not one: pav-report then exits 127 or 126 itself.
func wrapperFailedToStart(s *corev1.ContainerStatus) *corev1.ContainerStateTerminated {
	if s == nil || s.State.Terminated == nil || s.State.Terminated.Reason != "StartError" {
		return nil
	}
	return s.State.Terminated
}

// signalledReady: a KeepRunning pod has created /pav/ready. A node pod's /pav
// is read on the host; otherwise the report sidecar's readiness probe tells.
func signalledReady(op *Operation, sidecar *corev1.ContainerStatus) bool {
	if op.HostPath != "" {
		return hostReady(op.HostPath)
	}
	return sidecar != nil && sidecar.Ready && sidecar.State.Running != nil
}

func newFailure(op *Operation, pod *corev1.Pod) *PodFailure {
	return &PodFailure{
		Phase:     string(op.Phase),
		Pod:       pod.Name,
		Namespace: pod.Namespace,
		PodPhase:  pod.Status.Phase,
		ExitCodes: map[string]int32{},
	}
}

// podFailed describes a pod in phase Failed: the pod's own reason (Evicted,
// DeadlineExceeded, NodeAffinity, ...) or else the first failed container's
// (Error, OOMKilled, ...), and the exit codes of the containers that failed.
// Sidecars (ours included) are left out: their exit codes do not decide the
// phase, and when stopped they usually exit with 143.
func podFailed(op *Operation, pod *corev1.Pod) *PodFailure {
	f := newFailure(op, pod)
	f.Reason, f.Message = pod.Status.Reason, pod.Status.Message
	for _, c := range failedContainers(pod) {
		f.ExitCodes[c.Name] = c.State.Terminated.ExitCode
		if f.Reason == "" {
			f.Reason = c.State.Terminated.Reason
		}
	}
	if f.Reason == "" {
		f.Reason = "Unknown"
	}
	return f
}

// failedContainers lists the statuses of the non-sidecar containers that
// terminated with a non-zero code, in spec order (init containers first).
func failedContainers(pod *corev1.Pod) []corev1.ContainerStatus {
	var out []corev1.ContainerStatus
	add := func(containers []corev1.Container, statuses []corev1.ContainerStatus) {
		for _, c := range containers {
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				continue
			}
			if s := containerStatus(statuses, c.Name); s != nil && s.State.Terminated != nil && s.State.Terminated.ExitCode != 0 {
				out = append(out, *s)
			}
		}
	}
	add(pod.Spec.InitContainers, pod.Status.InitContainerStatuses)
	add(pod.Spec.Containers, pod.Status.ContainerStatuses)
	return out
}

// logContainer is the container whose log tail explains a failure: the first
// failed one, or (for a timeout or other failure without exit codes) the first
// regular container that ever started.
func logContainer(pod *corev1.Pod) string {
	if failed := failedContainers(pod); len(failed) > 0 {
		return failed[0].Name
	}
	for _, c := range pod.Spec.Containers {
		if s := containerStatus(pod.Status.ContainerStatuses, c.Name); s != nil &&
			(s.State.Running != nil || s.State.Terminated != nil) {
			return c.Name
		}
	}
	return ""
}

// allRunning: every regular container is running (so every regular init
// container has completed).
func allRunning(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.Containers {
		s := containerStatus(pod.Status.ContainerStatuses, c.Name)
		if s == nil || s.State.Running == nil {
			return false
		}
	}
	return len(pod.Spec.Containers) > 0
}

// endedInFact: every container of the pod (init containers, sidecars and
// regular ones) has a terminated state and none can be restarted
// (restartPolicy Never, no sidecar), whatever phase the kubelet has
// published yet. Nothing of the pod runs any more; only its sandbox and
// volumes are left for the kubelet to tear down.
func endedInFact(pod *corev1.Pod) bool {
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || len(pod.Spec.Containers) == 0 {
		return false
	}
	ended := func(containers []corev1.Container, statuses []corev1.ContainerStatus) bool {
		for _, c := range containers {
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				return false // a sidecar: stopped only with the pod
			}
			if s := containerStatus(statuses, c.Name); s == nil || s.State.Terminated == nil {
				return false
			}
		}
		return true
	}
	return ended(pod.Spec.InitContainers, pod.Status.InitContainerStatuses) && ended(pod.Spec.Containers, pod.Status.ContainerStatuses)
}

// usesClaims: the pod mounts a PersistentVolumeClaim, a generic ephemeral
// volume or a CSI inline volume, whose teardown other controllers count on
// the pod's existence for.
func usesClaims(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.Ephemeral != nil || v.CSI != nil {
			return true
		}
	}
	return false
}

func containerStatus(statuses []corev1.ContainerStatus, name string) *corev1.ContainerStatus {
	for i := range statuses {
		if statuses[i].Name == name {
			return &statuses[i]
		}
	}
	return nil
}

// podEnd is when a pod's outcome happened: the last container finish time for
// a finished pod (which may be long before a restarted driver adopts it), else now.
func podEnd(pod *corev1.Pod, now time.Time) time.Time {
	if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		return now
	}
	var end time.Time
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range list {
			if t := s.State.Terminated; t != nil && t.FinishedAt.After(end) {
				end = t.FinishedAt.Time
			}
		}
	}
	if end.IsZero() {
		return now
	}
	return end
}

// ErrNamespaceGone is what a *NamespaceGoneError is (errors.Is).
var ErrNamespaceGone = errors.New("the pod's namespace is gone")

// NamespaceGoneError is Run's error when the operation's pod cannot be
// created because the namespace it must run in no longer exists, or is being
// deleted, as the API server answered the pod's creation: 404 NotFound of the
// namespace, or 403 Forbidden with cause NamespaceTerminating (the
// NamespaceLifecycle admission plugin). No pod of the operation exists: Run
// looked for one first. Nothing pav does will let the pod be created until a
// namespace of that name exists again.
type NamespaceGoneError struct {
	Phase     string
	Namespace string
	// Terminating: the namespace is being deleted; false: it does not exist.
	Terminating bool
	// Err is the API server's answer.
	Err error
}

func (e *NamespaceGoneError) Error() string {
	state := "no longer exists"
	if e.Terminating {
		state = "is being deleted"
	}
	return fmt.Sprintf("the %s pod cannot be created: its namespace %q %s (%v)", e.Phase, e.Namespace, state, e.Err)
}

// Unwrap makes it ErrNamespaceGone, and keeps the API's answer in the chain.
func (e *NamespaceGoneError) Unwrap() []error { return []error{ErrNamespaceGone, e.Err} }

// IsNamespaceGone returns the *NamespaceGoneError in err's chain, if any.
func IsNamespaceGone(err error) (*NamespaceGoneError, bool) {
	var e *NamespaceGoneError
	ok := errors.As(err, &e)
	return e, ok
}
