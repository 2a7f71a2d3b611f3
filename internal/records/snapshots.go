package records

// The PavSnapshot store: the same cache-with-our-writes and optimistic writes
// as Store keeps for PavVolumes (see the package doc), for a provisioner's
// snapshot records, plus List (ListSnapshots reads every record) and the
// source volume label.

import (
	"context"
	"errors"
	"fmt"
	"sort"
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

// ErrSnapshotsNotStarted is returned before Start has synced.
var ErrSnapshotsNotStarted = errors.New("PavSnapshot records not loaded yet")

const snapshotHandleIndex = "pav.snapshot-handle"

// SnapshotStore reads and writes one provisioner's PavSnapshots.
type SnapshotStore struct {
	client      dynamic.ResourceInterface
	provisioner string
	informer    cache.SharedIndexInformer

	mu       sync.Mutex
	synced   bool
	swritten map[string]swritten // by record name: our writes the cache has not caught up with
}

// swritten is the last write of a snapshot of a record: the object (nil after a delete).
type swritten struct {
	obj *v1alpha1.PavSnapshot
	rv  string // resourceVersion of obj ("" for a delete)
}

// New returns a store of provisioner's records; call Start before using it.
func NewSnapshots(client dynamic.Interface, provisioner string) *SnapshotStore {
	s := &SnapshotStore{client: client.Resource(v1alpha1.SnapshotGroupVersionResource), provisioner: provisioner, swritten: map[string]swritten{}}
	selector := s.selector().String()
	s.informer = dynamicinformer.NewFilteredDynamicInformer(client, v1alpha1.SnapshotGroupVersionResource, "", 0,
		cache.Indexers{snapshotHandleIndex: func(obj any) ([]string, error) {
			if v, ok := obj.(*v1alpha1.PavSnapshot); ok && v.Labels[v1alpha1.LabelVolumeHandle] != "" {
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
		v, err := snapshotFromUnstructured(u)
		if err != nil {
			// A record pav cannot read must not stop the informer; it is
			// reported when someone asks for it (Get reads the API then).
			klog.ErrorS(err, "Unreadable PavSnapshot", "name", u.GetName())
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
			if m, err := snapshotMetaOf(obj); err == nil {
				s.mu.Lock()
				if w, ok := s.swritten[m.GetName()]; ok && w.obj == nil {
					delete(s.swritten, m.GetName())
				}
				s.mu.Unlock()
			}
		},
	})
	return s
}

func (s *SnapshotStore) selector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{v1alpha1.LabelVolumeProvisioner: s.provisioner})
}

// caughtUp forgets our write of a record once the cache holds that version.
func (s *SnapshotStore) caughtUp(obj any) {
	m, err := snapshotMetaOf(obj)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.swritten[m.GetName()]; ok && w.obj != nil && w.rv == m.GetResourceVersion() {
		delete(s.swritten, m.GetName())
	}
}

func snapshotMetaOf(obj any) (metav1.Object, error) {
	switch o := obj.(type) {
	case *v1alpha1.PavSnapshot:
		return o, nil
	case *unstructured.Unstructured:
		return o, nil
	}
	return nil, fmt.Errorf("unexpected %T", obj)
}

// Start runs the informer until ctx ends and waits for its first sync.
func (s *SnapshotStore) Start(ctx context.Context) error {
	go s.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		return fmt.Errorf("PavSnapshot informer did not sync: %w", context.Cause(ctx))
	}
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	return nil
}

// Synced reports whether the first sync is done (for readiness).
func (s *SnapshotStore) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// Get returns the record of a CSI volume name, or nil when there is none. A
// record of another provisioner under that name is an error naming it.
func (s *SnapshotStore) Get(ctx context.Context, snapshotName string) (*v1alpha1.PavSnapshot, error) {
	if !s.Synced() {
		return nil, ErrSnapshotsNotStarted
	}
	name := v1alpha1.SnapshotRecordName(snapshotName)
	s.mu.Lock()
	w, ok := s.swritten[name]
	s.mu.Unlock()
	if ok {
		if w.obj == nil {
			return nil, nil
		}
		return s.check(w.obj.DeepCopy(), snapshotName)
	}
	if obj, exists, err := s.informer.GetIndexer().GetByKey(name); err == nil && exists {
		if v, ok := obj.(*v1alpha1.PavSnapshot); ok {
			return s.check(v.DeepCopy(), snapshotName)
		}
	}
	// Not cached: either there is none, or the cache lags (or it is another
	// provisioner's, which the informer does not see). Ask the API server.
	u, err := s.client.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading PavSnapshot %s: %w", name, err)
	}
	v, err := snapshotFromUnstructured(u)
	if err != nil {
		return nil, err
	}
	return s.check(v, snapshotName)
}

// ErrOtherOwner is returned for a record of the name that belongs to another
// provisioner or volume.
var ErrOtherSnapshotOwner = errors.New("PavSnapshot belongs to another provisioner or snapshot")

func (s *SnapshotStore) check(v *v1alpha1.PavSnapshot, snapshotName string) (*v1alpha1.PavSnapshot, error) {
	if v.Spec.Provisioner != s.provisioner || v.Labels[v1alpha1.LabelVolumeProvisioner] != s.provisioner {
		return nil, fmt.Errorf("%w: PavSnapshot %s belongs to provisioner %q, not %q", ErrOtherSnapshotOwner, v.Name, v.Spec.Provisioner, s.provisioner)
	}
	if v.Spec.SnapshotName != snapshotName {
		return nil, fmt.Errorf("%w: PavSnapshot %s records snapshot %q, not %q (a hash collision)", ErrOtherSnapshotOwner, v.Name, v.Spec.SnapshotName, snapshotName)
	}
	return v, nil
}

// ByHandle returns this provisioner's records whose status.handle is handle
// (normally zero or one), from the cache; with live, or when the cache has
// none, from the API server, so that a record just written is never missed.
func (s *SnapshotStore) ByHandle(ctx context.Context, handle string, live bool) ([]*v1alpha1.PavSnapshot, error) {
	if !s.Synced() {
		return nil, ErrSnapshotsNotStarted
	}
	label := v1alpha1.HandleLabel(handle)
	var out []*v1alpha1.PavSnapshot
	if !live {
		objs, err := s.informer.GetIndexer().ByIndex(snapshotHandleIndex, label)
		if err != nil {
			return nil, err
		}
		seen := map[string]bool{}
		s.mu.Lock()
		for _, obj := range objs {
			v, ok := obj.(*v1alpha1.PavSnapshot)
			if !ok {
				continue
			}
			seen[v.Name] = true
			if w, ok := s.swritten[v.Name]; ok {
				v = w.obj // newer, or nil: deleted
			}
			if v != nil && v.Status.Handle == handle && v.Spec.Provisioner == s.provisioner {
				out = append(out, v.DeepCopy())
			}
		}
		for name, w := range s.swritten {
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
		return nil, fmt.Errorf("listing PavSnapshots of handle %q: %w", handle, err)
	}
	for i := range list.Items {
		v, err := snapshotFromUnstructured(&list.Items[i])
		if err != nil {
			return nil, err
		}
		if v.Status.Handle == handle && v.Spec.Provisioner == s.provisioner {
			out = append(out, v)
		}
	}
	return out, nil
}

// List returns every record of this provisioner, from the cache with our own
// writes the cache has not caught up with, sorted by name (ListSnapshots
// pages through it).
func (s *SnapshotStore) List() ([]*v1alpha1.PavSnapshot, error) {
	if !s.Synced() {
		return nil, ErrSnapshotsNotStarted
	}
	byName := map[string]*v1alpha1.PavSnapshot{}
	for _, obj := range s.informer.GetIndexer().List() {
		if v, ok := obj.(*v1alpha1.PavSnapshot); ok && v.Spec.Provisioner == s.provisioner {
			byName[v.Name] = v
		}
	}
	s.mu.Lock()
	for name, w := range s.swritten {
		if w.obj == nil {
			delete(byName, name)
		} else {
			byName[name] = w.obj
		}
	}
	out := make([]*v1alpha1.PavSnapshot, 0, len(byName))
	for _, v := range byName {
		out = append(out, v.DeepCopy())
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Create writes a new record (name, labels and spec.provisioner are set here).
// AlreadyExists is returned as is.
func (s *SnapshotStore) Create(ctx context.Context, v *v1alpha1.PavSnapshot) (*v1alpha1.PavSnapshot, error) {
	v = v.DeepCopy()
	v.Name = v1alpha1.SnapshotRecordName(v.Spec.SnapshotName)
	v.Spec.Provisioner = s.provisioner
	s.setLabels(v)
	u, err := snapshotToUnstructured(v)
	if err != nil {
		return nil, err
	}
	got, err := s.client.Create(ctx, u, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil {
		return nil, fmt.Errorf("creating PavSnapshot %s: %w", v.Name, err)
	}
	return s.remember(got)
}

// Update writes v, which must carry the resourceVersion it was read at: a
// Conflict (someone else wrote in between) is returned for the caller to retry
// from a fresh read.
func (s *SnapshotStore) Update(ctx context.Context, v *v1alpha1.PavSnapshot) (*v1alpha1.PavSnapshot, error) {
	if v.ResourceVersion == "" {
		return nil, fmt.Errorf("updating PavSnapshot %s: no resourceVersion (read it first)", v.Name)
	}
	v = v.DeepCopy()
	s.setLabels(v)
	u, err := snapshotToUnstructured(v)
	if err != nil {
		return nil, err
	}
	got, err := s.client.Update(ctx, u, metav1.UpdateOptions{FieldManager: fieldManager})
	if err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			// What we remember is stale: read afresh next time.
			s.mu.Lock()
			delete(s.swritten, v.Name)
			s.mu.Unlock()
		}
		return nil, fmt.Errorf("updating PavSnapshot %s: %w", v.Name, err)
	}
	return s.remember(got)
}

// Delete removes the record read as v (UID precondition); a record already
// gone is not an error.
func (s *SnapshotStore) Delete(ctx context.Context, v *v1alpha1.PavSnapshot) error {
	opts := metav1.DeleteOptions{}
	if v.UID != "" {
		uid := v.UID
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := s.client.Delete(ctx, v.Name, opts)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting PavSnapshot %s: %w", v.Name, err)
	}
	s.mu.Lock()
	s.swritten[v.Name] = swritten{}
	s.mu.Unlock()
	return nil
}

// setLabels keeps the labels the informer and the handle index select on.
func (s *SnapshotStore) setLabels(v *v1alpha1.PavSnapshot) {
	if v.Labels == nil {
		v.Labels = map[string]string{}
	}
	v.Labels[v1alpha1.LabelSnapshotSourceVolume] = v1alpha1.HandleLabel(v.Spec.SourceVolumeID)
	v.Labels[v1alpha1.LabelVolumeProvisioner] = s.provisioner
	if v.Status.Handle != "" {
		v.Labels[v1alpha1.LabelVolumeHandle] = v1alpha1.HandleLabel(v.Status.Handle)
	} else {
		delete(v.Labels, v1alpha1.LabelVolumeHandle)
	}
}

func (s *SnapshotStore) remember(u *unstructured.Unstructured) (*v1alpha1.PavSnapshot, error) {
	v, err := snapshotFromUnstructured(u)
	if err != nil {
		return nil, err
	}
	v.ManagedFields = nil
	s.mu.Lock()
	s.swritten[v.Name] = swritten{obj: v.DeepCopy(), rv: v.ResourceVersion}
	s.mu.Unlock()
	return v, nil
}

func snapshotToUnstructured(v *v1alpha1.PavSnapshot) (*unstructured.Unstructured, error) {
	v.APIVersion, v.Kind = v1alpha1.SchemeGroupVersion.String(), v1alpha1.SnapshotKind
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
	if err != nil {
		return nil, fmt.Errorf("PavSnapshot %s: %w", v.Name, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

func snapshotFromUnstructured(u *unstructured.Unstructured) (*v1alpha1.PavSnapshot, error) {
	v := &v1alpha1.PavSnapshot{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, v); err != nil {
		return nil, fmt.Errorf("PavSnapshot %s is unreadable: %w", u.GetName(), err)
	}
	return v, nil
}
