package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Event reasons, as external-resizer records them.
const (
	reasonResizing         = "Resizing"
	reasonResizeFailed     = "VolumeResizeFailed"
	reasonResizeSuccessful = "VolumeResizeSuccessful"
	reasonNodeResize       = "FileSystemResizeRequired"
)

// infeasibleRetry is how long a claim whose expansion the driver refused as
// infeasible waits before the same size is tried again (external-resizer's
// "slow set"); a new size is tried at once.
const infeasibleRetry = 5 * time.Minute

// resizer expands the claims whose PV belongs to driver.
type resizer struct {
	driver   string
	kube     kubernetes.Interface
	csi      csi.ControllerClient
	timeout  time.Duration
	recorder record.EventRecorder
	pvcs     corelisters.PersistentVolumeClaimLister
	pvs      corelisters.PersistentVolumeLister
	classes  storagelisters.StorageClassLister
	queue    workqueue.TypedRateLimitingInterface[string]
	synced   []cache.InformerSynced
}

func newResizer(driver string, kube kubernetes.Interface, client csi.ControllerClient, f informers.SharedInformerFactory,
	recorder record.EventRecorder, timeout time.Duration) *resizer {
	r := &resizer{driver: driver, kube: kube, csi: client, timeout: timeout, recorder: recorder,
		pvcs:    f.Core().V1().PersistentVolumeClaims().Lister(),
		pvs:     f.Core().V1().PersistentVolumes().Lister(),
		classes: f.Storage().V1().StorageClasses().Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "resizer"}),
	}
	pvc := f.Core().V1().PersistentVolumeClaims().Informer()
	pv := f.Core().V1().PersistentVolumes().Informer()
	sc := f.Storage().V1().StorageClasses().Informer()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			r.queue.Add(key)
		}
	}
	pvc.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }})
	// A PV of this driver that changes (bound, grown) may unblock its claim.
	pv.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(_, n any) {
		if v, ok := n.(*corev1.PersistentVolume); ok && r.ours(v) && v.Spec.ClaimRef != nil {
			r.queue.Add(v.Spec.ClaimRef.Namespace + "/" + v.Spec.ClaimRef.Name)
		}
	}})
	r.synced = []cache.InformerSynced{pvc.HasSynced, pv.HasSynced, sc.HasSynced}
	return r
}

func (r *resizer) ours(pv *corev1.PersistentVolume) bool {
	return pv.Spec.CSI != nil && pv.Spec.CSI.Driver == r.driver
}

// run works the queue until ctx ends.
func (r *resizer) run(ctx context.Context, workers int) {
	defer r.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), r.synced...) {
		return
	}
	for range workers {
		go func() {
			for r.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
}

func (r *resizer) next(ctx context.Context) bool {
	key, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(key)
	if err := r.sync(ctx, key); err != nil {
		klog.ErrorS(err, "resize failed; retrying with backoff", "pvc", key)
		r.queue.AddRateLimited(key)
		return true
	}
	r.queue.Forget(key)
	return true
}

// sync expands one claim if it asks for more than it has, following
// Kubernetes' resize protocol with RecoverVolumeExpansionFailure (on since
// 1.34): status.allocatedResources holds the size being made and
// status.allocatedResourceStatuses[storage] where it stands.
func (r *resizer) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pvc, err := r.pvcs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
		return nil
	}
	pv, err := r.pvs.Get(pvc.Spec.VolumeName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !r.ours(pv) || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID {
		return nil
	}
	requested, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return nil
	}
	have := pvc.Status.Capacity[corev1.ResourceStorage]
	if requested.Cmp(have) <= 0 {
		return nil // not an expansion (shrinking is not possible)
	}
	if !r.expansionAllowed(pvc) {
		klog.V(4).InfoS("StorageClass does not allow expansion", "pvc", key)
		return nil
	}
	newSize, act := target(pvc, pv)
	if !act {
		return nil // the kubelet's turn: node expansion is pending or running
	}
	state := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
	allocated, hasAllocated := pvc.Status.AllocatedResources[corev1.ResourceStorage]
	if state == corev1.PersistentVolumeClaimControllerResizeInfeasible && hasAllocated && allocated.Cmp(newSize) == 0 {
		// The driver said this size cannot be made; try it again only now and
		// then (the user may lower the request to recover).
		r.queue.AddAfter(key, infeasibleRetry)
		return nil
	}

	if pvc, err = r.patchStatus(ctx, pvc, func(st *corev1.PersistentVolumeClaimStatus) {
		setStatus(st, corev1.PersistentVolumeClaimControllerResizeInProgress)
		if st.AllocatedResources == nil {
			st.AllocatedResources = corev1.ResourceList{}
		}
		st.AllocatedResources[corev1.ResourceStorage] = newSize
		setCondition(st, corev1.PersistentVolumeClaimResizing, "")
	}); err != nil {
		return fmt.Errorf("marking the claim ControllerResizeInProgress: %w", err)
	}
	r.recorder.Event(pvc, corev1.EventTypeNormal, reasonResizing, "External resizer is resizing volume "+pv.Name)

	got, nodeRequired, err := r.expand(ctx, pv, newSize)
	if err != nil {
		r.recorder.Event(pvc, corev1.EventTypeWarning, reasonResizeFailed, err.Error())
		if final(err) {
			infeasible := isInfeasible(err)
			if _, perr := r.patchStatus(ctx, pvc, func(st *corev1.PersistentVolumeClaimStatus) {
				if infeasible {
					setStatus(st, corev1.PersistentVolumeClaimControllerResizeInfeasible)
				}
				setCondition(st, corev1.PersistentVolumeClaimControllerResizeError, err.Error())
			}); perr != nil {
				return fmt.Errorf("resizing failed in the controller with %v, and recording it failed: %w", err, perr)
			}
		}
		return fmt.Errorf("resize volume %q: %w", pv.Name, err)
	}
	if err := r.growPV(ctx, pv, got); err != nil {
		return fmt.Errorf("updating PV %q capacity: %w", pv.Name, err)
	}
	if nodeRequired {
		if _, err := r.patchStatus(ctx, pvc, func(st *corev1.PersistentVolumeClaimStatus) {
			setStatus(st, corev1.PersistentVolumeClaimNodeResizePending)
			setCondition(st, corev1.PersistentVolumeClaimFileSystemResizePending,
				"Waiting for user to (re-)start a pod to finish file system resize of volume on node.")
		}); err != nil {
			return fmt.Errorf("marking the claim NodeResizePending: %w", err)
		}
		r.recorder.Event(pvc, corev1.EventTypeNormal, reasonNodeResize, "Require file system resize of volume on node")
		return nil
	}
	if _, err := r.patchStatus(ctx, pvc, func(st *corev1.PersistentVolumeClaimStatus) {
		if st.Capacity == nil {
			st.Capacity = corev1.ResourceList{}
		}
		st.Capacity[corev1.ResourceStorage] = got
		delete(st.AllocatedResourceStatuses, corev1.ResourceStorage)
		if len(st.AllocatedResourceStatuses) == 0 {
			st.AllocatedResourceStatuses = nil
		}
		setCondition(st, "", "")
	}); err != nil {
		return fmt.Errorf("marking the resize finished: %w", err)
	}
	r.recorder.Event(pvc, corev1.EventTypeNormal, reasonResizeSuccessful, "Resize volume succeeded")
	return nil
}

// target is the size to expand to, and whether the controller has work: as
// external-resizer's expandAndRecover, an expansion in flight finishes at its
// recorded size (allocatedResources) before a newer request is taken up, and a
// volume already grown whose node expansion is pending is the kubelet's.
func target(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) (resource.Quantity, bool) {
	requested := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	pvSize := pv.Spec.Capacity[corev1.ResourceStorage]
	state := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
	allocated, hasAllocated := pvc.Status.AllocatedResources[corev1.ResourceStorage]
	nodeSide := state == corev1.PersistentVolumeClaimNodeResizePending || state == corev1.PersistentVolumeClaimNodeResizeInProgress
	if pvSize.Cmp(requested) < 0 {
		switch {
		case nodeSide && hasAllocated:
			// Let the node finish the size it was given first.
			return allocated, pvSize.Cmp(allocated) < 0
		case state == corev1.PersistentVolumeClaimControllerResizeInProgress && hasAllocated:
			// A call that may still be in flight: repeat it (idempotent).
			return allocated, true
		default:
			return requested, true
		}
	}
	// The PV is already big enough: only records may be missing.
	if nodeSide {
		return requested, false
	}
	if hasAllocated {
		return allocated, true
	}
	return requested, true
}

func (r *resizer) expansionAllowed(pvc *corev1.PersistentVolumeClaim) bool {
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName == "" {
		return false
	}
	sc, err := r.classes.Get(*pvc.Spec.StorageClassName)
	return err == nil && sc.AllowVolumeExpansion != nil && *sc.AllowVolumeExpansion
}

// expand calls ControllerExpandVolume; the size made is the driver's answer,
// or the size asked for when it answers none.
func (r *resizer) expand(ctx context.Context, pv *corev1.PersistentVolume, size resource.Quantity) (resource.Quantity, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	req := &csi.ControllerExpandVolumeRequest{
		VolumeId:         pv.Spec.CSI.VolumeHandle,
		CapacityRange:    &csi.CapacityRange{RequiredBytes: size.Value()},
		VolumeCapability: capability(pv),
	}
	resp, err := r.csi.ControllerExpandVolume(ctx, req)
	if err != nil {
		return size, false, err
	}
	got := size
	if resp.CapacityBytes > size.Value() {
		got = *resource.NewQuantity(resp.CapacityBytes, resource.BinarySI)
	}
	return got, resp.NodeExpansionRequired, nil
}

// capability is the PV's as a CSI VolumeCapability (external-resizer sends it).
func capability(pv *corev1.PersistentVolume) *csi.VolumeCapability {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	for _, m := range pv.Spec.AccessModes {
		switch m {
		case corev1.ReadWriteMany:
			c.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		case corev1.ReadOnlyMany:
			if c.AccessMode.Mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER {
				c.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
			}
		case corev1.ReadWriteOncePod:
			c.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		}
	}
	if pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: pv.Spec.CSI.FSType, MountFlags: pv.Spec.MountOptions}}
	}
	return c
}

// growPV records the new size on the PV (never shrinks it).
func (r *resizer) growPV(ctx context.Context, pv *corev1.PersistentVolume, size resource.Quantity) error {
	if cur := pv.Spec.Capacity[corev1.ResourceStorage]; cur.Cmp(size) >= 0 {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"capacity": map[string]any{"storage": size.String()}}})
	if err != nil {
		return err
	}
	_, err = r.kube.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// patchStatus applies change to a copy of the claim's status and patches the
// status subresource with the fields it touches, guarded by the resource
// version read (a concurrent change makes it fail, and the claim is retried).
func (r *resizer) patchStatus(ctx context.Context, pvc *corev1.PersistentVolumeClaim, change func(*corev1.PersistentVolumeClaimStatus)) (*corev1.PersistentVolumeClaim, error) {
	st := pvc.Status.DeepCopy()
	change(st)
	var statuses any // null removes the map
	if st.AllocatedResourceStatuses != nil {
		statuses = st.AllocatedResourceStatuses
	} else if pvc.Status.AllocatedResourceStatuses != nil {
		m := map[string]any{}
		for k := range pvc.Status.AllocatedResourceStatuses {
			m[string(k)] = nil
		}
		statuses = m
	}
	body := map[string]any{
		"metadata": map[string]any{"resourceVersion": pvc.ResourceVersion},
		"status": map[string]any{
			"capacity":                  st.Capacity,
			"allocatedResources":        st.AllocatedResources,
			"allocatedResourceStatuses": statuses,
			"conditions":                st.Conditions,
		},
	}
	patch, err := json.Marshal(body)
	if err != nil {
		return pvc, err
	}
	out, err := r.kube.CoreV1().PersistentVolumeClaims(pvc.Namespace).Patch(ctx, pvc.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return pvc, err
	}
	return out, nil
}

// resizeConditions are the claim conditions the resize protocol owns.
var resizeConditions = []corev1.PersistentVolumeClaimConditionType{
	corev1.PersistentVolumeClaimResizing,
	corev1.PersistentVolumeClaimFileSystemResizePending,
	corev1.PersistentVolumeClaimControllerResizeError,
}

// setCondition replaces the resize conditions by one of type t ("": none),
// keeping the others.
func setCondition(st *corev1.PersistentVolumeClaimStatus, t corev1.PersistentVolumeClaimConditionType, msg string) {
	var out []corev1.PersistentVolumeClaimCondition
	for _, c := range st.Conditions {
		owned := false
		for _, r := range resizeConditions {
			owned = owned || c.Type == r
		}
		if !owned {
			out = append(out, c)
		}
	}
	if t != "" {
		out = append(out, corev1.PersistentVolumeClaimCondition{Type: t, Status: corev1.ConditionTrue,
			LastTransitionTime: metav1.Now(), Message: msg})
	}
	st.Conditions = out
}

func setStatus(st *corev1.PersistentVolumeClaimStatus, s corev1.ClaimResourceStatus) {
	if st.AllocatedResourceStatuses == nil {
		st.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{}
	}
	st.AllocatedResourceStatuses[corev1.ResourceStorage] = s
}

// final reports whether the driver is known to have stopped working on the
// call (csi-lib-utils' IsFinalError): everything but time-outs and the codes
// that mean "not yet".
func final(err error) bool {
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
		return false
	}
	return true
}

// isInfeasible: codes by which the driver says the size cannot be made at all
// (external-resizer's IsInfeasibleError).
func isInfeasible(err error) bool {
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.InvalidArgument, codes.OutOfRange, codes.NotFound:
		return true
	}
	return false
}
