package phase

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// GroupMember is one member of a group snapshot as its contexts see it: its
// source volume, and the member snapshot's CSI name (also its default
// handle).
type GroupMember struct {
	SnapshotName string
	Volume       *v1alpha1.SnapshotSourceVolume
}

// GroupMemberName is the CSI snapshot name pav gives the member at index i
// (0-based, in the request's order) of group snapshot groupName: its
// PavSnapshot's spec.snapshotName, and its default handle.
func GroupMemberName(groupName string, i int) string {
	return groupName + "-" + strconv.Itoa(i)
}

// groupVolumeVar is a member's entry of `volumes`: what snapshotCreation's
// `volume` holds (handle, capacity, volumeMode, params), the source volume's
// `pvc` and `sc` when pav recorded them, and the member's `snapshotName` and
// `defaultHandle` (both <groupSnapshotName>-<index>).
func groupVolumeVar(m GroupMember) (map[string]any, error) {
	src := m.Volume
	v := map[string]any{
		"handle":        src.Handle,
		"capacity":      src.Capacity,
		"volumeMode":    string(src.VolumeMode),
		"params":        params(src.Params),
		"snapshotName":  m.SnapshotName,
		"defaultHandle": m.SnapshotName,
	}
	return v, addObjects(v, Objects{PVC: src.PVC, SC: src.SC})
}

// GroupSnapshotVars is the context of spec.groupSnapshotCreation: `params`
// (the VolumeGroupSnapshotClass parameters), `groupSnapshotName` and
// `defaultHandle` (both the CSI group snapshot name), and `volumes`, one entry
// per member in the request's order (groupVolumeVar).
func GroupSnapshotVars(groupName string, classParams map[string]string, members []GroupMember) (templating.Vars, error) {
	vols := make([]any, 0, len(members))
	for i, m := range members {
		v, err := groupVolumeVar(m)
		if err != nil {
			return nil, fmt.Errorf("volumes[%d]: %w", i, err)
		}
		vols = append(vols, v)
	}
	return templating.Vars{
		"params":            params(classParams),
		"groupSnapshotName": groupName,
		"defaultHandle":     groupName,
		"volumes":           vols,
	}, nil
}

// GroupMemberSnapshot is a member's snapshot in the deletion context: its
// handle and size (0: unknown), and which member it is.
type GroupMemberSnapshot struct {
	Member GroupMember
	Handle string
	Size   int64
}

// GroupSnapshotDeletionVars is the context of spec.groupSnapshotDeletion: the
// creation context plus the group's `handle` and `snapshots`, one
// {handle, capacity, volume} per member snapshot still to delete (capacity
// null when unknown, volume as in `volumes`).
func GroupSnapshotDeletionVars(groupName string, classParams map[string]string, members []GroupMember, handle string, snapshots []GroupMemberSnapshot) (templating.Vars, error) {
	v, err := GroupSnapshotVars(groupName, classParams, members)
	if err != nil {
		return nil, err
	}
	snaps := make([]any, 0, len(snapshots))
	for i, s := range snapshots {
		vol, err := groupVolumeVar(s.Member)
		if err != nil {
			return nil, fmt.Errorf("snapshots[%d]: %w", i, err)
		}
		var capacity any
		if s.Size > 0 {
			capacity = s.Size
		}
		snaps = append(snaps, map[string]any{"handle": s.Handle, "capacity": capacity, "volume": vol})
	}
	v["handle"] = handle
	v["snapshots"] = snaps
	return v, nil
}

// GroupSnapshotResult is what a group's members are, once its creation pod
// succeeded: each member's handle and size, in the members' order.
type GroupSnapshotResult struct {
	Handles []string
	Sizes   []int64
}

// ReadGroupSnapshots reads what a groupSnapshotCreation pod wrote to
// /pav/snapshots (reported: nil when it wrote nothing): YAML or JSON, a map
// from a member's source volume handle to {handle, capacity}, both optional.
// A member the file leaves out, or whose handle (capacity) it leaves out, gets
// the default: its snapshotName (<groupSnapshotName>-<index>) and its source
// volume's capacity. Anything else is an error naming the file, the member and
// the fix.
func ReadGroupSnapshots(reported *string, members []GroupMember) (*GroupSnapshotResult, error) {
	res := &GroupSnapshotResult{Handles: make([]string, len(members)), Sizes: make([]int64, len(members))}
	index := make(map[string]int, len(members))
	for i, m := range members {
		res.Handles[i], res.Sizes[i] = m.SnapshotName, m.Volume.Capacity
		index[m.Volume.Handle] = i
	}
	fail := func(format string, args ...any) (*GroupSnapshotResult, error) {
		return nil, fmt.Errorf("the groupSnapshotCreation pod wrote an invalid /pav/snapshots: "+format, args...)
	}
	if reported != nil && strings.TrimSpace(*reported) != "" {
		v, err := templating.ParseYAML(*reported)
		if err != nil {
			return fail("%v: write YAML or JSON, a map from each member's source volume handle (volumes[].handle) to {handle: ..., capacity: ...}", err)
		}
		entries, ok := v.(map[string]any)
		if !ok && v != nil {
			return fail("it is a %s, not a map from each member's source volume handle (volumes[].handle) to {handle: ..., capacity: ...}", typeName(v))
		}
		for _, key := range slices.Sorted(func(yield func(string) bool) {
			for k := range entries {
				if !yield(k) {
					return
				}
			}
		}) {
			i, ok := index[key]
			if !ok {
				known := make([]string, 0, len(members))
				for _, m := range members {
					known = append(known, strconv.Quote(m.Volume.Handle))
				}
				return fail("%q is not the handle of a member's source volume (the members' are %s): key each entry by volumes[].handle", key, strings.Join(known, ", "))
			}
			e := entries[key]
			if e == nil {
				continue // the defaults
			}
			m, ok := e.(map[string]any)
			if !ok {
				return fail("the entry of %q is a %s, not a map {handle: ..., capacity: ...}", key, typeName(e))
			}
			for _, f := range slices.Sorted(func(yield func(string) bool) {
				for k := range m {
					if !yield(k) {
						return
					}
				}
			}) {
				switch f {
				case "handle":
					h, ok := m[f].(string)
					if !ok || strings.TrimSpace(h) == "" {
						return fail("the entry of %q has handle %s: a member's handle must be a non-empty string (leave it out for the default %q)", key, describe(m[f]), members[i].SnapshotName)
					}
					res.Handles[i] = strings.TrimSpace(h)
				case "capacity":
					n, err := ParseCapacity(m[f], Floor)
					if err != nil {
						return fail("the entry of %q has capacity %s: %v (the snapshot's size in bytes, or a quantity such as 512Mi; leave it out for the source volume's)", key, describe(m[f]), err)
					}
					res.Sizes[i] = n
				default:
					return fail("the entry of %q has an unknown field %q: an entry holds handle and capacity only", key, f)
				}
			}
		}
	}
	seen := make(map[string]int, len(members))
	for i, h := range res.Handles {
		if j, dup := seen[h]; dup {
			return fail("the members of volumes %q and %q both have handle %q: each member's handle must be unique", members[j].Volume.Handle, members[i].Volume.Handle, h)
		}
		seen[h] = i
	}
	return res, nil
}
