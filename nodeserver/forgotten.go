package nodeserver

// Stagings the kubelet forgot.
//
// The kubelet unstages a volume (NodeUnstageVolume) once no pod on the node
// uses it. If the kubelet restarts during that call, it never asks again: a
// restarted kubelet rebuilds its view of mounted volumes from its pods'
// directories, and a volume whose last pod is gone has none, so its staging is
// in nobody's view and would stay on the node for good (found by the soak: the
// volume's state directory, an unstaging pod that failed when containerd
// restarted, another that succeeded and was never removed). So the node plugin
// finishes such unstagings itself.
//
// A staging is forgotten when all of these hold, checked again under the
// volume's lock just before it is unstaged:
//   - the kubelet made no CSI call for the volume (stage, publish, unstage)
//     for ForgottenGrace, nothing changed its state.json meanwhile, and this
//     plugin has run that long (what came before it is unknown);
//   - no mount on the node names the volume's PV: nothing is published;
//   - no pod on this node, in the API, uses the volume's claim: the kubelet
//     mounts volumes for the pods the API server binds to its node, and a
//     pod's object is only removed once the kubelet has unmounted its
//     volumes (or it was force-deleted, and then its mounts are still seen).
//
// The kubelet's own record, Node status.volumesInUse, does not help: it lists
// only volumes of attachable plugins, and pav's CSIDriver has attachRequired
// false. A NodeStageVolume or NodePublishVolume for the volume makes it used
// again (touch) before it takes the volume: one that comes while the
// unstaging runs is refused with Aborted and retried by the kubelet, and
// stages afresh.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/hostmount"
)

// DefaultForgottenGrace is how long the kubelet must have left a staging
// that no pod uses alone before the node plugin unstages it itself. Between
// the kubelet's NodeStageVolume and NodePublishVolume for a pod lie seconds;
// its retries of a failing NodeUnstageVolume come at most 2 min 2 s apart,
// and one of the node plugin in between does no harm (the same idempotent
// unstaging).
const DefaultForgottenGrace = time.Minute

// ReasonForgottenUnstaged is the event of a staging the node plugin unstaged
// because the kubelet forgot it.
const ReasonForgottenUnstaged = "ForgottenStagingUnstaged"

// touch records that the kubelet used the volume now (NodeStage, NodePublish,
// NodeUnstage), or that the node plugin looked at it and left it.
func (s *Server) touch(handle string) { s.touched.Store(handle, s.now()) }

func (s *Server) now() time.Time {
	if s.Clock != nil {
		return s.Clock()
	}
	return time.Now()
}

// lastUse is the latest of: the volume's last touch, the last change of its
// state.json, and the start of the forgotten-staging checks.
func (s *Server) lastUse(dir, handle string) time.Time {
	last := s.watchedSince
	if t, ok := s.touched.Load(handle); ok && t.(time.Time).After(last) {
		last = t.(time.Time)
	}
	if fi, err := os.Stat(filepath.Join(dir, "state.json")); err == nil && fi.ModTime().After(last) {
		last = fi.ModTime()
	}
	return last
}

// idle says whether the volume's staging was left alone for the grace, and
// is published nowhere on the node (see the file comment): the checks that
// read only this node. mounts is the node's mount table, read once per look.
func (s *Server) idle(dir string, st *staged, mounts func() ([]string, error)) (bool, error) {
	if s.ForgottenGrace <= 0 || s.now().Sub(s.lastUse(dir, st.Handle)) < s.ForgottenGrace {
		return false, nil
	}
	if st.PV == "" || st.PVCObject == nil {
		// Without the PV's and the claim's names, its use cannot be told
		// (no API: csi-sanity).
		return false, nil
	}
	mps, err := mounts()
	return err == nil && len(hostmount.PathsNaming(mps, st.PV)) == 0, err
}

// claimUsed says whether a pod on this node, in the API, uses the volume's
// claim (see the file comment).
func (s *Server) claimUsed(ctx context.Context, st *staged) (string, error) {
	if s.Client == nil {
		return "no API", nil
	}
	claim := st.PVCObject.Namespace + "/" + st.PVCObject.Name
	pods, err := s.Client.Pods(st.PVCObject.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", s.NodeID).String()})
	if err != nil {
		return "", fmt.Errorf("listing the pods on node %s that may use claim %s: %w", s.NodeID, claim, err)
	}
	for i := range pods.Items {
		if slices.Contains(claimsOf(&pods.Items[i]), claim) {
			return "pod " + pods.Items[i].Namespace + "/" + pods.Items[i].Name, nil
		}
	}
	return "", nil
}

// WatchNode runs the node plugin's own checks every interval until ctx is
// done: UnstageForgotten (counting the grace of every staging from now at
// least) and ReleaseStaleSubPaths (subpaths.go). Each reads this node's state
// directory and mount table, and asks the API only about what it found there:
// in a healthy node, never.
func (s *Server) WatchNode(ctx context.Context, interval time.Duration) {
	s.watchedSince = s.now()
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.UnstageForgotten(ctx)
				s.ReleaseStaleSubPaths(ctx)
			}
		}
	}()
}

// UnstageForgotten unstages, as NodeUnstageVolume would, every staging on this
// node that the kubelet forgot (see the file comment). A failure is logged
// and retried a grace later.
func (s *Server) UnstageForgotten(ctx context.Context) {
	if s.ForgottenGrace <= 0 {
		return
	}
	// Read once for all volumes, and only if one was left alone for the grace.
	mounts := sync.OnceValues(hostmount.MountPoints)
	s.eachState("forgotten stagings", func(dir string, st *staged) {
		if ok, err := s.idle(dir, st, mounts); err != nil || !ok {
			return
		}
		if err := s.unstageForgotten(ctx, st.Handle); err != nil {
			klog.ErrorS(err, "Cannot unstage a staging the kubelet forgot yet; retrying later", "handle", st.Handle)
		}
	})
}

// unstageForgotten checks, under the volume's lock, that its staging is still
// forgotten, and unstages it. Whatever it finds, the volume counts as used
// now: it is looked at again a grace later at the soonest.
func (s *Server) unstageForgotten(ctx context.Context, handle string) error {
	release, ok := s.busy.TryAcquire(handle)
	if !ok {
		return nil // a CSI call has it: the kubelet remembered
	}
	defer release()
	unstaged := false
	defer func() {
		if unstaged {
			s.touched.Delete(handle)
		} else {
			s.touch(handle)
		}
	}()
	dir := s.volumeDir(handle)
	st, err := readState(dir)
	if err != nil || st == nil {
		return err
	}
	// Read again: a pod may have been published since.
	if ok, err := s.idle(dir, st, hostmount.MountPoints); err != nil || !ok {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("handle", handle, "pv", st.PV)
	user, err := s.claimUsed(ctx, st)
	if err != nil || user != "" {
		if user != "" {
			logger.V(2).Info("A staging no mount uses is still wanted by a pod on the node: leaving it to the kubelet", "by", user)
		}
		return err
	}
	logger.Info("The kubelet forgot this staging (it restarted while unstaging it, say): unstaging it")
	if err := s.unstageRecorded(ctx, st, dir); err != nil {
		return err
	}
	unstaged = true
	s.eventf(st, corev1.EventTypeNormal, ReasonForgottenUnstaged,
		"Volume %s was staged on node %s, where no pod uses it any more, and the kubelet no longer meant to unstage it (it restarted during the unstaging, say): pav unstaged it",
		handle, s.NodeID)
	return nil
}
