// Package manager is `pav manager`: it turns every PavProvisioner into its
// CSIDriver, controller StatefulSet and node DaemonSet (the manifests of
// deploy/provisioner, embedded), guards PavProvisioner deletion (spec §6) and is
// the only writer of PavProvisioner status.
//
// It is a plain client-go controller: informers (no polling), one rate-limited
// workqueue keyed by provisioner name, server-side apply with owner references,
// events, and leader election so that only one replica acts.
package manager

import (
	"context"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/listers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/kube/managerapi"
	"github.com/pods-as-volumes/pav/podrunner"
)

// Config of a Controller.
type Config struct {
	// Kube serves PVs, pods and events; Apps the objects the manager applies.
	Kube    kube.Interface
	Apps    managerapi.Interface
	Dynamic dynamic.Interface
	// Namespace is the manager's own: the workloads go there, next to the
	// drivers' ServiceAccounts.
	Namespace string
	Settings  Settings
	Recorder  record.EventRecorder
	// Resync re-delivers every PavProvisioner from the cache this often (no API
	// call); 0 never does.
	Resync time.Duration
}

// Controller reconciles PavProvisioners.
type Controller struct {
	cfg Config
	// queue is the current term's (see Run); events queue there, and its
	// workers read it.
	queueMu sync.RWMutex
	queue   workqueue.TypedRateLimitingInterface[string]
	// own are the objects that always reconcile a provisioner (itself, its
	// workloads, its CSIDriver) and their keys: each term starts from them.
	own []keyedStore

	provisioners cache.GenericLister
	statefulSets listers.ResourceIndexer[*appsv1.StatefulSet]
	daemonSets   listers.ResourceIndexer[*appsv1.DaemonSet]
	csiDrivers   listers.ResourceIndexer[*storagev1.CSIDriver]
	// services and secrets: the csi-snapshot-metadata sidecars' (label
	// app.kubernetes.io/component=snapshot-metadata), in the manager's namespace.
	services listers.ResourceIndexer[*corev1.Service]
	secrets  listers.ResourceIndexer[*corev1.Secret]
	pvs      cache.Indexer
	pods     cache.Indexer
	records  cache.Indexer
	guards   []guard

	start  []func(<-chan struct{})
	synced []cache.InformerSynced
}

// New sets up the informers and their event handlers; Start runs them.
func New(cfg Config) (*Controller, error) {
	if cfg.Namespace == "" {
		return nil, fmt.Errorf("the manager's namespace is required (POD_NAMESPACE or --namespace)")
	}
	c := &Controller{cfg: cfg, queue: newQueue()}

	provInf := kube.NewInformer(cfg.Dynamic, cfg.Dynamic.Resource(v1alpha1.GroupVersionResource), &unstructured.Unstructured{},
		cfg.Resync, nil, nil)
	c.provisioners = cache.NewGenericLister(provInf.GetIndexer(), v1alpha1.GroupVersionResource.GroupResource())

	// The workloads in the manager's namespace.
	stsInf := kube.NewInformer(cfg.Apps, cfg.Apps.StatefulSets(cfg.Namespace), &appsv1.StatefulSet{}, 0, nil, nil)
	dsInf := kube.NewInformer(cfg.Apps, cfg.Apps.DaemonSets(cfg.Namespace), &appsv1.DaemonSet{}, 0, nil, nil)
	c.statefulSets = listers.NewNamespaced(listers.New[*appsv1.StatefulSet](stsInf.GetIndexer(), appsv1.Resource("statefulsets")), cfg.Namespace)
	c.daemonSets = listers.NewNamespaced(listers.New[*appsv1.DaemonSet](dsInf.GetIndexer(), appsv1.Resource("daemonsets")), cfg.Namespace)

	// CSIDrivers are few; all of them are watched, so that a driver of the same
	// name that pav did not make is seen (and never taken over).
	csiInf := kube.NewInformer(cfg.Apps, cfg.Apps.CSIDrivers(), &storagev1.CSIDriver{}, 0, nil, nil)
	c.csiDrivers = listers.New[*storagev1.CSIDriver](csiInf.GetIndexer(), storagev1.Resource("csidrivers"))
	// Only the snapshot metadata sidecars' Services and Secrets.
	ours := func(o *metav1.ListOptions) { o.LabelSelector = labelComponent + "=" + componentSnapshotMetadata }
	svcInf := kube.NewInformer(cfg.Apps, cfg.Apps.Services(cfg.Namespace), &corev1.Service{}, 0, ours, nil)
	secInf := kube.NewInformer(cfg.Apps, cfg.Apps.Secrets(cfg.Namespace), &corev1.Secret{}, 0, ours, nil)
	c.services = listers.NewNamespaced(listers.New[*corev1.Service](svcInf.GetIndexer(), corev1.Resource("services")), cfg.Namespace)
	c.secrets = listers.NewNamespaced(listers.New[*corev1.Secret](secInf.GetIndexer(), corev1.Resource("secrets")), cfg.Namespace)
	for _, inf := range []cache.SharedIndexInformer{stsInf, dsInf, csiInf, svcInf, secInf} {
		if err := inf.SetTransform(withoutManagedFields); err != nil {
			return nil, err
		}
	}
	pvInf := kube.NewInformer(cfg.Kube, cfg.Kube.PersistentVolumes(), &corev1.PersistentVolume{}, 0, nil,
		cache.Indexers{indexByDriver: pvByDriver})
	if err := pvInf.SetTransform(slim); err != nil {
		return nil, err
	}
	c.pvs = pvInf.GetIndexer()

	// Only pav's operation pods (they carry the provisioner label).
	podInf := kube.NewInformer(cfg.Kube, cfg.Kube.Pods(""), &corev1.Pod{}, 0,
		func(o *metav1.ListOptions) { o.LabelSelector = podrunner.LabelProvisioner },
		cache.Indexers{indexByProvisioner: podByProvisioner})
	if err := podInf.SetTransform(slim); err != nil {
		return nil, err
	}
	c.pods = podInf.GetIndexer()
	// Records of volumes (PavVolumes, labelled with their provisioner): they exist
	// from the start of CreateVolume until DeleteVolume or the revert of a failed
	// creation is done, also while no PV exists (creation in progress, a PV deleted
	// behind the driver's back).
	volInf := kube.NewInformer(cfg.Dynamic, cfg.Dynamic.Resource(v1alpha1.VolumeGroupVersionResource), &unstructured.Unstructured{},
		0, nil, cache.Indexers{indexByProvisioner: recordByProvisioner})
	if err := volInf.SetTransform(slim); err != nil {
		return nil, err
	}
	c.records = volInf.GetIndexer()
	// And of snapshots (PavSnapshots): a snapshot outlives its volume, and only
	// the driver can delete it.
	snapInf := kube.NewInformer(cfg.Dynamic, cfg.Dynamic.Resource(v1alpha1.SnapshotGroupVersionResource), &unstructured.Unstructured{},
		0, nil, cache.Indexers{indexByProvisioner: recordByProvisioner})
	if err := snapInf.SetTransform(slim); err != nil {
		return nil, err
	}
	// And of group snapshots (PavGroupSnapshots): the group's own pods and
	// its members' deletion are the driver's (its members are PavSnapshots,
	// guarded above, but the group's record outlives them by a moment, and a
	// failed group being undone may have none left).
	groupInf := kube.NewInformer(cfg.Dynamic, cfg.Dynamic.Resource(v1alpha1.GroupSnapshotGroupVersionResource), &unstructured.Unstructured{},
		0, nil, cache.Indexers{indexByProvisioner: recordByProvisioner})
	if err := groupInf.SetTransform(slim); err != nil {
		return nil, err
	}
	c.guards = []guard{pvGuard(c.pvs), podGuard(c.pods), recordGuard(v1alpha1.VolumeKind, c.records),
		recordGuard(v1alpha1.SnapshotKind, snapInf.GetIndexer()), recordGuard(v1alpha1.GroupSnapshotKind, groupInf.GetIndexer())}

	// What each informer's events mean to a provisioner (see routing):
	// its own objects and workloads concern it always; a PV's arrival or
	// departure changes its status.volumes; everything else that guards
	// deletion (a PV's updates, pav's pods, records) only matters once it is
	// being deleted.
	for _, h := range []struct {
		inf   cache.SharedIndexInformer
		keys  func(any) []string
		route routing
	}{
		{provInf, func(o any) []string { return nameOf(o) }, always},
		{stsInf, ownerKeys, always},
		{dsInf, ownerKeys, always},
		{csiInf, func(o any) []string { return nameOf(o) }, always},
		{svcInf, ownerKeys, always},
		{secInf, ownerKeys, always},
		{pvInf, pvKeys, counted},
		{podInf, podKeys, guarding},
		{volInf, func(o any) []string { k, _ := recordByProvisioner(o); return k }, guarding},
		{snapInf, func(o any) []string { k, _ := recordByProvisioner(o); return k }, guarding},
		{groupInf, func(o any) []string { k, _ := recordByProvisioner(o); return k }, guarding},
	} {
		keys, route := h.keys, h.route
		enqueue := func(o any, arrivalOrDeparture bool) {
			for _, k := range keys(o) {
				c.route(k, route, arrivalOrDeparture)
			}
		}
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { enqueue(o, true) },
			UpdateFunc: func(_, o any) { enqueue(o, false) },
			DeleteFunc: func(o any) { enqueue(o, true) },
		}); err != nil {
			return nil, err
		}
		c.synced = append(c.synced, h.inf.HasSynced)
		c.start = append(c.start, h.inf.Run)
		if route == always {
			c.own = append(c.own, keyedStore{h.inf.GetStore(), keys})
		}
	}
	return c, nil
}

// keyedStore is an informer's cache and the provisioners its objects concern.
type keyedStore struct {
	store cache.Store
	keys  func(any) []string
}

func newQueue() workqueue.TypedRateLimitingInterface[string] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "pav-manager"})
}

// q is the current term's queue.
func (c *Controller) q() workqueue.TypedRateLimitingInterface[string] {
	c.queueMu.RLock()
	defer c.queueMu.RUnlock()
	return c.queue
}

// Start runs the informers until ctx ends and waits for their first sync.
func (c *Controller) Start(ctx context.Context) error {
	for _, run := range c.start {
		go run(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("the manager's informers did not sync: %w", ctx.Err())
	}
	return nil
}

// HasSynced reports whether every informer has synced (the /readyz check).
func (c *Controller) HasSynced() bool {
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	return true
}

// Run is one term of the manager (while it leads): it processes the queue
// with workers goroutines until ctx ends and they have finished; one key is
// never reconciled by two workers at once (the workqueue guarantees it).
//
// A term has a queue of its own, shut down at its end, which starts with
// every provisioner the caches know of: the manager may lead again, after a
// lost Lease, with the caches it kept meanwhile, and the events between two
// terms went to a queue nobody read.
func (c *Controller) Run(ctx context.Context, workers int) {
	defer utilruntime.HandleCrash()
	q := newQueue()
	c.queueMu.Lock()
	before := c.queue
	c.queue = q
	c.queueMu.Unlock()
	before.ShutDown()
	for _, o := range c.own {
		for _, obj := range o.store.List() {
			for _, k := range o.keys(obj) {
				q.Add(k)
			}
		}
	}
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	klog.InfoS("pav manager reconciling", "workers", workers, "namespace", c.cfg.Namespace)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			wait.UntilWithContext(ctx, func(ctx context.Context) {
				for c.processNext(ctx, q) {
				}
			}, time.Second)
		})
	}
	// Returns once no reconcile is running any more, so that a successor (after
	// the Lease is released) never works beside this one.
	wg.Wait()
}

func (c *Controller) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) bool {
	name, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(name)
	if err := c.reconcile(ctx, name); err != nil {
		klog.ErrorS(err, "reconcile failed; retrying", "provisioner", name, "retries", q.NumRequeues(name))
		q.AddRateLimited(name)
		return true
	}
	q.Forget(name)
	return true
}

// routing is when an informer's event reconciles the provisioner it concerns.
// At 1,000 volumes a provisioner's PVs, pods and records change tens of
// thousands of times; reconciling on each re-rendered and compared its
// workloads for nothing (the manager spent twice the controller plugin's CPU).
type routing int

const (
	// always: the provisioner's own objects (it, its workloads, its CSIDriver).
	always routing = iota
	// counted: PVs. Their arrival and departure change status.volumes, which
	// is written at most once per volumeCountDelay; their updates matter to
	// the deletion guard only.
	counted
	// guarding: pav's pods and records, which matter to the deletion guard
	// only (finalize).
	guarding
)

// volumeCountDelay gathers the changes of status.volumes: creating or
// deleting many volumes at once writes the count once per this period.
const volumeCountDelay = 2 * time.Second

// route queues provisioner name for an event of the given routing.
// arrivalOrDeparture: the object was added or deleted (not updated). The
// provisioner's cache is up to date with any deletion that started before
// this event was handled: its own event queues it then, and the reconcile
// reads the guards' caches as they are by that time.
func (c *Controller) route(name string, r routing, arrivalOrDeparture bool) {
	switch {
	case r == always || c.terminating(name):
		c.q().Add(name)
	case r == counted && arrivalOrDeparture:
		c.q().AddAfter(name, volumeCountDelay)
	}
}

// terminating: the PavProvisioner of that name is cached with a deletion
// timestamp (finalize guards its deletion).
func (c *Controller) terminating(name string) bool {
	obj, err := c.provisioners.Get(name)
	if err != nil {
		return false
	}
	m, err := meta.Accessor(obj)
	return err == nil && m.GetDeletionTimestamp() != nil
}

// Event keys: every object maps to the name(s) of the PavProvisioner(s) it concerns.

func object(o any) (metav1.Object, bool) { return kube.Unwrap[metav1.Object](o) }

// nameOf: a PavProvisioner, or a CSIDriver (named after its provisioner).
func nameOf(o any) []string {
	if m, ok := object(o); ok {
		return []string{m.GetName()}
	}
	return nil
}

// ownerKeys: a workload's controlling PavProvisioner, and the provisioner its
// instance label names (also set on objects pav did not make, which the
// provisioner of that name must notice).
func ownerKeys(o any) []string {
	m, ok := object(o)
	if !ok {
		return nil
	}
	var keys []string
	if ref := metav1.GetControllerOfNoCopy(m); ref != nil && ref.Kind == v1alpha1.Kind {
		keys = append(keys, ref.Name)
	}
	if n := m.GetLabels()[labelInstance]; n != "" {
		keys = append(keys, n)
	}
	return keys
}

func pvKeys(o any) []string {
	if pv, ok := kube.Unwrap[*corev1.PersistentVolume](o); ok && pv.Spec.CSI != nil {
		return []string{pv.Spec.CSI.Driver}
	}
	return nil
}

func podKeys(o any) []string {
	if m, ok := object(o); ok && m.GetLabels()[podrunner.LabelProvisioner] != "" {
		return []string{m.GetLabels()[podrunner.LabelProvisioner]}
	}
	return nil
}
