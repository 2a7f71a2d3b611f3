package phase

import (
	"context"
	"strings"
	"testing"
)

// TestCapacityContext: storageCapacity sees segment and params, and nothing
// of a volume (there is none yet).
func TestCapacityContext(t *testing.T) {
	p := load(t, `  storageCapacity:
    refreshInterval: 30s
    podTemplate:
      spec:
        containers:
          - name: c
            image: busybox
            command: [sh, -c, "pool {{ params.pool }} on {{ segment['kubernetes.io/hostname'] or 'anywhere' }} ({{ segment | length }} keys)"]
`)
	for _, tc := range []struct {
		name    string
		segment map[string]string
		want    string
	}{
		{"a node's segment", map[string]string{"kubernetes.io/hostname": "vm-2"}, "pool fast on vm-2 (1 keys)"},
		{"no segment", map[string]string{}, "pool fast on anywhere (0 keys)"},
		{"nil segment", nil, "pool fast on anywhere (0 keys)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewEvaluator(nil).Capacity(context.Background(), p, CapacityVars(tc.segment, map[string]string{"pool": "fast"}))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.PodTemplate.Spec.Containers[0].Command[2]; got != tc.want {
				t.Fatalf("command = %q, want %q", got, tc.want)
			}
			if c.RefreshInterval.String() != "30s" {
				t.Fatalf("refresh interval %v", c.RefreshInterval)
			}
		})
	}

	// A volume's variables are not there: the template fails, naming the field.
	p = load(t, `  storageCapacity:
    podTemplate: {spec: {containers: [{name: c, image: busybox, command: [sh, -c, "{{ pvc.metadata.name }}"]}]}}
`)
	_, err := NewEvaluator(nil).Capacity(context.Background(), p, CapacityVars(nil, nil))
	if err == nil || !strings.Contains(err.Error(), "spec.storageCapacity") {
		t.Fatalf("got %v, want an error naming spec.storageCapacity", err)
	}
}
