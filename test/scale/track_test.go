//go:build scale

package scale

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/pods-as-volumes/pav/podrunner"
)

// recorder keeps, for every step of the run ("PVC Bound", "creation pod Succeeded", …),
// when each object first reached it, as the informers saw it. Waiting is on its change
// signal: no polling.
type recorder struct {
	mu      sync.Mutex
	changed chan struct{} // closed (and replaced) at every change
	steps   map[string]map[string]time.Time
	// live counts objects that exist now, by kind ("pod:creation", "pv", "pvc", "node").
	live map[string]map[string]bool
	// pvClaim: a pav-sim PV's claim name.
	pvClaim map[string]string
	// abort, once closed, fails every wait (kwok exited).
	abort chan struct{}
	why   string
}

func newRecorder() *recorder {
	return &recorder{changed: make(chan struct{}), steps: map[string]map[string]time.Time{},
		live: map[string]map[string]bool{}, pvClaim: map[string]string{}, abort: make(chan struct{})}
}

func (r *recorder) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// mark records that name reached step now (the first time only).
func (r *recorder) mark(step, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.steps[step]
	if m == nil {
		m = map[string]time.Time{}
		r.steps[step] = m
	}
	if _, ok := m[name]; !ok {
		m[name] = time.Now()
		r.notifyLocked()
	}
}

func (r *recorder) setLive(kind, name string, present bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.live[kind]
	if m == nil {
		m = map[string]bool{}
		r.live[kind] = m
	}
	if m[name] != present {
		if present {
			m[name] = true
		} else {
			delete(m, name)
		}
		r.notifyLocked()
	}
}

func (r *recorder) count(step string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.steps[step])
}

func (r *recorder) liveCount(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live[kind])
}

// times returns the times of a step, sorted.
func (r *recorder) times(step string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]time.Time, 0, len(r.steps[step]))
	for _, t := range r.steps[step] {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// latencies: for every name that reached both steps, to − from.
func (r *recorder) latencies(from, to string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Duration
	for name, t1 := range r.steps[to] {
		if t0, ok := r.steps[from][name]; ok {
			out = append(out, t1.Sub(t0))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func (r *recorder) stop(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.abort:
	default:
		r.why = why
		close(r.abort)
	}
}

// wait blocks until done() holds (checked at every change), ctx ends, or the run is
// aborted; progress() is logged every 30 s meanwhile.
func (r *recorder) wait(ctx context.Context, logf func(string, ...any), what string, done func() bool, progress func() string) error {
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	begin := time.Now()
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		if done() {
			return nil
		}
		select {
		case <-ch:
		case <-tick.C:
			logf("waiting for %s (%s): %s", what, time.Since(begin).Round(time.Second), progress())
		case <-r.abort:
			return fmt.Errorf("waiting for %s: %s", what, r.why)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (%s)", what, ctx.Err(), progress())
		}
	}
}

// Step names.
const (
	stepNodeReady   = "node Ready"
	stepPVCCreated  = "PVC created (API call returned)"
	stepPVCBound    = "PVC Bound"
	stepPVCDeleting = "PVC deleted (API call returned)"
	stepPVCGone     = "PVC gone"
	stepPVCreated   = "PV created"
	stepPVReleased  = "PV Released"
	stepPVGone      = "PV gone"
	stepWarning     = "Warning event"
)

func podStep(phase, what string) string { return phase + " pod " + what }

// handler turns add/update/delete of T into calls of f(obj, deleted).
func handler[T any](f func(obj T, deleted bool)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { f(o.(T), false) },
		UpdateFunc: func(_, o any) { f(o.(T), false) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if t, ok := o.(T); ok {
				f(t, true)
			}
		},
	}
}

// trackNodes follows the simulated nodes: Ready, and which exist.
func (s *sim) trackNodes(ctx context.Context) {
	f := informers.NewSharedInformerFactoryWithOptions(s.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = simLabel + "=" + simValue }))
	inf := f.Core().V1().Nodes().Informer()
	_, _ = inf.AddEventHandler(handler(func(n *corev1.Node, deleted bool) {
		s.rec.setLive("node", n.Name, !deleted)
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && !deleted {
				s.rec.mark(stepNodeReady, n.Name)
			}
		}
	}))
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
}

// trackVolumes follows the claims of the run's namespace, pav-sim's PVs, its operation
// pods (validation, creation, deletion) and the Warning events of the claims.
func (s *sim) trackVolumes(ctx context.Context) {
	claims := informers.NewSharedInformerFactoryWithOptions(s.client, 0, informers.WithNamespace(s.ns))
	_, _ = claims.Core().V1().PersistentVolumeClaims().Informer().AddEventHandler(handler(func(c *corev1.PersistentVolumeClaim, deleted bool) {
		s.rec.setLive("pvc", c.Name, !deleted)
		if deleted {
			s.rec.mark(stepPVCGone, c.Name)
		} else if c.Status.Phase == corev1.ClaimBound {
			s.rec.mark(stepPVCBound, c.Name)
		}
	}))
	_, _ = claims.Core().V1().Events().Informer().AddEventHandler(handler(func(e *corev1.Event, deleted bool) {
		if !deleted && e.Type == corev1.EventTypeWarning {
			s.rec.mark(stepWarning, e.InvolvedObject.Name+": "+e.Reason+": "+e.Message)
		}
	}))

	pvs := informers.NewSharedInformerFactory(s.client, 0)
	_, _ = pvs.Core().V1().PersistentVolumes().Informer().AddEventHandler(handler(func(pv *corev1.PersistentVolume, deleted bool) {
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != provisionerName {
			return
		}
		s.rec.setLive("pv", pv.Name, !deleted)
		s.rec.mark(stepPVCreated, pv.Name)
		if pv.Spec.ClaimRef != nil {
			s.rec.mu.Lock()
			s.rec.pvClaim[pv.Name] = pv.Spec.ClaimRef.Name
			s.rec.mu.Unlock()
		}
		switch {
		case deleted:
			s.rec.mark(stepPVGone, pv.Name)
		case pv.Status.Phase == corev1.VolumeReleased:
			s.rec.mark(stepPVReleased, pv.Name)
		}
	}))

	pods := informers.NewSharedInformerFactoryWithOptions(s.client, 0, informers.WithNamespace(pavNS),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = podrunner.LabelProvisioner + "=" + provisionerName
		}))
	_, _ = pods.Core().V1().Pods().Informer().AddEventHandler(handler(func(p *corev1.Pod, deleted bool) {
		phase := p.Labels[podrunner.LabelPhase]
		s.rec.setLive("pod", p.Name, !deleted)
		s.rec.setLive("pod:"+phase, p.Name, !deleted)
		s.rec.mark(podStep(phase, "created"), p.Name)
		if p.Spec.NodeName != "" {
			s.rec.mark(podStep(phase, "scheduled"), p.Name)
		}
		switch {
		case deleted:
			s.rec.mark(podStep(phase, "deleted"), p.Name)
		case p.Status.Phase == corev1.PodRunning:
			s.rec.mark(podStep(phase, "Running"), p.Name)
		case p.Status.Phase == corev1.PodSucceeded:
			s.rec.mark(podStep(phase, "Succeeded"), p.Name)
		case p.Status.Phase == corev1.PodFailed:
			s.rec.mark(podStep(phase, "Failed"), p.Name+": "+p.Status.Reason+" "+p.Status.Message)
		}
	}))
	for _, f := range []informers.SharedInformerFactory{claims, pvs, pods} {
		f.Start(ctx.Done())
		f.WaitForCacheSync(ctx.Done())
	}
}

// quantile of sorted values (nearest rank).
func quantile[T any](sorted []T, q float64) T {
	var zero T
	if len(sorted) == 0 {
		return zero
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
