package provisioner

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
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

func newFake() (*dynamicfake.FakeDynamicClient, dynamic.ResourceInterface) {
	gvr := v1alpha1.GroupVersionResource
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "PavProvisionerList"})
	return client, client.Resource(gvr)
}

// withGeneration sets metadata.generation (the fake API server does not).
func withGeneration(u *unstructured.Unstructured, g int64) *unstructured.Unstructured {
	u.SetGeneration(g)
	return u
}

const broken = `image: "{{ oops"`

// image is the staging container's image of a spec, to tell versions apart.
func image(p *v1alpha1.PavProvisioner) string {
	c := p.Spec.VolumeStaging.Data.(map[string]any)["podTemplate"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0]
	return c.(map[string]any)["image"].(string)
}

// TestWatch follows one object through create, a broken edit (new volumes are
// refused, deletion and unstaging keep the last valid spec), deletion and a fix.
func TestWatch(t *testing.T) {
	client, res := newFake()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := NewWatch(client, "p1")
	if _, err := w.Get(false); status.Code(err) != codes.Unavailable {
		t.Fatalf("before sync: %v", err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Get(false); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing object: %v", err)
	}
	if _, err := res.Create(ctx, withGeneration(object(t, good), 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the provisioner to load", func() bool { _, err := w.Get(true); return err == nil })
	for _, a := range client.Actions() {
		if v := a.GetVerb(); v != "list" && v != "watch" && v != "create" { // the test's create
			t.Errorf("the driver wrote to the API (%s %s): only the manager writes status", v, a.GetSubresource())
		}
	}

	update := func(y string, gen int64, deleting bool) {
		t.Helper()
		u := withGeneration(object(t, y), gen)
		cur, _ := res.Get(ctx, "p1", metav1.GetOptions{})
		u.SetResourceVersion(cur.GetResourceVersion())
		if deleting {
			now := metav1.Now()
			u.SetDeletionTimestamp(&now)
		}
		if _, err := res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	update(strings.Replace(good, "image: b", broken, 1), 2, false)
	waitFor(t, "the broken edit", func() bool {
		_, err := w.Get(true)
		return status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), "spec.volumeStaging.podTemplate.spec.containers[0].image")
	})
	if p, err := w.Get(false); err != nil || image(p) != "b" || p.Generation != 1 {
		t.Fatalf("deletion/unstaging during a broken edit: %v, %v; want generation 1", p, err)
	}

	update(strings.Replace(good, "image: b", broken, 1), 2, true)
	waitFor(t, "the deletion to be seen", func() bool {
		p, err := w.Get(false)
		return err == nil && p.DeletionTimestamp != nil
	})
	if p, err := w.Get(false); err != nil || image(p) != "b" {
		t.Fatalf("deletion/unstaging of a deleted, broken provisioner: %v, %v", p, err)
	}
	if _, err := w.Get(true); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "being deleted") {
		t.Fatalf("new volumes on a deleted, broken provisioner: %v, want \"being deleted\" (fixing the spec would not help)", err)
	}

	update(strings.Replace(good, "image: b", "image: c", 1), 3, true)
	waitFor(t, "the fix", func() bool { p, err := w.Get(false); return err == nil && image(p) == "c" })
	if _, err := w.Get(true); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "being deleted") {
		t.Fatalf("new volumes on a provisioner being deleted: %v", err)
	}
	if err := res.Delete(ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the object to be gone", func() bool { _, err := w.Get(false); return err != nil && strings.Contains(err.Error(), "was deleted") })
}

// TestWatchUsesSavedSpec: a driver that starts (or restarts) while the spec is
// invalid falls back, for deletion and unstaging only, to the copy the manager
// saved in status.lastValidSpec, unless it saw a newer valid version itself.
func TestWatchUsesSavedSpec(t *testing.T) {
	saved := func(img string, gen int) string {
		return fmt.Sprintf("status:\n  lastValidGeneration: %d\n  lastValidSpec:\n    provisioningModes: [Static]\n    volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: %q}]}}}\n", gen, img)
	}
	invalid := strings.Replace(good, "image: b", broken, 1)
	for _, tc := range []struct {
		name      string
		seen      string // a version the driver saw before (generation 2), if any
		obj       string // the version at generation 4
		wantImage string // what deletion and unstaging get; "" = an error
	}{
		{name: "saved copy after a restart", obj: invalid + saved("saved", 3), wantImage: "saved"},
		{name: "no saved copy", obj: invalid},
		{name: "saved copy is invalid too", obj: invalid + saved("{{ nope", 3)},
		{name: "own newer version wins over an older copy", seen: good, obj: invalid + saved("saved", 1), wantImage: "b"},
		{name: "newer copy wins over an older own version", seen: good, obj: invalid + saved("saved", 3), wantImage: "saved"},
		{name: "valid spec wins over a copy", obj: strings.Replace(good, "image: b", "image: live", 1) + saved("saved", 3), wantImage: "live"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, res := newFake()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := NewWatch(client, "p1")
			if err := w.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if tc.seen != "" {
				if _, err := res.Create(ctx, withGeneration(object(t, tc.seen), 2), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the first version", func() bool { _, err := w.Get(true); return err == nil })
				u := withGeneration(object(t, tc.obj), 4)
				cur, _ := res.Get(ctx, "p1", metav1.GetOptions{})
				u.SetResourceVersion(cur.GetResourceVersion())
				if _, err := res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the update", func() bool { _, err := w.Get(true); return err != nil || tc.wantImage == "live" })
			} else {
				if _, err := res.Create(ctx, withGeneration(object(t, tc.obj), 4), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the object", func() bool { _, err := w.Get(false); return !strings.Contains(fmt.Sprint(err), "does not exist") })
			}
			p, err := w.Get(false)
			switch {
			case tc.wantImage == "" && err == nil:
				t.Fatalf("deletion/unstaging got generation %d, want an error", p.Generation)
			case tc.wantImage == "" && status.Code(err) != codes.FailedPrecondition:
				t.Fatalf("error %v, want FailedPrecondition", err)
			case tc.wantImage != "" && err != nil:
				t.Fatalf("deletion/unstaging: %v", err)
			case tc.wantImage != "" && image(p) != tc.wantImage:
				t.Fatalf("deletion/unstaging got image %q, want %q", image(p), tc.wantImage)
			}
			if _, err := w.Get(true); (err == nil) != (tc.wantImage == "live") {
				t.Fatalf("new volumes: %v", err)
			}
		})
	}
}
