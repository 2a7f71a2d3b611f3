//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

const (
	driver  = "pav-e2e"
	busybox = "docker.io/library/busybox:1.36"
	// markers is pav-e2e's "backend" and the record of its pods' runs: outside /var/lib,
	// so that every node of a multi-node local cluster sees the same directory, as it
	// would network storage (hack/cluster gives each extra node its own /var/lib only).
	// pav-e2e declares no topology: a volume made on one node must serve on any other.
	markers    = "/srv/pav-e2e"
	volumesDir = "/var/lib/kubelet/plugins/" + driver + "/volumes"
)

var (
	client     kubernetes.Interface
	dyn        dynamic.Interface
	repo       string // project root
	kubeconfig string
	timeout    = 3 * time.Minute
)

func TestMain(m *testing.M) {
	wd, _ := os.Getwd()
	repo = filepath.Join(wd, "..", "..")
	kubeconfig = os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		kubeconfig = filepath.Join(repo, "_output", "cluster", "kubeconfig")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: no cluster (%v); run `make e2e`\n", err)
		os.Exit(1)
	}
	// client-go's default of 5 requests a second throttles the suite's polls once lanes and
	// the soak's lifecycles run at once (kubectl allows 50, bursts of 300).
	cfg.QPS, cfg.Burst = 50, 300
	client = kubernetes.NewForConfigOrDie(cfg)
	dyn = dynamic.NewForConfigOrDie(cfg)
	if inLanes {
		// A test waiting for its lane holds one of go test's parallel slots: with too few,
		// the lanes would take turns instead of running at once.
		flag.Parse()
		if f := flag.Lookup("test.parallel"); f != nil {
			if n, err := strconv.Atoi(f.Value.String()); err == nil && n < 64 {
				_ = f.Value.Set("64")
			}
		}
	}
	if err := waitProvisionerReady(context.Background(), driver, 3*time.Minute); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: pav-e2e is not ready: %v\n", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// Lanes. With PAV_E2E_PARALLEL=1 (make e2e), tests that do not disturb the cluster run in
// lanes at the same time: a lane is what its tests share and may check as a whole (a
// provisioner's pods, mounts and node directories; the default namespace), so that within a
// lane they run one at a time, as before. Tests outside every lane (those that kill a
// plugin other lanes use, restart the node, or uninstall) run alone: go test runs them
// first, before any parallel test, and TestUninstall waits for every lane (afterLanes).
// Without PAV_E2E_PARALLEL every test runs alone, in file order.
const (
	// The examples' provisioners: loop-block's lane is also encryption's and encrypted-fs's
	// (their volumes live in loop-block's), object-bucket's is also its example store's.
	// The examples' READMEs take both (and the default namespace, which nothing else uses).
	laneLoopBlock    = "loop-block"
	laneObjectBucket = "object-bucket"
	lanePavE2E       = "pav-e2e" // the suite's own provisioner, its backend and node directory
	laneOwn          = "own"     // tests that make provisioners of their own (PaV's system tests...)
	// laneSelf: tests of a shared provisioner that create and check only objects of their own
	// (namespace, classes, volumes, the volumes' own pods and directories), never the
	// provisioner as a whole: they may run beside that provisioner's lane. A long test moves
	// here to shorten its lane (lane times: "lane NAME: waited …, in lane …" in the log).
	laneSelf = "self"
	// laneSanity: csi-sanity against a provisioner of its own (TestCSISanityOnCluster)
	laneSanity = "sanity"
)

var (
	inLanes   = os.Getenv("PAV_E2E_PARALLEL") != ""
	laneLocks sync.Map // lane name → *sync.Mutex
	laneTests sync.WaitGroup
)

// inLane runs the rest of t in its lane, alongside the other lanes (see Lanes); a test that
// uses what several lanes share holds them all. Call it first.
func inLane(t *testing.T, lanes ...string) {
	if !inLanes {
		return
	}
	laneTests.Add(1) // before t.Parallel: every lane's test is counted before afterLanes waits
	t.Cleanup(laneTests.Done)
	t.Parallel()
	// Always taken in the same order, so that two tests holding some of the same lanes
	// cannot each wait for the other.
	lanes = slices.Sorted(slices.Values(lanes))
	waiting := time.Now()
	for _, lane := range lanes {
		mu, _ := laneLocks.LoadOrStore(lane, &sync.Mutex{})
		mu.(*sync.Mutex).Lock()
		t.Cleanup(mu.(*sync.Mutex).Unlock) // registered before the test's own: runs after them
	}
	// What each lane costs, for balancing them (its tests' "in lane" times add up).
	got := time.Now()
	t.Cleanup(func() {
		t.Logf("lane %s: waited %v, in lane %v", strings.Join(lanes, "+"), got.Sub(waiting).Round(time.Second), time.Since(got).Round(time.Second))
	})
}

// afterLanes holds t until every lane's test has finished (see Lanes). Call it first.
func afterLanes(t *testing.T) {
	if !inLanes {
		return
	}
	t.Parallel()
	laneTests.Wait()
}

// waitProvisionerReady waits for the pav manager to report a provisioner Ready,
// for its controller and node plugins, and for kubelet to have registered its
// driver on the node (CSINode).
func waitProvisionerReady(ctx context.Context, name string, within time.Duration) error {
	return waitProvisionerReadyIn(ctx, "pav", name, within)
}

// waitProvisionerReadyIn is waitProvisionerReady for a manager in namespace ns
// (the Helm chart's test installs pav elsewhere).
func waitProvisionerReadyIn(ctx context.Context, ns, name string, within time.Duration) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		if ready, _ := provisionerCondition(ctx, name, v1alpha1.ConditionReady); ready.Status != metav1.ConditionTrue {
			return false, nil
		}
		pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name})
		if err != nil || len(pods.Items) < 2 {
			return false, nil
		}
		for _, p := range pods.Items {
			if !podReady(&p) {
				return false, nil
			}
		}
		// Node 1's CSINode: the suite's clients run there (the cross-node tests wait
		// for the other nodes themselves, waitDriverOnNodes).
		csiNode, err := client.StorageV1().CSINodes().Get(ctx, hostNode(), metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, d := range csiNode.Spec.Drivers {
			if d.Name == name {
				return true, nil
			}
		}
		return false, nil
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// env is one test's namespace and the cluster-scoped objects it made.
type env struct {
	t   *testing.T
	ctx context.Context
	ns  string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	e := &env{t: t, ctx: ctx, ns: "e2e-" + strings.ToLower(rand.String(6))}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The default ServiceAccount must exist before pods can be created.
	e.poll("default ServiceAccount", func() (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(e.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	t.Cleanup(func() {
		defer cancel()
		if t.Failed() {
			e.dumpEvents()
		}
		bg := context.Background()
		_ = client.CoreV1().Namespaces().Delete(bg, e.ns, metav1.DeleteOptions{})
		// PVs of this namespace's claims go with them (reclaim Delete); wait so the
		// next test starts on a quiet node.
		_ = wait.PollUntilContextTimeout(bg, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := client.CoreV1().Namespaces().Get(ctx, e.ns, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	})
	return e
}

// in is e for a subtest of e's test: its checks fail the subtest, under its name, and its
// namespace and objects stay e's.
func (e *env) in(t *testing.T) *env {
	return &env{t: t, ctx: e.ctx, ns: e.ns}
}

func (e *env) poll(what string, cond func() (bool, error)) {
	e.t.Helper()
	e.pollFor(what, timeout, cond)
}

func (e *env) pollFor(what string, d time.Duration, cond func() (bool, error)) {
	e.t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(e.ctx, 500*time.Millisecond, d, true, func(context.Context) (bool, error) {
		ok, err := cond()
		last = err
		return ok, nil
	})
	if err != nil {
		e.t.Fatalf("timed out after %v waiting for %s (last error: %v)", d, what, last)
	}
}

func (e *env) dumpEvents() {
	evs, err := client.CoreV1().Events(e.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return
	}
	// Oldest first: CI's summary of a failure shows the last ten (hack/go-test.sh).
	when := func(ev *corev1.Event) time.Time {
		for _, t := range []time.Time{ev.LastTimestamp.Time, ev.EventTime.Time, ev.CreationTimestamp.Time} {
			if !t.IsZero() {
				return t
			}
		}
		return time.Time{}
	}
	slices.SortStableFunc(evs.Items, func(a, b corev1.Event) int { return when(&a).Compare(when(&b)) })
	for _, ev := range evs.Items {
		e.t.Logf("event %s/%s %s: %s", ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Reason, ev.Message)
	}
}

// storageClass makes a StorageClass of pav-e2e with parameters; it is deleted
// with the test.
func (e *env) storageClass(params map[string]string, reclaim corev1.PersistentVolumeReclaimPolicy) string {
	e.t.Helper()
	name := e.ns + "-" + strings.ToLower(rand.String(4))
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: driver, Parameters: params, ReclaimPolicy: &reclaim}
	if _, err := client.StorageV1().StorageClasses().Create(e.ctx, sc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = client.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

type claimOpts struct {
	size   string
	mode   corev1.PersistentVolumeMode
	access corev1.PersistentVolumeAccessMode
	volume string // static binding
}

func (e *env) claim(name, sc string, o claimOpts) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	if o.size == "" {
		o.size = "1Mi"
	}
	if o.mode == "" {
		o.mode = corev1.PersistentVolumeFilesystem
	}
	if o.access == "" {
		o.access = corev1.ReadWriteOnce
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeMode: &o.mode, AccessModes: []corev1.PersistentVolumeAccessMode{o.access},
			VolumeName: o.volume,
			Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(o.size)}}}}
	pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pvc
}

func (e *env) waitBound(name string) *corev1.PersistentVolume {
	e.t.Helper()
	var pvName string
	e.poll("PVC "+name+" Bound", func() (bool, error) {
		pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pvName = pvc.Spec.VolumeName
		return pvc.Status.Phase == corev1.ClaimBound, nil
	})
	pv, err := client.CoreV1().PersistentVolumes().Get(e.ctx, pvName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pv
}

// waitEvent waits for an event on an object whose message holds every substring.
func (e *env) waitEvent(kind, name, reason string, within time.Duration, substrings ...string) string {
	e.t.Helper()
	var found string
	e.pollFor(fmt.Sprintf("%s event on %s %s containing %q", reason, kind, name, substrings), within, func() (bool, error) {
		evs, err := client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind != kind || reason != "" && ev.Reason != reason {
				continue
			}
			ok := true
			for _, s := range substrings {
				ok = ok && strings.Contains(ev.Message, s)
			}
			if ok {
				found = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	return found
}

// clientPod runs a busybox pod with the claims mounted at /data/<claim> (or
// attached at /dev/<claim> for Block) and the given shell script, on node 1 (this
// machine): the suite's checks look at its mounts, devices and files, so on a
// cluster of several nodes its clients run there too (the cross-node tests place
// their own, pinnedSpec).
func (e *env) clientPod(name, script string, claims ...string) *corev1.Pod {
	e.t.Helper()
	c := corev1.Container{Name: "client", Image: busybox, ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"sh", "-c", script}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr(int64(1)),
			NodeSelector: map[string]string{hostnameKey: hostNode()}}}
	for _, cl := range claims {
		pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, cl, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: cl, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: cl}}})
		if pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock {
			c.VolumeDevices = append(c.VolumeDevices, corev1.VolumeDevice{Name: cl, DevicePath: "/dev/" + cl})
		} else {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: cl, MountPath: "/data/" + cl})
		}
	}
	pod.Spec.Containers = []corev1.Container{c}
	pod, err := client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pod
}

// mountsPod creates a busybox pod on node 1 (as clientPod) running command, whose one
// volume, named after claim, is mounted as mounts say (subPaths, several mounts).
func (e *env) mountsPod(name, claim string, command []string, mounts ...corev1.VolumeMount) {
	e.t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr(int64(1)),
			NodeSelector: map[string]string{hostnameKey: hostNode()},
			Volumes: []corev1.Volume{{Name: claim, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
			Containers: []corev1.Container{{Name: "client", Image: busybox, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: command, VolumeMounts: mounts}}}}
	if _, err := client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) waitPodPhase(name string, phase corev1.PodPhase) {
	e.t.Helper()
	e.poll("pod "+name+" "+string(phase), func() (bool, error) {
		p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase == corev1.PodFailed && phase != corev1.PodFailed {
			return false, fmt.Errorf("pod %s failed: %s", name, e.logs(name))
		}
		return p.Status.Phase == phase, nil
	})
}

func (e *env) waitPodRunning(name string) {
	e.t.Helper()
	e.poll("pod "+name+" running and ready", func() (bool, error) {
		p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return podReady(p), nil
	})
}

func (e *env) logs(name string) string { return podLog(e.ctx, e.ns, name, "") }

// podLog is the log of a pod's container ("": its only one), or why there is none.
func podLog(ctx context.Context, ns, name, container string) string {
	rc, err := client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: container}).Stream(ctx)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer rc.Close()
	b, _ := io.ReadAll(rc)
	return string(b)
}

// runClient runs a client pod to completion and returns its log.
func (e *env) runClient(name, script string, claims ...string) string {
	e.t.Helper()
	e.clientPod(name, script, claims...)
	e.waitPodPhase(name, corev1.PodSucceeded)
	return e.logs(name)
}

func (e *env) deletePod(name string) {
	e.t.Helper()
	if err := client.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	e.poll("pod "+name+" gone", func() (bool, error) {
		_, err := client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

func (e *env) deleteClaim(name string) {
	e.t.Helper()
	if err := client.CoreV1().PersistentVolumeClaims(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) waitPVGone(name string) {
	e.t.Helper()
	e.poll("PV "+name+" gone", func() (bool, error) {
		_, err := client.CoreV1().PersistentVolumes().Get(e.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// phasePods lists pav's pods of one phase for a provisioner, in every namespace.
func phasePods(ctx context.Context, phase string) []corev1.Pod {
	pods, _ := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: podrunner.LabelProvisioner + "=" + driver + "," + podrunner.LabelPhase + "=" + phase})
	return pods.Items
}

// marker reads a file the deletion or unstaging pod left on the node.
func marker(kind, handle string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(markers, kind, handle))
	return strings.TrimSpace(string(b)), err == nil
}

func (e *env) waitMarker(kind, handle string) string {
	e.t.Helper()
	var v string
	e.poll(kind+" marker of "+handle, func() (bool, error) {
		var ok bool
		v, ok = marker(kind, handle)
		return ok, nil
	})
	return v
}

// hostMounts lists the node's mounts under dir (the test runs on the node).
func hostMounts(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(f[4], dir) {
			out = append(out, f[4])
		}
	}
	return out
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out.String())
	}
	return out.String()
}

func ptr[T any](v T) *T { return &v }
