package records

// The generic store behind Store (PavVolumes) and SnapshotStore
// (PavSnapshots): one provisioner's records of one kind, read from an informer
// with the store's own writes the informer has not caught up with, written
// optimistically (see the package doc). What differs between the kinds is in
// a kind descriptor.

import (
	"context"
	"fmt"
	"sort"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/compat"
	"github.com/pods-as-volumes/pav/internal/kube"
)

// record is what the store needs of a record type (*v1alpha1.PavVolume or
// *v1alpha1.PavSnapshot): a pointer (comparable, nil for "none") to an object
// with metadata and apiVersion/kind.
type record interface {
	comparable
	metav1.Object
	runtime.Object
}

// kind describes one kind of record to store.
type kind[T record] struct {
	name     string // the Kind ("PavVolume"), in errors and logs
	what     string // what the CSI name names ("volume"), in the collision error
	gvr      schema.GroupVersionResource
	index    string // the name of the informer's handle index
	new      func() T
	deepCopy func(T) T

	notStarted error // returned before Start has synced
	otherOwner error // wrapped in check's errors

	// recordName is the record name of a CSI name (v1alpha1.VolumeRecordName).
	recordName func(csiName string) string
	// csiName is the CSI name a record records (spec.volumeName), which
	// check compares with the name asked for.
	csiName func(T) string
	// provisioner points at spec.provisioner, handle reads status.handle.
	provisioner func(T) *string
	handle      func(T) string
	// moreLabels, if set, sets the labels of the kind beyond the provisioner
	// and handle labels every record has.
	moreLabels func(T, map[string]string)

	// format is the kind's format, formatVersion points at the record's
	// spec.formatVersion, and migrations[v] makes a record of version v one
	// of version v+1 (in memory: the next write stores it).
	format        compat.Format
	formatVersion func(T) *int
	migrations    map[int]func(T)
}

// store reads and writes one provisioner's records of one kind.
type store[T record] struct {
	kind        *kind[T]
	client      dynamic.ResourceInterface
	provisioner string
	informer    cache.SharedIndexInformer

	mu      sync.Mutex
	synced  bool
	written map[string]written[T] // by record name: our writes the cache has not caught up with
	// stale: records whose write was refused (Conflict, NotFound): someone
	// else wrote them since our last write, which the cache may not show yet,
	// so the next Get asks the API server.
	stale map[string]struct{}
}

// written is the last write of a record: the object (nil after a delete).
type written[T record] struct {
	obj T
	rv  string // resourceVersion of obj ("" for a delete)
}

// isNil reports whether v is the nil record (T is a pointer type, but a type
// parameter only compares with its zero value).
func isNil[T record](v T) bool {
	var none T
	return v == none
}

// init makes s a store of provisioner's records of kind k; call Start before
// using it.
func (s *store[T]) init(k *kind[T], client dynamic.Interface, provisioner string) {
	s.kind, s.client, s.provisioner, s.written = k, client.Resource(k.gvr), provisioner, map[string]written[T]{}
	s.stale = map[string]struct{}{}
	selector := s.selector().String()
	s.informer = kube.NewInformer(client, s.client, &unstructured.Unstructured{}, 0,
		func(o *metav1.ListOptions) { o.LabelSelector = selector },
		cache.Indexers{k.index: func(obj any) ([]string, error) {
			if v, ok := obj.(T); ok && v.GetLabels()[v1alpha1.LabelVolumeHandle] != "" {
				return []string{v.GetLabels()[v1alpha1.LabelVolumeHandle]}, nil
			}
			return nil, nil
		}})
	// Convert once, when an object enters the cache, rather than on every read.
	_ = s.informer.SetTransform(func(obj any) (any, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return obj, nil
		}
		v, err := s.fromUnstructured(u)
		if err != nil {
			// A record pav cannot read must not stop the informer; it is
			// reported when someone asks for it (Get reads the API then).
			klog.ErrorS(err, "Unreadable "+k.name, "name", u.GetName())
			return obj, nil
		}
		v.SetManagedFields(nil)
		return v, nil
	})
	_, _ = s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.caughtUp,
		UpdateFunc: func(_, obj any) { s.caughtUp(obj) },
		DeleteFunc: func(obj any) {
			obj, _ = kube.Unwrap[any](obj)
			if m, err := s.metaOf(obj); err == nil {
				s.mu.Lock()
				if w, ok := s.written[m.GetName()]; ok && isNil(w.obj) {
					delete(s.written, m.GetName())
				}
				s.mu.Unlock()
			}
		},
	})
}

func (s *store[T]) selector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{v1alpha1.LabelVolumeProvisioner: s.provisioner})
}

// caughtUp forgets our write of a record once the cache holds that version.
func (s *store[T]) caughtUp(obj any) {
	m, err := s.metaOf(obj)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.written[m.GetName()]; ok && !isNil(w.obj) && w.rv == m.GetResourceVersion() {
		delete(s.written, m.GetName())
	}
}

func (s *store[T]) metaOf(obj any) (metav1.Object, error) {
	switch o := obj.(type) {
	case T:
		return o, nil
	case *unstructured.Unstructured:
		return o, nil
	}
	return nil, fmt.Errorf("unexpected %T", obj)
}

// Start runs the informer until ctx ends and waits for its first sync.
func (s *store[T]) Start(ctx context.Context) error {
	go s.informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		return fmt.Errorf("%s informer did not sync: %w", s.kind.name, context.Cause(ctx))
	}
	s.mu.Lock()
	s.synced = true
	s.mu.Unlock()
	return nil
}

// Synced reports whether the first sync is done (for readiness).
func (s *store[T]) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// Get returns the record of a CSI volume (or snapshot) name, or nil when there
// is none. A record of another provisioner under that name is an error naming
// it.
func (s *store[T]) Get(ctx context.Context, csiName string) (T, error) {
	var none T
	if !s.Synced() {
		return none, s.kind.notStarted
	}
	name := s.kind.recordName(csiName)
	// The overlay and the cache are read together, under s.mu, as in list.
	s.mu.Lock()
	w, ok := s.written[name]
	_, stale := s.stale[name]
	var cached T
	if !ok && !stale {
		if obj, exists, err := s.informer.GetIndexer().GetByKey(name); err == nil && exists {
			if v, isT := obj.(T); isT {
				cached = s.kind.deepCopy(v)
			}
		}
	}
	s.mu.Unlock()
	switch {
	case stale:
		// A write was just refused: the cache may still show what it was
		// refused against.
	case ok && isNil(w.obj):
		return none, nil
	case ok:
		return s.check(s.kind.deepCopy(w.obj), csiName)
	case !isNil(cached):
		return s.check(cached, csiName)
	}
	// Not cached: either there is none, or the cache lags (or it is another
	// provisioner's, which the informer does not see). Ask the API server.
	u, err := s.client.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		s.mu.Lock()
		delete(s.stale, name)
		s.mu.Unlock()
		return none, nil
	}
	if err != nil {
		return none, fmt.Errorf("reading %s %s: %w", s.kind.name, name, err)
	}
	var v T
	if stale {
		v, err = s.remember(u) // newer than the cache: serve it until the cache has it
	} else {
		v, err = s.fromUnstructured(u)
	}
	if err != nil {
		return none, err
	}
	return s.check(v, csiName)
}

// check refuses a record of another provisioner, or of another CSI name under
// the same (hashed) record name.
func (s *store[T]) check(v T, csiName string) (T, error) {
	var none T
	k := s.kind
	if p := *k.provisioner(v); p != s.provisioner || v.GetLabels()[v1alpha1.LabelVolumeProvisioner] != s.provisioner {
		return none, fmt.Errorf("%w: %s %s belongs to provisioner %q, not %q", k.otherOwner, k.name, v.GetName(), p, s.provisioner)
	}
	if n := k.csiName(v); n != csiName {
		return none, fmt.Errorf("%w: %s %s records %s %q, not %q (a hash collision)", k.otherOwner, k.name, v.GetName(), k.what, n, csiName)
	}
	return v, nil
}

// ours reports whether v is this provisioner's record of handle.
func (s *store[T]) ours(v T, handle string) bool {
	return s.kind.handle(v) == handle && *s.kind.provisioner(v) == s.provisioner
}

// ByHandle returns this provisioner's records whose status.handle is handle
// (normally zero or one), from the cache; with live, or when the cache has
// none, from the API server, so that a record just written is never missed.
func (s *store[T]) ByHandle(ctx context.Context, handle string, live bool) ([]T, error) {
	if !s.Synced() {
		return nil, s.kind.notStarted
	}
	label := v1alpha1.HandleLabel(handle)
	var out []T
	if !live {
		// Under s.mu, as list's.
		s.mu.Lock()
		objs, err := s.informer.GetIndexer().ByIndex(s.kind.index, label)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		seen := map[string]bool{}
		for _, obj := range objs {
			v, ok := obj.(T)
			if !ok {
				continue
			}
			seen[v.GetName()] = true
			if w, ok := s.written[v.GetName()]; ok {
				v = w.obj // newer, or nil: deleted
			}
			if !isNil(v) && s.ours(v, handle) {
				out = append(out, s.kind.deepCopy(v))
			}
		}
		for name, w := range s.written {
			if !seen[name] && !isNil(w.obj) && s.kind.handle(w.obj) == handle {
				out = append(out, s.kind.deepCopy(w.obj))
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
		return nil, fmt.Errorf("listing %ss of handle %q: %w", s.kind.name, handle, err)
	}
	for i := range list.Items {
		v, err := s.fromUnstructured(&list.Items[i])
		if err != nil {
			return nil, err
		}
		if s.ours(v, handle) {
			out = append(out, v)
		}
	}
	return out, nil
}

// list returns every record of this provisioner, from the cache with our own
// writes the cache has not caught up with, sorted by name. A record pav cannot
// read (a newer format) is an error, never left out.
func (s *store[T]) list() ([]T, error) {
	if !s.Synced() {
		return nil, s.kind.notStarted
	}
	// The cache is read under s.mu, with the overlay: the handlers forget a
	// write (under s.mu) once the cache holds it, so a cache read before
	// the lock could miss a record whose write is forgotten by the time the
	// overlay is read, or keep one whose deletion is.
	s.mu.Lock()
	defer s.mu.Unlock()
	byName := map[string]T{}
	for _, obj := range s.informer.GetIndexer().List() {
		if u, ok := obj.(*unstructured.Unstructured); ok {
			// The transform kept what it could not read: say why.
			if _, err := s.fromUnstructured(u); err != nil {
				return nil, err
			}
		}
		if v, ok := obj.(T); ok && *s.kind.provisioner(v) == s.provisioner {
			byName[v.GetName()] = v
		}
	}
	for name, w := range s.written {
		if isNil(w.obj) {
			delete(byName, name)
		} else {
			byName[name] = w.obj
		}
	}
	out := make([]T, 0, len(byName))
	for _, v := range byName {
		out = append(out, s.kind.deepCopy(v))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out, nil
}

// Create writes a new record (name, labels and spec.provisioner are set here).
// AlreadyExists is returned as is.
func (s *store[T]) Create(ctx context.Context, v T) (T, error) {
	var none T
	v = s.kind.deepCopy(v)
	v.SetName(s.kind.recordName(s.kind.csiName(v)))
	*s.kind.provisioner(v) = s.provisioner
	s.setLabels(v)
	u, err := s.toUnstructured(v)
	if err != nil {
		return none, err
	}
	got, err := s.client.Create(ctx, u, metav1.CreateOptions{FieldManager: fieldManager})
	if err != nil {
		return none, fmt.Errorf("creating %s %s: %w", s.kind.name, v.GetName(), err)
	}
	return s.remember(got)
}

// Update writes v, which must carry the resourceVersion it was read at: a
// Conflict (someone else wrote in between) is returned for the caller to retry
// from a fresh read.
func (s *store[T]) Update(ctx context.Context, v T) (T, error) {
	var none T
	if v.GetResourceVersion() == "" {
		return none, fmt.Errorf("updating %s %s: no resourceVersion (read it first)", s.kind.name, v.GetName())
	}
	v = s.kind.deepCopy(v)
	s.setLabels(v)
	u, err := s.toUnstructured(v)
	if err != nil {
		return none, err
	}
	got, err := s.client.Update(ctx, u, metav1.UpdateOptions{FieldManager: fieldManager})
	if err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			// What we remember, and maybe the cache, is stale: read
			// afresh from the API server next time.
			s.mu.Lock()
			delete(s.written, v.GetName())
			s.stale[v.GetName()] = struct{}{}
			s.mu.Unlock()
		}
		return none, fmt.Errorf("updating %s %s: %w", s.kind.name, v.GetName(), err)
	}
	return s.remember(got)
}

// Delete removes the record read as v (UID precondition); a record already
// gone is not an error.
func (s *store[T]) Delete(ctx context.Context, v T) error {
	opts := metav1.DeleteOptions{}
	if uid := v.GetUID(); uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := s.client.Delete(ctx, v.GetName(), opts)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s %s: %w", s.kind.name, v.GetName(), err)
	}
	s.mu.Lock()
	s.written[v.GetName()] = written[T]{}
	delete(s.stale, v.GetName())
	s.mu.Unlock()
	return nil
}

const fieldManager = "pav-driver"

// setLabels keeps the labels the informer and the handle index select on
// (and the kind's own).
func (s *store[T]) setLabels(v T) {
	l := v.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	if s.kind.moreLabels != nil {
		s.kind.moreLabels(v, l)
	}
	l[v1alpha1.LabelVolumeProvisioner] = s.provisioner
	if h := s.kind.handle(v); h != "" {
		l[v1alpha1.LabelVolumeHandle] = v1alpha1.HandleLabel(h)
	} else {
		delete(l, v1alpha1.LabelVolumeHandle)
	}
	v.SetLabels(l)
}

func (s *store[T]) remember(u *unstructured.Unstructured) (T, error) {
	v, err := s.fromUnstructured(u)
	if err != nil {
		var none T
		return none, err
	}
	v.SetManagedFields(nil)
	s.mu.Lock()
	s.written[v.GetName()] = written[T]{obj: s.kind.deepCopy(v), rv: v.GetResourceVersion()}
	delete(s.stale, v.GetName())
	s.mu.Unlock()
	return v, nil
}

func (s *store[T]) toUnstructured(v T) (*unstructured.Unstructured, error) {
	v.GetObjectKind().SetGroupVersionKind(v1alpha1.SchemeGroupVersion.WithKind(s.kind.name))
	// Every write is of this pav's format: fromUnstructured migrated what
	// it read.
	*s.kind.formatVersion(v) = s.kind.format.Current
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", s.kind.name, v.GetName(), err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// fromUnstructured reads a record, of this pav's format: an older one is
// migrated (in memory; the next write stores it), a newer one refused before
// anything of it is used, since its fields may mean what this pav does not
// know (compat.NewerError).
func (s *store[T]) fromUnstructured(u *unstructured.Unstructured) (T, error) {
	var none T
	v := s.kind.new()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, v); err != nil {
		return none, fmt.Errorf("%s %s is unreadable: %w", s.kind.name, u.GetName(), err)
	}
	if err := migrate(s.kind, v, u.GetName()); err != nil {
		return none, err
	}
	return v, nil
}

// migrate brings a record of kind k to k's current format, one version at a
// time, or refuses it (a newer format, or a version no pav writes).
func migrate[T record](k *kind[T], v T, name string) error {
	ver := k.formatVersion(v)
	if err := k.format.Check(name, *ver); err != nil {
		return err
	}
	for *ver < k.format.Current {
		step, ok := k.migrations[*ver]
		if !ok {
			return fmt.Errorf("%s %s has format version %d, which this pav (%s) cannot migrate: a pav bug", k.name, name, *ver, compat.Release)
		}
		step(v)
		*ver++
	}
	return nil
}
