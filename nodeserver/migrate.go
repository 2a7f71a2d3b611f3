package nodeserver

// Migration of state.json from older formats (stateFormat), when the node
// plugin starts: an upgrade must neither lose a staged volume nor stage it
// again, and a restage is what a misread state would cost (a live mount's
// staging pod stopped under its clients).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/podrunner"
)

// nodeFacts is what migrating a state needs to know beyond the file: where
// and when it is read, and the pods of this node. A parameter, so that every
// step is tested with the facts of its case.
type nodeFacts struct {
	provisioner, nodeID string
	// bootID is the node's boot, bootTime when it began; written is when
	// state.json was last written (its mtime).
	bootID   string
	bootTime time.Time
	written  time.Time
	// pod is this node's pav pod namespace/name, from the runner's informer
	// cache (nil: none).
	pod func(namespace, name string) (*corev1.Pod, error)
	// identify is what the staged /pav/volume of dir resolves to now.
	identify func(dir string, st *staged) (*hostmount.Identity, error)
}

// migrateState brings a state of an older format to stateFormat.Current, one
// version at a time (in memory; the caller writes it).
func migrateState(dir string, st *staged, f nodeFacts) error {
	for st.FormatVersion < stateFormat.Current {
		switch st.FormatVersion {
		case 0:
			if err := migrateState0(dir, st, f); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s/state.json has format version %d, which this pav cannot migrate: a pav bug", dir, st.FormatVersion)
		}
		st.FormatVersion++
	}
	return nil
}

// migrateState0 makes a state of format 0 one of format 1. Format 0 is
// v0.2.0's (the development builds after it wrote format 1's fields without
// the version, and need only the fields they lack):
//
//   - v0.2.0 recorded the staging pod's namespace (podNamespace), not its
//     identity: a pav pod has been adopted or deleted only by its recorded UID
//     or token since. The pod is found by the name and labels v0.2.0 gave it
//     (the informer cache of this node's pav pods) and its UID recorded, so
//     that unstaging removes it, and, while it runs (a live mount), verify
//     watches it. A staging pod that completed is gone: v0.2.0 deleted it.
//     Whoever can make pods in that namespace could have replaced the pod with
//     a lookalike before the upgrade; v0.2.0 would have adopted it too, and
//     pav gains nothing from it but the right to delete it.
//   - No boot ID: a state written during this boot gets this boot's, so that
//     a later reboot is seen; one written before (the node rebooted since
//     v0.2.0 staged the volume) gets none that can match, and the staging is
//     stale, as it is: what the staging pod set up went with the boot, and a
//     device number it saved may now be another volume's.
//   - No identity of /pav/volume: what it resolves to now is recorded, for a
//     staging of this boot that still checks out (the device or mount v0.2.0
//     published), so that a later change is seen.
func migrateState0(dir string, st *staged, f nodeFacts) error {
	if st.BootID == "" {
		if f.written.After(f.bootTime) {
			st.BootID = f.bootID
		} else {
			st.BootID = fmt.Sprintf("(a boot before %s, when v0.2.0 staged the volume)", f.bootTime.UTC().Format(time.RFC3339))
		}
	}
	if st.StagingPod == nil && st.PodNamespace != "" {
		key := podrunner.NodeVolumeKey(st.Handle, f.nodeID)
		name := podrunner.PodName(f.provisioner, v1alpha1.PhaseStaging, key)
		pod, err := f.pod(st.PodNamespace, name)
		if err != nil {
			return fmt.Errorf("looking for the staging pod %s/%s that v0.2.0 ran: %w", st.PodNamespace, name, err)
		}
		if pod != nil && legacyStagingPod(pod, f.provisioner, key, f.nodeID) {
			st.StagingPod = &podID{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
			st.Began = true
			st.KeepRunning = st.Staged && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
		}
	}
	st.PodNamespace = ""
	if st.Staged && st.Volume == nil && st.BootID == f.bootID {
		id, err := f.identify(dir, st)
		if err != nil {
			// Not staged as it should be: verify says why, and the
			// volume is staged again when next used.
			klog.InfoS("The staged volume does not check out; its staging is verified when next used", "dir", dir, "err", err)
		} else {
			st.Volume = id
		}
	}
	return nil
}

// legacyStagingPod says whether pod is the staging pod v0.2.0 ran for
// volumeKey on node: its labels and volume key annotation, by which v0.2.0
// itself adopted and deleted it.
func legacyStagingPod(pod *corev1.Pod, provisioner, volumeKey, node string) bool {
	l := pod.Labels
	return l[podrunner.LabelProvisioner] == provisioner && l[podrunner.LabelPhase] == string(v1alpha1.PhaseStaging) &&
		l[podrunner.LabelNode] == podrunner.NodeLabel(node) && pod.Annotations[podrunner.AnnotationVolumeKey] == volumeKey
}

// identifyStaged is nodeFacts.identify on the host: what /pav/volume of dir
// resolves to, if it is what the volume mode needs.
func identifyStaged(dir string, st *staged) (*hostmount.Identity, error) {
	src, err := checkVolume(dir, st)
	if err != nil {
		return nil, err
	}
	id, err := hostmount.Identify(src)
	if err != nil {
		return nil, err
	}
	return &id, nil
}

// MigrateStates brings every volume's state.json on this node to this pav's
// format. The driver calls it once, after the pod runner's cache has synced
// and before it serves: no CSI call meets an older state. A state of a newer
// format is left alone (readState refuses it, naming both versions); an
// error (a state that cannot be read or written) stops the node plugin, whose
// restart retries.
func (s *Server) MigrateStates(ctx context.Context, provisioner string) error {
	entries, err := os.ReadDir(s.StateDir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the state directory %s: %w", s.StateDir, err)
	}
	boot, err := s.boot()
	if err != nil {
		return err
	}
	bootTime, err := hostmount.BootTime()
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(s.StateDir, e.Name())
		st, err := readStateFile(dir)
		if err != nil {
			// A newer format, or an unreadable file: every call for the
			// volume says so (readState).
			klog.FromContext(ctx).Error(err, "Not migrating a volume's state", "dir", dir)
			continue
		}
		if st == nil || st.FormatVersion == stateFormat.Current {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, "state.json"))
		if err != nil {
			return err
		}
		from := st.FormatVersion
		f := nodeFacts{provisioner: provisioner, nodeID: s.NodeID, bootID: boot, bootTime: bootTime, written: fi.ModTime(),
			pod: s.Pods.Cached, identify: identifyStaged}
		if err := migrateState(dir, st, f); err != nil {
			return fmt.Errorf("migrating %s/state.json: %w", dir, err)
		}
		if err := writeState(dir, st); err != nil {
			return fmt.Errorf("migrating %s/state.json: %w", dir, err)
		}
		klog.FromContext(ctx).Info("Migrated a volume's state", "handle", st.Handle, "from", stateFormat.ReleaseOf(from), "fromVersion", from,
			"toVersion", st.FormatVersion, "stagingPod", st.StagingPod, "keepRunning", st.KeepRunning, "bootID", st.BootID)
	}
	return nil
}
