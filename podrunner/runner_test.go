package podrunner_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2/ktesting"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
	"github.com/pods-as-volumes/pav/podrunner"
)

var registry = metrics.NewKubeRegistry()

func TestMain(m *testing.M) {
	// The fake clientset's watchers have fixed-size channels and panic when
	// one fills up; the concurrency test makes bursts of events.
	watch.DefaultChanSize = 10000
	podrunner.RegisterMetrics(registry)
	os.Exit(m.Run())
}

const provisioner = "hello"

type env struct {
	t        *testing.T
	ctx      context.Context
	client   *fake.Clientset
	kubelet  *fakekubelet.Kubelet
	runner   *podrunner.Runner
	cfg      podrunner.Config
	recorder *record.FakeRecorder
	creates  atomic.Int32 // pods actually created (not AlreadyExists attempts)
	runs     atomic.Int32 // pods the kubelet started
}

type envOpts struct {
	cfg     func(c *podrunner.Config)
	kubelet fakekubelet.Options
	objects []runtime.Object
}

func newEnv(t *testing.T, behaviour fakekubelet.Behaviour, o envOpts) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	e := &env{t: t, ctx: ctx, client: fake.NewClientset(o.objects...)}
	e.kubelet = fakekubelet.New(e.client, func(pod *corev1.Pod) fakekubelet.Outcome {
		e.runs.Add(1)
		return behaviour(pod)
	}, o.kubelet)
	// Count creates that succeed. Reactors run under the fake's lock, so
	// looking at the tracker here is race-free.
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca := a.(k8stesting.CreateAction)
		pod := ca.GetObject().(*corev1.Pod)
		if _, err := e.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), ca.GetNamespace(), pod.Name); apierrors.IsNotFound(err) {
			e.creates.Add(1)
		}
		return false, nil, nil
	})
	e.recorder = record.NewFakeRecorder(100)
	e.cfg = podrunner.Config{
		Client: kubetest.Wrap(e.client), Provisioner: provisioner, ReportImage: "registry/pav:test",
		ReportWait: 2 * time.Second, Recorder: e.recorder,
	}
	if o.cfg != nil {
		o.cfg(&e.cfg)
	}
	if o.kubelet.Dir == "" {
		o.kubelet.Dir = t.TempDir()
	}
	if err := e.kubelet.Start(ctx); err != nil {
		t.Fatal(err)
	}
	e.runner = e.newRunner()
	t.Cleanup(func() {
		cancel()
		e.kubelet.Wait()
	})
	return e
}

// newRunner starts another Runner on the same cluster: a driver restart.
func (e *env) newRunner() *podrunner.Runner {
	e.t.Helper()
	r := podrunner.New(e.cfg)
	if err := r.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	return r
}

func creationOp(key string) podrunner.Operation {
	return podrunner.Operation{
		Provisioner: provisioner, Phase: v1alpha1.PhaseCreation, VolumeKey: key, Token: podrunner.NewToken(),
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "main", Image: "busybox", Command: []string{"sh", "-c", "echo hi"}},
		}}},
	}
}

// recordUID makes op record its pod's UID the way a caller does (Created),
// counting the calls.
func recordUID(op *podrunner.Operation) *[]types.UID {
	var mu sync.Mutex
	calls := &[]types.UID{}
	op.Created = func(_ context.Context, uid types.UID) error {
		mu.Lock()
		defer mu.Unlock()
		*calls = append(*calls, uid)
		return nil
	}
	return calls
}

// remove deletes the operation's pod as a caller does once it has recorded the
// outcome, and checks that it is gone.
func (e *env) remove(op podrunner.Operation) {
	e.t.Helper()
	if err := e.runner.Delete(e.ctx, op); err != nil {
		e.t.Fatalf("Delete: %v", err)
	}
	e.assertGone(op)
}

// events drains the events recorded so far.
func (e *env) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.recorder.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

func stagingOp(key, node, hostPath string) podrunner.Operation {
	op := creationOp(key + "@" + node)
	op.Phase, op.NodeName, op.HostPath, op.KeepRunning = v1alpha1.PhaseStaging, node, hostPath, true
	t := true
	op.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &t}
	return op
}

func (e *env) getPod(op podrunner.Operation) (*corev1.Pod, error) {
	return e.client.CoreV1().Pods(e.runner.Namespace(op)).Get(context.Background(), op.PodName(), metav1.GetOptions{})
}

func (e *env) assertGone(op podrunner.Operation) {
	e.t.Helper()
	if p, err := e.getPod(op); !apierrors.IsNotFound(err) {
		e.t.Errorf("pod %s still there (phase %v, err %v)", op.PodName(), podPhase(p), err)
	}
}

func podPhase(p *corev1.Pod) corev1.PodPhase {
	if p == nil {
		return ""
	}
	return p.Status.Phase
}

// waitPod waits (through a watch) until the op's pod satisfies cond.
func (e *env) waitPod(op podrunner.Operation, cond func(p *corev1.Pod) bool) *corev1.Pod {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	w, err := e.client.CoreV1().Pods(e.runner.Namespace(op)).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	defer w.Stop()
	if p, err := e.getPod(op); err == nil && cond(p) {
		return p
	}
	for {
		select {
		case <-ctx.Done():
			e.t.Fatalf("pod %s never reached the expected state", op.PodName())
		case ev := <-w.ResultChan():
			if p, ok := ev.Object.(*corev1.Pod); ok && p.Name == op.PodName() && ev.Type != watch.Deleted && cond(p) {
				return p
			}
		}
	}
}

func reportDone(p *corev1.Pod) bool {
	for _, s := range p.Status.InitContainerStatuses {
		if s.Name == podrunner.ReportContainer && s.State.Terminated != nil {
			return true
		}
	}
	return false
}

func always(o fakekubelet.Outcome) fakekubelet.Behaviour {
	return func(*corev1.Pod) fakekubelet.Outcome { return o }
}

func mustFail(t *testing.T, err error) *podrunner.PodFailure {
	t.Helper()
	f, ok := podrunner.IsPodFailure(err)
	if !ok {
		t.Fatalf("want a PodFailure, got %v", err)
	}
	return f
}

func TestRunOutcomes(t *testing.T) {
	thirtyLines := ""
	for i := 1; i <= 30; i++ {
		thirtyLines += fmt.Sprintf("line %d\n", i)
	}
	cases := []struct {
		name    string
		outcome fakekubelet.Outcome
		cfg     func(c *podrunner.Config)
		check   func(t *testing.T, res *podrunner.Result, err error)
	}{
		{"success with files", fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": "vol-42", "capacity": "1Gi\n"}},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				if err != nil {
					t.Fatal(err)
				}
				if res.Running || res.Files["handle"] != "vol-42" || res.Files["capacity"] != "1Gi\n" || len(res.Files) != 2 {
					t.Errorf("result %+v", res)
				}
			}},
		{"success without files", fakekubelet.Outcome{Kind: fakekubelet.Succeed},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				if err != nil || len(res.Files) != 0 {
					t.Errorf("res %+v err %v", res, err)
				}
			}},
		{"failure with /pav/error", fakekubelet.Outcome{Kind: fakekubelet.Fail, ExitCode: 3, Files: map[string]string{"error": "disk quota exceeded\n"}, Logs: "noise\n"},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				f := mustFail(t, err)
				if f.PodPhase != corev1.PodFailed || f.Reason != "Error" || f.ExitCodes["main"] != 3 || len(f.ExitCodes) != 1 ||
					f.ErrorFile != "disk quota exceeded\n" || f.LogTail != "" {
					t.Errorf("failure %+v", f)
				}
				want := fmt.Sprintf(`creation pod pav/%s failed (phase Failed, reason Error): container "main" exited with code 3; /pav/error: disk quota exceeded`, f.Pod)
				if err.Error() != want {
					t.Errorf("got  %s\nwant %s", err, want)
				}
			}},
		{"failure with log tail", fakekubelet.Outcome{Kind: fakekubelet.Fail, ExitCode: 2, Logs: thirtyLines},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				f := mustFail(t, err)
				if !strings.HasPrefix(f.LogTail, "line 11\n") || !strings.HasSuffix(f.LogTail, "line 30") {
					t.Errorf("log tail %q", f.LogTail)
				}
				if !strings.Contains(err.Error(), `container "main" exited with code 2; log tail: line 11`) {
					t.Errorf("message %s", err)
				}
			}},
		{"long log tail is cut to ~2 KiB", fakekubelet.Outcome{Kind: fakekubelet.Fail, Logs: strings.Repeat(strings.Repeat("x", 500)+"\n", 20) + "last"},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				f := mustFail(t, err)
				if len(f.LogTail) > 2048+len("…") || !strings.HasSuffix(f.LogTail, "last") || !strings.HasPrefix(f.LogTail, "…") {
					t.Errorf("log tail of %d bytes", len(f.LogTail))
				}
			}},
		{"unschedulable", fakekubelet.Outcome{Kind: fakekubelet.Unschedulable, Message: "0/3 nodes are available: 3 Insufficient memory."},
			func(c *podrunner.Config) { c.UnschedulableGrace = -1 }, func(t *testing.T, res *podrunner.Result, err error) {
				f := mustFail(t, err)
				if f.Reason != podrunner.ReasonUnschedulable || f.PodPhase != corev1.PodPending || f.Message != "0/3 nodes are available: 3 Insufficient memory." {
					t.Errorf("failure %+v", f)
				}
			}},
		{"image pull error", fakekubelet.Outcome{Kind: fakekubelet.ImagePullError, Message: "manifest unknown"},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				f := mustFail(t, err)
				if f.Reason != "ErrImagePull" || !strings.Contains(f.Message, `container "main" (image busybox): manifest unknown`) {
					t.Errorf("failure %+v", f)
				}
			}},
		{"image pull backoff", fakekubelet.Outcome{Kind: fakekubelet.ImagePullError, Reason: "ImagePullBackOff"},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				if f := mustFail(t, err); f.Reason != "ImagePullBackOff" {
					t.Errorf("failure %+v", f)
				}
			}},
		{"create container config error", fakekubelet.Outcome{Kind: fakekubelet.ImagePullError, Reason: "CreateContainerConfigError", Message: `secret "x" not found`},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				if f := mustFail(t, err); f.Reason != "CreateContainerConfigError" {
					t.Errorf("failure %+v", f)
				}
			}},
		{"report sidecar crash-loops", fakekubelet.Outcome{Kind: fakekubelet.ReportCrashLoop},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				f := mustFail(t, err)
				if f.Reason != "CrashLoopBackOff" || !strings.Contains(f.Message, "report sidecar (image registry/pav:test) cannot run") ||
					!strings.Contains(f.Message, "executable file not found") {
					t.Errorf("failure %+v", f)
				}
			}},
		{"timeout while pending", fakekubelet.Outcome{Kind: fakekubelet.Hang},
			func(c *podrunner.Config) { c.PodTimeout = 300 * time.Millisecond },
			func(t *testing.T, res *podrunner.Result, err error) {
				f := mustFail(t, err)
				if f.Reason != podrunner.ReasonTimeout || f.PodPhase != corev1.PodPending || !strings.Contains(f.Message, "300ms") {
					t.Errorf("failure %+v", f)
				}
			}},
		{"timeout while running, with log tail", fakekubelet.Outcome{Kind: fakekubelet.Run, Logs: "still copying\n"},
			func(c *podrunner.Config) { c.PodTimeout = 300 * time.Millisecond },
			func(t *testing.T, res *podrunner.Result, err error) {
				f := mustFail(t, err)
				if f.Reason != podrunner.ReasonTimeout || f.PodPhase != corev1.PodRunning || f.LogTail != "still copying" {
					t.Errorf("failure %+v", f)
				}
			}},
		{"report lags the phase", fakekubelet.Outcome{Kind: fakekubelet.Succeed, ReportLag: 300 * time.Millisecond, Files: map[string]string{"handle": "late"}},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				if err != nil || res.Files["handle"] != "late" {
					t.Errorf("res %+v err %v", res, err)
				}
			}},
		{"report never comes: bounded wait, then success without files", fakekubelet.Outcome{Kind: fakekubelet.Succeed, NoReport: true, Files: map[string]string{"handle": "lost"}},
			func(c *podrunner.Config) { c.ReportWait = 200 * time.Millisecond },
			func(t *testing.T, res *podrunner.Result, err error) {
				if err != nil || len(res.Files) != 0 {
					t.Errorf("res %+v err %v", res, err)
				}
			}},
		{"report of a failed pod lags", fakekubelet.Outcome{Kind: fakekubelet.Fail, ReportLag: 200 * time.Millisecond, Files: map[string]string{"error": "boom"}},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				if f := mustFail(t, err); f.ErrorFile != "boom" {
					t.Errorf("failure %+v", f)
				}
			}},
		{"unusable report fails a succeeded pod", fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": strings.Repeat("h", 5000)}},
			nil, func(t *testing.T, res *podrunner.Result, err error) {
				f := mustFail(t, err)
				if f.Reason != podrunner.ReasonInvalidReport || !strings.Contains(f.Message, "too large") {
					t.Errorf("failure %+v", f)
				}
			}},
	}
	// The report sidecar's own cases: ReportExec wraps the command instead.
	sidecarOnly := map[string]bool{"report sidecar crash-loops": true, "report lags the phase": true,
		"report never comes: bounded wait, then success without files": true, "report of a failed pod lags": true}
	for _, mode := range []podrunner.ReportMode{podrunner.ReportSidecar, podrunner.ReportExec} {
		for _, c := range cases {
			if sidecarOnly[c.name] && mode != podrunner.ReportSidecar {
				continue
			}
			t.Run(string(mode)+"/"+c.name, func(t *testing.T) {
				e := newEnv(t, always(c.outcome), envOpts{cfg: func(cfg *podrunner.Config) {
					cfg.Report = mode
					if c.cfg != nil {
						c.cfg(cfg)
					}
				}})
				op := creationOp("pvc-" + strings.ReplaceAll(c.name, " ", "-"))
				if got := reportedBy(t, e.runner, op); got != mode {
					t.Fatalf("the pod reports by %s, want %s", got, mode)
				}
				runOutcome(t, e, op, c.outcome, c.check)
			})
		}
	}
}

// reportedBy is how the runner's pod for op reports: the sidecar, or
// pav-report wrapping its command.
func reportedBy(t *testing.T, r *podrunner.Runner, op podrunner.Operation) podrunner.ReportMode {
	t.Helper()
	pod, err := r.BuildPod(op)
	if err != nil {
		t.Fatal(err)
	}
	_, wrapped := podrunner.Wrapped(pod)
	sidecar := len(pod.Spec.InitContainers) > 0 && pod.Spec.InitContainers[0].Name == podrunner.ReportContainer
	switch {
	case wrapped && !sidecar:
		return podrunner.ReportExec
	case sidecar && !wrapped:
		return podrunner.ReportSidecar
	}
	t.Fatalf("the pod has the sidecar %v and a wrapped command %v", sidecar, wrapped)
	return ""
}

// runOutcome runs op once, checks its outcome and what Run must always do,
// and removes its pod.
func runOutcome(t *testing.T, e *env, op podrunner.Operation, outcome fakekubelet.Outcome,
	check func(t *testing.T, res *podrunner.Result, err error)) {
	t.Helper()
	uids := recordUID(&op)
	start := time.Now()
	res, err := e.runner.Run(e.ctx, op)
	check(t, res, err)
	if outcome.NoReport && time.Since(start) < 200*time.Millisecond {
		t.Error("did not wait for the report")
	}
	if n := e.creates.Load(); n != 1 {
		t.Errorf("%d pods created", n)
	}
	// The pod stays until the caller has recorded the outcome.
	p, gerr := e.getPod(op)
	if gerr != nil {
		t.Fatalf("the finished pod was removed by Run: %v", gerr)
	}
	if len(*uids) != 1 || (*uids)[0] != p.UID {
		t.Errorf("Created called with %v, want once with %s", *uids, p.UID)
	}
	if f, ok := podrunner.IsPodFailure(err); ok && f.UID != p.UID || res != nil && res.UID != p.UID {
		t.Errorf("the outcome does not name the pod's UID %s", p.UID)
	}
	op.UID = p.UID
	e.remove(op)
}

// A pod the scheduler cannot place yet (a full node) waits in its queue for
// the grace, counted from when it became unschedulable; one that stays so
// fails with the scheduler's message.
func TestUnschedulableGrace(t *testing.T) {
	for _, c := range []struct {
		name  string
		after time.Duration // placed after this long; 0 = never
		fail  bool
	}{
		{"placed within the grace", 100 * time.Millisecond, false},
		{"never placed", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Unschedulable, Message: "0/1 nodes are available: 1 Too many pods.",
				SchedulableAfter: c.after, Files: map[string]string{"handle": "h"}}),
				envOpts{cfg: func(cfg *podrunner.Config) { cfg.UnschedulableGrace = 400 * time.Millisecond }})
			start := time.Now()
			res, err := e.runner.Run(e.ctx, creationOp("pvc-full-node"))
			if !c.fail {
				if err != nil || res.Files["handle"] != "h" {
					t.Fatalf("res %+v err %v", res, err)
				}
				return
			}
			f := mustFail(t, err)
			if f.Reason != podrunner.ReasonUnschedulable || !strings.Contains(f.Message, "Too many pods") {
				t.Errorf("failure %+v", f)
			}
			if d := time.Since(start); d < 400*time.Millisecond {
				t.Errorf("failed after %s, within the grace", d)
			}
		})
	}
}

// A node whose runtime cannot start pav-report in the wrapped container (an
// image volume mounted noexec, say) fails that pod with the runtime's reason;
// the runner's next pods get the report sidecar.
func TestExecFallsBackAfterAStartError(t *testing.T) {
	e := newEnv(t, func(pod *corev1.Pod) fakekubelet.Outcome {
		if _, wrapped := podrunner.Wrapped(pod); wrapped {
			return fakekubelet.Outcome{Kind: fakekubelet.StartError}
		}
		return fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": "h"}}
	}, envOpts{cfg: func(c *podrunner.Config) { c.Report = podrunner.ReportExec }})

	op := creationOp("pvc-start-error")
	_, err := e.runner.Run(e.ctx, op)
	f := mustFail(t, err)
	if f.Reason != "StartError" || !strings.Contains(f.Message, "permission denied") || !strings.Contains(f.Message, "report sidecar instead") {
		t.Errorf("failure %+v", f)
	}
	if got := reportedBy(t, e.runner, op); got != podrunner.ReportSidecar {
		t.Fatalf("after a start error the pods report by %s", got)
	}
	again := creationOp("pvc-after")
	if res, err := e.runner.Run(e.ctx, again); err != nil || res.Files["handle"] != "h" {
		t.Fatalf("res %+v err %v", res, err)
	}
}

// An API server without image volumes (Kubernetes before 1.35, or the
// ImageVolume gate off) drops the volume's source and refuses the pod: the
// runner creates it again with the sidecar, within the same Run.
func TestExecFallsBackWhenTheAPIServerRefusesImageVolumes(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": "h"}}),
		envOpts{cfg: func(c *podrunner.Config) { c.Report = podrunner.ReportExec }})
	refused := 0
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		for i, v := range pod.Spec.Volumes {
			if v.Image != nil {
				refused++
				return true, nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), pod.Name, field.ErrorList{
					field.Required(field.NewPath("spec", "volumes").Index(i), "must specify a volume type")})
			}
		}
		return false, nil, nil
	})
	op := creationOp("pvc-refused")
	res, err := e.runner.Run(e.ctx, op)
	if err != nil || res.Files["handle"] != "h" {
		t.Fatalf("res %+v err %v", res, err)
	}
	if refused != 1 || e.creates.Load() != 1 {
		t.Errorf("%d pods refused, %d created; want 1 and 1", refused, e.creates.Load())
	}
	p, err := e.getPod(op)
	if err != nil {
		t.Fatal(err)
	}
	if _, wrapped := podrunner.Wrapped(p); wrapped || p.Spec.InitContainers[0].Name != podrunner.ReportContainer {
		t.Error("the pod created is not the sidecar's")
	}
}

func TestRunCancelLeavesPod(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Hang}), envOpts{})
	op := creationOp("pvc-cancel")
	ctx, cancel := context.WithTimeout(e.ctx, 200*time.Millisecond)
	defer cancel()
	_, err := e.runner.Run(ctx, op)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v", err)
	}
	if _, err := e.getPod(op); err != nil {
		t.Fatalf("pod gone after cancel: %v", err)
	}
}

func TestAdoptAfterRestart(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed, RunFor: 500 * time.Millisecond, Files: map[string]string{"handle": "h"}}), envOpts{})
	op := creationOp("pvc-restart")

	// The first driver gives up while the pod runs...
	ctx, cancel := context.WithCancel(e.ctx)
	go func() {
		e.waitPod(op, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		cancel()
	}()
	if _, err := e.runner.Run(ctx, op); !errors.Is(err, context.Canceled) {
		t.Fatalf("first run: %v", err)
	}
	// ... and a new one (new informer, nothing shared) picks it up.
	res, err := e.newRunner().Run(e.ctx, op)
	if err != nil || res.Files["handle"] != "h" {
		t.Fatalf("res %+v err %v", res, err)
	}
	if c, r := e.creates.Load(), e.runs.Load(); c != 1 || r != 1 {
		t.Errorf("%d pods created, %d run; want exactly one", c, r)
	}
	e.remove(op)
}

func TestAdoptFinishedPod(t *testing.T) {
	for _, c := range []struct {
		name    string
		outcome fakekubelet.Outcome
	}{
		{"succeeded", fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": "from-before"}}},
		{"failed", fakekubelet.Outcome{Kind: fakekubelet.Fail, ExitCode: 7, Files: map[string]string{"error": "from before"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, always(c.outcome), envOpts{})
			op := creationOp("pvc-finished")
			uids := recordUID(&op)
			// A driver recorded the token, created the pod, and died before it
			// recorded the pod's UID or saw it finish.
			pod, err := e.runner.BuildPod(op)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.client.CoreV1().Pods(pod.Namespace).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			e.waitPod(op, reportDone)

			res, err := e.newRunner().Run(e.ctx, op)
			if c.outcome.Kind == fakekubelet.Succeed {
				if err != nil || res.Files["handle"] != "from-before" {
					t.Fatalf("res %+v err %v", res, err)
				}
			} else if f := mustFail(t, err); f.ExitCodes["main"] != 7 || f.ErrorFile != "from before" {
				t.Fatalf("failure %+v", f)
			}
			if c, r := e.creates.Load(), e.runs.Load(); c != 1 || r != 1 {
				t.Errorf("%d pods created, %d run: the finished pod was re-run", c, r)
			}
			if len(*uids) != 1 {
				t.Errorf("Created called %d times for a pod adopted by its token, want 1", len(*uids))
			}
			e.remove(op)
		})
	}
}

// A pod of the operation that is being deleted is never adopted, whether its
// containers still run or were already killed: Run waits until it is gone and
// runs a new pod. (Adopting the killed pod took its exit code 143 for the
// operation's result; this test was flaky because under load Run met the pod
// in that state, or read it from an informer cache that did not show the
// deletion yet.)
func TestTerminatingPodIsWaitedOut(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kubelet fakekubelet.Options
		// terminating is the state the deleted pod is in when Run meets it;
		// nil: Run is already waiting on the pod when it is deleted.
		terminating func(p *corev1.Pod) bool
	}{
		{"met while its containers still run", fakekubelet.Options{StopDelay: 500 * time.Millisecond},
			func(p *corev1.Pod) bool { return p.DeletionTimestamp != nil && p.Status.Phase == corev1.PodRunning }},
		{"met once killed, not yet removed", fakekubelet.Options{DeletionDelay: 500 * time.Millisecond},
			func(p *corev1.Pod) bool { return p.DeletionTimestamp != nil && p.Status.Phase == corev1.PodFailed }},
		{"deleted while Run waits on it", fakekubelet.Options{StopDelay: 300 * time.Millisecond, DeletionDelay: 300 * time.Millisecond}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Run}), envOpts{kubelet: tc.kubelet})
			op := creationOp("pvc-terminating")
			pod, _ := e.runner.BuildPod(op)
			if _, err := e.client.CoreV1().Pods(pod.Namespace).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			old := e.waitPod(op, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
			done := make(chan error, 1)
			if tc.terminating == nil {
				go func() { _, err := e.runner.Run(e.ctx, op); done <- err }()
				time.Sleep(100 * time.Millisecond)
			}
			if err := e.client.CoreV1().Pods(pod.Namespace).Delete(e.ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if tc.terminating != nil {
				e.waitPod(op, tc.terminating)
				go func() { _, err := e.runner.Run(e.ctx, op); done <- err }()
			}
			// Our pod, deleted before it finished: its outcome is unknown
			// (exit code 143 is its killing). Run waits until it is gone, so
			// that the caller's retry with a new token does not meet it, and
			// says so; it never starts a second pod itself.
			if err := <-done; !errors.Is(err, podrunner.ErrPodDeleted) || !strings.Contains(err.Error(), string(old.UID)) {
				t.Fatalf("Run: %v, want ErrPodDeleted naming %s", err, old.UID)
			}
			e.assertGone(op)
			if n := e.creates.Load(); n != 1 {
				t.Errorf("%d creates, want 1", n)
			}
			// The retry, with a new token, runs the phase again.
			retry := creationOp("pvc-terminating")
			ctx, cancel := context.WithTimeout(e.ctx, 300*time.Millisecond)
			defer cancel()
			if _, err := e.runner.Run(ctx, retry); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("retry: %v", err)
			}
			if p, err := e.getPod(retry); err != nil || p.Annotations[podrunner.AnnotationToken] != retry.Token || p.UID == old.UID {
				t.Fatalf("retry's pod %v err %v", p, err)
			}
		})
	}
}

func TestAdoptByRecordedUID(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": "h"}}), envOpts{})
	op := creationOp("pvc-uid")
	uids := recordUID(&op)
	if _, err := e.runner.Run(e.ctx, op); err != nil {
		t.Fatal(err)
	}
	// A restarted driver knows the UID; whatever the token, the pod with that
	// UID is the one, and Created is not called again.
	later := creationOp("pvc-uid")
	later.UID = (*uids)[0]
	again := recordUID(&later)
	res, err := e.newRunner().Run(e.ctx, later)
	if err != nil || res.Files["handle"] != "h" || res.UID != later.UID {
		t.Fatalf("res %+v err %v", res, err)
	}
	if len(*again) != 0 || e.creates.Load() != 1 || e.runs.Load() != 1 {
		t.Errorf("Created %v, %d creates, %d runs", *again, e.creates.Load(), e.runs.Load())
	}
	e.remove(later)
	// The recorded pod is gone with its outcome unread: never re-created
	// under the old identity.
	if _, err := e.runner.Run(e.ctx, later); !errors.Is(err, podrunner.ErrPodDeleted) {
		t.Errorf("recorded pod gone: %v, want ErrPodDeleted", err)
	}
	if n := e.creates.Load(); n != 1 {
		t.Errorf("%d creates", n)
	}
}

func TestCreatedError(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": "h"}}), envOpts{})
	op := creationOp("pvc-record-fails")
	op.Created = func(context.Context, types.UID) error { return errors.New("etcd is down") }
	if _, err := e.runner.Run(e.ctx, op); err == nil || !strings.Contains(err.Error(), "etcd is down") {
		t.Fatalf("err %v", err)
	}
	// The pod is left for the retry, which adopts it by its token.
	uids := recordUID(&op)
	if res, err := e.runner.Run(e.ctx, op); err != nil || res.Files["handle"] != "h" {
		t.Fatalf("retry: res %+v err %v", res, err)
	}
	if len(*uids) != 1 || e.creates.Load() != 1 {
		t.Errorf("Created %v, %d creates", *uids, e.creates.Load())
	}
}

func TestIdentityRequired(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{}), envOpts{})
	op := creationOp("pvc-no-token")
	op.Token = ""
	if _, err := e.runner.Run(e.ctx, op); !errors.Is(err, podrunner.ErrInvalidOperation) || !strings.Contains(err.Error(), "no token") {
		t.Errorf("Run without a token: %v", err)
	}
	if err := e.runner.Delete(e.ctx, op); !errors.Is(err, podrunner.ErrInvalidOperation) {
		t.Errorf("Delete without token or UID: %v", err)
	}
	if n := e.creates.Load(); n != 0 {
		t.Errorf("%d creates", n)
	}
}

func TestForeignPodRefused(t *testing.T) {
	op := creationOp("pvc-foreign")
	name := op.PodName()
	ours := map[string]string{podrunner.LabelProvisioner: provisioner, podrunner.LabelPhase: "creation",
		podrunner.LabelVolume: podrunner.VolumeLabel("pvc-foreign")}
	cases := []struct {
		name   string
		labels map[string]string
		annot  map[string]string
		uid    types.UID // the UID the caller recorded, if any
		why    string
	}{
		{"not pav", map[string]string{"app": "x"}, nil, "", "someone else (it has no pav labels)"},
		{"other provisioner", map[string]string{podrunner.LabelProvisioner: "other", podrunner.LabelPhase: "creation"},
			map[string]string{podrunner.AnnotationVolumeKey: "pvc-foreign"}, "", `pav provisioner "other", phase "creation", volume key "pvc-foreign"`},
		{"other volume (hash collision)", ours, map[string]string{podrunner.AnnotationVolumeKey: "pvc-else", podrunner.AnnotationToken: op.Token}, "", `volume key "pvc-else"`},
		// A tenant who may create pods where the template puts them copies
		// pav's labels, annotations and report sidecar: without the token, it
		// is not pav's.
		{"pre-created with pav's labels, no token", ours, map[string]string{podrunner.AnnotationVolumeKey: "pvc-foreign"}, "",
			"does not carry the token"},
		{"pre-created with another token", ours, map[string]string{podrunner.AnnotationVolumeKey: "pvc-foreign", podrunner.AnnotationToken: "guess"}, "",
			"does not carry the token"},
		// A tenant who read the token off our pod, deleted it and re-created
		// it: the token matches, the recorded UID does not.
		{"re-created with the right token, other UID", ours, map[string]string{podrunner.AnnotationVolumeKey: "pvc-foreign", podrunner.AnnotationToken: op.Token},
			"uid-pav-recorded", "is not the UID uid-pav-recorded pav recorded"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			foreign := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podrunner.DefaultNamespace, Labels: c.labels, Annotations: c.annot, UID: "foreign-uid"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "nginx"}},
					InitContainers: []corev1.Container{{Name: podrunner.ReportContainer, Image: "fake-report"}}},
			}
			// Pods finish at once: a wrongly adopted pod fails the test fast.
			e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed}), envOpts{objects: []runtime.Object{foreign}})
			op := op
			op.UID = c.uid
			uids := recordUID(&op)
			_, err := e.runner.Run(e.ctx, op)
			if !errors.Is(err, podrunner.ErrForeignPod) || !strings.Contains(err.Error(), "pav/"+name) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("err %v", err)
			}
			evs := e.events()
			if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning ForeignPod pav provisioner hello refuses to use this pod for phase creation of volume pvc-foreign: pav did not create it") ||
				!strings.Contains(evs[0], c.why) {
				t.Errorf("events %q", evs)
			}
			// Delete never removes it either: the operation's own pod is gone.
			if err := e.runner.Delete(e.ctx, op); err != nil {
				t.Errorf("Delete: %v", err)
			}
			if p, err := e.getPod(op); err != nil || p.UID != "foreign-uid" {
				t.Errorf("foreign pod touched: %v %v", p, err)
			}
			if n := e.creates.Load(); n != 0 || len(*uids) != 0 {
				t.Errorf("%d creates, Created %v", n, *uids)
			}
		})
	}
}

// nodeModes are the runner's report modes as node pods see them: unwrapped,
// or wrapped by pav-report writing the exit code.
var nodeModes = []podrunner.ReportMode{podrunner.ReportSidecar, podrunner.ReportExec}

func TestKeepRunningAndDelete(t *testing.T) {
	for _, mode := range nodeModes {
		t.Run(string(mode), func(t *testing.T) { testKeepRunningAndDelete(t, mode) })
	}
}

func testKeepRunningAndDelete(t *testing.T, mode podrunner.ReportMode) {
	hostDir := filepath.Join(t.TempDir(), "vol-1")
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}), envOpts{
		cfg: func(c *podrunner.Config) { c.NodeName = "node-a"; c.Report = mode },
		kubelet: fakekubelet.Options{
			DeletionDelay: 300 * time.Millisecond,
			OnStart: func(pod *corev1.Pod, dir string) error {
				return os.Mkdir(filepath.Join(dir, "volume"), 0o755) // the staged volume
			},
		},
	})
	op := stagingOp("vol-1", "node-a", hostDir)
	op.EndAtExit = true // wrapped in the exec mode
	res, err := e.runner.Run(e.ctx, op)
	if err != nil || !res.Running {
		t.Fatalf("res %+v err %v", res, err)
	}
	p, err := e.getPod(op)
	if err != nil || p.Status.Phase != corev1.PodRunning || p.Spec.NodeName != "node-a" {
		t.Fatalf("pod %v err %v", podPhase(p), err)
	}
	for _, f := range []string{"ready", "volume"} {
		if _, err := os.Stat(filepath.Join(hostDir, f)); err != nil {
			t.Errorf("host dir: %v", err)
		}
	}
	// A retry (NodeStageVolume is retried) adopts the running pod at once.
	if res, err := e.newRunner().Run(e.ctx, op); err != nil || !res.Running {
		t.Fatalf("retry: res %+v err %v", res, err)
	}
	op.UID = p.UID

	start := time.Now()
	if err := e.runner.Delete(e.ctx, op); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 300*time.Millisecond {
		t.Errorf("Delete returned after %v, before the pod was gone", time.Since(start))
	}
	e.assertGone(op)
	if err := e.runner.Delete(e.ctx, op); err != nil {
		t.Errorf("deleting a missing pod: %v", err)
	}
	if n := e.creates.Load(); n != 1 {
		t.Errorf("%d creates", n)
	}
}

func TestKeepRunningNotReadyTimesOut(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: false}), envOpts{
		cfg: func(c *podrunner.Config) { c.NodeName = "node-a"; c.PodTimeout = 300 * time.Millisecond },
	})
	op := stagingOp("vol-2", "node-a", filepath.Join(t.TempDir(), "vol-2"))
	_, err := e.runner.Run(e.ctx, op)
	if f := mustFail(t, err); f.Reason != podrunner.ReasonTimeout || !strings.Contains(f.Message, "neither finished nor became ready") {
		t.Fatalf("failure %+v", f)
	}
	e.remove(op)
}

func TestKeepRunningPodThatCompletes(t *testing.T) {
	for _, mode := range nodeModes {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed}), envOpts{cfg: func(c *podrunner.Config) { c.NodeName = "node-a"; c.Report = mode }})
			op := stagingOp("vol-3", "node-a", filepath.Join(t.TempDir(), "vol-3"))
			op.EndAtExit = true // wrapped in the exec mode
			res, err := e.runner.Run(e.ctx, op)
			if err != nil || res.Running {
				t.Fatalf("res %+v err %v", res, err)
			}
			e.remove(op)
		})
	}
}

// A node pod whose caller discards it (EndAtExit) has its command wrapped,
// and has ended when its exit code is in /pav: a success is taken from there,
// before the kubelet publishes the pod's end (here an hour later), and its
// pod is discarded without waiting; a failure waits for the pod's status,
// which says why.
func TestWrappedNodePodEndsAtItsExitFile(t *testing.T) {
	wrappedNode := func(c *podrunner.Config) { c.NodeName = "node-a"; c.Report = podrunner.ReportExec }
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": "h-1"}}),
		envOpts{cfg: wrappedNode, kubelet: fakekubelet.Options{StatusLag: time.Hour}})
	hostDir := filepath.Join(t.TempDir(), "vol-5")
	op := stagingOp("vol-5", "node-a", hostDir)
	op.EndAtExit = true
	op = e.succeedsBeforeItsPhase(op, "the exit file")
	if p, err := e.getPod(op); err != nil || p.DeletionTimestamp == nil {
		t.Errorf("Discard: pod %v, err %v; want it being deleted", p, err)
	}
	e.remove(op) // waits until it is gone

	bad := stagingOp("bad", "node-a", filepath.Join(t.TempDir(), "bad"))
	bad.EndAtExit = true
	failsOnItsStatus(t, bad, envOpts{cfg: wrappedNode, kubelet: fakekubelet.Options{StatusLag: 300 * time.Millisecond}}, "the exit file")
}

// succeedsBeforeItsPhase runs a wrapped op whose pod reports handle h-1 and
// whose kubelet publishes the pod's end late: Run must return its success
// while the pod is still Running (from what, says how), and the pod is then
// discarded. It returns op with the pod's UID.
func (e *env) succeedsBeforeItsPhase(op podrunner.Operation, what string) podrunner.Operation {
	t := e.t
	t.Helper()
	if got := reportedBy(t, e.runner, op); got != podrunner.ReportExec {
		t.Fatalf("the pod is not wrapped (%s)", got)
	}
	uids := recordUID(&op)
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	res, err := e.runner.Run(ctx, op)
	if err != nil || res.Running || res.Files["handle"] != "h-1" {
		t.Fatalf("res %+v err %v", res, err)
	}
	p, err := e.getPod(op)
	if err != nil || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("the pod's end was published (%v, %v): %s was not what ended the wait", podPhase(p), err, what)
	}
	op.UID = (*uids)[0]
	if err := e.runner.Discard(e.ctx, op); err != nil {
		t.Fatal(err)
	}
	return op
}

// failsOnItsStatus runs op, whose pod fails (exit code 3, /pav/error "no
// backend") and whose kubelet publishes the pod's end late (o's StatusLag or
// PhaseLag): the failure must come from the pod's status, not earlier from
// what (the exit file, the container's end), and say why.
func failsOnItsStatus(t *testing.T, op podrunner.Operation, o envOpts, what string) {
	t.Helper()
	lag := max(o.kubelet.StatusLag, o.kubelet.PhaseLag)
	if lag <= 0 {
		t.Fatal("failsOnItsStatus needs a kubelet that publishes the pod's end late")
	}
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Fail, ExitCode: 3, Files: map[string]string{"error": "no backend"}}), o)
	start := time.Now()
	_, err := e.runner.Run(e.ctx, op)
	f := mustFail(t, err)
	if f.ExitCodes["main"] != 3 || f.ErrorFile != "no backend" || f.PodPhase != corev1.PodFailed {
		t.Errorf("failure %+v", f)
	}
	if time.Since(start) < lag {
		t.Errorf("a failure was taken from %s, without the pod's status", what)
	}
	e.remove(op)
}

// A wrapped controller-side pod has ended once its only container has, with
// pav-report's message: a success is taken then, before the kubelet publishes
// the terminal phase (here an hour later), and Delete removes the pod at once
// (grace 0: it runs nothing) instead of waiting for the kubelet. A pod that
// mounts a claim is deleted gracefully all the same, and a failure waits for
// the pod's status, which says why.
func TestWrappedControllerPodEndsWithItsContainer(t *testing.T) {
	exec := func(c *podrunner.Config) { c.Report = podrunner.ReportExec }
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": "h-1"}}),
		envOpts{cfg: exec, kubelet: fakekubelet.Options{PhaseLag: time.Hour, DeletionDelay: time.Hour}})
	for _, c := range []struct {
		name     string
		claim    bool
		wantGone bool
	}{
		{name: "no claim: removed at once", wantGone: true},
		{name: "a claim: deleted gracefully", claim: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			op := creationOp("pvc-" + strings.ReplaceAll(c.name[:4], " ", "-"))
			if c.claim {
				op.Template.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}
			}
			op = e.succeedsBeforeItsPhase(op, "the container's end")
			p, err := e.getPod(op)
			switch {
			case c.wantGone && !apierrors.IsNotFound(err):
				t.Errorf("pod %v (%v) after Discard; want it removed at once", podPhase(p), err)
			case !c.wantGone && (err != nil || p.DeletionTimestamp == nil):
				t.Errorf("pod %v (%v) after Discard; want it being deleted gracefully", p, err)
			}
		})
	}

	failsOnItsStatus(t, creationOp("bad"), envOpts{cfg: exec, kubelet: fakekubelet.Options{PhaseLag: 300 * time.Millisecond}}, "the container's end")
}

func TestNodeModeRefusesOtherNodes(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{}), envOpts{cfg: func(c *podrunner.Config) { c.NodeName = "node-a" }})
	op := stagingOp("vol-4", "node-b", "/tmp/x")
	if _, err := e.runner.Run(e.ctx, op); !errors.Is(err, podrunner.ErrInvalidOperation) {
		t.Errorf("Run: %v", err)
	}
	if err := e.runner.Delete(e.ctx, op); !errors.Is(err, podrunner.ErrInvalidOperation) {
		t.Errorf("Delete: %v", err)
	}
	other := creationOp("x")
	other.Provisioner = "other"
	if _, err := e.runner.Run(e.ctx, other); !errors.Is(err, podrunner.ErrInvalidOperation) {
		t.Errorf("other provisioner: %v", err)
	}
}

func TestNotStarted(t *testing.T) {
	r := podrunner.New(podrunner.Config{Client: kubetest.Wrap(fake.NewClientset()), Provisioner: provisioner, ReportImage: "img"})
	if _, err := r.Run(context.Background(), creationOp("k")); !errors.Is(err, podrunner.ErrNotStarted) {
		t.Errorf("err %v", err)
	}
	if err := podrunner.New(podrunner.Config{Client: kubetest.Wrap(fake.NewClientset()), Provisioner: "Bad Name", ReportImage: "img"}).Start(context.Background()); err == nil {
		t.Error("bad provisioner name accepted")
	}
}

func TestStoppedRunner(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Hang}), envOpts{})
	ctx, cancel := context.WithCancel(e.ctx)
	r := podrunner.New(e.cfg)
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { _, err := r.Run(e.ctx, creationOp("pvc-stop")); done <- err }()
	time.Sleep(100 * time.Millisecond)
	cancel()
	if err := <-done; !errors.Is(err, podrunner.ErrStopped) {
		t.Errorf("err %v", err)
	}
}

func TestPodDeletedByOthers(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Hang}), envOpts{})
	op := creationOp("pvc-deleted")
	go func() {
		e.waitPod(op, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
		_ = e.client.CoreV1().Pods(podrunner.DefaultNamespace).Delete(e.ctx, op.PodName(), metav1.DeleteOptions{})
	}()
	if _, err := e.runner.Run(e.ctx, op); !errors.Is(err, podrunner.ErrPodDeleted) {
		t.Fatalf("err %v", err)
	}
}

func TestConcurrentRuns(t *testing.T) {
	e := newEnv(t, func(pod *corev1.Pod) fakekubelet.Outcome {
		key := pod.Annotations[podrunner.AnnotationVolumeKey]
		var n int
		fmt.Sscanf(key, "pvc-%d", &n)
		if n%3 == 0 {
			return fakekubelet.Outcome{Kind: fakekubelet.Fail, ExitCode: int32(n + 1), Files: map[string]string{"error": key}}
		}
		return fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": "h-" + key}, RunFor: time.Duration(n%5) * 10 * time.Millisecond}
	}, envOpts{})

	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("pvc-%d", i)
			op := creationOp(key)
			res, err := e.runner.Run(e.ctx, op)
			defer func() {
				if err := e.runner.Delete(e.ctx, op); err != nil {
					errs <- fmt.Errorf("%s: Delete: %v", key, err)
				}
			}()
			switch {
			case i%3 == 0:
				if f, ok := podrunner.IsPodFailure(err); !ok || f.ErrorFile != key || f.ExitCodes["main"] != int32(i+1) {
					errs <- fmt.Errorf("%s: err %v", key, err)
				}
			case err != nil || res.Files["handle"] != "h-"+key:
				errs <- fmt.Errorf("%s: res %+v err %v", key, res, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	pods, err := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("%d pods left, err %v", len(pods.Items), err)
	}
	if c := e.creates.Load(); c != n {
		t.Errorf("%d creates for %d operations", c, n)
	}
}

func TestConcurrentRunsOfOneOperation(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed, RunFor: 300 * time.Millisecond, Files: map[string]string{"handle": "one"}}), envOpts{})
	op := creationOp("pvc-same")
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, err := e.runner.Run(e.ctx, op); err != nil || res.Files["handle"] != "one" {
				t.Errorf("res %+v err %v", res, err)
			}
		}()
	}
	wg.Wait()
	if c, r := e.creates.Load(), e.runs.Load(); c != 1 || r != 1 {
		t.Errorf("%d creates, %d runs for one operation", c, r)
	}
	e.remove(op)
}

func counter(t *testing.T, phase, result string) float64 {
	t.Helper()
	vals, err := testutil.GetCounterValuesFromGatherer(registry, "pav_pod_operations_total", map[string]string{"phase": phase}, "result")
	if err != nil {
		return 0 // not yet reported
	}
	return vals[result]
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, func(pod *corev1.Pod) fakekubelet.Outcome {
		if pod.Annotations[podrunner.AnnotationVolumeKey] == "bad" {
			return fakekubelet.Outcome{Kind: fakekubelet.Fail}
		}
		return fakekubelet.Outcome{Kind: fakekubelet.Succeed}
	}, envOpts{})
	op := creationOp("good")
	op.Phase = v1alpha1.PhaseDeletion // a phase no other test uses
	bad := op
	bad.VolumeKey = "bad"
	s0, f0 := counter(t, "deletion", podrunner.ResultSuccess), counter(t, "deletion", podrunner.ResultFailure)
	if _, err := e.runner.Run(e.ctx, op); err != nil {
		t.Fatal(err)
	}
	if _, err := e.runner.Run(e.ctx, bad); err == nil {
		t.Fatal("bad succeeded")
	}
	if s, f := counter(t, "deletion", podrunner.ResultSuccess), counter(t, "deletion", podrunner.ResultFailure); s != s0+1 || f != f0+1 {
		t.Errorf("success %v→%v, failure %v→%v", s0, s, f0, f)
	}
	// The same metrics can also go to the legacy registry the driver serves.
	podrunner.RegisterLegacyMetrics()
	podrunner.RegisterLegacyMetrics()
	if got, err := legacyregistry.DefaultGatherer.Gather(); err != nil || !hasFamily(got, "pav_pod_operations_total") ||
		!hasFamily(got, "pav_phase_duration_seconds") {
		t.Errorf("legacy registry: %v", err)
	}
}

// phaseSamples is the count and sum of pav_phase_duration_seconds for one
// phase and outcome of this package's provisioner.
func phaseSamples(t *testing.T, phase, outcome string) (uint64, float64) {
	t.Helper()
	h, err := testutil.GetHistogramVecFromGatherer(registry, "pav_phase_duration_seconds",
		map[string]string{"provisioner": provisioner, "phase": phase, "outcome": outcome})
	if err != nil {
		return 0, 0 // nothing observed yet
	}
	return h.GetAggregatedSampleCount(), h.GetAggregatedSampleSum()
}

// TestPhaseDuration: each operation's pod is observed once under its
// outcome, for as long as it took from its creation; an operation whose
// caller gave up first is not observed (its pod has no outcome yet).
func TestPhaseDuration(t *testing.T) {
	const phase = v1alpha1.PhaseSnapshotDeletion // a phase no other test uses
	outcomes := []string{podrunner.OutcomeSuccess, podrunner.OutcomeFailure, podrunner.OutcomeTimeout}
	for _, tc := range []struct {
		name    string
		kubelet fakekubelet.Outcome
		timeout time.Duration // the caller's, else none
		want    string        // the outcome observed; "" none
		minSum  float64
	}{
		{name: "success", kubelet: fakekubelet.Outcome{Kind: fakekubelet.Succeed}, want: podrunner.OutcomeSuccess},
		{name: "failure", kubelet: fakekubelet.Outcome{Kind: fakekubelet.Fail}, want: podrunner.OutcomeFailure},
		// The Runner's PodTimeout below: the pod's duration is at least that.
		{name: "timeout", kubelet: fakekubelet.Outcome{Kind: fakekubelet.Run}, want: podrunner.OutcomeTimeout, minSum: 0.3},
		{name: "caller gave up", kubelet: fakekubelet.Outcome{Kind: fakekubelet.Hang}, timeout: 100 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Only the timeout case has a short pod timeout: on a loaded machine the
			// others' pods could take 300 ms too, and count as timed out.
			podTimeout := time.Minute
			if tc.want == podrunner.OutcomeTimeout {
				podTimeout = 300 * time.Millisecond
			}
			e := newEnv(t, always(tc.kubelet), envOpts{cfg: func(c *podrunner.Config) { c.PodTimeout = podTimeout }})
			type samples struct {
				n   uint64
				sum float64
			}
			before := map[string]samples{}
			for _, o := range outcomes {
				n, sum := phaseSamples(t, string(phase), o)
				before[o] = samples{n, sum}
			}
			op := creationOp(tc.name)
			op.Phase = phase
			ctx := e.ctx
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			_, _ = e.runner.Run(ctx, op)
			for _, o := range outcomes {
				n, sum := phaseSamples(t, string(phase), o)
				var want uint64
				if o == tc.want {
					want = 1
				}
				if n-before[o].n != want {
					t.Errorf("outcome %s: %d observations, want %d", o, n-before[o].n, want)
				}
				if o == tc.want && sum-before[o].sum < tc.minSum {
					t.Errorf("outcome %s: observed %.3f s, want at least %.1f", o, sum-before[o].sum, tc.minSum)
				}
			}
		})
	}
}

func hasFamily(fams []*dto.MetricFamily, name string) bool {
	for _, f := range fams {
		if f.GetName() == name {
			return true
		}
	}
	return false
}

// TestPodEventsAndCache: a caller learns what happens to a pod between its
// operations (a KeepRunning pod deleted by someone) from the Runner's own
// informer, and reads the pod from its cache.
func TestPodEventsAndCache(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Run, Ready: true}), envOpts{
		cfg: func(c *podrunner.Config) { c.NodeName = "node-a" },
	})
	if _, err := podrunner.New(e.cfg).Cached("pav", "x"); !errors.Is(err, podrunner.ErrNotStarted) {
		t.Fatalf("Cached before Start: %v", err)
	}
	type event struct {
		uid     types.UID
		phase   corev1.PodPhase
		deleted bool
	}
	events := make(chan event, 100)
	e.runner.OnPodEvent(func(pod *corev1.Pod, deleted bool) {
		events <- event{pod.UID, pod.Status.Phase, deleted}
	})
	op := stagingOp("vol-ev", "node-a", filepath.Join(t.TempDir(), "vol-ev"))
	if _, err := e.runner.Run(e.ctx, op); err != nil {
		t.Fatal(err)
	}
	ns := e.runner.Namespace(op)
	p, err := e.runner.Cached(ns, op.PodName())
	if err != nil || p == nil || p.Status.Phase != corev1.PodRunning {
		t.Fatalf("Cached = %v, %v; want the running pod", podPhase(p), err)
	}
	uid := p.UID
	if p, err := e.runner.Cached(ns, "no-such-pod"); p != nil || err != nil {
		t.Fatalf("Cached of a missing pod = %v, %v", p, err)
	}
	// Someone else deletes it.
	if err := e.client.CoreV1().Pods(ns).Delete(e.ctx, op.PodName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-events:
			if ev.uid == uid && ev.deleted {
				if p, _ := e.runner.Cached(ns, op.PodName()); p != nil {
					t.Fatalf("the cache still has the pod after its delete event")
				}
				return
			}
		case <-timeout:
			t.Fatal("no delete event for the pod")
		}
	}
}

// A pod's /pav/blocks, larger than any termination message, comes back
// through its reporting container's log, in either report mode, the command's
// own output around it; a copy the log does not hold fails the pod.
func TestLogFiles(t *testing.T) {
	blocks := strings.Repeat("1048576 4096\n", 20000) // 260 KB
	for _, mode := range []podrunner.ReportMode{podrunner.ReportSidecar, podrunner.ReportExec} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"blocks": blocks}, Logs: "listing\n"}),
				envOpts{cfg: func(c *podrunner.Config) { c.Report = mode }})
			op := creationOp("blocks-" + string(mode))
			op.Phase = v1alpha1.PhaseSnapshotMetadata
			op.LogFiles = []string{"blocks"}
			if pod, err := e.runner.BuildPod(op); err != nil {
				t.Fatal(err)
			} else if got := reportedBy(t, e.runner, op); got != mode {
				t.Fatalf("the pod %s reports by %s", pod.Name, got)
			}
			res, err := e.runner.Run(e.ctx, op)
			if err != nil {
				t.Fatal(err)
			}
			if res.Files["blocks"] != blocks {
				t.Errorf("blocks: %d bytes, want %d", len(res.Files["blocks"]), len(blocks))
			}
			if _, ok := res.Files["log:blocks"]; ok {
				t.Errorf("the reference is left in the files: %v", res.Files["log:blocks"])
			}
		})
	}
	t.Run("no file: nothing", func(t *testing.T) {
		e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed}), envOpts{})
		op := creationOp("no-blocks")
		op.LogFiles = []string{"blocks"}
		res, err := e.runner.Run(e.ctx, op)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := res.Files["blocks"]; ok {
			t.Errorf("files %v", res.Files)
		}
	})
	t.Run("too large: the pod fails", func(t *testing.T) {
		e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"blocks": strings.Repeat("0 1\n", 1<<20+1)}}), envOpts{})
		op := creationOp("big-blocks")
		op.LogFiles = []string{"blocks"}
		_, err := e.runner.Run(e.ctx, op)
		f := mustFail(t, err)
		if f.Reason != podrunner.ReasonInvalidReport || !strings.Contains(f.Message, "larger than the 4194304 bytes") {
			t.Errorf("failure %+v", f)
		}
	})
	t.Run("node pods read /pav on the host", func(t *testing.T) {
		op := creationOp("node")
		op.NodeName, op.HostPath, op.LogFiles = "n1", "/var/lib/x", []string{"blocks"}
		if _, err := podrunner.BuildPod(op, podrunner.PodConfig{ReportImage: "x"}); err == nil || !errors.Is(err, podrunner.ErrInvalidOperation) {
			t.Errorf("error %v", err)
		}
	})
}

// A wrapped controller-side pod whose end the node plugin of its node relays
// (AnnotationEnded, internal/endrelay) succeeds with the relayed report before
// the kubelet says anything, and is then removed at once; but only in the
// driver's own namespace, where tenants cannot write pods, and only with a
// report that can be read.
func TestRelayedEnd(t *testing.T) {
	e := newEnv(t, always(fakekubelet.Outcome{Kind: fakekubelet.Hang}), envOpts{cfg: func(c *podrunner.Config) {
		c.Report, c.DefaultNamespace = podrunner.ReportExec, "pav"
	}, kubelet: fakekubelet.Options{DeletionDelay: time.Hour}})
	relay := func(op podrunner.Operation, msg string) {
		p := e.waitPod(op, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, podrunner.AnnotationEnded, msg)
		if _, err := e.client.CoreV1().Pods(p.Namespace).Patch(e.ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Error(err)
		}
	}
	for _, c := range []struct {
		name      string
		namespace string // the template's
		msg       string
		want      string // the handle; "" = not taken
	}{
		{name: "in pav's namespace", msg: `{"handle":"relayed"}`, want: "relayed"},
		{name: "in a tenant's namespace", namespace: "tenant", msg: `{"handle":"forged"}`},
		{name: "an unreadable report", msg: `{"handle":`},
		{name: "a report with a problem", msg: `{"reportProblem":"handle too large"}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			op := creationOp("pvc-relay-" + strings.ReplaceAll(c.name, " ", "-")[:12])
			op.Template.Namespace = c.namespace
			ctx, cancel := context.WithTimeout(e.ctx, time.Second)
			defer cancel()
			go relay(op, c.msg)
			res, err := e.runner.Run(ctx, op)
			switch {
			case c.want == "" && err == nil:
				t.Fatalf("Run took the relayed end: %+v", res)
			case c.want == "" && !errors.Is(err, context.DeadlineExceeded):
				t.Fatalf("Run: %v; want it still waiting for the pod", err)
			case c.want == "":
				return
			case err != nil:
				t.Fatalf("Run: %v", err)
			case res.Files["handle"] != c.want:
				t.Fatalf("files %v, want handle %s", res.Files, c.want)
			}
			// The kubelet never said the pod ended: a graceful deletion
			// would wait for it (an hour, here).
			if err := e.runner.Discard(e.ctx, op); err != nil {
				t.Fatal(err)
			}
			e.assertGone(op)
		})
	}
}
