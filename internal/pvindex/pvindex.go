// Package pvindex finds a driver's PersistentVolumes by volume handle:
// DeleteVolume, ValidateVolumeCapabilities and NodeStageVolume only know the
// handle.
package pvindex

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Lookup finds a PV by volume handle (Index; a fixed list in tests). It returns
// nil, nil when there is none.
type Lookup interface {
	ByHandle(handle string) (*corev1.PersistentVolume, error)
}

const handleIndex = "pav.handle"

// Index finds this driver's PersistentVolumes by volume handle from an informer
// cache: listing every PV per call does not scale.
type Index struct {
	driver   string
	informer cache.SharedIndexInformer
}

// New indexes the PVs whose spec.csi.driver is driver.
func New(client kubernetes.Interface, driver string) *Index {
	f := informers.NewSharedInformerFactory(client, 10*time.Minute)
	inf := f.Core().V1().PersistentVolumes().Informer()
	_ = inf.AddIndexers(cache.Indexers{handleIndex: func(obj any) ([]string, error) {
		pv, ok := obj.(*corev1.PersistentVolume)
		if !ok || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver {
			return nil, nil
		}
		return []string{pv.Spec.CSI.VolumeHandle}, nil
	}})
	// Templates only see the spec and metadata that matter; dropping managedFields
	// halves the cache's memory.
	_ = inf.SetTransform(func(obj any) (any, error) {
		if pv, ok := obj.(*corev1.PersistentVolume); ok {
			pv.ManagedFields = nil
		}
		return obj, nil
	})
	return &Index{driver: driver, informer: inf}
}

// Start runs the informer until ctx ends and waits for the first sync.
func (x *Index) Start(ctx context.Context) error {
	go x.informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), x.informer.HasSynced) {
		return fmt.Errorf("PersistentVolume informer did not sync")
	}
	return nil
}

// ByHandle returns the PV of a handle, or nil when there is none. Two PVs with one
// handle (a static PV copied by hand) is an error: pav cannot tell which is meant.
func (x *Index) ByHandle(handle string) (*corev1.PersistentVolume, error) {
	objs, err := x.informer.GetIndexer().ByIndex(handleIndex, handle)
	if err != nil {
		return nil, err
	}
	switch len(objs) {
	case 0:
		return nil, nil
	case 1:
		return objs[0].(*corev1.PersistentVolume).DeepCopy(), nil
	}
	return nil, fmt.Errorf("%d PersistentVolumes of driver %s have volume handle %q; a handle must be unique", len(objs), x.driver, handle)
}
