//go:build bench

package bench

import (
	"context"
	"fmt"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/pods-as-volumes/pav/internal/apibudget"
	"github.com/pods-as-volumes/pav/podrunner"
	"github.com/pods-as-volumes/pav/test/podmetrics"
	"github.com/pods-as-volumes/pav/test/procstat"
)

// single is (a) and (b): one volume, one client, one bare pod at a time,
// alternating which goes first. keepRunning: sc's staging pods keep running
// (/pav/ready), and only (b) is reported, as (b′).
func single(t *testing.T, ctx context.Context, tab *table, sc string, reps int, keepRunning bool) {
	name := "single"
	if keepRunning {
		name = "single-keep"
	}
	ns := namespace(t, ctx, name)
	var aPav, aBare, bPav, bBare []time.Duration
	pods := client.CoreV1().Pods(ns)
	createPod := func(p *corev1.Pod) func(string) error {
		return func(string) error { _, err := pods.Create(ctx, p, metav1.CreateOptions{}); return err }
	}
	for i := range reps {
		v, bare, cl, sleeper := fmt.Sprintf("v%d", i), fmt.Sprintf("bare%d", i), fmt.Sprintf("client%d", i), fmt.Sprintf("sleeper%d", i)
		pavA := func() {
			aPav = append(aPav, timed(t, ctx, "PVC → Bound", []string{v}, func(string) error {
				_, err := client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim(ns, v, sc), metav1.CreateOptions{})
				return err
			}, has(claimsBound(ctx, ns))))
		}
		bareA := func() {
			if keepRunning {
				return // (a) is not reported for this class: its bare baseline is (a)'s own
			}
			aBare = append(aBare, timed(t, ctx, "bare pod → Succeeded", []string{bare}, createPod(pod(ns, bare, false, "")),
				has(podsIn(ctx, ns, corev1.PodSucceeded))))
		}
		pavB := func() {
			bPav = append(bPav, timed(t, ctx, "client → Running", []string{cl}, createPod(pod(ns, cl, true, v)),
				has(podsIn(ctx, ns, corev1.PodRunning))))
		}
		bareB := func() {
			bBare = append(bBare, timed(t, ctx, "bare pod → Running", []string{sleeper}, createPod(pod(ns, sleeper, true, "")),
				has(podsIn(ctx, ns, corev1.PodRunning))))
		}
		if i%2 == 0 {
			pavA()
			bareA()
			pavB()
			bareB()
		} else {
			bareA()
			pavA()
			bareB()
			pavB()
		}
		// Clean up (not timed) so that every repetition starts alike.
		pvc, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, v, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		names := []string{cl, sleeper}
		if !keepRunning {
			names = append(names, bare)
		}
		timed(t, ctx, "pods deleted", names, deletePod(ctx, ns), gone(podsIn(ctx, ns, "")))
		timed(t, ctx, "PV deleted", []string{pvc.Spec.VolumeName}, func(string) error {
			return client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, v, metav1.DeleteOptions{})
		}, gone(pvsPresent(ctx)))
		waitPavPodsGone(t, ctx)
	}
	if keepRunning {
		tab.ratio("(b′) client pod → Running (staging pod keeps running) vs bare pod → Running", bPav, bBare, targetRunning)
		return
	}
	tab.ratio("(a) PVC → Bound vs bare pod → Succeeded", aPav, aBare, targetBound)
	tab.ratio("(b) client pod → Running (staging pod completes) vs bare pod → Running", bPav, bBare, targetRunning)
	// The issue's own figure (2.03×) was this: 5.36 s against a bare pod's
	// create → Succeeded, 2.64 s.
	tab.ratio("(b) client pod → Running (staging pod completes) vs bare pod → Succeeded (the issue's baseline)", bPav, aBare, 0)
}

func deletePod(ctx context.Context, ns string) func(string) error {
	return func(name string) error {
		return client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
}

// waitPavPodsGone waits until pav-e2e runs no pod (unstaging, deletion): the
// next measurement starts on a quiet node, and the API counters are complete.
func waitPavPodsGone(t *testing.T, ctx context.Context) {
	t.Helper()
	var left []string
	err := wait.PollUntilContextTimeout(ctx, pollEvery, 2*time.Minute, true, func(context.Context) (bool, error) {
		l, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: podrunner.LabelProvisioner + "=" + driver + "," + podrunner.LabelPhase})
		if err != nil {
			return false, nil
		}
		left = left[:0]
		for _, p := range l.Items {
			left = append(left, p.Namespace+"/"+p.Name)
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Logf("pav-e2e's pods still there after 2 minutes (another volume's?), going on: %v", left)
	}
}

// atOnce is (c), (d), (e) under load and (f), for n volumes: n PVCs at once
// vs n bare pods at once, clients of `clients` of them at once vs as many bare
// pods that keep running, their deletion, and the API requests pav made.
func atOnce(t *testing.T, ctx context.Context, tab *table, sc string, n, clients int, procs []*proc) {
	ns := namespace(t, ctx, fmt.Sprintf("n%d", n))
	pods := client.CoreV1().Pods(ns)
	seq := func(prefix string, k int) []string {
		out := make([]string, k)
		for i := range out {
			out[i] = fmt.Sprintf("%s%d", prefix, i)
		}
		return out
	}
	vols, bares, cls, sleepers := seq("v", n), seq("bare", n), seq("client", clients), seq("sleeper", clients)
	before := scrapeAll(t, ctx)
	stop := sample(procs)
	defer stop()

	cPav := timed(t, ctx, "PVCs → Bound", vols, func(v string) error {
		_, err := client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim(ns, v, sc), metav1.CreateOptions{})
		return err
	}, has(claimsBound(ctx, ns)))
	cBare := timed(t, ctx, "bare pods → Succeeded", bares, func(b string) error {
		_, err := pods.Create(ctx, pod(ns, b, false, ""), metav1.CreateOptions{})
		return err
	}, has(podsIn(ctx, ns, corev1.PodSucceeded)))
	// Completed pods still count against the node's 110 pods: gone before
	// the clients and running bare pods come (not timed).
	timed(t, ctx, "completed bare pods deleted", bares, deletePod(ctx, ns), gone(podsIn(ctx, ns, "")))
	// Clients and running bare pods never share the node (min(N, 50) of
	// each and the cluster's own pods would pass its 110).
	clPav := timed(t, ctx, "clients → Running", cls, func(c string) error {
		_, err := pods.Create(ctx, pod(ns, c, true, "v"+strings.TrimPrefix(c, "client")), metav1.CreateOptions{})
		return err
	}, has(podsIn(ctx, ns, corev1.PodRunning)))
	dClients := timed(t, ctx, "clients deleted", cls, deletePod(ctx, ns), gone(podsIn(ctx, ns, "")))
	clBare := timed(t, ctx, "bare pods → Running", sleepers, func(s string) error {
		_, err := pods.Create(ctx, pod(ns, s, true, ""), metav1.CreateOptions{})
		return err
	}, has(podsIn(ctx, ns, corev1.PodRunning)))
	dBareRunning := timed(t, ctx, "running bare pods deleted", sleepers, deletePod(ctx, ns), gone(podsIn(ctx, ns, "")))
	pvOf := map[string]string{}
	l, err := client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pvNames []string
	for _, c := range l.Items {
		pvOf[c.Spec.VolumeName] = c.Name
		pvNames = append(pvNames, c.Spec.VolumeName)
	}
	dPav := timed(t, ctx, "PVCs deleted → PVs gone", pvNames, func(pv string) error {
		return client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, pvOf[pv], metav1.DeleteOptions{})
	}, gone(pvsPresent(ctx)))
	waitPavPodsGone(t, ctx)
	time.Sleep(2 * time.Second) // the last requests' metrics
	stop()
	after := scrapeAll(t, ctx)

	one := func(d time.Duration) []time.Duration { return []time.Duration{d} }
	tab.ratio(fmt.Sprintf("(c) %d PVCs at once → all Bound vs %d bare pods → all Succeeded", n, n), one(cPav), one(cBare), targetAtOnce)
	tab.ratio(fmt.Sprintf("(c) %d clients at once → all Running vs %d bare pods → all Running", clients, clients), one(clPav), one(clBare), 0)
	// Deleting a volume runs its deletion pod to completion, so what the node
	// can do at best is what it does for N bare pods run to completion at
	// once: (c)'s baseline. Deleting running bare pods (1s grace: sleep
	// ignores SIGTERM) is shown beside it, as what deleting a pod costs.
	tab.ratio(fmt.Sprintf("(d) %d PVCs deleted → all PVs gone vs %d bare pods → all Succeeded", n, n), one(dPav), one(cBare), targetAtOnce)
	tab.ratio(fmt.Sprintf("(d) %d PVCs deleted → all PVs gone vs %d running bare pods deleted → gone", n, clients), one(dPav), one(dBareRunning), 0)
	tab.ratio(fmt.Sprintf("(d) %d clients deleted → gone vs %d running bare pods deleted → gone", clients, clients), one(dClients), one(dBareRunning), 0)
	for _, m := range []struct {
		name   string
		per    int
		budget int
	}{
		{"controller", n, apibudget.Create + apibudget.Delete},
		{"node", clients, apibudget.Stage + apibudget.Unstage},
		{"manager", n, 0},
	} {
		b, okB := before[m.name]
		a, okA := after[m.name]
		if !okA || !okB {
			tab.add(row{fmt.Sprintf("(f) API requests per volume, %s (N=%d)", m.name, n), "not scraped", "", "", "", "info"})
			continue
		}
		total := a[""] - b[""]
		relayed := 0.0
		if m.name == "node" {
			// The node plugins' only PATCHes relay controller-side pods'
			// ends (internal/endrelay): outside the staging budget, shown
			// on a row of their own, per volume.
			relayed = a["PATCH"] - b["PATCH"]
			total -= relayed
		}
		per := total / float64(m.per)
		var methods []string
		for meth := range a {
			if d := a[meth] - b[meth]; meth != "" && d > 0 && (m.name != "node" || meth != "PATCH") {
				methods = append(methods, fmt.Sprintf("%s %.1f", meth, d/float64(m.per)))
			}
		}
		sort.Strings(methods)
		target, verdict := "—", "info"
		if m.budget > 0 {
			target = fmt.Sprintf("≤ %d (apibudget)", m.budget)
			verdict = "PASS"
			if per > float64(m.budget) {
				verdict = "OVER"
			}
		}
		what := "create+delete"
		if m.name == "node" {
			what = "stage+unstage"
		}
		if m.name == "manager" {
			what = "whole life"
		}
		tab.add(row{fmt.Sprintf("(f) API requests per volume (%s), %s, N=%d", what, m.name, n), fmt.Sprintf("%.1f (%s)", per, strings.Join(methods, ", ")), "", "", target, verdict})
		if m.name == "node" {
			tab.add(row{fmt.Sprintf("(f) API requests per volume (controller-side pods' ends relayed), node, N=%d", n),
				fmt.Sprintf("%.1f (PATCH)", relayed/float64(n)), "", "", "—", "info"})
		}
	}
}

// proc is a pav process on this node, found by its command line.
type proc struct {
	name, pattern string
	// idleTarget is the target for its idle RSS.
	idleTarget int64
	pid        int
	idle       int64
	peak       procstat.Peak
	// idleAnon and idleFile split idle into anonymous and file-backed pages;
	// idlePSS is its proportional set size (shared pages divided).
	idleAnon, idleFile, idlePSS int64
}

func findProcs(t *testing.T) []*proc {
	var out []*proc
	for _, p := range []*proc{
		{name: "controller plugin (pav-e2e)", pattern: "pav-driver --mode=controller --provisioner=" + driver + "( |$)", idleTarget: targetIdleRSS},
		{name: "node plugin (pav-e2e)", pattern: "pav-driver --mode=node --provisioner=" + driver + "( |$)", idleTarget: targetIdleRSS},
		{name: "manager", pattern: "pav manager( |$)", idleTarget: targetManagerIdleRSS},
	} {
		b, err := exec.Command("pgrep", "-o", "-f", p.pattern).Output()
		if err != nil {
			t.Logf("no process matches %q: its memory is not measured", p.pattern)
			continue
		}
		p.pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		out = append(out, p)
	}
	return out
}

// status reads a "kB" field of /proc/PID/status, in bytes.
func (p *proc) status(key string) int64 { return procstat.Status(p.pid, key) }

func (p *proc) rss() int64 { return p.status("VmRSS") }

// sample records each process's peak RSS until stopped (stop may be called
// more than once).
func sample(procs []*proc) (stop func()) {
	return procstat.Every(100*time.Millisecond, func() {
		for _, p := range procs {
			p.peak.Observe(p.pid)
		}
	})
}

// scrapeAll reads rest_client_requests_total (all codes, methods, hosts) of
// pav-e2e's controller and node plugins and of the manager.
// By process, then by method ("": all).
func scrapeAll(t *testing.T, ctx context.Context) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	l, err := client.CoreV1().Pods(pavNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Nodes that kwok simulates (make e2e runs the scale smoke beside this one) run no
	// process to scrape.
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	simulated := map[string]bool{}
	for _, n := range nodes.Items {
		if _, ok := n.Annotations["kwok.x-k8s.io/node"]; ok {
			simulated[n.Name] = true
		}
	}
	for _, p := range l.Items {
		if simulated[p.Spec.NodeName] {
			continue
		}
		var name, port string
		switch {
		case p.Name == "pav-"+driver+"-controller-0":
			name, port = "controller", "8080"
		case strings.HasPrefix(p.Name, "pav-"+driver+"-node-"):
			name, port = "node", "8082"
		case strings.HasPrefix(p.Name, "pav-manager-"):
			name, port = "manager", "8080"
		default:
			continue
		}
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		text, err := podmetrics.Scrape(ctx, client, &p, port)
		if err != nil {
			t.Logf("cannot read %s's /metrics: %v", p.Name, err)
			continue
		}
		counts := map[string]float64{}
		for _, line := range strings.Split(text, "\n") {
			if !strings.HasPrefix(line, "rest_client_requests_total{") {
				continue
			}
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				continue
			}
			method := ""
			if _, m, ok := strings.Cut(line, `method="`); ok {
				method, _, _ = strings.Cut(m, `"`)
			}
			counts[""] += v
			counts[method] += v
		}
		if len(counts) > 0 {
			out[name] = counts
		}
	}
	return out
}
