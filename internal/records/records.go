// Package records keeps pav's PavVolume records (api/v1alpha1.PavVolume) for one
// provisioner: the controller plugin's only memory of the volumes it made.
//
// Reads come from an informer (label selector on the provisioner, so its memory
// is O(this provisioner's volumes), never the cluster's), indexed by the handle
// label. The cache lags behind the store's own writes, so the store remembers
// each object it wrote until the informer has caught up with it, and Get and
// ByHandle fall back to one API read on a miss: a record just written is never
// missed, and one just deleted is never resurrected.
//
// Writes are optimistic: Update sends the resourceVersion it read (a Conflict
// means someone else wrote in between; the caller retries from a fresh read),
// Delete sends the UID it read.
//
// Store (PavVolumes) and SnapshotStore (PavSnapshots) are one generic store
// (store.go) over a descriptor of their kind.
package records

import (
	"errors"

	"k8s.io/client-go/dynamic"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/compat"
	"github.com/pods-as-volumes/pav/podrunner"
)

var (
	// ErrNotStarted and ErrSnapshotsNotStarted are returned before Start
	// has synced.
	ErrNotStarted          = errors.New("PavVolume records not loaded yet")
	ErrSnapshotsNotStarted = errors.New("PavSnapshot records not loaded yet")

	// ErrOtherOwner and ErrOtherSnapshotOwner are returned for a record of
	// the name that belongs to another provisioner or volume (snapshot).
	ErrOtherOwner         = errors.New("PavVolume belongs to another provisioner or volume")
	ErrOtherSnapshotOwner = errors.New("PavSnapshot belongs to another provisioner or snapshot")
)

// Store reads and writes one provisioner's PavVolumes. Its methods are the
// generic store's, with T *v1alpha1.PavVolume.
type Store struct {
	store[*v1alpha1.PavVolume]
}

// New returns a store of provisioner's records; call Start before using it.
func New(client dynamic.Interface, provisioner string) *Store {
	s := &Store{}
	s.init(&volumes, client, provisioner)
	return s
}

var volumes = kind[*v1alpha1.PavVolume]{
	name:        v1alpha1.VolumeKind,
	what:        "volume",
	gvr:         v1alpha1.VolumeGroupVersionResource,
	index:       "pav.handle",
	new:         func() *v1alpha1.PavVolume { return &v1alpha1.PavVolume{} },
	deepCopy:    (*v1alpha1.PavVolume).DeepCopy,
	notStarted:  ErrNotStarted,
	otherOwner:  ErrOtherOwner,
	recordName:  v1alpha1.VolumeRecordName,
	csiName:     func(v *v1alpha1.PavVolume) string { return v.Spec.VolumeName },
	provisioner: func(v *v1alpha1.PavVolume) *string { return &v.Spec.Provisioner },
	handle:      func(v *v1alpha1.PavVolume) string { return v.Status.Handle },
	// An inline volume's record carries its node, for people (kubectl get
	// -l): the node plugin reads its records by name.
	moreLabels: func(v *v1alpha1.PavVolume, l map[string]string) {
		if e := v.Spec.Ephemeral; e != nil {
			l[v1alpha1.LabelVolumeNode] = podrunner.NodeLabel(e.Node)
		} else {
			delete(l, v1alpha1.LabelVolumeNode)
		}
	},

	format:        VolumeFormat,
	formatVersion: func(v *v1alpha1.PavVolume) *int { return &v.Spec.FormatVersion },
	migrations: map[int]func(*v1alpha1.PavVolume){
		// Version 1 is version 0 with the version written down: the records
		// development builds kept after v0.2.0 have every field version 1's
		// have, or leave it out (all are optional since).
		0: func(*v1alpha1.PavVolume) {},
	},
}

// VolumeFormat and SnapshotFormat are the formats of the records this pav
// writes (and the newest it reads). A change to what a record's fields mean,
// or a field an older pav must not ignore, takes a new version and a
// migration from the one before (records_test.go tests each).
var (
	VolumeFormat = compat.Format{What: "PavVolume", Current: 1, Releases: map[int]string{
		0: "a development build after v0.2.0 (v0.2.0 kept no records)",
		1: "the first release after v0.2.0",
	}}
	SnapshotFormat = compat.Format{What: "PavSnapshot", Current: 1, Releases: map[int]string{
		0: "a development build after v0.2.0 (v0.2.0 had no snapshots)",
		1: "the first release after v0.2.0",
	}}
)
