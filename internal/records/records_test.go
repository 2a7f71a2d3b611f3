package records_test

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
)

func start(t *testing.T, c *dynamicfake.FakeDynamicClient, provisioner string) *records.Store {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := records.New(c, provisioner)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func newVolume(name string) *v1alpha1.PavVolume {
	return &v1alpha1.PavVolume{Spec: v1alpha1.PavVolumeSpec{VolumeName: name, RequestedVolumeMode: "Filesystem", DefaultHandle: name},
		Status: v1alpha1.PavVolumeStatus{Phase: v1alpha1.VolumeValidating}}
}

// foreign is a record of another provisioner, stored before the store starts.
func foreign(t *testing.T, name, provisioner, handle string) runtime.Object {
	t.Helper()
	v := newVolume(name)
	v.Name = v1alpha1.VolumeRecordName(name)
	v.APIVersion, v.Kind = v1alpha1.SchemeGroupVersion.String(), v1alpha1.VolumeKind
	v.Spec.Provisioner = provisioner
	v.Labels = map[string]string{v1alpha1.LabelVolumeProvisioner: provisioner, v1alpha1.LabelVolumeHandle: v1alpha1.HandleLabel(handle)}
	v.Status.Handle = handle
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	c := recordstest.NewClient(foreign(t, "pvc-other", "other", "h-1"))
	s := start(t, c, "hello")

	if v, err := s.Get(ctx, "pvc-1"); v != nil || err != nil {
		t.Fatalf("Get of nothing: %v %v", v, err)
	}
	v, err := s.Create(ctx, newVolume("pvc-1"))
	if err != nil {
		t.Fatal(err)
	}
	if v.UID == "" || v.ResourceVersion == "" || v.Spec.Provisioner != "hello" || v.Labels[v1alpha1.LabelVolumeProvisioner] != "hello" {
		t.Fatalf("created %+v", v.ObjectMeta)
	}
	// Read right after the write, whether or not the informer has caught up.
	got, err := s.Get(ctx, "pvc-1")
	if err != nil || got == nil || got.ResourceVersion != v.ResourceVersion {
		t.Fatalf("Get after Create: %+v %v", got, err)
	}
	if _, err := s.Create(ctx, newVolume("pvc-1")); !apierrors.IsAlreadyExists(err) {
		t.Errorf("second Create: %v", err)
	}

	// A transition that learns the handle: found by it at once.
	got.Status.Phase, got.Status.Handle, got.Status.Capacity = v1alpha1.VolumeCreated, "h-1", 42
	upd, err := s.Update(ctx, got)
	if err != nil {
		t.Fatal(err)
	}
	if upd.Labels[v1alpha1.LabelVolumeHandle] != v1alpha1.HandleLabel("h-1") {
		t.Errorf("labels %v", upd.Labels)
	}
	for _, live := range []bool{false, true} {
		// The other provisioner's volume of the same handle is not ours.
		vs, err := s.ByHandle(ctx, "h-1", live)
		if err != nil || len(vs) != 1 || vs[0].Spec.VolumeName != "pvc-1" {
			t.Errorf("ByHandle(live=%v) = %v, %v", live, vs, err)
		}
	}
	// A write from a stale read is refused.
	if _, err := s.Update(ctx, got); !apierrors.IsConflict(err) {
		t.Errorf("stale Update: %v", err)
	}
	fresh, err := s.Get(ctx, "pvc-1")
	if err != nil || fresh.ResourceVersion != upd.ResourceVersion || fresh.Status.Handle != "h-1" {
		t.Fatalf("Get after a conflict: %+v %v", fresh, err)
	}

	// Another process (a restarted driver) sees it through its informer.
	other := start(t, c, "hello")
	if vs, err := other.ByHandle(ctx, "h-1", false); err != nil || len(vs) != 1 {
		t.Errorf("restarted ByHandle = %v, %v", vs, err)
	}

	// Delete checks the UID it read.
	stale := fresh.DeepCopy()
	stale.UID = "not-it"
	if err := s.Delete(ctx, stale); !apierrors.IsConflict(err) {
		t.Errorf("Delete with another UID: %v", err)
	}
	if err := s.Delete(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get(ctx, "pvc-1"); v != nil || err != nil {
		t.Errorf("Get after Delete: %v %v", v, err)
	}
	if vs, err := s.ByHandle(ctx, "h-1", false); err != nil || len(vs) != 0 {
		t.Errorf("ByHandle after Delete: %v %v", vs, err)
	}
	if err := s.Delete(ctx, fresh); err != nil {
		t.Errorf("deleting a deleted record: %v", err)
	}
	// The restarted store catches up through its informer.
	deadline := time.Now().Add(5 * time.Second)
	for {
		vs, err := other.ByHandle(ctx, "h-1", false)
		if err == nil && len(vs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the other store still sees %v (%v)", vs, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOtherOwners(t *testing.T) {
	ctx := context.Background()
	c := recordstest.NewClient(foreign(t, "pvc-2", "other", "h-2"))
	s := start(t, c, "hello")
	for _, tc := range []struct {
		name, volumeName string
	}{
		{"another provisioner's record of that name", "pvc-2"},
	} {
		if _, err := s.Get(ctx, tc.volumeName); !errors.Is(err, records.ErrOtherOwner) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	// Same hashed name, other volume name: a collision is refused, not shared.
	long := "Not-A-DNS-Name/x"
	v, err := s.Create(ctx, newVolume(long))
	if err != nil {
		t.Fatal(err)
	}
	v.Spec.VolumeName = "something else"
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Tracker().Update(v1alpha1.VolumeGroupVersionResource, &unstructured.Unstructured{Object: u}, ""); err != nil {
		t.Fatal(err)
	}
	s2 := start(t, c, "hello")
	if _, err := s2.Get(ctx, long); !errors.Is(err, records.ErrOtherOwner) {
		t.Errorf("a record of another volume name under the same record name: %v", err)
	}
}

func TestNotStarted(t *testing.T) {
	s := records.New(recordstest.NewClient(), "hello")
	if _, err := s.Get(context.Background(), "x"); !errors.Is(err, records.ErrNotStarted) {
		t.Errorf("Get: %v", err)
	}
	if _, err := s.ByHandle(context.Background(), "x", true); !errors.Is(err, records.ErrNotStarted) {
		t.Errorf("ByHandle: %v", err)
	}
}

func TestUpdateNeedsResourceVersion(t *testing.T) {
	s := start(t, recordstest.NewClient(), "hello")
	v := newVolume("pvc-3")
	v.Name = "pvc-3"
	if _, err := s.Update(context.Background(), v); err == nil {
		t.Error("an Update without a resourceVersion was sent")
	}
}

// TestCacheLag: with an informer that never hears of the store's own writes
// (the worst lag), reads still see every write the store made.
func TestCacheLag(t *testing.T) {
	ctx := context.Background()
	c := recordstest.NewClient()
	if _, err := start(t, c, "hello").Create(ctx, newVolume("pvc-lag")); err != nil {
		t.Fatal(err)
	}
	// From now on watches never deliver anything: a store started now
	// caches the record as it is, and never hears of its own writes.
	c.PrependWatchReactor(v1alpha1.VolumeResource, func(k8stesting.Action) (bool, watch.Interface, error) {
		return true, watch.NewFake(), nil
	})
	s := start(t, c, "hello")
	v, err := s.Get(ctx, "pvc-lag")
	if err != nil || v == nil {
		t.Fatalf("Get = %v, %v", v, err)
	}
	v.Status.Phase, v.Status.Handle = v1alpha1.VolumeCreated, "h-lag"
	upd, err := s.Update(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "pvc-lag")
	if err != nil || got == nil || got.ResourceVersion != upd.ResourceVersion {
		t.Fatalf("Get after Update = %+v, %v; want resourceVersion %s", got, err, upd.ResourceVersion)
	}
	if vs, err := s.ByHandle(ctx, "h-lag", false); err != nil || len(vs) != 1 {
		t.Fatalf("ByHandle after Update = %v, %v", vs, err)
	}
	if err := s.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "pvc-lag"); got != nil || err != nil {
		t.Fatalf("Get after Delete = %+v, %v", got, err)
	}
	if vs, err := s.ByHandle(ctx, "h-lag", false); err != nil || len(vs) != 0 {
		t.Fatalf("ByHandle after Delete = %v, %v", vs, err)
	}
}
