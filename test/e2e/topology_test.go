//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
)

// nodeLocal is a node-local provisioner (docs/beyond-pav.md, "Topology"): a volume is a
// directory on the node WaitForFirstConsumer selected, made there by the
// creation pod (nodeName: "{{ selectedNode }}"), staged from there and
// removed there by the deletion pod. The creation pod writes the node it ran
// on into the volume.
func nodeLocal(name string) string {
	return fmt.Sprintf(`apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: %[1]s
spec:
  provisioningModes: [Dynamic]
  topology:
    nodeLabels: [kubernetes.io/hostname]
  volumeCreation:
    capacity: 1Mi
    podTemplate:
      spec:
        nodeName: "{{ selectedNode }}"
        containers:
          - name: create
            image: %[2]s
            imagePullPolicy: IfNotPresent
            env: [{name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]
            command: [sh, -c, "mkdir -p /host/{{ defaultHandle }} && echo $NODE > /host/{{ defaultHandle }}/node"]
            volumeMounts: [{name: host, mountPath: /host}]
        volumes: [{name: host, hostPath: {path: %[3]s/local, type: DirectoryOrCreate}}]
  volumeDeletion:
    podTemplate:
      spec:
        nodeName: "{{ selectedNode }}"
        containers:
          - name: delete
            image: %[2]s
            imagePullPolicy: IfNotPresent
            command: [sh, -c, "rm -rf /host/{{ handle }}"]
            volumeMounts: [{name: host, mountPath: /host}]
        volumes: [{name: host, hostPath: {path: %[3]s/local, type: DirectoryOrCreate}}]
  volumeStaging:
    podTemplate:
      spec:
        containers:
          - name: stage
            image: %[2]s
            imagePullPolicy: IfNotPresent
            command: [sh, -c, "mkdir -p /pav/volume && cp /host/{{ handle }}/node /pav/volume/node"]
            volumeMounts: [{name: host, mountPath: /host}]
        volumes: [{name: host, hostPath: {path: %[3]s/local, type: DirectoryOrCreate}}]
`, name, busybox, markers)
}

func TestNodeLocalTopology(t *testing.T) {
	inLane(t, laneOwn)
	e := newEnv(t)
	name := "e2e-local-" + strings.ToLower(rand.String(4))
	e.newProvisioner(nodeLocal(name))

	// The scheduler picks the node of the first pod that uses the claim: pin
	// that pod to a node, so that the test knows which one.
	nodes, err := client.CoreV1().Nodes().List(e.ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) == 0 {
		t.Fatalf("no nodes: %v", err)
	}
	node := nodes.Items[len(nodes.Items)-1].Name

	sc := e.ns + "-" + strings.ToLower(rand.String(4))
	kubectlApply(t, fmt.Sprintf("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: %s}\nprovisioner: %s\nvolumeBindingMode: WaitForFirstConsumer\n", sc, name))
	t.Cleanup(func() { _, _ = kubectlErr("delete", "storageclass", sc, "--ignore-not-found") })
	e.claim("local", sc, claimOpts{})

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "reader", Namespace: e.ns}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr(int64(1)),
		NodeSelector: map[string]string{"kubernetes.io/hostname": node},
		Containers: []corev1.Container{{Name: "client", Image: busybox, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"sh", "-c", "cat /data/node"}, VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/data"}}}},
		Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "local"}}}},
	}}
	if _, err := client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := e.waitBound("local")

	// The PV is reachable from the selected node only.
	var hosts []string
	if a := pv.Spec.NodeAffinity; a != nil && a.Required != nil {
		for _, term := range a.Required.NodeSelectorTerms {
			for _, r := range term.MatchExpressions {
				if r.Key == "kubernetes.io/hostname" && r.Operator == corev1.NodeSelectorOpIn {
					hosts = append(hosts, r.Values...)
				}
			}
		}
	}
	if !slices.Equal(hosts, []string{node}) {
		t.Fatalf("PV %s node affinity %+v, want kubernetes.io/hostname In [%s]", pv.Name, pv.Spec.NodeAffinity, node)
	}

	// The creation pod ran on that node, and the volume staged there holds
	// what it wrote.
	e.waitPodPhase("reader", corev1.PodSucceeded)
	if got := strings.TrimSpace(e.logs("reader")); got != node {
		t.Fatalf("the creation pod ran on %q, want the selected node %q", got, node)
	}
	handle := pv.Spec.CSI.VolumeHandle
	if _, ok := marker("local", filepath.Join(handle, "node")); !ok && len(nodes.Items) == 1 {
		// The test runs on the node of a one-node cluster: the directory is here.
		t.Errorf("no %s/local/%s/node on the node", markers, handle)
	}

	// The deletion pod runs on the same node (the recorded request) and
	// removes the directory.
	e.deletePod("reader")
	e.deleteClaim("local")
	e.waitPVGone(pv.Name)
	if _, err := os.Stat(filepath.Join(markers, "local", handle)); err == nil && len(nodes.Items) == 1 {
		t.Errorf("the deletion pod left %s/local/%s", markers, handle)
	}
	deleteProvisioner(t, name)
}
