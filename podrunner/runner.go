package podrunner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

const (
	// DefaultReportWait bounds the wait, after a pod finished, for the kubelet to
	// record its report sidecar's termination (and so the /pav files).
	DefaultReportWait = 30 * time.Second
	// defaultDeleteSlack is added to a pod's termination grace period to bound
	// the wait for its removal after an operation.
	defaultDeleteSlack = 60 * time.Second
	logTailLines       = 20
	logTailBytes       = 2048
	logTailTimeout     = 10 * time.Second
	// maxCreateAttempts bounds create/AlreadyExists/NotFound races.
	maxCreateAttempts = 5
)

var (
	// ErrNotStarted is returned by Run and Delete before Start has synced.
	ErrNotStarted = errors.New("pod runner not started")
	// ErrStopped is returned once the context given to Start is done.
	ErrStopped = errors.New("pod runner stopped")
	// ErrForeignPod is returned when the operation's pod name is taken by a pod
	// that is not this operation's (another provisioner, phase or volume, or not pav's).
	ErrForeignPod = errors.New("pod name taken by another owner")
	// ErrPodDeleted is returned when the operation's pod disappeared before it
	// finished (deleted by someone else); a retry runs a new pod.
	ErrPodDeleted = errors.New("pod deleted before it finished")
)

// Config configures a Runner.
type Config struct {
	Client kubernetes.Interface
	// Provisioner is the PavProvisioner name; the informer selects its pods.
	Provisioner string
	// NodeName, in node mode, restricts the informer to this node's pods (label
	// selector on LabelNode); Run and Delete then only accept operations on it.
	NodeName string
	// ReportImage is the image holding the pav binary, for the report sidecar.
	ReportImage string
	// PodTimeout bounds a pod's life from its creationTimestamp (so retries and
	// driver restarts keep the same clock); 0 = no timeout.
	PodTimeout time.Duration
	// ReportWait bounds the wait for the report of a finished pod; 0 = DefaultReportWait.
	ReportWait time.Duration
	// DeleteWait bounds the wait for a pod's removal after an operation;
	// 0 = the pod's termination grace period + 60 s.
	DeleteWait time.Duration
}

// Runner runs operation pods for one provisioner (and, in node mode, one node).
// It is safe for concurrent use; concurrent Runs of the same operation converge
// on one pod.
type Runner struct {
	cfg Config

	mu      sync.Mutex
	waiters map[string]map[*waiter]struct{} // "namespace/name" → waiters
	lister  corelisters.PodLister           // set once Start has synced
	stopped <-chan struct{}
}

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
	factory := informers.NewSharedInformerFactoryWithOptions(r.cfg.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	podInformer := factory.Core().V1().Pods()
	inf := podInformer.Informer()
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
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			r.onEvent(obj, true)
		},
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("pod runner: informer did not sync: %w", context.Cause(ctx))
	}
	r.mu.Lock()
	r.lister = podInformer.Lister()
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

// onEvent pokes the waiters of a pod; deleted marks the pod's UID gone.
func (r *Runner) onEvent(obj any, deleted bool) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
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
	key := ns + "/" + name
	w := &waiter{kick: make(chan struct{}, 1), gone: map[types.UID]*corev1.Pod{}}
	if r.waiters[key] == nil {
		r.waiters[key] = map[*waiter]struct{}{}
	}
	r.waiters[key][w] = struct{}{}
	return &podWatch{r: r, ns: ns, name: name, w: w, lister: r.lister, stoppedCh: r.stopped}, nil
}

func (pw *podWatch) close() {
	pw.r.mu.Lock()
	defer pw.r.mu.Unlock()
	key := pw.ns + "/" + pw.name
	delete(pw.r.waiters[key], pw.w)
	if len(pw.r.waiters[key]) == 0 {
		delete(pw.r.waiters, key)
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
	var t0, t1 <-chan time.Time
	if len(timers) > 0 {
		t0 = timers[0]
	}
	if len(timers) > 1 {
		t1 = timers[1]
	}
	select {
	case <-ctx.Done():
		return -1, ctx.Err()
	case <-pw.stoppedCh:
		return -1, ErrStopped
	case <-pw.w.kick:
		return -1, nil
	case <-t0:
		return 0, nil
	case <-t1:
		return 1, nil
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

// BuildPod builds the operation's pod with the Runner's report image.
func (r *Runner) BuildPod(op Operation) (*corev1.Pod, error) {
	return BuildPod(op, r.cfg.ReportImage)
}

// Run runs the operation's pod, or adopts the one a previous attempt (maybe of
// a previous driver process) left, and waits for its outcome:
//
//   - the pod succeeded: a Result with the files it left in /pav;
//   - a KeepRunning pod signalled ready (/pav/ready) with all its containers
//     running: a Result with Running set, and the pod is left running;
//   - the pod failed, could not be scheduled or pull an image, or outlived
//     PodTimeout: a *PodFailure;
//   - ctx ended first: ctx.Err(), and the pod is left as it is, so that the
//     caller's retry adopts it rather than starting over.
//
// Finished pods are deleted before Run returns, and Run waits (bounded) until
// the informer has seen them gone, so that a retry never meets a stale one.
func (r *Runner) Run(ctx context.Context, op Operation) (res *Result, err error) {
	start := time.Now()
	var decided *corev1.Pod // the pod whose state decided the outcome
	defer func() { r.record(&op, decided, start, res, err) }()

	if err := op.validate(); err != nil {
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
	if v.reportProblem != nil {
		logger.Info("Pod report incomplete; using what is there", "problem", v.reportProblem.Error())
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
	} else {
		logger.Info("Pod succeeded", "files", sortedKeys(v.result.Files))
	}
	r.cleanup(ctx, pw, p)
	if v.failure != nil {
		return nil, v.failure
	}
	return v.result, nil
}

// createOrAdopt creates the pod or adopts the existing pod of the same
// operation. One that has finished is adopted, since its result is final (a
// driver restart may have come between its end and its cleanup). One that is
// being deleted is waited out and replaced, finished or not: the API server
// removes a finished pod at once when it is deleted (pav's pods have no
// finalizers), so a pod still there with a deletionTimestamp was deleted while
// it ran, and whatever it ends with (exit code 143, say) is its killing, not
// the operation's result.
func (r *Runner) createOrAdopt(ctx context.Context, pw *podWatch, pod *corev1.Pod, op *Operation) (*corev1.Pod, error) {
	logger := klog.FromContext(ctx)
	pods := r.cfg.Client.CoreV1().Pods(pod.Namespace)
	for range maxCreateAttempts {
		created, err := pods.Create(ctx, pod, metav1.CreateOptions{})
		if err == nil {
			pw.forget()
			logger.Info("Created pod")
			return created, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating %s pod %s/%s: %w", op.Phase, pod.Namespace, pod.Name, err)
		}
		// The API server's copy, not the informer's: the cache may not show yet
		// that the pod is being deleted.
		existing, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // deleted in between: create again
		}
		if err != nil {
			return nil, fmt.Errorf("getting existing %s pod %s/%s: %w", op.Phase, pod.Namespace, pod.Name, err)
		}
		if err := r.checkOwner(existing, op); err != nil {
			return nil, err
		}
		if existing.DeletionTimestamp != nil {
			logger.Info("Waiting for the operation's terminating pod to go away before re-creating it", "uid", existing.UID, "podPhase", existing.Status.Phase)
			if err := r.waitGone(ctx, pw, existing.UID); err != nil {
				return nil, err
			}
			continue
		}
		logger.Info("Adopting existing pod", "uid", existing.UID, "podPhase", existing.Status.Phase)
		return existing, nil
	}
	return nil, fmt.Errorf("%s pod %s/%s: gave up after %d attempts to create or adopt it (it keeps appearing and disappearing)",
		op.Phase, pod.Namespace, pod.Name, maxCreateAttempts)
}

// checkOwner refuses to adopt a pod that is not this operation's.
func (r *Runner) checkOwner(pod *corev1.Pod, op *Operation) error {
	l := pod.Labels
	ok := l[LabelProvisioner] == op.Provisioner && l[LabelPhase] == string(op.Phase) &&
		pod.Annotations[AnnotationVolumeKey] == op.VolumeKey
	if ok && op.NodeName != "" {
		ok = l[LabelNode] == NodeLabel(op.NodeName)
	}
	if ok {
		return nil
	}
	return fmt.Errorf("%w: pod %s/%s already exists and belongs to %s; refusing to adopt it for %s of volume %q (provisioner %q)",
		ErrForeignPod, pod.Namespace, pod.Name, describeOwner(pod), op.Phase, op.VolumeKey, op.Provisioner)
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

func finished(pod *corev1.Pod) bool {
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
	var reportC <-chan time.Time
	var reportTimer *time.Timer
	defer func() {
		if reportTimer != nil {
			reportTimer.Stop()
		}
	}()

	timedOut, reportExpired := false, false
	for {
		p := pw.cached()
		switch {
		case p != nil && p.UID == uid:
			v := evaluate(op, p, reportExpired, timedOut, r.cfg.PodTimeout)
			if v.done {
				return p, v, nil
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
			if last, _ := pw.lastState(uid); last != nil && finished(last) {
				if v := evaluate(op, last, true, timedOut, r.cfg.PodTimeout); v.done {
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
		fired, err := pw.next(ctx, timeoutC, reportC)
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

// waitGone waits until the pod with this UID is gone (or replaced).
func (r *Runner) waitGone(ctx context.Context, pw *podWatch, uid types.UID) error {
	askedAPI, seen := false, false
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
			got, err := r.cfg.Client.CoreV1().Pods(pw.ns).Get(ctx, pw.name, metav1.GetOptions{})
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
	if pod.UID != "" {
		uid := pod.UID
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := r.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, opts)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Gone already, or replaced by a pod that is not ours to delete.
		return nil
	}
	return err
}

// cleanup deletes a finished (or failed, or timed-out) pod and waits until the
// informer has seen it gone, bounded by DeleteWait. It goes on even if the
// caller's ctx is done: the outcome is known, and a pod left behind would be
// mistaken for the result of the next attempt.
func (r *Runner) cleanup(ctx context.Context, pw *podWatch, pod *corev1.Pod) {
	logger := klog.FromContext(ctx)
	bound := r.cfg.DeleteWait
	if bound <= 0 {
		grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
		if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
			grace = *g
		}
		bound = time.Duration(grace)*time.Second + defaultDeleteSlack
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	defer cancel()
	if err := r.deletePod(ctx, pod); err != nil {
		logger.Error(err, "Could not delete finished pod; a retry will adopt it")
		return
	}
	if err := r.waitGone(ctx, pw, pod.UID); err != nil {
		logger.Info("Pod not gone yet; a retry will wait for it", "bound", bound, "reason", err)
		return
	}
	logger.V(2).Info("Deleted pod")
}

// Delete deletes the operation's pod, if there is one, and waits (until ctx is
// done) for it to be gone. A pod of the same name that is not the operation's
// is left alone (ErrForeignPod).
func (r *Runner) Delete(ctx context.Context, op Operation) error {
	if err := op.validate(); err != nil {
		return err
	}
	if err := r.checkNode(&op); err != nil {
		return err
	}
	ns, name := op.Namespace(), op.PodName()
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(ns, name), "phase", op.Phase)
	ctx = klog.NewContext(ctx, logger)
	pw, err := r.watch(ns, name)
	if err != nil {
		return err
	}
	defer pw.close()
	p := pw.cached()
	if p == nil {
		p, err = r.cfg.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("getting %s pod %s/%s: %w", op.Phase, ns, name, err)
		}
	}
	if err := r.checkOwner(p, &op); err != nil {
		return err
	}
	logger.Info("Deleting pod", "uid", p.UID, "podPhase", p.Status.Phase)
	if err := r.deletePod(ctx, p); err != nil {
		return fmt.Errorf("deleting %s pod %s/%s: %w", op.Phase, ns, name, err)
	}
	if err := r.waitGone(ctx, pw, p.UID); err != nil {
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
	rc, err := r.cfg.Client.CoreV1().Pods(pod.Namespace).
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
	s := strings.TrimRight(string(b), "\n")
	if len(s) > logTailBytes {
		s = truncatedMark + tailRunes(s, logTailBytes)
	}
	return s
}

// record updates the metrics for one Run.
func (r *Runner) record(op *Operation, pod *corev1.Pod, start time.Time, res *Result, err error) {
	result := resultLabel(res, err)
	operationsTotal.WithLabelValues(string(op.Phase), result).Inc()
	if pod == nil {
		return
	}
	from := pod.CreationTimestamp.Time
	if from.IsZero() {
		from = start
	}
	if d := podEnd(pod, time.Now()).Sub(from); d >= 0 {
		podDuration.WithLabelValues(string(op.Phase)).Observe(d.Seconds())
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
