// The populator flow below is adapted from kubernetes-csi/lib-volume-populator
// (populator-machinery/controller.go and example/hello-populator/main.go),
// Copyright 2021 The Kubernetes Authors, licensed under the Apache License,
// Version 2.0 (http://www.apache.org/licenses/LICENSE-2.0). Changes: only the
// populator-pod flow (no provider functions, no cross-namespace data sources,
// no populator metrics); related objects are found through informer indexes
// instead of a notification map; a claim deleted before it was populated is
// cleaned up and let go.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/test/standin"
)

// The data source kind, and the example's paths in the populator pod.
const (
	helloGroup = "hello.example.com"
	helloKind  = "Hello"
	prefix     = "hello.example.com" // of the annotation, the finalizer and the event source
	mountPath  = "/mnt"
	devicePath = "/dev/block"
)

var helloGVR = schema.GroupVersionResource{Group: helloGroup, Version: "v1alpha1", Resource: "hellos"}

// Names, annotations and event reasons, as populator-machinery has them.
const (
	populatorContainerName = "populate"
	populatorPodPrefix     = "populate"
	populatorPodVolumeName = "target"
	populatorPvcPrefix     = "prime"
	populatedFromAnno      = prefix + "/populated-from"
	pvcFinalizer           = prefix + "/populate-target-protection"
	annSelectedNode        = "volume.kubernetes.io/selected-node"
	annMigratedTo          = "pv.kubernetes.io/migrated-to"

	reasonPodCreationError   = "PopulatorCreationError"
	reasonPodCreationSuccess = "PopulatorCreated"
	reasonPodFailed          = "PopulatorFailed"
	reasonPopulatorFinished  = "PopulatorFinished"
	reasonPVCCreationError   = "PopulatorPVCPrimeCreationError"
)

// Informer indexes of claims (the original ones: those with a Hello data source).
const (
	byUID   = "uid"   // every claim, by UID: the prime claim and the pod are named after it
	byHello = "hello" // namespace/name of the Hello
	byClass = "class" // storage class name
)

// controller populates the claims whose data source is a Hello.
type controller struct {
	namespace string // the populator's: prime claims and populator pods live here
	image     string // of the populator pods
	kube      kubernetes.Interface
	recorder  record.EventRecorder

	pvcs    corelisters.PersistentVolumeClaimLister
	pvcIdx  cache.Indexer
	pvs     corelisters.PersistentVolumeLister
	pods    corelisters.PodLister // of the populator's namespace
	classes storagelisters.StorageClassLister
	hellos  cache.GenericLister
	synced  []cache.InformerSynced

	queue workqueue.TypedRateLimitingInterface[string]
}

// newController sets the controller up on the informers of f (cluster-wide),
// nsf (the populator's namespace) and dyn (Hellos); the caller starts them.
func newController(kube kubernetes.Interface, f, nsf informers.SharedInformerFactory, dyn dynamicinformer.DynamicSharedInformerFactory,
	namespace, image string, recorder record.EventRecorder) (*controller, error) {
	pvcInf := f.Core().V1().PersistentVolumeClaims()
	pvInf := f.Core().V1().PersistentVolumes()
	scInf := f.Storage().V1().StorageClasses()
	podInf := nsf.Core().V1().Pods()
	helloInf := dyn.ForResource(helloGVR)
	if err := pvcInf.Informer().AddIndexers(cache.Indexers{byUID: indexUID, byHello: indexHello, byClass: indexClass}); err != nil {
		return nil, err
	}
	c := &controller{
		namespace: namespace,
		image:     image,
		kube:      kube,
		recorder:  recorder,
		pvcs:      pvcInf.Lister(),
		pvcIdx:    pvcInf.Informer().GetIndexer(),
		pvs:       pvInf.Lister(),
		pods:      podInf.Lister(),
		classes:   scInf.Lister(),
		hellos:    helloInf.Lister(),
		synced: []cache.InformerSynced{pvcInf.Informer().HasSynced, pvInf.Informer().HasSynced, scInf.Informer().HasSynced,
			podInf.Informer().HasSynced, helloInf.Informer().HasSynced},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "hello-populator"}),
	}
	handlers := func(h func(any)) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{AddFunc: h, UpdateFunc: func(_, n any) { h(n) }, DeleteFunc: h}
	}
	for _, reg := range []struct {
		inf cache.SharedIndexInformer
		h   func(any)
	}{
		{pvcInf.Informer(), c.onPVC},
		{pvInf.Informer(), c.onPV},
		{podInf.Informer(), c.onPod},
		{scInf.Informer(), c.onClass},
		{helloInf.Informer(), c.onHello},
	} {
		if _, err := reg.inf.AddEventHandler(handlers(reg.h)); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func indexUID(obj any) ([]string, error) {
	if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok {
		return []string{string(pvc.UID)}, nil
	}
	return nil, nil
}

func indexHello(obj any) ([]string, error) {
	if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok {
		if name, ok := helloSource(pvc); ok {
			return []string{pvc.Namespace + "/" + name}, nil
		}
	}
	return nil, nil
}

func indexClass(obj any) ([]string, error) {
	if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok && pvc.Spec.StorageClassName != nil {
		if _, ok := helloSource(pvc); ok {
			return []string{*pvc.Spec.StorageClassName}, nil
		}
	}
	return nil, nil
}

// helloSource returns the name of the Hello that pvc's spec.dataSourceRef names,
// if it names one in pvc's namespace. A data source in another namespace needs
// ReferenceGrants (CrossNamespaceVolumeDataSource), which upstream's example
// does not enable either: such claims are left alone.
func helloSource(pvc *corev1.PersistentVolumeClaim) (string, bool) {
	ref := pvc.Spec.DataSourceRef
	if ref == nil || ref.APIGroup == nil || *ref.APIGroup != helloGroup || ref.Kind != helloKind || ref.Name == "" {
		return "", false
	}
	if ref.Namespace != nil && *ref.Namespace != "" && *ref.Namespace != pvc.Namespace {
		return "", false
	}
	return ref.Name, true
}

// primeName and podName are the names of the prime claim and the populator pod
// of the claim with UID uid; originalUID is the reverse.
func primeName(uid types.UID) string { return populatorPvcPrefix + "-" + string(uid) }
func podName(uid types.UID) string   { return populatorPodPrefix + "-" + string(uid) }

func originalUID(name, prefix string) (types.UID, bool) {
	uid, ok := strings.CutPrefix(name, prefix+"-")
	return types.UID(uid), ok && uid != ""
}

func metaOf(obj any) metav1.Object {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, _ := obj.(metav1.Object)
	return m
}

func (c *controller) enqueue(namespace, name string) { c.queue.Add(namespace + "/" + name) }

// enqueueIndexed queues the claims of index at value.
func (c *controller) enqueueIndexed(index, value string) {
	objs, err := c.pvcIdx.ByIndex(index, value)
	if err != nil {
		klog.ErrorS(err, "Looking up claims", "index", index, "value", value)
		return
	}
	for _, o := range objs {
		if pvc, ok := o.(*corev1.PersistentVolumeClaim); ok {
			c.enqueue(pvc.Namespace, pvc.Name)
		}
	}
}

// enqueueOriginal queues the original claim of a prime claim or pod whose name
// is prefix-<UID>.
func (c *controller) enqueueOriginal(name, prefix string) {
	if uid, ok := originalUID(name, prefix); ok {
		c.enqueueIndexed(byUID, string(uid))
	}
}

func (c *controller) onPVC(obj any) {
	m := metaOf(obj)
	if m == nil {
		return
	}
	if m.GetNamespace() == c.namespace {
		c.enqueueOriginal(m.GetName(), populatorPvcPrefix)
		return
	}
	if pvc, ok := obj.(*corev1.PersistentVolumeClaim); ok {
		if _, ok := helloSource(pvc); !ok {
			return // a data source is immutable: this claim is never ours
		}
	}
	c.enqueue(m.GetNamespace(), m.GetName())
}

func (c *controller) onPV(obj any) {
	pv, ok := obj.(*corev1.PersistentVolume)
	if !ok {
		return // deleted: nothing waits for a PV to go
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		if ref.Namespace == c.namespace {
			c.enqueueOriginal(ref.Name, populatorPvcPrefix)
		} else if _, ok := pv.Annotations[populatedFromAnno]; ok {
			c.enqueue(ref.Namespace, ref.Name)
		}
	}
}

func (c *controller) onPod(obj any) {
	if m := metaOf(obj); m != nil && m.GetNamespace() == c.namespace {
		c.enqueueOriginal(m.GetName(), populatorPodPrefix)
	}
}

func (c *controller) onClass(obj any) {
	if m := metaOf(obj); m != nil {
		c.enqueueIndexed(byClass, m.GetName())
	}
}

func (c *controller) onHello(obj any) {
	if m := metaOf(obj); m != nil {
		c.enqueueIndexed(byHello, m.GetNamespace()+"/"+m.GetName())
	}
}

// run works the queue until ctx ends.
func (c *controller) run(ctx context.Context, workers int) error {
	defer c.queue.ShutDown()
	klog.InfoS("Waiting for the informers' caches", "kind", helloGVR.GroupResource())
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return ctx.Err()
	}
	klog.InfoS("Populator controller started", "kind", helloKind+"."+helloGroup, "namespace", c.namespace, "image", c.image)
	for range workers {
		go func() {
			for c.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
	return nil
}

func (c *controller) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.sync(ctx, key); err != nil {
		klog.ErrorS(err, "Populating failed; retrying with backoff", "pvc", key)
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// sync moves one original claim a step along: prime claim, populator pod, PV
// handed over, clean-up. It only acts on what the informers show, and every
// step is safe to repeat, so a restarted controller picks up where it was.
func (c *controller) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil || ns == c.namespace {
		return nil // our own working namespace holds no claims to populate
	}
	pvc, err := c.pvcs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	source, ok := helloSource(pvc)
	if !ok {
		return nil
	}
	logger := klog.LoggerWithValues(klog.Background(), "pvc", key, "hello", source)

	pod, err := c.pods.Pods(c.namespace).Get(podName(pvc.UID))
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	prime, err := c.pvcs.PersistentVolumeClaims(c.namespace).Get(primeName(pvc.UID))
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}

	if pvc.DeletionTimestamp != nil && pvc.Spec.VolumeName == "" {
		// Deleted before it was populated: nothing will use the volume.
		logger.Info("Claim deleted before it was populated; cleaning up")
		return c.cleanup(ctx, pvc, pod, prime)
	}

	if pvc.Spec.VolumeName == "" {
		// The data source and the class matter until the claim is bound: then
		// only clean-up is left, whatever became of them.
		obj, err := c.hellos.ByNamespace(pvc.Namespace).Get(source)
		if apierrors.IsNotFound(err) {
			logger.V(2).Info("Waiting for the data source")
			return nil // onHello queues the claim when it comes
		}
		if err != nil {
			return err
		}
		hello, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return fmt.Errorf("%s %s/%s: unexpected type %T in the cache", helloKind, pvc.Namespace, source, obj)
		}

		var nodeName string // WaitForFirstConsumer: the node the scheduler selected
		if pvc.Spec.StorageClassName != nil {
			class, err := c.classes.Get(*pvc.Spec.StorageClassName)
			if apierrors.IsNotFound(err) {
				logger.V(2).Info("Waiting for the storage class", "storageClass", *pvc.Spec.StorageClassName)
				return nil // onClass queues the claim when it comes
			}
			if err != nil {
				return err
			}
			if err := checkIntreeStorageClass(pvc, class); err != nil {
				logger.V(2).Info("Ignoring claim", "reason", err.Error())
				return nil
			}
			if class.VolumeBindingMode != nil && *class.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer {
				nodeName = pvc.Annotations[annSelectedNode]
				if nodeName == "" {
					logger.V(2).Info("Waiting for the scheduler to select a node")
					return nil
				}
			}
		}

		if prime == nil {
			prime = primeClaim(pvc, c.namespace, nodeName)
			if prime, err = c.kube.CoreV1().PersistentVolumeClaims(c.namespace).Create(ctx, prime, metav1.CreateOptions{}); err != nil {
				if apierrors.IsAlreadyExists(err) {
					return err // a stale cache: retried once it has the claim
				}
				c.recorder.Eventf(pvc, corev1.EventTypeWarning, reasonPVCCreationError, "Failed to create populator PVC prime: %s", err)
				return err
			}
			logger.Info("Created the prime claim", "prime", c.namespace+"/"+prime.Name, "node", nodeName)
		}
		// The finalizer keeps the claim until what is made for it is cleaned up.
		if err := c.ensureFinalizer(ctx, pvc, true); err != nil {
			return err
		}

		if pod == nil {
			pod, err := populatorPod(pvc, hello, prime.Name, c.namespace, c.image, nodeName)
			if err != nil {
				return err
			}
			if _, err := c.kube.CoreV1().Pods(c.namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				c.recorder.Eventf(pvc, corev1.EventTypeWarning, reasonPodCreationError, "Failed to create populator pod: %s", err)
				return err
			}
			c.recorder.Eventf(pvc, corev1.EventTypeNormal, reasonPodCreationSuccess, "Populator started")
			logger.Info("Started the populator pod", "pod", c.namespace+"/"+pod.Name, "node", pod.Spec.NodeName)
			return nil // onPod queues the claim as the pod goes on
		}
		switch pod.Status.Phase {
		case corev1.PodSucceeded:
		case corev1.PodFailed:
			c.recorder.Eventf(pvc, corev1.EventTypeWarning, reasonPodFailed, "Populator failed: %s", pod.Status.Message)
			logger.Info("The populator pod failed; deleting it to try again", "pod", c.namespace+"/"+pod.Name, "message", pod.Status.Message)
			// Deleted so that the next sync makes a new one.
			if err := c.kube.CoreV1().Pods(c.namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			return nil
		default:
			return nil // onPod queues the claim as the pod goes on
		}

		if prime.Spec.VolumeName == "" {
			return nil // (a stale cache: the pod ran, so the prime claim is bound)
		}
		pv, err := c.pvs.Get(prime.Spec.VolumeName)
		if apierrors.IsNotFound(err) {
			return nil // onPV queues the claim when it comes
		}
		if err != nil {
			return err
		}
		if ref := pv.Spec.ClaimRef; ref == nil || ref.Name != pvc.Name || ref.Namespace != pvc.Namespace || ref.UID != pvc.UID {
			patch, err := claimRefPatch(pv.Name, pvc)
			if err != nil {
				return err
			}
			if _, err := c.kube.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("rebinding PV %s to the claim: %w", pv.Name, err)
			}
			logger.Info("Populated; handed the PV over to the claim", "pv", pv.Name)
			// Clean-up waits for the PV controller to bind the claim and let
			// the prime claim go (Lost).
			return nil
		}
	}

	// Wait for the PV controller to rebind the PV.
	if prime != nil && prime.Status.Phase != corev1.ClaimLost {
		return nil
	}
	if pod == nil && prime == nil && !hasFinalizer(pvc) {
		return nil // populated, and cleaned up
	}
	c.recorder.Eventf(pvc, corev1.EventTypeNormal, reasonPopulatorFinished, "Populator finished")
	logger.Info("Populator finished; cleaning up", "pv", pvc.Spec.VolumeName)
	return c.cleanup(ctx, pvc, pod, prime)
}

// cleanup deletes the populator pod and the prime claim of pvc, if they exist,
// then removes pvc's finalizer.
func (c *controller) cleanup(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pod *corev1.Pod, prime *corev1.PersistentVolumeClaim) error {
	if pod != nil {
		if err := c.kube.CoreV1().Pods(c.namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if prime != nil {
		if err := c.kube.CoreV1().PersistentVolumeClaims(c.namespace).Delete(ctx, prime.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return c.ensureFinalizer(ctx, pvc, false)
}

// checkIntreeStorageClass refuses an in-tree storage class (kubernetes.io/*)
// unless the claim is migrated to CSI: those volumes are not populated.
func checkIntreeStorageClass(pvc *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) error {
	if !strings.HasPrefix(class.Provisioner, "kubernetes.io/") || pvc.Annotations[annMigratedTo] != "" {
		return nil
	}
	return fmt.Errorf("in-tree volume %s is not supported by the populator", class.Provisioner)
}

// primeClaim is the claim the populator provisions and fills in its namespace:
// the original's class, size, access modes and volume mode, on its selected
// node (node: WaitForFirstConsumer).
func primeClaim(pvc *corev1.PersistentVolumeClaim, namespace, node string) *corev1.PersistentVolumeClaim {
	prime := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: primeName(pvc.UID), Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      pvc.Spec.AccessModes,
			Resources:        pvc.Spec.Resources,
			StorageClassName: pvc.Spec.StorageClassName,
			VolumeMode:       pvc.Spec.VolumeMode,
		},
	}
	if node != "" {
		prime.Annotations = map[string]string{annSelectedNode: node}
	}
	return prime
}

// populateArgs are the populator pod's arguments for hello: the example's
// getPopulatorPodArgs.
func populateArgs(rawBlock bool, hello *unstructured.Unstructured) ([]string, error) {
	fileName, _, err := unstructured.NestedString(hello.Object, "spec", "fileName")
	if err != nil {
		return nil, err
	}
	contents, _, err := unstructured.NestedString(hello.Object, "spec", "fileContents")
	if err != nil {
		return nil, err
	}
	if fileName == "" || contents == "" {
		return nil, fmt.Errorf("%s %s/%s: spec.fileName and spec.fileContents are required", helloKind, hello.GetNamespace(), hello.GetName())
	}
	args := []string{"--mode=populate"}
	if rawBlock {
		args = append(args, "--file-name="+devicePath)
	} else {
		args = append(args, "--file-name="+mountPath+"/"+fileName)
	}
	return append(args, "--file-contents="+contents), nil
}

// populatorPod is the pod that fills the prime claim primeName for pvc: this
// image in --mode=populate, the claim mounted at /mnt (a Block claim: the
// device /dev/block), on node if one was selected.
func populatorPod(pvc *corev1.PersistentVolumeClaim, hello *unstructured.Unstructured, primeName, namespace, image, node string) (*corev1.Pod, error) {
	rawBlock := pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock
	args, err := populateArgs(rawBlock, hello)
	if err != nil {
		return nil, err
	}
	con := corev1.Container{
		Name:            populatorContainerName,
		Image:           image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args:            args,
	}
	if rawBlock {
		con.VolumeDevices = []corev1.VolumeDevice{{Name: populatorPodVolumeName, DevicePath: devicePath}}
	} else {
		con.VolumeMounts = []corev1.VolumeMount{{Name: populatorPodVolumeName, MountPath: mountPath}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(pvc.UID), Namespace: namespace},
		Spec: corev1.PodSpec{
			Containers:    []corev1.Container{con},
			RestartPolicy: corev1.RestartPolicyNever,
			NodeName:      node,
			Volumes: []corev1.Volume{{
				Name: populatorPodVolumeName,
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
					ClaimName: primeName,
				}},
			}},
		},
	}, nil
}

// claimRefPatch is the strategic merge patch that hands PV pvName over to pvc:
// spec.claimRef to pvc (namespace, name, UID, resourceVersion) and the
// populated-from annotation, as upstream patches it.
func claimRefPatch(pvName string, pvc *corev1.PersistentVolumeClaim) ([]byte, error) {
	return json.Marshal(corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        pvName,
			Annotations: map[string]string{populatedFromAnno: pvc.Namespace + "/" + pvc.Spec.DataSourceRef.Name},
		},
		Spec: corev1.PersistentVolumeSpec{
			ClaimRef: &corev1.ObjectReference{
				Namespace:       pvc.Namespace,
				Name:            pvc.Name,
				UID:             pvc.UID,
				ResourceVersion: pvc.ResourceVersion,
			},
		},
	})
}

func hasFinalizer(pvc *corev1.PersistentVolumeClaim) bool {
	for _, f := range pvc.Finalizers {
		if f == pvcFinalizer {
			return true
		}
	}
	return false
}

// ensureFinalizer adds (want) or removes the populator's finalizer on pvc with
// a JSON patch that tests the list it changes, as upstream does.
func (c *controller) ensureFinalizer(ctx context.Context, pvc *corev1.PersistentVolumeClaim, want bool) error {
	idx := -1
	for i, f := range pvc.Finalizers {
		if f == pvcFinalizer {
			idx = i
			break
		}
	}
	if (idx >= 0) == want {
		return nil
	}
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value,omitempty"`
	}
	var patch []op
	if want {
		if pvc.Finalizers == nil {
			// No list yet (a claim always has pvc-protection's, but for a
			// moment): test that it is still absent (null), then add it.
			patch = []op{
				{Op: "test", Path: "/metadata/finalizers", Value: json.RawMessage("null")},
				{Op: "add", Path: "/metadata/finalizers", Value: []string{pvcFinalizer}},
			}
		} else {
			patch = []op{
				{Op: "test", Path: "/metadata/finalizers", Value: pvc.Finalizers},
				{Op: "add", Path: "/metadata/finalizers/-", Value: pvcFinalizer},
			}
		}
	} else {
		path := fmt.Sprintf("/metadata/finalizers/%d", idx)
		patch = []op{{Op: "test", Path: path, Value: pvcFinalizer}, {Op: "remove", Path: path}}
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	_, err = c.kube.CoreV1().PersistentVolumeClaims(pvc.Namespace).Patch(ctx, pvc.Name, types.JSONPatchType, data, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) && !want {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s the finalizer %s: %w", map[bool]string{true: "adding", false: "removing"}[want], pvcFinalizer, err)
	}
	return nil
}

// runController runs controller mode until ctx ends.
func runController(ctx context.Context, o *options) error {
	cfg, err := restConfig(o)
	if err != nil {
		return fmt.Errorf("kubernetes client configuration: %w", err)
	}
	cl, err := standin.NewClients(ctx, cfg, prefix+"-populator")
	if err != nil {
		return err
	}
	defer cl.Shutdown()
	kube, dynClient, recorder := cl.Kube, cl.Dynamic, cl.Recorder
	if o.httpEndpoint != "" {
		go standin.ServeHTTP(ctx, o.httpEndpoint, o.metricsPath)
	}

	const resync = 30 * time.Second // upstream's
	f := informers.NewSharedInformerFactory(kube, resync)
	nsf := informers.NewSharedInformerFactoryWithOptions(kube, resync, informers.WithNamespace(o.namespace))
	dyn := dynamicinformer.NewDynamicSharedInformerFactory(dynClient, resync)
	c, err := newController(kube, f, nsf, dyn, o.namespace, o.imageName, recorder)
	if err != nil {
		return err
	}
	klog.InfoS("Starting populator controller", "kind", helloKind+"."+helloGroup, "namespace", o.namespace, "image", o.imageName)
	f.Start(ctx.Done())
	nsf.Start(ctx.Done())
	dyn.Start(ctx.Done())
	defer func() {
		f.Shutdown()
		nsf.Shutdown()
		dyn.Shutdown()
	}()
	err = c.run(ctx, 1)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
