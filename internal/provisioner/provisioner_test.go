package provisioner

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

const good = `apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata: {name: p1}
spec:
  provisioningModes: [Static]
  volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}
`

func TestLoad(t *testing.T) {
	if _, err := Load([]byte(good)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ in, want string }{
		{strings.Replace(good, "provisioningModes", "provisioningMode", 1), `unknown field "spec.provisioningMode"`},
		{strings.Replace(good, "kind: PavProvisioner", "kind: Pod", 1), `kind is "Pod"`},
		{strings.Replace(good, "v1alpha1", "v1", 1), `apiVersion is "pav.albertofaria.github.io/v1"`},
		{"a: [", "not YAML"},
	} {
		if _, err := Load([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load: %v, want %q", err, tc.want)
		}
	}
}

func object(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	m := map[string]any{}
	if err := yaml.Unmarshal([]byte(y), &m); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWatch follows one object through create, a broken edit, a fix and
// deletion, and checks the Valid condition written to its status.
func TestWatch(t *testing.T) {
	gvr := v1alpha1.GroupVersionResource
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "PavProvisionerList"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := NewWatch(client, "p1", true)
	if _, err := w.Get(false); status.Code(err) != codes.Unavailable {
		t.Fatalf("before sync: %v", err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Get(false); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing object: %v", err)
	}
	res := client.Resource(gvr)
	if _, err := res.Create(ctx, object(t, good), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the provisioner to load", func() bool { _, err := w.Get(true); return err == nil })
	waitFor(t, "status Valid=True", func() bool {
		u, _ := res.Get(ctx, "p1", metav1.GetOptions{})
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		return len(conds) == 1 && conds[0].(map[string]any)["status"] == "True"
	})

	broken := object(t, strings.Replace(good, "image: b", "image: \"{{ oops\"", 1))
	u, _ := res.Get(ctx, "p1", metav1.GetOptions{})
	broken.SetResourceVersion(u.GetResourceVersion())
	if _, err := res.Update(ctx, broken, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the broken edit", func() bool {
		_, err := w.Get(false)
		return status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), "spec.volumeStaging.podTemplate.spec.containers[0].image")
	})
	waitFor(t, "status Valid=False", func() bool {
		u, _ := res.Get(ctx, "p1", metav1.GetOptions{})
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		return len(conds) == 1 && conds[0].(map[string]any)["status"] == "False"
	})

	deleting := object(t, good)
	u, _ = res.Get(ctx, "p1", metav1.GetOptions{})
	deleting.SetResourceVersion(u.GetResourceVersion())
	now := metav1.Now()
	deleting.SetDeletionTimestamp(&now)
	if _, err := res.Update(ctx, deleting, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deletion to be seen", func() bool {
		_, errNew := w.Get(true)
		_, errOld := w.Get(false)
		return status.Code(errNew) == codes.FailedPrecondition && strings.Contains(errNew.Error(), "being deleted") && errOld == nil
	})
	if err := res.Delete(ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the object to be gone", func() bool { _, err := w.Get(false); return err != nil && strings.Contains(err.Error(), "was deleted") })
}
