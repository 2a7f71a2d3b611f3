package records_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/compat"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
)

func groupRecord(t *testing.T, name, provisioner, handle string, format int) runtime.Object {
	t.Helper()
	v := &v1alpha1.PavGroupSnapshot{Spec: v1alpha1.PavGroupSnapshotSpec{Provisioner: provisioner, GroupSnapshotName: name, FormatVersion: format,
		Members: []v1alpha1.GroupSnapshotMember{{SnapshotName: name + "-0", SourceVolumeID: "v"}}},
		Status: v1alpha1.PavGroupSnapshotStatus{Phase: v1alpha1.SnapshotCreated, Handle: handle}}
	v.Name = v1alpha1.GroupSnapshotRecordName(name)
	v.APIVersion, v.Kind = v1alpha1.SchemeGroupVersion.String(), v1alpha1.GroupSnapshotKind
	v.Labels = map[string]string{v1alpha1.LabelVolumeProvisioner: provisioner, v1alpha1.LabelVolumeHandle: v1alpha1.HandleLabel(handle)}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// TestGroupSnapshotStore: the group store reads its own writes at once (Get
// by CSI name, ByHandle), never another provisioner's records, labels what it
// writes with the current format, and refuses a record of a newer format.
func TestGroupSnapshotStore(t *testing.T) {
	ctx := context.Background()
	defer setRelease("v9.9.9-test")()
	c := recordstest.NewClient(groupRecord(t, "g-other", "other", "h-1", 1), groupRecord(t, "g-newer", "hello", "h-2", 2))
	bg, cancel := context.WithCancel(ctx)
	defer cancel()
	s := records.NewGroupSnapshots(c, "hello")
	if err := s.Start(bg); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 300) // not a DNS name: hashed
	g, err := s.Create(ctx, &v1alpha1.PavGroupSnapshot{Spec: v1alpha1.PavGroupSnapshotSpec{GroupSnapshotName: long,
		Members: []v1alpha1.GroupSnapshotMember{{SnapshotName: long + "-0", SourceVolumeID: "v"}}},
		Status: v1alpha1.PavGroupSnapshotStatus{Phase: v1alpha1.SnapshotCreating, Handle: "h-g"}})
	if err != nil {
		t.Fatal(err)
	}
	if g.Name != v1alpha1.GroupSnapshotRecordName(long) || !strings.HasPrefix(g.Name, "g-") || g.Spec.Provisioner != "hello" ||
		g.Spec.FormatVersion != records.GroupSnapshotFormat.Current || g.Labels[v1alpha1.LabelVolumeHandle] != v1alpha1.HandleLabel("h-g") {
		t.Fatalf("created %+v", g)
	}
	if got, err := s.Get(ctx, long); err != nil || got == nil || got.Status.Handle != "h-g" {
		t.Fatalf("Get: %v, %v", got, err)
	}
	for _, live := range []bool{false, true} {
		if l, err := s.ByHandle(ctx, "h-g", live); err != nil || len(l) != 1 {
			t.Fatalf("ByHandle(live %v): %v, %v", live, l, err)
		}
		if l, err := s.ByHandle(ctx, "h-1", live); err != nil || len(l) != 0 {
			t.Fatalf("ByHandle of another provisioner's group (live %v): %v, %v", live, l, err)
		}
	}
	if _, err := s.Get(ctx, "g-other"); !errors.Is(err, records.ErrOtherGroupSnapshotOwner) {
		t.Errorf("Get of another provisioner's record: %v", err)
	}
	if _, err := s.Get(ctx, "g-newer"); !errors.Is(err, compat.ErrNewerFormat) || !strings.Contains(err.Error(), "PavGroupSnapshot g-newer has format version 2") {
		t.Errorf("Get of a newer record: %v", err)
	}
	if err := s.Delete(ctx, g); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, long); got != nil || err != nil {
		t.Errorf("Get after Delete: %v, %v", got, err)
	}
}
