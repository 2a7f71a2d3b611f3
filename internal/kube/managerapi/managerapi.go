// Package managerapi is the part of the Kubernetes API that pav-manager uses
// besides package kube's: the objects it applies (CSIDrivers, StatefulSets,
// DaemonSets) and its leader election Lease, on client-go's generic typed
// client with a scheme of apps/v1, storage/v1 and coordination/v1 only.
//
// Why not client-go's clientset, apply configurations and leader election:
// each of them imports k8s.io/client-go/kubernetes/scheme, which registers
// every API group's types when the program starts (see package kube); that
// held some 10 MiB of the manager's RSS. The driver's binary does not import
// this package, so that it holds no API group it does not use.
package managerapi

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/lease"
)

// Interface is the manager's view of these resources. client-go's typed
// clients satisfy each resource's interface, so that the fake clientset
// serves tests.
type Interface interface {
	CSIDrivers() Applied[*storagev1.CSIDriver, *storagev1.CSIDriverList]
	StatefulSets(namespace string) Applied[*appsv1.StatefulSet, *appsv1.StatefulSetList]
	DaemonSets(namespace string) Applied[*appsv1.DaemonSet, *appsv1.DaemonSetList]
	Leases(namespace string) lease.Client
}

// Applied is the methods of the typed client of a resource the manager
// applies (server-side apply is a Patch of type types.ApplyPatchType) and
// watches.
type Applied[T runtime.Object, L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// Scheme knows the types of this package's Interface.
var Scheme = runtime.NewScheme()

var (
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

func init() {
	utilruntime.Must(appsv1.AddToScheme(Scheme))
	utilruntime.Must(storagev1.AddToScheme(Scheme))
	utilruntime.Must(coordinationv1.AddToScheme(Scheme))
}

// NewForConfig returns the Interface served by the API server of cfg, with
// cfg's rate limiter (kubeconfig.Load makes it one per process).
func NewForConfig(cfg *rest.Config) (Interface, error) {
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	c := &client{}
	if c.apps, err = kube.NewRESTClient(cfg, httpClient, "/apis", appsv1.SchemeGroupVersion, Scheme, codecs); err != nil {
		return nil, err
	}
	if c.storage, err = kube.NewRESTClient(cfg, httpClient, "/apis", storagev1.SchemeGroupVersion, Scheme, codecs); err != nil {
		return nil, err
	}
	if c.coordination, err = kube.NewRESTClient(cfg, httpClient, "/apis", coordinationv1.SchemeGroupVersion, Scheme, codecs); err != nil {
		return nil, err
	}
	return c, nil
}

type client struct {
	apps, storage, coordination *rest.RESTClient
}

func (c *client) CSIDrivers() Applied[*storagev1.CSIDriver, *storagev1.CSIDriverList] {
	return kube.Typed(c.storage, parameterCodec, "csidrivers", "",
		func() *storagev1.CSIDriver { return &storagev1.CSIDriver{} },
		func() *storagev1.CSIDriverList { return &storagev1.CSIDriverList{} })
}

func (c *client) StatefulSets(namespace string) Applied[*appsv1.StatefulSet, *appsv1.StatefulSetList] {
	return kube.Typed(c.apps, parameterCodec, "statefulsets", namespace,
		func() *appsv1.StatefulSet { return &appsv1.StatefulSet{} },
		func() *appsv1.StatefulSetList { return &appsv1.StatefulSetList{} })
}

func (c *client) DaemonSets(namespace string) Applied[*appsv1.DaemonSet, *appsv1.DaemonSetList] {
	return kube.Typed(c.apps, parameterCodec, "daemonsets", namespace,
		func() *appsv1.DaemonSet { return &appsv1.DaemonSet{} },
		func() *appsv1.DaemonSetList { return &appsv1.DaemonSetList{} })
}

func (c *client) Leases(namespace string) lease.Client {
	return kube.Typed(c.coordination, parameterCodec, "leases", namespace,
		func() *coordinationv1.Lease { return &coordinationv1.Lease{} },
		func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} })
}
