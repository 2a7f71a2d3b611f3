//go:build e2e

package e2e

// TestOutage (make e2e-outage, PAV_OUTAGE=1; issue 36): pav after the API server was down
// for 5 minutes. Every pav pod (the manager, and every provisioner's controller and node
// plugins, all their containers) must be Ready within 60 s of the API server's return, and a
// volume requested during the outage bound within 2 minutes of it; afterwards each phase ran
// once per volume and nothing is left.
//
// "A volume requested during the outage" is two claims of pav-e2e, since no client can
// create anything while the API server is down:
//   - in-flight: created just before the outage, which begins once its creation pod runs
//     (the class's createSleep keeps it running 30 s): the pod finishes during the outage,
//     and pav finds out afterwards, from an operation the outage interrupted;
//   - requested: created by a client that tries every second from the outage's start, as a
//     GitOps controller or a job retrying would: it exists from the API server's first
//     answer, and everything about it happens after the return.
//
// The test prints what it measured (per pod kind, each claim, restarts, CrashLoopBackOff);
// CHANGELOG.md and docs/operations.md#api-server-outages hold the figures.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/podrunner"
)

const (
	outageReadyWithin = 60 * time.Second // every pav pod Ready after the return
	outageBoundWithin = 2 * time.Minute  // both claims Bound after the return
	// outageSettle: everything must have held this long before the test stops watching, so
	// that a pod Ready at first and failing later (a container restarting after the return)
	// is seen.
	outageSettle = 30 * time.Second
)

// apiServerDown kills the API server (SIGKILL: a crash), runs during (if any) once it is dead,
// keeps it down for down, and starts it again with its own command line, the way
// hack/cluster/up.sh starts its daemons (its own session, descriptors beyond 0-2 closed —
// such as the cluster lock's — and its pid in its pid file). Not up.sh itself: that imports
// every image archive before the API server starts, which would stretch the outage by as
// long. It returns when the API server died and when its /readyz first answered ok.
func apiServerDown(ctx context.Context, down time.Duration, who string, during func()) (died, back time.Time, err error) {
	pid, err := daemonPid("kube-apiserver")
	if err != nil {
		return died, back, err
	}
	argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return died, back, err
	}
	args := strings.Split(strings.TrimRight(string(argv), "\x00"), "\x00")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return died, back, err
	}
	if err := until(ctx, time.Minute, func(context.Context) (bool, error) { return syscall.Kill(pid, 0) != nil, nil }); err != nil {
		return died, back, fmt.Errorf("the API server (pid %d) did not die: %v", pid, err)
	}
	died = time.Now()
	if during != nil {
		during()
	}
	soakPause(ctx, down) // cut short if the test ends: the API server is started again all the same
	logf, err := os.OpenFile(filepath.Join(clusterDir(), "logs", "kube-apiserver.log"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return died, back, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "==== %s start (%s)\n", time.Now().Format(time.RFC3339), who)
	cmd := exec.Command("setsid", append([]string{"bash", "-c", `for fd in /proc/$$/fd/*; do fd=${fd##*/}
      if [ "$fd" -gt 2 ] && [ -e "/proc/$$/fd/$fd" ]; then eval "exec $fd>&-"; fi; done
    echo $$ > "$0"; exec "$@"`, filepath.Join(clusterDir(), "run", "kube-apiserver.pid")}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return died, back, fmt.Errorf("starting the API server again: %v", err)
	}
	go func() { _ = cmd.Wait() }() // reaped whenever it ends; it outlives the test
	deadline := time.Now().Add(soakStep)
	for {
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		b, err := client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		cancel()
		if err == nil && strings.HasPrefix(string(b), "ok") {
			return died, time.Now(), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return died, back, fmt.Errorf("the API server's /readyz did not answer ok within %v of its start: %v", soakStep, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// pavPod is what the test follows of one of pav's own pods (the manager, a controller or
// node plugin; not the pods of phases).
type pavPod struct {
	kind       string // manager, controller, node
	provider   string // the provisioner (app.kubernetes.io/instance), "" for the manager
	node       string
	restarts   map[string]int32 // per container, when first seen
	ready      bool
	readySince time.Time // the Ready condition's last transition (the kubelet's clock, this machine's)
	notReadyAt time.Time // the last poll after the return that saw it not Ready
	crashLoop  map[string]bool
	last       *corev1.Pod
}

func (p *pavPod) name() string {
	if p.last == nil {
		return "?"
	}
	return p.last.Name
}

// readyAfter is how long after back the pod became Ready for good.
func (p *pavPod) readyAfter(back time.Time) time.Duration {
	at := p.readySince
	if p.notReadyAt.After(at) {
		at = p.notReadyAt
	}
	return max(at.Sub(back), 0)
}

func (p *pavPod) restarted() map[string]int32 {
	out := map[string]int32{}
	for _, c := range p.last.Status.ContainerStatuses {
		if d := c.RestartCount - p.restarts[c.Name]; d > 0 {
			out[c.Name] = d
		}
	}
	return out
}

// workloadPods lists pav's own pods (app.kubernetes.io/name=pav in namespace pav).
func workloadPods(ctx context.Context) ([]corev1.Pod, error) {
	return pavPodsOf(ctx, "app.kubernetes.io/name=pav")
}

func readyCondition(p *corev1.Pod) (bool, time.Time) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue, c.LastTransitionTime.Time
		}
	}
	return false, time.Time{}
}

// TestOutage: see the top of this file.
func TestOutage(t *testing.T) {
	if os.Getenv("PAV_OUTAGE") != "1" {
		t.Skip("make e2e-outage runs it (PAV_OUTAGE=1): it takes the API server down for 5 minutes")
	}
	down := 5 * time.Minute
	if s := os.Getenv("PAV_OUTAGE_DOWN"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("PAV_OUTAGE_DOWN=%q is not a positive duration", s)
		}
		down = d
	}
	e := newLongEnv(t, down+20*time.Minute)
	ctx := e.ctx

	// pav whole before it starts
	pods := map[string]*pavPod{}
	e.pollFor("every pav pod Ready", 3*time.Minute, func() (bool, error) {
		list, err := workloadPods(ctx)
		if err != nil || len(list) == 0 {
			return false, err
		}
		for _, p := range list {
			if !podReady(&p) {
				return false, fmt.Errorf("%s not Ready", p.Name)
			}
		}
		return true, nil
	})
	list, err := workloadPods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	track := func(p *corev1.Pod) *pavPod {
		pp := pods[p.Name]
		if pp == nil {
			pp = &pavPod{kind: p.Labels["app.kubernetes.io/component"], provider: p.Labels["app.kubernetes.io/instance"],
				node: p.Spec.NodeName, restarts: map[string]int32{}, crashLoop: map[string]bool{}}
			for _, c := range p.Status.ContainerStatuses {
				pp.restarts[c.Name] = c.RestartCount
			}
			pods[p.Name] = pp
		}
		pp.last = p
		return pp
	}
	for i := range list {
		track(&list[i])
	}

	slow := e.storageClass(map[string]string{"createSleep": "30"}, corev1.PersistentVolumeReclaimDelete)
	fast := e.storageClass(nil, corev1.PersistentVolumeReclaimDelete)
	inFlight := e.claim("in-flight", slow, claimOpts{})
	volInFlight := "pvc-" + string(inFlight.UID)
	e.pollFor("claim in-flight's creation pod running", 2*time.Minute, func() (bool, error) {
		for _, p := range volumePods(ctx, volInFlight, "") {
			if p.Labels[podrunner.LabelPhase] == "creation" && p.Status.Phase == corev1.PodRunning {
				return true, nil
			}
		}
		return false, nil
	})

	requested := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "requested", Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &fast, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}}
	var requestedAt atomic.Pointer[time.Time]
	requester := func() {
		go func() {
			for ctx.Err() == nil {
				rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := client.CoreV1().PersistentVolumeClaims(e.ns).Create(rctx, requested, metav1.CreateOptions{})
				cancel()
				if err == nil || apierrors.IsAlreadyExists(err) {
					now := time.Now()
					requestedAt.Store(&now)
					return
				}
				time.Sleep(time.Second)
			}
		}()
	}
	// The Leases in use: renewed within a minute (a removed provisioner's, or a sidecar's
	// that a provisioner no longer has, stays, renewed by nobody).
	liveLeases := map[string]bool{}
	if l, err := client.CoordinationV1().Leases("pav").List(ctx, metav1.ListOptions{}); err == nil {
		for _, lease := range l.Items {
			if lease.Spec.RenewTime != nil && time.Since(lease.Spec.RenewTime.Time) < time.Minute {
				liveLeases[lease.Name] = true
			}
		}
	}
	t.Logf("outage: taking the API server down for %v", down)
	died, back, err := apiServerDown(ctx, down, "TestOutage", requester)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("outage: the API server died at %s and was ready again at %s, %v later", died.Format(time.TimeOnly), back.Format(time.TimeOnly), back.Sub(died).Round(time.Second))

	// Watch until every pav pod is Ready, both claims are Bound, and all held for
	// outageSettle; at most until both limits are past by outageSettle.
	bound := map[string]time.Time{}
	leaseBack := map[string]time.Time{} // each Lease of namespace pav: first renewed after the return
	var leases []string
	settled := time.Time{}
	stop := back.Add(max(outageReadyWithin, outageBoundWithin) + outageSettle)
	for {
		now := time.Now()
		whole := true
		if list, err := workloadPods(ctx); err == nil {
			seen := map[string]bool{}
			for i := range list {
				p := track(&list[i])
				seen[list[i].Name] = true
				p.ready, p.readySince = readyCondition(&list[i])
				if !p.ready {
					p.notReadyAt, whole = now, false
				}
				for _, c := range list[i].Status.ContainerStatuses {
					if c.State.Waiting != nil && c.State.Waiting.Reason == "CrashLoopBackOff" {
						p.crashLoop[c.Name] = true
					}
				}
			}
			for name, p := range pods {
				if !seen[name] && p.ready {
					p.ready, p.notReadyAt = false, now // gone: replaced, or deleted
				}
			}
		} else {
			whole = false
		}
		for _, name := range []string{"in-flight", "requested"} {
			if _, ok := bound[name]; ok {
				continue
			}
			if c, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, name, metav1.GetOptions{}); err == nil && c.Status.Phase == corev1.ClaimBound {
				bound[name] = now
			}
		}
		if l, err := client.CoordinationV1().Leases("pav").List(ctx, metav1.ListOptions{}); err == nil {
			leases = leases[:0]
			for _, lease := range l.Items {
				if !liveLeases[lease.Name] {
					continue
				}
				leases = append(leases, lease.Name)
				if _, ok := leaseBack[lease.Name]; !ok && lease.Spec.RenewTime != nil && lease.Spec.RenewTime.After(back) {
					leaseBack[lease.Name] = now
				}
			}
		}
		whole = whole && len(bound) == 2 && len(leaseBack) == len(leases)
		switch {
		case !whole:
			settled = time.Time{}
		case settled.IsZero():
			settled = now
		}
		if (!settled.IsZero() && now.Sub(settled) >= outageSettle) || now.After(stop) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}

	// What it measured.
	type worst struct {
		after time.Duration
		pod   string
		n     int
	}
	byKind := map[string]*worst{}
	var restarts, crashLoops, late []string
	for name, p := range pods {
		w := byKind[p.kind]
		if w == nil {
			w = &worst{}
			byKind[p.kind] = w
		}
		w.n++
		after := p.readyAfter(back)
		if !p.ready {
			late = append(late, fmt.Sprintf("%s not Ready %v after the return", name, time.Since(back).Round(time.Second)))
		} else if after > outageReadyWithin {
			late = append(late, fmt.Sprintf("%s Ready %v after the return", name, after.Round(time.Second)))
		}
		if after >= w.after {
			w.after, w.pod = after, name
		}
		for c, n := range p.restarted() {
			restarts = append(restarts, fmt.Sprintf("%s/%s ×%d", name, c, n))
		}
		for c := range p.crashLoop {
			crashLoops = append(crashLoops, name+"/"+c)
		}
	}
	sort.Strings(restarts)
	sort.Strings(crashLoops)
	sort.Strings(late)
	var kinds []string
	for _, k := range []string{"manager", "controller", "node"} {
		if w := byKind[k]; w != nil {
			kinds = append(kinds, fmt.Sprintf("%s %s (%d pods; slowest %s)", k, since(w.after), w.n, w.pod))
		}
	}
	var leaseTimes []string
	slices.Sort(leases)
	for _, l := range leases {
		if at, ok := leaseBack[l]; ok {
			leaseTimes = append(leaseTimes, fmt.Sprintf("%s %s", l, since(at.Sub(back))))
		} else {
			leaseTimes = append(leaseTimes, l+" not renewed")
		}
	}
	claimTimes := []string{}
	for _, name := range []string{"in-flight", "requested"} {
		if at, ok := bound[name]; ok {
			claimTimes = append(claimTimes, fmt.Sprintf("%s Bound %s", name, since(at.Sub(back))))
		} else {
			claimTimes = append(claimTimes, name+" not Bound")
		}
	}
	if at := requestedAt.Load(); at != nil {
		claimTimes = append(claimTimes, fmt.Sprintf("requested created %s", since(at.Sub(back))))
	}
	none := func(s []string) string {
		if len(s) == 0 {
			return "none"
		}
		return strings.Join(s, ", ")
	}
	t.Logf("outage: API server down %v; after its return: Ready: %s", back.Sub(died).Round(time.Second), strings.Join(kinds, "; "))
	t.Logf("outage: claims: %s", strings.Join(claimTimes, ", "))
	t.Logf("outage: Leases renewed: %s", strings.Join(leaseTimes, ", "))
	t.Logf("outage: container restarts (during the outage or after): %s; CrashLoopBackOff seen after the return: %s", none(restarts), none(crashLoops))

	for _, l := range late {
		t.Errorf("%s, want Ready within %v", l, outageReadyWithin)
	}
	for _, name := range []string{"in-flight", "requested"} {
		if at, ok := bound[name]; !ok || at.Sub(back) > outageBoundWithin {
			t.Errorf("claim %s not Bound within %v of the API server's return", name, outageBoundWithin)
		}
	}
	if len(leaseBack) != len(leases) {
		t.Errorf("Leases not renewed after the return: %s", strings.Join(leaseTimes, ", "))
	}

	// Nothing left: each volume made and deleted once, no PV, record or pod.
	vols := map[string]string{volInFlight: "e2e-" + e.ns + "-in-flight"}
	if c, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(ctx, "requested", metav1.GetOptions{}); err == nil {
		vols["pvc-"+string(c.UID)] = "e2e-" + e.ns + "-requested"
	}
	e.deleteClaim("in-flight")
	e.deleteClaim("requested")
	for vol, handle := range vols {
		e.waitPVGone(vol)
		e.pollFor("the record and pods of "+vol+" gone", 2*time.Minute, func() (bool, error) {
			r, err := record(ctx, vol)
			return err == nil && r == nil && len(volumePods(ctx, vol, handle)) == 0, err
		})
		e.wantRuns("creation", vol, 1)
		e.pollFor("the deletion of "+handle+" counted", time.Minute, func() (bool, error) { return runs("deletion", handle) == 1, nil })
	}
}

// since shows a time after the return: "+12s" (or before it: "-1s").
func since(d time.Duration) string {
	if d < 0 {
		return d.Round(time.Second).String()
	}
	return "+" + d.Round(time.Second).String()
}
