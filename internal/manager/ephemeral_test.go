package manager

import (
	"slices"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
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

// TestInlineVolumeHoldsDeletion: an inline volume's PavVolume (written by a
// node plugin, labelled with its provisioner like any other) holds its
// PavProvisioner's deletion until the pod is gone and the volume deleted.
func TestInlineVolumeHoldsDeletion(t *testing.T) {
	const id = "csi-0d4f6b3b2f0e7c1a9b8e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a"
	f := newFixture(t, Settings{})
	f.record(id, "p1", v1alpha1.VolumeCreated)
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	f.markDeleted("p1")
	if err := f.reconcile("p1"); err != nil {
		t.Fatal(err)
	}
	if term := f.condition("p1", v1alpha1.ConditionTerminating); term.Reason != "WaitingForVolumes" || !strings.Contains(term.Message, "PavVolume "+id+" (Created)") {
		t.Fatalf("Terminating = %s: %s", term.Reason, term.Message)
	}
	if slices.Contains(f.lastWrites, "delete csidrivers p1") {
		t.Fatalf("the drivers went while an inline volume needs them: %v", f.lastWrites)
	}
}
