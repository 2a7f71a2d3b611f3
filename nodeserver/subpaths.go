package nodeserver

// SubPath mounts the kubelet cannot clean up.
//
// For a container's volumeMount with a subPath, the kubelet bind-mounts the
// subPath's directory of the volume at
// <kubelet root>/pods/<pod UID>/volume-subpaths/<volume>/<container>/<index>.
// When the pod goes, it cleans these up before it unpublishes the volume: it
// stat()s each, unmounts it if it is a mount point, and removes the
// directories. If a container deleted the subPath's directory meanwhile, a
// kernel file system still answers that stat (the mount holds the directory,
// with no links), but a FUSE server need not: gocryptfs (go-fuse), for one,
// answers ENOENT for a node that was removed. The kubelet takes ENOENT for "no
// mount there" (it unmounts a broken mount only on ESTALE, EIO, ENOTCONN and
// the like), leaves the mount, fails to remove its directory ("directory not
// empty") and retries forever: the pod stays Terminating, its volume stays
// published and staged (kubernetes/kubernetes#139535, open; the External
// Storage suite's "subPath should be able to unmount after the subpath
// directory is deleted" fails so on examples/encrypted-fs).
//
// So the node plugin unmounts such a mount itself, which is what the kubelet
// would have done with any other answer, when all of these hold:
//   - it is a mount under a pod's volume-subpaths directory, of the same file
//     system (device) as a pav volume that this node plugin published for the
//     same pod (pods/<UID>/volumes/kubernetes.io~csi/<PV>/mount, the PV one of
//     its stagings);
//   - stat of the mount point says ENOENT, which no mounted directory of a
//     kernel file system says;
//   - the pod is gone from the API, or being deleted with none of its
//     containers running: the kubelet is tearing it down. (A running
//     container keeps its own copy of the mount in its mount namespace
//     whatever happens to this one; a container restart would need the
//     directory anyway.)
//
// The look reads only the node's mount table and state directory, and asks
// the API about the pod only when it finds such a mount.

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/hostmount"
)

// ReasonStaleSubPathReleased is the event of a subPath mount the node plugin
// unmounted for the kubelet.
const ReasonStaleSubPathReleased = "StaleSubPathUnmounted"

// staleSubPath is a subPath mount of a pav volume whose directory is gone.
type staleSubPath struct {
	path   string
	podUID types.UID
	st     *staged // the staging of the volume it is of
}

// kubeletPodPath splits a path under the kubelet's pods directory into the
// pod's UID and the rest: "/var/lib/kubelet/pods/UID/rest" → UID, "rest".
// The kubelet's root is whatever precedes the last "/pods/" element.
func kubeletPodPath(p string) (uid types.UID, rest []string, ok bool) {
	i := strings.LastIndex(p, "/pods/")
	if i < 0 {
		return "", nil, false
	}
	elems := strings.Split(p[i+len("/pods/"):], "/")
	if len(elems) < 2 || elems[0] == "" {
		return "", nil, false
	}
	return types.UID(elems[0]), elems[1:], true
}

// findStaleSubPaths lists the subPath mounts, among mounts, of the pav volumes
// published for the same pod (a publication of a PV in byPV) whose mount
// point stat says ENOENT.
func findStaleSubPaths(mounts []hostmount.Mount, byPV map[string]*staged, stat func(string) error) []staleSubPath {
	// pod UID → device → the staging published there
	published := map[types.UID]map[string]*staged{}
	for _, m := range mounts {
		uid, rest, ok := kubeletPodPath(m.Path)
		if !ok || len(rest) != 4 || rest[0] != "volumes" || rest[1] != "kubernetes.io~csi" || rest[3] != "mount" {
			continue
		}
		if st := byPV[rest[2]]; st != nil {
			if published[uid] == nil {
				published[uid] = map[string]*staged{}
			}
			published[uid][m.Dev] = st
		}
	}
	var out []staleSubPath
	for _, m := range mounts {
		uid, rest, ok := kubeletPodPath(m.Path)
		if !ok || len(rest) != 4 || rest[0] != "volume-subpaths" {
			continue
		}
		st := published[uid][m.Dev]
		if st == nil {
			continue
		}
		if err := stat(m.Path); errors.Is(err, fs.ErrNotExist) {
			out = append(out, staleSubPath{path: m.Path, podUID: uid, st: st})
		}
	}
	return out
}

// tornDown says whether the kubelet is tearing the pod down: it is being
// deleted and none of its containers runs.
func tornDown(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp == nil {
		return false
	}
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for _, c := range statuses {
			if c.State.Running != nil {
				return false
			}
		}
	}
	return true
}

// ReleaseStaleSubPaths unmounts the subPath mounts of pav volumes that the
// kubelet cannot clean up (see the file comment). A failure is logged and
// the mount looked at again at the next check.
func (s *Server) ReleaseStaleSubPaths(ctx context.Context) {
	if s.Client == nil {
		return
	}
	byPV := map[string]*staged{}
	s.eachState("subPath mounts", func(_ string, st *staged) {
		if st.PV != "" {
			byPV[st.PV] = st
		}
	})
	if len(byPV) == 0 {
		return
	}
	mounts, err := s.mounts()
	if err != nil {
		klog.ErrorS(err, "Cannot read the mount table to look for subPath mounts the kubelet cannot clean up")
		return
	}
	stale := findStaleSubPaths(mounts, byPV, s.statOnce)
	if len(stale) == 0 {
		return
	}
	// A pod using a claim is in the claim's namespace.
	byUID := map[types.UID]*corev1.Pod{}
	listed := map[string]error{}
	list := func(ns string) error {
		if err, ok := listed[ns]; ok {
			return err
		}
		pods, err := s.Client.Pods(ns).List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", s.NodeID).String()})
		if err == nil {
			for i := range pods.Items {
				byUID[pods.Items[i].UID] = &pods.Items[i]
			}
		}
		listed[ns] = err
		return err
	}
	for _, sp := range stale {
		if sp.st.PVCObject == nil {
			continue // no claim recorded (no API when it was staged)
		}
		if err := list(sp.st.PVCObject.Namespace); err != nil {
			klog.ErrorS(err, "Cannot list this node's pods to check a subPath mount whose directory is gone; retrying later", "node", s.NodeID, "path", sp.path)
			continue
		}
		pod := byUID[sp.podUID]
		who := "pod UID " + string(sp.podUID) + " (no longer in the API)"
		if pod != nil {
			if !tornDown(pod) {
				klog.V(2).InfoS("A subPath mount's directory is gone, but its pod is not being torn down: leaving it to the kubelet", "path", sp.path, "pod", klog.KObj(pod))
				continue
			}
			who = "pod " + pod.Namespace + "/" + pod.Name
		}
		if err := s.unmount(sp.path); err != nil {
			klog.ErrorS(err, "Cannot unmount a subPath mount whose directory is gone; retrying later", "path", sp.path)
			continue
		}
		klog.InfoS("Unmounted a subPath mount whose directory was deleted, which the kubelet cannot clean up (kubernetes#139535)", "path", sp.path, "handle", sp.st.Handle, "pv", sp.st.PV)
		s.eventf(sp.st, corev1.EventTypeNormal, ReasonStaleSubPathReleased,
			"The directory of a subPath of volume %s that %s mounted was deleted, and the volume's file system answers ENOENT for it, which the kubelet takes for \"not mounted\" (kubernetes/kubernetes#139535): pav unmounted %s so that the pod can finish terminating",
			sp.st.Handle, who, sp.path)
	}
}

// subPathStatTimeout bounds how long a look waits for a stat of a subPath
// mount: a FUSE server that hangs would hang the stat, and with it the node
// plugin's checks (forgotten stagings too).
const subPathStatTimeout = 5 * time.Second

// statOnce stats path within subPathStatTimeout (boundedStat).
func (s *Server) statOnce(path string) error {
	return s.boundedStat(path, func(p string) error { _, err := os.Stat(p); return err }, subPathStatTimeout)
}

// boundedStat runs stat(path) for at most timeout. One that does not return
// in time is left to finish in the background and counts as no answer (nil);
// path is not stat'ed again until it returns, so that hung stats do not pile
// up.
func (s *Server) boundedStat(path string, stat func(string) error, timeout time.Duration) error {
	if _, busy := s.statting.LoadOrStore(path, true); busy {
		return nil
	}
	done := make(chan error, 1)
	go func() {
		defer s.statting.Delete(path)
		done <- stat(path)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		klog.InfoS("A subPath mount does not answer stat; looking again once it does", "path", path, "after", timeout)
		return nil
	}
}

func (s *Server) mounts() ([]hostmount.Mount, error) {
	if s.Mounts != nil {
		return s.Mounts()
	}
	return hostmount.Mounts()
}

func (s *Server) unmount(path string) error {
	if s.Unmount != nil {
		return s.Unmount(path)
	}
	return hostmount.Unmount(path)
}
