package manager

import (
	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/phase"
)

// sidecars are the names of the controller pod's containers a provisioner gets:
// the driver and external-provisioner always; external-resizer only when the
// driver serves ControllerExpandVolume (spec.volumeExpansion) and
// external-snapshotter only when it serves CreateSnapshot (spec.snapshotCreation).
// Both stock sidecars exit at start when the driver lacks the capability, so a
// provisioner without the phase would get a crash-looping controller pod.
//
// The features are those of the spec the drivers run with: the spec itself when
// it passes phase.Check, else the last valid one the manager saved (drivers fall
// back to it, see internal/provisioner), else none: an invalid provisioner's
// driver serves nothing, and a sidecar would only crash-loop.
func sidecars(p *v1alpha1.PavProvisioner) map[string]bool {
	want := map[string]bool{containerPav: true, containerProvision: true}
	spec := &p.Spec
	if phase.Check(p) != nil {
		if p.Status.LastValidSpec == nil {
			return want
		}
		saved := &v1alpha1.PavProvisioner{ObjectMeta: p.ObjectMeta, Spec: *p.Status.LastValidSpec}
		if phase.Check(saved) != nil {
			return want
		}
		spec = p.Status.LastValidSpec
	}
	f, err := phase.FeaturesOf(spec)
	if err != nil {
		return want
	}
	want[containerResizer] = f.Expansion
	want[containerSnapshot] = f.Snapshots
	return want
}
