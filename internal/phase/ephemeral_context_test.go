package phase

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// TestEphemeralContexts: every volume context says `ephemeral` (false for a
// persistent volume, which has no `pod`); an inline volume's contexts have
// `pod` and no claim objects, and templates branch on them.
func TestEphemeralContexts(t *testing.T) {
	pod := &v1alpha1.EphemeralPod{Namespace: "team-a", Name: "web-0", UID: "u-1", ServiceAccountName: "sa"}
	persistent := Request{VolumeMode: corev1.PersistentVolumeFilesystem, MinCapacity: 1, Params: map[string]string{"k": "v"}}
	inline := persistent
	inline.Pod = pod

	contexts := func(r Request, s Staged) map[string]func() (templating.Vars, error) {
		return map[string]func() (templating.Vars, error){
			"validation": func() (templating.Vars, error) { return ValidationVars(r, Objects{}, "") },
			"creation":   func() (templating.Vars, error) { return CreationVars(r, Objects{}, "d") },
			"deletion":   func() (templating.Vars, error) { return DeletionVars(r, Objects{}, "d", "h", 1) },
			"expansion":  func() (templating.Vars, error) { return ExpansionVars(r, Objects{}, "d", "h", 1, 2, nil) },
			"staging":    func() (templating.Vars, error) { return StagingVars(s, Objects{}) },
			"node expansion": func() (templating.Vars, error) {
				return NodeExpansionVars(s, Objects{}, 1)
			},
		}
	}
	for what, c := range map[string]struct {
		r    Request
		s    Staged
		want bool
	}{
		"persistent": {persistent, Staged{Handle: "h"}, false},
		"inline":     {inline, Staged{Handle: "h", Pod: pod}, true},
	} {
		for name, vars := range contexts(c.r, c.s) {
			t.Run(what+"/"+name, func(t *testing.T) {
				v, err := vars()
				if err != nil {
					t.Fatal(err)
				}
				if v["ephemeral"] != c.want {
					t.Errorf("ephemeral = %v, want %v", v["ephemeral"], c.want)
				}
				p, hasPod := v["pod"].(map[string]any)
				if hasPod != c.want {
					t.Fatalf("pod = %v", v["pod"])
				}
				if hasPod && (p["namespace"] != "team-a" || p["name"] != "web-0" || p["uid"] != "u-1" || p["serviceAccountName"] != "sa") {
					t.Errorf("pod = %v", p)
				}
				for _, k := range []string{"pvc", "sc", "pv"} {
					if _, ok := v[k]; ok {
						t.Errorf("%s in the context", k)
					}
				}
			})
		}
	}

	// A template that branches on ephemeral: the pod's name where there is
	// no claim (pod is undefined for persistent volumes).
	p := load(t, `  volumeStaging:
    podTemplate:
      spec:
        containers: [{name: c, image: busybox, command: ["{{ pod.namespace ~ '/' ~ pod.name if ephemeral else 'claim' }}"]}]
`)
	for _, c := range []struct {
		s    Staged
		want string
	}{{Staged{Handle: "h"}, "claim"}, {Staged{Handle: "h", Pod: pod}, "team-a/web-0"}} {
		vars, err := StagingVars(c.s, Objects{})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := NewEvaluator(nil).Staging(context.Background(), p, vars)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.PodTemplate.Spec.Containers[0].Command[0]; got != c.want {
			t.Errorf("command = %q, want %q", got, c.want)
		}
	}
}
