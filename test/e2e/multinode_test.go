//go:build e2e

package e2e

// The cross-node suite (issue 24): pav on a cluster of three nodes, which the local cluster
// has with `make cluster-up NODES=3`. Node 1 is this machine; nodes 2 and 3 are
// hack/cluster/node.sh's nodes, each in namespaces of its own, whose /var/lib and /var/log
// are their own disk (nodes/<name>/var-lib and var-log under the cluster's state directory)
// while the rest of the file system (/srv, /tmp, /dev) is this machine's, shared by all.
// So a hostPath under /var/lib (pav's node state, loop-block's files) is node-local, and
// one under /srv stands in for network storage (multinode/provisioner.yaml). The tests
// read a node's files through that mapping (onNode), its mounts and loop devices through
// node.sh exec, and power nodes off and on with node.sh stop and start.
//
// With fewer than three Ready nodes every test here is skipped, unless PAV_E2E_NODES says
// the cluster has three or more: then a missing node is a failure (clusterNodes).

import (
	"bytes"
	"context"
	"crypto/md5"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	"github.com/pods-as-volumes/pav/nodeserver"
	"github.com/pods-as-volumes/pav/podrunner"
)

const (
	// sharedRoot is where multinode/provisioner.yaml keeps its volumes, one directory per
	// provisioner: the same directory on every node.
	sharedRoot = "/srv/pav-e2e-shared"
	// outOfService is the taint with which Kubernetes' non-graceful node shutdown procedure
	// lets the pods of a node that is down go (pod GC force-deletes them).
	outOfService = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
	hostnameKey  = "kubernetes.io/hostname"
)

// clusterDir is the local cluster's state directory, as hack/cluster/lib.sh finds it.
func clusterDir() string {
	if d := os.Getenv("PAV_CLUSTER_DIR"); d != "" {
		return d
	}
	return filepath.Join(repo, "_output", "cluster")
}

// hostNode is the name of node 1, this machine (hack/cluster/lib.sh's node1_name).
func hostNode() string {
	if n := os.Getenv("PAV_NODE_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return strings.ToLower(h)
}

func nodeScript() string { return filepath.Join(repo, "hack", "cluster", "node.sh") }

// clusterNodes returns the cluster's Ready and schedulable nodes, this machine first, then
// by name, when there are at least n of them. With fewer the test is skipped, unless
// PAV_E2E_NODES asks for n or more: then the cluster was meant to have them, and a missing
// node fails the test. Every node but the first must be one of node.sh's, whose disk the
// tests read from here, and carry its name as its kubernetes.io/hostname label, which the
// tests pin pods with.
func clusterNodes(t *testing.T, n int) []string {
	t.Helper()
	want := 0
	if s := os.Getenv("PAV_E2E_NODES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("PAV_E2E_NODES=%q is not a number", s)
		}
		want = v
	}
	list, err := client.CoreV1().Nodes().List(bgCtx(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var usable, other []string
	for _, nd := range list.Items {
		switch {
		case !isReady(&nd):
			other = append(other, nd.Name+" (not Ready)")
		case nd.Spec.Unschedulable:
			other = append(other, nd.Name+" (cordoned)")
		default:
			if l := nd.Labels[hostnameKey]; l != nd.Name {
				t.Fatalf("node %s has %s=%q: the tests pin pods to a node by that label, which must be its name", nd.Name, hostnameKey, l)
			}
			usable = append(usable, nd.Name)
		}
	}
	if len(usable) < n {
		msg := fmt.Sprintf("this test needs %d Ready, schedulable nodes; the cluster has %d %v (others: %v): make cluster-up NODES=%d",
			n, len(usable), usable, other, n)
		if want >= n {
			t.Fatalf("%s (PAV_E2E_NODES=%d says the cluster has them)", msg, want)
		}
		t.Skip(msg)
	}
	host := hostNode()
	sort.Slice(usable, func(i, j int) bool {
		if (usable[i] == host) != (usable[j] == host) {
			return usable[i] == host
		}
		return usable[i] < usable[j]
	})
	if usable[0] != host {
		t.Fatalf("node 1 (this machine, %q) is not among the usable nodes %v: the tests read its files directly", host, usable)
	}
	for _, nd := range usable[1:] {
		if _, err := os.Stat(filepath.Join(clusterDir(), "nodes", nd, "var-lib")); err != nil {
			t.Fatalf("node %s is not a node of hack/cluster/node.sh (%v): the tests read its disk and power it off through node.sh", nd, err)
		}
	}
	return usable
}

// onNode is where a path of a node's file system is on this machine: an extra node's
// /var/lib and /var/log are its own disk; everything else is shared.
func onNode(node, p string) string {
	if node == hostNode() {
		return p
	}
	for _, d := range []struct{ dir, disk string }{{"/var/lib", "var-lib"}, {"/var/log", "var-log"}} {
		if rest, ok := strings.CutPrefix(p, d.dir); ok && (rest == "" || rest[0] == '/') {
			return filepath.Join(clusterDir(), "nodes", node, d.disk, rest)
		}
	}
	return p
}

// onNodeCmd runs a command in a node's namespaces (on node 1, here) and returns its
// standard output.
func onNodeCmd(node string, args ...string) (string, error) {
	cmd := exec.Command(args[0], args[1:]...)
	if node != hostNode() {
		cmd = exec.Command(nodeScript(), append([]string{"exec", node}, args...)...)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%v on node %s: %v: %s", args, node, err, stderr.String())
	}
	return stdout.String(), nil
}

// power runs node.sh stop or start for a node; start returns once the node is Ready.
func power(t *testing.T, action, node string) time.Duration {
	t.Helper()
	start := time.Now()
	run(t, nodeScript(), action, node)
	took := time.Since(start)
	t.Logf("node.sh %s %s took %v", action, node, took.Round(100*time.Millisecond))
	return took
}

// nodeMountPoints lists the mount points of a node's mount namespace.
func nodeMountPoints(node string) ([]string, error) {
	out, err := onNodeCmd(node, "cat", "/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var mps []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 4 {
			mps = append(mps, f[4])
		}
	}
	return mps, nil
}

// pluginVolumes is a provisioner's node state directory (on every node).
func pluginVolumes(provisioner string) string {
	return "/var/lib/kubelet/plugins/" + provisioner + "/volumes"
}

// volumeMounts lists a node's mounts of a volume: under its state directory, and its
// publish targets (kubelet's paths name the PV).
func volumeMounts(node, provisioner string, pv *corev1.PersistentVolume) ([]string, error) {
	mps, err := nodeMountPoints(node)
	if err != nil {
		return nil, err
	}
	dir := nodeserver.VolumeDir(pluginVolumes(provisioner), pv.Spec.CSI.VolumeHandle)
	var out []string
	for _, mp := range mps {
		if mp == dir || strings.HasPrefix(mp, dir+"/") || strings.Contains(mp, "/"+pv.Name+"/") || strings.HasSuffix(mp, "/"+pv.Name) {
			out = append(out, mp)
		}
	}
	return out, nil
}

// phasePodsKeyed lists a provisioner's pods of a phase whose volume key is exactly key
// (pavPods matches a prefix, and "h@vm" is a prefix of "h@vm-2").
func phasePodsKeyed(provisioner, phase, key string) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pavPods(provisioner, phase, key) {
		if p.Annotations[podrunner.AnnotationVolumeKey] == key {
			out = append(out, p)
		}
	}
	return out
}

// waitUnstagedOn waits until nothing of a volume's staging is left on a node: no staging
// or unstaging pod, no state directory on the node's disk, no mount in its namespace.
func (e *env) waitUnstagedOn(provisioner string, pv *corev1.PersistentVolume, node string) {
	e.t.Helper()
	handle := pv.Spec.CSI.VolumeHandle
	e.poll(fmt.Sprintf("volume %s unstaged on node %s", handle, node), func() (bool, error) {
		for _, ph := range []string{"staging", "unstaging"} {
			if ps := phasePodsKeyed(provisioner, ph, handle+"@"+node); len(ps) > 0 {
				return false, fmt.Errorf("%s pod %s/%s still there", ph, ps[0].Namespace, ps[0].Name)
			}
		}
		err := stagingLeftOn(provisioner, pv, node)
		return err == nil, err
	})
}

// stagingLeftOn says what of a volume's staging is left on a node's disk and in its mount
// namespace (its state directory, its mounts), or nil.
func stagingLeftOn(provisioner string, pv *corev1.PersistentVolume, node string) error {
	dir := nodeserver.VolumeDir(pluginVolumes(provisioner), pv.Spec.CSI.VolumeHandle)
	if _, err := os.Stat(onNode(node, dir)); !os.IsNotExist(err) {
		return fmt.Errorf("state directory %s still on the node (%v)", dir, err)
	}
	m, err := volumeMounts(node, provisioner, pv)
	if err != nil || len(m) > 0 {
		return fmt.Errorf("mounts left on the node: %v (%v)", m, err)
	}
	return nil
}

// assertNothingOnNodes checks that no node has a state directory or a mount of a volume.
func (e *env) assertNothingOnNodes(provisioner string, pv *corev1.PersistentVolume, nodes []string) {
	e.t.Helper()
	for _, n := range nodes {
		if err := stagingLeftOn(provisioner, pv, n); err != nil {
			e.t.Errorf("node %s, volume %s: %v", n, pv.Spec.CSI.VolumeHandle, err)
		}
	}
}

// waitDriverOnNodes waits until a provisioner's node plugin is ready on each node and the
// node's CSINode lists its driver (waitProvisionerReady looks at one node only).
func (e *env) waitDriverOnNodes(provisioner string, nodes []string) {
	e.t.Helper()
	e.poll(provisioner+"'s node plugin ready on "+strings.Join(nodes, ", "), func() (bool, error) {
		pods, err := client.CoreV1().Pods("pav").List(e.ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/instance=" + provisioner + ",app.kubernetes.io/component=node"})
		if err != nil {
			return false, err
		}
		ready := map[string]bool{}
		for _, p := range pods.Items {
			if podReady(&p) && p.DeletionTimestamp == nil {
				ready[p.Spec.NodeName] = true
			}
		}
		for _, n := range nodes {
			if !ready[n] {
				return false, fmt.Errorf("no ready node plugin pod on %s", n)
			}
			cn, err := client.StorageV1().CSINodes().Get(e.ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if !slices.ContainsFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == provisioner }) {
				return false, fmt.Errorf("CSINode %s does not list %s", n, provisioner)
			}
		}
		return true, nil
	})
}

// longEnv is newEnv whose polls may go on for d: a node powered off and on again takes
// more than the suite's ten minutes per test on two busy cores.
func newLongEnv(t *testing.T, d time.Duration) *env {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	e.ctx = ctx
	return e
}

// sharedProvisioner applies multinode/provisioner.yaml under a name of the test's own,
// waits until its node plugin runs on every node, and removes its directory in the
// shared storage once it is gone (a volume's directory still there then is an error: its
// deletion pod did not run).
func (e *env) sharedProvisioner(nodes []string) string {
	e.t.Helper()
	name := "e2e-shared-" + strings.ToLower(rand.String(4))
	dir := filepath.Join(sharedRoot, name)
	// Registered before newProvisioner's clean-up, so it runs after it.
	e.t.Cleanup(func() {
		if left, _ := os.ReadDir(filepath.Join(dir, "volumes")); len(left) > 0 {
			var names []string
			for _, l := range left {
				names = append(names, l.Name())
			}
			e.t.Errorf("volumes left in the shared storage %s: %v", dir, names)
		}
		if err := os.RemoveAll(dir); err != nil {
			e.t.Errorf("removing %s: %v", dir, err)
		}
		_ = os.Remove(sharedRoot) // only once empty: another test's provisioner may use it
		// The node plugin's directory (its socket, and the state directories of its
		// volumes): pav leaves it, empty, on every node; anything still in it is a
		// volume's state that unstaging did not remove.
		for _, n := range nodes {
			plugin := onNode(n, filepath.Dir(pluginVolumes(name)))
			var err error
			_ = wait.PollUntilContextTimeout(context.Background(), time.Second, time.Minute, true, func(context.Context) (bool, error) {
				// The socket goes with the plugin's container, which may still be stopping.
				if err = os.Remove(filepath.Join(plugin, "volumes")); err == nil || os.IsNotExist(err) {
					if err = os.Remove(plugin); os.IsNotExist(err) {
						err = nil
					}
				}
				return err == nil, nil
			})
			if err != nil {
				left, _ := exec.Command("find", plugin).CombinedOutput()
				e.t.Errorf("node %s: %v; left:\n%s", n, err, left)
			}
		}
	})
	b, err := os.ReadFile(filepath.Join(repo, "test", "e2e", "multinode", "provisioner.yaml"))
	if err != nil {
		e.t.Fatal(err)
	}
	took := e.newProvisioner(strings.ReplaceAll(string(b), "PROVISIONER_NAME", name))
	e.waitDriverOnNodes(name, nodes)
	e.t.Logf("provisioner %s Ready in %v", name, took.Round(100*time.Millisecond))
	return name
}

// sharedRuns lists, in order, the nodes on which a pod of a shared provisioner ran a phase
// for a volume (creation: its default handle, which is its handle).
func sharedRuns(provisioner, phase, handle string) []string {
	b, err := os.ReadFile(filepath.Join(sharedRoot, provisioner, "runs", phase, handle))
	if err != nil {
		return nil
	}
	return strings.Fields(string(b))
}

// wantRunsOn checks on which nodes, in order, a phase of a shared provisioner ran for a
// volume.
func (e *env) wantRunsOn(provisioner, phase, handle string, want ...string) {
	e.t.Helper()
	if got := sharedRuns(provisioner, phase, handle); !slices.Equal(got, want) {
		e.t.Errorf("the %s pod of %s ran on %v, want %v", phase, handle, got, want)
	}
}

// wantRunsOnce checks that a phase of a shared provisioner ran once for a volume, on any
// node (controller-side phases).
func (e *env) wantRunsOnce(provisioner, phase, handle string) {
	e.t.Helper()
	if got := sharedRuns(provisioner, phase, handle); len(got) != 1 {
		e.t.Errorf("the %s pod of %s ran %d times (on %v), want once", phase, handle, len(got), got)
	}
}

// finishShared checks what deleting a shared volume leaves: no pod, record or PV, nothing
// on any node, nothing in the shared storage; and creation and deletion ran once each.
func (e *env) finishShared(provisioner string, pv *corev1.PersistentVolume, nodes []string) {
	e.t.Helper()
	handle := pv.Spec.CSI.VolumeHandle
	e.wantRunsOnce(provisioner, "creation", handle)
	e.wantRunsOnce(provisioner, "deletion", handle)
	e.poll("no pod, record or PV left of "+pv.Name, func() (bool, error) {
		pods, err := client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{LabelSelector: podrunner.LabelProvisioner + "=" + provisioner})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if k := p.Annotations[podrunner.AnnotationVolumeKey]; k == pv.Name || k == handle || strings.HasPrefix(k, handle+"@") || k == "delete/"+handle {
				return false, fmt.Errorf("pod %s/%s left", p.Namespace, p.Name)
			}
		}
		if v, err := record(e.ctx, pv.Name); v != nil || err != nil {
			return false, fmt.Errorf("PavVolume of %s left (%v)", pv.Name, err)
		}
		if _, err := client.CoreV1().PersistentVolumes().Get(e.ctx, pv.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("PV %s left (%v)", pv.Name, err)
		}
		return true, nil
	})
	e.assertNothingOnNodes(provisioner, pv, nodes)
	if _, err := os.Stat(filepath.Join(sharedRoot, provisioner, "volumes", handle)); !os.IsNotExist(err) {
		e.t.Errorf("volume %s still in the shared storage (%v)", handle, err)
	}
}

// podOpts are how a pinned client pod differs from a plain one.
type podOpts struct {
	restart corev1.RestartPolicy // default Never
	// tolerateAll keeps the pod bound to its node whatever taints the node gets (a node
	// going down, the out-of-service taint), as a DaemonSet's pods are.
	tolerateAll bool
}

// pinnedSpec is a busybox client pod that runs script on node, with the claims at
// /data/<claim> (Filesystem) or /dev/<claim> (Block), and the node's name in $NODE. It
// goes through the scheduler, held to the node by its kubernetes.io/hostname label rather
// than spec.nodeName, so that a WaitForFirstConsumer claim is provisioned for that node.
func (e *env) pinnedSpec(node, script string, o podOpts, claims ...string) corev1.PodSpec {
	e.t.Helper()
	if o.restart == "" {
		o.restart = corev1.RestartPolicyNever
	}
	c := corev1.Container{Name: "client", Image: busybox, ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"sh", "-c", script},
		Env: []corev1.EnvVar{{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}}}
	spec := corev1.PodSpec{RestartPolicy: o.restart, TerminationGracePeriodSeconds: ptr(int64(1)),
		NodeSelector: map[string]string{hostnameKey: node}}
	if o.tolerateAll {
		spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	}
	for _, cl := range claims {
		pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, cl, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: cl, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: cl}}})
		if pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock {
			c.VolumeDevices = append(c.VolumeDevices, corev1.VolumeDevice{Name: cl, DevicePath: "/dev/" + cl})
		} else {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: cl, MountPath: "/data/" + cl})
		}
	}
	spec.Containers = []corev1.Container{c}
	return spec
}

// podOn creates a pinned client pod (pinnedSpec).
func (e *env) podOn(name, node, script string, o podOpts, claims ...string) {
	e.t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: e.pinnedSpec(node, script, o, claims...)}
	if _, err := client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// liveScript writes token to a claim's volume unless it already holds one, prints what
// the volume holds ("read: …", as waitRead wants) and sleeps.
func liveScript(claim, token string) string {
	return fmt.Sprintf(`f=/data/%[1]s/token; [ -f $f ] || echo %[2]s > $f; echo "read: $(cat $f)"; exec sleep 3600`, claim, token)
}

// waitReadSince is waitRead for a container started at since or later (a node's reboot
// need not show in the restart count).
func (e *env) waitReadSince(name string, since time.Time) string {
	e.t.Helper()
	since = since.Truncate(time.Second) // the API's timestamps have whole seconds
	return e.waitReadOf(name, "started since "+since.Format(time.TimeOnly), func(c corev1.ContainerStatus) bool {
		r := c.State.Running
		return r != nil && !r.StartedAt.Time.Before(since)
	})
}

// phaseRecord is what a test saw of one pav pod.
type phaseRecord struct{ provisioner, phase, key, node string }

// phaseWatch records every pav pod the cluster has while a test runs (pav removes them
// once done, so a later List misses them): which phase, for which volume key, on which
// node.
type phaseWatch struct {
	mu   sync.Mutex
	pods map[types.UID]phaseRecord
}

// watchPhasePods starts a phaseWatch, which stops with the test.
func (e *env) watchPhasePods() *phaseWatch {
	e.t.Helper()
	w := &phaseWatch{pods: map[types.UID]phaseRecord{}}
	seen := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		r := w.pods[p.UID]
		r.provisioner, r.phase, r.key = p.Labels[podrunner.LabelProvisioner], p.Labels[podrunner.LabelPhase], p.Annotations[podrunner.AnnotationVolumeKey]
		if p.Spec.NodeName != "" { // a controller-side pod gets one once scheduled
			r.node = p.Spec.NodeName
		}
		w.pods[p.UID] = r
	}
	lw := cache.NewFilteredListWatchFromClient(client.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
		func(o *metav1.ListOptions) { o.LabelSelector = podrunner.LabelPhase })
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{ListerWatcher: lw, ObjectType: &corev1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, obj any) { seen(obj) }}})
	ctx, cancel := context.WithCancel(context.Background())
	go ctrl.RunWithContext(ctx)
	e.t.Cleanup(cancel)
	e.poll("the watch of pav's pods synced", func() (bool, error) { return ctrl.HasSynced(), nil })
	return w
}

// of lists the pods seen of a provisioner's phase for a volume key.
func (w *phaseWatch) of(provisioner, phase, key string) []phaseRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []phaseRecord
	for _, r := range w.pods {
		if r.provisioner == provisioner && r.phase == phase && r.key == key {
			out = append(out, r)
		}
	}
	return out
}

// nodesOf is where those pods ran, sorted.
func (w *phaseWatch) nodesOf(provisioner, phase, key string) []string {
	var out []string
	for _, r := range w.of(provisioner, phase, key) {
		out = append(out, r.node)
	}
	sort.Strings(out)
	return out
}

// loopsOfFile lists the loop devices whose backing file is the file at path here, by
// device and inode: a loop device reports its file by the path the node that attached it
// saw, which on an extra node is not this machine's.
func loopsOfFile(t *testing.T, path string) []string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)))
	out := run(t, "losetup", "--list", "--noheadings", "--output", "NAME,BACK-MAJ:MIN,BACK-INO")
	var devs []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[1] == dev && f[2] == strconv.FormatUint(st.Ino, 10) {
			devs = append(devs, f[0])
		}
	}
	return devs
}

// TestVolumeMovesBetweenNodes: a ReadWriteOnce volume of the shared provisioner (its data
// in /srv, which every node reaches: the stand-in for network storage) is written by a pod
// on node A, then read by a pod on node B. The volume is unstaged on A (its unstaging pod
// ran there, nothing of it is left on A) before it is staged on B, and B reads what A
// wrote, byte for byte. A and B are the two extra nodes, whose pav state directories are
// each their own disk.
func TestVolumeMovesBetweenNodes(t *testing.T) {
	inLane(t, laneSelf) // a shared provisioner of its own: nothing another test uses
	start := time.Now()
	nodes := clusterNodes(t, 3)[:3]
	a, b := nodes[1], nodes[2]
	e := newEnv(t)
	prov := e.sharedProvisioner(nodes)
	sc := e.storageClassOf(prov)
	e.claim("data", sc, claimOpts{size: "8Mi"})
	pv := e.waitBound("data")
	handle := pv.Spec.CSI.VolumeHandle
	token := "pav-e2e-" + rand.String(8)

	e.podOn("writer", a, fmt.Sprintf(`set -e; cd /data/data; dd if=/dev/urandom of=blob bs=64k count=16 2>/dev/null; md5sum blob > blob.md5; echo %s > token; cat blob.md5`, token),
		podOpts{}, "data")
	e.waitPodPhase("writer", corev1.PodSucceeded)
	sum := e.logs("writer")
	e.wantRunsOn(prov, "staging", handle, a)
	e.deletePod("writer")
	e.waitUnstagedOn(prov, pv, a)
	e.wantRunsOn(prov, "unstaging", handle, a)
	e.wantRunsOn(prov, "staging", handle, a)

	e.podOn("reader", b, `cd /data/data && md5sum -c blob.md5 && cat token blob.md5`, podOpts{}, "data")
	e.waitPodPhase("reader", corev1.PodSucceeded)
	if got, want := e.logs("reader"), "blob: OK\n"+token+"\n"+sum; got != want {
		t.Fatalf("the reader on %s printed %q, want %q: the data written on %s", b, got, want, a)
	}
	e.wantRunsOn(prov, "staging", handle, a, b)
	e.wantRunsOn(prov, "unstaging", handle, a)
	e.deletePod("reader")
	e.waitUnstagedOn(prov, pv, b)
	e.wantRunsOn(prov, "unstaging", handle, a, b)

	e.deleteClaim("data")
	e.waitPVGone(pv.Name)
	e.finishShared(prov, pv, nodes)
	t.Logf("TestVolumeMovesBetweenNodes took %v", time.Since(start).Round(time.Second))
}

// TestNodeLocalTopologyChoice: loop-block volumes (node-local files) with
// WaitForFirstConsumer binding, one claim for a pod on each of the three nodes: the
// scheduler's choice decides where each volume is made. Each volume's creation pod ran on
// its pod's node, its backing file is on that node's disk (and on no other), the loop
// device its client uses is attached to that very file, its handle and its PV's node
// affinity name the node. A second pod of the claim held to another node stays Pending,
// with the scheduler's reason. Deletion runs on the volume's node and removes the file.
func TestNodeLocalTopologyChoice(t *testing.T) {
	inLane(t, laneLoopBlock)
	start := time.Now()
	nodes := clusterNodes(t, 3)[:3]
	waitExample(t, "loop-block")
	e := newEnv(t)
	e.waitDriverOnNodes("loop-block", nodes)
	w := e.watchPhasePods()
	sc := e.exampleSC("loop-block", nil, storagev1.VolumeBindingWaitForFirstConsumer)

	type local struct {
		claim, node, marker string
		pvc                 *corev1.PersistentVolumeClaim
		pv                  *corev1.PersistentVolume
		file                string // its backing file on its node, as a path here
	}
	var vols []*local
	for i, n := range nodes {
		v := &local{claim: fmt.Sprintf("local-%d", i+1), node: n, marker: "pav-e2e-" + n + "-" + rand.String(6)}
		v.pvc = e.claim(v.claim, sc, claimOpts{size: "8Mi", mode: corev1.PersistentVolumeBlock})
		e.podOn("user-"+n, n, fmt.Sprintf(`echo %s | dd of=/dev/%s bs=512 seek=2048 count=1 conv=sync 2>/dev/null && sync && echo written && exec sleep 3600`, v.marker, v.claim),
			podOpts{}, v.claim)
		vols = append(vols, v)
	}
	for _, v := range vols {
		v.pv = e.waitBound(v.claim)
		e.waitPodRunning("user-" + v.node)
		e.poll("user-"+v.node+" wrote its volume", func() (bool, error) { return e.logs("user-"+v.node) == "written\n", nil })
		handle := v.pv.Spec.CSI.VolumeHandle
		pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, v.claim, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := pvc.Annotations["volume.kubernetes.io/selected-node"]; got != v.node {
			t.Errorf("claim %s: the scheduler selected node %q, want %q (its pod's)", v.claim, got, v.node)
		}
		if want := "pvc-" + string(v.pvc.UID) + "." + v.node; handle != want {
			t.Errorf("claim %s: handle %q, want %q", v.claim, handle, want)
		}
		if !pvAffinityNames(v.pv, hostnameKey, v.node) {
			t.Errorf("PV %s node affinity %v, want %s In [%s]", v.pv.Name, v.pv.Spec.NodeAffinity, hostnameKey, v.node)
		}
		if got := w.nodesOf("loop-block", "creation", v.pv.Name); !slices.Equal(got, []string{v.node}) {
			t.Errorf("the creation pods of %s ran on %v, want [%s]", v.pv.Name, got, v.node)
		}
		if got := w.nodesOf("loop-block", "staging", handle+"@"+v.node); !slices.Equal(got, []string{v.node}) {
			t.Errorf("the staging pods of %s ran on %v, want [%s]", handle, got, v.node)
		}
		v.file = onNode(v.node, filepath.Join(loopBlockDir, handle+".img"))
		if st, err := os.Stat(v.file); err != nil || st.Size() != 8<<20 {
			t.Fatalf("backing file of %s on node %s (%s): %v, want 8Mi", handle, v.node, v.file, err)
		}
		for _, o := range nodes {
			if o == v.node {
				continue
			}
			if m, _ := filepath.Glob(onNode(o, filepath.Join(loopBlockDir, "pvc-"+string(v.pvc.UID)+"*"))); len(m) > 0 {
				t.Errorf("node %s has files of claim %s, which lives on %s: %v", o, v.claim, v.node, m)
			}
		}
		if l := loopsOfFile(t, v.file); len(l) != 1 {
			t.Errorf("loop devices on %s's backing file on node %s: %v, want the one its client uses", handle, v.node, l)
		}
	}

	// Each claim is now bound to a node-local PV: a pod of it held to another node has
	// nowhere to go.
	for i, v := range vols {
		other := nodes[(i+1)%len(nodes)]
		e.podOn("elsewhere-"+other, other, "true", podOpts{}, v.claim)
	}
	for i, v := range vols {
		name := "elsewhere-" + nodes[(i+1)%len(nodes)]
		msg := e.waitEvent("Pod", name, "FailedScheduling", time.Minute, "didn't match PersistentVolume's node affinity")
		t.Logf("%s (claim %s, on %s): %s", name, v.claim, v.node, msg)
	}
	time.Sleep(5 * time.Second) // and stays so
	for i, v := range vols {
		name := "elsewhere-" + nodes[(i+1)%len(nodes)]
		other := nodes[(i+1)%len(nodes)]
		p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
			t.Errorf("%s is %s on %q, want Pending on no node (claim %s is on %s)", name, p.Status.Phase, p.Spec.NodeName, v.claim, v.node)
		}
		if got := w.nodesOf("loop-block", "staging", v.pv.Spec.CSI.VolumeHandle+"@"+other); len(got) > 0 {
			t.Errorf("claim %s, which lives on %s, was staged on %s", v.claim, v.node, other)
		}
		e.deletePod(name)
	}

	for _, v := range vols {
		e.deletePod("user-" + v.node)
		e.waitUnstagedOn("loop-block", v.pv, v.node)
		if l := loopsOf(v.pv.Spec.CSI.VolumeHandle); len(l) > 0 {
			t.Errorf("loop devices of %s left after unstaging: %v", v.pv.Spec.CSI.VolumeHandle, l)
		}
		raw, err := os.ReadFile(v.file)
		if err != nil || len(raw) < 1<<20 || !bytes.HasPrefix(raw[1<<20:], []byte(v.marker+"\n")) {
			t.Errorf("the backing file of %s on node %s does not hold what its client wrote at 1 MiB (%v)", v.claim, v.node, err)
		}
		e.deleteClaim(v.claim)
	}
	for _, v := range vols {
		e.waitPVGone(v.pv.Name)
		if _, err := os.Stat(v.file); !os.IsNotExist(err) {
			t.Errorf("backing file %s of %s still on node %s after deletion (%v)", v.file, v.claim, v.node, err)
		}
		if got := w.nodesOf("loop-block", "deletion", "delete/"+v.pv.Spec.CSI.VolumeHandle); !slices.Equal(got, []string{v.node}) {
			t.Errorf("the deletion pods of %s ran on %v, want [%s]", v.pv.Spec.CSI.VolumeHandle, got, v.node)
		}
	}
	t.Logf("TestNodeLocalTopologyChoice took %v", time.Since(start).Round(time.Second))
}

// TestReadWriteManyOnThreeNodes: one ReadWriteMany volume of the shared provisioner,
// used by a pod on each of the three nodes at once. Each pod writes a file and reads the
// other two's; each node ran exactly one staging pod (which keeps running while the
// volume is staged there), and one unstaging pod once its pod was gone.
func TestReadWriteManyOnThreeNodes(t *testing.T) {
	inLane(t, laneOwn)
	start := time.Now()
	nodes := clusterNodes(t, 3)[:3]
	e := newEnv(t)
	prov := e.sharedProvisioner(nodes)
	sc := e.storageClassOf(prov)
	e.claim("shared", sc, claimOpts{size: "8Mi", access: corev1.ReadWriteMany})
	pv := e.waitBound("shared")
	handle := pv.Spec.CSI.VolumeHandle

	// Each pod keeps running once it has read the others' files: the volume stays staged
	// on the three nodes at once.
	want := ""
	for _, n := range nodes {
		want += n + ": written on " + n + "\n"
	}
	for _, n := range nodes {
		e.podOn("user-"+n, n, fmt.Sprintf(`echo "written on %[1]s" > /data/shared/%[1]s.tmp && mv /data/shared/%[1]s.tmp /data/shared/%[1]s.txt
for n in %[2]s; do until [ -f /data/shared/$n.txt ]; do sleep 0.5; done; echo "$n: $(cat /data/shared/$n.txt)"; done
exec sleep 3600`, n, strings.Join(nodes, " ")), podOpts{}, "shared")
	}
	e.poll("each pod reading the three nodes' files", func() (bool, error) {
		var got []string
		ok := true
		for _, n := range nodes {
			l := e.logs("user-" + n)
			ok = ok && l == want
			got = append(got, fmt.Sprintf("%s printed %q", n, l))
		}
		return ok, fmt.Errorf("%s", strings.Join(got, "; "))
	})
	for _, n := range nodes {
		p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, "user-"+n, metav1.GetOptions{})
		if err != nil || p.Spec.NodeName != n || p.Status.Phase != corev1.PodRunning {
			t.Fatalf("user-%s: %v, want it running on %s", n, err, n)
		}
		staging := phasePodsKeyed(prov, "staging", handle+"@"+n)
		if len(staging) != 1 || staging[0].Spec.NodeName != n || staging[0].Status.Phase != corev1.PodRunning {
			t.Errorf("node %s: %d staging pods of the volume, want one running there", n, len(staging))
		}
	}
	got := sharedRuns(prov, "staging", handle)
	sort.Strings(got)
	if !slices.Equal(got, nodes) {
		t.Errorf("staging pods ran on %v, want once on each of %v", got, nodes)
	}

	for _, n := range nodes {
		e.deletePod("user-" + n)
	}
	for _, n := range nodes {
		e.waitUnstagedOn(prov, pv, n)
	}
	got = sharedRuns(prov, "unstaging", handle)
	sort.Strings(got)
	if !slices.Equal(got, nodes) {
		t.Errorf("unstaging pods ran on %v, want once on each of %v", got, nodes)
	}
	e.deleteClaim("shared")
	e.waitPVGone(pv.Name)
	e.finishShared(prov, pv, nodes)
	t.Logf("TestReadWriteManyOnThreeNodes took %v", time.Since(start).Round(time.Second))
}

// TestObjectBucketAcrossNodes: an object-bucket volume used from pods on two nodes at
// once, for each access mode (Kubernetes does not hold a ReadWriteOnce volume without
// attachment to one node, and the conformance suite's "concurrently access the single
// volume from pods on different node" uses one so). The nodes take turns: one rewrites a
// file in place with the same size, the other reads it at once and must see the new
// content. A node once read back its own cached copy of a file it had written: its rclone
// served the VFS cache while its directory listing still named the old object.
func TestObjectBucketAcrossNodes(t *testing.T) {
	inLane(t, laneObjectBucket)
	start := time.Now()
	nodes := clusterNodes(t, 3)[:2]
	e, params := objectBucketEnv(t)
	e.waitDriverOnNodes("object-bucket", nodes)
	sc := e.exampleSC("object-bucket", params, storagev1.VolumeBindingImmediate)
	for _, access := range []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadWriteMany} {
		claim := strings.ToLower(string(access))
		e.claim(claim, sc, claimOpts{size: "1Gi", access: access})
		pv := e.waitBound(claim)
		pods := []string{claim + "-a", claim + "-b"}
		for i, n := range nodes {
			e.podOn(pods[i], n, "exec sleep 3600", podOpts{}, claim)
		}
		for _, p := range pods {
			e.waitPodRunning(p)
		}
		f := "/data/" + claim + "/file"
		for round := 0; round < 4; round++ {
			writer, reader := pods[round%2], pods[1-round%2]
			fill := string(rune('a' + round))
			e.exec(writer, fmt.Sprintf("yes %s | tr -d '\\n' | head -c 65536 > %s", fill, f))
			want := fmt.Sprintf("%x", md5.Sum(bytes.Repeat([]byte(fill), 65536)))
			if got := strings.Fields(e.exec(reader, "md5sum < "+f)); len(got) == 0 || got[0] != want {
				t.Fatalf("%s: %s read %v after %s rewrote the file with %q (md5 %s)", access, reader, got, writer, fill, want)
			}
		}
		for _, p := range pods {
			e.deletePod(p)
		}
		for _, n := range nodes {
			e.waitUnstagedOn("object-bucket", pv, n)
		}
		e.deleteClaim(claim)
		e.waitPVGone(pv.Name)
	}
	t.Logf("TestObjectBucketAcrossNodes took %v", time.Since(start).Round(time.Second))
}

// controllerPod is the running pod of a provisioner's controller plugin (StatefulSet).
func (e *env) controllerPod(provisioner string) *corev1.Pod {
	e.t.Helper()
	var found *corev1.Pod
	e.poll("the controller plugin of "+provisioner+" ready", func() (bool, error) {
		pods, err := client.CoreV1().Pods("pav").List(e.ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/instance=" + provisioner + ",app.kubernetes.io/component=controller"})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if podReady(&p) && p.DeletionTimestamp == nil {
				found = &p
				return true, nil
			}
		}
		return false, nil
	})
	return found
}

// cordon cordons or uncordons nodes.
func cordon(t *testing.T, on bool, nodes ...string) {
	t.Helper()
	verb := "uncordon"
	if on {
		verb = "cordon"
	}
	for _, n := range nodes {
		kubectl(t, verb, n)
	}
}

// controllerOn makes a provisioner's controller plugin run on node: if it runs elsewhere,
// the other nodes are cordoned while its pod is deleted and the StatefulSet makes the next.
func (e *env) controllerOn(provisioner, node string, nodes []string) *corev1.Pod {
	e.t.Helper()
	p := e.controllerPod(provisioner)
	if p.Spec.NodeName == node {
		return p
	}
	var others []string
	for _, n := range nodes {
		if n != node {
			others = append(others, n)
		}
	}
	e.t.Cleanup(func() {
		for _, n := range others {
			_, _ = kubectlErr("uncordon", n)
		}
	})
	cordon(e.t, true, others...)
	if err := client.CoreV1().Pods("pav").Delete(e.ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.poll("the controller plugin of "+provisioner+" back on "+node, func() (bool, error) {
		n, err := client.CoreV1().Pods("pav").Get(e.ctx, p.Name, metav1.GetOptions{})
		if err != nil || n.UID == p.UID {
			return false, err
		}
		return podReady(n) && n.Spec.NodeName == node, nil
	})
	cordon(e.t, false, others...)
	return e.controllerPod(provisioner)
}

// nodeReady tells whether a node's Ready condition is True.
func nodeReady(ctx context.Context, node string) (bool, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	return isReady(n), nil
}

// isReady: the node's Ready condition is True.
func isReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestNodeDown: node B is powered off (node.sh stop: every process of the node dies, its
// mounts go, its disk stays) while volumes of the shared provisioner are in use on each
// node and pav's controller plugin runs on B.
//
//   - The volumes on A and C keep serving: their clients go on reading and writing, never
//     restarted.
//   - B is recovered as Kubernetes documents for a non-graceful node shutdown: once it is
//     NotReady, it gets the out-of-service taint, and pod GC force-deletes its pods. The
//     controller plugin (a StatefulSet) is made again on another node, and a claim made
//     while B was down is provisioned: creation, staging and (at the end) unstaging and
//     deletion each run once.
//   - B comes back (node.sh start; the taint removed). Its pav state still says "staged"
//     for the two volumes that were in use there, whose staging pods and mounts are gone.
//     The client of "b", which tolerates every taint and so stayed bound to B, is
//     restarted by the kubelet: pav's staging self-check finds the staging stale (the
//     node plugin's sweep at its start, or NodeStage's check: VolumeStagingLost naming
//     B), NodeStage runs the unstaging pod on B and stages the volume afresh
//     (VolumeRestaged), and the client reads its data. The client of "b2" was
//     force-deleted: the kubelet tears down what it left on B, which runs the unstaging
//     pod there and leaves no state; a new pod on B reads b2's data.
//
// (node.sh's nodes share this machine's kernel, so B's boot ID does not change: pav takes
// the same-boot path and runs the unstaging pod of a stale staging.)
func TestNodeDown(t *testing.T) {
	start := time.Now()
	nodes := clusterNodes(t, 3)[:3]
	e := newLongEnv(t, 25*time.Minute)
	prov := e.sharedProvisioner(nodes)
	sc := e.storageClassOf(prov)

	// B is an extra node (only those can be powered off), the one the controller plugin
	// runs on if it runs on one; A is this machine.
	a := nodes[0]
	b := nodes[1]
	if n := e.controllerPod(prov).Spec.NodeName; n != a {
		b = n
	}
	c := nodes[1]
	if c == b {
		c = nodes[2]
	}
	controller := e.controllerOn(prov, b, nodes)
	t.Logf("A=%s B=%s C=%s; controller plugin %s on %s", a, b, c, controller.Name, b)

	// Whatever happens, B is left up, untainted and schedulable for the tests after this
	// one (registered after newProvisioner's clean-up, so it runs before it: deleting the
	// volumes needs B).
	stopped := false
	t.Cleanup(func() {
		_, _ = kubectlErr("taint", "nodes", b, outOfService+"-")
		if stopped {
			if out, err := exec.Command(nodeScript(), "start", b).CombinedOutput(); err != nil {
				t.Errorf("restarting node %s: %v\n%s", b, err, out)
			}
		}
		_, _ = kubectlErr("uncordon", b)
	})

	type vol struct {
		claim, node, client, token string
		o                          podOpts
		pv                         *corev1.PersistentVolume
	}
	vols := []*vol{
		{claim: "a", node: a, client: "client-a"},
		{claim: "c", node: c, client: "client-c"},
		// Stays bound to B through its outage: the kubelet restarts it when B is back.
		{claim: "b", node: b, client: "client-b", o: podOpts{restart: corev1.RestartPolicyAlways, tolerateAll: true}},
		// An ordinary pod: the out-of-service taint has it force-deleted.
		{claim: "b2", node: b, client: "client-b2"},
	}
	for _, v := range vols {
		e.claim(v.claim, sc, claimOpts{size: "8Mi"})
	}
	for _, v := range vols {
		v.pv = e.waitBound(v.claim)
		v.token = "pav-e2e-" + v.claim + "-" + rand.String(8)
		e.podOn(v.client, v.node, liveScript(v.claim, v.token), v.o, v.claim)
	}
	for _, v := range vols {
		if got := e.waitRead(v.client, 0); got != v.token {
			t.Fatalf("%s read %q, want %q", v.client, got, v.token)
		}
	}
	serving := func(when string) {
		t.Helper()
		for _, v := range vols[:2] {
			s := rand.String(6)
			if out := e.exec(v.client, fmt.Sprintf("cat /data/%[1]s/token && echo %[2]s > /data/%[1]s/%[2]s && cat /data/%[1]s/%[2]s", v.claim, s)); out != v.token+"\n"+s+"\n" {
				t.Errorf("%s, %s on %s printed %q, want its token and what it wrote", when, v.client, v.node, out)
			}
			p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, v.client, metav1.GetOptions{})
			if err != nil || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].RestartCount != 0 {
				t.Errorf("%s, %s on %s was restarted or is gone (%v)", when, v.client, v.node, err)
			}
		}
	}

	// B goes down.
	stopped = true
	down := time.Now()
	power(t, "stop", b)
	// Made while the controller plugin is gone with B: provisioned once it is back.
	e.claim("new", sc, claimOpts{size: "8Mi"})
	e.podOn("client-new", a, liveScript("new", "pav-e2e-new"), podOpts{}, "new")
	serving("with B just down")
	e.pollFor("node "+b+" NotReady", 3*time.Minute, func() (bool, error) {
		r, err := nodeReady(e.ctx, b)
		return !r, err
	})
	t.Logf("node %s NotReady %v after it went down", b, time.Since(down).Round(time.Second))
	if pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, "new", metav1.GetOptions{}); err != nil || pvc.Status.Phase == corev1.ClaimBound {
		t.Fatalf("claim new bound while the only controller plugin was down (%v)", err)
	}

	// Kubernetes' non-graceful node shutdown: the out-of-service taint lets pod GC
	// force-delete B's pods, so that the StatefulSet may make its pod elsewhere.
	kubectl(t, "taint", "nodes", b, outOfService)
	tainted := time.Now()
	e.poll("the controller plugin made again on another node", func() (bool, error) {
		p, err := client.CoreV1().Pods("pav").Get(e.ctx, controller.Name, metav1.GetOptions{})
		if err != nil || p.UID == controller.UID {
			return false, err
		}
		return podReady(p) && p.Spec.NodeName != b, fmt.Errorf("pod %s on %q, ready %v", p.Name, p.Spec.NodeName, podReady(p))
	})
	t.Logf("controller plugin ready again elsewhere %v after the taint", time.Since(tainted).Round(time.Second))
	newPV := e.waitBound("new")
	if got := e.waitRead("client-new", 0); got != "pav-e2e-new" {
		t.Errorf("client-new read %q", got)
	}
	e.wantRunsOnce(prov, "creation", newPV.Spec.CSI.VolumeHandle)
	e.wantRunsOn(prov, "staging", newPV.Spec.CSI.VolumeHandle, a)
	serving("with B down and tainted")
	e.poll("client-b2 force-deleted", func() (bool, error) {
		_, err := client.CoreV1().Pods(e.ns).Get(e.ctx, "client-b2", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if _, err := client.CoreV1().Pods(e.ns).Get(e.ctx, "client-b", metav1.GetOptions{}); err != nil {
		t.Fatalf("client-b, which tolerates the taint, is gone: %v", err)
	}

	// B comes back. The taint goes first: on a Ready node it would evict every pod pav
	// starts there (they tolerate no such taint), and the pods it was for are gone.
	kubectl(t, "taint", "nodes", b, outOfService+"-")
	back := time.Now()
	power(t, "start", b)
	stopped = false
	e.waitDriverOnNodes(prov, nodes)
	vb, vb2 := vols[2], vols[3]
	if got := e.waitReadSince("client-b", back); got != vb.token {
		t.Fatalf("client-b read %q after %s came back, want its data %q", got, b, vb.token)
	}
	t.Logf("client-b read its volume %v after node.sh start", time.Since(back).Round(time.Second))
	lost := e.waitEvent("PersistentVolumeClaim", "b", nodeserver.ReasonStagingLost, time.Minute, "on node "+b)
	t.Logf("claim b: %s", lost)
	e.waitEvent("PersistentVolumeClaim", "b", nodeserver.ReasonRestaged, time.Minute, "on node "+b)
	e.wantRunsOn(prov, "staging", vb.pv.Spec.CSI.VolumeHandle, b, b)
	e.wantRunsOn(prov, "unstaging", vb.pv.Spec.CSI.VolumeHandle, b)

	// b2's stale staging goes with no pod asking for the volume on B.
	e.waitUnstagedOn(prov, vb2.pv, b)
	e.wantRunsOn(prov, "unstaging", vb2.pv.Spec.CSI.VolumeHandle, b)
	e.podOn("client-b2-again", b, liveScript("b2", "not-this-one"), podOpts{}, "b2")
	if got := e.waitRead("client-b2-again", 0); got != vb2.token {
		t.Fatalf("a new pod on %s read %q from b2, want its data %q", b, got, vb2.token)
	}
	serving("with B back")
	t.Logf("node %s down and back: %v", b, time.Since(down).Round(time.Second))

	// Each phase ran as often as it had to, and nothing is left anywhere.
	for _, name := range []string{"client-a", "client-c", "client-b", "client-b2-again", "client-new"} {
		e.deletePod(name)
	}
	all := append(slices.Clone(vols), &vol{claim: "new", node: a, pv: newPV})
	for _, v := range all {
		e.waitUnstagedOn(prov, v.pv, v.node)
		e.deleteClaim(v.claim)
	}
	for _, v := range all {
		e.waitPVGone(v.pv.Name)
	}
	for _, v := range all {
		staged := []string{v.node}
		if v.node == b {
			staged = []string{b, b}
		}
		e.wantRunsOn(prov, "staging", v.pv.Spec.CSI.VolumeHandle, staged...)
		e.wantRunsOn(prov, "unstaging", v.pv.Spec.CSI.VolumeHandle, staged...)
		e.finishShared(prov, v.pv, nodes)
	}
	t.Logf("TestNodeDown took %v", time.Since(start).Round(time.Second))
}

// replicaSetOn runs a pinned client pod (Always restarted) under a ReplicaSet of one, as
// workloads run: a node's drain evicts it, and the ReplicaSet makes another.
func (e *env) replicaSetOn(name, node, script string, claims ...string) {
	e.t.Helper()
	labels := map[string]string{"app": name}
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: appsv1.ReplicaSetSpec{
		Replicas: ptr(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: e.pinnedSpec(node, script, podOpts{restart: corev1.RestartPolicyAlways}, claims...)}}}
	if _, err := client.AppsV1().ReplicaSets(e.ns).Create(e.ctx, rs, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// podOf waits for the one pod of a ReplicaSet that is not being deleted and, if running,
// ready, and returns it.
func (e *env) podOf(rs string, running bool) *corev1.Pod {
	e.t.Helper()
	var found *corev1.Pod
	e.poll("the pod of "+rs, func() (bool, error) {
		pods, err := client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: "app=" + rs})
		if err != nil {
			return false, err
		}
		var live []corev1.Pod
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				live = append(live, p)
			}
		}
		if len(live) != 1 || running && !podReady(&live[0]) {
			return false, fmt.Errorf("%d pods", len(live))
		}
		found = &live[0]
		return true, nil
	})
	return found
}

// TestDrain: `kubectl drain` of a node where two volumes are staged: one of the shared
// provisioner (a staging pod that keeps running, a bind mount) and a loop-block one (an
// ext4 on a loop device of a file on the node's disk), each used by a ReplicaSet's pod held
// to the node. The drain evicts the clients; then the kubelet unstages the volumes: their
// unstaging pods run on the node, and nothing of them is left there (staging pods, state
// directories, mounts, loop devices). The ReplicaSets' new pods wait, unschedulable, until
// the node is uncordoned; then they run there again and read their data.
//
// pav's own pods are left out of the drain (--pod-selector): they are bare pods, which
// drain refuses to evict without --force, and a staging pod must outlive its clients,
// which pav then removes itself (see the log of the plain drain's dry run).
func TestDrain(t *testing.T) {
	start := time.Now()
	nodes := clusterNodes(t, 3)[:3]
	waitExample(t, "loop-block")
	node := nodes[2]
	e := newLongEnv(t, 20*time.Minute)
	e.waitDriverOnNodes("loop-block", nodes)
	w := e.watchPhasePods()
	prov := e.sharedProvisioner(nodes)
	t.Cleanup(func() { _, _ = kubectlErr("uncordon", node) })

	e.claim("shared", e.storageClassOf(prov), claimOpts{size: "8Mi"})
	e.claim("local", e.exampleSC("loop-block", nil, storagev1.VolumeBindingWaitForFirstConsumer), claimOpts{size: "32Mi"})
	tokens := map[string]string{"shared": "pav-e2e-shared-" + rand.String(8), "local": "pav-e2e-local-" + rand.String(8)}
	claims := []string{"shared", "local"}
	provOf := map[string]string{"shared": prov, "local": "loop-block"}
	first := map[string]*corev1.Pod{}
	for _, cl := range claims {
		e.replicaSetOn("rs-"+cl, node, liveScript(cl, tokens[cl]), cl)
	}
	pvs := map[string]*corev1.PersistentVolume{}
	for _, cl := range claims {
		first[cl] = e.podOf("rs-"+cl, true)
		if got := e.waitRead(first[cl].Name, 0); got != tokens[cl] {
			t.Fatalf("%s read %q, want %q", first[cl].Name, got, tokens[cl])
		}
		pvs[cl] = e.waitBound(cl)
	}
	lh := pvs["local"].Spec.CSI.VolumeHandle
	lfile := onNode(node, filepath.Join(loopBlockDir, lh+".img"))
	if l := loopsOfFile(t, lfile); len(l) != 1 {
		t.Fatalf("loop devices of %s on node %s: %v, want one", lh, node, l)
	}
	for _, cl := range claims {
		if m, err := volumeMounts(node, provOf[cl], pvs[cl]); err != nil || len(m) == 0 {
			t.Fatalf("no mount of %s on node %s before the drain: %v", cl, node, err)
		}
	}

	// What an operator types first. pav's staging pods have no controller: drain refuses
	// them without --force (which would evict them together with their clients).
	out, err := kubectlCmd("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--dry-run=server").CombinedOutput()
	t.Logf("kubectl drain %s --ignore-daemonsets --delete-emptydir-data --dry-run=server: %v\n%s", node, err, out)

	drained := time.Now()
	kubectl(t, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--pod-selector=!"+podrunner.LabelPhase, "--timeout=180s")
	t.Logf("kubectl drain took %v", time.Since(drained).Round(100*time.Millisecond))
	for _, cl := range claims {
		if _, err := client.CoreV1().Pods(e.ns).Get(e.ctx, first[cl].Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s not evicted (%v)", first[cl].Name, err)
		}
		e.waitUnstagedOn(provOf[cl], pvs[cl], node)
		p := e.podOf("rs-"+cl, false)
		if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
			t.Errorf("the new pod %s of rs-%s is %s on %q, want Pending: its node is cordoned", p.Name, cl, p.Status.Phase, p.Spec.NodeName)
		}
	}
	t.Logf("both volumes unstaged %v after the drain began", time.Since(drained).Round(100*time.Millisecond))
	e.wantRunsOn(prov, "unstaging", pvs["shared"].Spec.CSI.VolumeHandle, node)
	if got := w.nodesOf("loop-block", "unstaging", lh+"@"+node); !slices.Equal(got, []string{node}) {
		t.Errorf("the unstaging pods of %s ran on %v, want [%s]", lh, got, node)
	}
	if l := loopsOf(lh); len(l) > 0 {
		t.Errorf("loop devices of %s left after the drain: %v", lh, l)
	}
	pods, err := client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Namespace == e.ns || p.Labels[podrunner.LabelPhase] != "" && slices.ContainsFunc(claims, func(cl string) bool {
			return strings.HasPrefix(p.Annotations[podrunner.AnnotationVolumeKey], pvs[cl].Spec.CSI.VolumeHandle)
		}) {
			t.Errorf("pod %s/%s still on the drained node", p.Namespace, p.Name)
		}
	}

	kubectl(t, "uncordon", node)
	for _, cl := range claims {
		p := e.podOf("rs-"+cl, true)
		if p.Spec.NodeName != node {
			t.Errorf("the new pod of rs-%s runs on %s, want %s", cl, p.Spec.NodeName, node)
		}
		if got := e.waitRead(p.Name, 0); got != tokens[cl] {
			t.Errorf("after the drain %s read %q, want %q", p.Name, got, tokens[cl])
		}
	}
	e.wantRunsOn(prov, "staging", pvs["shared"].Spec.CSI.VolumeHandle, node, node)
	if got := w.nodesOf("loop-block", "staging", lh+"@"+node); !slices.Equal(got, []string{node, node}) {
		t.Errorf("the staging pods of %s ran on %v, want twice on %s", lh, got, node)
	}

	for _, cl := range claims {
		if err := client.AppsV1().ReplicaSets(e.ns).Delete(e.ctx, "rs-"+cl, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, cl := range claims {
		e.poll("the pods of rs-"+cl+" gone", func() (bool, error) {
			pods, err := client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: "app=rs-" + cl})
			return err == nil && len(pods.Items) == 0, err
		})
		e.waitUnstagedOn(provOf[cl], pvs[cl], node)
		e.deleteClaim(cl)
	}
	for _, cl := range claims {
		e.waitPVGone(pvs[cl].Name)
	}
	e.wantRunsOn(prov, "unstaging", pvs["shared"].Spec.CSI.VolumeHandle, node, node)
	e.finishShared(prov, pvs["shared"], nodes)
	if _, err := os.Stat(lfile); !os.IsNotExist(err) {
		t.Errorf("backing file %s still on node %s after deletion (%v)", lfile, node, err)
	}
	e.assertNothingOnNodes("loop-block", pvs["local"], nodes)
	t.Logf("TestDrain took %v", time.Since(start).Round(time.Second))
}
