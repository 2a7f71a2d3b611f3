package podrunner

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/report"
)

const (
	// DefaultReportWait bounds the wait, after a pod finished, for the kubelet to
	// record its report sidecar's termination (and so the /pav files).
	DefaultReportWait = 30 * time.Second
	// DefaultUnschedulableGrace: a pod the scheduler cannot place yet (the
	// nodes are full until other pods end, or an autoscaler is adding one)
	// waits in its queue like any pod for this long before its operation
	// fails with the scheduler's message. Failing at once turned a burst of
	// claims on a full node into failed creations, each reverted by a
	// deletion pod that could not be placed either.
	DefaultUnschedulableGrace = 2 * time.Minute
	// ReasonForeignPod is the reason of the Warning event pav puts on a pod
	// that holds an operation's name but that pav did not create.
	ReasonForeignPod = "ForeignPod"
	logTailLines     = 20
	logTailBytes     = 2048
	logTailTimeout   = 10 * time.Second
	// maxCreateAttempts bounds create/AlreadyExists/NotFound races.
	maxCreateAttempts = 5
)

var (
	// ErrNotStarted is returned by Run and Delete before Start has synced.
	ErrNotStarted = errors.New("pod runner not started")
	// ErrStopped is returned once the context given to Start is done.
	ErrStopped = errors.New("pod runner stopped")
	// ErrForeignPod is returned when the operation's pod name is taken by a pod
	// that pav did not create for this operation: another provisioner's, phase's
	// or volume's, or one without the recorded UID or token (pre-created by
	// someone who can create pods in that namespace). It is never adopted or
	// deleted; a human must remove it.
	ErrForeignPod = errors.New("pod name taken by a pod pav did not create")
	// ErrPodDeleted is returned when the operation's pod disappeared before its
	// outcome was read (deleted by someone else): its outcome is unknown, and
	// the caller's retry runs the phase again with a new token.
	ErrPodDeleted = errors.New("pod deleted before it finished")
)

// Config configures a Runner.
type Config struct {
	Client kube.Interface
	// Provisioner is the PavProvisioner name; the informer selects its pods.
	Provisioner string
	// NodeName, in node mode, restricts the informer to this node's pods (label
	// selector on LabelNode); Run and Delete then only accept operations on it.
	NodeName string
	// ReportImage is the image holding pav-report (the pav image).
	ReportImage string
	// Report is how controller-side pods report their /pav files
	// (ReportExec, ReportSidecar; "" = ReportSidecar). A Runner that finds
	// ReportExec unsupported (the API server drops image volumes, or a node
	// cannot start the wrapped command) falls back to ReportSidecar for good.
	Report ReportMode
	// PodTimeout bounds a pod's life from its creationTimestamp (so retries and
	// driver restarts keep the same clock); 0 = no timeout.
	PodTimeout time.Duration
	// UnschedulableGrace is how long a pod the scheduler places may stay
	// unschedulable before that fails its operation: 0 =
	// DefaultUnschedulableGrace, negative = at once.
	UnschedulableGrace time.Duration
	// ReportWait bounds the wait for the report of a finished pod; 0 = DefaultReportWait.
	ReportWait time.Duration
	// DefaultNamespace is where pods go when their template names no namespace:
	// the driver's own namespace. "" = DefaultNamespace.
	DefaultNamespace string
	// Recorder, if set, gets the Warning events pav puts on foreign pods
	// (ReasonForeignPod); nil = no events.
	Recorder record.EventRecorder
}

// Runner runs operation pods for one provisioner (and, in node mode, one node).
// It is safe for concurrent use; concurrent Runs of the same operation converge
// on one pod.
type Runner struct {
	cfg Config

	mu       sync.Mutex
	waiters  map[string]map[*waiter]struct{} // "namespace/name" → waiters
	lister   corelisters.PodLister           // set once Start has synced
	stopped  <-chan struct{}
	handlers []PodEventHandler

	// noExec: ReportExec was found unsupported; pods get the sidecar.
	noExec atomic.Bool
}

// PodEventHandler is told of every pod event of a Runner's informer: a pod of
// its provisioner (and node) was added or changed (deleted false), or is gone
// (deleted true, with its last known state). It runs on the informer's
// goroutine: it must not block, and must not mutate pod (the cache's object).
type PodEventHandler func(pod *corev1.Pod, deleted bool)

// waiter is one goroutine's interest in one pod name. The informer's event
// handlers poke it; it then re-reads the pod from the informer cache (which the
// informer updates before calling handlers), so no event is ever lost and
// nothing polls.
type waiter struct {
	kick chan struct{}
	// gone holds the UIDs the informer reported deleted, with the pod's last
	// known state (guarded by Runner.mu): a pod that finished and was deleted
	// before this waiter looked (by a concurrent Run of the same operation, say)
	// still has a result.
	gone map[types.UID]*corev1.Pod
}

// New returns a Runner; call Start before Run.
func New(cfg Config) *Runner {
	return &Runner{cfg: cfg, waiters: map[string]map[*waiter]struct{}{}}
}

// Selector is the label selector of the Runner's informer.
func (r *Runner) Selector() labels.Selector {
	set := labels.Set{LabelProvisioner: r.cfg.Provisioner}
	if r.cfg.NodeName != "" {
		set[LabelNode] = NodeLabel(r.cfg.NodeName)
	}
	return labels.SelectorFromSet(set)
}

// Start starts the pod informer (all namespaces; label selector on the
// provisioner, plus the node in node mode) and waits for it to sync. The
// informer runs until ctx is done; Run and Delete fail with ErrStopped after that.
func (r *Runner) Start(ctx context.Context) error {
	if r.cfg.Client == nil {
		return errors.New("pod runner: no client")
	}
	if errs := validation.IsValidLabelValue(r.cfg.Provisioner); r.cfg.Provisioner == "" || len(errs) > 0 {
		return fmt.Errorf("pod runner: invalid provisioner name %q: %s", r.cfg.Provisioner, strings.Join(errs, ", "))
	}
	if r.cfg.ReportImage == "" {
		return errors.New("pod runner: no report image")
	}
	r.mu.Lock()
	if r.stopped != nil {
		r.mu.Unlock()
		return errors.New("pod runner: already started")
	}
	r.stopped = ctx.Done()
	r.mu.Unlock()

	selector := r.Selector().String()
	inf := kube.NewInformer(r.cfg.Client, r.cfg.Client.Pods(""), &corev1.Pod{}, 0,
		func(o *metav1.ListOptions) { o.LabelSelector = selector }, nil)
	// managedFields are large and never read here.
	if err := inf.SetTransform(stripManagedFields); err != nil {
		return err
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { r.onEvent(obj, false) },
		UpdateFunc: func(oldObj, newObj any) {
			// A relist may replace a pod by a new one of the same name.
			if o, ok := oldObj.(*corev1.Pod); ok {
				if n, ok := newObj.(*corev1.Pod); ok && o.UID != n.UID {
					r.onEvent(o, true)
				}
			}
			r.onEvent(newObj, false)
		},
		DeleteFunc: func(obj any) {
			obj, _ = kube.Unwrap[any](obj)
			r.onEvent(obj, true)
		},
	}); err != nil {
		return err
	}
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("pod runner: informer did not sync: %w", context.Cause(ctx))
	}
	r.mu.Lock()
	r.lister = corelisters.NewPodLister(inf.GetIndexer())
	r.mu.Unlock()
	klog.FromContext(ctx).Info("Pod runner started", "provisioner", r.cfg.Provisioner, "node", r.cfg.NodeName, "selector", selector)
	return nil
}

func stripManagedFields(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		p.ManagedFields = nil
	}
	return obj, nil
}

// OnPodEvent adds a handler of the informer's pod events, so that a caller can
// react to what happens to a pod between its operations (the node plugin: a
// KeepRunning staging pod that died under its clients) from the informer it
// already has, instead of a second watch. Handlers added before Start also see
// the initial list as additions.
func (r *Runner) OnPodEvent(h PodEventHandler) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.handlers = append(r.handlers, h)
}

// Cached returns the pod namespace/name from the informer cache, or nil if the
// cache has none (never mutate it). The cache holds exactly the pods of the
// Runner's selector, so in node mode a pav pod of this node that is not there
// is gone, give or take the informer's lag behind the API server.
func (r *Runner) Cached(namespace, name string) (*corev1.Pod, error) {
	r.mu.Lock()
	lister := r.lister
	r.mu.Unlock()
	if lister == nil {
		return nil, ErrNotStarted
	}
	p, err := lister.Pods(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return p, err
}

// CachedList returns the pods of the informer cache that sel selects (never
// mutate them).
func (r *Runner) CachedList(sel labels.Selector) ([]*corev1.Pod, error) {
	r.mu.Lock()
	lister := r.lister
	r.mu.Unlock()
	if lister == nil {
		return nil, ErrNotStarted
	}
	return lister.List(sel)
}

// WaitGone waits until the informer no longer has pod (its namespace, name and
// UID), or ctx is done.
func (r *Runner) WaitGone(ctx context.Context, pod *corev1.Pod) error {
	pw, err := r.watch(pod.Namespace, pod.Name)
	if err != nil {
		return err
	}
	defer pw.close()
	return r.waitGone(ctx, pw, pod.UID, false)
}

// WaitCreated waits until the informer has a pod named name in one of
// namespaces, and returns it (never mutate it), or until ctx is done.
func (r *Runner) WaitCreated(ctx context.Context, name string, namespaces ...string) (*corev1.Pod, error) {
	keys := make([]string, len(namespaces))
	for i, ns := range namespaces {
		keys[i] = ns + "/" + name
	}
	w := newWaiter()
	r.mu.Lock()
	lister, stopped := r.lister, r.stopped
	if lister == nil {
		r.mu.Unlock()
		return nil, ErrNotStarted
	}
	r.addWaiter(w, keys...)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.removeWaiter(w, keys...)
	}()
	for {
		for _, ns := range namespaces {
			if p, err := lister.Pods(ns).Get(name); err == nil {
				return p, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-stopped:
			return nil, ErrStopped
		case <-w.kick:
		}
	}
}

// onEvent pokes the waiters of a pod, deleted marks the pod's UID gone, and
// the OnPodEvent handlers are told.
func (r *Runner) onEvent(obj any, deleted bool) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	r.mu.Lock()
	handlers := r.handlers
	r.poke(pod, deleted)
	r.mu.Unlock()
	for _, h := range handlers {
		h(pod, deleted)
	}
}

// poke wakes the waiters of pod's name; r.mu is held.
func (r *Runner) poke(pod *corev1.Pod, deleted bool) {
	for w := range r.waiters[pod.Namespace+"/"+pod.Name] {
		if deleted {
			w.gone[pod.UID] = pod
		}
		select {
		case w.kick <- struct{}{}:
		default: // already poked: it will re-read the cache anyway
		}
	}
}

// podWatch is a registered waiter for one pod name.
type podWatch struct {
	r         *Runner
	ns, name  string
	w         *waiter
	lister    corelisters.PodLister
	stoppedCh <-chan struct{}
}

func (r *Runner) watch(ns, name string) (*podWatch, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lister == nil {
		return nil, ErrNotStarted
	}
	w := newWaiter()
	r.addWaiter(w, ns+"/"+name)
	return &podWatch{r: r, ns: ns, name: name, w: w, lister: r.lister, stoppedCh: r.stopped}, nil
}

func (pw *podWatch) close() {
	pw.r.mu.Lock()
	defer pw.r.mu.Unlock()
	pw.r.removeWaiter(pw.w, pw.ns+"/"+pw.name)
}

func newWaiter() *waiter {
	return &waiter{kick: make(chan struct{}, 1), gone: map[types.UID]*corev1.Pod{}}
}

// addWaiter has the events of the pods namespace/name keys poke w; r.mu is held.
func (r *Runner) addWaiter(w *waiter, keys ...string) {
	for _, key := range keys {
		if r.waiters[key] == nil {
			r.waiters[key] = map[*waiter]struct{}{}
		}
		r.waiters[key][w] = struct{}{}
	}
}

// removeWaiter undoes addWaiter; r.mu is held.
func (r *Runner) removeWaiter(w *waiter, keys ...string) {
	for _, key := range keys {
		delete(r.waiters[key], w)
		if len(r.waiters[key]) == 0 {
			delete(r.waiters, key)
		}
	}
}

// poke makes the waiter look at the pod again (something else than the pod
// changed: a node pod's /pav/ready).
func (pw *podWatch) poke() {
	select {
	case pw.w.kick <- struct{}{}:
	default: // already poked
	}
}

// cached is the pod in the informer cache (shared: never mutate it), or nil.
func (pw *podWatch) cached() *corev1.Pod {
	p, err := pw.lister.Pods(pw.ns).Get(pw.name)
	if err != nil {
		return nil
	}
	return p
}

func (pw *podWatch) isGone(uid types.UID) bool {
	_, gone := pw.lastState(uid)
	return gone
}

// lastState is the last known state of a pod the informer reported deleted.
func (pw *podWatch) lastState(uid types.UID) (*corev1.Pod, bool) {
	pw.r.mu.Lock()
	defer pw.r.mu.Unlock()
	p, gone := pw.w.gone[uid]
	return p, gone
}

// forget clears the gone marks: after we create a pod, an earlier deletion must
// not be mistaken for its own (matters where UIDs are empty, as in a bare fake clientset).
func (pw *podWatch) forget() {
	pw.r.mu.Lock()
	defer pw.r.mu.Unlock()
	clear(pw.w.gone)
}

// next blocks until the pod may have changed, a timer fires, ctx is done or the
// runner stops.
func (pw *podWatch) next(ctx context.Context, timers ...<-chan time.Time) (fired int, err error) {
	var t [3]<-chan time.Time
	copy(t[:], timers)
	select {
	case <-ctx.Done():
		return -1, ctx.Err()
	case <-pw.stoppedCh:
		return -1, ErrStopped
	case <-pw.w.kick:
		return -1, nil
	case <-t[0]:
		return 0, nil
	case <-t[1]:
		return 1, nil
	case <-t[2]:
		return 2, nil
	}
}

func (r *Runner) checkNode(op *Operation) error {
	if r.cfg.NodeName != "" && op.NodeName != r.cfg.NodeName {
		// The informer only sees this node's pods: it would never see this one.
		return fmt.Errorf("%w: the pod runner of node %q cannot run a pod on node %q",
			ErrInvalidOperation, r.cfg.NodeName, op.NodeName)
	}
	if op.Provisioner != r.cfg.Provisioner {
		return fmt.Errorf("%w: the pod runner of provisioner %q cannot run a pod for provisioner %q",
			ErrInvalidOperation, r.cfg.Provisioner, op.Provisioner)
	}
	return nil
}

// podConfig is how the Runner builds its pods now.
func (r *Runner) podConfig() PodConfig {
	mode := r.cfg.Report
	if r.noExec.Load() {
		mode = ReportSidecar
	}
	return PodConfig{ReportImage: r.cfg.ReportImage, DefaultNamespace: r.cfg.DefaultNamespace, Report: mode}
}

// execUnsupported makes the Runner's next pods report through the sidecar.
func (r *Runner) execUnsupported(ctx context.Context, why string) {
	if !r.noExec.Swap(true) {
		klog.FromContext(ctx).Info("pav-report cannot run the pods' commands here (report mode exec); the next pods get the report sidecar (set --pod-report=sidecar to start so)", "why", why)
	}
}

// BuildPod builds the operation's pod with the Runner's report image and
// default namespace.
func (r *Runner) BuildPod(op Operation) (*corev1.Pod, error) {
	return BuildPod(op, r.podConfig())
}

// Namespace is where the Runner puts the operation's pod.
func (r *Runner) Namespace(op Operation) string {
	return op.Namespace(r.cfg.DefaultNamespace)
}

// Run runs the operation's pod, or adopts the one a previous attempt (maybe of
// a previous driver process) left, and waits for its outcome:
//
//   - the pod succeeded: a Result with the files it left in /pav;
//   - a KeepRunning pod signalled ready (/pav/ready) with all its containers
//     running: a Result with Running set;
//   - the pod failed, could not be scheduled or pull an image, or outlived
//     PodTimeout: a *PodFailure;
//   - ctx ended first: ctx.Err(), for the caller's retry to adopt the pod.
//
// Only a pod with op.UID, or (op.UID unset) with op.Token, is adopted; any
// other pod of that name is refused (ErrForeignPod, and a Warning event on
// it). With op.UID set, Run never creates a pod.
//
// The pod is always left in place: the caller first records the outcome where
// only pav can write, then removes the pod with Delete. So a driver that dies in
// between finds the finished pod on its retry and reads its result again,
// instead of running the phase twice.
func (r *Runner) Run(ctx context.Context, op Operation) (res *Result, err error) {
	start := time.Now()
	var decided *corev1.Pod // the pod whose state decided the outcome
	defer func() { r.record(&op, decided, start, res, err) }()

	if err := op.validate(); err != nil {
		return nil, err
	}
	if err := op.validateIdentity(true); err != nil {
		return nil, err
	}
	if err := r.checkNode(&op); err != nil {
		return nil, err
	}
	pod, err := r.BuildPod(op)
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod), "phase", op.Phase)
	ctx = klog.NewContext(ctx, logger)
	if op.Template.Name != "" || op.Template.GenerateName != "" {
		logger.V(2).Info("Ignoring the pod template's name: pav names its pods itself",
			"templateName", op.Template.Name, "templateGenerateName", op.Template.GenerateName)
	}

	pw, err := r.watch(pod.Namespace, pod.Name)
	if err != nil {
		return nil, err
	}
	defer pw.close()
	if _, wrapped := Wrapped(pod); op.HostPath != "" && (op.KeepRunning || wrapped) {
		// Readiness, and a wrapped command's end (BuildPod wraps a node pod
		// only for EndAtExit), are files on this node, not a pod status:
		// watch them before the first look at the pod, so that their
		// creation cannot be missed.
		defer watchHostDir(ctx, op.HostPath, pw.poke)()
	}

	cur, err := r.createOrAdopt(ctx, pw, pod, &op)
	if err != nil {
		return nil, err
	}
	p, v, err := r.await(ctx, pw, &op, cur)
	if err != nil {
		if ctx.Err() != nil {
			logger.V(1).Info("Stopped waiting for pod; leaving it for a retry to adopt", "reason", err)
		}
		return nil, err
	}
	decided = p
	if v.execUnsupported {
		r.execUnsupported(ctx, v.failure.Message)
	}
	if v.reportProblem != nil {
		logger.Info("Pod report incomplete; using what is there", "problem", v.reportProblem.Error())
	}

	if v.result != nil {
		v.result.UID = p.UID
	}
	if v.failure != nil {
		v.failure.UID = p.UID
	}
	if v.result != nil && v.result.Running {
		logger.Info("Pod is running and ready")
		return v.result, nil
	}
	if v.failure != nil {
		if v.failure.ErrorFile == "" && v.failure.Reason != ReasonInvalidReport {
			if c := logContainer(p); c != "" {
				v.failure.LogTail = r.logTail(ctx, p, c)
			}
		}
		logger.Info("Pod failed", "reason", v.failure.Reason, "error", v.failure.Error())
		return nil, v.failure
	}
	if len(op.LogFiles) > 0 {
		if err := r.readLogFiles(ctx, &op, p, v.result); err != nil {
			var f *PodFailure
			if errors.As(err, &f) {
				f.UID = p.UID
				logger.Info("Pod failed", "reason", f.Reason, "error", f.Error())
			}
			return nil, err
		}
	}
	logger.Info("Pod succeeded", "files", slices.Sorted(maps.Keys(v.result.Files)))
	return v.result, nil
}

// readLogFiles replaces, in res.Files, the reference to each of op.LogFiles
// that the report carries with the file itself, read from the reporting
// container's log (report.ReadLogFile). A copy that is not in the log, or not
// what the report says, fails the pod (ReasonInvalidReport: running it again
// is the way out); an API error is returned as it is, and the retry reads the
// log of the same pod again.
func (r *Runner) readLogFiles(ctx context.Context, op *Operation, pod *corev1.Pod, res *Result) error {
	container := ReportContainer
	if name, ok := Wrapped(pod); ok {
		container = name
	}
	for _, name := range op.LogFiles {
		key := report.LogRefKey(name)
		ref, ok := res.Files[key]
		if !ok {
			continue
		}
		delete(res.Files, key)
		rc, err := r.cfg.Client.Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: container}).Stream(ctx)
		if err != nil {
			return fmt.Errorf("reading /pav/%s from the log of container %q of %s pod %s/%s: %w", name, container, op.Phase, pod.Namespace, pod.Name, err)
		}
		content, err := report.ReadLogFile(rc, name, ref)
		rc.Close()
		if err != nil && !errors.Is(err, report.ErrLogFileInvalid) {
			return fmt.Errorf("reading /pav/%s from the log of container %q of %s pod %s/%s: %w", name, container, op.Phase, pod.Namespace, pod.Name, err)
		}
		if err != nil {
			f := newFailure(op, pod)
			f.Reason, f.Message = ReasonInvalidReport, err.Error()
			return f
		}
		res.Files[name] = content
	}
	return nil
}

// createOrAdopt creates the pod or adopts the operation's existing pod (see
// ownership). One that has finished is adopted, since its result is final (a
// driver restart may have come between its end and the record of its
// outcome). One of ours that is being deleted has an unknown outcome: the API
// server removes a finished pod at once when it is deleted (pav's pods have no
// finalizers), so a pod still there with a deletionTimestamp was deleted while
// it ran, and whatever it ends with (exit code 143, say) is its killing, not
// the operation's result. It is waited out and reported as ErrPodDeleted, so
// that the caller re-runs the phase with a new token.
func (r *Runner) createOrAdopt(ctx context.Context, pw *podWatch, pod *corev1.Pod, op *Operation) (*corev1.Pod, error) {
	logger := klog.FromContext(ctx)
	pods := r.cfg.Client.Pods(pod.Namespace)
	for range maxCreateAttempts {
		if op.UID == "" {
			created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
			if err == nil {
				pw.forget()
				logger.Info("Created pod", "uid", created.UID)
				if err := r.created(ctx, op, created.UID); err != nil {
					return nil, err
				}
				return created, nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if rejectsReportVolume(err, pod) {
				// An API server without image volumes (before Kubernetes
				// 1.35, or the ImageVolume gate off) drops the volume's
				// source and then refuses the volume.
				r.execUnsupported(ctx, err.Error())
				rebuilt, berr := r.BuildPod(*op)
				if berr != nil {
					return nil, berr
				}
				pod = rebuilt
				continue
			}
			if terminating, gone := namespaceGone(err, pod.Namespace); gone {
				// A namespace being deleted refuses every creation, even of
				// a pod that exists: one of ours (created before a restart
				// that kept its UID from the record) is adopted and waited
				// out below, as any other.
				if !terminating || !podExists(ctx, pods, pod.Name) {
					logger.Info("The pod cannot be created: its namespace is gone", "terminating", terminating)
					return nil, &NamespaceGoneError{Phase: string(op.Phase), Namespace: pod.Namespace, Terminating: terminating, Err: err}
				}
			} else if !apierrors.IsAlreadyExists(err) {
				return nil, fmt.Errorf("creating %s pod %s/%s: %w", op.Phase, pod.Namespace, pod.Name, err)
			}
		}
		// The API server's copy, not the informer's: the cache may lag behind,
		// and not show yet that the pod is being deleted.
		existing, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) && op.UID != "":
			return nil, fmt.Errorf("%w: %s pod %s/%s (uid %s) is gone and its outcome was never recorded",
				ErrPodDeleted, op.Phase, pod.Namespace, pod.Name, op.UID)
		case apierrors.IsNotFound(err):
			continue // deleted in between: create again
		case err != nil:
			return nil, fmt.Errorf("getting existing %s pod %s/%s: %w", op.Phase, pod.Namespace, pod.Name, err)
		}
		if err := r.checkOwner(ctx, existing, op, true); err != nil {
			return nil, err
		}
		if existing.DeletionTimestamp != nil {
			// Deleted while it ran (the API server removes a finished pod at
			// once: pav's pods have no finalizers), so whatever it ends with
			// (exit code 143, say) is its killing, not the operation's result.
			// Wait it out: the caller's retry, with a new token, must not meet
			// it (it would be foreign to the new token).
			logger.Info("The operation's pod is being deleted; waiting for it to go", "uid", existing.UID, "podPhase", existing.Status.Phase)
			if err := r.waitGone(ctx, pw, existing.UID, false); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %s pod %s/%s (uid %s) was deleted by someone else before it finished",
				ErrPodDeleted, op.Phase, pod.Namespace, pod.Name, existing.UID)
		}
		logger.Info("Adopting existing pod", "uid", existing.UID, "podPhase", existing.Status.Phase)
		if op.UID == "" {
			if err := r.created(ctx, op, existing.UID); err != nil {
				return nil, err
			}
		}
		return existing, nil
	}
	return nil, fmt.Errorf("%s pod %s/%s: gave up after %d attempts to create or adopt it (it keeps appearing and disappearing)",
		op.Phase, pod.Namespace, pod.Name, maxCreateAttempts)
}

// namespaceGone: err is the API server refusing a pod's creation because its
// namespace ns is being deleted (403 with cause NamespaceTerminating, from
// the NamespaceLifecycle admission plugin) or does not exist (404 NotFound
// of the namespace itself, not of anything else). Only these answers count:
// nothing is guessed from a message.
func namespaceGone(err error, ns string) (terminating, gone bool) {
	if apierrors.IsForbidden(err) && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		return true, true
	}
	var status apierrors.APIStatus
	if apierrors.IsNotFound(err) && errors.As(err, &status) {
		if d := status.Status().Details; d != nil && d.Group == "" && d.Kind == "namespaces" && d.Name == ns {
			return false, true
		}
	}
	return false, false
}

// podExists: the API server has a pod of that name (an error other than
// NotFound counts as "maybe": the caller then takes the adoption path, which
// reads it again).
func podExists(ctx context.Context, pods kube.Pods, name string) bool {
	_, err := pods.Get(ctx, name, metav1.GetOptions{})
	return !apierrors.IsNotFound(err)
}

// rejectsReportVolume: err is the API server refusing pod's ReportVolume.
func rejectsReportVolume(err error, pod *corev1.Pod) bool {
	if _, ok := Wrapped(pod); !ok || !apierrors.IsInvalid(err) {
		return false
	}
	field := ""
	for i, v := range pod.Spec.Volumes {
		if v.Name == ReportVolume {
			field = fmt.Sprintf("spec.volumes[%d]", i)
		}
	}
	var status apierrors.APIStatus
	if field == "" || !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Field == field || strings.HasPrefix(c.Field, field+".") {
			return true
		}
	}
	return false
}

// created tells the caller the UID of the pod that carries its token.
func (r *Runner) created(ctx context.Context, op *Operation, uid types.UID) error {
	if op.Created == nil {
		return nil
	}
	if err := op.Created(ctx, uid); err != nil {
		return fmt.Errorf("recording the UID %s of the %s pod of volume %q: %w", uid, op.Phase, op.VolumeKey, err)
	}
	return nil
}

// ownership says why pod is not the operation's own, or "" if it is: it must
// carry the operation's labels and volume key, and the recorded UID (if known)
// or else the recorded token. Labels and annotations alone prove nothing:
// anyone who may create pods in the namespace can copy them.
func ownership(pod *corev1.Pod, op *Operation) string {
	l := pod.Labels
	ok := l[LabelProvisioner] == op.Provisioner && l[LabelPhase] == string(op.Phase) &&
		pod.Annotations[AnnotationVolumeKey] == op.VolumeKey
	if ok && op.NodeName != "" {
		ok = l[LabelNode] == NodeLabel(op.NodeName)
	}
	switch {
	case !ok:
		return "it belongs to " + describeOwner(pod)
	case op.UID != "" && pod.UID != op.UID:
		return fmt.Sprintf("its UID %s is not the UID %s pav recorded for the pod it created", pod.UID, op.UID)
	case op.UID == "" && (op.Token == "" || subtle.ConstantTimeCompare([]byte(pod.Annotations[AnnotationToken]), []byte(op.Token)) != 1):
		return "it does not carry the token pav recorded before creating its pod"
	}
	return ""
}

// checkOwner refuses a pod that is not the operation's own (ownership); when
// warn is set it also puts a Warning event on it, where whoever created it (and
// the namespace's users) will see it.
func (r *Runner) checkOwner(ctx context.Context, pod *corev1.Pod, op *Operation, warn bool) error {
	why := ownership(pod, op)
	if why == "" {
		return nil
	}
	klog.FromContext(ctx).Info("Refusing a pod pav did not create", "uid", pod.UID, "why", why)
	if warn && r.cfg.Recorder != nil {
		r.cfg.Recorder.Eventf(pod, corev1.EventTypeWarning, ReasonForeignPod,
			"pav provisioner %s refuses to use this pod for phase %s of volume %s: pav did not create it (%s); delete it",
			op.Provisioner, op.Phase, op.VolumeKey, why)
	}
	return fmt.Errorf("%w: pod %s/%s holds the name of the %s pod of volume %q (provisioner %q) but %s; delete it so that pav can create its own",
		ErrForeignPod, pod.Namespace, pod.Name, op.Phase, op.VolumeKey, op.Provisioner, why)
}

func describeOwner(pod *corev1.Pod) string {
	if prov, ok := pod.Labels[LabelProvisioner]; ok {
		s := fmt.Sprintf("pav provisioner %q, phase %q, volume key %q", prov, pod.Labels[LabelPhase], pod.Annotations[AnnotationVolumeKey])
		if n := pod.Labels[LabelNode]; n != "" {
			s += fmt.Sprintf(", node %q", n)
		}
		return s
	}
	if len(pod.OwnerReferences) > 0 {
		o := pod.OwnerReferences[0]
		return fmt.Sprintf("%s %q (not a pav pod)", o.Kind, o.Name)
	}
	return "someone else (it has no pav labels)"
}

// Finished says whether a pod has ended (Succeeded or Failed).
func Finished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// await waits, through informer events and two timers (PodTimeout, report
// wait), until evaluate decides the pod's outcome.
func (r *Runner) await(ctx context.Context, pw *podWatch, op *Operation, cur *corev1.Pod) (*corev1.Pod, verdict, error) {
	logger := klog.FromContext(ctx)
	uid := cur.UID
	// The clock starts at the pod's creation, not at this call, so that a
	// retry or a restarted driver does not extend a pod's time.
	created := cur.CreationTimestamp.Time
	if created.IsZero() {
		created = time.Now()
	}
	var timeoutC <-chan time.Time
	if r.cfg.PodTimeout > 0 {
		t := time.NewTimer(time.Until(created.Add(r.cfg.PodTimeout)))
		defer t.Stop()
		timeoutC = t.C
	}
	var reportC, recheckC <-chan time.Time
	var reportTimer, recheckTimer *time.Timer
	defer func() {
		for _, t := range []*time.Timer{reportTimer, recheckTimer} {
			if t != nil {
				t.Stop()
			}
		}
	}()
	grace := r.cfg.UnschedulableGrace
	if grace == 0 {
		grace = DefaultUnschedulableGrace
	}

	timedOut, reportExpired := false, false
	for {
		p := pw.cached()
		switch {
		case p != nil && p.UID == uid && p.DeletionTimestamp != nil && !Finished(p):
			// Someone deletes it while it runs: what it ends with is its
			// killing, not the operation's result.
			logger.Info("The operation's pod is being deleted before it finished; waiting for it to go")
			if err := r.waitGone(ctx, pw, uid, true); err != nil {
				return nil, verdict{}, err
			}
			return nil, verdict{}, fmt.Errorf("%w: %s pod %s/%s (uid %s) was deleted by someone else before it finished",
				ErrPodDeleted, op.Phase, pw.ns, pw.name, uid)
		case p != nil && p.UID == uid:
			v := evaluate(op, p, reportExpired, timedOut, r.trustEnded(p), r.cfg.PodTimeout, grace, time.Now())
			if v.done {
				return p, v, nil
			}
			if !v.recheckAt.IsZero() {
				if recheckTimer == nil {
					logger.Info("Pod is unschedulable for now; waiting for the scheduler", "until", v.recheckAt)
					recheckTimer = time.NewTimer(time.Until(v.recheckAt))
				} else {
					recheckTimer.Reset(time.Until(v.recheckAt))
				}
				recheckC = recheckTimer.C
			}
			if v.awaitingReport && reportTimer == nil {
				wait := r.cfg.ReportWait
				if wait <= 0 {
					wait = DefaultReportWait
				}
				logger.V(2).Info("Pod finished; waiting for its report", "podPhase", p.Status.Phase, "bound", wait)
				reportTimer = time.NewTimer(wait)
				reportC = reportTimer.C
			}
		case pw.isGone(uid):
			// The informer reported it deleted (or replaced by a relist). If
			// it had finished, its result stands (no update will come: stop
			// waiting for the report). A pod merely absent from the cache is
			// not enough: the informer updates its store before it calls the
			// delete handler that records the last state, so wait for that.
			if last, _ := pw.lastState(uid); last != nil && Finished(last) {
				if v := evaluate(op, last, true, timedOut, r.trustEnded(last), r.cfg.PodTimeout, grace, time.Now()); v.done {
					logger.V(2).Info("Pod finished and was deleted before we looked; using its last state")
					return last, v, nil
				}
			}
			return nil, verdict{}, fmt.Errorf("%w: %s pod %s/%s (uid %s)", ErrPodDeleted, op.Phase, pw.ns, pw.name, uid)
		default:
			// Just created or adopted from the API and the cache has not
			// caught up (it may even still show an older pod of that name),
			// or just deleted and the handler has not run yet.
		}
		fired, err := pw.next(ctx, timeoutC, reportC, recheckC)
		if err != nil {
			return nil, verdict{}, err
		}
		switch fired {
		case 0:
			timedOut, timeoutC = true, nil
		case 1:
			reportExpired, reportC = true, nil
			logger.Info("Pod finished but its report did not arrive in time; going on without it")
		}
	}
}

// waitGone waits until the pod with this UID is gone (or replaced). seen: the
// caller found it in the informer cache after registering pw, so the informer
// will tell of its end (its removal from the cache, then the delete event that
// marks it gone; a relist's tombstone too) and the API need not be asked.
func (r *Runner) waitGone(ctx context.Context, pw *podWatch, uid types.UID, seen bool) error {
	askedAPI := false
	for {
		p := pw.cached()
		switch {
		case pw.isGone(uid):
			return nil
		case p != nil && p.UID == uid:
			seen = true
		case seen:
			// The cache had it and has moved on.
			return nil
		case !askedAPI:
			// Not in the cache (or an older pod is): either already gone, or
			// the cache lags. One API read tells which; after that, the
			// informer's events will.
			askedAPI = true
			got, err := r.cfg.Client.Pods(pw.ns).Get(ctx, pw.name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && got.UID != uid) {
				return nil
			}
		}
		if _, err := pw.next(ctx); err != nil {
			return err
		}
	}
}

// deletePod deletes exactly this pod (UID precondition), in the background.
func (r *Runner) deletePod(ctx context.Context, pod *corev1.Pod) error {
	bg := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{PropagationPolicy: &bg}
	if _, relayed := relayedEnd(pod, r.trustEnded(pod)); !Finished(pod) && (endedInFact(pod) || relayed) && !usesClaims(pod) {
		// Its containers have all ended (or its node plugin relayed the
		// wrapped command's end) but the kubelet has not published
		// the terminal phase yet: a graceful deletion would wait for the
		// kubelet to stop a pod that runs nothing (the API server removes
		// a terminal pod at once anyway). The kubelet tears down the
		// sandbox and the pod's own volumes of a pod it no longer finds.
		// Not a pod that mounts a claim: while the kubelet still has it
		// mounted, the claim must stay in use (PVC protection counts the
		// pods that exist).
		opts.GracePeriodSeconds = ptr.To[int64](0)
	}
	if pod.UID != "" {
		uid := pod.UID
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := r.cfg.Client.Pods(pod.Namespace).Delete(ctx, pod.Name, opts)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Gone already, or replaced by a pod that is not ours to delete.
		return nil
	}
	return err
}

// trustEnded: pod is in the driver's own namespace, where only pav (and the
// cluster's admins) write pods, so its AnnotationEnded, which the node plugins
// write, may stand for its end. A template may put its pods in a tenant's
// namespace, whose users could write the annotation themselves.
func (r *Runner) trustEnded(pod *corev1.Pod) bool {
	return r.cfg.DefaultNamespace != "" && pod.Namespace == r.cfg.DefaultNamespace
}

// Delete deletes the operation's pod (the one with op.UID, or else op.Token),
// if it exists, and waits (until ctx is done) for the informer to see it gone,
// so that a KeepRunning pod has stopped using /pav when Delete returns. A pod
// of that name that is not the operation's is never deleted: Delete leaves it
// alone and returns nil, since the operation's own pod is gone.
func (r *Runner) Delete(ctx context.Context, op Operation) error {
	return r.remove(ctx, op, true)
}

// Discard is Delete without the wait: it asks for the deletion of the
// operation's pod (the same identity checks) and returns. It is for a pod
// whose command has ended (a node pod's wrapped command wrote its exit code)
// while its status may still say Running: the kubelet then takes a graceful
// deletion's round trip to remove it, which nothing needs to wait for. The
// caller keeps the pod's identity until the informer no longer has it, so
// that no new pod of its name is created meanwhile (it would meet this one).
func (r *Runner) Discard(ctx context.Context, op Operation) error {
	return r.remove(ctx, op, false)
}

func (r *Runner) remove(ctx context.Context, op Operation, wait bool) error {
	if err := op.validate(); err != nil {
		return err
	}
	if err := op.validateIdentity(false); err != nil {
		return err
	}
	if err := r.checkNode(&op); err != nil {
		return err
	}
	ns, name := r.Namespace(op), op.PodName()
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(ns, name), "phase", op.Phase)
	ctx = klog.NewContext(ctx, logger)
	pw, err := r.watch(ns, name)
	if err != nil {
		return err
	}
	defer pw.close()
	p := pw.cached()
	fromCache := p != nil && ownership(p, &op) == ""
	if !fromCache {
		// Not cached, or the cache may lag behind: ask the API server.
		p, err = r.cfg.Client.Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("getting %s pod %s/%s: %w", op.Phase, ns, name, err)
		}
	}
	if why := ownership(p, &op); why != "" {
		logger.Info("Not deleting a pod pav did not create; the operation's own pod is gone", "uid", p.UID, "why", why)
		return nil
	}
	logger.Info("Deleting pod", "uid", p.UID, "podPhase", p.Status.Phase)
	if err := r.deletePod(ctx, p); err != nil {
		return fmt.Errorf("deleting %s pod %s/%s: %w", op.Phase, ns, name, err)
	}
	if !wait {
		return nil
	}
	if err := r.waitGone(ctx, pw, p.UID, fromCache); err != nil {
		return fmt.Errorf("waiting for %s pod %s/%s to go away: %w", op.Phase, ns, name, err)
	}
	logger.V(2).Info("Pod gone")
	return nil
}

// logTail is the end of a container's log: its last 20 lines, at most ~2 KiB.
func (r *Runner) logTail(ctx context.Context, pod *corev1.Pod, container string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), logTailTimeout)
	defer cancel()
	lines := int64(logTailLines)
	rc, err := r.cfg.Client.Pods(pod.Namespace).
		GetLogs(pod.Name, &corev1.PodLogOptions{Container: container, TailLines: &lines}).Stream(ctx)
	if err != nil {
		klog.FromContext(ctx).V(1).Info("Could not read the log of a failed pod", "container", container, "err", err)
		return ""
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 64*1024))
	if err != nil && len(b) == 0 {
		return ""
	}
	return report.Tail(strings.TrimRight(string(b), "\n"), logTailBytes)
}

// record updates the metrics for one Run.
func (r *Runner) record(op *Operation, pod *corev1.Pod, start time.Time, res *Result, err error) {
	result := resultLabel(res, err)
	operationsTotal.WithLabelValues(string(op.Phase), result).Inc()
	outcome, ok := outcomes[result]
	if pod == nil || !ok {
		return
	}
	from := pod.CreationTimestamp.Time
	if from.IsZero() {
		from = start
	}
	if d := podEnd(pod, time.Now()).Sub(from); d >= 0 {
		// The Runner's provisioner: op's was checked against it, if
		// the operation got as far as a pod.
		phaseDuration.WithLabelValues(r.cfg.Provisioner, string(op.Phase), outcome).Observe(d.Seconds())
	}
}

func resultLabel(res *Result, err error) string {
	if err == nil {
		if res != nil && res.Running {
			return ResultRunning
		}
		return ResultSuccess
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return ResultCanceled
	}
	if f, ok := IsPodFailure(err); ok {
		switch {
		case f.Reason == ReasonTimeout:
			return ResultTimeout
		case f.Reason == ReasonUnschedulable:
			return ResultUnschedulable
		case imageErrorReasons[f.Reason]:
			return ResultImageError
		}
		return ResultFailure
	}
	return ResultError
}
