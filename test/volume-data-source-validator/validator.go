// The validation below is adapted from kubernetes-csi/volume-data-source-validator
// (pkg/data-source-validator/data_source_validator.go), Copyright 2021 The
// Kubernetes Authors, licensed under the Apache License, Version 2.0
// (http://www.apache.org/licenses/LICENSE-2.0). Changes: VolumePopulators are
// read with a dynamic informer rather than a generated client, and the data
// source is spec.dataSourceRef (spec.dataSource when it is not set).

package main

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// populatorGVR is the cluster-scoped VolumePopulator resource.
var populatorGVR = schema.GroupVersionResource{Group: "populator.storage.k8s.io", Version: "v1beta1", Resource: "volumepopulators"}

// The event upstream records on a claim whose data source no populator handles.
const (
	reasonUnrecognized  = "UnrecognizedDataSourceKind"
	messageUnrecognized = "The data source for this PVC does not match any registered VolumePopulator"
)

// volumeSnapshotGK is allowed as a special case, as upstream does: the core
// restores snapshots itself (as it clones PVCs, a core kind).
var volumeSnapshotGK = schema.GroupKind{Group: "snapshot.storage.k8s.io", Kind: "VolumeSnapshot"}

// validator warns about claims whose data source no VolumePopulator registers.
type validator struct {
	recorder   record.EventRecorder
	pvcs       corelisters.PersistentVolumeClaimLister
	populators cache.GenericLister
	synced     []cache.InformerSynced
	queue      workqueue.TypedRateLimitingInterface[string]
}

// newValidator sets the validator up on the informers of f and dyn; the caller
// starts them.
func newValidator(f informers.SharedInformerFactory, dyn dynamicinformer.DynamicSharedInformerFactory, recorder record.EventRecorder) (*validator, error) {
	pvcInf := f.Core().V1().PersistentVolumeClaims()
	popInf := dyn.ForResource(populatorGVR)
	v := &validator{
		recorder:   recorder,
		pvcs:       pvcInf.Lister(),
		populators: popInf.Lister(),
		synced:     []cache.InformerSynced{pvcInf.Informer().HasSynced, popInf.Informer().HasSynced},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "pvc"}),
	}
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			v.queue.Add(key)
		}
	}
	if _, err := pvcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, n any) { enqueue(n) },
	}); err != nil {
		return nil, err
	}
	return v, nil
}

// run works the queue until ctx ends.
func (v *validator) run(ctx context.Context, workers int) {
	defer v.queue.ShutDown()
	klog.InfoS("Waiting for the informers' caches (the VolumePopulator CRD must exist)")
	if !cache.WaitForCacheSync(ctx.Done(), v.synced...) {
		return
	}
	klog.InfoS("Starting data-source-validator controller")
	for range workers {
		go func() {
			for v.next() {
			}
		}()
	}
	<-ctx.Done()
	klog.InfoS("Shutting down data-source-validator controller")
}

func (v *validator) next() bool {
	key, quit := v.queue.Get()
	if quit {
		return false
	}
	defer v.queue.Done(key)
	if err := v.sync(key); err != nil {
		klog.ErrorS(err, "Checking the claim failed; retrying", "pvc", key)
		v.queue.AddRateLimited(key)
		return true
	}
	v.queue.Forget(key)
	return true
}

// sync checks one claim's data source, and records an event if no
// VolumePopulator registers its kind.
func (v *validator) sync(key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pvc, err := v.pvcs.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	gk, ok := dataSourceKind(pvc)
	if !ok {
		return nil
	}
	klog.V(3).InfoS("Claim has a data source", "pvc", key, "kind", gk.String())
	objs, err := v.populators.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("listing VolumePopulators: %w", err)
	}
	if allowed(gk, objs) {
		return nil
	}
	klog.InfoS("No populator matches the claim's data source", "pvc", key, "kind", gk.String())
	v.recorder.Event(pvc, corev1.EventTypeWarning, reasonUnrecognized, messageUnrecognized)
	return nil
}

// dataSourceKind is the group and kind of the claim's data source that a
// populator must register: none for a claim without one, or with a core one
// (a PVC to clone).
func dataSourceKind(pvc *corev1.PersistentVolumeClaim) (schema.GroupKind, bool) {
	var group *string
	var kind string
	switch {
	case pvc.Spec.DataSourceRef != nil:
		group, kind = pvc.Spec.DataSourceRef.APIGroup, pvc.Spec.DataSourceRef.Kind
	case pvc.Spec.DataSource != nil:
		group, kind = pvc.Spec.DataSource.APIGroup, pvc.Spec.DataSource.Kind
	default:
		return schema.GroupKind{}, false
	}
	if group == nil || *group == "" {
		return schema.GroupKind{}, false // a core object
	}
	return schema.GroupKind{Group: *group, Kind: kind}, true
}

// allowed tells whether gk is a VolumeSnapshot or the sourceKind of one of
// the VolumePopulators objs.
func allowed(gk schema.GroupKind, objs []runtime.Object) bool {
	if gk == volumeSnapshotGK {
		return true
	}
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		group, _, _ := unstructured.NestedString(u.Object, "sourceKind", "group")
		kind, _, _ := unstructured.NestedString(u.Object, "sourceKind", "kind")
		if group == gk.Group && kind == gk.Kind {
			klog.V(4).InfoS("Allowing the data source", "kind", gk.String(), "populator", u.GetName())
			return true
		}
	}
	return false
}
