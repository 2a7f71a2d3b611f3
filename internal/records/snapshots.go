package records

// The PavSnapshot store: the same cache-with-our-writes and optimistic writes
// as Store keeps for PavVolumes (see the package doc), for a provisioner's
// snapshot records, plus List (ListSnapshots reads every record) and the
// source volume label.

import (
	"k8s.io/client-go/dynamic"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// SnapshotStore reads and writes one provisioner's PavSnapshots. Its methods
// are the generic store's, with T *v1alpha1.PavSnapshot, and List.
type SnapshotStore struct {
	store[*v1alpha1.PavSnapshot]
}

// NewSnapshots returns a store of provisioner's snapshot records; call Start
// before using it.
func NewSnapshots(client dynamic.Interface, provisioner string) *SnapshotStore {
	s := &SnapshotStore{}
	s.init(&snapshots, client, provisioner)
	return s
}

// List returns every record of this provisioner, from the cache with our own
// writes the cache has not caught up with, sorted by name (ListSnapshots
// pages through it).
func (s *SnapshotStore) List() ([]*v1alpha1.PavSnapshot, error) {
	return s.list()
}

var snapshots = kind[*v1alpha1.PavSnapshot]{
	name:        v1alpha1.SnapshotKind,
	what:        "snapshot",
	gvr:         v1alpha1.SnapshotGroupVersionResource,
	index:       "pav.snapshot-handle",
	new:         func() *v1alpha1.PavSnapshot { return &v1alpha1.PavSnapshot{} },
	deepCopy:    (*v1alpha1.PavSnapshot).DeepCopy,
	notStarted:  ErrSnapshotsNotStarted,
	otherOwner:  ErrOtherSnapshotOwner,
	recordName:  v1alpha1.SnapshotRecordName,
	csiName:     func(v *v1alpha1.PavSnapshot) string { return v.Spec.SnapshotName },
	provisioner: func(v *v1alpha1.PavSnapshot) *string { return &v.Spec.Provisioner },
	handle:      func(v *v1alpha1.PavSnapshot) string { return v.Status.Handle },
	// ListSnapshots filters on the source volume.
	moreLabels: func(v *v1alpha1.PavSnapshot, l map[string]string) {
		l[v1alpha1.LabelSnapshotSourceVolume] = v1alpha1.HandleLabel(v.Spec.SourceVolumeID)
	},

	format:        SnapshotFormat,
	formatVersion: func(v *v1alpha1.PavSnapshot) *int { return &v.Spec.FormatVersion },
	migrations: map[int]func(*v1alpha1.PavSnapshot){
		0: func(*v1alpha1.PavSnapshot) {}, // as PavVolume's
	},
}
