package records_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/records"
	"github.com/pods-as-volumes/pav/internal/records/recordstest"
)

func foreignSnapshot(t *testing.T, name, provisioner, handle string) runtime.Object {
	t.Helper()
	v := &v1alpha1.PavSnapshot{Spec: v1alpha1.PavSnapshotSpec{Provisioner: provisioner, SnapshotName: name, SourceVolumeID: "v"},
		Status: v1alpha1.PavSnapshotStatus{Phase: v1alpha1.SnapshotCreated, Handle: handle}}
	v.Name = v1alpha1.SnapshotRecordName(name)
	v.APIVersion, v.Kind = v1alpha1.SchemeGroupVersion.String(), v1alpha1.SnapshotKind
	v.Labels = map[string]string{v1alpha1.LabelVolumeProvisioner: provisioner, v1alpha1.LabelVolumeHandle: v1alpha1.HandleLabel(handle)}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(v)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func names(l []*v1alpha1.PavSnapshot) string {
	var out []string
	for _, v := range l {
		out = append(out, v.Spec.SnapshotName+"="+v.Status.Handle)
	}
	return strings.Join(out, " ")
}

// TestSnapshotLifecycle: the snapshot store reads its own writes at once
// (List, Get, ByHandle), never lists another provisioner's records, labels
// what it writes, and a deleted record is never resurrected by a lagging
// cache.
func TestSnapshotLifecycle(t *testing.T) {
	ctx := context.Background()
	c := recordstest.NewClient(foreignSnapshot(t, "s-other", "other", "h-1"))
	bg, cancel := context.WithCancel(ctx)
	defer cancel()
	s := records.NewSnapshots(c, "hello")
	if err := s.Start(bg); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 300) // not a DNS name: hashed
	var created []*v1alpha1.PavSnapshot
	for _, n := range []string{"s2", "s1", long} {
		v, err := s.Create(ctx, &v1alpha1.PavSnapshot{Spec: v1alpha1.PavSnapshotSpec{SnapshotName: n, SourceVolumeID: "vol-1"},
			Status: v1alpha1.PavSnapshotStatus{Phase: v1alpha1.SnapshotCreated, Handle: "h-" + n[:2]}})
		if err != nil {
			t.Fatal(err)
		}
		created = append(created, v)
	}
	for _, tc := range []struct {
		name string
		got  func() (string, error)
		want string
	}{
		{"List: sorted by record name, ours only", func() (string, error) { l, err := s.List(); return names(l), err }, long + "=h-xx s1=h-s1 s2=h-s2"}, // s-<hash> < s1
		{"ByHandle from the cache", func() (string, error) { l, err := s.ByHandle(ctx, "h-s1", false); return names(l), err }, "s1=h-s1"},
		{"ByHandle live", func() (string, error) { l, err := s.ByHandle(ctx, "h-s2", true); return names(l), err }, "s2=h-s2"},
		{"another provisioner's handle", func() (string, error) { l, err := s.ByHandle(ctx, "h-1", true); return names(l), err }, ""},
		{"Get of a hashed name", func() (string, error) { v, err := s.Get(ctx, long); return v.Name, err }, v1alpha1.SnapshotRecordName(long)},
	} {
		if got, err := tc.got(); err != nil || got != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if l := created[0].Labels; l[v1alpha1.LabelVolumeProvisioner] != "hello" || l[v1alpha1.LabelVolumeHandle] != v1alpha1.HandleLabel("h-s2") ||
		l[v1alpha1.LabelSnapshotSourceVolume] != v1alpha1.HandleLabel("vol-1") {
		t.Errorf("labels %v", l)
	}
	if _, err := s.Get(ctx, "s-other"); !errors.Is(err, records.ErrOtherSnapshotOwner) {
		t.Errorf("Get of another provisioner's record: %v", err)
	}
	if err := s.Delete(ctx, created[0]); err != nil {
		t.Fatal(err)
	}
	if l, err := s.List(); err != nil || names(l) != long+"=h-xx s1=h-s1" {
		t.Errorf("List after Delete: %q, %v", names(l), err)
	}
	if v, err := s.Get(ctx, "s2"); v != nil || err != nil {
		t.Errorf("Get after Delete: %v, %v", v, err)
	}
}
