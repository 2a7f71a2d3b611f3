// Package recordstest serves PavVolumes from a fake dynamic client with the
// write semantics of a real API server that pav's records rely on, which
// k8s.io/client-go/dynamic/fake leaves out: create sets a UID, a
// creationTimestamp and a resourceVersion; update refuses a stale
// resourceVersion (Conflict) and bumps it; delete honours a UID precondition.
package recordstest

import (
	"fmt"
	"strconv"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/uuid"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// ListKinds are the list kinds the fake dynamic client must know for pav's
// resources (PavProvisioner and PavVolume).
var ListKinds = map[schema.GroupVersionResource]string{
	v1alpha1.GroupVersionResource:              v1alpha1.Kind + "List",
	v1alpha1.VolumeGroupVersionResource:        v1alpha1.VolumeKind + "List",
	v1alpha1.SnapshotGroupVersionResource:      v1alpha1.SnapshotKind + "List",
	v1alpha1.GroupSnapshotGroupVersionResource: v1alpha1.GroupSnapshotKind + "List",
}

// NewClient returns a fake dynamic client holding objects (unstructured),
// with API server semantics for PavVolume writes.
func NewClient(objects ...runtime.Object) *dynamicfake.FakeDynamicClient {
	c := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), ListKinds, objects...)
	Install(c)
	return c
}

// Install adds the PavVolume, PavSnapshot and PavGroupSnapshot write semantics to an existing fake client.
func Install(c *dynamicfake.FakeDynamicClient) {
	var mu sync.Mutex
	rv := int64(1000)
	next := func() string {
		mu.Lock()
		defer mu.Unlock()
		rv++
		return strconv.FormatInt(rv, 10)
	}
	for _, gvr := range []schema.GroupVersionResource{v1alpha1.VolumeGroupVersionResource, v1alpha1.SnapshotGroupVersionResource, v1alpha1.GroupSnapshotGroupVersionResource} {
		install(c, gvr, next)
	}
}

func install(c *dynamicfake.FakeDynamicClient, gvr schema.GroupVersionResource, next func() string) {
	stored := func(name string) (*unstructured.Unstructured, error) {
		obj, err := c.Tracker().Get(gvr, "", name)
		if err != nil {
			return nil, err
		}
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return nil, fmt.Errorf("stored %T", obj)
		}
		return u, nil
	}
	c.PrependReactor("create", gvr.Resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		u, ok := a.(k8stesting.CreateAction).GetObject().(*unstructured.Unstructured)
		if !ok || a.GetSubresource() != "" {
			return false, nil, nil
		}
		if u.GetName() == "" {
			return true, nil, apierrors.NewBadRequest("metadata.name is required")
		}
		u.SetUID(uuid.NewUUID())
		u.SetCreationTimestamp(metav1.Now())
		u.SetResourceVersion(next())
		return false, nil, nil // the tracker stores it and returns it
	})
	c.PrependReactor("update", gvr.Resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		u, ok := a.(k8stesting.UpdateAction).GetObject().(*unstructured.Unstructured)
		if !ok {
			return false, nil, nil
		}
		old, err := stored(u.GetName())
		if err != nil {
			return true, nil, err
		}
		if u.GetResourceVersion() != old.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), u.GetName(),
				fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again (resourceVersion %s, stored %s)",
					u.GetResourceVersion(), old.GetResourceVersion()))
		}
		u.SetUID(old.GetUID())
		u.SetCreationTimestamp(old.GetCreationTimestamp())
		u.SetResourceVersion(next())
		return false, nil, nil
	})
	c.PrependReactor("delete", gvr.Resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
		da := a.(k8stesting.DeleteAction)
		pre := da.GetDeleteOptions().Preconditions
		if pre == nil || pre.UID == nil {
			return false, nil, nil
		}
		old, err := stored(da.GetName())
		if err != nil {
			return true, nil, err
		}
		if old.GetUID() != *pre.UID {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), da.GetName(),
				fmt.Errorf("the UID in the precondition (%s) does not match the UID in record (%s)", *pre.UID, old.GetUID()))
		}
		return false, nil, nil
	})
}

// Writes counts the PavVolume writes (create, update, delete) the client has
// seen.
func Writes(c *dynamicfake.FakeDynamicClient) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetResource() == v1alpha1.VolumeGroupVersionResource {
			switch a.GetVerb() {
			case "create", "update", "delete", "patch":
				n++
			}
		}
	}
	return n
}
