// Package managerapi is the part of the Kubernetes API that pav-manager uses
// besides package kube's: the objects it applies (CSIDrivers, StatefulSets,
// DaemonSets), on client-go's generic typed client with a scheme of apps/v1
// and storage/v1 only.
//
// It was written to keep the manager off client-go's clientset, whose import
// of k8s.io/client-go/kubernetes/scheme registers every API group's types when
// the program starts (see package kube), some 10 MiB of RSS. The manager's
// leader election is now client-go's (through csi-lib-utils), which takes the
// clientset, so the manager links it again (its RSS target is 64 MiB, the
// drivers' 40); this package stays the manager's view of what it applies. The
// driver's binary does not import this package.
package managerapi

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/pods-as-volumes/pav/internal/kube"
)

// Interface is the manager's view of these resources. client-go's typed
// clients satisfy each resource's interface, so that the fake clientset
// serves tests.
type Interface interface {
	CSIDrivers() Applied[*storagev1.CSIDriver, *storagev1.CSIDriverList]
	StatefulSets(namespace string) Applied[*appsv1.StatefulSet, *appsv1.StatefulSetList]
	DaemonSets(namespace string) Applied[*appsv1.DaemonSet, *appsv1.DaemonSetList]
	// Services and Secrets: a provisioner's csi-snapshot-metadata sidecar's
	// Service and TLS Secret (spec.snapshotMetadata).
	Services(namespace string) Applied[*corev1.Service, *corev1.ServiceList]
	Secrets(namespace string) Readable[*corev1.Secret, *corev1.SecretList]
}

// Readable is Applied that also reads one object by name (the manager reads
// a Secret its cache does not hold yet before it makes a new one).
type Readable[T runtime.Object, L runtime.Object] interface {
	Applied[T, L]
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
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
	utilruntime.Must(corev1.AddToScheme(Scheme))
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
	if c.core, err = kube.NewRESTClient(cfg, httpClient, "/api", corev1.SchemeGroupVersion, Scheme, codecs); err != nil {
		return nil, err
	}
	return c, nil
}

type client struct {
	apps, storage, core *rest.RESTClient
}

func (c *client) Services(namespace string) Applied[*corev1.Service, *corev1.ServiceList] {
	return kube.Typed(c.core, parameterCodec, "services", namespace,
		func() *corev1.Service { return &corev1.Service{} },
		func() *corev1.ServiceList { return &corev1.ServiceList{} })
}

func (c *client) Secrets(namespace string) Readable[*corev1.Secret, *corev1.SecretList] {
	return kube.Typed(c.core, parameterCodec, "secrets", namespace,
		func() *corev1.Secret { return &corev1.Secret{} },
		func() *corev1.SecretList { return &corev1.SecretList{} })
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
