//go:build e2e

package e2e

// Storage capacity tracking and volume limits (issue 35; docs/beyond-pav.md, "Capacity"
// and "Volume limits"): what users see of them.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/pods-as-volumes/pav/internal/phase"
	"github.com/pods-as-volumes/pav/podrunner"
)

// capacityRoot is where the capacity tests' creation pods record the nodes they ran on:
// outside /var/lib, so that every node writes the same file.
const capacityRoot = "/srv/pav-e2e-capacity"

// poolProvisioner is a node-local provisioner whose capacity pod reports, for each node,
// what the test wrote to /var/lib/NAME/free on that node (the node's own disk), refreshed
// every 10 s; its creation pod runs on the selected node and records that node in
// capacityRoot/NAME/creations. The volumes themselves are empty directories of the staging pod.
func poolProvisioner(name string) string {
	return fmt.Sprintf(`apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: %[1]s
spec:
  provisioningModes: [Dynamic]
  topology:
    nodeLabels: [kubernetes.io/hostname]
  storageCapacity:
    refreshInterval: 10s
    podTemplate:
      spec:
        containers:
          - name: capacity
            image: %[2]s
            imagePullPolicy: IfNotPresent
            command: [sh, -c, "cat /pool/free > /pav/capacity"]
            volumeMounts: [{name: pool, mountPath: /pool}]
        volumes: [{name: pool, hostPath: {path: /var/lib/%[1]s, type: DirectoryOrCreate}}]
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
            command: [sh, -c, "echo $NODE >> /runs/creations"]
            volumeMounts: [{name: runs, mountPath: /runs}]
        volumes: [{name: runs, hostPath: {path: %[3]s/%[1]s, type: DirectoryOrCreate}}]
  volumeStaging:
    podTemplate:
      spec:
        containers: [{name: stage, image: %[2]s, imagePullPolicy: IfNotPresent, command: [sh, -c, "mkdir -p /pav/volume"]}]
`, name, busybox, capacityRoot)
}

// setFree writes what node's capacity pod of a poolProvisioner reports.
func setFree(t *testing.T, provisioner, node, free string) {
	t.Helper()
	dir := onNode(node, filepath.Join("/var/lib", provisioner))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "free"), []byte(free+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// classOf makes a StorageClass of a provisioner with a binding mode, deleted with the test.
func (e *env) classOf(provisioner string, mode storagev1.VolumeBindingMode) string {
	e.t.Helper()
	name := e.ns + "-" + strings.ToLower(rand.String(4))
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, VolumeBindingMode: &mode}
	if _, err := client.StorageV1().StorageClasses().Create(e.ctx, sc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = client.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// capacities are the CSIStorageCapacity objects of a StorageClass, by the node their
// segment names (kubernetes.io/hostname), and those that name no node under "".
func capacities(ctx context.Context, sc string) (map[string][]storagev1.CSIStorageCapacity, error) {
	l, err := client.StorageV1().CSIStorageCapacities("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string][]storagev1.CSIStorageCapacity{}
	for _, c := range l.Items {
		if c.StorageClassName != sc {
			continue
		}
		node := ""
		if c.NodeTopology != nil {
			node = c.NodeTopology.MatchLabels[hostnameKey]
		}
		out[node] = append(out[node], c)
	}
	return out, nil
}

// waitCapacities waits until a StorageClass has exactly one CSIStorageCapacity per node,
// each as want says of it, and returns them by node.
func (e *env) waitCapacities(sc string, nodes []string, want func(node string, c storagev1.CSIStorageCapacity) error) map[string]storagev1.CSIStorageCapacity {
	e.t.Helper()
	var got map[string]storagev1.CSIStorageCapacity
	e.poll("a CSIStorageCapacity of StorageClass "+sc+" per node", func() (bool, error) {
		all, err := capacities(e.ctx, sc)
		if err != nil {
			return false, err
		}
		got = map[string]storagev1.CSIStorageCapacity{}
		for node, cs := range all {
			if !slices.Contains(nodes, node) || len(cs) != 1 {
				return false, fmt.Errorf("node %q has %d objects (nodes: %v)", node, len(cs), nodes)
			}
			got[node] = cs[0]
		}
		for _, n := range nodes {
			c, ok := got[n]
			if !ok {
				return false, fmt.Errorf("none for node %s", n)
			}
			if want != nil {
				if err := want(n, c); err != nil {
					return false, err
				}
			}
		}
		return true, nil
	})
	return got
}

// capacityIs wants each node's object to say free[node] (and nothing else, no maximum).
func capacityIs(free map[string]string) func(string, storagev1.CSIStorageCapacity) error {
	return func(node string, c storagev1.CSIStorageCapacity) error {
		want := resource.MustParse(free[node])
		if c.Capacity == nil || c.Capacity.Cmp(want) != 0 || c.MaximumVolumeSize != nil {
			return fmt.Errorf("node %s: capacity %v, maximum %v, want %s", node, c.Capacity, c.MaximumVolumeSize, want.String())
		}
		return nil
	}
}

// preferringPod runs a client of claim that may run on any of nodes, and prefers the
// first: without capacity tracking the scheduler puts it there.
func (e *env) preferringPod(name, claim string, nodes []string) {
	e.t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr(int64(1)),
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostnameKey, Operator: corev1.NodeSelectorOpIn, Values: nodes}}}}},
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 100, Preference: corev1.NodeSelectorTerm{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostnameKey, Operator: corev1.NodeSelectorOpIn, Values: nodes[:1]}}}}},
		}},
		Containers: []corev1.Container{{Name: "client", Image: busybox, ImagePullPolicy: corev1.PullIfNotPresent,
			Command: []string{"sh", "-c", "sleep 3600"}, VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/data"}}}},
		Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
	}}
	if _, err := client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) podNode(name string) string {
	e.t.Helper()
	p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p.Spec.NodeName
}

// noEvent fails if an object of the test's namespace got an event of that reason.
func (e *env) noEvent(kind, name, reason string) {
	e.t.Helper()
	evs, err := client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, ev := range evs.Items {
		if ev.InvolvedObject.Kind == kind && ev.Reason == reason {
			e.t.Errorf("%s %s got a %s event: %s", kind, name, reason, ev.Message)
		}
	}
}

// A full node gets no new volume and no failed creation pod: the scheduler picks another
// node. On three nodes, node X (which the client prefers) reports 0 bytes free and the others
// 1Gi: the client runs elsewhere, its volume is made there, and no creation pod ever ran on
// X. Then X reports room again: its CSIStorageCapacity says so within a refresh, and the
// next claim's client runs on X.
func TestFullNodeGetsNoVolume(t *testing.T) {
	inLane(t, laneOwn)
	nodes := clusterNodes(t, 3)
	e := newEnv(t)
	name := "e2e-cap-" + strings.ToLower(rand.String(4))
	full, other := nodes[1], nodes[2]
	free := map[string]string{nodes[0]: "1Gi", full: "0", other: "1Gi"}
	// Removed once the provisioner is gone (cleanups run last in, first out).
	t.Cleanup(func() {
		for _, n := range nodes {
			_ = os.RemoveAll(onNode(n, filepath.Join("/var/lib", name)))
		}
		_ = os.RemoveAll(filepath.Join(capacityRoot, name))
		_ = os.Remove(capacityRoot)
	})
	for n, f := range free {
		setFree(t, name, n, f)
	}
	e.newProvisioner(poolProvisioner(name))
	e.waitDriverOnNodes(name, nodes)
	sc := e.classOf(name, storagev1.VolumeBindingWaitForFirstConsumer)
	byNode := e.waitCapacities(sc, nodes, capacityIs(free))
	for n, c := range byNode {
		if len(c.OwnerReferences) != 1 || c.OwnerReferences[0].Kind != "StatefulSet" || c.Namespace != "pav" {
			t.Errorf("node %s: CSIStorageCapacity %s/%s owned by %+v, want pav's controller StatefulSet in pav", n, c.Namespace, c.Name, c.OwnerReferences)
		}
	}

	// The client may run on the full node or the other one, and prefers the full one.
	e.claim("first", sc, claimOpts{})
	e.preferringPod("first", "first", []string{full, other})
	e.waitPodRunning("first")
	if got := e.podNode("first"); got != other {
		t.Fatalf("the client runs on %s, want %s: %s reports no free space", got, other, full)
	}
	pv := e.waitBound("first")
	if got := pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values; !slices.Equal(got, []string{other}) {
		t.Errorf("the volume is on %v, want %s", got, other)
	}
	runs := func() []string {
		b, _ := os.ReadFile(filepath.Join(capacityRoot, name, "creations"))
		return strings.Fields(string(b))
	}
	if got := runs(); !slices.Equal(got, []string{other}) {
		t.Errorf("creation pods ran on %v, want one, on %s", got, other)
	}
	e.noEvent("PersistentVolumeClaim", "first", "ProvisioningFailed")

	// Room on the full node: its object says so at its next refresh (10 s), and the next
	// claim's client goes there.
	free[full] = "2Gi"
	setFree(t, name, full, free[full])
	start := time.Now()
	e.waitCapacities(sc, nodes, capacityIs(free))
	t.Logf("node %s's CSIStorageCapacity shows its new free space after %v", full, time.Since(start).Round(time.Second))
	e.claim("second", sc, claimOpts{})
	e.preferringPod("second", "second", []string{full, other})
	e.waitPodRunning("second")
	if got := e.podNode("second"); got != full {
		t.Errorf("the second client runs on %s, want %s, which has room again", got, full)
	}
	if got := runs(); !slices.Equal(got, []string{other, full}) {
		t.Errorf("creation pods ran on %v, want %s then %s", got, other, full)
	}
	e.noEvent("PersistentVolumeClaim", "second", "ProvisioningFailed")

	// The StorageClass goes: so do its objects.
	if err := client.StorageV1().StorageClasses().Delete(e.ctx, sc, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("the CSIStorageCapacity objects of "+sc+" gone", func() (bool, error) {
		all, err := capacities(e.ctx, sc)
		return err == nil && len(all) == 0, err
	})
}

// limitedProvisioner takes at most two volumes per node; its volumes are empty directories.
func limitedProvisioner(name string) string {
	return fmt.Sprintf(`apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: %[1]s
spec:
  provisioningModes: [Dynamic]
  maxVolumesPerNode: 2
  volumeCreation: {capacity: 1Mi}
  volumeStaging:
    podTemplate:
      spec:
        containers: [{name: stage, image: %[2]s, imagePullPolicy: IfNotPresent, command: [sh, -c, "mkdir -p /pav/volume"]}]
`, name, busybox)
}

// A node at its limit takes no more: with maxVolumesPerNode 2, the node's CSINode says 2,
// a client of two volumes runs, and a client of a third volume on that node stays Pending
// with the scheduler's reason until the first goes.
func TestNodeAtItsLimit(t *testing.T) {
	inLane(t, laneOwn)
	e := newEnv(t)
	name := "e2e-limit-" + strings.ToLower(rand.String(4))
	e.newProvisioner(limitedProvisioner(name))
	node := hostNode()
	e.poll("CSINode "+node+" allocatable count of "+name, func() (bool, error) {
		cn, err := client.StorageV1().CSINodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, d := range cn.Spec.Drivers {
			if d.Name == name {
				if d.Allocatable == nil || d.Allocatable.Count == nil || *d.Allocatable.Count != 2 {
					return false, fmt.Errorf("allocatable %+v, want count 2", d.Allocatable)
				}
				return true, nil
			}
		}
		return false, fmt.Errorf("no driver %s", name)
	})
	sc := e.classOf(name, storagev1.VolumeBindingImmediate)
	for _, c := range []string{"a", "b", "c"} {
		e.claim(c, sc, claimOpts{})
	}
	e.clientPod("two", "sleep 3600", "a", "b")
	e.waitPodRunning("two")
	e.clientPod("third", "sleep 3600", "c")
	unschedulable := regexp.MustCompile(`max.+volume.+count`)
	var msg string
	e.poll("the third volume's client Unschedulable", func() (bool, error) {
		p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, "third", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Status.Phase != corev1.PodPending {
			return false, fmt.Errorf("pod third is %s, want Pending", p.Status.Phase)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable && unschedulable.MatchString(c.Message) {
				msg = c.Message
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("the third volume's client: %s", msg)
	// It stays so.
	time.Sleep(5 * time.Second)
	if p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, "third", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("pod third %v on %q, want still unscheduled", err, p.Spec.NodeName)
	}
	// The first client goes: the third volume fits.
	e.deletePod("two")
	e.waitPodRunning("third")
}

// garbageProvisioner's capacity pod writes report to /pav/capacity.
func garbageProvisioner(name, report string) string {
	return fmt.Sprintf(`apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: %[1]s
spec:
  provisioningModes: [Dynamic]
  storageCapacity:
    refreshInterval: 10s
    podTemplate:
      spec:
        containers: [{name: capacity, image: %[2]s, imagePullPolicy: IfNotPresent, command: [sh, -c, "echo '%[3]s' > /pav/capacity"]}]
  volumeCreation: {capacity: 1Mi}
  volumeStaging:
    podTemplate:
      spec:
        containers: [{name: stage, image: %[2]s, imagePullPolicy: IfNotPresent, command: [sh, -c, "mkdir -p /pav/volume"]}]
`, name, busybox, report)
}

// provisionerEvent waits for an event on a PavProvisioner (cluster-scoped: its events
// are in the default namespace) whose message holds every substring.
func (e *env) provisionerEvent(name, reason string, substrings ...string) string {
	e.t.Helper()
	var found string
	e.poll(fmt.Sprintf("a %s event on PavProvisioner %s containing %q", reason, name, substrings), func() (bool, error) {
		evs, err := client.CoreV1().Events(metav1.NamespaceDefault).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Kind != "PavProvisioner" || ev.Reason != reason || ev.Type != corev1.EventTypeWarning {
				continue
			}
			ok := true
			for _, s := range substrings {
				ok = ok && strings.Contains(ev.Message, s)
			}
			if ok {
				found = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	return found
}

// A capacity pod that writes garbage: a Warning event on the PavProvisioner names the pod,
// the file and the fix; no CSIStorageCapacity is published with a made-up value, so a claim
// waits (its client Pending) rather than land anywhere; nothing is lost: once the template
// is fixed, the capacity is published and the claim's client runs.
func TestCapacityPodWritesGarbage(t *testing.T) {
	inLane(t, laneOwn)
	e := newEnv(t)
	name := "e2e-garbage-" + strings.ToLower(rand.String(4))
	e.newProvisioner(garbageProvisioner(name, "lots of room"))
	sc := e.classOf(name, storagev1.VolumeBindingWaitForFirstConsumer)
	msg := e.provisionerEvent(name, "InvalidCapacityReport",
		"capacity pod pav/pav-"+name+"-capacity-", `wrote "lots of room" to /pav/capacity`, "have it write the free bytes")
	t.Logf("event: %s", msg)
	e.claim("data", sc, claimOpts{})
	e.clientPod("client", "sleep 3600", "data")
	time.Sleep(10 * time.Second)
	all, err := capacities(e.ctx, sc)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 0 {
		t.Fatalf("CSIStorageCapacity objects %v for a capacity pod that writes garbage, want none", all)
	}
	if p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, "client", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("client %v on %q, want Pending: no node is known to have room", err, p.Spec.NodeName)
	}
	if pods := phasePodsOf(e.ctx, name, "creation"); len(pods) != 0 {
		t.Fatalf("creation pods %d, want none", len(pods))
	}

	// Fixed: the capacity is published, and the waiting claim gets its volume.
	kubectlApply(t, garbageProvisioner(name, "1Gi"))
	got := e.waitCapacities(sc, []string{""}, capacityIs(map[string]string{"": "1Gi"}))
	// One object for every node, which stays (external-provisioner deletes
	// its own object of an empty segment at once): it selects the nodes
	// where the provisioner's node plugin registered.
	if sel := got[""].NodeTopology; sel == nil || !reflect.DeepEqual(sel.MatchLabels, phase.EveryNodeSegment(name)) || len(sel.MatchExpressions) > 0 {
		t.Errorf("the object's nodeTopology %v, want the labels %v", sel, phase.EveryNodeSegment(name))
	}
	time.Sleep(3 * time.Second)
	if again, err := capacities(e.ctx, sc); err != nil || len(again[""]) != 1 || again[""][0].UID != got[""].UID {
		t.Errorf("CSIStorageCapacity objects a moment later: %v (%v), want the same one", again, err)
	}
	e.waitPodRunning("client")
	e.waitBound("data")
}

func phasePodsOf(ctx context.Context, provisioner, phase string) []corev1.Pod {
	pods, _ := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: podrunner.LabelProvisioner + "=" + provisioner + "," + podrunner.LabelPhase + "=" + phase})
	return pods.Items
}

// loop-block reports each node's pool (examples/loop-block, "Capacity and limits"): one
// CSIStorageCapacity per node that runs its node plugin, never more than the pool's file
// system has available; a volume made on node 1 takes its size off node 1's figure at once
// (its sparse file may grow to it), and its deletion gives it back.
func TestLoopBlockCapacityPerNode(t *testing.T) {
	inLane(t, laneLoopBlock)
	e := newEnv(t)
	var nodes []string
	cns, err := client.StorageV1().CSINodes().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cn := range cns.Items {
		if slices.ContainsFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == "loop-block" }) {
			nodes = append(nodes, cn.Name)
		}
	}
	host := hostNode()
	if !slices.Contains(nodes, host) {
		t.Fatalf("loop-block's node plugin is not registered on node 1 (%s): %v", host, nodes)
	}
	available := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs("/var/lib/pav-loop-block", &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Frsize
	}
	sc := e.classOf("loop-block", storagev1.VolumeBindingWaitForFirstConsumer)
	byNode := e.waitCapacities(sc, nodes, func(node string, c storagev1.CSIStorageCapacity) error {
		if c.Capacity == nil || c.MaximumVolumeSize == nil || c.Capacity.Cmp(*c.MaximumVolumeSize) != 0 {
			return fmt.Errorf("node %s: capacity %v, maximum volume size %v: want both, equal", node, c.Capacity, c.MaximumVolumeSize)
		}
		return nil
	})
	before := byNode[host].Capacity.Value()
	if avail := available(); before > avail+256<<20 {
		t.Errorf("node 1 reports %d bytes, more than its pool's file system has available (%d)", before, avail)
	}

	// A 1Gi Block volume on node 1: a sparse file of 1Gi that holds nothing yet.
	const size = 1 << 30
	e.claim("disk", sc, claimOpts{size: "1Gi", mode: corev1.PersistentVolumeBlock})
	e.clientPod("client", "sleep 3600", "disk")
	e.waitPodRunning("client")
	start := time.Now()
	e.waitCapacities(sc, nodes, func(node string, c storagev1.CSIStorageCapacity) error {
		if node == host && c.Capacity.Value() > before-size/2 {
			return fmt.Errorf("node 1 still reports %d bytes (%d before the volume)", c.Capacity.Value(), before)
		}
		return nil
	})
	t.Logf("node 1's figure took the 1Gi volume off within %v", time.Since(start).Round(time.Second))

	e.deletePod("client")
	pv := e.waitBound("disk")
	e.deleteClaim("disk")
	e.waitPVGone(pv.Name)
	e.waitCapacities(sc, nodes, func(node string, c storagev1.CSIStorageCapacity) error {
		if node == host && c.Capacity.Value() < before-size/2 {
			return fmt.Errorf("node 1 reports %d bytes (%d before the volume)", c.Capacity.Value(), before)
		}
		return nil
	})
}
