package main

import (
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// With --node, render shows a node-local creation as it runs once the
// scheduler picked that node: the pod on it, the volume reachable from it.
func TestRenderSelectedNode(t *testing.T) {
	prov := write(t, "local.yaml", `apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata: {name: local}
spec:
  provisioningModes: [Dynamic]
  topology: {nodeLabels: [kubernetes.io/hostname]}
  volumeCreation:
    podTemplate:
      spec:
        nodeName: "{{ selectedNode }}"
        containers: [{name: c, image: busybox, command: [sh, -c, "echo {{ preferredTopology | tojson | tobash }}"]}]
  volumeStaging: {podTemplate: {spec: {containers: [{name: s, image: busybox}]}}}
`)
	pvc := write(t, "pvc.yaml", "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: c, namespace: apps, uid: u-1}\nspec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n")
	node := write(t, "node.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: worker-2, labels: {kubernetes.io/hostname: worker-2}}\n")
	unlabelled := write(t, "bare.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: bare}\n")

	code, out, errOut := runCmd(t, "", "render", "-f", prov, "--phase", "creation", "--pvc", pvc, "--node", node)
	if code != 0 {
		t.Fatalf("render: %d %s", code, errOut)
	}
	var got struct {
		Creation struct {
			AccessibleTopology []map[string]string `json:"accessibleTopology"`
		} `json:"creation"`
		Pod struct {
			Spec struct {
				NodeName   string `json:"nodeName"`
				Containers []struct {
					Command []string `json:"command"`
				} `json:"containers"`
			} `json:"spec"`
		} `json:"pod"`
	}
	if err := yaml.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Pod.Spec.NodeName != "worker-2" {
		t.Errorf("nodeName %q, want worker-2:\n%s", got.Pod.Spec.NodeName, out)
	}
	if want := []map[string]string{{"kubernetes.io/hostname": "worker-2"}}; !reflect.DeepEqual(got.Creation.AccessibleTopology, want) {
		t.Errorf("accessibleTopology %v, want %v", got.Creation.AccessibleTopology, want)
	}
	if cmd := strings.Join(got.Pod.Spec.Containers[0].Command, " "); !strings.Contains(cmd, `[{"kubernetes.io/hostname": "worker-2"}]`) {
		t.Errorf("command %q does not show the preferred topology", cmd)
	}

	code, _, errOut = runCmd(t, "", "render", "-f", prov, "--phase", "creation", "--pvc", pvc, "--node", unlabelled)
	if code == 0 || !strings.Contains(errOut, "--node: node bare has no label kubernetes.io/hostname") {
		t.Fatalf("a node without the label: %d %s", code, errOut)
	}
}

// render shows a node's capacity pod as the controller plugin runs it: pinned to the
// node's segment, under the name the driver gives it.
func TestRenderCapacity(t *testing.T) {
	node := write(t, "node.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: worker-2, labels: {kubernetes.io/hostname: worker-2}}\n")
	code, out, errOut := runCmd(t, "", "render", "-f", "../../examples/loop-block/provisioner.yaml", "--phase", "capacity", "--node", node)
	if code != 0 {
		t.Fatalf("render: %d %s", code, errOut)
	}
	var got struct {
		Capacity struct {
			Segment         map[string]string `json:"segment"`
			RefreshInterval string            `json:"refreshInterval"`
		} `json:"capacity"`
		Pod struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Affinity struct {
					NodeAffinity struct {
						Required struct {
							Terms []struct {
								MatchExpressions []struct {
									Key    string   `json:"key"`
									Values []string `json:"values"`
								} `json:"matchExpressions"`
							} `json:"nodeSelectorTerms"`
						} `json:"requiredDuringSchedulingIgnoredDuringExecution"`
					} `json:"nodeAffinity"`
				} `json:"affinity"`
			} `json:"spec"`
		} `json:"pod"`
	}
	if err := yaml.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"kubernetes.io/hostname": "worker-2"}; !reflect.DeepEqual(got.Capacity.Segment, want) || got.Capacity.RefreshInterval != "1m0s" {
		t.Errorf("capacity %+v", got.Capacity)
	}
	terms := got.Pod.Spec.Affinity.NodeAffinity.Required.Terms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != "kubernetes.io/hostname" ||
		!reflect.DeepEqual(terms[0].MatchExpressions[0].Values, []string{"worker-2"}) {
		t.Errorf("node affinity %+v, want kubernetes.io/hostname in [worker-2]:\n%s", terms, out)
	}
	if !strings.HasPrefix(got.Pod.Metadata.Name, "pav-loop-block-capacity-") {
		t.Errorf("pod name %q", got.Pod.Metadata.Name)
	}
	// A node-local provisioner measures a node: which one must be said.
	if code, _, errOut := runCmd(t, "", "render", "-f", "../../examples/loop-block/provisioner.yaml", "--phase", "capacity"); code == 0 || !strings.Contains(errOut, "--node") {
		t.Errorf("without --node: %d %s", code, errOut)
	}
}
