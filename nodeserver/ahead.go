package nodeserver

// Staging ahead of the kubelet.
//
// The kubelet calls NodeStageVolume some 0.3 s after a pod is bound to its
// node: its admission and two volume manager loops (each on a 0.1 s period)
// come first. A staging pod takes about as long as any pod to start, so the
// node plugin starts it when the pod is bound instead: it watches the pods
// bound to its node (field selector spec.nodeName: bounded by the node's pod
// capacity; pav's own phase pods left out) and, for each claim of a Pending
// pod that is bound to a PV of this driver, runs the staging NodeStageVolume
// would. The kubelet's call
// then waits for that staging instead of answering Aborted (the kubelet
// would retry only 0.5 s later), and adopts it: the staging target path is
// the kubelet's from then on, and so is the unstaging.
//
// Only what the kubelet itself stages for the pod is staged ahead, checked as
// the kubelet checks it before its call: the claim is bound to the PV both
// ways (pvc.spec.volumeName, pv.spec.claimRef with the claim's UID), neither
// is being deleted, and the PV's node affinity admits this node. A tenant who
// creates a pod with spec.nodeName reaches nothing more than the kubelet
// would stage for that pod. A PV with a nodeStageSecretRef is left to the
// kubelet (the node plugin reads no secrets; the kubelet's call brings them).
//
// A staging made ahead that the kubelet never adopts (its pod was deleted or
// failed first) is unstaged as soon as no pod on the node that has not ended
// uses its claim, so that a deletion of the volume right after does not meet
// it. If the node plugin was down when the pod went, it is unstaged when the
// plugin starts again, and failing that it is a forgotten staging
// (forgotten.go), unstaged after ForgottenGrace.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/endrelay"
	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/podrunner"
)

// stageAheadTimeout bounds a staging made ahead, as the kubelet's own
// timeout (2 min) bounds its NodeStageVolume: a staging pod still not done
// then is left recorded, and the kubelet's next call adopts it and waits on.
const stageAheadTimeout = 2 * time.Minute

// KubeletStagingPath is the staging target path the kubelet (1.21 and
// later) gives driver's volume handle in NodeStageVolume: a staging made
// ahead records it, so that the kubelet's call finds what it expects (one
// with another path adopts the staging all the same).
func KubeletStagingPath(driver, handle string) string {
	sum := sha256.Sum256([]byte(handle))
	return filepath.Join(endrelay.DefaultKubeletDir, "plugins", "kubernetes.io", "csi", driver, hex.EncodeToString(sum[:]), "globalmount")
}

// claimIndex indexes the pods of the node by the claims they use (podClaims).
const claimIndex = "claim"

// podClaims are the claims of a pod that has not ended: those it may still
// need staged.
func podClaims(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || podrunner.Finished(pod) {
		return nil, nil
	}
	return claimsOf(pod), nil
}

// StageAhead starts the watch of the pods bound to this node and stages their
// volumes ahead of the kubelet (see the file comment), until ctx is done.
func (s *Server) StageAhead(ctx context.Context) error {
	field := fields.OneTermEqualSelector("spec.nodeName", s.NodeID).String()
	// pav's own phase pods (of every provisioner: two or three per volume,
	// each with many status updates) are left to the kubelet: every node
	// plugin of every provisioner of the node would decode them all.
	notPhase := "!" + podrunner.LabelPhase
	inf := kube.NewInformer(s.Client, s.Client.Pods(""), &corev1.Pod{}, 0,
		func(o *metav1.ListOptions) { o.FieldSelector, o.LabelSelector = field, notPhase },
		cache.Indexers{claimIndex: podClaims})
	// The node plugin runs on every node: it keeps of each pod only what it
	// reads.
	if err := inf.SetTransform(trimPod); err != nil {
		return err
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.podSeen(ctx, o) },
		UpdateFunc: func(_, o any) { s.podSeen(ctx, o) },
		DeleteFunc: func(o any) { s.podGone(ctx, o) },
	}); err != nil {
		return err
	}
	s.pods = inf.GetIndexer()
	go inf.RunWithContext(ctx)
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			s.undoUnadopted(ctx)
		}
	}()
	return nil
}

// trimPod keeps of a pod what staging ahead reads: its identity, node, claims
// and phase.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID,
		ResourceVersion: pod.ResourceVersion, DeletionTimestamp: pod.DeletionTimestamp}}
	out.Spec.NodeName = pod.Spec.NodeName
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			out.Spec.Volumes = append(out.Spec.Volumes, corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v.PersistentVolumeClaim.ClaimName}}})
		case v.Ephemeral != nil:
			out.Spec.Volumes = append(out.Spec.Volumes, corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{
				Ephemeral: &corev1.EphemeralVolumeSource{}}})
		}
	}
	out.Status.Phase = pod.Status.Phase
	return out, nil
}

// podSeen stages ahead the volumes of a pod the kubelet is about to start, the
// first time it is seen Pending on this node; a pod that ended lets go of the
// stagings made ahead for it.
func (s *Server) podSeen(ctx context.Context, obj any) {
	pod, ok := kube.Unwrap[*corev1.Pod](obj)
	switch {
	case !ok || pod.Spec.NodeName != s.NodeID:
	case podrunner.Finished(pod):
		s.podGone(ctx, pod)
	case pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodPending:
	default:
		claims := claimsOf(pod)
		if len(claims) == 0 {
			return
		}
		if _, seen := s.aheadPods.LoadOrStore(pod.UID, true); seen {
			return
		}
		for _, c := range claims {
			go func() {
				// A pod that went during the staging may have found
				// nothing to undo yet: its end is looked at again.
				if h := s.stageAheadClaim(ctx, c); h != "" {
					s.undoAhead(ctx, h, c)
				}
			}()
		}
	}
}

// podGone unstages the stagings made ahead for a pod that was deleted or
// ended, unless the kubelet adopted them or another pod uses their claim.
func (s *Server) podGone(ctx context.Context, obj any) {
	pod, ok := kube.Unwrap[*corev1.Pod](obj)
	if !ok {
		return
	}
	s.aheadPods.Delete(pod.UID)
	for _, c := range claimsOf(pod) {
		if h, ok := s.aheadClaims.Load(c); ok {
			go s.undoAhead(ctx, h.(string), c)
		}
	}
}

// stageAheadClaim stages ahead the volume of claim (namespace/name), if the
// kubelet would stage it for a pod on this node (see the file comment), and
// returns its handle if it did, even in part.
func (s *Server) stageAheadClaim(ctx context.Context, claim string) (handle string) {
	logger := klog.FromContext(ctx).WithValues("claim", claim)
	p, err := s.Source.Get(true)
	if err != nil {
		return "" // the kubelet's own call says why
	}
	r, why, err := s.aheadRequest(ctx, p.Name, claim)
	if err != nil {
		logger.V(2).Info("Not staging the claim's volume ahead of the kubelet", "err", err.Error())
		return ""
	}
	if why != "" {
		logger.V(4).Info("Not staging the claim's volume ahead of the kubelet", "why", why)
		return ""
	}
	// Waitable: the kubelet's NodeStageVolume waits for it (Await).
	release, ok := s.busy.TryAcquireWaitable(r.handle)
	if !ok {
		return "" // the kubelet got there first
	}
	defer release()
	dir := s.volumeDir(r.handle)
	if m, err := s.readMarker(r.handle); err != nil || m != nil {
		return ""
	}
	if st, err := readState(dir); err != nil || st != nil {
		return "" // staged already, or something the kubelet's call must finish
	}
	s.aheadClaims.Store(claim, r.handle)
	ctx, cancel := context.WithTimeout(ctx, stageAheadTimeout)
	defer cancel()
	start := time.Now()
	if err := s.stage(ctx, p, r); err != nil {
		// The kubelet's call stages again, or goes on with what is recorded,
		// and reports the error on the pod.
		logger.Info("Staging ahead of the kubelet failed; its NodeStageVolume will retry", "handle", r.handle, "err", err.Error())
		return r.handle
	}
	logger.V(2).Info("Volume staged ahead of the kubelet", "handle", r.handle, "took", time.Since(start))
	return r.handle
}

// aheadRequest is the stageRequest the kubelet's NodeStageVolume would make
// for claim (namespace/name) of a pod on this node, for driver; why says why
// there is none.
func (s *Server) aheadRequest(ctx context.Context, driver, claim string) (r stageRequest, why string, err error) {
	ns, name, _ := strings.Cut(claim, "/")
	pvc, err := s.Client.PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return r, "no such claim", nil
	case err != nil:
		return r, "", err
	case pvc.DeletionTimestamp != nil:
		return r, "the claim is being deleted", nil
	case pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "":
		return r, "the claim is not bound", nil
	case provisionedByOther(pvc, driver):
		// Saves every other provisioner's node plugin a PV read per pod.
		return r, "the claim was provisioned by another provisioner", nil
	}
	pv, err := s.Client.PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return r, "no such PersistentVolume", nil
	case err != nil:
		return r, "", err
	case pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver:
		return r, "not a volume of this driver", nil
	case pv.DeletionTimestamp != nil:
		return r, "the PersistentVolume is being deleted", nil
	case pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID || pv.Spec.ClaimRef.Namespace != ns || pv.Spec.ClaimRef.Name != name:
		return r, "the PersistentVolume is not bound to the claim", nil
	case pv.Spec.CSI.NodeStageSecretRef != nil:
		return r, "its staging takes secrets, which only the kubelet's call brings", nil
	}
	// The staging reads no object again (apibudget.Stage holds for it).
	read := phase.Objects{PV: pv, PVC: pvc}
	if na := pv.Spec.NodeAffinity; na != nil && na.Required != nil {
		if read.Node, err = s.node(ctx); err != nil {
			return r, "", err
		}
		if ok, err := corev1helpers.MatchNodeSelectorTerms(read.Node, na.Required); err != nil || !ok {
			return r, "the PersistentVolume's node affinity does not admit this node", nil
		}
	}
	r = stageRequest{handle: pv.Spec.CSI.VolumeHandle, target: KubeletStagingPath(driver, pv.Spec.CSI.VolumeHandle),
		mode: corev1.PersistentVolumeFilesystem, access: kubeletAccess(pv), volumeContext: pv.Spec.CSI.VolumeAttributes,
		ahead: true, read: read}
	if pv.Spec.VolumeMode != nil {
		r.mode = *pv.Spec.VolumeMode
	}
	r.readOnly = r.access == corev1.ReadOnlyMany
	return r, "", nil
}

// provisionedByOther says whether the PV controller gave the claim to another
// provisioner than driver to provision (a claim bound statically has no such
// annotation).
func provisionedByOther(pvc *corev1.PersistentVolumeClaim, driver string) bool {
	for _, k := range []string{"volume.kubernetes.io/storage-provisioner", "volume.beta.kubernetes.io/storage-provisioner"} {
		if p, ok := pvc.Annotations[k]; ok && p != driver {
			return true
		}
	}
	return false
}

// kubeletAccess is the access mode of the capability the kubelet's
// NodeStageVolume gives a PV (its first access mode; ReadWriteOncePod as
// SINGLE_NODE_WRITER, pav's node plugin not offering SINGLE_NODE_MULTI_WRITER),
// as KubeAccessMode reads it back.
func kubeletAccess(pv *corev1.PersistentVolume) corev1.PersistentVolumeAccessMode {
	if len(pv.Spec.AccessModes) == 0 || pv.Spec.AccessModes[0] == corev1.ReadWriteOncePod {
		return corev1.ReadWriteOnce
	}
	return pv.Spec.AccessModes[0]
}

// undoAhead unstages the staging made ahead of the kubelet for claim, if the
// kubelet did not adopt it and no pod on the node that has not ended uses
// the claim; a staging ahead still under way is waited for first.
func (s *Server) undoAhead(ctx context.Context, handle, claim string) {
	if _, err := s.busy.Await(ctx, handle); err != nil || s.claimWanted(claim) {
		return
	}
	release, ok := s.busy.TryAcquire(handle)
	if !ok {
		return // a CSI call of the kubelet's: it adopts or unstages the volume
	}
	defer release()
	logger := klog.FromContext(ctx).WithValues("handle", handle, "claim", claim)
	if s.claimWanted(claim) {
		return
	}
	dir := s.volumeDir(handle)
	st, err := readState(dir)
	if err != nil || st == nil || !st.Ahead {
		s.aheadClaims.Delete(claim)
		return
	}
	if err := s.unstageRecorded(ctx, st, dir); err != nil {
		logger.Error(err, "Cannot unstage a volume staged ahead for a pod that went before the kubelet staged it; the forgotten-staging check will")
		return
	}
	s.aheadClaims.Delete(claim)
	s.touched.Delete(handle)
	logger.Info("Unstaged a volume staged ahead of the kubelet for a pod that went before the kubelet staged it")
}

// claimWanted says whether a pod on this node that has not ended uses claim
// (or whether that is unknown: no watch of the node's pods).
func (s *Server) claimWanted(claim string) bool {
	if s.pods == nil {
		return true
	}
	users, err := s.pods.ByIndex(claimIndex, claim)
	return err != nil || len(users) > 0
}

// undoUnadopted, once the pods of the node are known, lets go of the stagings
// made ahead that the kubelet has not adopted: those whose pods went while
// the node plugin was down are unstaged, the others are remembered for when
// their pods go.
func (s *Server) undoUnadopted(ctx context.Context) {
	s.eachState("stagings made ahead", func(_ string, st *staged) {
		if !st.Ahead || st.PVCObject == nil {
			return
		}
		claim := st.PVCObject.Namespace + "/" + st.PVCObject.Name
		s.aheadClaims.Store(claim, st.Handle)
		s.undoAhead(ctx, st.Handle, claim)
	})
}
