//go:build bench

// Package bench is `make bench-e2e`: pav's per-operation overhead, memory and
// API requests on the local cluster (issue 10), each pav figure measured in the
// same run as the bare pods it is compared with, alternating between them, and
// printed as a table of medians, ratios and the targets. It measures;
// it does not fail on a figure over its target (OVER), only when something
// does not work.
//
//	make bench-e2e                        # N=20, 5 repetitions
//	make bench-e2e BENCH_N=20,100         # also 100 volumes at once
//	PAV_BENCH_N=2 PAV_BENCH_REPS=1 ...    # the smoke form make e2e runs
//
// It runs on the cluster's node itself (single-node cluster, as root): the
// processes' memory is read from /proc.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/pods-as-volumes/pav/test/procstat"
)

const (
	driver    = "pav-e2e" // its default scenario: a creation pod, a staging pod that completes
	busybox   = "docker.io/library/busybox:1.36"
	pavNS     = "pav"
	pollEvery = 100 * time.Millisecond
	mib       = 1 << 20
)

// The targets.
const (
	targetBound     = 1.15 // PVC → Bound vs a bare pod → Succeeded
	targetRunning   = 1.6  // client → Running vs a bare pod → Running
	targetAtOnce    = 1.15 // N PVCs Bound at once vs N bare pods, and their deletion
	targetIdleRSS   = 40 * mib
	targetLoadedRSS = 80 * mib

	// targetIdleRSS is a driver's, one per node and provisioner. The
	// manager, one per cluster, links client-go's clientset for its leader
	// election (csi-lib-utils'): issue 25 set its target to 64 MiB.
	targetManagerIdleRSS = 64 * mib
)

var client kubernetes.Interface

func envInt(name string, def int) int {
	if v := envCount(name, def); v > 0 {
		return v
	}
	return def
}

// envCount is envInt that also takes 0 (none of something).
func envCount(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= 0 {
		return v
	}
	return def
}

func envInts(name string, def []int) []int {
	var out []int
	for _, f := range strings.FieldsFunc(os.Getenv(name), func(r rune) bool { return r == ',' || r == ' ' }) {
		if v, err := strconv.Atoi(f); err == nil && v > 0 {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return def
	}
	return out
}

// row is one line of the table.
type row struct {
	what, pav, bare, ratio, target, verdict string
}

type table struct {
	mu   sync.Mutex
	rows []row
}

func (t *table) add(r row) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rows = append(t.rows, r)
}

// ratio adds a row comparing two sets of durations by their medians.
func (t *table) ratio(what string, pav, bare []time.Duration, target float64) {
	mp, mb := median(pav), median(bare)
	r := float64(mp) / float64(mb)
	verdict := "PASS"
	if r > target {
		verdict = "OVER"
	}
	tgt := fmt.Sprintf("≤ %.2f×", target)
	if target == 0 {
		tgt, verdict = "—", "info"
	}
	t.add(row{what, secs(mp), secs(mb), fmt.Sprintf("%.2f×", r), tgt, verdict})
}

func (t *table) print(w io.Writer, header string) {
	fmt.Fprintf(w, "\n%s\n\n", header)
	fmt.Fprintln(w, "| measure | pav | bare pods | ratio | target | |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|---|")
	for _, r := range t.rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", r.what, r.pav, r.bare, r.ratio, r.target, r.verdict)
	}
	fmt.Fprintln(w)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// TestBench measures everything and prints the table.
func TestBench(t *testing.T) {
	connect(t)
	reps := envInt("PAV_BENCH_REPS", 5)
	ns := envInts("PAV_BENCH_N", []int{20})
	maxClients := envInt("PAV_BENCH_MAX_CLIENTS", 50)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()

	procs := findProcs(t)
	tab := &table{}
	for _, p := range procs {
		p.idle = p.rss()
		// What idle RSS is made of: the heap and stacks (anonymous) and the
		// binary's pages mapped so far (file-backed: the page cache of the
		// one image file, shared by every pav process of the node, which PSS
		// divides among them).
		p.idleAnon, p.idleFile = p.status("RssAnon"), p.status("RssFile")
		p.idlePSS = procstat.Rollup(p.pid, "Pss")
	}
	sc := storageClass(t, ctx, nil)
	// pav-e2e's tmpfs scenario: the staging pod mounts, creates /pav/ready
	// and keeps running, as a FUSE daemon or a backend's client does.
	scKeep := storageClass(t, ctx, map[string]string{"scenario": "tmpfs"})

	// The table is printed even when a case fails half-way: what was
	// measured by then is worth having.
	defer func() {
		for _, p := range procs {
			hwm := p.status("VmHWM")
			verdict := func(v, target int64) string {
				if v > target {
					return "OVER"
				}
				return "PASS"
			}
			tab.add(row{"(e) RSS idle: " + p.name, fmt.Sprintf("%.1f MiB (anon %.1f, file %.1f; PSS %.1f)", float64(p.idle)/mib, float64(p.idleAnon)/mib, float64(p.idleFile)/mib, float64(p.idlePSS)/mib),
				"", "", fmt.Sprintf("≤ %d MiB", p.idleTarget/mib), verdict(p.idle, p.idleTarget)})
			tab.add(row{fmt.Sprintf("(e) RSS peak during the N-at-once cases (N=%v): %s", ns, p.name), fmt.Sprintf("%.1f MiB", float64(p.peak.Max())/mib), "", "",
				fmt.Sprintf("≤ %d MiB", targetLoadedRSS/mib), verdict(p.peak.Max(), targetLoadedRSS)})
			tab.add(row{"(e) VmHWM since start: " + p.name, fmt.Sprintf("%.1f MiB", float64(hwm)/mib), "", "", "—", "info"})
		}
		host, _ := os.Hostname()
		out, _ := exec.Command("uname", "-r").Output()
		tab.print(os.Stdout, fmt.Sprintf("pav bench-e2e: %s, %d cores (nproc), kernel %s, repetitions %d, N %v, at %s",
			host, nproc(), strings.TrimSpace(string(out)), reps, ns, time.Now().UTC().Format(time.RFC3339)))
	}()

	// (a) and (b): one at a time, alternating.
	single(t, ctx, tab, sc, reps, false)
	single(t, ctx, tab, scKeep, reps, true)

	// (c), (d), (e) under load, (f).
	for _, n := range ns {
		atOnce(t, ctx, tab, sc, n, min(n, maxClients), procs)
	}
}

// connect sets client to the cluster of KUBECONFIG, or skips the test without one.
func connect(t *testing.T) *rest.Config {
	t.Helper()
	kc := os.Getenv("KUBECONFIG")
	if kc == "" {
		t.Skip("KUBECONFIG is not set: make bench-e2e and make bench-peers run this against the local cluster")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 200, 400 // the benchmark's own requests must not be what is slow
	if client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func nproc() int {
	out, err := exec.Command("nproc").Output()
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	return n
}

// namespace makes a namespace for one case, deleted (and waited for) after.
func namespace(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	ns := "bench-" + name + "-" + strings.ToLower(rand.String(5))
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = client.CoreV1().Namespaces().Delete(bg, ns, metav1.DeleteOptions{})
		_ = wait.PollUntilContextTimeout(bg, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	})
	poll(t, ctx, "default ServiceAccount of "+ns, func() bool {
		_, err := client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
	return ns
}

func poll(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, pollEvery, 10*time.Minute, true, func(context.Context) (bool, error) {
		return cond(), nil
	}); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func storageClass(t *testing.T, ctx context.Context, params map[string]string) string {
	t.Helper()
	name := "bench-" + strings.ToLower(rand.String(5))
	del := corev1.PersistentVolumeReclaimDelete
	if _, err := client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name},
		Provisioner: driver, ReclaimPolicy: &del, Parameters: params}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

func claim(ns, name, sc string) *corev1.PersistentVolumeClaim {
	fs := corev1.PersistentVolumeFilesystem
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeMode: &fs,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}}
}

// grace is every pod's termination grace: sleep ignores SIGTERM (PID 1), so a
// running pod's deletion takes this long, pav's client or bare. Not 0: that
// removes the pod from the API at once, before the kubelet tears it down.
var grace = int64(1)

// pod is a busybox pod: `true` (it succeeds) or, with sleep, one that keeps
// running; with a claim, a client of that volume.
func pod(ns, name string, sleep bool, claimName string) *corev1.Pod {
	cmd := []string{"true"}
	if sleep {
		cmd = []string{"sleep", "3600"}
	}
	c := corev1.Container{Name: "c", Image: busybox, ImagePullPolicy: corev1.PullIfNotPresent, Command: cmd}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: &grace}}
	if claimName != "" {
		p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claimName}}}}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	}
	p.Spec.Containers = []corev1.Container{c}
	return p
}

// timed creates (or deletes) with start (names of the objects), then polls
// done (the names that reached the state) until all of them have, and returns
// how long it took until the last.
func timed(t *testing.T, ctx context.Context, what string, names []string, start func(name string) error, done state) time.Duration {
	t.Helper()
	begin := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(names))
	sem := make(chan struct{}, 20)
	for _, n := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := start(n); err != nil {
				errs <- fmt.Errorf("%s %s: %w", what, n, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, pollEvery, 5*time.Minute, true, func(context.Context) (bool, error) {
		got, err := done()
		if last = err; err != nil {
			var f failed
			if errors.As(err, &f) {
				return false, err
			}
			return false, nil
		}
		for _, n := range names {
			if !got(n) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%s: %v (last error: %v)", what, err, last)
	}
	d := time.Since(begin)
	t.Logf("%s (%d): %v", what, len(names), d.Round(10*time.Millisecond))
	return d
}

func podsIn(ctx context.Context, ns string, phase corev1.PodPhase) func() (map[string]bool, error) {
	return func() (map[string]bool, error) {
		l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		out := map[string]bool{}
		for _, p := range l.Items {
			if phase == "" || p.Status.Phase == phase {
				out[p.Name] = true
			}
			// A pod that runs sleep fails when deleted (SIGKILL after its grace):
			// only a pod that should get somewhere and failed is an error.
			if phase != "" && p.Status.Phase == corev1.PodFailed {
				return nil, failed{fmt.Errorf("pod %s failed: %s %s", p.Name, p.Status.Reason, p.Status.Message)}
			}
		}
		return out, nil
	}
}

// failed is an error that waiting longer will not mend.
type failed struct{ error }

// state says which of timed's names reached the state it waits for.
type state func() (func(name string) bool, error)

// has: the names in the set have.
func has(set func() (map[string]bool, error)) state {
	return func() (func(string) bool, error) {
		m, err := set()
		if err != nil {
			return nil, err
		}
		return func(n string) bool { return m[n] }, nil
	}
}

// gone: the names not in the set (of what is still there) have.
func gone(set func() (map[string]bool, error)) state {
	return func() (func(string) bool, error) {
		m, err := set()
		if err != nil {
			return nil, err
		}
		return func(n string) bool { return !m[n] }, nil
	}
}

func claimsBound(ctx context.Context, ns string) func() (map[string]bool, error) {
	return func() (map[string]bool, error) {
		l, err := client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		out := map[string]bool{}
		for _, c := range l.Items {
			if c.Status.Phase == corev1.ClaimBound {
				out[c.Name] = true
			}
		}
		return out, nil
	}
}

func pvsPresent(ctx context.Context) func() (map[string]bool, error) {
	return func() (map[string]bool, error) { return pvs(ctx) }
}

func pvs(ctx context.Context) (map[string]bool, error) {
	l, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, pv := range l.Items {
		out[pv.Name] = true
	}
	return out, nil
}
