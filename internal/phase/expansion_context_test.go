package phase

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestExpansionContexts: volumeExpansion sees the deletion context (capacity =
// the current capacity) plus the request; volumeNodeExpansion the staging
// context (capacity = the new capacity) plus previousCapacity; and both
// evaluate with them.
func TestExpansionContexts(t *testing.T) {
	limit := int64(300)
	for _, tc := range []struct {
		name  string
		limit *int64
		want  string
	}{
		{"with a limit", &limit, "grow h from 100 to 200 limit 300 default d blue"},
		{"without a limit", nil, "grow h from 100 to 200 limit none default d blue"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars, err := ExpansionVars(Request{Params: map[string]string{"color": "blue"}}, Objects{}, "d", "h", 100, 200, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			p := load(t, `  volumeExpansion:
    capacity: "{{ requestedCapacity + 1 }}"
    podTemplate:
      spec:
        containers:
          - name: c
            image: busybox
            command: [sh, -c, "grow {{ handle }} from {{ capacity }} to {{ requestedCapacity }} limit {{ requestedCapacityLimit or 'none' }} default {{ defaultHandle }} {{ params.color }}"]
`)
			c, err := NewEvaluator(nil).Expansion(context.Background(), p, vars)
			if err != nil {
				t.Fatal(err)
			}
			if got := c.PodTemplate.Spec.Containers[0].Command[2]; got != tc.want {
				t.Fatalf("command = %q, want %q", got, tc.want)
			}
			if c.Capacity == nil || *c.Capacity != 201 || !c.Online {
				t.Fatalf("config %+v", c)
			}
		})
	}

	vars, err := NodeExpansionVars(Staged{VolumeMode: corev1.PersistentVolumeBlock, Capacity: 200, Handle: "h"}, Objects{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	p := load(t, `  volumeNodeExpansion:
    podTemplate:
      spec:
        containers: [{name: c, image: busybox, command: [sh, -c, "{{ volumeMode }} {{ handle }} {{ previousCapacity }} -> {{ capacity }}"]}]
`)
	c, err := NewEvaluator(nil).NodeExpansion(context.Background(), p, vars)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.PodTemplate.Spec.Containers[0].Command[2], "Block h 100 -> 200"; got != want {
		t.Fatalf("command = %q, want %q", got, want)
	}
}
