//go:build bench

package bench

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/pods-as-volumes/pav/podrunner"
)

// The timelines of bench-peers: what the bench's watches saw happen to the objects of a
// volume's life (claim, PV, client pod, pav's phase pods, local-path's helper pods, and
// the events about them), each stamped with the time its watch event reached the bench.
// They show where the time of a measure goes, step by step, against the peers (issue 37,
// "Find it with timelines of one volume's life"). What the API never shows (the kubelet's
// NodeStageVolume and NodePublishVolume, a container's real exit) is in the kubelet's and
// the drivers' logs; the docs say where.

const (
	annSelectedNode = "volume.kubernetes.io/selected-node"
	localPathNS     = "local-path-storage"
	hostpathNS      = "csi-hostpath" // the peer's install (its manifests put upstream's plugin there)

	// stepClaimRefused is the step of a client pod whose claim the kubelet was not yet
	// allowed to read (event FailedMount, "… no relationship found between node …"): the
	// API server's node authorizer had not linked the pod, just bound to the node, to
	// that node when the kubelet asked. A race of Kubernetes' own, whatever the driver,
	// more likely the busier the API server; the kubelet tries the pod again only after
	// its sync back-off, 10 to 15 s later.
	stepClaimRefused = "claim refused to the kubelet (node authorizer race)"
)

// mark is one step of one object, as the bench saw it.
type mark struct {
	at   time.Time
	role string // "claim", "PV", "client pod", "pav creation pod", "local-path helper (create)", "event"
	obj  string
	step string
}

// recorder keeps the marks of the objects of the bench's namespaces, of the bench-peers
// provisioner's phase pods and of local-path's helper pods.
type recorder struct {
	mu     sync.Mutex
	marks  []mark
	seen   map[string]bool // role/obj/uid/step marked already
	nss    map[string]bool // the bench's namespaces
	pvs    map[string]bool // PVs of the bench's claims
	stop   context.CancelFunc
	synced []cache.InformerSynced
}

// newRecorder starts watching pods, claims, PVs and events cluster-wide (it filters on
// its side: a few hundred objects on the local cluster).
func newRecorder(ctx context.Context) *recorder {
	ctx, cancel := context.WithCancel(ctx)
	r := &recorder{seen: map[string]bool{}, nss: map[string]bool{}, pvs: map[string]bool{}, stop: cancel}
	f := informers.NewSharedInformerFactory(client, 0)
	add := func(inf cache.SharedIndexInformer, h func(obj any, deleted bool)) {
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { h(o, false) },
			UpdateFunc: func(_, o any) { h(o, false) },
			DeleteFunc: func(o any) {
				if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
					o = d.Obj
				}
				h(o, true)
			},
		})
		r.synced = append(r.synced, inf.HasSynced)
	}
	add(f.Core().V1().Pods().Informer(), r.pod)
	add(f.Core().V1().PersistentVolumeClaims().Informer(), r.claim)
	add(f.Core().V1().PersistentVolumes().Informer(), r.pv)
	add(f.Core().V1().Events().Informer(), r.event)
	f.Start(ctx.Done())
	cache.WaitForCacheSync(ctx.Done(), r.synced...)
	return r
}

// watchNamespace adds one of the bench's namespaces.
func (r *recorder) watchNamespace(ns string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nss[ns] = true
}

func (r *recorder) mark(role, obj, uid, step string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := role + "/" + obj + "/" + uid + "/" + step
	if r.seen[k] {
		return
	}
	r.seen[k] = true
	r.marks = append(r.marks, mark{time.Now(), role, obj, step})
}

func (r *recorder) ours(ns string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nss[ns]
}

// podRole says whose pod this is, or "" for a pod the bench does not follow.
func (r *recorder) podRole(p *corev1.Pod) string {
	switch {
	case p.Labels[podrunner.LabelProvisioner] == peersProvisioner:
		return "pav " + p.Labels[podrunner.LabelPhase] + " pod"
	case p.Namespace == localPathNS && strings.HasPrefix(p.Name, "helper-pod-create-"):
		return "local-path helper pod (create)"
	case p.Namespace == localPathNS && strings.HasPrefix(p.Name, "helper-pod-delete-"):
		return "local-path helper pod (delete)"
	case r.ours(p.Namespace):
		return "client pod"
	}
	return ""
}

func (r *recorder) pod(o any, deleted bool) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	role := r.podRole(p)
	if role == "" {
		return
	}
	m := func(step string) { r.mark(role, p.Name, string(p.UID), step) }
	if deleted {
		m("gone")
		return
	}
	m("created")
	if p.Spec.NodeName != "" {
		m("scheduled (" + p.Spec.NodeName + ")")
	}
	var started, exited int
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil || cs.State.Terminated != nil {
			started++
		}
		if cs.State.Terminated != nil {
			exited++
		}
	}
	if n := len(p.Spec.Containers); n > 0 {
		if started == n {
			m("containers started")
		}
		if exited == n {
			m("containers exited")
		}
	}
	if p.Status.Phase != corev1.PodPending && p.Status.Phase != "" {
		m("phase " + string(p.Status.Phase))
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			m("Ready")
		}
	}
	if p.DeletionTimestamp != nil {
		m("deleting")
	}
}

func (r *recorder) claim(o any, deleted bool) {
	c, ok := o.(*corev1.PersistentVolumeClaim)
	if !ok || !r.ours(c.Namespace) {
		return
	}
	m := func(step string) { r.mark("claim", c.Name, string(c.UID), step) }
	if deleted {
		m("gone")
		return
	}
	m("created")
	if n := c.Annotations[annSelectedNode]; n != "" {
		m("selected-node (" + n + ")")
	}
	if c.Status.Phase == corev1.ClaimBound {
		m("Bound")
	}
	if c.DeletionTimestamp != nil {
		m("deleting")
	}
}

func (r *recorder) pv(o any, deleted bool) {
	pv, ok := o.(*corev1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef == nil || !r.ours(pv.Spec.ClaimRef.Namespace) {
		return
	}
	r.mu.Lock()
	r.pvs[pv.Name] = true
	r.mu.Unlock()
	m := func(step string) { r.mark("PV", pv.Name, string(pv.UID), step) }
	if deleted {
		m("gone")
		return
	}
	m("created")
	if pv.Status.Phase != corev1.VolumePending && pv.Status.Phase != corev1.VolumeAvailable && pv.Status.Phase != "" {
		m(string(pv.Status.Phase))
	}
	if pv.DeletionTimestamp != nil {
		m("deleting")
	}
}

func (r *recorder) event(o any, deleted bool) {
	e, ok := o.(*corev1.Event)
	if !ok || deleted {
		return
	}
	inv := e.InvolvedObject
	r.mu.Lock()
	inBench := r.nss[inv.Namespace] // a client pod's, a claim's
	follow := inBench || (inv.Kind == "PersistentVolume" && r.pvs[inv.Name])
	r.mu.Unlock()
	if !follow && inv.Kind == "Pod" {
		follow = strings.HasPrefix(inv.Name, "pav-"+peersProvisioner+"-") || (inv.Namespace == localPathNS && strings.HasPrefix(inv.Name, "helper-pod-"))
	}
	if !follow {
		return
	}
	msg := e.Message
	if len(msg) > 100 {
		msg = msg[:100] + "…"
	}
	if inv.Kind == "Pod" && inBench && claimRefused(e) {
		r.mark("client pod", inv.Name, string(inv.UID), stepClaimRefused)
	}
	// An event is marked when first seen and when its count grows (a repeated
	// event is one object whose count the recorder raises).
	r.mark("event", inv.Kind+" "+inv.Name, fmt.Sprintf("%s/%d", e.UID, e.Count), e.Reason+": "+msg)
}

// claimRefused says whether an event is the kubelet's of stepClaimRefused.
func claimRefused(e *corev1.Event) bool {
	return e.Reason == "FailedMount" && strings.Contains(e.Message, "no relationship found between node")
}

// refused counts the client pods that had stepClaimRefused between from and to (one
// system's repetition: the systems' repetitions never overlap).
func (r *recorder) refused(from, to time.Time) int {
	n := 0
	for _, m := range r.window(from, to) {
		if m.role == "client pod" && m.step == stepClaimRefused {
			n++
		}
	}
	return n
}

// window returns the marks between from and to, in order.
func (r *recorder) window(from, to time.Time) []mark {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []mark
	for _, m := range r.marks {
		if !m.at.Before(from) && !m.at.After(to) {
			out = append(out, m)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// printOne writes the marks of one volume's measure, one a line, as seconds after
// start; the bench's own steps (what it did, what it measured) are in the list it is given.
func printOne(w io.Writer, title string, start time.Time, marks []mark) {
	fmt.Fprintf(w, "\n%s; 0 = %s UTC (the clock of the cluster's logs)\n\n", title, start.UTC().Format("15:04:05.000"))
	fmt.Fprintln(w, "| s | object | step |")
	fmt.Fprintln(w, "|---:|---|---|")
	for _, m := range marks {
		obj := m.role
		if m.obj != "" {
			obj += " " + m.obj
		}
		fmt.Fprintf(w, "| %+.3f | %s | %s |\n", m.at.Sub(start).Seconds(), obj, m.step)
	}
}

// printSteps writes, for a measure of many volumes at once, how many objects reached
// each step and when the first, the median and the last did (s after start): where
// the volumes queue. Events are left out (one line per reason would drown the steps).
func printSteps(w io.Writer, title string, start time.Time, marks []mark) {
	type step struct {
		key string
		at  []time.Duration
	}
	steps := map[string]*step{}
	var order []*step
	for _, m := range marks {
		if m.role == "event" || m.role == "bench" {
			continue
		}
		s := m.step
		if i := strings.Index(s, " ("); i > 0 { // "scheduled (vm-2)": one step whatever the node
			s = s[:i]
		}
		k := m.role + ": " + s
		st := steps[k]
		if st == nil {
			st = &step{key: k}
			steps[k] = st
			order = append(order, st)
		}
		st.at = append(st.at, m.at.Sub(start))
	}
	fmt.Fprintf(w, "\n%s; 0 = %s UTC\n\n", title, start.UTC().Format("15:04:05.000"))
	fmt.Fprintln(w, "| step | objects | first s | median s | last s |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
	for _, st := range order {
		fmt.Fprintf(w, "| %s | %d | %.2f | %.2f | %.2f |\n", st.key, len(st.at), st.at[0].Seconds(), median(st.at).Seconds(), st.at[len(st.at)-1].Seconds())
	}
}
