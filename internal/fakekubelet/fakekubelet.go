// Package fakekubelet is a tiny fake kubelet (and scheduler, and pod deletion
// logic of the API server) for tests that run pav pods against
// k8s.io/client-go/kubernetes/fake. It watches pods and drives each through a
// realistic lifecycle chosen by a pluggable Behaviour:
//
//	Pending (PodScheduled) → Running (containers and report sidecar running)
//	→ main containers terminated → report sidecar terminated with its message,
//	  phase Succeeded/Failed
//
// (a pod whose command pav-report wraps has no sidecar: its container ends
// with the message, and the pod with it).
//
// It keeps a real /pav directory per pod (the pod's hostPath, or a temporary
// directory standing in for the emptyDir), writes the Outcome's files there,
// and records the report's termination message by running the same encoder
// as pav-report on that directory, so a Runner sees exactly what it would see
// with a real kubelet.
//
// It also fills in what the fake clientset leaves out and the runner relies on:
// UIDs and creationTimestamps on create, UID preconditions and graceful
// deletion on delete (a running pod bound to a node gets a deletionTimestamp,
// its containers are stopped, then it is removed), pods/log, and watches that
// hand out copies and, after a list, do not miss the removals in between.
package fakekubelet

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/report"
	"github.com/pods-as-volumes/pav/podrunner"
)

// Kind is what a pod does.
type Kind int

const (
	// Succeed: every container exits 0 after RunFor.
	Succeed Kind = iota
	// Fail: the first regular container exits with ExitCode after RunFor.
	Fail
	// Run: the pod keeps running; with Ready it creates /pav/ready.
	Run
	// Unschedulable: the scheduler reports PodScheduled=False, reason Unschedulable.
	Unschedulable
	// ImagePullError: the first regular container waits with Reason (default ErrImagePull).
	ImagePullError
	// Hang: the pod is scheduled but stays Pending (say, a volume never mounts).
	Hang
	// ReportCrashLoop: the report sidecar cannot run (a report image without
	// the pav binary) and crash-loops; the pod stays Pending.
	ReportCrashLoop
	// StartError: the runtime cannot start the regular containers (an image
	// volume mounted noexec under a wrapped command, say): they terminate
	// with reason StartError and code 128, and the pod fails.
	StartError
)

// Outcome is what one pod does.
type Outcome struct {
	Kind Kind
	// ExitCode of the failing container (Fail); default 1.
	ExitCode int32
	// Ready (Run): the pod creates /pav/ready.
	Ready bool
	// Files are written into the pod's /pav directory when it starts running.
	Files map[string]string
	// Logs is the log of the pod's regular containers, served through pods/log.
	Logs string
	// Reason and Message: the waiting reason and message (ImagePullError), or
	// the PodScheduled condition message (Unschedulable).
	Reason, Message string
	// RunFor is how long the pod runs before finishing (Succeed, Fail).
	RunFor time.Duration
	// SchedulableAfter (Unschedulable): the pod is placed after this long
	// (other pods ended) and then succeeds; 0 = never placed.
	SchedulableAfter time.Duration
	// ReportLag, if set, publishes the terminal phase while the report sidecar
	// is still running, and its termination ReportLag later (as happens when an
	// init container fails). NoReport never records the sidecar's termination.
	ReportLag time.Duration
	NoReport  bool
}

// Behaviour decides each new pod's Outcome. It gets a copy of the pod.
type Behaviour func(pod *corev1.Pod) Outcome

// Options tune the fake kubelet; the zero value works.
type Options struct {
	// Node is where pods without spec.nodeName are "scheduled"; default "fake-node".
	Node string
	// Dir holds the /pav directories of pods without a hostPath; default: a
	// temporary directory (removed by Wait).
	Dir string
	// OnStart is called when a pod starts running, with its /pav directory on
	// the host, after the Outcome's files are written: a test can create files
	// there as the pod would (e.g. a staging pod's /pav/volume).
	OnStart func(pod *corev1.Pod, pavDir string) error
	// StopDelay is how long a gracefully deleted running pod's containers take
	// to exit (a real container handling SIGTERM): meanwhile the pod stays
	// Running with its deletionTimestamp.
	StopDelay time.Duration
	// DeletionDelay is how long a gracefully deleted pod stays Terminating
	// once its containers have exited (phase Failed, exit code 143).
	DeletionDelay time.Duration
	// StatusLag is how long after a wrapped node pod's command wrote its exit
	// code (/pav/.pav-exit) the pod's end is published: the real kubelet's
	// relist, up to its 1 s period.
	StatusLag time.Duration
	// PhaseLag is how long after a wrapped pod's containers ended (their
	// terminated states published, pav-report's message with them) the
	// pod's terminal phase is published: the real kubelet's publishes it
	// only once it has stopped the pod's sandbox.
	PhaseLag time.Duration
}

var (
	podsGVR = corev1.SchemeGroupVersion.WithResource("pods")
	podsGVK = corev1.SchemeGroupVersion.WithKind("Pod")
)

// Kubelet is the fake kubelet.
type Kubelet struct {
	client    *fake.Clientset
	tracker   k8stesting.ObjectTracker
	behaviour Behaviour
	opts      Options
	ownDir    bool

	mu   sync.Mutex // serializes every read-modify-write of a pod
	pods map[types.UID]*podState
	// gone holds the last state of every pod removed, in order (guarded by
	// mu, as are the removals and the lists of onList): a watch that follows
	// a list is told of those removed since (onWatch).
	gone []*corev1.Pod
	logs []logEntry
	wg   sync.WaitGroup
}

type podState struct {
	uid       types.UID
	ns, name  string
	deleted   chan struct{} // closed when a graceful deletion begins
	closeOnce sync.Once
}

func (s *podState) markDeleted() { s.closeOnce.Do(func() { close(s.deleted) }) }

type logEntry struct {
	ns, pod, container, text string
}

// New installs the fake kubelet's reactors on client (creates get a UID and a
// creationTimestamp, deletes are graceful, pods/log is served); call Start to
// begin driving pods.
func New(client *fake.Clientset, behaviour Behaviour, opts Options) *Kubelet {
	if opts.Node == "" {
		opts.Node = "fake-node"
	}
	k := &Kubelet{
		client:    client,
		tracker:   client.Tracker(),
		behaviour: behaviour,
		opts:      opts,
		pods:      map[types.UID]*podState{},
	}
	client.PrependReactor("create", "pods", k.onCreate)
	client.PrependReactor("delete", "pods", k.onDelete)
	client.PrependReactor("list", "pods", k.onList)
	client.PrependReactor("get", "pods", k.onGetLog)
	client.PrependWatchReactor("pods", k.onWatch)
	return k
}

// onList serves pod lists (but those with a field selector, which the tracker
// ignores: a test may serve them itself) from the tracker, under the lock of
// the removals, and appends to the list's resourceVersion how many pods were
// removed so far: "<tracker's resourceVersion>.<removals>" (onWatch).
func (k *Kubelet) onList(action k8stesting.Action) (bool, runtime.Object, error) {
	la, ok := action.(k8stesting.ListActionImpl)
	if !ok || la.GetSubresource() != "" {
		return false, nil, nil
	}
	if f := la.GetListRestrictions().Fields; f != nil && !f.Empty() {
		return false, nil, nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	obj, err := k.tracker.List(podsGVR, podsGVK, la.GetNamespace(), la.ListOptions)
	if err != nil {
		return true, nil, err
	}
	list := obj.(*corev1.PodList)
	list.ResourceVersion = fmt.Sprintf("%s.%d", list.ResourceVersion, len(k.gone))
	return true, list, nil
}

// onWatch serves pod watches from the tracker, as the fake clientset does, but
// with every event's object copied, and without losing a removal.
//
// The tracker sends a watch that starts after pods exist the very objects it
// stores, while an informer may change what it receives (pav's runner drops
// managedFields in a transform): a data race with the tracker's next read of
// the pod. A real API server decodes fresh objects for every watcher.
//
// A watch from the resourceVersion of a list (an informer's, after its initial
// list) gets from the tracker the pods added or changed since, but not those
// removed since: an informer would keep such a pod in its cache for ever (a
// runner restarted while its previous process's pod was being removed, say,
// would wait for that pod to go). A real API server sends their deletions; so
// does this watch, first, for the pods removed between the list (onList) and
// the watch.
func (k *Kubelet) onWatch(action k8stesting.Action) (bool, watch.Interface, error) {
	var opts metav1.ListOptions
	if wa, ok := action.(k8stesting.WatchActionImpl); ok {
		opts = wa.ListOptions
	}
	ns := action.GetNamespace()
	since := -1
	if rv, n, ok := strings.Cut(opts.ResourceVersion, "."); ok {
		i, err := strconv.Atoi(n)
		if err != nil {
			return true, nil, apierrors.NewBadRequest(fmt.Sprintf("invalid resourceVersion %q", opts.ResourceVersion))
		}
		opts.ResourceVersion, since = rv, i
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	w, err := k.tracker.Watch(podsGVR, ns, opts)
	if err != nil {
		return false, nil, err
	}
	var missed []watch.Event
	if since >= 0 && since <= len(k.gone) {
		for _, p := range k.gone[since:] {
			if ns == metav1.NamespaceAll || p.Namespace == ns {
				missed = append(missed, watch.Event{Type: watch.Deleted, Object: p.DeepCopy()})
			}
		}
	}
	return true, newCopyWatch(w, missed), nil
}

// copyWatch hands out first the missed events, then copies of the tracker
// watch's. Unlike watch.Filter, its goroutine ends when it is stopped, even
// with an event nobody receives.
type copyWatch struct {
	in   watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func newCopyWatch(in watch.Interface, missed []watch.Event) *copyWatch {
	w := &copyWatch{in: in, out: make(chan watch.Event), stop: make(chan struct{})}
	go w.loop(missed)
	return w
}

func (w *copyWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *copyWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.in.Stop()
	})
}

func (w *copyWatch) loop(missed []watch.Event) {
	defer close(w.out)
	send := func(e watch.Event) bool {
		select {
		case w.out <- e:
			return true
		case <-w.stop:
			return false
		}
	}
	for _, e := range missed {
		if !send(e) {
			return
		}
	}
	for e := range w.in.ResultChan() {
		if e.Object != nil {
			e.Object = e.Object.DeepCopyObject()
		}
		if !send(e) {
			return
		}
	}
}

// Start watches pods until ctx is done; it returns once its informer has synced.
func (k *Kubelet) Start(ctx context.Context) error {
	if k.opts.Dir == "" {
		d, err := os.MkdirTemp("", "fakekubelet-")
		if err != nil {
			return err
		}
		k.opts.Dir, k.ownDir = d, true
	}
	factory := informers.NewSharedInformerFactory(k.client, 0)
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			// A pod first seen while being deleted is never started (a
			// kubelet only tears such a pod down): a test that adds one
			// keeps the status it gave it.
			if pod, ok := obj.(*corev1.Pod); ok && pod.DeletionTimestamp == nil {
				k.startPod(ctx, pod)
			}
		},
		// A pod removed at once (unscheduled or finished) ends its goroutine.
		DeleteFunc: func(obj any) {
			if pod, ok := kube.Unwrap[*corev1.Pod](obj); ok {
				k.mu.Lock()
				st := k.pods[pod.UID]
				k.mu.Unlock()
				if st != nil {
					st.markDeleted()
				}
			}
		},
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("fake kubelet: informer did not sync")
	}
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		<-ctx.Done()
		factory.Shutdown()
	}()
	return nil
}

// Wait waits, after Start's ctx is done, until every pod goroutine has returned.
func (k *Kubelet) Wait() {
	k.wg.Wait()
	if k.ownDir {
		os.RemoveAll(k.opts.Dir)
	}
}

// onCreate fills in what the API server would: a UID and a creationTimestamp.
// It mutates the action's object and lets the tracker's reactor store it.
func (k *Kubelet) onCreate(action k8stesting.Action) (bool, runtime.Object, error) {
	ca, ok := action.(k8stesting.CreateAction)
	if !ok || ca.GetSubresource() != "" {
		return false, nil, nil
	}
	if pod, ok := ca.GetObject().(*corev1.Pod); ok {
		if pod.UID == "" {
			pod.UID = uuid.NewUUID()
		}
		if pod.CreationTimestamp.IsZero() {
			pod.CreationTimestamp = metav1.Now()
		}
	}
	return false, nil, nil
}

// onDelete does what the API server does on pod deletion: check the UID
// precondition; remove unscheduled or finished pods at once; give a running
// pod a deletionTimestamp and let its kubelet (us) stop and remove it.
func (k *Kubelet) onDelete(action k8stesting.Action) (bool, runtime.Object, error) {
	da, ok := action.(k8stesting.DeleteAction)
	if !ok || da.GetSubresource() != "" {
		return false, nil, nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	ns, name := da.GetNamespace(), da.GetName()
	obj, err := k.tracker.Get(podsGVR, ns, name)
	if err != nil {
		return true, nil, err
	}
	pod := obj.(*corev1.Pod)
	opts := da.GetDeleteOptions()
	if pre := opts.Preconditions; pre != nil && pre.UID != nil && *pre.UID != pod.UID {
		return true, nil, apierrors.NewConflict(podsGVR.GroupResource(), name,
			fmt.Errorf("the UID in the precondition (%s) does not match the UID in record (%s)", *pre.UID, pod.UID))
	}
	if pod.DeletionTimestamp != nil {
		return true, pod, nil
	}
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	if opts.GracePeriodSeconds != nil {
		grace = *opts.GracePeriodSeconds
	}
	st := k.pods[pod.UID]
	if st == nil || pod.Spec.NodeName == "" || grace == 0 ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		if err := k.tracker.Delete(podsGVR, ns, name); err != nil {
			return true, nil, err
		}
		k.gone = append(k.gone, pod)
		return true, nil, nil
	}
	now := metav1.Now()
	pod.DeletionTimestamp = &now
	pod.DeletionGracePeriodSeconds = &grace
	if err := k.tracker.Update(podsGVR, pod, ns); err != nil {
		return true, nil, err
	}
	st.markDeleted()
	return true, pod, nil
}

// onGetLog serves pods/log. The fake's log action carries no pod name, only
// the namespace and the options, so the log is that of the latest pod of the
// namespace with a container of that name: fine for tests that fail one pod
// at a time.
func (k *Kubelet) onGetLog(action k8stesting.Action) (bool, runtime.Object, error) {
	if action.GetSubresource() != "log" {
		return false, nil, nil
	}
	ga, ok := action.(k8stesting.GenericAction)
	if !ok {
		return false, nil, nil
	}
	opts, _ := ga.GetValue().(*corev1.PodLogOptions)
	container := ""
	if opts != nil {
		container = opts.Container
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := len(k.logs) - 1; i >= 0; i-- {
		e := k.logs[i]
		if e.ns == action.GetNamespace() && (container == "" || e.container == container) {
			text := e.text
			if opts != nil && opts.TailLines != nil {
				text = tailLines(text, int(*opts.TailLines))
			}
			return true, &runtime.Unknown{Raw: []byte(text)}, nil
		}
	}
	return true, nil, apierrors.NewBadRequest(fmt.Sprintf("container %q in namespace %q has no log", container, action.GetNamespace()))
}

func tailLines(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

func (k *Kubelet) startPod(ctx context.Context, pod *corev1.Pod) {
	k.mu.Lock()
	if _, ok := k.pods[pod.UID]; ok {
		k.mu.Unlock()
		return
	}
	st := &podState{uid: pod.UID, ns: pod.Namespace, name: pod.Name, deleted: make(chan struct{})}
	k.pods[pod.UID] = st
	k.mu.Unlock()
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		k.lifecycle(ctx, st, pod.DeepCopy())
	}()
}

// mutate applies f to the current pod under the kubelet lock (so that it
// never races with a deletion) and stores it. It reports false when the pod is
// gone or replaced.
func (k *Kubelet) mutate(st *podState, f func(p *corev1.Pod)) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	obj, err := k.tracker.Get(podsGVR, st.ns, st.name)
	if err != nil {
		return false
	}
	p := obj.(*corev1.Pod).DeepCopy()
	if p.UID != st.uid {
		return false
	}
	f(p)
	return k.tracker.Update(podsGVR, p, st.ns) == nil
}

// remove is the kubelet's final deletion of a terminated pod.
func (k *Kubelet) remove(st *podState) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if obj, err := k.tracker.Get(podsGVR, st.ns, st.name); err == nil && obj.(*corev1.Pod).UID == st.uid {
		if k.tracker.Delete(podsGVR, st.ns, st.name) == nil {
			k.gone = append(k.gone, obj.(*corev1.Pod))
		}
	}
	delete(k.pods, st.uid)
	// The emptyDir goes with the pod (a hostPath stays, as on a real node).
	if k.opts.Dir != "" {
		_ = os.RemoveAll(filepath.Join(k.opts.Dir, string(st.uid)))
	}
}

func (k *Kubelet) lifecycle(ctx context.Context, st *podState, pod *corev1.Pod) {
	out := k.behaviour(pod.DeepCopy())
	if out.Kind == Fail && out.ExitCode == 0 {
		out.ExitCode = 1
	}
	// wait blocks for d (forever if d < 0); it reports whether the pod is
	// being deleted, and false with ok=false if ctx ended.
	wait := func(d time.Duration) (deleted, ok bool) {
		var t <-chan time.Time
		if d >= 0 {
			timer := time.NewTimer(d)
			defer timer.Stop()
			t = timer.C
		}
		select {
		case <-ctx.Done():
			return false, false
		case <-st.deleted:
			return true, true
		case <-t:
			return false, true
		}
	}
	// pending: nothing ran; a deletion just removes the pod.
	pending := func() {
		if deleted, ok := wait(-1); ok && deleted {
			k.remove(st)
		}
	}

	if out.Kind == Unschedulable {
		msg := out.Message
		if msg == "" {
			msg = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod."
		}
		k.mutate(st, func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodPending
			setCondition(p, corev1.PodScheduled, corev1.ConditionFalse, corev1.PodReasonUnschedulable, msg)
		})
		if out.SchedulableAfter <= 0 {
			pending()
			return
		}
		if deleted, ok := wait(out.SchedulableAfter); !ok {
			return
		} else if deleted {
			k.remove(st)
			return
		}
		out.Kind = Succeed
	}

	// Scheduled: bound to a node, containers being created.
	if !k.mutate(st, func(p *corev1.Pod) {
		if p.Spec.NodeName == "" {
			p.Spec.NodeName = k.opts.Node
		}
		p.Status.Phase = corev1.PodPending
		p.Status.HostIP = "10.0.0.1"
		setCondition(p, corev1.PodScheduled, corev1.ConditionTrue, "", "")
		setCondition(p, corev1.PodInitialized, corev1.ConditionFalse, "ContainersNotInitialized", "")
		p.Status.InitContainerStatuses = statuses(p.Spec.InitContainers, waiting("PodInitializing", ""))
		p.Status.ContainerStatuses = statuses(p.Spec.Containers, waiting("PodInitializing", ""))
	}) {
		return
	}

	switch out.Kind {
	case ImagePullError:
		reason := out.Reason
		if reason == "" {
			reason = "ErrImagePull"
		}
		k.mutate(st, func(p *corev1.Pod) {
			t := true
			for i, c := range p.Spec.InitContainers {
				// The init containers ran: it is the main container whose image fails.
				s := &p.Status.InitContainerStatuses[i]
				if isSidecar(&c) {
					s.State, s.Started, s.Ready = running(), &t, c.ReadinessProbe == nil
				} else {
					s.State, s.Ready = terminated(0, "Completed", ""), true
				}
			}
			if len(p.Status.ContainerStatuses) > 0 {
				p.Status.ContainerStatuses[0].State = waiting(reason, out.Message)
			}
		})
		pending()
		return
	case Hang:
		pending()
		return
	case StartError:
		msg := out.Message
		if msg == "" {
			msg = `failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: "` +
				podrunner.ReportExecPath + `": permission denied`
		}
		k.mutate(st, func(p *corev1.Pod) {
			for i := range p.Status.ContainerStatuses {
				p.Status.ContainerStatuses[i].State = terminated(128, "StartError", msg)
			}
			p.Status.Phase = corev1.PodFailed
		})
		pending()
		return
	case ReportCrashLoop:
		k.mutate(st, func(p *corev1.Pod) {
			for i := range p.Status.InitContainerStatuses {
				s := &p.Status.InitContainerStatuses[i]
				if s.Name == podrunner.ReportContainer {
					s.State = waiting("CrashLoopBackOff", "back-off 10s restarting failed container="+s.Name)
					s.LastTerminationState = terminated(127, "Error", `exec: "pav": executable file not found in $PATH`)
					s.RestartCount = 1
				}
			}
		})
		pending()
		return
	}

	dir, err := k.pavDir(pod)
	if err == nil && dir != "" {
		for name, content := range out.Files {
			if werr := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); werr != nil {
				err = werr
			}
		}
		if out.Kind == Run && out.Ready {
			if werr := os.WriteFile(filepath.Join(dir, report.FileReady), nil, 0o644); werr != nil {
				err = werr
			}
		}
		if err == nil && k.opts.OnStart != nil {
			err = k.opts.OnStart(pod.DeepCopy(), dir)
		}
	}
	if err != nil {
		// The kubelet cannot set the pod up: like a failed volume mount.
		k.mutate(st, func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodFailed
			p.Status.Reason, p.Status.Message = "FakeKubeletError", err.Error()
		})
		pending()
		return
	}
	if out.Logs != "" {
		k.mu.Lock()
		for _, c := range pod.Spec.Containers {
			k.logs = append(k.logs, logEntry{pod.Namespace, pod.Name, c.Name, out.Logs})
		}
		k.mu.Unlock()
	}

	// Running: regular init containers completed, sidecars and containers running.
	started := metav1.Now()
	if !k.mutate(st, func(p *corev1.Pod) {
		p.Status.Phase = corev1.PodRunning
		p.Status.StartTime = &started
		p.Status.PodIP = "10.1.0.1"
		setCondition(p, corev1.PodInitialized, corev1.ConditionTrue, "", "")
		setCondition(p, corev1.ContainersReady, corev1.ConditionTrue, "", "")
		setCondition(p, corev1.PodReady, corev1.ConditionTrue, "", "")
		t := true
		for i, c := range p.Spec.InitContainers {
			s := &p.Status.InitContainerStatuses[i]
			if isSidecar(&c) {
				s.State, s.Started = running(), &t
				// Like a real probe: without one a running container is ready;
				// with one (the report's --check-ready) only once /pav/ready exists.
				s.Ready = c.ReadinessProbe == nil || fileExists(dir, report.FileReady)
			} else {
				s.State, s.Started, s.Ready = terminated(0, "Completed", ""), new(bool), true
			}
		}
		for i := range p.Status.ContainerStatuses {
			s := &p.Status.ContainerStatuses[i]
			s.State, s.Started, s.Ready = running(), &t, true
		}
	}) {
		return
	}

	var deleted, ok bool
	switch out.Kind {
	case Run:
		deleted, ok = wait(-1)
	default:
		deleted, ok = wait(out.RunFor)
	}
	if !ok {
		return
	}
	if deleted && k.opts.StopDelay > 0 {
		t := time.NewTimer(k.opts.StopDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}

	// The regular containers exit (or are killed by a deletion).
	code, reason := int32(0), "Completed"
	if out.Kind == Fail {
		code, reason = out.ExitCode, "Error"
	}
	if deleted {
		code, reason = 143, "Error"
	}
	phase := corev1.PodSucceeded
	if code != 0 {
		phase = corev1.PodFailed
	}
	// A wrapped node command's pav-report writes its exit code in /pav as
	// it ends; the kubelet publishes the end later.
	if dir != "" && wrapsNodeCommand(pod) {
		if err := report.WriteExit(filepath.Join(dir, report.FileExit), int(code)); err != nil {
			k.mutate(st, func(p *corev1.Pod) { p.Status.Reason, p.Status.Message = "FakeKubeletError", err.Error() })
		}
		if k.opts.StatusLag > 0 {
			if d, ok := wait(k.opts.StatusLag); !ok {
				return
			} else if d && !deleted {
				// Deleted in between: the kubelet publishes the end it found.
				deleted = true
			}
		}
	}
	// A wrapped command's pav-report writes the report as the container ends.
	wrapped, isWrapped := podrunner.Wrapped(pod)
	lagPhase := isWrapped && k.opts.PhaseLag > 0 && !deleted
	wrappedMsg := ""
	if isWrapped && dir != "" && !out.NoReport {
		wrappedMsg = kubeletTruncate(k.reportWithLogFiles(pod, wrapped, dir, execBudget(pod)), pod)
	}
	k.mutate(st, func(p *corev1.Pod) {
		for i := range p.Status.ContainerStatuses {
			s := &p.Status.ContainerStatuses[i]
			c := int32(0)
			r := "Completed"
			if i == 0 || deleted {
				c, r = code, reason
			}
			m := ""
			if isWrapped && s.Name == wrapped {
				m = wrappedMsg
			}
			s.State, s.Ready = terminated(c, r, m), false
		}
		setCondition(p, corev1.ContainersReady, corev1.ConditionFalse, "PodCompleted", "")
		setCondition(p, corev1.PodReady, corev1.ConditionFalse, "PodCompleted", "")
		if (out.ReportLag > 0 || out.NoReport || isWrapped) && !lagPhase {
			p.Status.Phase = phase
		}
	})
	if lagPhase {
		if d, ok := wait(k.opts.PhaseLag); !ok {
			return
		} else if d {
			deleted = true
		}
		k.mutate(st, func(p *corev1.Pod) { p.Status.Phase = phase })
	}

	if out.NoReport {
		if deleted {
			k.remove(st)
		} else {
			pending()
		}
		return
	}
	if out.ReportLag > 0 {
		if d, ok := wait(out.ReportLag); !ok {
			return
		} else if d {
			deleted = true
		}
	}
	// SIGTERM to the sidecars: the report writes its message and exits 0.
	msg := ""
	if dir != "" {
		msg = kubeletTruncate(k.reportWithLogFiles(pod, podrunner.ReportContainer, dir, reportBudget(pod)), pod)
	}
	k.mutate(st, func(p *corev1.Pod) {
		for i, c := range p.Spec.InitContainers {
			if isSidecar(&c) {
				s := &p.Status.InitContainerStatuses[i]
				m := ""
				if c.Name == podrunner.ReportContainer {
					m = msg
				}
				s.State, s.Ready = terminated(0, "Completed", m), false
			}
		}
		p.Status.Phase = phase
	})
	if deleted {
		// Terminating: the pod stays (with its deletionTimestamp) a while.
		t := time.NewTimer(k.opts.DeletionDelay)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
			k.remove(st)
		}
		return
	}
	pending() // a finished pod stays until it is deleted
}

// reportWithLogFiles is the report pav-report writes in container (the
// report sidecar, or the wrapped one): with the --log-file flags of its
// command, the files are printed to that container's log first.
func (k *Kubelet) reportWithLogFiles(pod *corev1.Pod, container, dir string, budget int) string {
	var files []string
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if c.Name != container {
				continue
			}
			for _, a := range c.Command {
				if a == "--" {
					break
				}
				if v, ok := strings.CutPrefix(a, "--log-file="); ok {
					files = append(files, v)
				}
			}
		}
	}
	if len(files) == 0 {
		return report.Message(dir, budget)
	}
	var log bytes.Buffer
	refs, problems := report.PrintLogFiles(dir, files, &log)
	k.mu.Lock()
	text := ""
	for i := len(k.logs) - 1; i >= 0; i-- {
		if e := k.logs[i]; e.ns == pod.Namespace && e.pod == pod.Name && e.container == container {
			text = e.text
			break
		}
	}
	k.logs = append(k.logs, logEntry{pod.Namespace, pod.Name, container, text + log.String()})
	k.mu.Unlock()
	return report.MessageWith(dir, budget, refs, problems)
}

// wrapsNodeCommand: pav-report wraps the pod's command and writes its exit
// code to /pav/.pav-exit (report.ExecNode): what BuildPod does for a wrapped
// pod whose /pav is a host directory.
func wrapsNodeCommand(pod *corev1.Pod) bool {
	if _, ok := podrunner.Wrapped(pod); !ok {
		return false
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == podrunner.VolumeName {
			return v.HostPath != nil
		}
	}
	return false
}

// pavDir is the pod's /pav directory on the "host": its hostPath, or a
// per-pod directory standing in for the emptyDir; "" when the pod has no pav volume.
func (k *Kubelet) pavDir(pod *corev1.Pod) (string, error) {
	for _, v := range pod.Spec.Volumes {
		if v.Name != podrunner.VolumeName {
			continue
		}
		dir := filepath.Join(k.opts.Dir, string(pod.UID))
		if v.HostPath != nil {
			dir = v.HostPath.Path
		}
		return dir, os.MkdirAll(dir, 0o755)
	}
	return "", nil
}

// reportBudget reads the report sidecar's budget from its environment, as Report does.
func reportBudget(pod *corev1.Pod) int {
	for _, c := range pod.Spec.InitContainers {
		if c.Name != podrunner.ReportContainer {
			continue
		}
		for _, e := range c.Env {
			if e.Name == "PAV_REPORT_MAX_BYTES" {
				if n, err := strconv.Atoi(e.Value); err == nil && n > 0 && n <= 4096 {
					return n
				}
			}
		}
	}
	return 4096
}

// execBudget reads a wrapped command's report budget from pav-report's
// --max-bytes, as report.Command does.
func execBudget(pod *corev1.Pod) int {
	name, _ := podrunner.Wrapped(pod)
	for _, c := range pod.Spec.Containers {
		if c.Name != name {
			continue
		}
		for _, a := range c.Command {
			if v, ok := strings.CutPrefix(a, "--max-bytes="); ok {
				if n, err := strconv.Atoi(v); err == nil && n > 0 && n <= 4096 {
					return n
				}
			}
			if a == "--" {
				break
			}
		}
	}
	return 4096
}

// kubeletTruncate cuts a termination message as the kubelet does: the last
// 4096 bytes of the file, then 12 KiB divided among the pod's containers (head kept).
func kubeletTruncate(msg string, pod *corev1.Pod) string {
	if len(msg) > 4096 {
		msg = msg[len(msg)-4096:]
	}
	n := len(pod.Spec.Containers) + len(pod.Spec.InitContainers) + len(pod.Spec.EphemeralContainers)
	if per := 12 * 1024 / max(n, 1); len(msg) > per {
		msg = msg[:per]
	}
	return msg
}

func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

func fileExists(dir, name string) bool {
	if dir == "" {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

func statuses(containers []corev1.Container, state corev1.ContainerState) []corev1.ContainerStatus {
	out := make([]corev1.ContainerStatus, 0, len(containers))
	for _, c := range containers {
		out = append(out, corev1.ContainerStatus{
			Name:    c.Name,
			Image:   c.Image,
			ImageID: "fake://" + c.Image,
			State:   state,
			Started: new(bool),
		})
	}
	return out
}

func waiting(reason, msg string) corev1.ContainerState {
	return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
}

func running() corev1.ContainerState {
	return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}
}

func terminated(code int32, reason, msg string) corev1.ContainerState {
	now := metav1.Now()
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: code, Reason: reason, Message: msg, StartedAt: now, FinishedAt: now,
		ContainerID: "fake://" + string(uuid.NewUUID()),
	}}
}

func setCondition(p *corev1.Pod, t corev1.PodConditionType, s corev1.ConditionStatus, reason, msg string) {
	now := metav1.Now()
	for i := range p.Status.Conditions {
		if c := &p.Status.Conditions[i]; c.Type == t {
			if c.Status != s {
				c.LastTransitionTime = now
			}
			c.Status, c.Reason, c.Message = s, reason, msg
			return
		}
	}
	p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
		Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: now,
	})
}
