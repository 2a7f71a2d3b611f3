// Package kube is the part of the Kubernetes API the CSI driver uses: pods,
// PersistentVolumes, PersistentVolumeClaims, Nodes, StorageClasses,
// VolumeAttributesClasses, events
// and the server's version, built on client-go's generic typed client
// (gentype) with a scheme of core/v1 and storage/v1 only.
//
// Why not client-go's clientset: every typed client of it registers the types
// of every API group (k8s.io/client-go/kubernetes/scheme) when the program
// starts. That touches most of the 7.6 MB of k8s.io/api's code and type data,
// which then stays resident in every driver process: a driver built on the
// clientset idled at 45 MiB RSS, built on this package at 31-32 MiB, and a
// cluster runs two driver processes per provisioner and node. The driver's
// binary (cmd/pav-driver) must therefore never import the clientset; a test
// there checks it. Tests adapt client-go's fake clientset to this package's
// Interface with kubetest.
package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/gentype"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// Interface is the driver's view of the API. client-go's typed clients
// satisfy each resource's interface, so that the fake clientset serves tests.
type Interface interface {
	Pods(namespace string) Pods
	PersistentVolumes() Resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList]
	PersistentVolumeClaims(namespace string) Resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList]
	Nodes() Resource[*corev1.Node, *corev1.NodeList]
	StorageClasses() Resource[*storagev1.StorageClass, *storagev1.StorageClassList]
	// VolumeAttributesClasses: the node plugin reads the class a PV names
	// (its parameters are the staging context's mutableParams).
	VolumeAttributesClasses() Resource[*storagev1.VolumeAttributesClass, *storagev1.VolumeAttributesClassList]
	// EventSink is where an event recorder's events go (any namespace).
	EventSink() record.EventSink
	// ServerVersion asks the API server its version: the driver's
	// readiness check that the API answers.
	ServerVersion(ctx context.Context) (*version.Info, error)
}

// Resource is the methods of one resource's typed client that pav calls.
type Resource[T runtime.Object, L runtime.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// Pods is Resource for pods, with their logs.
type Pods interface {
	Resource[*corev1.Pod, *corev1.PodList]
	GetLogs(name string, opts *corev1.PodLogOptions) *rest.Request
	// Patch: the node plugin's relay of a controller-side pod's end
	// (internal/endrelay) annotates the pod.
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Pod, error)
}

// Scheme knows the types of this package's Interface: event recorders need
// it to make references to the objects events are about.
var Scheme = runtime.NewScheme()

var (
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

func init() {
	utilruntime.Must(corev1.AddToScheme(Scheme))
	utilruntime.Must(storagev1.AddToScheme(Scheme))
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
}

// NewForConfig returns the Interface served by the API server of cfg; every
// request shares cfg's rate limiter and counts in client-go's request metrics.
func NewForConfig(cfg *rest.Config) (Interface, error) {
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	core, err := restClient(cfg, httpClient, "/api", corev1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	storage, err := restClient(cfg, httpClient, "/apis", storagev1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return &client{core: core, storage: storage}, nil
}

// restClient is what client-go's generated group clients build, for this
// package's scheme.
func restClient(cfg *rest.Config, httpClient *http.Client, apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
	return NewRESTClient(cfg, httpClient, apiPath, gv, Scheme, codecs)
}

// NewRESTClient is what client-go's generated group clients build: a client of
// one group version at apiPath ("/api" for the core group, else "/apis"),
// encoding and decoding with scheme's codecs.
func NewRESTClient(cfg *rest.Config, httpClient *http.Client, apiPath string, gv schema.GroupVersion,
	scheme *runtime.Scheme, codecs serializer.CodecFactory) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = apiPath
	c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(scheme, codecs).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	return rest.RESTClientForConfigAndClient(c, httpClient)
}

type client struct {
	core, storage *rest.RESTClient
}

// typed is a gentype client of one resource of this package's scheme.
func typed[T interface {
	runtime.Object
	metav1.Object
}, L runtime.Object](rc rest.Interface, resource, namespace string, newT func() T, newL func() L) *gentype.ClientWithList[T, L] {
	return Typed(rc, parameterCodec, resource, namespace, newT, newL)
}

// Typed is a gentype client of one resource, preferring protobuf as
// client-go's own clients of the built-in types do.
func Typed[T interface {
	runtime.Object
	metav1.Object
}, L runtime.Object](rc rest.Interface, params runtime.ParameterCodec, resource, namespace string, newT func() T, newL func() L) *gentype.ClientWithList[T, L] {
	return gentype.NewClientWithList(resource, rc, params, namespace, newT, newL, gentype.PrefersProtobuf[T]())
}

func (c *client) Pods(namespace string) Pods {
	return pods{typed(c.core, "pods", namespace,
		func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} })}
}

type pods struct {
	*gentype.ClientWithList[*corev1.Pod, *corev1.PodList]
}

// GetLogs is client-go's pods.GetLogs.
func (p pods) GetLogs(name string, opts *corev1.PodLogOptions) *rest.Request {
	return p.GetClient().Get().Namespace(p.GetNamespace()).Name(name).Resource("pods").
		SubResource("log").VersionedParams(opts, parameterCodec)
}

func (c *client) PersistentVolumes() Resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList] {
	return typed(c.core, "persistentvolumes", "",
		func() *corev1.PersistentVolume { return &corev1.PersistentVolume{} },
		func() *corev1.PersistentVolumeList { return &corev1.PersistentVolumeList{} })
}

func (c *client) PersistentVolumeClaims(namespace string) Resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList] {
	return typed(c.core, "persistentvolumeclaims", namespace,
		func() *corev1.PersistentVolumeClaim { return &corev1.PersistentVolumeClaim{} },
		func() *corev1.PersistentVolumeClaimList { return &corev1.PersistentVolumeClaimList{} })
}

func (c *client) Nodes() Resource[*corev1.Node, *corev1.NodeList] {
	return typed(c.core, "nodes", "",
		func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} })
}

func (c *client) StorageClasses() Resource[*storagev1.StorageClass, *storagev1.StorageClassList] {
	return typed(c.storage, "storageclasses", "",
		func() *storagev1.StorageClass { return &storagev1.StorageClass{} },
		func() *storagev1.StorageClassList { return &storagev1.StorageClassList{} })
}

func (c *client) VolumeAttributesClasses() Resource[*storagev1.VolumeAttributesClass, *storagev1.VolumeAttributesClassList] {
	return typed(c.storage, "volumeattributesclasses", "",
		func() *storagev1.VolumeAttributesClass { return &storagev1.VolumeAttributesClass{} },
		func() *storagev1.VolumeAttributesClassList { return &storagev1.VolumeAttributesClassList{} })
}

func (c *client) EventSink() record.EventSink { return eventSink{c.core} }

func (c *client) ServerVersion(ctx context.Context) (*version.Info, error) {
	body, err := c.core.Get().AbsPath("/version").Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	var info version.Info
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("the API server's /version: %w", err)
	}
	return &info, nil
}

// eventSink writes events in their own namespace, as client-go's
// EventSinkImpl over Events("") does; that one lives in the clientset's typed
// core client, which imports every API group (see the package comment).
type eventSink struct{ rc rest.Interface }

func (s eventSink) Create(e *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.rc.Post().NamespaceIfScoped(e.Namespace, e.Namespace != "").Resource("events").
		Body(e).Do(context.TODO()).Into(out)
	return out, err
}

func (s eventSink) Update(e *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.rc.Put().NamespaceIfScoped(e.Namespace, e.Namespace != "").Resource("events").Name(e.Name).
		Body(e).Do(context.TODO()).Into(out)
	return out, err
}

func (s eventSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	out := &corev1.Event{}
	err := s.rc.Patch(types.StrategicMergePatchType).NamespaceIfScoped(e.Namespace, e.Namespace != "").
		Resource("events").Name(e.Name).Body(data).Do(context.TODO()).Into(out)
	return out, err
}

// ListWatcher is what an informer lists and watches: a Resource of this
// package, or a dynamic client's resource.
type ListWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// NewInformer is an informer of r's objects (example is one, empty), listed
// and watched with tweak, if not nil, applied to every request (a label
// selector, say),
// indexed by namespace and by indexers. It is what client-go's informer
// factories and dynamicinformer build, without importing them: both import
// every API group's informers and typed clients (see the package comment).
//
// client is the client r comes from. The reflector streams the initial list
// through a watch (WatchListClient) unless the client says it cannot, as
// client-go's fake clients do: their watches never send the bookmark that
// ends the stream, so an informer on them would never sync.
func NewInformer[L runtime.Object](client any, r ListWatcher[L], example runtime.Object, resync time.Duration,
	tweak func(*metav1.ListOptions), indexers cache.Indexers) cache.SharedIndexInformer {
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return r.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return r.Watch(ctx, o)
		},
	}
	all := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	for name, f := range indexers {
		all[name] = f
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), example, resync, all)
}

// Unwrap is obj as a T, as an informer's event handler receives it: a
// deletion the informer missed (it relisted) comes as a
// cache.DeletedFinalStateUnknown, whose Obj is the last state it had.
func Unwrap[T any](obj any) (T, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	v, ok := obj.(T)
	return v, ok
}
