//go:build e2e

package e2e

// The fault-injection suite, node side (issue 12, findings 4 and 5): the node
// plugin killed while it stages and while it unstages, a staging pod deleted
// under a live client, and a node "reboot" (kubelet stopped, the node's
// containers killed, every mount and loop device of the volume undone,
// kubelet started) for a mounted Filesystem volume and a loop-device Block
// volume whose loop minor meanwhile went to another file. The volumes use
// pav-e2e's "backend" scenario, whose data lives outside /pav (a directory or
// an image file in /srv/pav-e2e/backend), as a real backend's would: a
// restarted or new client must get its real data back. After each case: each
// phase's pod ran as often as it must, and nothing is left (pods, PV, record,
// state directory, mounts, loop devices, backend data).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/pods-as-volumes/pav/nodeserver"
)

const nodeSocket = "/var/lib/kubelet/plugins/" + driver + "/csi.sock"

// backendOf is where a backend-scenario volume keeps its data on the node.
func backendOf(handle string, block bool) string {
	if block {
		return filepath.Join(markers, "backend", handle+".img")
	}
	return filepath.Join(markers, "backend", handle)
}

// backendVolume makes a claim of the backend scenario (with extra
// parameters) and waits for it to be bound.
func (e *env) backendVolume(name string, block bool, params map[string]string) *corev1.PersistentVolume {
	e.t.Helper()
	p := map[string]string{"scenario": "backend"}
	for k, v := range params {
		p[k] = v
	}
	sc := e.storageClass(p, corev1.PersistentVolumeReclaimDelete)
	o := claimOpts{size: "8Mi"}
	if block {
		o.mode = corev1.PersistentVolumeBlock
	}
	e.claim(name, sc, o)
	return e.waitBound(name)
}

// liveClient runs a client that keeps running (and is restarted when its
// container dies, as after a reboot): it writes token to the volume unless
// the volume already holds one, prints what the volume holds, and sleeps.
func (e *env) liveClient(name, claim, token string, block bool) {
	e.t.Helper()
	script := fmt.Sprintf(`f=/data/%[1]s/token; [ -f $f ] || echo %[2]s > $f; echo "read: $(cat $f)"; exec sleep 3600`, claim, token)
	c := corev1.Container{Name: "client", Image: busybox, ImagePullPolicy: corev1.PullIfNotPresent,
		VolumeMounts: []corev1.VolumeMount{{Name: claim, MountPath: "/data/" + claim}}}
	if block {
		// The token goes in the device's first 64 bytes.
		script = fmt.Sprintf(`d=/dev/%[1]s; h=$(dd if=$d bs=64 count=1 2>/dev/null | tr -d '\000'); `+
			`case "$h" in pav-e2e-*) ;; *) printf %%s %[2]s | dd of=$d bs=64 count=1 conv=sync 2>/dev/null; h=$(dd if=$d bs=64 count=1 2>/dev/null | tr -d '\000');; esac; `+
			`echo "read: $h"; exec sleep 3600`, claim, token)
		c.VolumeMounts, c.VolumeDevices = nil, []corev1.VolumeDevice{{Name: claim, DevicePath: "/dev/" + claim}}
	}
	c.Command = []string{"sh", "-c", script}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways, TerminationGracePeriodSeconds: ptr(int64(1)),
			NodeSelector: map[string]string{hostnameKey: hostNode()}, // as clientPod's
			Containers:   []corev1.Container{c},
			Volumes: []corev1.Volume{{Name: claim, VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	if _, err := client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// waitRead waits until the client's current container (restarted at least
// restarts times) has printed what it read, and returns it.
func (e *env) waitRead(name string, restarts int32) string {
	e.t.Helper()
	return e.waitReadOf(name, fmt.Sprintf("restarted ≥ %d times", restarts), func(c corev1.ContainerStatus) bool {
		return c.RestartCount >= restarts
	})
}

// waitReadOf waits until the client is Ready, its first container is the one current
// says (described by which), and that container has printed what it read ("read: …");
// it returns what was read.
func (e *env) waitReadOf(name, which string, current func(corev1.ContainerStatus) bool) string {
	e.t.Helper()
	var read string
	e.poll(fmt.Sprintf("client %s (%s) read its volume", name, which), func() (bool, error) {
		p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil || !podReady(p) || len(p.Status.ContainerStatuses) == 0 || !current(p.Status.ContainerStatuses[0]) {
			return false, err
		}
		for _, l := range strings.Split(e.logs(name), "\n") {
			if s, ok := strings.CutPrefix(l, "read: "); ok {
				read = s
				return true, nil
			}
		}
		return false, nil
	})
	return read
}

// nodePlugin is the running pod of pav-e2e's node plugin on node 1 (where the suite's
// clients run).
func (e *env) nodePlugin() *corev1.Pod {
	e.t.Helper()
	pods, err := client.CoreV1().Pods("pav").List(e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + driver + ",app.kubernetes.io/component=node",
		FieldSelector: "spec.nodeName=" + hostNode()})
	if err != nil || len(pods.Items) != 1 {
		e.t.Fatalf("node plugin pod: %v (%d)", err, len(pods.Items))
	}
	return &pods.Items[0]
}

// killNodePlugin kills the node plugin's pod (no grace: a crash) and waits
// for the DaemonSet's new one to be ready.
func (e *env) killNodePlugin() {
	e.t.Helper()
	old := e.nodePlugin()
	if err := client.CoreV1().Pods("pav").Delete(e.ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		e.t.Fatal(err)
	}
	e.poll("a new node plugin pod ready", func() (bool, error) {
		pods, err := client.CoreV1().Pods("pav").List(e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + driver + ",app.kubernetes.io/component=node",
			FieldSelector: "spec.nodeName=" + old.Spec.NodeName})
		if err != nil {
			return false, err
		}
		for _, p := range pods.Items {
			if p.UID != old.UID && podReady(&p) {
				return true, nil
			}
		}
		return false, nil
	})
}

// stagingPodNow waits for the staging pod of a volume on this node to be
// running and returns it.
func (e *env) stagingPodNow(handle string) *corev1.Pod {
	e.t.Helper()
	return e.phasePodOf("staging", handle+"@"+e.nodeName())
}

func (e *env) nodeName() string {
	e.t.Helper()
	return nodeName(e.t)
}

// loopsOf lists the loop devices attached to a file whose path holds s.
func loopsOf(s string) []string {
	out, _ := exec.Command("losetup", "--list", "--noheadings", "--output", "NAME,BACK-FILE").Output()
	var devs []string
	for _, l := range strings.Split(string(out), "\n") {
		// The backing file may end in " (deleted)".
		if f := strings.Fields(l); len(f) >= 2 && strings.Contains(strings.Join(f[1:], " "), s) {
			devs = append(devs, f[0])
		}
	}
	return devs
}

// assertNodeClean checks what the node side leaves of a deleted volume:
// nothing (the controller side is assertClean's).
func (e *env) assertNodeClean(pv *corev1.PersistentVolume, block bool) {
	e.t.Helper()
	handle := pv.Spec.CSI.VolumeHandle
	e.assertClean(pv.Name, handle)
	if l := loopsOf(filepath.Base(backendOf(handle, true))); len(l) > 0 {
		e.t.Errorf("loop devices left: %v", l)
	}
	e.poll("the volume's backend data deleted", func() (bool, error) {
		_, err := os.Stat(backendOf(handle, block))
		return os.IsNotExist(err), nil
	})
}

// finish deletes the clients and the claim, and checks that each phase ran
// as often as wanted and nothing is left.
func (e *env) finish(pv *corev1.PersistentVolume, claim string, block bool, staging, unstaging int, clients ...string) {
	e.t.Helper()
	handle := pv.Spec.CSI.VolumeHandle
	for _, c := range clients {
		e.deletePod(c)
	}
	e.poll("the volume unstaged", func() (bool, error) {
		_, err := os.Stat(nodeserver.VolumeDir(volumesDir, handle))
		return os.IsNotExist(err), nil
	})
	e.deleteClaim(claim)
	e.waitPVGone(pv.Name)
	e.wantRuns("staging", handle, staging)
	e.wantRuns("unstaging", handle, unstaging)
	e.wantRuns("deletion", handle, 1)
	e.assertNodeClean(pv, block)
}

// TestNodePluginKilledDuringStaging is finding 2's node half: the node
// plugin dies while the staging pod runs; kubelet retries NodeStage, and the
// new plugin adopts the pod by the UID in state.json: it runs once.
func TestNodePluginKilledDuringStaging(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	pv := e.backendVolume("data", false, map[string]string{"stageSleep": "12"})
	handle := pv.Spec.CSI.VolumeHandle
	token := "pav-e2e-" + rand.String(8)
	e.liveClient("client", "data", token, false)
	e.stagingPodNow(handle)
	e.killNodePlugin()
	if got := e.waitRead("client", 0); got != token {
		t.Fatalf("client read %q, want %q", got, token)
	}
	e.wantRuns("staging", handle, 1)
	e.finish(pv, "data", false, 1, 1, "client")
}

// TestNodePluginKilledDuringUnstaging: the node plugin dies while the
// unstaging pod runs; kubelet retries NodeUnstage, and the new plugin adopts
// the unstaging pod: it runs once, and everything is cleaned up.
func TestNodePluginKilledDuringUnstaging(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	pv := e.backendVolume("data", false, map[string]string{"unstageSleep": "12"})
	handle := pv.Spec.CSI.VolumeHandle
	e.liveClient("client", "data", "pav-e2e-"+rand.String(8), false)
	e.waitRead("client", 0)
	if err := client.CoreV1().Pods(e.ns).Delete(e.ctx, "client", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.phasePodOf("unstaging", handle+"@"+e.nodeName())
	e.killNodePlugin()
	e.finish(pv, "data", false, 1, 1, "client")
}

// TestStagingPodDeletedUnderLiveClient is finding 4: someone deletes the
// KeepRunning staging pod while a client uses the volume. pav notices at once
// (a VolumeStagingLost event on the claim), NodeGetVolumeStats reports the
// volume abnormal with the reason, and a new client pod on the node gets the
// volume staged again, with its real data (kubelet calls NodePublish only:
// the volume is still staged in its eyes).
func TestStagingPodDeletedUnderLiveClient(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	pv := e.backendVolume("data", false, nil)
	handle := pv.Spec.CSI.VolumeHandle
	token := "pav-e2e-" + rand.String(8)
	e.liveClient("first", "data", token, false)
	e.waitRead("first", 0)
	first, err := client.CoreV1().Pods(e.ns).Get(e.ctx, "first", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	staging := e.stagingPodNow(handle)
	if err := client.CoreV1().Pods(staging.Namespace).Delete(e.ctx, staging.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitEvent("PersistentVolumeClaim", "data", nodeserver.ReasonStagingLost, time.Minute, staging.Name, "no longer served")
	target := filepath.Join("/var/lib/kubelet/pods", string(first.UID), "volumes/kubernetes.io~csi", pv.Name, "mount")
	abnormal, msg := volumeCondition(t, handle, target)
	if !abnormal || !strings.Contains(msg, staging.Name) {
		t.Fatalf("NodeGetVolumeStats condition: abnormal=%v %q", abnormal, msg)
	}
	t.Logf("volume condition: %s", msg)

	e.liveClient("second", "data", "not-this-one", false)
	if got := e.waitRead("second", 0); got != token {
		t.Fatalf("the new client read %q, want the volume's data %q", got, token)
	}
	e.waitEvent("PersistentVolumeClaim", "data", nodeserver.ReasonRestaged, time.Minute)
	if abnormal, msg := volumeCondition(t, handle, target); abnormal {
		t.Fatalf("still abnormal after re-staging: %s", msg)
	}
	// Staged twice; the lost staging was unstaged before the second, and the
	// second is unstaged at the end.
	e.finish(pv, "data", false, 2, 2, "first", "second")
}

// volumeCondition asks the node plugin, as kubelet does, for the condition
// of a published volume (VolumeCondition, field 2 of CSI 1.9's
// NodeGetVolumeStatsResponse).
func volumeCondition(t *testing.T, handle, target string) (bool, string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+nodeSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(bgCtx(), 30*time.Second)
	defer cancel()
	resp, err := csi.NewNodeClient(conn).NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: handle, VolumePath: target})
	if err != nil {
		t.Fatalf("NodeGetVolumeStats: %v", err)
	}
	b := resp.ProtoReflect().GetUnknown()
	if num, typ, n := protowire.ConsumeTag(b); num == 2 && typ == protowire.BytesType && n > 0 {
		cond, _ := protowire.ConsumeBytes(b[n:])
		abnormal, msg := false, ""
		for len(cond) > 0 {
			num, typ, n := protowire.ConsumeTag(cond)
			if n < 0 {
				break
			}
			cond = cond[n:]
			switch {
			case num == 1 && typ == protowire.VarintType:
				v, m := protowire.ConsumeVarint(cond)
				abnormal, cond = protowire.DecodeBool(v), cond[m:]
			case num == 2 && typ == protowire.BytesType:
				s, m := protowire.ConsumeString(cond)
				msg, cond = s, cond[m:]
			default:
				m := protowire.ConsumeFieldValue(num, typ, cond)
				cond = cond[m:]
			}
		}
		return abnormal, msg
	}
	t.Fatalf("no volume condition in %v", resp)
	return false, ""
}

// TestNodeReboot is finding 4: a node "reboot" under a running client. The
// kubelet stops, the client's and the staging pod's containers are killed,
// every mount of the volume (its /pav/volume, the client's publish target)
// and its loop devices are undone — and for the Block volume, another file
// takes the freed loop minor —, then the kubelet starts. kubelet restarts the
// client and stages and publishes the volume again: pav finds the staging
// stale (the mount is a bare directory, the device's disk sequence changed,
// the staging pod failed) and stages it afresh, so the restarted client reads
// its real data, never the bare directory or the other file. (The boot ID
// does not change in this simulation, so pav takes the same-boot path: the
// unstaging pod runs before the new staging, and this scenario's unstaging
// pod detaches a loop device only if its disk sequence number is the one it
// staged; the new-boot path is nodeserver's TestRestageAfterReboot.)
func TestNodeReboot(t *testing.T) {
	for _, tc := range []struct {
		name  string
		block bool
	}{{"Filesystem bind mount", false}, {"Block loop device", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			pv := e.backendVolume("data", tc.block, nil)
			handle := pv.Spec.CSI.VolumeHandle
			token := "pav-e2e-" + rand.String(8)
			e.liveClient("client", "data", token, tc.block)
			if got := e.waitRead("client", 0); got != token {
				t.Fatalf("client read %q before the reboot", got)
			}
			clientPod, _ := client.CoreV1().Pods(e.ns).Get(e.ctx, "client", metav1.GetOptions{})
			// A Filesystem volume's staging pod keeps the bind mount running; a
			// Block volume's finished once its loop device was attached.
			killed := []*corev1.Pod{clientPod}
			if !tc.block {
				killed = append(killed, e.stagingPodNow(handle))
			}
			loops := loopsOf(filepath.Base(backendOf(handle, true)))
			if tc.block && len(loops) != 1 {
				t.Fatalf("loop devices of the volume: %v", loops)
			}

			var decoy string // another volume's file, on the freed minor (Block)
			e.reboot(func() {
				killPodContainers(t, killed...)
				// kubelet keeps a mapped Block volume open through a loop device of
				// its own over the published device file (named after the PV until
				// that file is unmounted): a reboot undoes it too, and the volume's
				// loop device is only freed once it is gone.
				for _, l := range loopsOf(pv.Name) {
					run(t, "losetup", "-d", l)
				}
				unmountVolume(t, pv.Name, handle)
				for _, l := range loops {
					run(t, "losetup", "-d", l)
				}
				if tc.block {
					// Another volume's file takes the freed minor.
					decoy = filepath.Join(t.TempDir(), "other-volume.img")
					if err := os.WriteFile(decoy, []byte("pav-e2e-someone-else"), 0o600); err != nil {
						t.Fatal(err)
					}
					if err := os.Truncate(decoy, 8<<20); err != nil {
						t.Fatal(err)
					}
					run(t, "losetup", loops[0], decoy)
					t.Cleanup(func() { _ = exec.Command("losetup", "-d", loops[0]).Run() })
				}
			})

			if got := e.waitRead("client", 1); got != token {
				t.Fatalf("the restarted client read %q, want its data %q", got, token)
			}
			if tc.block {
				// Its whole path: a file of the same name elsewhere (another test's) is not it.
				if l := loopsOf(decoy); len(l) != 1 || l[0] != loops[0] {
					t.Fatalf("the other file's loop device was touched: %v", l)
				}
			}
			e.waitEvent("PersistentVolumeClaim", "data", nodeserver.ReasonStagingLost, time.Minute)
			// Staged twice (before and after); unstaged before the second
			// staging (same boot) and at the end.
			e.finish(pv, "data", tc.block, 2, 2, "client")
		})
	}
}

// TestKubeletRestartedDuringUnstaging is what the soak found (issue 26): the kubelet
// restarted while NodeUnstageVolume ran. A restarted kubelet rebuilds its view of mounted
// volumes from its pods' directories; the volume's last pod was gone, so it never asked
// again, and the staging (state directory, unstaging pod) stayed on the node for good. The
// node plugin now finishes it once the kubelet's node status has not listed the volume in
// use for the grace (nodeserver's forgotten.go; a minute): a ForgottenStagingUnstaged event
// on the claim, the unstaging pod adopted (it ran once), nothing left.
func TestKubeletRestartedDuringUnstaging(t *testing.T) {
	e := newEnv(t)
	pv := e.backendVolume("data", false, map[string]string{"unstageSleep": "20"})
	handle := pv.Spec.CSI.VolumeHandle
	token := "pav-e2e-" + rand.String(8)
	e.liveClient("client", "data", token, false)
	if got := e.waitRead("client", 0); got != token {
		t.Fatalf("client read %q", got)
	}
	if err := client.CoreV1().Pods(e.ns).Delete(e.ctx, "client", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.phasePodOf("unstaging", handle+"@"+e.nodeName())
	e.reboot(func() {}) // the kubelet stopped, then started again: nothing else undone
	e.waitEvent("PersistentVolumeClaim", "data", nodeserver.ReasonForgottenUnstaged, 4*time.Minute, handle, "node "+e.nodeName())
	e.finish(pv, "data", false, 1, 1, "client")
}

// reboot stops the kubelet, runs undo (what a reboot does to the node), and
// starts the kubelet again with hack/cluster/up.sh (which waits for the node
// to be Ready with a fresh heartbeat). The kubelet is restarted whatever
// happens, so the node is left Ready. The suite runs under the cluster lock
// (flock /tmp/pav-cluster.lock make e2e).
func (e *env) reboot(undo func()) {
	e.t.Helper()
	pidFile := filepath.Join(repo, "_output", "cluster", "run", "kubelet.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		e.t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		e.t.Fatal(err)
	}
	started := false
	start := func() {
		if started {
			return
		}
		started = true
		cmd := exec.Command(filepath.Join(repo, "hack", "cluster", "up.sh"))
		cmd.Env = append(os.Environ(), "PAV_CLUSTER_DIR="+filepath.Join(repo, "_output", "cluster"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			e.t.Fatalf("restarting the kubelet: %v\n%s", err, out)
		}
	}
	e.t.Cleanup(start)
	defer start()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		e.t.Fatalf("stopping the kubelet (pid %d): %v", pid, err)
	}
	e.pollFor("the kubelet stopped", time.Minute, func() (bool, error) {
		return syscall.Kill(pid, 0) != nil, nil
	})
	undo()
}

// killPodContainers kills every container of the pods (sandboxes included),
// as a reboot does, through containerd (the kubelet is down).
func killPodContainers(t *testing.T, pods ...*corev1.Pod) {
	t.Helper()
	ctr := []string{"--address", filepath.Join(repo, "_output", "cluster", "run", "containerd", "containerd.sock"), "-n", "k8s.io"}
	for _, p := range pods {
		ids := strings.Fields(run(t, filepath.Join(repo, "_output", "bin", "ctr"), append(ctr, "containers", "list", "--quiet",
			fmt.Sprintf(`labels."io.kubernetes.pod.uid"==%s`, p.UID))...))
		if len(ids) == 0 {
			t.Fatalf("no containers of pod %s/%s in containerd", p.Namespace, p.Name)
		}
		for _, id := range ids {
			_ = exec.Command(filepath.Join(repo, "_output", "bin", "ctr"), append(ctr, "tasks", "kill", "--signal", "SIGKILL", id)...).Run()
		}
	}
}

// unmountVolume undoes every mount of a volume on the node: under its state
// directory, and the publish targets of its PV (as a reboot does).
func unmountVolume(t *testing.T, pvName, handle string) {
	t.Helper()
	dir := nodeserver.VolumeDir(volumesDir, handle)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var mps []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 5 {
			continue
		}
		mp := f[4]
		if strings.HasPrefix(mp, dir+"/") || strings.Contains(mp, "/"+pvName+"/") || strings.HasSuffix(mp, "/"+pvName) {
			mps = append(mps, mp)
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	for _, mp := range mps {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			t.Fatalf("unmount %s: %v", mp, err)
		}
	}
	if len(mps) == 0 {
		t.Fatalf("no mount of volume %s on the node", handle)
	}
	t.Logf("unmounted %v", mps)
}
