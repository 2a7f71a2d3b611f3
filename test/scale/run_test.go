//go:build scale

package scale

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
)

// idle measures the cluster at rest with the simulated nodes: every process's RSS, and
// what the API server serves and the machine spends before any volume is asked for.
func (s *sim) idle(ctx context.Context) {
	s.t.Helper()
	for _, p := range s.procs {
		p.idle = p.rss()
	}
	const window = 15 * time.Second
	a := s.snapshot(ctx)
	select {
	case <-time.After(window):
	case <-ctx.Done():
		s.t.Fatal(ctx.Err())
	}
	b := s.snapshot(ctx)
	d := b.at.Sub(a.at).Seconds()
	type kv struct {
		k string
		v float64
	}
	var rates []kv
	total := 0.0
	ra := requestsBy(a.apiserver)
	for k, v := range requestsBy(b.apiserver) {
		if x := v - ra[k]; x > 0 {
			rates = append(rates, kv{k, x / d})
			total += x / d
		}
	}
	sort.Slice(rates, func(i, j int) bool { return rates[i].v > rates[j].v })
	var top []string
	for _, r := range rates[:min(4, len(rates))] {
		top = append(top, fmt.Sprintf("%s %.1f", r.k, r.v))
	}
	s.out.setup = append(s.out.setup,
		[]string{fmt.Sprintf("at rest with %d simulated nodes: API server requests/s (top: %s)", s.nodes, strings.Join(top, ", ")), fmt.Sprintf("%.1f/s", total)},
		[]string{"at rest: machine CPU busy", busyPct(a, b)},
		[]string{"at rest: CPU by process, % of one core", restCPU(s.procs, a, b)})
}

// restCPU is each process's CPU between a and b (the busiest first), and what the rest
// of the machine used, in % of one core.
func restCPU(procs []*proc, a, b *snapshot) string {
	d := b.at.Sub(a.at).Seconds()
	if d <= 0 {
		return "?"
	}
	type kv struct {
		k string
		v float64
	}
	var all []kv
	listed := 0.0
	for _, p := range procs {
		c := b.cpu[p.name] - a.cpu[p.name]
		listed += c
		all = append(all, kv{p.name, c})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v })
	var out []string
	for _, x := range all {
		if x.v/d >= 0.005 {
			out = append(out, fmt.Sprintf("%s %.0f%%", x.k, 100*x.v/d))
		}
	}
	out = append(out, fmt.Sprintf("everything else (kubelet, containerd, other users' work) %.0f%%", 100*((b.busy-a.busy)/100-listed)/d))
	return strings.Join(out, ", ")
}

func busyPct(a, b *snapshot) string {
	if b.total <= a.total {
		return "?"
	}
	return fmt.Sprintf("%.0f%% of %d cores", 100*(b.busy-a.busy)/(b.total-a.total), nproc())
}

// requestsBy sums apiserver_request_total by "VERB resource[/subresource]".
func requestsBy(m metricsText) map[string]float64 { return requestsWith(m, false) }

// requestsWith is requestsBy, of the requests answered with an error only if failed.
func requestsWith(m metricsText, failed bool) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m["apiserver_request_total"] {
		if failed && strings.HasPrefix(s.labels["code"], "2") {
			continue
		}
		r := s.labels["resource"]
		if sub := s.labels["subresource"]; sub != "" {
			r += "/" + sub
		}
		if r == "" {
			r = "(non-resource)"
		}
		out[s.labels["verb"]+" "+r] += s.v
	}
	return out
}

func claimName(i int) string { return fmt.Sprintf("claim-%04d", i) }

// run creates the claims at once, waits until all are Bound, deletes them at once and
// waits until every PV is gone, then reports.
func (s *sim) run(ctx context.Context) {
	s.t.Helper()
	s.ns = "pav-scale-" + strings.ToLower(rand.String(5))
	if _, err := s.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: s.ns, Labels: map[string]string{simLabel: simValue}}}, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.trackVolumes(ctx)
	names := make([]string, s.pvcs)
	for i := range names {
		names[i] = claimName(i)
	}
	sc := provisionerName
	fs := corev1.PersistentVolumeFilesystem
	claim := func(name string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeMode: &fs,
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}}
	}
	progress := func() string {
		return fmt.Sprintf("PVCs created %d, Bound %d, gone %d; PVs created %d, gone %d; pods now: validation %d, creation %d, deletion %d; pods Failed %d; Warning events %d",
			s.rec.count(stepPVCCreated), s.rec.count(stepPVCBound), s.rec.count(stepPVCGone), s.rec.count(stepPVCreated), s.rec.count(stepPVGone),
			s.rec.liveCount("pod:validation"), s.rec.liveCount("pod:creation"), s.rec.liveCount("pod:deletion"),
			s.rec.count(podStep("validation", "Failed"))+s.rec.count(podStep("creation", "Failed"))+s.rec.count(podStep("deletion", "Failed")),
			s.rec.count(stepWarning))
	}

	before := s.snapshot(ctx)
	kcmOff := fileSize(s.kcmLog)
	stopSampling := s.sample()
	defer stopSampling()
	const workers = 64

	// Creation.
	start := time.Now()
	if err := forEach(names, workers, func(n string) error {
		if _, err := s.client.CoreV1().PersistentVolumeClaims(s.ns).Create(ctx, claim(n), metav1.CreateOptions{}); err != nil {
			return err
		}
		s.rec.mark(stepPVCCreated, n)
		return nil
	}); err != nil {
		s.t.Fatalf("creating claims: %v", err)
	}
	submitted := time.Since(start)
	s.t.Logf("%d claims created in %s", s.pvcs, submitted)
	defer s.report(before, nil, nil, start, time.Time{}, submitted, 0, 0, 0, kcmOff)
	err := s.rec.wait(ctx, s.t.Logf, fmt.Sprintf("%d claims Bound", s.pvcs),
		func() bool { return s.rec.count(stepPVCBound) >= s.pvcs }, progress)
	if err != nil {
		s.t.Fatal(err)
	}
	createDur := time.Since(start)
	s.t.Logf("all %d claims Bound after %s", s.pvcs, createDur)
	mid := s.snapshot(ctx)

	// Deletion.
	delStart := time.Now()
	if err := forEach(names, workers, func(n string) error {
		if err := s.client.CoreV1().PersistentVolumeClaims(s.ns).Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		s.rec.mark(stepPVCDeleting, n)
		return nil
	}); err != nil {
		s.t.Fatalf("deleting claims: %v", err)
	}
	delSubmitted := time.Since(delStart)
	pvs := s.rec.count(stepPVCreated)
	err = s.rec.wait(ctx, s.t.Logf, fmt.Sprintf("%d PVs gone", pvs),
		func() bool {
			return s.rec.count(stepPVCGone) >= s.pvcs && s.rec.count(stepPVGone) >= pvs && s.rec.liveCount("pv") == 0
		}, progress)
	deleteDur := time.Since(delStart)
	if err != nil {
		s.report(before, mid, nil, start, delStart, submitted, createDur, delSubmitted, 0, kcmOff)
		s.t.Fatal(err)
	}
	s.t.Logf("all %d PVs gone %s after the claims' deletion", pvs, deleteDur)
	// pav deletes its pods once their outcome is recorded: wait for that (not timed) so
	// that the request counts are complete.
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := s.rec.wait(wctx, s.t.Logf, "pav-sim's pods gone", func() bool { return s.rec.liveCount("pod") == 0 }, progress); err != nil {
		s.t.Logf("%v: the request counts below may miss their deletion", err)
	}
	stopSampling()
	after := s.snapshot(ctx)
	// Before the deferred report (which would only have the creation).
	s.report(before, mid, after, start, delStart, submitted, createDur, delSubmitted, deleteDur, kcmOff)
}

// report adds the run's sections to s.out. mid or after nil: that part did not finish.
func (s *sim) report(before, mid, after *snapshot, start, delStart time.Time, submitted, createDur, delSubmitted, deleteDur time.Duration, kcmOff int64) {
	if s.out.reported {
		return
	}
	s.out.reported = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if mid == nil {
		mid = s.snapshot(ctx)
	}
	end := after
	if end == nil {
		end = s.snapshot(ctx)
	}
	m, n := s.pvcs, float64(s.pvcs)

	// Throughput.
	thr := section{title: "Throughput", header: []string{"measure", "value"}}
	if createDur > 0 {
		thr.rows = append(thr.rows, []string{fmt.Sprintf("%d PVCs created at once (%d API calls at a time, all returned after %s) → all Bound", m, 64, secs(submitted)),
			fmt.Sprintf("%s: **%.1f PVCs/s**", secs(createDur), n/createDur.Seconds())})
	} else {
		thr.rows = append(thr.rows, []string{fmt.Sprintf("%d PVCs created at once → all Bound", m),
			fmt.Sprintf("did not finish: %d Bound after %s", s.rec.count(stepPVCBound), secs(time.Since(start)))})
	}
	if l := s.rec.latencies(stepPVCCreated, stepPVCBound); len(l) > 0 {
		thr.rows = append(thr.rows, []string{"per claim: created → Bound (p50 / p90 / max)",
			fmt.Sprintf("%s / %s / %s", secs(quantile(l, .5)), secs(quantile(l, .9)), secs(quantile(l, 1)))})
	}
	if deleteDur > 0 {
		thr.rows = append(thr.rows, []string{fmt.Sprintf("%d PVCs deleted at once (all calls returned after %s) → all PVs gone", m, secs(delSubmitted)),
			fmt.Sprintf("%s: **%.1f PVs/s**", secs(deleteDur), n/deleteDur.Seconds())})
	} else if !delStart.IsZero() {
		thr.rows = append(thr.rows, []string{fmt.Sprintf("%d PVCs deleted at once → all PVs gone", m),
			fmt.Sprintf("did not finish: %d PVs gone after %s", s.rec.count(stepPVGone), secs(time.Since(delStart)))})
	}
	if l := s.deleteLatencies(); len(l) > 0 {
		thr.rows = append(thr.rows, []string{"per volume: PVC deleted → PV gone (p50 / p90 / max)",
			fmt.Sprintf("%s / %s / %s", secs(quantile(l, .5)), secs(quantile(l, .9)), secs(quantile(l, 1)))})
	}
	failed := 0
	var examples []string
	s.rec.mu.Lock()
	for _, ph := range []string{"validation", "creation", "deletion"} {
		failed += len(s.rec.steps[podStep(ph, "Failed")])
		for k := range s.rec.steps[podStep(ph, "Failed")] {
			examples = append(examples, k)
		}
	}
	warnings := len(s.rec.steps[stepWarning])
	for k := range s.rec.steps[stepWarning] {
		if len(examples) < 3 {
			examples = append(examples, k)
		}
	}
	s.rec.mu.Unlock()
	sort.Strings(examples)
	thr.rows = append(thr.rows, []string{"pav-sim pods Failed; Warning events on the claims",
		fmt.Sprintf("%d; %d %s", failed, warnings, strings.Join(first(examples, 3), " | "))})
	s.out.add(thr)

	// Timelines.
	s.out.add(s.timeline(fmt.Sprintf("Creation timeline (s after the first create call; %d claims)", m), start, []string{
		stepPVCCreated,
		podStep("validation", "created"), podStep("validation", "scheduled"), podStep("validation", "Running"), podStep("validation", "Succeeded"),
		podStep("creation", "created"), podStep("creation", "scheduled"), podStep("creation", "Running"), podStep("creation", "Succeeded"),
		stepPVCreated, stepPVCBound, podStep("validation", "deleted"), podStep("creation", "deleted"),
	}))
	if !delStart.IsZero() {
		s.out.add(s.timeline("Deletion timeline (s after the first delete call)", delStart, []string{
			stepPVCDeleting, stepPVCGone, stepPVReleased,
			podStep("deletion", "created"), podStep("deletion", "scheduled"), podStep("deletion", "Running"), podStep("deletion", "Succeeded"),
			stepPVGone, podStep("deletion", "deleted"),
		}))
	}

	// Memory and CPU.
	mem := section{title: "Memory and CPU (/proc on the node)", header: []string{"process", "RSS idle", "RSS peak", "CPU s while creating", "CPU s while deleting"}}
	for _, p := range s.procs {
		peak := p.peak.Max()
		mem.rows = append(mem.rows, []string{p.name, fmt.Sprintf("%.1f MiB", float64(p.idle)/mib), fmt.Sprintf("%.1f MiB", float64(peak)/mib),
			fmt.Sprintf("%.1f", mid.cpu[p.name]-before.cpu[p.name]), cpuDelta(mid, after, p.name)})
	}
	others := func(a, b *snapshot) string {
		if a == nil || b == nil {
			return "—"
		}
		listed := 0.0
		for _, p := range s.procs {
			listed += b.cpu[p.name] - a.cpu[p.name]
		}
		return fmt.Sprintf("%.1f", (b.busy-a.busy)/100-listed)
	}
	mem.rows = append(mem.rows,
		[]string{"everything else on the machine (kubelet, containerd, other users' work, …)", "", "", others(before, mid), others(mid, after)},
		[]string{"machine: CPU busy", "", "", busyPct(before, mid), busyOrDash(mid, after)})
	s.out.add(mem)

	// The pav controller and its sidecar.
	reqs := func(m metricsText) float64 { return m.sum("rest_client_requests_total", nil) }
	perVol := func(a, b *snapshot, which func(*snapshot) metricsText) string {
		if a == nil || b == nil || which(a) == nil || which(b) == nil {
			return "—"
		}
		return fmt.Sprintf("%.1f", (reqs(which(b))-reqs(which(a)))/n)
	}
	pavM := func(sn *snapshot) metricsText { return sn.pav }
	mgrM := func(sn *snapshot) metricsText { return sn.manager }
	byMethod := func(a, b metricsText) string {
		if a == nil || b == nil {
			return "not scraped"
		}
		var out []string
		bb, aa := b.by("rest_client_requests_total", "method", nil), a.by("rest_client_requests_total", "method", nil)
		var keys []string
		for k := range bb {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		total := 0.0
		for _, k := range keys {
			if d := bb[k] - aa[k]; d > 0 {
				total += d
				out = append(out, fmt.Sprintf("%s %.1f", k, d/n))
			}
		}
		return fmt.Sprintf("%.1f (%s)", total/n, strings.Join(out, ", "))
	}
	limiterWait := func(a, b metricsText) string {
		if a == nil || b == nil {
			return "—"
		}
		w := b.sum("rest_client_rate_limiter_duration_seconds_sum", nil) - a.sum("rest_client_rate_limiter_duration_seconds_sum", nil)
		c := b.sum("rest_client_rate_limiter_duration_seconds_count", nil) - a.sum("rest_client_rate_limiter_duration_seconds_count", nil)
		if c <= 0 {
			return "0"
		}
		return fmt.Sprintf("%.0f s in all (%.2f s per request)", w, w/c)
	}
	drv := section{title: "pav-sim's controller (pav and external-provisioner) and the manager", header: []string{"measure", "creating", "deleting", "whole life, per volume"}}
	drv.rows = append(drv.rows,
		[]string{"pav controller plugin: API requests per volume (rest_client_requests_total)", perVol(before, mid, pavM), perVol(mid, after, pavM), byMethod(before.pav, end.pav)},
		[]string{"pav controller plugin: time its requests waited on its client rate limiter", limiterWait(before.pav, mid.pav), limiterWait(mid.pav, end.pav), ""},
		[]string{"pav controller plugin: mean API request latency (rest_client_request_duration_seconds)", meanOf(before.pav, mid.pav, "rest_client_request_duration_seconds"),
			meanOf(mid.pav, end.pav, "rest_client_request_duration_seconds"), ""},
		[]string{"pav manager: API requests per volume", perVol(before, mid, mgrM), perVol(mid, after, mgrM), byMethod(before.manager, end.manager)},
	)
	for _, ph := range []string{"validation", "creation", "deletion"} {
		keep := func(l map[string]string) bool { return l["phase"] == ph }
		c := end.pav.sum("pav_phase_duration_seconds_count", keep) - before.pav.sum("pav_phase_duration_seconds_count", keep)
		sum := end.pav.sum("pav_phase_duration_seconds_sum", keep) - before.pav.sum("pav_phase_duration_seconds_sum", keep)
		if c > 0 {
			drv.rows = append(drv.rows, []string{fmt.Sprintf("pav: %s pods, mean time from creation to outcome (pav_phase_duration_seconds)", ph), "", "",
				fmt.Sprintf("%.0f pods, %.1f s", c, sum/c)})
		}
	}
	for _, meth := range []string{"CreateVolume", "DeleteVolume"} {
		keep := func(l map[string]string) bool { return strings.HasSuffix(l["method_name"], "/"+meth) }
		c := end.sidecar.sum("csi_sidecar_operations_seconds_count", keep) - before.sidecar.sum("csi_sidecar_operations_seconds_count", keep)
		sum := end.sidecar.sum("csi_sidecar_operations_seconds_sum", keep) - before.sidecar.sum("csi_sidecar_operations_seconds_sum", keep)
		if c > 0 {
			codes := end.sidecar.by("csi_sidecar_operations_seconds_count", "grpc_status_code", keep)
			prev := before.sidecar.by("csi_sidecar_operations_seconds_count", "grpc_status_code", keep)
			var cs []string
			for k, v := range codes {
				if d := v - prev[k]; d > 0 {
					cs = append(cs, fmt.Sprintf("%s %.0f", k, d))
				}
			}
			sort.Strings(cs)
			drv.rows = append(drv.rows, []string{fmt.Sprintf("external-provisioner: %s calls to pav, mean duration (csi_sidecar_operations_seconds)", meth), "", "",
				fmt.Sprintf("%.0f calls (%s), %.1f s", c, strings.Join(cs, ", "), sum/c)})
		}
	}
	for _, q := range []string{"claims", "volumes"} {
		keep := func(l map[string]string) bool { return l["name"] == q }
		c := end.sidecar.sum("workqueue_queue_duration_seconds_count", keep) - before.sidecar.sum("workqueue_queue_duration_seconds_count", keep)
		w := end.sidecar.sum("workqueue_queue_duration_seconds_sum", keep) - before.sidecar.sum("workqueue_queue_duration_seconds_sum", keep)
		r := end.sidecar.sum("workqueue_retries_total", keep) - before.sidecar.sum("workqueue_retries_total", keep)
		if c > 0 {
			drv.rows = append(drv.rows, []string{fmt.Sprintf("external-provisioner: work queue %q: items, mean wait for a worker, retries", q), "", "",
				fmt.Sprintf("%.0f, %.2f s, %.0f", c, w/c, r)})
		}
	}
	if s.ctrlPod != nil {
		lctx, lcancel := context.WithTimeout(context.Background(), time.Minute)
		for _, c := range []struct{ container, name string }{{"csi-provisioner", "external-provisioner"}, {"pav", "pav controller plugin"}} {
			k, longest := throttling(s.containerLog(lctx, s.ctrlPod, c.container, start))
			drv.rows = append(drv.rows, []string{c.name + ": client-go \"client-side throttling\" log lines (≤ 1 a second), longest wait", "", "",
				fmt.Sprintf("%d, %s", k, secs(longest))})
		}
		lcancel()
	}
	s.out.add(drv)

	// The control plane's clients.
	cp := section{title: "The control plane's own clients", header: []string{"measure", "creating", "deleting"}}
	cp.rows = append(cp.rows,
		[]string{"kube-controller-manager (PV binder, PVC protection, …; --kube-api-qps 20 each): time its requests waited on client rate limiters", limiterWait(before.kcm, mid.kcm), limiterWait(mid.kcm, end.kcm)},
		[]string{"… of which, by verb", limiterByVerb(before.kcm, mid.kcm), limiterByVerb(mid.kcm, end.kcm)},
		[]string{"kube-scheduler (--kube-api-qps 50): time its requests waited on its client rate limiter", limiterWait(before.scheduler, mid.scheduler), limiterWait(mid.scheduler, end.scheduler)},
	)
	// The PV controller's queues and the PVC protection controller's: how long a
	// claim or volume waited for a worker, and how long the worker took.
	for _, q := range []string{"claims", "volumes", "pvcprotection"} {
		cp.rows = append(cp.rows, []string{fmt.Sprintf("kube-controller-manager work queue %q: items; mean wait in the queue; mean work", q),
			queueStats(before.kcm, mid.kcm, q), queueStats(mid.kcm, end.kcm, q)})
	}
	k, longest := throttling(fileFrom(s.kcmLog, kcmOff))
	cp.rows = append(cp.rows, []string{"kube-controller-manager: \"client-side throttling\" log lines (--v=1: ≤ 1 per 10 s), longest wait", fmt.Sprintf("%d, %s", k, secs(longest)), ""})
	s.out.add(cp)

	// The API server.
	api := section{title: "API server requests (apiserver_request_total; the test's own calls included: 1 create and 1 delete per claim, its watches)",
		header: []string{"verb resource", "creating", "deleting", "per volume", "of which errors (not 2xx)"}}
	rb, rm, re := requestsBy(before.apiserver), requestsBy(mid.apiserver), requestsBy(end.apiserver)
	fb, fe := requestsWith(before.apiserver, true), requestsWith(end.apiserver, true)
	var keys []string
	for k := range re {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var allC, allD, otherC, otherD float64
	for _, k := range keys {
		c, d := rm[k]-rb[k], re[k]-rm[k]
		if after == nil {
			d = 0
		}
		allC, allD = allC+c, allD+d
		_, res, _ := strings.Cut(k, " ")
		res, _, _ = strings.Cut(res, "/")
		switch res {
		case "pods", "persistentvolumes", "persistentvolumeclaims", "pavvolumes", "events":
			if c+d > 0 {
				errs := ""
				if e := fe[k] - fb[k]; e > 0 {
					errs = fmt.Sprintf("%.0f", e)
				}
				api.rows = append(api.rows, []string{k, fmt.Sprintf("%.0f", c), fmt.Sprintf("%.0f", d), fmt.Sprintf("%.2f", (c+d)/n), errs})
			}
		default:
			otherC, otherD = otherC+c, otherD+d
		}
	}
	api.rows = append(api.rows,
		[]string{"all other resources (leases, nodes, …)", fmt.Sprintf("%.0f", otherC), fmt.Sprintf("%.0f", otherD), fmt.Sprintf("%.2f", (otherC+otherD)/n), ""},
		[]string{"**all**", fmt.Sprintf("%.0f (%.0f/s)", allC, allC/mid.at.Sub(before.at).Seconds()), fmt.Sprintf("%.0f (%.0f/s)", allD, allD/end.at.Sub(mid.at).Seconds()), fmt.Sprintf("%.2f", (allC+allD)/n), ""},
	)
	apf := func(a, b metricsText) string {
		if a == nil || b == nil {
			return "—"
		}
		w := b.sum("apiserver_flowcontrol_request_wait_duration_seconds_sum", nil) - a.sum("apiserver_flowcontrol_request_wait_duration_seconds_sum", nil)
		r := b.sum("apiserver_flowcontrol_rejected_requests_total", nil) - a.sum("apiserver_flowcontrol_rejected_requests_total", nil)
		return fmt.Sprintf("%.1f s queued, %.0f rejected", w, r)
	}
	api.rows = append(api.rows, []string{"API priority and fairness: time requests queued, requests rejected", apf(before.apiserver, mid.apiserver), apf(mid.apiserver, end.apiserver), "", ""})
	s.out.add(api)
}

// limiterByVerb: client-go's rate-limiter wait between a and b, by verb.
func limiterByVerb(a, b metricsText) string {
	if a == nil || b == nil {
		return "—"
	}
	wa, wb := a.by("rest_client_rate_limiter_duration_seconds_sum", "verb", nil), b.by("rest_client_rate_limiter_duration_seconds_sum", "verb", nil)
	var out []string
	for v, x := range wb {
		if d := x - wa[v]; d >= 0.5 {
			out = append(out, fmt.Sprintf("%s %.0f s", v, d))
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// meanOf: the mean of a histogram between a and b.
func meanOf(a, b metricsText, name string) string {
	if a == nil || b == nil {
		return "—"
	}
	c := b.sum(name+"_count", nil) - a.sum(name+"_count", nil)
	if c <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.3f s (%.0f requests)", (b.sum(name+"_sum", nil)-a.sum(name+"_sum", nil))/c, c)
}

// queueStats: a work queue's items, mean queue wait and mean work time between a and b.
func queueStats(a, b metricsText, q string) string {
	if a == nil || b == nil {
		return "—"
	}
	keep := func(l map[string]string) bool { return l["name"] == q }
	d := func(name string) float64 { return b.sum(name, keep) - a.sum(name, keep) }
	adds, qc, wc := d("workqueue_adds_total"), d("workqueue_queue_duration_seconds_count"), d("workqueue_work_duration_seconds_count")
	if qc <= 0 || wc <= 0 {
		return fmt.Sprintf("%.0f", adds)
	}
	return fmt.Sprintf("%.0f; %.2f s; %.3f s", adds, d("workqueue_queue_duration_seconds_sum")/qc, d("workqueue_work_duration_seconds_sum")/wc)
}

func cpuDelta(a, b *snapshot, name string) string {
	if a == nil || b == nil {
		return "—"
	}
	return fmt.Sprintf("%.1f", b.cpu[name]-a.cpu[name])
}

func busyOrDash(a, b *snapshot) string {
	if a == nil || b == nil {
		return "—"
	}
	return busyPct(a, b)
}

// deleteLatencies: for every PV gone, from its claim's delete call.
func (s *sim) deleteLatencies() []time.Duration {
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	var out []time.Duration
	for pv, gone := range s.rec.steps[stepPVGone] {
		if t0, ok := s.rec.steps[stepPVCDeleting][s.rec.pvClaim[pv]]; ok {
			out = append(out, gone.Sub(t0))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// timeline is a table of steps: how many objects reached each, and when the first, the
// median and the last did, relative to start. The step where the median jumps is where
// the volumes queue.
func (s *sim) timeline(title string, start time.Time, steps []string) section {
	sec := section{title: title, header: []string{"step", "count", "first", "median", "last"}}
	for _, st := range steps {
		ts := s.rec.times(st)
		if len(ts) == 0 {
			sec.rows = append(sec.rows, []string{st, "0", "", "", ""})
			continue
		}
		rel := func(t time.Time) string { return fmt.Sprintf("%.1f", t.Sub(start).Seconds()) }
		sec.rows = append(sec.rows, []string{st, fmt.Sprint(len(ts)), rel(ts[0]), rel(quantile(ts, .5)), rel(ts[len(ts)-1])})
	}
	return sec
}

// section is one table of the report.
type section struct {
	title  string
	header []string
	rows   [][]string
}

// report is what the run prints (and saves in _output/scale/).
type report struct {
	s                  *sim
	setup              [][]string
	daemonSets, dsPods int
	sections           []section
	reported           bool
}

func newReport(s *sim) *report { return &report{s: s} }

func (r *report) add(sec section) { r.sections = append(r.sections, sec) }

func (r *report) print() {
	var b strings.Builder
	host, _ := os.Hostname()
	kernel, _ := exec.Command("uname", "-r").Output()
	fmt.Fprintf(&b, "\npav bench-scale: %d simulated nodes (kwok), %d PVCs; machine %s, %d cores (nproc), kernel %s, %s\n",
		r.s.nodes, r.s.pvcs, host, nproc(), strings.TrimSpace(string(kernel)), time.Now().UTC().Format(time.RFC3339))
	all := append([]section{{title: "Setup", header: []string{"step", "time / value"}, rows: r.setup}}, r.sections...)
	for _, sec := range all {
		fmt.Fprintf(&b, "\n%s\n\n| %s |\n|%s\n", sec.title, strings.Join(sec.header, " | "), strings.Repeat("---|", len(sec.header)))
		for _, row := range sec.rows {
			fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
		}
	}
	fmt.Fprintln(&b)
	_, _ = io.WriteString(os.Stdout, b.String())
	path := filepath.Join(r.s.logDir, fmt.Sprintf("report-%dx%d-%s.md", r.s.nodes, r.s.pvcs, time.Now().UTC().Format("20060102T150405Z")))
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err == nil {
		r.s.t.Logf("report saved in %s", path)
	}
}
