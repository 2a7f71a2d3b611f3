package manager

import (
	"slices"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestEphemeralCSIDriver: a provisioner with Ephemeral gets a CSIDriver
// with volumeLifecycleModes [Persistent, Ephemeral] and podInfoOnMount, one
// without keeps [Persistent] and no pod information. volumeLifecycleModes is
// immutable: a change of mode replaces the CSIDriver (deleted, then created
// anew), never updates it, which the API server would refuse.
func TestEphemeralCSIDriver(t *testing.T) {
	want := func(f *fixture, modes []storagev1.VolumeLifecycleMode, podInfo bool) {
		t.Helper()
		d := f.csiDriver("p1")
		if !slices.Equal(d.Spec.VolumeLifecycleModes, modes) || (d.Spec.PodInfoOnMount != nil && *d.Spec.PodInfoOnMount) != podInfo {
			t.Fatalf("CSIDriver modes %v podInfoOnMount %v, want %v %v", d.Spec.VolumeLifecycleModes, d.Spec.PodInfoOnMount, modes, podInfo)
		}
	}
	persistent := []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}
	both := []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}
	setModes := func(modes ...any) func(u *unstructured.Unstructured) {
		return func(u *unstructured.Unstructured) {
			u.Object["spec"].(map[string]any)["provisioningModes"] = modes
			u.SetGeneration(u.GetGeneration() + 1)
		}
	}

	f := newFixture(t, Settings{})
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	want(f, persistent, false)
	f.drainEvents()

	f.edit("p1", setModes("Dynamic", "Ephemeral"))
	mustReconcile(t, f, "p1")
	if !slices.Contains(f.lastWrites, "delete csidrivers p1") || slices.Contains(f.lastWrites, "apply csidrivers p1") {
		t.Fatalf("writes %v: want the CSIDriver deleted, not applied", f.lastWrites)
	}
	if ev := f.drainEvents(); !hasEvent(ev, "Normal Replacing", "Deleting CSIDriver p1 to create it anew: its volumeLifecycleModes, which cannot be updated, change from [Persistent] to [Persistent Ephemeral]") {
		t.Errorf("events %v", ev)
	}
	mustReconcile(t, f, "p1")
	if !slices.Contains(f.lastWrites, "apply csidrivers p1") {
		t.Fatalf("writes %v: want the CSIDriver created", f.lastWrites)
	}
	want(f, both, true)
	mustReconcile(t, f, "p1")
	if slices.Contains(f.lastWrites, "apply csidrivers p1") || slices.Contains(f.lastWrites, "delete csidrivers p1") {
		t.Fatalf("writes %v: nothing to do", f.lastWrites)
	}

	// Ephemeral alone: Persistent stays (PVs of the driver keep working).
	f.edit("p1", setModes("Ephemeral"))
	mustReconcile(t, f, "p1")
	want(f, both, true)

	// Back to persistent volumes only.
	f.edit("p1", setModes("Dynamic", "Static"))
	mustReconcile(t, f, "p1")
	mustReconcile(t, f, "p1")
	want(f, persistent, false)
}
