package phase

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// Features is what a provisioner can do beyond PaV's create/delete/stage, read
// from the literal parts of its spec: the CSI capabilities pav advertises
// (before any volume exists, so none of it may hide in a template).
type Features struct {
	// Expansion: spec.volumeExpansion is set (EXPAND_VOLUME, controller);
	// OnlineExpansion its `online` (PluginCapability ONLINE, else OFFLINE).
	Expansion, OnlineExpansion bool
	// NodeExpansion: spec.volumeNodeExpansion is set (EXPAND_VOLUME, node;
	// ControllerExpandVolume answers node_expansion_required).
	NodeExpansion bool
	// Snapshots: spec.snapshotCreation is set (CREATE_DELETE_SNAPSHOT,
	// LIST_SNAPSHOTS).
	Snapshots bool
	// ContentSources: spec.volumeCreation.contentSources ("Snapshot" restores
	// snapshots, "Volume" clones volumes: CLONE_VOLUME).
	ContentSources []string
	// TopologyKeys: spec.topology.nodeLabels (VOLUME_ACCESSIBILITY_CONSTRAINTS).
	TopologyKeys []string
	// MaxVolumesPerNode: spec.maxVolumesPerNode (NodeGetInfo's
	// max_volumes_per_node); 0: no limit.
	MaxVolumesPerNode int64
	// Capacity: spec.storageCapacity is set (GET_CAPACITY; the CSIDriver's
	// storageCapacity, external-provisioner --enable-capacity);
	// CapacityRefresh its refreshInterval (DefaultCapacityRefresh if unset).
	Capacity        bool
	CapacityRefresh time.Duration
	// Modification: spec.volumeModification is set (MODIFY_VOLUME);
	// MutableParameters its mutableParameters, the parameter keys a
	// VolumeAttributesClass may set (never empty then).
	Modification      bool
	MutableParameters []string
	// GroupSnapshots: spec.groupSnapshotCreation is set (the GroupController
	// service, CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT).
	GroupSnapshots bool
	// SnapshotMetadata: spec.snapshotMetadata is set (the SnapshotMetadata
	// service: allocated and changed blocks of snapshots).
	SnapshotMetadata bool
	// Ephemeral: spec.provisioningModes contains Ephemeral (the CSIDriver's
	// volumeLifecycleModes gain Ephemeral, podInfoOnMount).
	Ephemeral bool
}

const (
	// DefaultCapacityRefresh is storageCapacity.refreshInterval's default.
	DefaultCapacityRefresh = time.Minute
	// MinCapacityRefresh is the shortest refreshInterval: each refresh runs a
	// capacity pod per segment that was asked for.
	MinCapacityRefresh = 10 * time.Second
	// MaxMutableParameters and MaxParameterKeyLen bound
	// volumeModification.mutableParameters (the CRD says the same).
	MaxMutableParameters = 64
	MaxParameterKeyLen   = 253
	// ReservedParameterPrefix starts the parameter keys that Kubernetes and the
	// CSI sidecars keep for themselves (csi.storage.k8s.io/fstype, the secret
	// keys, ...): never a provisioner's own parameter.
	ReservedParameterPrefix = "csi.storage.k8s.io/"
)

// Clones reports whether volumes may be created from other volumes.
func (f Features) Clones() bool { return slices.Contains(f.ContentSources, SourceVolume) }

// Restores reports whether volumes may be created from snapshots.
func (f Features) Restores() bool { return slices.Contains(f.ContentSources, SourceSnapshot) }

// FeaturesOf reads a spec's features, and says what is wrong with the literals
// that declare them (Check runs it too).
func FeaturesOf(s *v1alpha1.PavProvisionerSpec) (Features, error) {
	var f Features
	present := func(v *v1alpha1.Value) bool { return v != nil && v.Data != nil }
	if present(s.VolumeExpansion) {
		f.Expansion, f.OnlineExpansion = true, true
		if m, ok := templating.Normalize(s.VolumeExpansion.Data).(map[string]any); ok && m["online"] != nil {
			b, ok := m["online"].(bool)
			if !ok {
				return f, fieldErr("spec.volumeExpansion.online", "must be a literal boolean (true: volumes grow while in use; false: only while unused), got %s: it is advertised before any volume exists", describe(m["online"]))
			}
			f.OnlineExpansion = b
		}
	}
	if present(s.VolumeNodeExpansion) {
		if !f.Expansion {
			return f, fieldErr("spec.volumeNodeExpansion", "needs spec.volumeExpansion (which may be just {}): the controller side grows the volume first, then the node side")
		}
		f.NodeExpansion = true
	}
	f.Snapshots = present(s.SnapshotCreation)
	if present(s.SnapshotDeletion) && !f.Snapshots {
		return f, fieldErr("spec.snapshotDeletion", "needs spec.snapshotCreation: there are no snapshots to delete without it")
	}
	if present(s.VolumeCreation) {
		if m, ok := templating.Normalize(s.VolumeCreation.Data).(map[string]any); ok && m["contentSources"] != nil {
			srcs, err := contentSources(m["contentSources"], "spec.volumeCreation.contentSources")
			if err != nil {
				return f, err
			}
			f.ContentSources = srcs
		}
	}
	if f.Restores() && !f.Snapshots {
		return f, fieldErr("spec.volumeCreation.contentSources", "lists Snapshot, which needs spec.snapshotCreation: without it there are no snapshots to restore")
	}
	if t := s.Topology; t != nil {
		const path = "spec.topology.nodeLabels"
		if len(t.NodeLabels) == 0 {
			return f, fieldErr(path, "must name at least one node label (e.g. topology.kubernetes.io/zone, or kubernetes.io/hostname for node-local volumes); omit spec.topology otherwise")
		}
		for i, k := range t.NodeLabels {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				return f, fieldErr(fmt.Sprintf("%s[%d]", path, i), "%q is not a label key: %s", k, errs[0])
			}
			if slices.Contains(t.NodeLabels[:i], k) {
				return f, fieldErr(fmt.Sprintf("%s[%d]", path, i), "%q is listed twice", k)
			}
		}
		f.TopologyKeys = slices.Clone(t.NodeLabels)
	}
	if n := s.MaxVolumesPerNode; n != nil {
		// CSINode's allocatable count, where kubelet puts it, is an int32.
		if *n < 1 || *n > math.MaxInt32 {
			return f, fieldErr("spec.maxVolumesPerNode", "must be an integer from 1 to %d (the most volumes of this provisioner one node takes), got %d; omit it for no limit", math.MaxInt32, *n)
		}
		f.MaxVolumesPerNode = *n
	}
	if present(s.StorageCapacity) {
		f.Capacity, f.CapacityRefresh = true, DefaultCapacityRefresh
		// A whole-phase template cannot say refreshInterval (evaluation
		// refuses it there): the default holds.
		if m, ok := templating.Normalize(s.StorageCapacity.Data).(map[string]any); ok {
			if m["refreshInterval"] != nil {
				d, err := refreshInterval(m["refreshInterval"], "spec.storageCapacity.refreshInterval")
				if err != nil {
					return f, err
				}
				f.CapacityRefresh = d
			}
			if m["podTemplate"] == nil {
				return f, fieldErr("spec.storageCapacity.podTemplate", "is required: the capacity pod reports the free capacity of a segment by writing /pav/capacity")
			}
		}
	}
	if present(s.VolumeModification) {
		const path = "spec.volumeModification"
		data := templating.Normalize(s.VolumeModification.Data)
		m, ok := data.(map[string]any)
		if !ok {
			what := "a " + typeName(data)
			if isTemplate(data) {
				what = "a template string"
			}
			return f, fieldErr(path, "must be an object, not %s: its mutableParameters is a literal list, advertised before any volume exists (a template may stand for its podTemplate instead)", what)
		}
		keys, err := mutableParameters(m["mutableParameters"], path+".mutableParameters")
		if err != nil {
			return f, err
		}
		f.Modification, f.MutableParameters = true, keys
	}
	f.GroupSnapshots = present(s.GroupSnapshotCreation)
	if f.GroupSnapshots && !f.Snapshots {
		return f, fieldErr("spec.groupSnapshotCreation", "needs spec.snapshotCreation: a group snapshot is made of ordinary snapshots (and, without its own podTemplate, by each member's snapshotCreation pod)")
	}
	if present(s.GroupSnapshotDeletion) && !f.GroupSnapshots {
		return f, fieldErr("spec.groupSnapshotDeletion", "needs spec.groupSnapshotCreation: there are no group snapshots to delete without it")
	}
	f.SnapshotMetadata = present(s.SnapshotMetadata)
	if f.SnapshotMetadata && !f.Snapshots {
		return f, fieldErr("spec.snapshotMetadata", "needs spec.snapshotCreation: it lists the blocks of snapshots, and there are none without it")
	}
	f.Ephemeral = s.HasMode(v1alpha1.Ephemeral)
	return f, nil
}

// The form of a refreshInterval the API server admits (the CRD's maxLength,
// which counts characters, and the policy's pattern): Go durations, bounded so that none overflows (at
// most 2000007h; Go's durations end at 2562047h), which the policy's CEL
// duration() would fail on.
const maxRefreshIntervalLen = 16

var refreshIntervalPattern = regexp.MustCompile(`^(([0-9]{1,6}(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

// refreshInterval checks storageCapacity.refreshInterval: a literal Go
// duration of at least MinCapacityRefresh.
func refreshInterval(v any, path string) (time.Duration, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fieldErr(path, "must be a Go duration such as 30s, 1m or 1h30m, got %s", typeName(v))
	}
	if isTemplate(s) {
		return 0, fieldErr(path, "must be a literal Go duration such as 30s, 1m or 1h30m, not a template: external-provisioner polls with it (--capacity-poll-interval) before any volume exists")
	}
	if utf8.RuneCountInString(s) > maxRefreshIntervalLen {
		return 0, fieldErr(path, "must be at most %d characters, got %q: write it with larger units, such as 1h30m", maxRefreshIntervalLen, s)
	}
	if !refreshIntervalPattern.MatchString(s) {
		return 0, fieldErr(path, "%q is not a Go duration with at most 6 digits before each unit: write numbers and units (h, m, s, ms, us, ns), such as 30s, 1m or 1h30m", s)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fieldErr(path, "%q is not a Go duration: write numbers and units (h, m, s, ms, us, ns), such as 30s, 1m or 1h30m", s)
	}
	if d < MinCapacityRefresh {
		return 0, fieldErr(path, "must be at least %s (each refresh runs a capacity pod per topology segment), got %q", MinCapacityRefresh, s)
	}
	return d, nil
}

// mutableParameters checks volumeModification.mutableParameters: a literal,
// non-empty list of distinct parameter keys. Kubernetes takes any non-empty
// string as a VolumeAttributesClass parameter key, except that the keys
// starting with csi.storage.k8s.io/ are reserved; a key that is a template
// string is refused too, since the list is never evaluated.
func mutableParameters(v any, path string) ([]string, error) {
	if v == nil {
		return nil, fieldErr(path, "is required: list the parameter keys a VolumeAttributesClass may set (e.g. [iops, throughput])")
	}
	if isTemplate(v) {
		return nil, fieldErr(path, "must be a literal list, not a template: it is advertised (MODIFY_VOLUME) before any volume exists")
	}
	l, ok := v.([]any)
	if !ok {
		return nil, fieldErr(path, "must be a list of parameter keys, got %s", typeName(v))
	}
	if len(l) == 0 {
		return nil, fieldErr(path, "must not be empty: list the parameter keys a VolumeAttributesClass may set, or remove spec.volumeModification")
	}
	if len(l) > MaxMutableParameters {
		return nil, fieldErr(path, "must list at most %d keys, got %d", MaxMutableParameters, len(l))
	}
	keys := make([]string, 0, len(l))
	for i, x := range l {
		at := fmt.Sprintf("%s[%d]", path, i)
		k, ok := x.(string)
		switch {
		case !ok:
			return nil, fieldErr(at, "must be a string (a parameter key), got %s", typeName(x))
		case k == "":
			return nil, fieldErr(at, "must not be empty: Kubernetes refuses empty VolumeAttributesClass parameter keys")
		case utf8.RuneCountInString(k) > MaxParameterKeyLen:
			return nil, fieldErr(at, "must be at most %d characters, got %d", MaxParameterKeyLen, utf8.RuneCountInString(k))
		case strings.HasPrefix(k, ReservedParameterPrefix):
			return nil, fieldErr(at, "%q starts with %s, which Kubernetes and the CSI sidecars reserve for their own keys: rename the parameter", k, ReservedParameterPrefix)
		case isTemplate(k):
			return nil, fieldErr(at, "%q must be a literal parameter key, not a template", k)
		case slices.Contains(keys, k):
			return nil, fieldErr(at, "%q is listed twice", k)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// TopologySegments checks an evaluated list of topology segments (each a map
// of topology key to value, as CSI's Topology), e.g. what /pav/topology or
// volumeCreation.accessibleTopology say; a single map is one segment.
func TopologySegments(v any, path string) ([]map[string]string, error) {
	var items []any
	switch x := v.(type) {
	case map[string]any:
		items = []any{x}
	case []any:
		items = x
	default:
		return nil, fieldErr(path, "must be a list of topology segments (maps of topology key to value), got %s", typeName(v))
	}
	out := make([]map[string]string, 0, len(items))
	for i, it := range items {
		m, ok := it.(map[string]any)
		if !ok || len(m) == 0 {
			return nil, fieldErr(fmt.Sprintf("%s[%d]", path, i), "must be a non-empty map of topology key to value, got %s", typeName(it))
		}
		seg := make(map[string]string, len(m))
		for k, val := range m {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				return nil, fieldErr(fmt.Sprintf("%s[%d]", path, i), "%q is not a topology key: %s", k, errs[0])
			}
			s, ok := val.(string)
			if !ok {
				return nil, fieldErr(fmt.Sprintf("%s[%d].%s", path, i, k), "must be a string, got %s", typeName(val))
			}
			if errs := validation.IsValidLabelValue(s); len(errs) > 0 {
				return nil, fieldErr(fmt.Sprintf("%s[%d].%s", path, i, k), "%q is not a valid topology value: %s", s, errs[0])
			}
			seg[k] = s
		}
		out = append(out, seg)
	}
	return out, nil
}

// contentSources checks volumeCreation.contentSources: a literal list of
// Snapshot and Volume, each once (the API server's schema makes it a set).
func contentSources(v any, path string) ([]string, error) {
	if isTemplate(v) {
		return nil, fieldErr(path, "must be a literal list, not a template: it is advertised (CLONE_VOLUME) before any volume exists")
	}
	srcs, err := enumList(v, path, false, SourceSnapshot, SourceVolume)
	if err != nil {
		return nil, err
	}
	// enumList drops repeats; the API server (a set) refuses them.
	if l := v.([]any); len(srcs) < len(l) {
		for i := range l {
			if slices.Contains(l[:i], l[i]) {
				return nil, fieldErr(fmt.Sprintf("%s[%d]", path, i), "%s is listed twice", describe(l[i]))
			}
		}
	}
	return srcs, nil
}
