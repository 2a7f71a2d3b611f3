package phase

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/pods-as-volumes/pav/internal/templating"
)

// TestMutableParamsInContexts: every volume context has mutableParams ({}
// without any), so that one template may read it in any phase: validation
// and creation see CreateVolume's, deletion and expansion the request's
// (the controller gives them the current ones), staging, unstaging and node
// expansion the staged volume's (its VolumeAttributesClass's).
func TestMutableParamsInContexts(t *testing.T) {
	with := map[string]string{"readAheadKiB": "256"}
	r := Request{VolumeMode: corev1.PersistentVolumeFilesystem, Params: map[string]string{}, MutableParams: with}
	limit := int64(3)
	build := map[string]func(r Request) (templating.Vars, error){
		"validation": func(r Request) (templating.Vars, error) { return ValidationVars(r, Objects{}, "") },
		"creation":   func(r Request) (templating.Vars, error) { return CreationVars(r, Objects{}, "d") },
		"deletion":   func(r Request) (templating.Vars, error) { return DeletionVars(r, Objects{}, "d", "h", 1) },
		"expansion":  func(r Request) (templating.Vars, error) { return ExpansionVars(r, Objects{}, "d", "h", 1, 2, &limit) },
		"staging": func(r Request) (templating.Vars, error) {
			return StagingVars(Staged{VolumeMode: r.VolumeMode, Capacity: 1, Handle: "h", MutableParams: r.MutableParams}, Objects{})
		},
		"node expansion": func(r Request) (templating.Vars, error) {
			return NodeExpansionVars(Staged{VolumeMode: r.VolumeMode, Capacity: 2, Handle: "h", MutableParams: r.MutableParams}, Objects{}, 1)
		},
	}
	for name, f := range build {
		t.Run(name, func(t *testing.T) {
			v, err := f(r)
			if err != nil {
				t.Fatal(err)
			}
			if m, ok := v["mutableParams"].(map[string]any); !ok || len(m) != 1 || m["readAheadKiB"] != "256" {
				t.Errorf("mutableParams = %#v, want {readAheadKiB: \"256\"}", v["mutableParams"])
			}
			none := r
			none.MutableParams = nil
			if v, err = f(none); err != nil {
				t.Fatal(err)
			}
			if m, ok := v["mutableParams"].(map[string]any); !ok || len(m) != 0 {
				t.Errorf("without any: mutableParams = %#v, want {}", v["mutableParams"])
			}
		})
	}
}

// TestModificationContext: volumeModification sees the deletion context with
// mutableParams the new set and previousMutableParams the current one, and
// evaluates with it; mutableParameters stays the literal list.
func TestModificationContext(t *testing.T) {
	p := load(t, `  provisioningModes: [Dynamic]
  volumeModification:
    mutableParameters: [readAheadKiB, tier]
    podTemplate:
      spec:
        nodeName: "{{ handle.split('.')[1] }}"
        containers:
          - name: c
            image: busybox
            command: [sh, -c, "set {{ handle }} {{ capacity }} {{ params.color }} {{ defaultHandle }} ra={{ mutableParams.readAheadKiB }} tier={{ mutableParams.tier | default('default') }} was={{ previousMutableParams.readAheadKiB | default('none') }}/{{ previousMutableParams.tier | default('none') }}"]
`)
	for _, tc := range []struct {
		name       string
		prev, next map[string]string
		want       string
	}{
		{"from none", nil, map[string]string{"readAheadKiB": "512"}, "set v.node-1 100 blue d ra=512 tier=default was=none/none"},
		{"replace: a key the new set lacks goes back to the default", map[string]string{"readAheadKiB": "128", "tier": "gold"}, map[string]string{"readAheadKiB": "512"},
			"set v.node-1 100 blue d ra=512 tier=default was=128/gold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars, err := ModificationVars(Request{Params: map[string]string{"color": "blue"}, MutableParams: tc.prev}, Objects{}, "d", "v.node-1", 100, tc.next)
			if err != nil {
				t.Fatal(err)
			}
			c, err := NewEvaluator(nil).Modification(context.Background(), p, vars)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.PodTemplate.Spec.Containers[0].Command[2]; got != tc.want {
				t.Fatalf("command = %q, want %q", got, tc.want)
			}
			if c.PodTemplate.Spec.NodeName != "node-1" || strings.Join(c.MutableParameters, ",") != "readAheadKiB,tier" {
				t.Fatalf("config %+v", c)
			}
		})
	}

	// Without a podTemplate: the keys only; absent: nil.
	c, err := NewEvaluator(nil).Modification(context.Background(), load(t, "  volumeModification: {mutableParameters: [tier]}\n"), templating.Vars{})
	if err != nil || c == nil || c.PodTemplate != nil || strings.Join(c.MutableParameters, ",") != "tier" {
		t.Fatalf("record-only modification: %+v, %v", c, err)
	}
	if c, err := NewEvaluator(nil).Modification(context.Background(), load(t, "  volumeStaging: {}\n"), templating.Vars{}); c != nil || err != nil {
		t.Fatalf("no volumeModification: %+v, %v", c, err)
	}
	// An undefined variable names the field.
	_, err = NewEvaluator(nil).Modification(context.Background(), load(t, `  volumeModification: {mutableParameters: [tier], podTemplate: {spec: {containers: [{name: c, image: "{{ mutableParams.nope }}"}]}}}`+"\n"),
		templating.Vars{"mutableParams": map[string]any{}})
	if err == nil || !strings.Contains(err.Error(), "spec.volumeModification.podTemplate") {
		t.Fatalf("undefined variable: %v", err)
	}
}
