//go:build bench

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
	"github.com/pods-as-volumes/pav/test/procstat"
)

// TestBenchPeers is `make bench-peers` (issue 37): pav beside the provisioners its users would
// use instead, csi-driver-host-path (the reference CSI driver: everything in its own process,
// the floor of a CSI driver) and local-path-provisioner (a helper pod per creation and
// deletion: pav's design class), and bare pods, measured interleaved in one run on one
// cluster. It installs the peers with their own scripts (PAV_PEERS_DIR, ../shared/peers
// beside the repository; the test skips without them), applies its own PavProvisioner
// (peers-provisioner.yaml: creation, staging and deletion pods that each run one trivial
// command), and measures for each system, with WaitForFirstConsumer classes, 1Mi volumes and
// busybox pods:
//
//   - a pod and its new claim created together → the pod Running (bare: a pod → Running);
//   - N such pairs at once → all pods Running (bare: N pods);
//   - those N pods and claims deleted → all their PVs gone (bare: N pods deleted → gone);
//
// medians of PAV_BENCH_REPS (5) repetitions with their range (local-path:
// PAV_BENCH_LOCALPATH_REPS, at most as many, 0 for none), rotating which system goes first. It prints the
// table with ratios against host-path and bare pods, the targets with PASS/OVER, the
// load average during the run, and the timelines of the median repetitions (what the bench's
// watches saw: claim, scheduler, PV, binding, every pod's steps, events); with
// PAV_BENCH_PEERS_OUT, also to that file. Then it removes what it made and uninstalls the
// peers (their PVs first; PAV_BENCH_PEERS_KEEP=1 keeps them and the provisioner). Like
// TestBench it measures: it fails only when something does not work.
//
//	make bench-peers                                 # N=20, 5 repetitions
//	PAV_BENCH_PEERS_N=2 PAV_BENCH_REPS=1 ...         # the smoke form make e2e runs
func TestBenchPeers(t *testing.T) {
	cfg := connect(t)
	peers := peersDir(t)
	reps := envInt("PAV_BENCH_REPS", 5)
	n := envInt("PAV_BENCH_PEERS_N", 20)
	lpReps := min(reps, envCount("PAV_BENCH_LOCALPATH_REPS", reps)) // 0 leaves local-path out
	// Ctrl-C or SIGTERM ends the run through the test's failure path, so that the
	// cleanups still remove what it made and uninstall the peers.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, envDuration("PAV_BENCH_PEERS_TIMEOUT", 90*time.Minute))
	defer cancel()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run := &peerRun{n: n, reps: reps, started: time.Now()}
	stopLoad := run.sampleLoad()
	defer stopLoad()

	installPeers(t, ctx, peers, run)
	applyPeersProvisioner(t, ctx, dyn, run)
	run.rec = newRecorder(ctx)
	t.Cleanup(run.rec.stop)

	run.systems = []*system{
		{key: "bare", title: "bare pods", reps: reps},
		{key: "hostpath", title: "host-path v1.18.0", class: "csi-hostpath-fast", reps: reps},
		{key: "localpath", title: "local-path v0.0.37", class: "local-path", reps: lpReps},
		{key: "pav", title: "pav", class: peersProvisioner, reps: reps},
	}
	// Namespaces are deleted (their claims with them) before the provisioner and the peers
	// go: cleanups run last-in first-out.
	for _, s := range run.systems {
		s.ns = namespace(t, ctx, "peers-"+s.key)
		run.rec.watchNamespace(s.ns)
	}
	run.nodes = nodeNames(t, ctx)
	quiet(t, ctx)
	if u, ok := idleCPU(t, ctx, 10*time.Second); ok {
		run.idle = u
	}

	defer func() {
		stopLoad()
		run.print(os.Stdout)
		if out := os.Getenv("PAV_BENCH_PEERS_OUT"); out != "" {
			f, err := os.Create(out)
			if err != nil {
				t.Errorf("writing the table: %v", err)
				return
			}
			defer f.Close()
			run.print(f)
		}
	}()

	// Each measure runs for one system at a time, the systems rotating from one
	// repetition to the next, so that all of them see the same machine.
	for r := range reps {
		for _, s := range rotate(run.systems, r) {
			if r < s.reps {
				s.freshRep(t, ctx, r)
				quiet(t, ctx)
			}
		}
	}
	for r := range reps {
		for _, s := range rotate(run.systems, r) {
			if r < s.reps {
				s.atOnceRep(t, ctx, r, n)
				quiet(t, ctx)
			}
		}
	}
}

const (
	peersProvisioner = "bench-peers" // peers-provisioner.yaml's PavProvisioner and StorageClass
	hostpathDriver   = "hostpath.csi.k8s.io"
	// todayN is the N of the figures, which only that N is held to.
	todayN = 20
)

// peerMeasure is a row of the table and its targets (issue 37): pav's median at most
// vsHostpath times host-path's, below local-path's, and (at N = todayN) no slower than
// today, the figure before its work.
type peerMeasure struct {
	what       func(n int) string
	bare       func(n int) string // what the bare pods' column measures
	vsHostpath float64
	today      time.Duration
}

var peerMeasures = []peerMeasure{
	{func(int) string { return "a pod and its new claim created together → pod Running" },
		func(int) string { return "bare pod → Running" }, 1.5, 4440 * time.Millisecond},
	{func(n int) string { return fmt.Sprintf("%d such pairs at once → all pods Running", n) },
		func(n int) string { return fmt.Sprintf("%d bare pods", n) }, 2, 20300 * time.Millisecond},
	{func(n int) string { return fmt.Sprintf("those %d pods and claims deleted → all PVs gone", n) },
		func(n int) string { return fmt.Sprintf("%d bare pods deleted → gone", n) }, 2, 13100 * time.Millisecond},
}

// system is a column: bare pods (no class) or a provisioner's StorageClass.
type system struct {
	key, title, class string
	reps              int
	ns                string
	d                 [3][]time.Duration // by peerMeasures' row
	cpu               [3][]cpuUse        // by row, the N-at-once rows (1 and 2) only
	// The windows of each repetition, for the timelines: fresh (row 0), and at once
	// (rows 1 and 2).
	fresh, atOnce []window
}

// window is one repetition: when it started, when what it measured happened, when the
// deletion started and when it ended.
type window struct{ start, measured, delStart, end time.Time }

type peerRun struct {
	n, reps int
	systems []*system
	nodes   []string
	rec     *recorder
	started time.Time
	setup   [][2]string // what setting up took
	load    []float64   // 1-minute load average, every 5 s
	idle    cpuUse      // the machine's CPU with nothing measured running
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// envPath is an environment variable naming a path, made absolute (the test runs in
// test/bench).
func envPath(name, def string) string {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	abs, err := filepath.Abs(v)
	if err != nil {
		return v
	}
	return abs
}

// peersDir is ../shared/peers beside the repository (PAV_PEERS_DIR): without it there is
// nothing to measure against.
func peersDir(t *testing.T) string {
	dir := envPath("PAV_PEERS_DIR", "../../../shared/peers")
	for _, f := range []string{"hostpath/install.sh", "local-path/install.sh"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Skipf("no peers to measure against (%v): PAV_PEERS_DIR names the folder of csi-driver-host-path's and local-path-provisioner's install scripts", err)
		}
	}
	return dir
}

func rotate(s []*system, r int) []*system {
	k := r % len(s)
	return append(append([]*system(nil), s[k:]...), s[:k]...)
}

// installPeers runs the peers' install scripts, and registers their uninstall scripts,
// which wait for the peers' PVs to go first.
func installPeers(t *testing.T, ctx context.Context, dir string, run *peerRun) {
	cl := envPath("PAV_CLUSTER_DIR", "../../_output/cluster")
	bin := envPath("PAV_BIN_DIR", "../../_output/bin")
	script := func(ctx context.Context, name string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(dir, name), filepath.Join(bin, "kubectl"))
		cmd.Env = append(os.Environ(), "CL="+cl, "BIN="+bin)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
		return cmd.Run()
	}
	if os.Getenv("PAV_BENCH_PEERS_KEEP") != "1" {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			for _, s := range []string{"hostpath/uninstall.sh", "local-path/uninstall.sh"} {
				if err := script(ctx, s); err != nil {
					t.Errorf("%s: %v", s, err)
				}
			}
		})
	}
	for _, s := range []string{"hostpath/install.sh", "local-path/install.sh"} {
		begin := time.Now()
		if err := script(ctx, s); err != nil {
			t.Fatalf("%s: %v", filepath.Join(dir, s), err)
		}
		run.setup = append(run.setup, [2]string{s, secs(time.Since(begin))})
	}
}

// applyPeersProvisioner applies peers-provisioner.yaml and waits until the PavProvisioner
// is Ready; its removal, registered here, waits for its PVs to go first.
func applyPeersProvisioner(t *testing.T, ctx context.Context, dyn dynamic.Interface, run *peerRun) {
	b, err := os.ReadFile("peers-provisioner.yaml")
	if err != nil {
		t.Fatal(err)
	}
	gvr := map[string]schema.GroupVersionResource{
		"PavProvisioner": v1alpha1.GroupVersionResource,
		"StorageClass":   {Group: "storage.k8s.io", Version: "v1", Resource: "storageclasses"},
	}
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(string(b), "\n---\n") {
		o := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &o.Object); err != nil {
			t.Fatalf("peers-provisioner.yaml: %v", err)
		}
		if _, ok := gvr[o.GetKind()]; !ok {
			t.Fatalf("peers-provisioner.yaml: unexpected kind %q", o.GetKind())
		}
		objs = append(objs, o)
	}
	if os.Getenv("PAV_BENCH_PEERS_KEEP") != "1" {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			if err := untilGone(ctx, "PVs of "+peersProvisioner, driverPVs(peersProvisioner)); err != nil {
				t.Errorf("%v: leaving PavProvisioner %s", err, peersProvisioner)
				return
			}
			for i := len(objs) - 1; i >= 0; i-- {
				o := objs[i]
				if err := dyn.Resource(gvr[o.GetKind()]).Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("deleting %s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
			_ = untilGone(ctx, "PavProvisioner "+peersProvisioner, func(ctx context.Context) ([]string, error) {
				_, err := dyn.Resource(v1alpha1.GroupVersionResource).Get(ctx, peersProvisioner, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return nil, nil
				}
				return []string{peersProvisioner}, err
			})
		})
	}
	begin := time.Now()
	for _, o := range objs {
		if _, err := dyn.Resource(gvr[o.GetKind()]).Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "pav-bench", Force: true}); err != nil {
			t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	last := "not seen yet"
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(v1alpha1.GroupVersionResource).Get(ctx, peersProvisioner, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == v1alpha1.ConditionReady {
				last = fmt.Sprintf("%v: %v", m["reason"], m["message"])
				return m["status"] == "True", nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("waiting for PavProvisioner %s Ready: %v (last: %s)", peersProvisioner, err, last)
	}
	run.setup = append(run.setup, [2]string{"PavProvisioner " + peersProvisioner + " applied → Ready", secs(time.Since(begin))})
}

// driverPVs lists the PVs of a CSI driver.
func driverPVs(driver string) func(context.Context) ([]string, error) {
	return func(ctx context.Context) ([]string, error) {
		l, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var out []string
		for _, pv := range l.Items {
			if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driver {
				out = append(out, pv.Name)
			}
		}
		return out, nil
	}
}

// untilGone waits until left lists nothing.
func untilGone(ctx context.Context, what string, left func(context.Context) ([]string, error)) error {
	var last []string
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := left(ctx)
		if err != nil {
			return false, nil
		}
		last = l
		return len(l) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s to go: %w (left: %v)", what, err, last)
	}
	return nil
}

func nodeNames(t *testing.T, ctx context.Context) []string {
	l, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range l.Items {
		if _, ok := n.Annotations["kwok.x-k8s.io/node"]; !ok { // the scale smoke's simulated nodes
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out
}

// createPair creates a pod that keeps running and, for a provisioner, its claim first:
// both at once, as a user's manifest would.
func (s *system) createPair(ctx context.Context, name string) error {
	claimName := ""
	if s.class != "" {
		if _, err := client.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, claim(s.ns, name, s.class), metav1.CreateOptions{}); err != nil {
			return err
		}
		claimName = name
	}
	_, err := client.CoreV1().Pods(s.ns).Create(ctx, pod(s.ns, name, true, claimName), metav1.CreateOptions{})
	return err
}

// deleteAll deletes the pods of names and their claims, and waits until the pods are gone
// (bare pods) or the claims' PVs are (which comes after the pods and claims: a claim in use
// is not deleted, a PV is deleted once released).
func (s *system) deleteAll(t *testing.T, ctx context.Context, what string, names []string) time.Duration {
	t.Helper()
	if s.class == "" {
		return timed(t, ctx, what, names, deletePod(ctx, s.ns), gone(podsIn(ctx, s.ns, "")))
	}
	l, err := client.CoreV1().PersistentVolumeClaims(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	claimOf := map[string]string{}
	var pvNames []string
	for _, c := range l.Items {
		if !want[c.Name] {
			continue
		}
		if c.Spec.VolumeName == "" {
			t.Fatalf("%s: claim %s/%s has no volume", what, s.ns, c.Name)
		}
		claimOf[c.Spec.VolumeName] = c.Name
		pvNames = append(pvNames, c.Spec.VolumeName)
	}
	return timed(t, ctx, what, pvNames, func(pv string) error {
		n := claimOf[pv]
		if err := deletePod(ctx, s.ns)(n); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		return client.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, n, metav1.DeleteOptions{})
	}, gone(pvsPresent(ctx)))
}

// freshRep is the first row, once: a pod and its new claim → the pod Running. The
// deletion that follows is not timed (the third row is).
func (s *system) freshRep(t *testing.T, ctx context.Context, r int) {
	name := fmt.Sprintf("f%d", r)
	w := window{start: time.Now()}
	d := timed(t, ctx, s.title+": "+peerMeasures[0].what(1), []string{name}, func(string) error { return s.createPair(ctx, name) },
		has(podsIn(ctx, s.ns, corev1.PodRunning)))
	w.measured = w.start.Add(d)
	s.d[0] = append(s.d[0], d)
	w.delStart = time.Now()
	s.deleteAll(t, ctx, s.title+": deleted (not timed)", []string{name})
	w.end = time.Now()
	s.fresh = append(s.fresh, w)
}

// atOnceRep is the second and third rows, once.
func (s *system) atOnceRep(t *testing.T, ctx context.Context, r, n int) {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("a%d-%d", r, i)
	}
	w := window{start: time.Now()}
	c := startCPU(t)
	d := timed(t, ctx, s.title+": "+peerMeasures[1].what(n), names, func(name string) error { return s.createPair(ctx, name) },
		has(podsIn(ctx, s.ns, corev1.PodRunning)))
	w.measured = w.start.Add(d)
	s.d[1] = append(s.d[1], d)
	s.addCPU(ctx, 1, c)
	w.delStart = time.Now()
	c = startCPU(t)
	s.d[2] = append(s.d[2], s.deleteAll(t, ctx, s.title+": "+peerMeasures[2].what(n), names))
	s.addCPU(ctx, 2, c)
	w.end = time.Now()
	s.atOnce = append(s.atOnce, w)
}

// addCPU keeps row i's CPU for this repetition, if it could be read (its absence in
// one repetition leaves the row without a split: medianCPU needs one per repetition).
func (s *system) addCPU(ctx context.Context, i int, c cpuWindow) {
	if u, ok := c.end(ctx, s.ownPods); ok {
		s.cpu[i] = append(s.cpu[i], u)
	}
}

// quiet waits until no phase pod of bench-peers and no helper pod of local-path is left
// (the last deletion's pods, which the PV's end does not wait for), then a second, so
// that the next measure starts on a quiet cluster.
func quiet(t *testing.T, ctx context.Context) {
	t.Helper()
	var left []string
	err := wait.PollUntilContextTimeout(ctx, pollEvery, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		left = left[:0]
		l, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: podrunner.LabelProvisioner + "=" + peersProvisioner})
		if err != nil {
			return false, nil
		}
		for _, p := range l.Items {
			left = append(left, p.Namespace+"/"+p.Name)
		}
		l, err = client.CoreV1().Pods(localPathNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, p := range l.Items {
			if strings.HasPrefix(p.Name, "helper-pod-") {
				left = append(left, p.Namespace+"/"+p.Name)
			}
		}
		return len(left) == 0, nil
	})
	if err != nil && ctx.Err() == nil {
		t.Logf("pods still there after 2 minutes, going on: %v", left)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
	}
}

// sampleLoad records the 1-minute load average every 5 s until the returned stop.
func (run *peerRun) sampleLoad() (stop func()) {
	return procstat.Every(5*time.Second, func() {
		if v, err := loadAverage(); err == nil {
			run.load = append(run.load, v)
		}
	})
}

func loadAverage() (float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, errors.New("empty /proc/loadavg")
	}
	return strconv.ParseFloat(f[0], 64)
}

// spread is a median with its range: "4.44 s (4.32–4.46)".
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "—"
	}
	lo, hi := ds[0], ds[0]
	for _, d := range ds {
		lo, hi = min(lo, d), max(hi, d)
	}
	if len(ds) == 1 {
		return fmt.Sprintf("%.2f s", median(ds).Seconds())
	}
	return fmt.Sprintf("%.2f s (%.2f–%.2f)", median(ds).Seconds(), lo.Seconds(), hi.Seconds())
}

func ratioOf(a, b []time.Duration) (float64, bool) {
	if len(a) == 0 || len(b) == 0 || median(b) == 0 {
		return 0, false
	}
	return float64(median(a)) / float64(median(b)), true
}

func ratioCell(a, b []time.Duration) string {
	if r, ok := ratioOf(a, b); ok {
		return fmt.Sprintf("%.2f×", r)
	}
	return "—"
}

func (run *peerRun) system(key string) *system {
	for _, s := range run.systems {
		if s.key == key {
			return s
		}
	}
	return &system{}
}

func (run *peerRun) print(w io.Writer) {
	host, _ := os.Hostname()
	kernel, _ := exec.Command("uname", "-r").Output()
	fmt.Fprintf(w, "\npav bench-peers: %s, %d cores (nproc), kernel %s, nodes %s; repetitions %d (local-path %d), N %d; at %s\n",
		host, nproc(), strings.TrimSpace(string(kernel)), strings.Join(run.nodes, " "), run.reps, run.system("localpath").reps, run.n, run.started.UTC().Format(time.RFC3339))
	if len(run.load) > 0 {
		l := append([]float64(nil), run.load...)
		sort.Float64s(l)
		fmt.Fprintf(w, "load average (1 min, every 5 s, %d samples over %s): min %.2f, median %.2f, max %.2f\n",
			len(l), time.Since(run.started).Round(time.Second), l[0], l[len(l)/2], l[len(l)-1])
	}
	for _, s := range run.setup {
		fmt.Fprintf(w, "setup: %s: %s\n", s[0], s[1])
	}
	bare, hp, lp, pv := run.system("bare"), run.system("hostpath"), run.system("localpath"), run.system("pav")

	fmt.Fprintln(w)
	fmt.Fprintf(w, "| what a user sees | bare pods | %s | %s | %s | pav ÷ host-path | pav ÷ local-path | host-path ÷ bare | pav ÷ bare |\n", hp.title, lp.title, pv.title)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for i, m := range peerMeasures {
		fmt.Fprintf(w, "| %s | %s (%s) | %s | %s | %s | %s | %s | %s | %s |\n", m.what(run.n), spread(bare.d[i]), m.bare(run.n),
			spread(hp.d[i]), spread(lp.d[i]), spread(pv.d[i]),
			ratioCell(pv.d[i], hp.d[i]), ratioCell(pv.d[i], lp.d[i]), ratioCell(hp.d[i], bare.d[i]), ratioCell(pv.d[i], bare.d[i]))
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target (issue 37) | pav | against | ratio | |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|")
	verdict := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "OVER"
	}
	for i, m := range peerMeasures {
		row := []string{"fresh", fmt.Sprintf("%d at once", run.n), fmt.Sprintf("%d deleted", run.n)}[i]
		if r, ok := ratioOf(pv.d[i], hp.d[i]); ok {
			fmt.Fprintf(w, "| %s: ≤ %.1f× host-path | %.2f s | %.2f s | %.2f× | %s |\n", row, m.vsHostpath, median(pv.d[i]).Seconds(), median(hp.d[i]).Seconds(), r, verdict(r <= m.vsHostpath))
		}
		if r, ok := ratioOf(pv.d[i], lp.d[i]); ok {
			fmt.Fprintf(w, "| %s: ahead of local-path | %.2f s | %.2f s | %.2f× | %s |\n", row, median(pv.d[i]).Seconds(), median(lp.d[i]).Seconds(), r, verdict(r < 1))
		}
		if len(pv.d[i]) > 0 {
			if run.n == todayN {
				fmt.Fprintf(w, "| %s: no slower than before issue 37 | %.2f s | %.2f s | %.2f× | %s |\n", row, median(pv.d[i]).Seconds(), m.today.Seconds(),
					float64(median(pv.d[i]))/float64(m.today), verdict(median(pv.d[i]) <= m.today))
			} else {
				fmt.Fprintf(w, "| %s: no slower than before issue 37 (%.2f s at N=%d) | %.2f s | — | — | n/a at N=%d |\n", row, m.today.Seconds(), todayN, median(pv.d[i]).Seconds(), run.n)
			}
		}
	}

	run.printCPU(w)
	if run.rec == nil {
		return
	}
	run.printRefused(w)
	// The timelines of each system's median repetitions.
	for _, s := range run.systems {
		if len(s.fresh) > 0 {
			wd := s.fresh[medianIndex(s.d[0][:len(s.fresh)])]
			printOne(w, fmt.Sprintf("Timeline: %s, a pod and its new claim → Running (%.2f s), then deleted (not timed): the median repetition, s after the create calls", s.title, wd.measured.Sub(wd.start).Seconds()),
				wd.start, withBench(run.rec.window(wd.start, wd.end.Add(time.Second)), wd, "pod Running"))
		}
		if len(s.atOnce) > 0 {
			k := medianIndex(s.d[1][:len(s.atOnce)])
			wd := s.atOnce[k]
			printSteps(w, fmt.Sprintf("Steps: %s, %d pairs at once → all Running (%.2f s): the median repetition, s after the create calls", s.title, run.n, wd.measured.Sub(wd.start).Seconds()),
				wd.start, run.rec.window(wd.start, wd.delStart))
			printSteps(w, fmt.Sprintf("Steps: %s, the same %d deleted → all gone (%.2f s), s after the delete calls", s.title, run.n, s.d[2][k].Seconds()),
				wd.delStart, run.rec.window(wd.delStart, wd.end.Add(time.Second)))
		}
	}
}

// withBench adds the bench's own steps to a window's marks.
func withBench(marks []mark, w window, measured string) []mark {
	out := append([]mark{{at: w.start, role: "bench", step: "create calls"}}, marks...)
	out = append(out, mark{at: w.measured, role: "bench", step: measured + " (measured)"}, mark{at: w.delStart, role: "bench", step: "delete calls"},
		mark{at: w.end, role: "bench", step: "all gone"})
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// medianIndex is the index of the median of ds (the lower one of an even count).
func medianIndex(ds []time.Duration) int {
	idx := make([]int, len(ds))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return ds[idx[a]] < ds[idx[b]] })
	return idx[(len(idx)-1)/2]
}

// printRefused says, per system and repetition, how many client pods met the kubelet's
// node authorizer race (stepClaimRefused) before the figure was measured: each such pod
// waits 10 to 15 s for the kubelet's next try, whatever its driver, so a repetition that
// met it measures the race, not the driver.
func (run *peerRun) printRefused(w io.Writer) {
	counts := func(ws []window) string {
		if len(ws) == 0 {
			return "—"
		}
		c := make([]string, len(ws))
		for i, wd := range ws {
			c[i] = strconv.Itoa(run.rec.refused(wd.start, wd.measured))
		}
		return strings.Join(c, ", ")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Client pods that met the node authorizer race (step %q: event FailedMount, \"no relationship found between node\"; the kubelet tries the pod again 10–15 s later), per repetition:\n\n", stepClaimRefused)
	fmt.Fprintf(w, "| system | fresh | %d at once |\n", run.n)
	fmt.Fprintln(w, "|---|---|---|")
	for _, s := range run.systems {
		if s.class == "" {
			continue // bare pods have no claim
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", s.title, counts(s.fresh), counts(s.atOnce))
	}
}
