package nodeserver

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/hostmount"
	"github.com/pods-as-volumes/pav/podrunner"
)

// PodEvents is where the node server hears of its pods' events
// (podrunner.Runner.OnPodEvent).
type PodEvents interface {
	OnPodEvent(podrunner.PodEventHandler)
}

// Event reasons of the node plugin (on the volume's PVC, else its PV).
const (
	// ReasonStagingLost: the staging of a volume on a node no longer holds (a
	// KeepRunning staging pod ended, the node rebooted, what /pav/volume was is
	// gone).
	ReasonStagingLost = "VolumeStagingLost"
	// ReasonRestaged: pav staged such a volume again.
	ReasonRestaged = "VolumeRestaged"
)

// verify says why the staging recorded in st no longer holds, or "" if it
// does. It reads only this node: the boot ID, the informer cache of the
// runner, and /pav/volume. Fields a state written by an older pav lacks are
// not checked.
func (s *Server) verify(dir string, st *staged) (string, error) {
	if st.BootID != "" {
		boot, err := s.boot()
		if err != nil {
			return "", err
		}
		if boot != st.BootID {
			return fmt.Sprintf("node %s rebooted since the volume was staged (boot ID %s, staged under %s)", s.NodeID, boot, st.BootID), nil
		}
	}
	if st.KeepRunning && st.StagingPod != nil {
		pod, err := s.Pods.Cached(st.StagingPod.Namespace, st.StagingPod.Name)
		if err != nil {
			return "", err
		}
		var why string
		if pod == nil || pod.UID != st.StagingPod.UID {
			why = "is gone"
		} else {
			why = podLost(pod)
		}
		if why != "" {
			return fmt.Sprintf("its staging pod %s (uid %s), which keeps the volume available, %s", st.StagingPod, st.StagingPod.UID, why), nil
		}
	}
	src, err := checkVolume(dir, st)
	if err != nil {
		return err.Error(), nil
	}
	if st.Volume != nil {
		cur, err := hostmount.Identify(src)
		if err != nil {
			return fmt.Sprintf("/pav/volume cannot be checked: %v", err), nil
		}
		rec := *st.Volume
		if rec.IsBlock() && st.growingTo(cur.Size) {
			// Grown by the node expansion under way, not yet recorded.
			rec.Size = cur.Size
		}
		if why := rec.Compare(cur); why != "" {
			return "/pav/volume is not what staging made: " + why, nil
		}
	}
	return "", nil
}

// podLost says why a KeepRunning staging pod no longer keeps its volume
// available, or "" if it still does.
func podLost(pod *corev1.Pod) string {
	switch {
	case pod.DeletionTimestamp != nil:
		return "is being deleted"
	case podrunner.Finished(pod):
		msg := fmt.Sprintf("has ended (phase %s", pod.Status.Phase)
		if pod.Status.Reason != "" {
			msg += ", reason " + pod.Status.Reason
		}
		for _, c := range pod.Status.ContainerStatuses {
			if t := c.State.Terminated; t != nil && t.ExitCode != 0 {
				msg += fmt.Sprintf(", container %q exited with code %d", c.Name, t.ExitCode)
				if t.Reason != "" {
					msg += " (" + t.Reason + ")"
				}
			}
		}
		return msg + ")"
	}
	for _, c := range pod.Status.ContainerStatuses {
		if c.State.Running == nil {
			return fmt.Sprintf("has container %q not running", c.Name)
		}
	}
	return ""
}

// boot is this node's boot ID (BootID, else read once from the kernel).
func (s *Server) boot() (string, error) {
	s.bootOnce.Do(func() {
		if s.BootID == "" {
			s.BootID, s.bootErr = hostmount.BootID()
		}
	})
	return s.BootID, s.bootErr
}

// eventf puts an event on the volume's PVC, else on its PV (pav's users look
// at their claims; a static PV may have no claim), or on the pod of an inline
// volume. Without either, or
// without a recorder, it is only logged.
func (s *Server) eventf(st *staged, eventType, reason, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	klog.InfoS("Volume event", "handle", st.Handle, "type", eventType, "reason", reason, "message", msg)
	if s.Recorder == nil {
		return
	}
	var obj runtime.Object
	switch {
	case st.PVCObject != nil:
		obj = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: st.PVCObject.Namespace,
			Name: st.PVCObject.Name, UID: st.PVCObject.UID, ResourceVersion: st.PVCObject.ResourceVersion}
	case st.PVObject != nil:
		obj = &corev1.ObjectReference{Kind: "PersistentVolume", APIVersion: "v1", Name: st.PVObject.Name, UID: st.PVObject.UID}
	case st.Pod != nil:
		// An inline volume: its pod is what its author looks at.
		obj = &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: st.Pod.Namespace, Name: st.Pod.Name, UID: st.Pod.UID}
	default:
		return
	}
	s.Recorder.Event(obj, eventType, reason, msg)
}

// WatchStagingPods makes the server react to its runner's pod events: when a
// KeepRunning staging pod that keeps a staged volume available ends, a
// Warning event goes to the volume's PVC at once, once per pod (users need
// not wait for the next NodeGetVolumeStats, which kubelet only makes use of
// with the CSIVolumeHealth feature gate). Call it before the runner starts, so
// that a pod that ended while the node plugin was down is reported from the
// informer's initial list; a pod deleted meanwhile is found by Sweep.
func (s *Server) WatchStagingPods(r PodEvents) {
	r.OnPodEvent(func(pod *corev1.Pod, deleted bool) {
		if pod.Labels[podrunner.LabelPhase] != string(v1alpha1.PhaseStaging) {
			return
		}
		handle, node, ok := podrunner.SplitNodeVolumeKey(pod.Annotations[podrunner.AnnotationVolumeKey])
		if !ok || node != s.NodeID {
			return
		}
		why := "is gone"
		if !deleted {
			if why = podLost(pod); why == "" {
				return
			}
		}
		s.reportLost(handle, func(st *staged) string {
			if st.StagingPod.UID != pod.UID {
				return "" // an older pod of the volume, or a pod pav did not create
			}
			return why
		})
	})
}

// Sweep reports the staged volumes of this node whose KeepRunning staging pod
// is gone (it ended while the node plugin was not running). It reads only the
// state directory and the runner's cache.
func (s *Server) Sweep() {
	s.eachState("the staging pods that ended", func(_ string, st *staged) {
		s.reportLost(st.Handle, func(st *staged) string {
			pod, err := s.Pods.Cached(st.StagingPod.Namespace, st.StagingPod.Name)
			switch {
			case err != nil:
				return ""
			case pod == nil || pod.UID != st.StagingPod.UID:
				return "is gone"
			}
			return podLost(pod)
		})
	})
}

// reportLost reports, once per staging pod, that the KeepRunning staging pod
// of a staged volume no longer keeps it available (why(st) != ""). An
// operation in progress on the volume is left alone: it is the one removing
// the pod (unstaging, re-staging), or it verifies the staging itself.
//
// The volume is taken only when there is something to report: the state is
// first read without it (state.json is replaced by a rename, so a read sees
// a whole state), then again once taken. Every staging pod's events come
// here, a completed pod's deletion among them; taking the volume for each
// made a NodeStageVolume or NodeUnstageVolume that came at that moment fail
// with Aborted, and the kubelet retry it after a back-off.
func (s *Server) reportLost(handle string, why func(st *staged) string) {
	dir := s.volumeDir(handle)
	if reason, _ := lostReason(dir, why); reason == "" {
		return
	}
	release, ok := s.busy.TryAcquire(handle)
	if !ok {
		return
	}
	defer release()
	reason, st := lostReason(dir, why)
	if reason == "" {
		return
	}
	s.eventf(st, corev1.EventTypeWarning, ReasonStagingLost,
		"The staging pod %s of volume %s on node %s %s: the volume is no longer served on that node. Pods using it keep what they have; a pod that mounts it there next gets it staged again",
		st.StagingPod, st.Handle, s.NodeID, reason)
	st.LostReported = st.StagingPod.UID
	if err := writeState(dir, st); err != nil {
		klog.ErrorS(err, "Cannot record that the loss of the staging was reported", "handle", handle)
	}
}

// lostReason reads a volume's state and says why its KeepRunning staging pod
// no longer keeps it available, if it is staged, that was not reported yet for
// this pod, and why(st) says so; else "".
func lostReason(dir string, why func(st *staged) string) (string, *staged) {
	st, err := readState(dir)
	if err != nil || st == nil || !st.Staged || !st.KeepRunning || st.StagingPod == nil || st.StagingPod.UID == "" ||
		st.LostReported == st.StagingPod.UID {
		return "", nil
	}
	return why(st), st
}

// healthOf is NodeGetVolumeStats' and NodeGetVolumeHealth's view of a
// volume: "" when its staging holds on this node, else why not.
func (s *Server) healthOf(ctx context.Context, handle string) (string, error) {
	dir := s.volumeDir(handle)
	st, err := readState(dir)
	switch {
	case err != nil:
		return "", err
	case st == nil:
		return fmt.Sprintf("volume %s is not staged on node %s", handle, s.NodeID), nil
	case !st.Staged:
		return fmt.Sprintf("volume %s is being staged or unstaged on node %s", handle, s.NodeID), nil
	}
	why, err := s.verify(dir, st)
	if why != "" {
		klog.FromContext(ctx).V(2).Info("Volume staging no longer holds", "handle", handle, "reason", why)
		why = fmt.Sprintf("the staging of volume %s on node %s no longer holds: %s; a pod that mounts it there next gets it staged again", handle, s.NodeID, why)
	}
	return why, err
}
