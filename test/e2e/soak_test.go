//go:build e2e

package e2e

// The soak (issue 26): many volume lifecycles of pav-e2e, interleaved at random, while a
// fault injector kills pav's controller plugin, a node plugin or the manager, restarts a
// kubelet, takes the API server down, and deletes pav's phase pods, at random moments.
// Every scripted fault of faults_test.go and nodefaults_test.go holds alone; this is
// whether they hold together, under load. It runs only with PAV_SOAK=1 (make soak; make
// e2e runs a smoke form); the settings are SOAK_* (soakSettingsFromEnv).
//
// The invariants, checked as each lifecycle ends and again once all have:
//   - each phase's pod ran exactly once per volume (pav-e2e's pods count their runs on
//     the node they ran on), or once more for each pod of the phase the injector
//     deleted: pav cannot know whether a pod deleted mid-run did its work, so it runs
//     the phase again (PodLost) — and a lost staging or creation may be undone, once
//     more, by its unstaging or deletion;
//   - every client read back exactly what it wrote, and the volume its claim's staging
//     made, never another's;
//   - nothing is left: no PV, PavVolume, phase pod, mount, loop device or node state
//     directory, on any node;
//   - each claim is bound to the volume made for it: its PV, its handle, its record.
// A violation is recorded, not fatal: the test goes on and fails at the end, listing
// them all, with the seed that replays the run.

import (
	"context"
	"crypto/md5"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/nodeserver"
	"github.com/pods-as-volumes/pav/podrunner"
)

// soakStep bounds each step of a lifecycle (and each fault's recovery): long enough for an
// API-server outage, a kubelet restart and a controller plugin's restart in a row on two
// busy cores; a step that takes longer is a violation (something is stuck).
const soakStep = 5 * time.Minute

type soakSettings struct {
	lifecycles, concurrency int
	seed                    int64
	faults                  []string
}

// soakFaultKinds are the faults the injector knows, by SOAK_FAULTS name, in the order
// their kind is drawn from (so a seed means the same faults whatever SOAK_FAULTS
// enables, among those it does).
var soakFaultKinds = []struct {
	name   string
	inject func(s *soak, ctx context.Context, f soakFaultPlan) (string, error)
}{
	{"controller", (*soak).killControllerPlugin},
	{"node", (*soak).killNodePlugin},
	{"manager", (*soak).killManagerPod},
	{"kubelet", (*soak).restartKubelet},
	{"apiserver", (*soak).apiServerOutage},
	{"phasepod", (*soak).deletePhasePod},
}

func soakSettingsFromEnv(t *testing.T) soakSettings {
	t.Helper()
	s := soakSettings{lifecycles: 200, concurrency: 4, seed: time.Now().UnixNano()}
	for _, v := range []struct {
		env string
		dst *int
	}{{"SOAK_LIFECYCLES", &s.lifecycles}, {"SOAK_CONCURRENCY", &s.concurrency}} {
		if x := os.Getenv(v.env); x != "" {
			n, err := strconv.Atoi(x)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive number", v.env, x)
			}
			*v.dst = n
		}
	}
	if x := os.Getenv("SOAK_SEED"); x != "" {
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: want a number", x)
		}
		s.seed = n
	}
	x := os.Getenv("SOAK_FAULTS")
	if x == "" {
		for _, k := range soakFaultKinds {
			s.faults = append(s.faults, k.name)
		}
		return s
	}
	if x == "none" {
		return s
	}
	for _, f := range strings.Split(x, ",") {
		f = strings.TrimSpace(f)
		known := false
		for _, k := range soakFaultKinds {
			known = known || k.name == f
		}
		if !known {
			t.Fatalf("SOAK_FAULTS: unknown fault %q (know: controller, node, manager, kubelet, apiserver, phasepod; or none)", f)
		}
		s.faults = append(s.faults, f)
	}
	return s
}

// soakLifecyclePlan is what the seed decides of one lifecycle.
type soakLifecyclePlan struct {
	node        int  // index into the cluster's nodes, of the client's node
	slow        bool // the StorageClass whose pods sleep: wider windows for faults mid-phase
	clientEarly bool // the client is created with the claim, before it is bound
	pattern     string
	pauses      [4]time.Duration // before the claim, the client, its deletion, the claim's
}

// soakFaultPlan is what the seed decides of one fault; target picks among what is there
// when it strikes (a node, a phase pod).
type soakFaultPlan struct {
	gap    time.Duration // after the previous fault's recovery
	kind   string
	down   time.Duration // the API server's outage
	target uint64
}

type soakVolume struct {
	id          int
	claim, node string
	handle, pv  string // pv: also the CSI volume name, pvc-<claim uid>
	uid         types.UID
	deleted     map[string]int // phase → pods of it the injector deleted (or caught starting: strikeStarting)
	gone        bool           // its PV went
	done        bool           // the lifecycle ran to its end
}

type soakOp struct {
	kind       string
	start, end time.Time
}

type soakFault struct {
	kind, what string
	start, end time.Time
}

type soak struct {
	e       *env
	t       *testing.T
	set     soakSettings
	nodes   []string
	classes [2]string // quick, slow

	mu         sync.Mutex
	violations []string
	seen       map[string]bool
	faults     []soakFault
	ops        []soakOp
	vols       []*soakVolume
	byKey      map[string]*soakVolume // pv name and handle → volume
}

// TestSoak is the soak (see the top of this file). It needs PAV_SOAK=1.
func TestSoak(t *testing.T) {
	if os.Getenv("PAV_SOAK") != "1" {
		t.Skip("the soak runs with PAV_SOAK=1 (make soak)")
	}
	set := soakSettingsFromEnv(t)
	t.Logf("soak: seed %d (SOAK_SEED=%d replays this schedule), %d lifecycles, %d at once, faults %v",
		set.seed, set.seed, set.lifecycles, set.concurrency, set.faults)
	nodes := clusterNodes(t, 1)
	d := 6 * time.Hour
	if dl, ok := t.Deadline(); ok {
		d = time.Until(dl) - 2*time.Minute
	}
	e := newLongEnv(t, d)
	s := &soak{e: e, t: t, set: set, nodes: nodes, seen: map[string]bool{}, byKey: map[string]*soakVolume{}}
	s.classes[0] = e.storageClass(nil, corev1.PersistentVolumeReclaimDelete)
	s.classes[1] = e.storageClass(map[string]string{"createSleep": "3", "deleteSleep": "3", "unstageSleep": "3"}, corev1.PersistentVolumeReclaimDelete)
	e.waitDriverOnNodes(driver, nodes)
	t.Logf("soak: nodes %v, namespace %s", nodes, e.ns)

	// Two streams of the seed: the lifecycles' plans all drawn up front, the faults' one
	// by one by the injector alone, so that neither depends on timing.
	lrng := rand.New(rand.NewSource(set.seed))
	plans := make([]soakLifecyclePlan, set.lifecycles)
	for i := range plans {
		p := &plans[i]
		p.node = lrng.Intn(len(nodes))
		p.slow = lrng.Intn(3) == 0
		p.clientEarly = lrng.Intn(3) == 0
		b := make([]byte, 16)
		lrng.Read(b)
		p.pattern = fmt.Sprintf("soak-%d-%d-%x", set.seed, i, b)
		for j := range p.pauses {
			p.pauses[j] = time.Duration(lrng.Int63n(int64(3 * time.Second)))
		}
	}

	start := time.Now()
	injCtx, stopInjector := context.WithCancel(e.ctx)
	injDone := make(chan struct{})
	go func() {
		defer close(injDone)
		s.injector(injCtx, rand.New(rand.NewSource(set.seed^0x5eed)))
	}()
	ids := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < set.concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				s.lifecycle(e.ctx, id, plans[id])
			}
		}()
	}
	for id := range plans {
		ids <- id
	}
	close(ids)
	wg.Wait()
	stopInjector()
	<-injDone
	t.Logf("soak: lifecycles done in %v; final checks", time.Since(start).Round(time.Second))

	s.finalChecks(e.ctx)
	s.report(time.Since(start))
	if len(s.violations) > 0 {
		t.Errorf("%d violations (replay with SOAK_SEED=%d):\n%s", len(s.violations), set.seed, strings.Join(s.violations, "\n"))
	}
}

// violate records a violation once (the final checks repeat the ones made during the run).
func (s *soak) violate(v *soakVolume, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if v != nil {
		msg = fmt.Sprintf("lifecycle %d (claim %s, node %s, PV %s): %s", v.id, v.claim, v.node, v.pv, msg)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[msg] {
		return
	}
	s.seen[msg] = true
	s.violations = append(s.violations, msg)
	s.t.Logf("soak: VIOLATION %s", msg)
}

func (s *soak) op(kind string, start time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops = append(s.ops, soakOp{kind, start, time.Now()})
}

// errFinal marks a condition's error that waiting will not change (a client pod failed).
var errFinal = errors.New("final")

// transient tells whether an error may go away by itself: no answer at all (the API
// server is down or restarting), an answer that says try again, or a condition not met
// yet; not an API refusal, nor one marked errFinal.
func transient(err error) bool {
	if errors.Is(err, errFinal) {
		return false
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	c := st.Status().Code
	// A 404 that names no object is the API server's own "could not find the requested
	// resource", while it starts and has not installed its routes yet; an object not
	// found names it (details).
	routesNotYet := c == 404 && st.Status().Details == nil
	return c >= 500 || c == 429 || routesNotYet || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
}

// apiCreate is apiRetry of a create: an object already there (made by an earlier try whose
// answer was lost in an API-server outage) is the one wanted.
func apiCreate(ctx context.Context, create func(context.Context) error) error {
	return apiRetry(ctx, func(ctx context.Context) error {
		if err := create(ctx); !apierrors.IsAlreadyExists(err) {
			return err
		}
		return nil
	})
}

// apiRetry runs call until it succeeds, fails for good, or a step's time is up: the
// injector takes the API server down, and the soak's own requests must outlive that.
func apiRetry(ctx context.Context, call func(context.Context) error) error {
	return until(ctx, soakStep, func(ctx context.Context) (bool, error) {
		err := call(ctx)
		return err == nil, err
	})
}

// until polls cond every second for at most within. A transient error from cond is
// retried, and is what is returned when time is up; any other ends the wait at once.
func until(ctx context.Context, within time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var last error
	final := false
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		last = err
		if err != nil && !transient(err) {
			final = true
			return false, err
		}
		return ok, nil
	})
	switch {
	case final:
		return last
	case err != nil && last != nil:
		return fmt.Errorf("still after %v: %w", within, last)
	}
	return err
}

func soakPause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// soakData is the bulk of what a client writes: 1024 lines naming its pattern.
func soakData(pattern string) (script, sum string) {
	var b strings.Builder
	for i := 0; i < 1024; i++ {
		fmt.Fprintf(&b, "%s %d\n", pattern, i)
	}
	return fmt.Sprintf(`i=0; while [ $i -lt 1024 ]; do echo "%s $i"; i=$((i+1)); done`, pattern), fmt.Sprintf("%x", md5.Sum([]byte(b.String())))
}

// lifecycle runs one volume's life: claim, client writing and reading, client gone
// (unstaging), claim gone (deletion); then checks what it may while the soak goes on.
func (s *soak) lifecycle(ctx context.Context, id int, p soakLifecyclePlan) {
	e := s.e
	v := &soakVolume{id: id, claim: fmt.Sprintf("l%03d", id), node: s.nodes[p.node], deleted: map[string]int{}}
	v.handle = "e2e-" + e.ns + "-" + v.claim // what pav-e2e's creation pod reports
	pod := "c-" + v.claim
	soakPause(ctx, p.pauses[0])

	sc := s.classes[0]
	if p.slow {
		sc = s.classes[1]
	}
	created := time.Now()
	pvc := e.soakClaim(v.claim, sc)
	if err := apiCreate(ctx, func(ctx context.Context) error {
		_, err := client.CoreV1().PersistentVolumeClaims(e.ns).Create(ctx, pvc, metav1.CreateOptions{})
		return err
	}); err != nil {
		s.violate(v, "creating the claim: %v", err)
		return
	}
	if err := apiRetry(ctx, func(ctx context.Context) error {
		got, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, v.claim, metav1.GetOptions{})
		if err == nil {
			v.uid = got.UID
		}
		return err
	}); err != nil {
		s.violate(v, "reading the claim back: %v", err)
		return
	}
	v.pv = "pvc-" + string(v.uid)
	s.mu.Lock()
	s.vols = append(s.vols, v)
	s.byKey[v.pv], s.byKey[v.handle] = v, v
	s.mu.Unlock()
	defer s.cleanupLifecycle(v, pod)

	pattern := p.pattern
	dataScript, sum := soakData(pattern)
	script := fmt.Sprintf(`set -e; d=/data/%[1]s; printf %%s %[2]s > $d/pattern; %[3]s > $d/data; sync
echo "claim: $(cat $d/claim)"; echo "handle: $(cat $d/handle)"; echo "pattern: $(cat $d/pattern)"
echo "sum: $(md5sum < $d/data | cut -d' ' -f1)"; echo "files: $(ls $d | tr '\n' ' ')"`, v.claim, pattern, dataScript)
	want := fmt.Sprintf("claim: %s\nhandle: %s\npattern: %s\nsum: %s\nfiles: claim data handle params.json pattern \n", v.claim, v.handle, pattern, sum)
	var clientStart time.Time
	startClient := func() bool {
		clientStart = time.Now()
		spec := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: e.ns}, Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr(int64(1)),
			NodeSelector: map[string]string{hostnameKey: v.node},
			Containers: []corev1.Container{{Name: "client", Image: busybox, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", script}, VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/data/" + v.claim}}}},
			Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.claim}}}}}}
		if err := apiCreate(ctx, func(ctx context.Context) error {
			_, err := client.CoreV1().Pods(e.ns).Create(ctx, spec, metav1.CreateOptions{})
			return err
		}); err != nil {
			s.violate(v, "creating the client: %v", err)
			return false
		}
		return true
	}
	if p.clientEarly && !startClient() {
		return
	}

	var pv *corev1.PersistentVolume
	if err := until(ctx, soakStep, func(ctx context.Context) (bool, error) {
		got, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, v.claim, metav1.GetOptions{})
		if err != nil || got.Status.Phase != corev1.ClaimBound {
			return false, err
		}
		pv, err = client.CoreV1().PersistentVolumes().Get(ctx, got.Spec.VolumeName, metav1.GetOptions{})
		return err == nil, err
	}); err != nil {
		s.violate(v, "claim not bound: %v", err)
		return
	}
	s.op("create→bound", created)
	s.checkBinding(ctx, v, pv)

	if !p.clientEarly {
		soakPause(ctx, p.pauses[1])
		if !startClient() {
			return
		}
	}
	var got string
	if err := until(ctx, soakStep, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(e.ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		switch p.Status.Phase {
		case corev1.PodSucceeded:
			got, err = soakLogs(ctx, e.ns, pod)
			return err == nil, err
		case corev1.PodFailed:
			got, _ = soakLogs(ctx, e.ns, pod)
			return false, fmt.Errorf("%w: the client failed: %s", errFinal, got)
		}
		return false, nil
	}); err != nil {
		s.violate(v, "client on %s: %v", v.node, err)
		return
	}
	s.op("client start→read ok", clientStart)
	if got != want {
		s.violate(v, "the client read back %q, want %q%s", got, want, s.whose(v, got))
	}

	soakPause(ctx, p.pauses[2])
	if err := s.deleteAndWait(ctx, "pod "+pod, func(ctx context.Context) error {
		return client.CoreV1().Pods(e.ns).Delete(ctx, pod, metav1.DeleteOptions{})
	}, func(ctx context.Context) error {
		_, err := client.CoreV1().Pods(e.ns).Get(ctx, pod, metav1.GetOptions{})
		return err
	}); err != nil {
		s.violate(v, "%v", err)
		return
	}
	if err := until(ctx, soakStep, func(ctx context.Context) (bool, error) {
		return s.unstagedOn(ctx, v, pv, v.node)
	}); err != nil {
		s.violate(v, "not unstaged on %s once its client was gone: %v", v.node, err)
		return
	}

	soakPause(ctx, p.pauses[3])
	deleted := time.Now()
	if err := s.deleteAndWait(ctx, "claim "+v.claim, func(ctx context.Context) error {
		return client.CoreV1().PersistentVolumeClaims(e.ns).Delete(ctx, v.claim, metav1.DeleteOptions{})
	}, func(ctx context.Context) error {
		_, err := client.CoreV1().PersistentVolumes().Get(ctx, v.pv, metav1.GetOptions{})
		return err
	}); err != nil {
		s.violate(v, "%v", err)
		return
	}
	s.op("delete→PV gone", deleted)
	v.gone = true
	if err := s.waitNothingLeft(ctx, v); err != nil {
		s.violate(v, "left after its deletion: %v", err)
	}
	s.checkRuns(v)
	v.done = true
}

// soakClaim is a claim of the soak's (env.claim's, without creating it: the soak creates
// it through outages).
func (e *env) soakClaim(name, sc string) *corev1.PersistentVolumeClaim {
	mode := corev1.PersistentVolumeFilesystem
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeMode: &mode,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}}
}

// cleanupLifecycle deletes what a lifecycle that stopped early left (its client, its
// claim), so that one stuck volume does not hold the rest up; the final checks then say
// whether pav cleaned it up.
func (s *soak) cleanupLifecycle(v *soakVolume, pod string) {
	if v.done {
		return
	}
	ctx := context.Background()
	_ = apiRetry(ctx, func(ctx context.Context) error {
		err := client.CoreV1().Pods(s.e.ns).Delete(ctx, pod, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	_ = apiRetry(ctx, func(ctx context.Context) error {
		err := client.CoreV1().PersistentVolumeClaims(s.e.ns).Delete(ctx, v.claim, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
}

// deleteAndWait deletes an object and waits until gone says it is (NotFound).
func (s *soak) deleteAndWait(ctx context.Context, what string, del, gone func(context.Context) error) error {
	if err := apiRetry(ctx, func(ctx context.Context) error {
		if err := del(ctx); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	}); err != nil {
		return fmt.Errorf("deleting %s: %w", what, err)
	}
	if err := until(ctx, soakStep, func(ctx context.Context) (bool, error) {
		err := gone(ctx)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}); err != nil {
		return fmt.Errorf("%s not gone: %w", what, err)
	}
	return nil
}

func soakLogs(ctx context.Context, ns, pod string) (string, error) {
	b, err := client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
	return string(b), err
}

// whose names the lifecycle whose claim or handle a wrong read names, if another's.
func (s *soak) whose(v *soakVolume, got string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.vols {
		if o != v && strings.Contains(got, "claim: "+o.claim+"\n") || strings.Contains(got, o.handle+"\n") {
			return fmt.Sprintf(" (names lifecycle %d's volume)", o.id)
		}
	}
	return ""
}

// checkBinding checks that a bound claim's PV, handle and record are its own.
func (s *soak) checkBinding(ctx context.Context, v *soakVolume, pv *corev1.PersistentVolume) {
	if pv.Name != v.pv {
		s.violate(v, "bound to PV %s, want %s (the one made for it)", pv.Name, v.pv)
	}
	if r := pv.Spec.ClaimRef; r == nil || r.Namespace != s.e.ns || r.Name != v.claim || r.UID != v.uid {
		s.violate(v, "PV %s claimRef %v, want %s/%s uid %s", pv.Name, r, s.e.ns, v.claim, v.uid)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver || pv.Spec.CSI.VolumeHandle != v.handle {
		s.violate(v, "PV %s CSI source %v, want driver %s handle %s", pv.Name, pv.Spec.CSI, driver, v.handle)
	}
	var rec *v1alpha1.PavVolume
	if err := apiRetry(ctx, func(ctx context.Context) (err error) {
		rec, err = record(ctx, v.pv)
		return err
	}); err != nil || rec == nil {
		s.violate(v, "no PavVolume for a bound volume (%v)", err)
		return
	}
	if rec.Spec.Claim != s.e.ns+"/"+v.claim || rec.Spec.PVC != nil && rec.Spec.PVC.UID != v.uid || rec.Status.Handle != v.handle {
		s.violate(v, "PavVolume %s is of claim %q (uid %v), handle %q", rec.Name, rec.Spec.Claim, pvcUID(rec), rec.Status.Handle)
	}
}

func pvcUID(r *v1alpha1.PavVolume) types.UID {
	if r.Spec.PVC == nil {
		return ""
	}
	return r.Spec.PVC.UID
}

// soakPods lists pav-e2e's phase pods (an error, unlike volumePods: during an outage an
// empty answer must not pass for "none left").
func soakPods(ctx context.Context) ([]corev1.Pod, error) {
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: podrunner.LabelProvisioner + "=" + driver + "," + podrunner.LabelPhase})
	if err != nil {
		return nil, err
	}
	return pods.Items, nil
}

// keyVolume is the volume a pav pod's volume key names: the CSI volume name (creation),
// or the handle (staging and unstaging: handle@node; deletion: delete/handle).
func keyVolume(key string) string {
	key = strings.TrimPrefix(key, "delete/")
	if i := strings.LastIndex(key, "@"); i >= 0 {
		key = key[:i]
	}
	return key
}

// unstagedOn is waitUnstagedOn's condition, for the soak's goroutines.
func (s *soak) unstagedOn(ctx context.Context, v *soakVolume, pv *corev1.PersistentVolume, node string) (bool, error) {
	pods, err := soakPods(ctx)
	if err != nil {
		return false, err
	}
	for _, p := range pods {
		if k := p.Annotations[podrunner.AnnotationVolumeKey]; k == v.handle+"@"+node {
			return false, fmt.Errorf("%s pod %s/%s still there", p.Labels[podrunner.LabelPhase], p.Namespace, p.Name)
		}
	}
	err = stagingLeftOn(driver, pv, node)
	return err == nil, err
}

// waitNothingLeft waits until nothing of a deleted volume is left (leftOf), or a step's
// time is up; the error then says what is left.
func (s *soak) waitNothingLeft(ctx context.Context, v *soakVolume) error {
	return until(ctx, soakStep, func(ctx context.Context) (bool, error) {
		left, err := s.leftOf(ctx, v)
		if err == nil && len(left) > 0 {
			err = errors.New(strings.Join(left, "; "))
		}
		return err == nil, err
	})
}

// leftOf lists what is left of a deleted volume: pods, record, PV; its state directory on
// any node. (Mounts and loop devices: finalChecks, once for all volumes.)
func (s *soak) leftOf(ctx context.Context, v *soakVolume) ([]string, error) {
	var left []string
	pods, err := soakPods(ctx)
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		if k := keyVolume(p.Annotations[podrunner.AnnotationVolumeKey]); k == v.pv || k == v.handle {
			left = append(left, fmt.Sprintf("%s pod %s/%s", p.Labels[podrunner.LabelPhase], p.Namespace, p.Name))
		}
	}
	rec, err := record(ctx, v.pv)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		left = append(left, fmt.Sprintf("PavVolume %s (%s)", rec.Name, rec.Status.Phase))
	}
	if _, err := client.CoreV1().PersistentVolumes().Get(ctx, v.pv, metav1.GetOptions{}); err == nil {
		left = append(left, "PV "+v.pv)
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	dir := nodeserver.VolumeDir(pluginVolumes(driver), v.handle)
	for _, n := range s.nodes {
		if _, err := os.Stat(onNode(n, dir)); !os.IsNotExist(err) {
			left = append(left, fmt.Sprintf("state directory %s on %s", dir, n))
		}
	}
	return left, nil
}

// soakRevert is the phase that undoes a phase: a lost pod of the latter may have it run once
// more.
var soakRevert = map[string]string{"unstaging": "staging", "deletion": "creation"}

// checkRuns checks that each phase ran once for the volume: creation (keyed by the volume
// name, its default handle), staging, unstaging, deletion (by handle); once more for each
// pod of it, or of the phase it undoes, that the injector deleted.
func (s *soak) checkRuns(v *soakVolume) {
	s.mu.Lock()
	deleted := map[string]int{}
	for k, n := range v.deleted {
		deleted[k] = n
	}
	s.mu.Unlock()
	for _, ph := range []string{"creation", "staging", "unstaging", "deletion"} {
		key := v.handle
		if ph == "creation" {
			key = v.pv
		}
		n := runs(ph, key) // markers: one directory every node shares
		extra := deleted[ph] + deleted[soakRevert[ph]]
		switch {
		case n < 1 || n > 1+extra:
			s.violate(v, "the %s pod ran %d times, want once (or up to %d more: pods the injector deleted, or caught starting on a kubelet it stopped)", ph, n, extra)
		case n > 1:
			s.t.Logf("soak: lifecycle %d: the %s pod ran %d times after the injector deleted (or caught starting) a pod of it", v.id, ph, n)
		}
	}
}

// finalChecks: once the lifecycles are done and the faults over, the cluster is whole
// again and nothing of any volume is left anywhere, and the runs are as they were.
func (s *soak) finalChecks(ctx context.Context) {
	if err := until(ctx, soakStep, func(ctx context.Context) (bool, error) {
		return s.driverReadyEverywhere(ctx)
	}); err != nil {
		s.violate(nil, "pav-e2e not ready on every node after the soak: %v", err)
	}
	for _, v := range s.vols {
		if err := s.waitNothingLeft(ctx, v); err != nil {
			s.violate(v, "left at the end: %v", err)
		}
		if v.done || v.gone {
			s.checkRuns(v)
		}
	}
	// Nothing of the namespace's claims anywhere: a PV or record not of a lifecycle
	// (a claim bound to a volume not made for it would leave one).
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		s.violate(nil, "listing PVs: %v", err)
	} else {
		for _, pv := range pvs.Items {
			if r := pv.Spec.ClaimRef; r != nil && r.Namespace == s.e.ns || pv.Spec.CSI != nil && strings.HasPrefix(pv.Spec.CSI.VolumeHandle, "e2e-"+s.e.ns+"-") {
				s.violate(nil, "PV %s of the soak left (claim %v)", pv.Name, r)
			}
		}
	}
	recs, err := dyn.Resource(v1alpha1.VolumeGroupVersionResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		s.violate(nil, "listing PavVolumes: %v", err)
	} else {
		for _, u := range recs.Items {
			r := &v1alpha1.PavVolume{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, r); err == nil && strings.HasPrefix(r.Spec.Claim, s.e.ns+"/") {
				s.violate(nil, "PavVolume %s of claim %s left (%s)", r.Name, r.Spec.Claim, r.Status.Phase)
			}
		}
	}
	// Mounts, once per node: any under a soak volume's state directory, or naming its PV.
	for _, n := range s.nodes {
		mps, err := nodeMountPoints(n)
		if err != nil {
			s.violate(nil, "mounts of node %s: %v", n, err)
			continue
		}
		for _, v := range s.vols {
			dir := nodeserver.VolumeDir(pluginVolumes(driver), v.handle)
			for _, mp := range mps {
				if mp == dir || strings.HasPrefix(mp, dir+"/") || strings.Contains(mp, "/"+v.pv+"/") || strings.HasSuffix(mp, "/"+v.pv) {
					s.violate(v, "mount %s left on node %s", mp, n)
				}
			}
		}
	}
	// Loop devices: the kernel's, shared by every node; none may name a soak volume.
	out, _ := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	for _, l := range strings.Split(string(out), "\n") {
		for _, v := range s.vols {
			if strings.Contains(l, v.handle) || strings.Contains(l, v.pv) {
				s.violate(v, "loop device left: %s", l)
			}
		}
	}
}

// driverReadyEverywhere: pav-e2e's controller plugin ready, and a ready node plugin on
// every node (waitDriverOnNodes' condition, which the soak's goroutines cannot call).
func (s *soak) driverReadyEverywhere(ctx context.Context) (bool, error) {
	pods, err := client.CoreV1().Pods("pav").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + driver})
	if err != nil {
		return false, err
	}
	ready := map[string]bool{}
	for _, p := range pods.Items {
		if podReady(&p) && p.DeletionTimestamp == nil {
			ready[p.Labels["app.kubernetes.io/component"]+"@"+p.Spec.NodeName] = true
			ready[p.Labels["app.kubernetes.io/component"]] = true
		}
	}
	if !ready["controller"] {
		return false, errors.New("no ready controller plugin")
	}
	for _, n := range s.nodes {
		if !ready["node@"+n] {
			return false, fmt.Errorf("no ready node plugin on %s", n)
		}
	}
	return true, nil
}

// injector injects faults until ctx ends: each after a seeded gap, of a seeded kind among
// the enabled ones, and waits for the cluster to recover from it before the next.
func (s *soak) injector(ctx context.Context, rng *rand.Rand) {
	if len(s.set.faults) == 0 {
		return
	}
	enabled := map[string]bool{}
	for _, f := range s.set.faults {
		enabled[f] = true
	}
	for {
		// Every draw is made whatever is enabled, in the same order, so that the seed
		// gives the same gaps whatever SOAK_FAULTS says.
		f := soakFaultPlan{
			gap:    3*time.Second + time.Duration(rng.Int63n(int64(17*time.Second))),
			down:   5*time.Second + time.Duration(rng.Int63n(int64(25*time.Second))),
			target: rng.Uint64(),
		}
		f.kind = soakFaultKinds[rng.Intn(len(soakFaultKinds))].name
		if other := s.set.faults[int(rng.Uint64()%uint64(len(s.set.faults)))]; !enabled[f.kind] {
			f.kind = other
		}
		soakPause(ctx, f.gap)
		if ctx.Err() != nil {
			return
		}
		var inject func(*soak, context.Context, soakFaultPlan) (string, error)
		for _, k := range soakFaultKinds {
			if k.name == f.kind {
				inject = k.inject
			}
		}
		start := time.Now()
		// The fault and its recovery run to their end even once the lifecycles are
		// done: the final checks need the cluster whole.
		what, err := inject(s, context.Background(), f)
		if what == "" && err == nil {
			continue // nothing to strike (no phase pod ran): not a fault
		}
		end := time.Now()
		s.mu.Lock()
		s.faults = append(s.faults, soakFault{kind: f.kind, what: what, start: start, end: end})
		s.mu.Unlock()
		s.t.Logf("soak: fault %s: %s (%v)", f.kind, what, end.Sub(start).Round(100*time.Millisecond))
		if err != nil {
			s.violate(nil, "fault %s (%s): no recovery: %v", f.kind, what, err)
		}
	}
}

// pavPodsOf lists pav's pods in namespace pav with a label selector.
func pavPodsOf(ctx context.Context, selector string) ([]corev1.Pod, error) {
	pods, err := client.CoreV1().Pods("pav").List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	sort.Slice(pods.Items, func(i, j int) bool {
		return pods.Items[i].Spec.NodeName+pods.Items[i].Name < pods.Items[j].Spec.NodeName+pods.Items[j].Name
	})
	return pods.Items, nil
}

// crash deletes a pod with no grace (a crash, as killController does) and waits until
// replaced says its successor is ready.
func crash(ctx context.Context, p corev1.Pod, replaced func(ctx context.Context, old corev1.Pod) (bool, error)) error {
	if err := apiRetry(ctx, func(ctx context.Context) error {
		err := client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0)), Preconditions: &metav1.Preconditions{UID: &p.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}); err != nil {
		return err
	}
	return until(ctx, soakStep, func(ctx context.Context) (bool, error) { return replaced(ctx, p) })
}

// killControllerPlugin is killController for the soak's goroutines: pav-e2e's controller
// plugin crashes, and its StatefulSet makes it again.
func (s *soak) killControllerPlugin(ctx context.Context, f soakFaultPlan) (string, error) {
	pods, err := pavPodsOf(ctx, "app.kubernetes.io/instance="+driver+",app.kubernetes.io/component=controller")
	if err != nil || len(pods) == 0 {
		return "no controller plugin pod", fmt.Errorf("listing it: %v (%d)", err, len(pods))
	}
	old := pods[0]
	return fmt.Sprintf("controller plugin %s on %s", old.Name, old.Spec.NodeName), crash(ctx, old, func(ctx context.Context, old corev1.Pod) (bool, error) {
		p, err := client.CoreV1().Pods("pav").Get(ctx, old.Name, metav1.GetOptions{})
		return err == nil && p.UID != old.UID && podReady(p), nil
	})
}

// killNodePlugin is killNodePlugin of nodefaults_test.go on any node: the node plugin of a
// seeded node crashes, and the DaemonSet makes another there.
func (s *soak) killNodePlugin(ctx context.Context, f soakFaultPlan) (string, error) {
	node := s.nodes[f.target%uint64(len(s.nodes))]
	pods, err := pavPodsOf(ctx, "app.kubernetes.io/instance="+driver+",app.kubernetes.io/component=node")
	if err != nil {
		return "node plugin of " + node, err
	}
	for _, old := range pods {
		if old.Spec.NodeName != node || old.DeletionTimestamp != nil {
			continue
		}
		return fmt.Sprintf("node plugin %s on %s", old.Name, node), crash(ctx, old, func(ctx context.Context, old corev1.Pod) (bool, error) {
			ps, err := pavPodsOf(ctx, "app.kubernetes.io/instance="+driver+",app.kubernetes.io/component=node")
			for _, p := range ps {
				if p.Spec.NodeName == node && p.UID != old.UID && podReady(&p) {
					return true, nil
				}
			}
			return false, err
		})
	}
	return "node plugin of " + node, errors.New("none on the node")
}

// killManagerPod crashes the pav manager's pod; its Deployment makes another.
func (s *soak) killManagerPod(ctx context.Context, f soakFaultPlan) (string, error) {
	const sel = "app.kubernetes.io/name=pav,app.kubernetes.io/component=manager"
	pods, err := pavPodsOf(ctx, sel)
	if err != nil || len(pods) == 0 {
		return "no manager pod", fmt.Errorf("listing it: %v (%d)", err, len(pods))
	}
	old := pods[0]
	return fmt.Sprintf("manager %s on %s", old.Name, old.Spec.NodeName), crash(ctx, old, func(ctx context.Context, old corev1.Pod) (bool, error) {
		ps, err := pavPodsOf(ctx, sel)
		for _, p := range ps {
			if p.UID != old.UID && podReady(&p) && p.DeletionTimestamp == nil {
				return true, nil
			}
		}
		return false, err
	})
}

// restartKubelet restarts node 1's kubelet as reboot (nodefaults_test.go) does, without
// undoing anything: SIGTERM, then hack/cluster/up.sh, which starts it again and waits for
// the node to be Ready with a fresh heartbeat. (The extra nodes' kubelets are their init's
// children, which node.sh cannot restart alone.)
func (s *soak) restartKubelet(ctx context.Context, f soakFaultPlan) (string, error) {
	what := "kubelet of " + hostNode()
	pid, err := daemonPid("kubelet")
	if err != nil {
		return what, err
	}
	s.strikeStarting(ctx, hostNode())
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return what, fmt.Errorf("stopping the kubelet (pid %d): %v", pid, err)
	}
	if err := until(ctx, time.Minute, func(context.Context) (bool, error) { return syscall.Kill(pid, 0) != nil, nil }); err != nil {
		return what, fmt.Errorf("the kubelet (pid %d) did not stop: %v", pid, err)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "hack", "cluster", "up.sh"))
	cmd.Env = append(os.Environ(), "PAV_CLUSTER_DIR="+clusterDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		return what, fmt.Errorf("restarting the kubelet: %v\n%s", err, out)
	}
	return what, nil
}

// strikeStarting counts the soak's phase pods still starting (Pending) on a node whose
// kubelet is about to stop as struck, as a deleted pod is: a container the kubelet was
// starting is cancelled with it (StartError), though its command may have begun, and the
// phase then runs once more. A pod that starts fine after all just leaves the allowance
// unused.
func (s *soak) strikeStarting(ctx context.Context, node string) {
	pods, err := soakPods(ctx)
	if err != nil {
		s.t.Logf("soak: cannot list the phase pods starting on %s before its kubelet stops: %v", node, err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range pods {
		if v := s.byKey[keyVolume(p.Annotations[podrunner.AnnotationVolumeKey])]; v != nil && p.Spec.NodeName == node &&
			p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodPending {
			v.deleted[p.Labels[podrunner.LabelPhase]]++
		}
	}
}

// daemonPid is the pid of one of hack/cluster/up.sh's daemons, from its pid file.
func daemonPid(name string) (int, error) {
	b, err := os.ReadFile(filepath.Join(clusterDir(), "run", name+".pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// apiServerOutage takes the API server down for the seeded 5–30 s (apiServerDown).
func (s *soak) apiServerOutage(ctx context.Context, f soakFaultPlan) (string, error) {
	what := fmt.Sprintf("API server down %v", f.down.Round(100*time.Millisecond))
	_, _, err := apiServerDown(ctx, f.down, "TestSoak", nil)
	return what, err
}

// deletePhasePod deletes, as an operator would (kubectl delete pod), a pav phase pod of a
// soak volume whose operation is under way; the volume may then run that phase once more.
// With none there it waits a little for one, and strikes nothing if none comes.
func (s *soak) deletePhasePod(ctx context.Context, f soakFaultPlan) (string, error) {
	for try := 0; try < 40; try++ {
		pods, err := soakPods(ctx)
		if err != nil {
			soakPause(ctx, 500*time.Millisecond)
			continue
		}
		var live []corev1.Pod
		s.mu.Lock()
		for _, p := range pods {
			if s.byKey[keyVolume(p.Annotations[podrunner.AnnotationVolumeKey])] != nil && p.DeletionTimestamp == nil &&
				(p.Status.Phase == corev1.PodPending || p.Status.Phase == corev1.PodRunning) {
				live = append(live, p)
			}
		}
		s.mu.Unlock()
		if len(live) == 0 {
			soakPause(ctx, 500*time.Millisecond)
			continue
		}
		sort.Slice(live, func(i, j int) bool { return live[i].Name < live[j].Name })
		p := live[f.target%uint64(len(live))]
		phase := p.Labels[podrunner.LabelPhase]
		// Counted before the deletion: a lifecycle may check its runs as soon as the pod
		// is gone.
		s.mu.Lock()
		v := s.byKey[keyVolume(p.Annotations[podrunner.AnnotationVolumeKey])]
		v.deleted[phase]++
		s.mu.Unlock()
		what := fmt.Sprintf("%s pod %s/%s of lifecycle %d (%s, on %s)", phase, p.Namespace, p.Name, v.id, p.Status.Phase, p.Spec.NodeName)
		err = client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &p.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			// It finished and went meanwhile: nothing struck.
			s.mu.Lock()
			v.deleted[phase]--
			s.mu.Unlock()
			return "", nil
		}
		return what, err
	}
	return "", nil
}

// report prints the closing line and the latencies, with and without a fault overlapping
// the operation.
func (s *soak) report(took time.Duration) {
	byKind := map[string]int{}
	for _, f := range s.faults {
		byKind[f.kind]++
	}
	var kinds []string
	for _, k := range soakFaultKinds {
		kinds = append(kinds, fmt.Sprintf("%s=%d", k.name, byKind[k.name]))
	}
	s.t.Logf("soak: %d lifecycles, %d faults (by kind: %s), %d violations (seed %d, %v)",
		len(s.vols), len(s.faults), strings.Join(kinds, " "), len(s.violations), s.set.seed, took.Round(time.Second))
	for _, kind := range []string{"create→bound", "client start→read ok", "delete→PV gone"} {
		var quiet, faulted []time.Duration
		for _, o := range s.ops {
			if o.kind != kind {
				continue
			}
			overlap := false
			for _, f := range s.faults {
				overlap = overlap || o.start.Before(f.end) && f.start.Before(o.end)
			}
			if overlap {
				faulted = append(faulted, o.end.Sub(o.start))
			} else {
				quiet = append(quiet, o.end.Sub(o.start))
			}
		}
		s.t.Logf("soak: %-20s without fault: %s; under fault: %s", kind, percentiles(quiet), percentiles(faulted))
	}
}

// percentiles is "n=…, p50 …, p99 …" (nearest rank).
func percentiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n=0"
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	at := func(p float64) time.Duration {
		i := int(p*float64(len(ds))+0.999999) - 1
		if i < 0 {
			i = 0
		}
		return ds[i].Round(100 * time.Millisecond)
	}
	return fmt.Sprintf("n=%d, p50 %v, p99 %v", len(ds), at(0.50), at(0.99))
}
