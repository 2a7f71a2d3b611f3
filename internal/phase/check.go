package phase

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// isTemplate reports whether a value is a string that holds Jinja syntax, i.e. its
// value is only known once evaluated for a volume.
func isTemplate(v any) bool {
	s, ok := v.(string)
	return ok && templating.IsTemplate(s)
}

// holdsTemplate reports whether a template string stands anywhere in v.
func holdsTemplate(v any) bool {
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			if holdsTemplate(e) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if holdsTemplate(e) {
				return true
			}
		}
	default:
		return isTemplate(v)
	}
	return false
}

// Check finds what is wrong with a PavProvisioner before any volume is involved:
// provisioning modes, required phases, template syntax of every string, and every
// literal (non-template) value, with the same rules evaluation applies. The driver
// runs it on load and on every update; `pav render` runs it first.
func Check(p *v1alpha1.PavProvisioner) error {
	if err := checkName(p.Name); err != nil {
		return err
	}
	if len(p.Spec.ProvisioningModes) == 0 {
		return fieldErr("spec.provisioningModes", "must list at least one of Dynamic, Static, Ephemeral")
	}
	seen := map[v1alpha1.ProvisioningMode]bool{}
	for i, m := range p.Spec.ProvisioningModes {
		if !slices.Contains(v1alpha1.ProvisioningModes, m) {
			return fieldErr(fmt.Sprintf("spec.provisioningModes[%d]", i), "must be Dynamic, Static or Ephemeral, got %q", m)
		}
		if seen[m] {
			return fieldErr(fmt.Sprintf("spec.provisioningModes[%d]", i), "%q is listed twice", m)
		}
		seen[m] = true
	}
	dynamic := p.Spec.HasMode(v1alpha1.Dynamic)
	// Inline volumes (Ephemeral) are created and deleted too.
	if !dynamic && !p.Spec.HasMode(v1alpha1.Ephemeral) {
		for _, ph := range []v1alpha1.Phase{v1alpha1.PhaseCreation, v1alpha1.PhaseDeletion} {
			if v := p.Spec.Phase(ph); v != nil && v.Data != nil {
				return fieldErr("spec."+ph.Field(), "is only allowed when spec.provisioningModes contains Dynamic or Ephemeral")
			}
		}
	}
	// Snapshots, modifications and capacity concern dynamically provisioned
	// volumes only (static ones have no record; capacity is asked for
	// volumes yet to be created).
	for _, ph := range []v1alpha1.Phase{v1alpha1.PhaseSnapshotCreation, v1alpha1.PhaseSnapshotDeletion,
		v1alpha1.PhaseGroupSnapshotCreation, v1alpha1.PhaseGroupSnapshotDeletion, v1alpha1.PhaseModification, v1alpha1.PhaseCapacity} {
		if v := p.Spec.Phase(ph); v != nil && v.Data != nil && !dynamic {
			return fieldErr("spec."+ph.Field(), "is only allowed when spec.provisioningModes contains Dynamic")
		}
	}
	if v := p.Spec.VolumeCreation; dynamic && (v == nil || v.Data == nil) {
		return fieldErr("spec.volumeCreation", "is required when spec.provisioningModes contains Dynamic: give a capacity, a podTemplate that writes /pav/capacity, or both")
	}
	if v := p.Spec.VolumeStaging; v == nil || v.Data == nil {
		return fieldErr("spec.volumeStaging", "is required (with a podTemplate that makes the volume available at /pav/volume)")
	}
	for _, ph := range v1alpha1.Phases {
		v := p.Spec.Phase(ph)
		if v == nil || v.Data == nil {
			continue
		}
		path := "spec." + ph.Field()
		data := templating.Normalize(v.Data)
		if err := templating.Check(data, path); err != nil {
			return err
		}
		if isTemplate(data) {
			continue // the whole phase is one template: nothing literal to check
		}
		if err := checkLiteral(ph, data, path, dynamic); err != nil {
			return err
		}
	}
	_, err := FeaturesOf(&p.Spec)
	return err
}

func checkLiteral(ph v1alpha1.Phase, data any, path string, dynamic bool) error {
	// The CRD types volumeModification (it is never a template), so the API
	// server names an unknown field of it by its own path; so does this.
	if m, ok := data.(map[string]any); ok && ph == v1alpha1.PhaseModification {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if !slices.Contains(phaseFields[ph], k) {
				return fieldErr(path+"."+k, "unknown field (%s may only hold %s)", ph.Field(), strings.Join(phaseFields[ph], ", "))
			}
		}
	}
	m, err := asObject(data, path, phaseFields[ph])
	if err == nil {
		switch ph {
		case v1alpha1.PhaseValidation:
			_, err = decodeValidation(m, true)
		case v1alpha1.PhaseCreation:
			_, err = decodeCreation(m, true)
		case v1alpha1.PhaseExpansion:
			_, err = decodeExpansion(m, true)
		case v1alpha1.PhaseSnapshotCreation:
			_, err = decodeSnapshot(m, true)
		case v1alpha1.PhaseCapacity:
			_, err = decodeCapacity(m, true)
		case v1alpha1.PhaseModification:
			_, err = decodeModification(m, true)
		case v1alpha1.PhaseDeletion:
			if _, err = whenNamespaceGone(m["whenNamespaceGone"]); err == nil {
				_, err = decodePodPhase(m, path, false, true)
			}
		default:
			_, err = decodePodPhase(m, path, requiredPodTemplate(ph), true)
		}
	}
	if err != nil {
		return err
	}
	// With Dynamic, a literal volumeCreation must say how the capacity is known;
	// an absent volumeCreation can never produce a capacity either.
	if ph == v1alpha1.PhaseCreation && dynamic {
		m, _ := data.(map[string]any)
		if m["capacity"] == nil && m["podTemplate"] == nil {
			return fieldErr(path, "needs capacity or podTemplate when spec.provisioningModes contains Dynamic")
		}
	}
	return nil
}

// checkName checks metadata.name, which is also the CSI driver name, as a DNS
// label, naming the field and what makes a valid name.
func checkName(name string) error {
	const path = "metadata.name"
	switch {
	case name == "":
		return fieldErr(path, "is required (it is also the CSI driver name)")
	case len(name) > validation.DNS1123LabelMaxLength:
		return fieldErr(path, "must be at most %d characters (a DNS label), got %d", validation.DNS1123LabelMaxLength, len(name))
	case len(validation.IsDNS1123Label(name)) > 0:
		return fieldErr(path, "%q must be a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit", name)
	}
	return nil
}
