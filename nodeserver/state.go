package nodeserver

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/compat"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/internal/volume"
	"github.com/pods-as-volumes/pav/podrunner"
)

// staged is a volume's state.json on this node: what NodeStageVolume made
// and learnt, for NodeUnstageVolume (which gets neither the volume context nor
// the capability), for the checks that staging still holds (verify), and for
// a restarted node plugin. It lives in the per-volume directory, which only
// root on the node can write: it is a record, not input.
type staged struct {
	// FormatVersion is the version of this file's format (stateFormat; 0:
	// v0.2.0's, which had none). MigrateStates brings older ones to it when
	// the node plugin starts; a newer one is refused (readState).
	FormatVersion int `json:"formatVersion"`

	Handle     string                              `json:"handle"`
	VolumeMode corev1.PersistentVolumeMode         `json:"volumeMode"`
	Access     []corev1.PersistentVolumeAccessMode `json:"accessModes"`
	Capacity   int64                               `json:"capacity"`
	Params     map[string]string                   `json:"params"`
	ReadOnly   bool                                `json:"readOnly"`
	PV         string                              `json:"pv,omitempty"`
	StagedAt   string                              `json:"stagingTargetPath"`
	// MutableParams are the parameters of the PV's VolumeAttributesClass
	// when the volume was staged (the staging context's mutableParams): the
	// unstaging and node expansion pods see what the staging pod saw.
	MutableParams map[string]string `json:"mutableParams,omitempty"`

	// The objects of the staging context, trimmed (volume.Snapshot): the
	// unstaging pod gets the context the staging pod had, even once the PV or
	// PVC is gone, and without reading them again.
	PVObject   *corev1.PersistentVolume      `json:"pvObject,omitempty"`
	PVCObject  *corev1.PersistentVolumeClaim `json:"pvcObject,omitempty"`
	NodeObject *corev1.Node                  `json:"nodeObject,omitempty"`

	// BootID is the node's boot ID when staging began: after a reboot nothing
	// the staging pod set up survives, and device numbers it saved may name
	// another volume's device.
	BootID string `json:"bootID,omitempty"`

	// The pods pav runs for the volume on this node, recorded before each is
	// asked for: only a pod with the recorded UID (or, until it is known, the
	// recorded token) is ever adopted or deleted.
	ValidationPod *podID `json:"validationPod,omitempty"`
	StagingPod    *podID `json:"stagingPod,omitempty"`
	UnstagingPod  *podID `json:"unstagingPod,omitempty"`
	// NodeExpansionPod is the pod of the node expansion under way
	// (NodeExpansion), until it is removed after its outcome was recorded.
	NodeExpansionPod *podID `json:"nodeExpansionPod,omitempty"`
	// NodeExpansion is the growth under way (NodeExpandVolume), recorded
	// with its pod's identity before the pod is asked for, so that a retry
	// finishes it with the capacity that pod was given; nil when none is.
	NodeExpansion *nodeExpansion `json:"nodeExpansion,omitempty"`
	// Began: a staging pod was asked for, so the unstaging pod has something to
	// undo, even if that pod is gone since.
	Began bool `json:"began,omitempty"`

	// Staged: the staging pod is done (or ready) and /pav/volume checked out.
	Staged bool `json:"staged"`
	// Ahead: the node plugin staged the volume ahead of the kubelet, for a
	// pod bound to this node (ahead.go), and the kubelet's NodeStageVolume
	// has not adopted the staging yet. StagedAt is then the path the kubelet
	// is expected to give.
	Ahead bool `json:"ahead,omitempty"`
	// Unstaging: an unstaging began (NodeUnstage, the revert of a failed
	// staging, or the clean-up of a lost one), so the volume is no longer
	// staged, and the unstaging must finish before it is staged again.
	Unstaging bool `json:"unstaging,omitempty"`
	// Unstaged: the unstaging pod succeeded (recorded before it is removed), so
	// a retry of a clean-up that failed afterwards does not run it again.
	Unstaged bool `json:"unstaged,omitempty"`
	// KeepRunning: the staging pod was still running when it became ready (a
	// FUSE daemon, say): the volume lasts only as long as that pod.
	KeepRunning bool `json:"keepRunning,omitempty"`
	// Volume is what /pav/volume resolved to when staging finished.
	Volume *hostmount.Identity `json:"volume,omitempty"`
	// LostReported is the UID of the KeepRunning staging pod whose end pav
	// already reported (one event per death, across restarts).
	LostReported types.UID `json:"lostReported,omitempty"`

	// Pod is, for an inline ephemeral volume (inline.go), the pod whose
	// volume it is: its contexts' `pod`, and where its events go. Such a
	// volume has no PV, claim or staging target path.
	Pod *v1alpha1.EphemeralPod `json:"pod,omitempty"`

	// PodNamespace is where v0.2.0 ran the staging pod (format 0, which
	// recorded no pod identity): read by the migration, never written since.
	PodNamespace string `json:"podNamespace,omitempty"`
}

// stateFormat is the format of state.json this pav writes, and the newest it
// reads. A change to what a field means, or a field an older pav must not
// ignore, takes a new version and a step in migrateState (migrate_test.go
// tests each).
var stateFormat = compat.Format{What: "node state", Current: 1, Releases: map[int]string{
	0: "v0.2.0, or a development build after it (no format version)",
	1: "the first release after v0.2.0",
}}

// nodeExpansion is a growth of the staged volume on this node: from Previous
// to Capacity bytes.
type nodeExpansion struct {
	Capacity int64 `json:"capacity"`
	Previous int64 `json:"previousCapacity"`
}

// podID is the identity of one pod pav runs: where it is, the token it
// carries, and its UID once known.
type podID struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name,omitempty"`
	Token     string    `json:"token"`
	UID       types.UID `json:"uid,omitempty"`
	// Deleting: its deletion was asked for without waiting (a completed
	// staging pod, Discard); it is gone once the informer no longer has it.
	Deleting bool `json:"deleting,omitempty"`
}

func (id *podID) String() string { return id.Namespace + "/" + id.Name }

// withID returns op carrying id's identity.
func withID(op podrunner.Operation, id *podID) podrunner.Operation {
	op.Token, op.UID = id.Token, id.UID
	if op.Template.Namespace == "" {
		op.Template.Namespace = id.Namespace
	}
	return op
}

func (st *staged) vars() phase.Staged {
	return phase.Staged{VolumeMode: st.VolumeMode, AccessModes: st.Access, Capacity: st.Capacity,
		Params: st.Params, Handle: st.Handle, ReadOnly: st.ReadOnly, MutableParams: st.MutableParams, Pod: st.Pod}
}

// objects are the staging context's objects, from the snapshot.
func (st *staged) objects() phase.Objects {
	return phase.Objects{PV: st.PVObject, PVC: st.PVCObject, Node: st.NodeObject}
}

// setObjects snapshots the staging context's objects.
func (st *staged) setObjects(objs phase.Objects) {
	st.PVObject, st.PVCObject, st.NodeObject = nil, nil, nil
	if objs.PV != nil {
		st.PVObject = objs.PV.DeepCopy()
		volume.Snapshot(&st.PVObject.ObjectMeta)
	}
	if objs.PVC != nil {
		st.PVCObject = objs.PVC.DeepCopy()
		volume.Snapshot(&st.PVCObject.ObjectMeta)
	}
	if objs.Node != nil {
		st.NodeObject = objs.Node.DeepCopy()
		volume.Snapshot(&st.NodeObject.ObjectMeta)
	}
}

// anyPod says whether a pod of the volume may exist.
func (st *staged) anyPod() bool {
	return st.ValidationPod != nil || st.StagingPod != nil || st.UnstagingPod != nil || st.NodeExpansionPod != nil
}

// writeState replaces state.json atomically (write, then rename), so a crash
// leaves the old or the new state, never half of one.
func writeState(dir string, st *staged) error {
	st.FormatVersion = stateFormat.Current
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "state.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "state.json"))
}

// readState reads a volume's state.json (nil if there is none), which must be
// of this pav's format: MigrateStates brought older ones to it before the
// node plugin served, and a newer one is refused before anything of it is
// used (a downgrade: its fields may mean what this pav does not know).
func readState(dir string) (*staged, error) {
	st, err := readStateFile(dir)
	if err != nil || st == nil {
		return st, err
	}
	if st.FormatVersion < stateFormat.Current {
		return nil, grpcerr.Errorf(codes.Unavailable, "%s/state.json has format version %d (%s), which the node plugin migrates when it starts, and has not: see its log (restarting it retries)",
			dir, st.FormatVersion, stateFormat.ReleaseOf(st.FormatVersion))
	}
	return st, nil
}

// eachState calls f with the directory and state of every volume of this
// node whose state.json reads; errors (a missing state directory, a state of
// another format) leave the volume out. what names the look, for a log of a
// state directory that cannot be read.
func (s *Server) eachState(what string, f func(dir string, st *staged)) {
	entries, err := os.ReadDir(s.StateDir)
	if err != nil {
		if !os.IsNotExist(err) {
			klog.ErrorS(err, "Cannot read the state directory", "dir", s.StateDir, "for", what)
		}
		return
	}
	for _, e := range entries {
		dir := filepath.Join(s.StateDir, e.Name())
		if st, err := readState(dir); err == nil && st != nil {
			f(dir, st)
		}
	}
}

// readStateFile reads state.json as it is, of this format or an older one.
func readStateFile(dir string) (*staged, error) {
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	st := &staged{}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("%s/state.json: %w", dir, err)
	}
	if err := stateFormat.Check(fmt.Sprintf("%s/state.json of volume %q", dir, st.Handle), st.FormatVersion); err != nil {
		return nil, err
	}
	return st, nil
}
