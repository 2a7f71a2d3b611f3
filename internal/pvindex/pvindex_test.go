package pvindex

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

func pv(name, driver, handle string) runtime.Object {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
			CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle},
		}},
	}
}

func TestByHandle(t *testing.T) {
	client := fake.NewClientset(
		pv("mine", "pav-x", "h1"),
		pv("other-driver", "other", "h1"),
		pv("theirs-only", "other", "h3"),
		pv("copy-a", "pav-x", "h2"),
		pv("copy-b", "pav-x", "h2"),
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "not-csi"}},
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	x := New(client, "pav-x")
	if err := x.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		handle, wantPV, wantErr string
	}{
		{"h1", "mine", ""},               // another driver's PV with the same handle is not ours
		{"h3", "", ""},                   // only another driver's
		{"nope", "", ""},                 // none
		{"h2", "", "have volume handle"}, // two of ours: ambiguous
	} {
		got, err := x.ByHandle(tc.handle)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: err %v, want %q", tc.handle, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.handle, err)
		case tc.wantPV == "" && got != nil:
			t.Errorf("%s: got PV %s, want none", tc.handle, got.Name)
		case tc.wantPV != "" && (got == nil || got.Name != tc.wantPV || got.ManagedFields != nil):
			t.Errorf("%s: got %+v, want PV %s without managedFields", tc.handle, got, tc.wantPV)
		}
	}
}
