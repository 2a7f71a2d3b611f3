package phase

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

func TestTopologyContexts(t *testing.T) {
	wffc := &v1alpha1.TopologyRequirement{
		Requisite: []map[string]string{{HostnameKey: "n2", "zone": "a"}, {HostnameKey: "n1", "zone": "a"}},
		Preferred: []map[string]string{{HostnameKey: "n1", "zone": "a"}, {HostnameKey: "n2", "zone": "a"}},
	}
	zonal := &v1alpha1.TopologyRequirement{Requisite: []map[string]string{{"zone": "b"}}, Preferred: []map[string]string{{"zone": "b"}}}
	for _, c := range []struct {
		name               string
		topo               *v1alpha1.TopologyRequirement
		requisite, preferd []any
		selected           any
	}{
		{"no requirements", nil, []any{}, []any{}, nil},
		{"WaitForFirstConsumer", wffc,
			[]any{map[string]any{HostnameKey: "n2", "zone": "a"}, map[string]any{HostnameKey: "n1", "zone": "a"}},
			[]any{map[string]any{HostnameKey: "n1", "zone": "a"}, map[string]any{HostnameKey: "n2", "zone": "a"}}, "n1"},
		{"zones only: no node", zonal, []any{map[string]any{"zone": "b"}}, []any{map[string]any{"zone": "b"}}, nil},
		{"requisite only: no node", &v1alpha1.TopologyRequirement{Requisite: []map[string]string{{HostnameKey: "n3"}}},
			[]any{map[string]any{HostnameKey: "n3"}}, []any{}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := Request{VolumeMode: "Filesystem", MinCapacity: 1, Params: map[string]string{}, Topology: c.topo}
			val, err := ValidationVars(r, Objects{}, "")
			if err != nil {
				t.Fatal(err)
			}
			cre, err := CreationVars(r, Objects{}, "pvc-1")
			if err != nil {
				t.Fatal(err)
			}
			for name, vars := range map[string]map[string]any{"validation": val, "creation": cre} {
				if !reflect.DeepEqual(vars["requisiteTopology"], c.requisite) || !reflect.DeepEqual(vars["preferredTopology"], c.preferd) || vars["selectedNode"] != c.selected {
					t.Errorf("%s context: requisiteTopology %v, preferredTopology %v, selectedNode %v; want %v, %v, %v", name,
						vars["requisiteTopology"], vars["preferredTopology"], vars["selectedNode"], c.requisite, c.preferd, c.selected)
				}
				if _, ok := vars["selectedNode"]; !ok {
					t.Errorf("%s context: selectedNode must be null, not absent", name)
				}
			}
		})
	}
}

// A node-local creation pod places itself with nodeName: "{{ selectedNode }}".
func TestCreationPodOnTheSelectedNode(t *testing.T) {
	p := load(t, `  provisioningModes: [Dynamic]
  topology: {nodeLabels: [kubernetes.io/hostname]}
  volumeCreation:
    podTemplate:
      spec:
        nodeName: "{{ selectedNode }}"
        containers: [{name: c, image: busybox}]
  volumeStaging:
    podTemplate: {spec: {containers: [{name: s, image: busybox}]}}
`)
	r := Request{VolumeMode: "Filesystem", MinCapacity: 1, Params: map[string]string{},
		Topology: &v1alpha1.TopologyRequirement{Preferred: []map[string]string{{HostnameKey: "worker-2"}}}}
	vars, err := CreationVars(r, Objects{}, "pvc-1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewEvaluator(nil).Creation(context.Background(), p, vars)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.PodTemplate.Spec.NodeName; got != "worker-2" {
		t.Fatalf("nodeName = %q, want worker-2", got)
	}
}

func TestNodeSegment(t *testing.T) {
	labels := map[string]string{HostnameKey: "n1", "topology.kubernetes.io/zone": "a", "other": "x"}
	seg, err := NodeSegment("n1", labels, []string{"topology.kubernetes.io/zone", HostnameKey})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{HostnameKey: "n1", "topology.kubernetes.io/zone": "a"}; !reflect.DeepEqual(seg, want) {
		t.Fatalf("segment %v, want %v", seg, want)
	}
	_, err = NodeSegment("n1", labels, []string{HostnameKey, "example.com/rack"})
	if err == nil || !strings.Contains(err.Error(), "node n1 has no label example.com/rack") || !strings.Contains(err.Error(), "spec.topology.nodeLabels") {
		t.Fatalf("a missing label: got %v", err)
	}
}

func TestAccessibleTopologyPrecedence(t *testing.T) {
	str := func(s string) *string { return &s }
	keys := []string{"zone"}
	req := &v1alpha1.TopologyRequirement{
		// As external-provisioner asks: every preferred segment is requisite.
		Requisite: []map[string]string{{"zone": "p", HostnameKey: "n1"}, {"zone": "q", HostnameKey: "n2"}, {"zone": "r", HostnameKey: "n9"}},
		Preferred: []map[string]string{{"zone": "p", HostnameKey: "n1"}, {"zone": "q", HostnameKey: "n2"}},
	}
	configured := []map[string]string{{"zone": "r"}}
	for _, c := range []struct {
		name       string
		reported   *string
		configured []map[string]string
		keys       []string
		req        *v1alpha1.TopologyRequirement
		want       []map[string]string
		err        string
	}{
		{"/pav/topology wins (YAML)", str("- {zone: q}\n- {zone: w}\n"), configured, keys, req, []map[string]string{{"zone": "q"}, {"zone": "w"}}, ""},
		{"/pav/topology outside every requisite segment", str("- {zone: x}\n"), configured, keys, req, nil, "reachable from none of the requisite topology segments"},
		{"/pav/topology on another key only", str("- {rack: a}\n"), configured, keys, req, nil, "reachable from none of the requisite topology segments"},
		{"accessibleTopology outside every requisite segment", nil, []map[string]string{{"zone": "x"}}, keys, req, nil, "reachable from none of the requisite topology segments"},
		{"no requisite: anything goes", str("- {zone: x}\n"), nil, keys, &v1alpha1.TopologyRequirement{}, []map[string]string{{"zone": "x"}}, ""},
		{"YAML 1.1 booleans are not strings", str("- {zone: yes}\n"), nil, keys, req, nil, "/pav/topology[0].zone: must be a string, got boolean"},
		{"parsed as a template's yaml output: y is a string", str("- {zone: y, rack: n}\n"), nil, keys, &v1alpha1.TopologyRequirement{}, []map[string]string{{"zone": "y", "rack": "n"}}, ""},
		{"/pav/topology as one JSON segment", str(`{"zone": "x"}`), nil, nil, nil, []map[string]string{{"zone": "x"}}, ""},
		{"/pav/topology empty list: nowhere said, taken as written", str("[]"), configured, keys, req, []map[string]string{}, ""},
		{"invalid /pav/topology", str("zone: [a]"), configured, keys, req, nil, "/pav/topology[0].zone: must be a string"},
		{"/pav/topology not YAML", str("{zone"), nil, keys, req, nil, "invalid /pav/topology"},
		{"then volumeCreation.accessibleTopology", nil, configured, keys, req, configured, ""},
		{"then the first preferred segment, on the topology keys", nil, nil, keys, req, []map[string]string{{"zone": "p"}}, ""},
		{"then the first requisite segment", nil, nil, keys, &v1alpha1.TopologyRequirement{Requisite: req.Requisite[2:]}, []map[string]string{{"zone": "r"}}, ""},
		{"node-local", nil, nil, []string{HostnameKey}, req, []map[string]string{{HostnameKey: "n1"}}, ""},
		{"no topology keys: everywhere", nil, nil, nil, req, nil, ""},
		{"no requirements: everywhere", nil, nil, keys, nil, nil, ""},
		{"the request lacks the keys: everywhere", nil, nil, []string{"rack"}, req, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := AccessibleTopology(c.reported, c.configured, c.keys, c.req)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("want an error containing %q, got %v (%v)", c.err, err, got)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %v, %v; want %v", got, err, c.want)
			}
		})
	}
}
