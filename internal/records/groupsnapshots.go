package records

// The PavGroupSnapshot store: the same cache-with-our-writes and optimistic
// writes as Store keeps for PavVolumes (see the package doc), for a
// provisioner's group snapshot records. A group is found by its CSI name (Get)
// or its handle (ByHandle); its members are PavSnapshots (SnapshotStore).

import (
	"errors"

	"k8s.io/client-go/dynamic"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/compat"
)

var (
	// ErrGroupSnapshotsNotStarted is returned before Start has synced.
	ErrGroupSnapshotsNotStarted = errors.New("PavGroupSnapshot records not loaded yet")
	// ErrOtherGroupSnapshotOwner is returned for a record of the name that
	// belongs to another provisioner or group snapshot.
	ErrOtherGroupSnapshotOwner = errors.New("PavGroupSnapshot belongs to another provisioner or group snapshot")
)

// GroupSnapshotFormat is the format of the PavGroupSnapshots this pav writes
// (and the newest it reads); see VolumeFormat.
var GroupSnapshotFormat = compat.Format{What: "PavGroupSnapshot", Current: 1, Releases: map[int]string{
	1: "the first release with group snapshots",
}}

// GroupSnapshotStore reads and writes one provisioner's PavGroupSnapshots.
// Its methods are the generic store's, with T *v1alpha1.PavGroupSnapshot.
type GroupSnapshotStore struct {
	store[*v1alpha1.PavGroupSnapshot]
}

// NewGroupSnapshots returns a store of provisioner's group snapshot records;
// call Start before using it.
func NewGroupSnapshots(client dynamic.Interface, provisioner string) *GroupSnapshotStore {
	s := &GroupSnapshotStore{}
	s.init(&groupSnapshots, client, provisioner)
	return s
}

var groupSnapshots = kind[*v1alpha1.PavGroupSnapshot]{
	name:        v1alpha1.GroupSnapshotKind,
	what:        "group snapshot",
	gvr:         v1alpha1.GroupSnapshotGroupVersionResource,
	index:       "pav.group-snapshot-handle",
	new:         func() *v1alpha1.PavGroupSnapshot { return &v1alpha1.PavGroupSnapshot{} },
	deepCopy:    (*v1alpha1.PavGroupSnapshot).DeepCopy,
	notStarted:  ErrGroupSnapshotsNotStarted,
	otherOwner:  ErrOtherGroupSnapshotOwner,
	recordName:  v1alpha1.GroupSnapshotRecordName,
	csiName:     func(v *v1alpha1.PavGroupSnapshot) string { return v.Spec.GroupSnapshotName },
	provisioner: func(v *v1alpha1.PavGroupSnapshot) *string { return &v.Spec.Provisioner },
	handle:      func(v *v1alpha1.PavGroupSnapshot) string { return v.Status.Handle },

	format:        GroupSnapshotFormat,
	formatVersion: func(v *v1alpha1.PavGroupSnapshot) *int { return &v.Spec.FormatVersion },
	migrations:    map[int]func(*v1alpha1.PavGroupSnapshot){},
}
