// Package records keeps pav's PavVolume records (api/v1alpha1.PavVolume) for one
// provisioner: the controller plugin's only memory of the volumes it made.
//
// Reads come from an informer (label selector on the provisioner, so its memory
// is O(this provisioner's volumes), never the cluster's), indexed by the handle
// label. The cache lags behind the store's own writes, so the store remembers
// each object it wrote until the informer has caught up with it, and Get and
// ByHandle fall back to one API read on a miss: a record just written is never
// missed, and one just deleted is never resurrected.
//
// Writes are optimistic: Update sends the resourceVersion it read (a Conflict
// means someone else wrote in between; the caller retries from a fresh read),
// Delete sends the UID it read.
package records

import (
	"context"
	"errors"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// ErrNotStarted is returned before Start has synced.
var ErrNotStarted = errors.New("PavVolume records not loaded yet")

const handleIndex = "pav.handle"

// Store reads and writes one provisioner's PavVolumes.
type Store struct {
	client      dynamic.ResourceInterface
	provisioner string
	informer    cache.SharedIndexInformer

	mu      sync.Mutex
	synced  bool
	written map[string]written // by record name: our writes the cache has not caught up with
}

// written is the last write of a record: the object (nil after a delete).
type written struct {
	obj *v1alpha1.PavVolume
	rv  string // resourceVersion of obj ("" for a delete)
}

// New returns a store of provisioner's records; call Start before using it.
func New(client dynamic.Interface, provisioner string) *Store {
	s := &Store{client: client.Resource(v1alpha1.VolumeGroupVersionResource), provisioner: provisioner, written: map[string]written{}}
	selector := s.selector().String()
	s.informer = dynamicinformer.NewFilteredDynamicInformer(client, v1alpha1.VolumeGroupVersionResource, "", 0,
		cache.Indexers{handleIndex: func(obj any) ([]string, error) {
			if v, ok := obj.(*v1alpha1.PavVolume); ok && v.Labels[v1alpha1.LabelVolumeHandle] != "" {
				return []string{v.Labels[v1alpha1.LabelVolumeHandle]}, nil
			}
			return nil, nil
		}},
		func(o *metav1.ListOptions) { o.LabelSelector = selector }).Informer()
	// Convert once, when an object enters the cache, rather than on every read.
	_ = s.informer.SetTransform(func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil
		}
		v, err := fromUnstructured(u)
		if err != nil {
			// A record pav cannot read must not stop the informer; it is
			// reported when someone asks for it (Get reads the API then).
			klog.ErrorS(err, "Unreadable PavVolume", "name", u.GetName())
			return obj, nil
		}
		v.ManagedFields = nil
		return v, nil
	})
	_, _ = s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.caughtUp,
		UpdateFunc: func(_, obj any) { s.caughtUp(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if m, err := metaOf(obj); err == nil {
				s.mu.Lock()
				if w, ok := s.written[m.GetName()]; ok && w.obj == nil {
					delete(s.written, m.GetName())
				}
				s.mu.Unlock()
			}
		},
	})
	return s
}

func (s *Store) selector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{v1alpha1.LabelVolumeProvisioner: s.provisioner})
}

// caughtUp forgets our write of a record once the cache holds that version.
func (s *Store) caughtUp(obj any) {
	m, err := metaOf(obj)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.written[m.GetName()]; ok && w.obj != nil && w.rv == m.GetResourceVersion() {
		delete(s.written, m.GetName())
	}
}

func metaOf(obj any) (metav1.Object, error) {
	switch o := obj.(type) {
	case *v1alpha1.PavVolume:
		return o, nil
	case *unstructured.Unstructured:
		return o, nil
	}
	return nil, fmt.Errorf("unexpected %T", obj)
}

// Start runs the informer until ctx ends and waits for its first sync.
func (s *Store) Start(ctx context.Context) error {
	go s.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		return fmt.Errorf("PavVolume informer did not sync: %w", context.Cause(ctx))
	}
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	return nil
}

// Synced reports whether the first sync is done (for readiness).
func (s *Store) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// Get returns the record of a CSI volume name, or nil when there is none. A
// record of another provisioner under that name is an error naming it.
func (s *Store) Get(ctx context.Context, volumeName string) (*v1alpha1.PavVolume, error) {
	if !s.Synced() {
		return nil, ErrNotStarted
	}
	name := v1alpha1.VolumeRecordName(volumeName)
	s.mu.Lock()
	w, ok := s.written[name]
	s.mu.Unlock()
	if ok {
		if w.obj == nil {
			return nil, nil
		}
		return s.check(w.obj.DeepCopy(), volumeName)
	}
	if obj, exists, err := s.informer.GetIndexer().GetByKey(name); err == nil && exists {
		if v, ok := obj.(*v1alpha1.PavVolume); ok {
			return s.check(v.DeepCopy(), volumeName)
		}
	}
	// Not cached: either there is none, or the cache lags (or it is another
	// provisioner's, which the informer does not see). Ask the API server.
	u, err := s.client.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading PavVolume %s: %w", name, err)
	}
	v, err := fromUnstructured(u)
	if err != nil {
		return nil, err
	}
	return s.check(v, volumeName)
}

// ErrOtherOwner is returned for a record of the name that belongs to another
// provisioner or volume.
var ErrOtherOwner = errors.New("PavVolume belongs to another provisioner or volume")

func (s *Store) check(v *v1alpha1.PavVolume, volumeName string) (*v1alpha1.PavVolume, error) {
	if v.Spec.Provisioner != s.provisioner || v.Labels[v1alpha1.LabelVolumeProvisioner] != s.provisioner {
		return nil, fmt.Errorf("%w: PavVolume %s belongs to provisioner %q, not %q", ErrOtherOwner, v.Name, v.Spec.Provisioner, s.provisioner)
	}
	if v.Spec.VolumeName != volumeName {
		return nil, fmt.Errorf("%w: PavVolume %s records volume %q, not %q (a hash collision)", ErrOtherOwner, v.Name, v.Spec.VolumeName, volumeName)
	}
	return v, nil
}

// ByHandle returns this provisioner's records whose status.handle is handle
// (normally zero or one), from the cache; with live, or when the cache has
// none, from the API server, so that a record just written is never missed.
func (s *Store) ByHandle(ctx context.Context, handle string, live bool) ([]*v1alpha1.PavVolume, error) {
	if !s.Synced() {
		return nil, ErrNotStarted
	}
	label := v1alpha1.HandleLabel(handle)
	var out []*v1alpha1.PavVolume
	if !live {
		objs, err := s.informer.GetIndexer().ByIndex(handleIndex, label)
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		s.mu.Lock()
		for _, obj := range objs {
			v, ok := obj.(*v1alpha1.PavVolume)
			if !ok {
				continue
			}
			seen[v.Name] = true
			if w, ok := s.written[v.Name]; ok {
				v = w.obj // newer, or nil: deleted
			}
			if v != nil && v.Status.Handle == handle && v.Spec.Provisioner == s.provisioner {
				out = append(out, v.DeepCopy())
			}
		}
		for name, w := range s.written {
			if !seen[name] && w.obj != nil && w.obj.Status.Handle == handle {
				out = append(out, w.obj.DeepCopy())
			}
		}
		s.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
	}
	sel := labels.SelectorFromSet(labels.Set{v1alpha1.LabelVolumeProvisioner: s.provisioner, v1alpha1.LabelVolumeHandle: label})
	list, err := s.client.List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("listing PavVolumes of handle %q: %w", handle, err)
	}
	for i := range list.Items {
		v, err := fromUnstructured(&list.Items[i])
		if err != nil {
			return nil, err
		}
		if v.Status.Handle == handle && v.Spec.Provisioner == s.provisioner {
			out = append(out, v)
		}
	}
	return out, nil
}

// Create writes a new record (name, labels and spec.provisioner are set here).
// AlreadyExists is returned as is.
func (s *Store) Create(ctx context.Context, v *v1alpha1.PavVolume) (*v1alpha1.PavVolume, error) {
	v = v.DeepCopy()
	v.Name = v1alpha1.VolumeRecordName(v.Spec.VolumeName)
	v.Spec.Provisioner = s.provisioner
	s.setLabels(v)
	u, err := toUnstructured(v)
	if err != nil {
		return nil, err
	}
	got, err := s.client.Create(ctx, u, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil {
		return nil, fmt.Errorf("creating PavVolume %s: %w", v.Name, err)
	}
	return s.remember(got)
}

// Update writes v, which must carry the resourceVersion it was read at: a
// Conflict (someone else wrote in between) is returned for the caller to retry
// from a fresh read.
func (s *Store) Update(ctx context.Context, v *v1alpha1.PavVolume) (*v1alpha1.PavVolume, error) {
	if v.ResourceVersion == "" {
		return nil, fmt.Errorf("updating PavVolume %s: no resourceVersion (read it first)", v.Name)
	}
	v = v.DeepCopy()
	s.setLabels(v)
	u, err := toUnstructured(v)
	if err != nil {
		return nil, err
	}
	got, err := s.client.Update(ctx, u, metav1.UpdateOptions{FieldManager: fieldManager})
	if err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			// What we remember is stale: read afresh next time.
			s.mu.Lock()
			delete(s.written, v.Name)
			s.mu.Unlock()
		}
		return nil, fmt.Errorf("updating PavVolume %s: %w", v.Name, err)
	}
	return s.remember(got)
}

// Delete removes the record read as v (UID precondition); a record already
// gone is not an error.
func (s *Store) Delete(ctx context.Context, v *v1alpha1.PavVolume) error {
	opts := metav1.DeleteOptions{}
	if v.UID != "" {
		uid := v.UID
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := s.client.Delete(ctx, v.Name, opts)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting PavVolume %s: %w", v.Name, err)
	}
	s.mu.Lock()
	s.written[v.Name] = written{}
	s.mu.Unlock()
	return nil
}

const fieldManager = "pav-driver"

// setLabels keeps the labels the informer and the handle index select on.
func (s *Store) setLabels(v *v1alpha1.PavVolume) {
	if v.Labels == nil {
		v.Labels = map[string]string{}
	}
	v.Labels[v1alpha1.LabelVolumeProvisioner] = s.provisioner
	if v.Status.Handle != "" {
		v.Labels[v1alpha1.LabelVolumeHandle] = v1alpha1.HandleLabel(v.Status.Handle)
	} else {
		delete(v.Labels, v1alpha1.LabelVolumeHandle)
	}
}

func (s *Store) remember(u *unstructured.Unstructured) (*v1alpha1.PavVolume, error) {
	v, err := fromUnstructured(u)
	if err != nil {
		return nil, err
	}
	v.ManagedFields = nil
	s.mu.Lock()
	s.written[v.Name] = written{obj: v.DeepCopy(), rv: v.ResourceVersion}
	s.mu.Unlock()
	return v, nil
}

func toUnstructured(v *v1alpha1.PavVolume) (*unstructured.Unstructured, error) {
	v.APIVersion, v.Kind = v1alpha1.SchemeGroupVersion.String(), v1alpha1.VolumeKind
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
	if err != nil {
		return nil, fmt.Errorf("PavVolume %s: %w", v.Name, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

func fromUnstructured(u *unstructured.Unstructured) (*v1alpha1.PavVolume, error) {
	v := &v1alpha1.PavVolume{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, v); err != nil {
		return nil, fmt.Errorf("PavVolume %s is unreadable: %w", u.GetName(), err)
	}
	return v, nil
}
