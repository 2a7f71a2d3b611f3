package controllerserver

// Storage capacity tracking (docs/beyond-pav.md, "Capacity"): GetCapacity
// answers from the latest report of the capacity pod of spec.storageCapacity,
// never by a pod per call.
//
// A report belongs to a key: the capacity pod as rendered for the request
// (the template evaluated with the segment and the StorageClass parameters,
// then pinned to the segment's nodes), so that two StorageClasses whose
// parameters make the same pod share one report, and a spec edit that
// changes the pod starts a new one. Each key has one worker goroutine, which
// runs the key's pod (at most one at a time: the pod's name is the key's),
// records the report and removes the pod:
//
//   - at once for the first request of a key, which waits for that first
//     report (bounded by its deadline: external-provisioner's --timeout);
//   - every refreshInterval while the key was asked for within the last
//     capacityIdleIntervals intervals; a key asked for no longer is dropped
//     with its report (the next request is a first one again);
//   - at once after a volume was created, grown or deleted in the key's
//     segment: the report is stale until then, and a request that comes
//     meanwhile waits for the new one, so that external-provisioner's
//     refresh after a provisioning sees the space the volume took. A request
//     during a periodic refresh does not wait: external-provisioner has one
//     capacity worker for every segment and class (--capacity-threads), and
//     a wait would hold them all for a figure no one needs sooner.
//
// A report is the pod's /pav/capacity (free bytes; 0: full) and optional
// /pav/maximumVolumeSize. A failed pod, or one that reports no or an
// unreadable capacity, is a failed report: every call gets its error (which
// names the pod, the file and the fix) until the next refresh, and the
// PavProvisioner gets a Warning event. external-provisioner then keeps the
// segment's CSIStorageCapacity object as it was: no bogus value is published.
//
// Capacity pods have no record: their reports are worth nothing after a
// restart. Those in the controller plugin's namespace are owned by its pod,
// so that they go with it (a rollout, the provisioner's deletion); a
// restarted controller plugin (the same pod) removes every capacity pod an
// earlier process left (SweepCapacityPods, and a pod found under a key's
// name before its run) and never reads their reports.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/report"
	"github.com/pods-as-volumes/pav/internal/templating"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/podrunner"
)

const (
	// capacityKeyPrefix starts the volume key of capacity pods (their
	// AnnotationVolumeKey), apart from CSI volume names and DeletionKey's.
	capacityKeyPrefix = "capacity/"
	// capacityIdleIntervals: a key not asked for within this many refresh
	// intervals is no longer refreshed, and dropped. external-provisioner
	// asks for every segment and class once per interval (its
	// --capacity-poll-interval is the refresh interval), so only a segment
	// or a class that went away stops being asked for.
	capacityIdleIntervals = 3
	// capacityRunAttempts bounds the pods one refresh runs: a pod deleted
	// before it finished (by someone else), or a leftover of an earlier
	// process under the key's name, is followed by a new pod at once.
	capacityRunAttempts = 3
	// capacityRetry is how soon a run that failed for a reason not the
	// pod's (the API server did not answer, say) is tried again, if the
	// refresh interval is longer.
	capacityRetry = 5 * time.Second
)

// Reasons of the Warning events a capacity report puts on the PavProvisioner.
const (
	// ReasonCapacityPodFailed: the capacity pod failed (exit code, timeout,
	// unschedulable, image), so the segment's capacity is unknown.
	ReasonCapacityPodFailed = "CapacityPodFailed"
	// ReasonInvalidCapacityReport: the capacity pod succeeded but left no
	// /pav/capacity, or one (or a /pav/maximumVolumeSize) that is not a
	// number of bytes.
	ReasonInvalidCapacityReport = "InvalidCapacityReport"
	// ReasonCapacityTemplateFailed: spec.storageCapacity cannot be
	// evaluated for a segment.
	ReasonCapacityTemplateFailed = "CapacityTemplateFailed"
)

// GetCapacity answers the free capacity of a topology segment for the
// StorageClass parameters given, from the latest report of its capacity pod
// (see above).
func (s *Server) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	resp, err := s.getCapacity(ctx, req)
	if err != nil {
		return nil, grpcerr.Status(err)
	}
	return resp, nil
}

func (s *Server) getCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	// The spec in force (the last valid one while an edit is invalid, and
	// while the provisioner is being deleted): the free space of the
	// storage does not depend on an edit being valid.
	p, err := s.Source.Get(false)
	if err != nil {
		return nil, err
	}
	f, err := phase.FeaturesOf(&p.Spec)
	if err != nil {
		return nil, err
	}
	if !f.Capacity {
		return nil, grpcerr.Errorf(codes.FailedPrecondition, "PavProvisioner %s has no spec.storageCapacity, so it reports no capacity (GET_CAPACITY is not advertised): add spec.storageCapacity, or run external-provisioner without --enable-capacity", p.Name)
	}
	segment, err := capacitySegment(req.GetAccessibleTopology(), f.TopologyKeys)
	if err != nil {
		return nil, err
	}
	op, cfg, err := CapacityOperation(ctx, s.Eval, p, segment, req.GetParameters())
	if err != nil {
		var fe *phase.FieldError
		var te *templating.Error
		if errors.As(err, &fe) || errors.As(err, &te) {
			s.warn(p, ReasonCapacityTemplateFailed, fmt.Sprintf("the capacity pod of segment %s cannot be made: %v", describeSegment(segment), err))
		}
		return nil, err
	}
	if me := s.Self; me != nil && s.Pods.Namespace(op) == me.Namespace {
		// Its report is worth nothing without this process: it goes with it.
		op.Owner = &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: me.Name, UID: me.UID}
		op.OwnerNamespace = me.Namespace
	}
	rep, err := s.capacityReporter().report(ctx, op, segment, cfg.RefreshInterval, p)
	if err != nil {
		return nil, err
	}
	resp := &csi.GetCapacityResponse{AvailableCapacity: rep.available}
	if rep.maximum != nil {
		resp.MaximumVolumeSize = wrapperspb.Int64(*rep.maximum)
	}
	return resp, nil
}

// CapacityOperation is the capacity pod's operation (without its token) for
// a segment and StorageClass parameters: spec.storageCapacity evaluated with
// the capacity context, pinned to the segment, keyed by the result. `pav
// render` shows it.
func CapacityOperation(ctx context.Context, eval *phase.Evaluator, p *v1alpha1.PavProvisioner, segment, params map[string]string) (podrunner.Operation, *phase.CapacityConfig, error) {
	cfg, err := eval.Capacity(ctx, p, phase.CapacityVars(segment, volume.UserParams(params)))
	if err != nil {
		return podrunner.Operation{}, nil, err
	}
	if cfg == nil {
		return podrunner.Operation{}, nil, grpcerr.Errorf(codes.FailedPrecondition, "PavProvisioner %s has no spec.storageCapacity", p.Name)
	}
	tmpl := pinnedToSegment(*cfg.PodTemplate, segment)
	key, err := capacityKey(tmpl)
	if err != nil {
		return podrunner.Operation{}, nil, err
	}
	return PodOperation(p.Name, v1alpha1.PhaseCapacity, key, tmpl), cfg, nil
}

// capacitySegment is the segment a GetCapacity asks for, as the capacity
// context's `segment`: {} for a provisioner without spec.topology (its
// volumes are reachable from every node, so there is one segment; the
// request names the phase.EveryNodeSegment its node plugins report), else the
// request's, whose keys must be among spec.topology.nodeLabels (they are
// node labels: the capacity pod is pinned by them).
func capacitySegment(t *csi.Topology, keys []string) (map[string]string, error) {
	seg := map[string]string{}
	if len(keys) == 0 {
		return seg, nil
	}
	for _, k := range slices.Sorted(maps.Keys(t.GetSegments())) {
		v := t.GetSegments()[k]
		if !slices.Contains(keys, k) {
			return nil, grpcerr.Errorf(codes.InvalidArgument, "accessible_topology: %q is not a topology key of this provisioner (spec.topology.nodeLabels: %s)", k, strings.Join(keys, ", "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return nil, grpcerr.Errorf(codes.InvalidArgument, "accessible_topology: %s=%q is not a node label value: %s", k, v, errs[0])
		}
		seg[k] = v
	}
	return seg, nil
}

// describeSegment is a segment as messages show it: k=v,... or "(every node)".
func describeSegment(seg map[string]string) string {
	if len(seg) == 0 {
		return "(every node)"
	}
	parts := make([]string, 0, len(seg))
	for _, k := range slices.Sorted(maps.Keys(seg)) {
		parts = append(parts, k+"="+seg[k])
	}
	return strings.Join(parts, ",")
}

// pinnedToSegment is the capacity pod's template with a required node
// affinity on the segment's labels, added to the template's own: each of
// its node selector terms (which the scheduler ORs) gets the segment's
// requirements (ANDed within a term). A segment {} leaves it as it is.
func pinnedToSegment(t corev1.PodTemplateSpec, seg map[string]string) corev1.PodTemplateSpec {
	if len(seg) == 0 {
		return t
	}
	t = *t.DeepCopy()
	exprs := make([]corev1.NodeSelectorRequirement, 0, len(seg))
	for _, k := range slices.Sorted(maps.Keys(seg)) {
		exprs = append(exprs, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{seg[k]}})
	}
	spec := &t.Spec
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		terms[i].MatchExpressions = append(terms[i].MatchExpressions, exprs...)
	}
	return t
}

// capacityKey is the key of a rendered capacity pod: a hash of its
// template, so that equal pods share a report and a changed one starts its own.
func capacityKey(t corev1.PodTemplateSpec) (string, error) {
	b, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("hashing the capacity pod template: %w", err)
	}
	sum := sha256.Sum256(b)
	return capacityKeyPrefix + hex.EncodeToString(sum[:16]), nil
}

// warn puts a Warning event on the PavProvisioner.
func (s *Server) warn(p *v1alpha1.PavProvisioner, reason, msg string) {
	klog.Background().V(2).Info("Warning event on the PavProvisioner", "provisioner", p.Name, "reason", reason, "message", msg)
	if s.Recorder == nil {
		return
	}
	s.Recorder.Event(provisionerRef(p), corev1.EventTypeWarning, reason, msg)
}

// provisionerRef is the object reference of a PavProvisioner, which the
// driver's event recorder takes as it is (its scheme does not know the type).
func provisionerRef(p *v1alpha1.PavProvisioner) *corev1.ObjectReference {
	return &corev1.ObjectReference{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.Kind,
		Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion}
}

// capacityReporter owns the reports of one controller plugin process.
type capacityReporter struct {
	s   *Server
	ctx context.Context // the process's: pods outlive the calls that asked for them
	now func() time.Time

	mu   sync.Mutex
	keys map[string]*capacityEntry
}

// capacityEntry is one key's report and what its worker needs.
type capacityEntry struct {
	op       podrunner.Operation // the pod, without a token
	segment  map[string]string
	interval time.Duration
	p        *v1alpha1.PavProvisioner // the provisioner of the latest request (events)

	asked   time.Time // the latest request
	waiters int       // requests waiting for a report
	// gen counts the volumes created, grown or deleted in the segment: a
	// report made from a pod that started before the latest is stale.
	gen     uint64
	report  *capacityReport
	changed chan struct{} // closed, and replaced, when report changes
	kick    chan struct{} // a run is wanted now
}

// capacityReport is the outcome of one capacity pod.
type capacityReport struct {
	available int64
	maximum   *int64
	err       error
	// transient: err is not the pod's doing (the API, the driver
	// stopping): the next run comes sooner than the next refresh.
	transient bool
	gen       uint64 // the key's gen when the pod started
}

// capacityReporter is the Server's reporter, made at its first use.
func (s *Server) capacityReporter() *capacityReporter {
	s.capacityOnce.Do(func() {
		ctx := s.Background
		if ctx == nil {
			ctx = context.Background()
		}
		s.capacity = &capacityReporter{s: s, ctx: ctx, now: time.Now, keys: map[string]*capacityEntry{}}
	})
	return s.capacity
}

// report is the key's current report, waiting (as long as ctx allows) for
// the first one, or for a fresh one while the latest is stale.
func (r *capacityReporter) report(ctx context.Context, op podrunner.Operation, segment map[string]string, interval time.Duration, p *v1alpha1.PavProvisioner) (*capacityReport, error) {
	key := op.VolumeKey
	if r.s.capacityInterval > 0 {
		interval = r.s.capacityInterval
	}
	r.mu.Lock()
	e := r.keys[key]
	if e == nil {
		e = &capacityEntry{op: op, segment: segment, interval: interval,
			changed: make(chan struct{}), kick: make(chan struct{}, 1)}
		r.keys[key] = e
		go r.work(key, e)
	}
	e.asked, e.p = r.now(), p
	want := e.gen
	e.waiters++
	defer func() {
		r.mu.Lock()
		e.waiters--
		r.mu.Unlock()
	}()
	for {
		if rep := e.report; rep != nil && rep.gen >= want {
			r.mu.Unlock()
			if rep.err != nil {
				return nil, rep.err
			}
			return rep, nil
		}
		changed := e.changed
		what := "the first report"
		if e.report != nil {
			what = "the report after a volume was created, grown or deleted there"
		}
		r.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s of capacity pod %s/%s (segment %s): %w",
				what, r.s.Pods.Namespace(op), op.PodName(), describeSegment(segment), ctx.Err())
		}
		r.mu.Lock()
	}
}

// work runs a key's pods: at once, after each volume change in its segment
// (kick), and every interval while the key is asked for; then it drops the key.
func (r *capacityReporter) work(key string, e *capacityEntry) {
	timer := time.NewTimer(e.interval)
	defer timer.Stop()
	due := true // the first report
	for {
		r.mu.Lock()
		if e.waiters == 0 && r.now().Sub(e.asked) > capacityIdleIntervals*e.interval {
			if r.keys[key] == e {
				delete(r.keys, key)
			}
			r.mu.Unlock()
			klog.FromContext(r.ctx).V(2).Info("Capacity report no longer asked for: dropped", "key", key, "segment", describeSegment(e.segment))
			return
		}
		run := due || e.report == nil || e.report.gen < e.gen
		gen := e.gen
		r.mu.Unlock()
		if run {
			rep := r.run(e)
			rep.gen = gen
			r.mu.Lock()
			e.report = rep
			close(e.changed)
			e.changed = make(chan struct{})
			r.mu.Unlock()
			due = false
			next := e.interval
			if rep.transient {
				next = min(next, capacityRetry)
			}
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(next)
		}
		select {
		case <-r.ctx.Done():
			return
		case <-e.kick:
		case <-timer.C:
			due = true
			timer.Reset(e.interval)
		}
	}
}

// changed marks the reports of the segments a volume is reachable from
// stale (every report for a volume reachable from everywhere), and has
// their workers run a pod now.
func (s *Server) capacityChanged(topology []map[string]string) {
	r := s.capacityReporter()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.keys {
		if !inSegment(e.segment, topology) {
			continue
		}
		e.gen++
		select {
		case e.kick <- struct{}{}:
		default: // already kicked
		}
	}
}

// inSegment: a volume reachable from topology (nil: from everywhere) may
// take space in segment: one of its segments agrees with it on every key
// they share.
func inSegment(segment map[string]string, topology []map[string]string) bool {
	if len(segment) == 0 || len(topology) == 0 {
		return true
	}
	for _, t := range topology {
		agree := true
		for k, v := range t {
			if sv, ok := segment[k]; ok && sv != v {
				agree = false
			}
		}
		if agree {
			return true
		}
	}
	return false
}

// run runs the key's pod once (a new pod at once if it was lost), removes
// it, and reads its report.
func (r *capacityReporter) run(e *capacityEntry) *capacityReport {
	ctx := klog.NewContext(r.ctx, klog.FromContext(r.ctx).WithValues("segment", describeSegment(e.segment)))
	var res *podrunner.Result
	var err error
	for attempt := 1; ; attempt++ {
		op := e.op
		op.Token = podrunner.NewToken()
		res, err = r.s.Pods.Run(ctx, op)
		if ctx.Err() == nil {
			if res != nil {
				op.UID = res.UID
			} else if f, ok := podrunner.IsPodFailure(err); ok {
				op.UID = f.UID
			}
			// Its report is read: the pod goes (it is never adopted).
			if derr := r.s.Pods.Delete(ctx, op); derr != nil {
				klog.FromContext(ctx).Error(derr, "Could not remove a capacity pod; the next run, or the next process, will", "pod", op.PodName())
			}
		}
		if attempt >= capacityRunAttempts {
			break
		}
		if errors.Is(err, podrunner.ErrPodDeleted) {
			continue
		}
		if errors.Is(err, podrunner.ErrForeignPod) && r.s.removeStaleCapacityPod(ctx, op) {
			continue
		}
		break
	}
	return r.read(e, res, err)
}

// read makes a report of a capacity pod's outcome.
func (r *capacityReporter) read(e *capacityEntry, res *podrunner.Result, err error) *capacityReport {
	op := e.op
	pod := r.s.Pods.Namespace(op) + "/" + op.PodName()
	seg := describeSegment(e.segment)
	r.mu.Lock()
	p := e.p
	r.mu.Unlock()
	fail := func(reason string, err error) *capacityReport {
		r.s.warn(p, reason, err.Error())
		return &capacityReport{err: err}
	}
	if f, ok := podrunner.IsPodFailure(err); ok {
		return fail(ReasonCapacityPodFailed, fmt.Errorf(
			"the capacity of segment %s is unknown: %w; fix spec.storageCapacity.podTemplate (or what its pod reads) so that the pod writes the free bytes of its segment to /pav/capacity and exits 0 (pav runs it again every %s)",
			seg, f, e.interval))
	}
	if errors.Is(err, podrunner.ErrForeignPod) {
		// A pod pav did not make holds the name (it has a ForeignPod
		// event): a human must delete it.
		return fail(ReasonCapacityPodFailed, fmt.Errorf("the capacity of segment %s is unknown: %w", seg, err))
	}
	if errors.Is(err, podrunner.ErrInvalidOperation) {
		// The template makes a pod pav refuses to run (a volume named pav...).
		return fail(ReasonCapacityTemplateFailed, fmt.Errorf("the capacity pod of segment %s cannot run: %w; fix spec.storageCapacity.podTemplate", seg, err))
	}
	if err != nil {
		err = fmt.Errorf("running capacity pod %s (segment %s): %w", pod, seg, err)
		switch grpcerr.Code(err) {
		case codes.Unavailable, codes.Aborted, codes.Canceled, codes.DeadlineExceeded:
			// Not the pod's doing (the API server, a driver stopping): no
			// event, and a retry soon.
			return &capacityReport{err: err, transient: true}
		}
		// The API refused the pod (RBAC of the namespace the template
		// chose, a quota, admission): a human must look.
		return fail(ReasonCapacityPodFailed, err)
	}
	invalid := func(format string, args ...any) *capacityReport {
		return fail(ReasonInvalidCapacityReport, grpcerr.WithCode(codes.Internal, fmt.Errorf(
			"capacity pod %s (segment %s) succeeded but "+format+" (pav runs it again every %s)", append([]any{pod, seg}, append(args, e.interval)...)...)))
	}
	c, ok := res.Files[report.FileCapacity]
	if !ok {
		return invalid("wrote no /pav/capacity: have it write the free bytes of its segment there, as a number or a quantity such as 10Gi (0 when full)")
	}
	available, perr := phase.ParseFreeBytes(c)
	if perr != nil {
		return invalid("wrote %q to /pav/capacity (%v): have it write the free bytes of its segment there, as a number or a quantity such as 10Gi (0 when full)", abbreviate(c, 64), perr)
	}
	rep := &capacityReport{available: available}
	if m, ok := res.Files[report.FileMaximumVolumeSize]; ok {
		n, perr := phase.ParseFreeBytes(m)
		if perr != nil {
			return invalid("wrote %q to /pav/maximumVolumeSize (%v): have it write the size of the largest volume it can make now, as a number or a quantity such as 10Gi, or no such file", abbreviate(m, 64), perr)
		}
		rep.maximum = &n
	}
	klog.FromContext(r.ctx).V(2).Info("Capacity reported", "segment", seg, "pod", pod, "capacity", available, "maximumVolumeSize", rep.maximum)
	return rep
}

func abbreviate(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// SweepCapacityPods removes the capacity pods an earlier controller plugin
// process of the provisioner left (their reports were never read, and no
// process will read them): at start, before serving.
func (s *Server) SweepCapacityPods(ctx context.Context) error {
	if s.Client == nil {
		return nil
	}
	sel := labels.SelectorFromSet(labels.Set{podrunner.LabelProvisioner: s.Source.Name(), podrunner.LabelPhase: string(v1alpha1.PhaseCapacity)})
	pods, err := s.Client.Pods("").List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return fmt.Errorf("listing the capacity pods an earlier process left: %w", err)
	}
	for i := range pods.Items {
		if err := s.removeCapacityPod(ctx, &pods.Items[i]); err != nil {
			return err
		}
	}
	if n := len(pods.Items); n > 0 {
		klog.FromContext(ctx).Info("Removed the capacity pods an earlier process left", "pods", n)
	}
	return nil
}

// removeStaleCapacityPod removes the pod that holds op's name, if it is a
// capacity pod of this provisioner and key that another process made (the
// runner refused it: it lacks op's token), and says whether the name is free.
func (s *Server) removeStaleCapacityPod(ctx context.Context, op podrunner.Operation) bool {
	if s.Client == nil {
		return false
	}
	pod, err := s.Client.Pods(s.Pods.Namespace(op)).Get(ctx, op.PodName(), metav1.GetOptions{})
	if err != nil {
		return false
	}
	if pod.Annotations[podrunner.AnnotationVolumeKey] != op.VolumeKey {
		return false
	}
	return s.removeCapacityPod(ctx, pod) == nil
}

// removeCapacityPod deletes a capacity pod of this provisioner by its UID
// (the runner checks its labels and volume key), and waits until it is gone.
func (s *Server) removeCapacityPod(ctx context.Context, pod *corev1.Pod) error {
	if pod.Labels[podrunner.LabelProvisioner] != s.Source.Name() || pod.Labels[podrunner.LabelPhase] != string(v1alpha1.PhaseCapacity) {
		return nil // not one of ours: the runner said so, and a human must look
	}
	op := PodOperation(s.Source.Name(), v1alpha1.PhaseCapacity, pod.Annotations[podrunner.AnnotationVolumeKey], corev1.PodTemplateSpec{})
	op.Template.Namespace, op.UID = pod.Namespace, pod.UID
	if op.VolumeKey == "" {
		return nil
	}
	klog.FromContext(ctx).Info("Removing a capacity pod an earlier process left (its report is never read)", "pod", klog.KObj(pod))
	if err := s.Pods.Delete(ctx, op); err != nil {
		return fmt.Errorf("removing capacity pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}
