// Package phase evaluates one phase of a PavProvisioner (volumeValidation,
// volumeCreation, ...) for one volume: it runs the templates of the phase's subtree
// with the phase's context, applies PaV's defaults, checks types and cross-field
// rules, and returns a typed config. Every error names the field it is about,
// e.g. "spec.volumeCreation.capacity: capacity values must be positive".
package phase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	sigsjson "sigs.k8s.io/json"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// ValidationConfig is an evaluated spec.volumeValidation.
type ValidationConfig struct {
	VolumeModes []corev1.PersistentVolumeMode
	AccessModes []corev1.PersistentVolumeAccessMode
	MinCapacity int64  // bytes, ≥ 1
	MaxCapacity *int64 // bytes; nil means no maximum
	PodTemplate *corev1.PodTemplateSpec
}

// CreationConfig is an evaluated spec.volumeCreation.
type CreationConfig struct {
	Handle      string // "" when the pod or the default decides
	Capacity    *int64 // nil when the pod must report it
	PodTemplate *corev1.PodTemplateSpec
	// ContentSources lists what a volume may be created from: "Snapshot",
	// "Volume" (the creation pod handles `source`); empty: nothing.
	ContentSources []string
	// AccessibleTopology is where the volume can be reached (segments, each
	// a map of topology key to value); /pav/topology wins. nil: not said.
	AccessibleTopology []map[string]string
}

// ExpansionConfig is an evaluated spec.volumeExpansion.
type ExpansionConfig struct {
	// Online: the volume may grow while pods use it (ONLINE); false: only
	// while no pod uses it (OFFLINE).
	Online bool
	// Capacity is the grown volume's capacity; nil: what was asked for (or
	// the pod's /pav/capacity).
	Capacity    *int64
	PodTemplate *corev1.PodTemplateSpec
}

// SnapshotConfig is an evaluated spec.snapshotCreation.
type SnapshotConfig struct {
	Handle      string // "" when the pod or the default decides
	PodTemplate *corev1.PodTemplateSpec
}

// CapacityConfig is an evaluated spec.storageCapacity.
type CapacityConfig struct {
	// RefreshInterval is how often a segment's report is refreshed while it
	// is asked for (a literal; DefaultCapacityRefresh when unset).
	RefreshInterval time.Duration
	// PodTemplate is the capacity pod, which writes /pav/capacity; never nil.
	PodTemplate *corev1.PodTemplateSpec
}

// ModificationConfig is an evaluated spec.volumeModification.
type ModificationConfig struct {
	// MutableParameters are the parameter keys a VolumeAttributesClass may
	// set (a literal, non-empty list of distinct keys).
	MutableParameters []string
	// PodTemplate changes a live volume; nil: the new parameters are only
	// recorded (later phases see them).
	PodTemplate *corev1.PodTemplateSpec
}

// Fields a phase object may hold, by phase.
var phaseFields = map[v1alpha1.Phase][]string{
	v1alpha1.PhaseValidation:       {"volumeModes", "accessModes", "minCapacity", "maxCapacity", "podTemplate"},
	v1alpha1.PhaseCreation:         {"handle", "capacity", "podTemplate", "contentSources", "accessibleTopology"},
	v1alpha1.PhaseDeletion:         {"podTemplate", "whenNamespaceGone"},
	v1alpha1.PhaseStaging:          {"podTemplate"},
	v1alpha1.PhaseUnstaging:        {"podTemplate"},
	v1alpha1.PhaseExpansion:        {"online", "capacity", "podTemplate"},
	v1alpha1.PhaseNodeExpansion:    {"podTemplate"},
	v1alpha1.PhaseSnapshotCreation: {"handle", "podTemplate"},
	v1alpha1.PhaseSnapshotDeletion: {"podTemplate"},

	v1alpha1.PhaseCapacity:              {"refreshInterval", "podTemplate"},
	v1alpha1.PhaseModification:          {"mutableParameters", "podTemplate"},
	v1alpha1.PhaseGroupSnapshotCreation: {"podTemplate"},
	v1alpha1.PhaseGroupSnapshotDeletion: {"podTemplate"},
	v1alpha1.PhaseSnapshotMetadata:      {"podTemplate"},
}

// requiredPodTemplate: phases whose object must hold a podTemplate.
func requiredPodTemplate(ph v1alpha1.Phase) bool {
	switch ph {
	case v1alpha1.PhaseStaging, v1alpha1.PhaseNodeExpansion, v1alpha1.PhaseCapacity, v1alpha1.PhaseSnapshotMetadata:
		return true
	}
	return false
}

// PodConfig is an evaluated phase that holds only a pod template:
// spec.volumeDeletion, volumeStaging, volumeUnstaging, volumeNodeExpansion,
// snapshotDeletion, groupSnapshotCreation, groupSnapshotDeletion,
// snapshotMetadata.
type PodConfig struct {
	PodTemplate *corev1.PodTemplateSpec
}

// FieldError is an error about one field of the PavProvisioner.
type FieldError struct {
	Path string
	Msg  string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Msg }

func fieldErr(path, format string, args ...any) error {
	return &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)}
}

// Evaluator evaluates phases. It is safe for concurrent use.
type Evaluator struct {
	Engine *templating.Engine
}

// NewEvaluator returns an Evaluator on a template engine with the given get_pvc source.
func NewEvaluator(pvcs templating.PVCGetter) *Evaluator {
	return &Evaluator{Engine: templating.New(templating.Options{PVCs: pvcs})}
}

// tree evaluates the templates of a phase subtree and returns it as a map, or nil
// when the phase is absent (also when it is a template that evaluates to null).
func (e *Evaluator) tree(ctx context.Context, p *v1alpha1.PavProvisioner, ph v1alpha1.Phase, vars templating.Vars, allowed ...string) (map[string]any, error) {
	path := "spec." + ph.Field()
	raw := p.Spec.Phase(ph)
	if raw == nil || raw.Data == nil {
		return nil, nil
	}
	out, err := e.Engine.Evaluate(ctx, templating.Normalize(raw.Data), path, vars)
	if err != nil {
		return nil, err
	}
	return asObject(out, path, allowed)
}

// asObject checks that v is an object (or null) holding only allowed keys.
func asObject(v any, path string, allowed []string) (map[string]any, error) {
	if v == nil {
		return nil, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fieldErr(path, "must be an object, got %s", typeName(v))
	}
	var unknown []string
	for k := range m {
		if !slices.Contains(allowed, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fieldErr(path, "unknown field %q (allowed: %s)", unknown[0], strings.Join(allowed, ", "))
	}
	return m, nil
}

// Validation evaluates spec.volumeValidation with a validation context and applies
// PaV's defaults (volume modes [Filesystem], access modes RWO/ROX/RWX, minimum 1 byte).
func (e *Evaluator) Validation(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*ValidationConfig, error) {
	m, err := e.tree(ctx, p, v1alpha1.PhaseValidation, vars, phaseFields[v1alpha1.PhaseValidation]...)
	if err != nil {
		return nil, err
	}
	return decodeValidation(m, false)
}

// decodeValidation turns an evaluated volumeValidation into a config. With
// literalOnly, template strings are skipped (used to check a provisioner on load).
func decodeValidation(m map[string]any, literalOnly bool) (*ValidationConfig, error) {
	const path = "spec.volumeValidation"
	c := &ValidationConfig{
		VolumeModes: []corev1.PersistentVolumeMode{corev1.PersistentVolumeFilesystem},
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadOnlyMany, corev1.ReadWriteMany},
		MinCapacity: 1,
	}
	skip := func(k string) bool { return m[k] == nil || literalOnly && isTemplate(m[k]) }
	if !skip("volumeModes") {
		modes, err := enumList(m["volumeModes"], path+".volumeModes", literalOnly, "Filesystem", "Block")
		if err != nil {
			return nil, err
		}
		c.VolumeModes = nil
		for _, s := range modes {
			c.VolumeModes = append(c.VolumeModes, corev1.PersistentVolumeMode(s))
		}
	}
	if !skip("accessModes") {
		modes, err := enumList(m["accessModes"], path+".accessModes", literalOnly, "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
		if err != nil {
			return nil, err
		}
		c.AccessModes = nil
		for _, s := range modes {
			c.AccessModes = append(c.AccessModes, corev1.PersistentVolumeAccessMode(s))
		}
	}
	if !skip("minCapacity") {
		n, err := ParseCapacity(m["minCapacity"], Floor)
		if err != nil {
			return nil, fieldErr(path+".minCapacity", "%v", err)
		}
		c.MinCapacity = n
	}
	if !skip("maxCapacity") {
		n, err := ParseCapacity(m["maxCapacity"], Ceil)
		if err != nil {
			return nil, fieldErr(path+".maxCapacity", "%v", err)
		}
		c.MaxCapacity = &n
	}
	if c.MaxCapacity != nil && c.MinCapacity > *c.MaxCapacity {
		return nil, fieldErr(path+".minCapacity", "must not be greater than maxCapacity (%d bytes > %d bytes)", c.MinCapacity, *c.MaxCapacity)
	}
	if !skip("podTemplate") {
		t, err := podTemplate(m["podTemplate"], path+".podTemplate", literalOnly)
		if err != nil {
			return nil, err
		}
		c.PodTemplate = t
	}
	return c, nil
}

// Creation evaluates spec.volumeCreation with a creation context. dynamic tells
// whether the provisioner allows dynamic provisioning at all.
func (e *Evaluator) Creation(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*CreationConfig, error) {
	m, err := e.tree(ctx, p, v1alpha1.PhaseCreation, vars, phaseFields[v1alpha1.PhaseCreation]...)
	if err != nil {
		return nil, err
	}
	return decodeCreation(m, false)
}

func decodeCreation(m map[string]any, literalOnly bool) (*CreationConfig, error) {
	const path = "spec.volumeCreation"
	c := &CreationConfig{}
	skip := func(k string) bool { return m[k] == nil || literalOnly && isTemplate(m[k]) }
	if !skip("handle") {
		h, err := handleField(m["handle"], path+".handle")
		if err != nil {
			return nil, err
		}
		c.Handle = h
	}
	if !skip("capacity") {
		n, err := ParseCapacity(m["capacity"], Floor)
		if err != nil {
			return nil, fieldErr(path+".capacity", "%v", err)
		}
		c.Capacity = &n
	}
	if !skip("podTemplate") {
		t, err := podTemplate(m["podTemplate"], path+".podTemplate", literalOnly)
		if err != nil {
			return nil, err
		}
		c.PodTemplate = t
	}
	if m["contentSources"] != nil {
		srcs, err := contentSources(m["contentSources"], path+".contentSources")
		if err != nil {
			return nil, err
		}
		c.ContentSources = srcs
	}
	// A segment value may be a template ({zone: "{{ params.zone }}"}): the
	// literal check leaves such a list to evaluation.
	if !skip("accessibleTopology") && !(literalOnly && holdsTemplate(m["accessibleTopology"])) {
		t, err := TopologySegments(m["accessibleTopology"], path+".accessibleTopology")
		if err != nil {
			return nil, err
		}
		c.AccessibleTopology = t
	}
	if !literalOnly && c.Capacity == nil && c.PodTemplate == nil {
		return nil, fieldErr(path, "needs capacity or podTemplate: without a creation pod to report /pav/capacity, the capacity must be given")
	}
	return c, nil
}

// handleField checks a volume's or snapshot's handle field: a non-empty string.
func handleField(v any, path string) (string, error) {
	h, ok := v.(string)
	if !ok {
		return "", fieldErr(path, "must be a string, got %s", typeName(v))
	}
	if strings.TrimSpace(h) == "" {
		return "", fieldErr(path, "must not be empty (omit it to use the pod's /pav/handle or the default handle)")
	}
	return h, nil
}

// Content sources a volume may be created from (volumeCreation.contentSources).
const (
	SourceSnapshot = "Snapshot"
	SourceVolume   = "Volume"
)

// Expansion evaluates spec.volumeExpansion with an expansion context; nil
// when the provisioner has none (volumes cannot grow).
func (e *Evaluator) Expansion(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*ExpansionConfig, error) {
	if raw := p.Spec.VolumeExpansion; raw == nil || raw.Data == nil {
		return nil, nil
	}
	m, err := e.tree(ctx, p, v1alpha1.PhaseExpansion, vars, phaseFields[v1alpha1.PhaseExpansion]...)
	if err != nil {
		return nil, err
	}
	return decodeExpansion(m, false)
}

func decodeExpansion(m map[string]any, literalOnly bool) (*ExpansionConfig, error) {
	const path = "spec.volumeExpansion"
	c := &ExpansionConfig{Online: true}
	skip := func(k string) bool { return m[k] == nil || literalOnly && isTemplate(m[k]) }
	if m["online"] != nil {
		b, ok := m["online"].(bool)
		if !ok {
			return nil, fieldErr(path+".online", "must be a literal boolean (true: volumes grow while in use; false: only while unused), got %s: it is advertised before any volume exists", describe(m["online"]))
		}
		c.Online = b
	}
	if !skip("capacity") {
		n, err := ParseCapacity(m["capacity"], Floor)
		if err != nil {
			return nil, fieldErr(path+".capacity", "%v", err)
		}
		c.Capacity = &n
	}
	if !skip("podTemplate") {
		t, err := podTemplate(m["podTemplate"], path+".podTemplate", literalOnly)
		if err != nil {
			return nil, err
		}
		c.PodTemplate = t
	}
	return c, nil
}

// NodeExpansion evaluates spec.volumeNodeExpansion with a node expansion
// context; nil when the provisioner has none.
func (e *Evaluator) NodeExpansion(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*PodConfig, error) {
	if raw := p.Spec.VolumeNodeExpansion; raw == nil || raw.Data == nil {
		return nil, nil
	}
	return e.podPhase(ctx, p, v1alpha1.PhaseNodeExpansion, vars, true)
}

// SnapshotCreation evaluates spec.snapshotCreation with a snapshot context;
// nil when the provisioner takes no snapshots.
func (e *Evaluator) SnapshotCreation(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*SnapshotConfig, error) {
	if raw := p.Spec.SnapshotCreation; raw == nil || raw.Data == nil {
		return nil, nil
	}
	m, err := e.tree(ctx, p, v1alpha1.PhaseSnapshotCreation, vars, phaseFields[v1alpha1.PhaseSnapshotCreation]...)
	if err != nil {
		return nil, err
	}
	return decodeSnapshot(m, false)
}

func decodeSnapshot(m map[string]any, literalOnly bool) (*SnapshotConfig, error) {
	const path = "spec.snapshotCreation"
	c := &SnapshotConfig{}
	skip := func(k string) bool { return m[k] == nil || literalOnly && isTemplate(m[k]) }
	if !skip("handle") {
		h, err := handleField(m["handle"], path+".handle")
		if err != nil {
			return nil, err
		}
		c.Handle = h
	}
	if !skip("podTemplate") {
		t, err := podTemplate(m["podTemplate"], path+".podTemplate", literalOnly)
		if err != nil {
			return nil, err
		}
		c.PodTemplate = t
	}
	return c, nil
}

// SnapshotDeletion evaluates spec.snapshotDeletion with a snapshot deletion context.
func (e *Evaluator) SnapshotDeletion(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*PodConfig, error) {
	return e.podPhase(ctx, p, v1alpha1.PhaseSnapshotDeletion, vars, false)
}

// Capacity evaluates spec.storageCapacity with a capacity context; nil when
// the provisioner reports no capacity.
func (e *Evaluator) Capacity(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*CapacityConfig, error) {
	raw := p.Spec.StorageCapacity
	if raw == nil || raw.Data == nil {
		return nil, nil
	}
	m, err := e.tree(ctx, p, v1alpha1.PhaseCapacity, vars, phaseFields[v1alpha1.PhaseCapacity]...)
	if err != nil {
		return nil, err
	}
	// external-provisioner polls with the literal refreshInterval
	// (FeaturesOf): one a template made would differ from it.
	if isTemplate(templating.Normalize(raw.Data)) && m["refreshInterval"] != nil {
		return nil, fieldErr("spec.storageCapacity.refreshInterval", "must be written in a literal spec.storageCapacity object, not made by a template: it is used before any volume exists (let a template stand for the podTemplate instead)")
	}
	return decodeCapacity(m, false)
}

func decodeCapacity(m map[string]any, literalOnly bool) (*CapacityConfig, error) {
	const path = "spec.storageCapacity"
	c := &CapacityConfig{RefreshInterval: DefaultCapacityRefresh}
	if m["refreshInterval"] != nil {
		d, err := refreshInterval(m["refreshInterval"], path+".refreshInterval")
		if err != nil {
			return nil, err
		}
		c.RefreshInterval = d
	}
	pc, err := decodePodPhase(m, path, true, literalOnly)
	if err != nil {
		return nil, err
	}
	c.PodTemplate = pc.PodTemplate
	return c, nil
}

// Modification evaluates spec.volumeModification with a modification
// context; nil when volumes have no mutable parameters.
func (e *Evaluator) Modification(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*ModificationConfig, error) {
	if raw := p.Spec.VolumeModification; raw == nil || raw.Data == nil {
		return nil, nil
	}
	m, err := e.tree(ctx, p, v1alpha1.PhaseModification, vars, phaseFields[v1alpha1.PhaseModification]...)
	if err != nil {
		return nil, err
	}
	return decodeModification(m, false)
}

func decodeModification(m map[string]any, literalOnly bool) (*ModificationConfig, error) {
	const path = "spec.volumeModification"
	keys, err := mutableParameters(m["mutableParameters"], path+".mutableParameters")
	if err != nil {
		return nil, err
	}
	pc, err := decodePodPhase(m, path, false, literalOnly)
	if err != nil {
		return nil, err
	}
	return &ModificationConfig{MutableParameters: keys, PodTemplate: pc.PodTemplate}, nil
}

// GroupSnapshotCreation evaluates spec.groupSnapshotCreation with a group
// snapshot context; nil when the provisioner takes no group snapshots. A
// config without a PodTemplate means: each member's snapshotCreation pod.
func (e *Evaluator) GroupSnapshotCreation(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*PodConfig, error) {
	if raw := p.Spec.GroupSnapshotCreation; raw == nil || raw.Data == nil {
		return nil, nil
	}
	return e.podPhase(ctx, p, v1alpha1.PhaseGroupSnapshotCreation, vars, false)
}

// GroupSnapshotDeletion evaluates spec.groupSnapshotDeletion with a group
// snapshot deletion context; nil when absent. Absent, or without a
// PodTemplate: each member's snapshotDeletion pod.
func (e *Evaluator) GroupSnapshotDeletion(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*PodConfig, error) {
	if raw := p.Spec.GroupSnapshotDeletion; raw == nil || raw.Data == nil {
		return nil, nil
	}
	return e.podPhase(ctx, p, v1alpha1.PhaseGroupSnapshotDeletion, vars, false)
}

// SnapshotMetadata evaluates spec.snapshotMetadata with a snapshot metadata
// context; nil when the provisioner lists no blocks. Its pod template is
// mandatory.
func (e *Evaluator) SnapshotMetadata(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*PodConfig, error) {
	if raw := p.Spec.SnapshotMetadata; raw == nil || raw.Data == nil {
		return nil, nil
	}
	return e.podPhase(ctx, p, v1alpha1.PhaseSnapshotMetadata, vars, true)
}

// DeletionConfig is an evaluated spec.volumeDeletion.
type DeletionConfig struct {
	PodConfig
	// WhenNamespaceGone is what the deletion means once the deletion pod's
	// namespace is gone: Retry (the default) or Forget. Always literal
	// (WhenNamespaceGoneOf).
	WhenNamespaceGone v1alpha1.WhenNamespaceGone
}

// Deletion evaluates spec.volumeDeletion with a deletion context.
func (e *Evaluator) Deletion(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*DeletionConfig, error) {
	when, err := WhenNamespaceGoneOf(&p.Spec)
	if err != nil {
		return nil, err
	}
	m, err := e.tree(ctx, p, v1alpha1.PhaseDeletion, vars, phaseFields[v1alpha1.PhaseDeletion]...)
	if err != nil {
		return nil, err
	}
	if m["whenNamespaceGone"] != nil && !literalWhenNamespaceGone(&p.Spec) {
		// A template produced it: a claim's input must never decide
		// whether a deletion may be skipped.
		return nil, fieldErr(pathWhenNamespaceGone, "must be written literally in the volumeDeletion object (Retry or Forget), not produced by a template: it decides whether pav may forget a volume without its deletion pod")
	}
	pc, err := decodePodPhase(m, "spec."+v1alpha1.PhaseDeletion.Field(), false, false)
	if err != nil {
		return nil, err
	}
	return &DeletionConfig{PodConfig: *pc, WhenNamespaceGone: when}, nil
}

// Staging evaluates spec.volumeStaging with a staging context; its pod template is mandatory.
func (e *Evaluator) Staging(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*PodConfig, error) {
	return e.podPhase(ctx, p, v1alpha1.PhaseStaging, vars, true)
}

// Unstaging evaluates spec.volumeUnstaging with a staging context.
func (e *Evaluator) Unstaging(ctx context.Context, p *v1alpha1.PavProvisioner, vars templating.Vars) (*PodConfig, error) {
	return e.podPhase(ctx, p, v1alpha1.PhaseUnstaging, vars, false)
}

func (e *Evaluator) podPhase(ctx context.Context, p *v1alpha1.PavProvisioner, ph v1alpha1.Phase, vars templating.Vars, required bool) (*PodConfig, error) {
	m, err := e.tree(ctx, p, ph, vars, phaseFields[ph]...)
	if err != nil {
		return nil, err
	}
	return decodePodPhase(m, "spec."+ph.Field(), required, false)
}

func decodePodPhase(m map[string]any, path string, required, literalOnly bool) (*PodConfig, error) {
	c := &PodConfig{}
	if m == nil || m["podTemplate"] == nil {
		if required {
			return nil, fieldErr(path+".podTemplate", "is required")
		}
		return c, nil
	}
	if literalOnly && isTemplate(m["podTemplate"]) {
		return c, nil
	}
	t, err := podTemplate(m["podTemplate"], path+".podTemplate", literalOnly)
	if err != nil {
		return nil, err
	}
	c.PodTemplate = t
	return c, nil
}

// podTemplate decodes an evaluated pod template strictly, so a typo such as
// "imag:" is reported with its path instead of being silently dropped. With
// literalOnly, a template that still holds template strings is only checked
// for what they cannot change (a template string may stand where the pod
// needs a number or an object, which only evaluation tells), and nil is
// returned.
func podTemplate(v any, path string, literalOnly bool) (*corev1.PodTemplateSpec, error) {
	m, err := asObject(v, path, []string{"metadata", "spec"})
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, nil
	}
	for _, k := range []string{"metadata", "spec"} {
		if x := m[k]; x != nil && !(literalOnly && isTemplate(x)) {
			if _, ok := x.(map[string]any); !ok {
				return nil, fieldErr(path+"."+k, "must be an object, got %s", typeName(x))
			}
		}
	}
	// A pod needs containers, whatever templates elsewhere give, unless spec
	// or containers is itself a template.
	spec, specIsObject := m["spec"].(map[string]any)
	if !(literalOnly && (isTemplate(m["spec"]) || specIsObject && isTemplate(spec["containers"]))) {
		if c, isList := spec["containers"].([]any); spec["containers"] == nil || isList && len(c) == 0 {
			return nil, fieldErr(path+".spec.containers", "needs at least one container")
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, fieldErr(path, "%v", err)
	}
	t := &corev1.PodTemplateSpec{}
	strict, err := sigsjson.UnmarshalStrict(b, t)
	switch {
	case len(strict) > 0:
		// Unknown or duplicate fields: a typo, template strings or not.
		return nil, fieldErr(path, "is not a valid pod template: %v", joinErrors(strict))
	case err != nil && literalOnly && holdsTemplate(m):
		// A template string where the pod needs a number or an object:
		// only evaluation tells.
		return nil, nil
	case err != nil:
		return nil, fieldErr(path, "is not a valid pod template: %v", err)
	}
	return t, nil
}

// UnmarshalStrict decodes JSON into v and fails on unknown or duplicate fields,
// naming each by its full path (`unknown field "spec.containers[0].imag"`), as
// the API server's strict field validation does: a typo must not be dropped.
func UnmarshalStrict(data []byte, v any) error {
	strict, err := sigsjson.UnmarshalStrict(data, v)
	if err != nil {
		return err
	}
	if len(strict) == 0 {
		return nil
	}
	return joinErrors(strict)
}

// joinErrors is one error of several, their messages joined with "; ".
func joinErrors(errs []error) error {
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}

// enumList checks a non-empty list of allowed strings and returns it
// deduplicated. With literalOnly, template items are skipped: evaluation
// checks them.
func enumList(v any, path string, literalOnly bool, allowed ...string) ([]string, error) {
	l, ok := v.([]any)
	if !ok {
		return nil, fieldErr(path, "must be a list, got %s", typeName(v))
	}
	if len(l) == 0 {
		return nil, fieldErr(path, "must not be empty (omit the field for the default)")
	}
	var out []string
	for i, x := range l {
		if literalOnly && isTemplate(x) {
			continue
		}
		s, ok := x.(string)
		if !ok || !slices.Contains(allowed, s) {
			return nil, fieldErr(fmt.Sprintf("%s[%d]", path, i), "must be one of %s, got %s", strings.Join(allowed, ", "), describe(x))
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

func describe(v any) string {
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	return typeName(v)
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case bool:
		return "boolean"
	case int, int64, float64:
		return "number"
	case []any:
		return "list"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}
