//go:build e2e

package e2e

// The storage-middleware examples (examples/loop-block, encryption, encrypted-fs,
// object-bucket) on the real cluster: their drivers are deployed by make deploy-e2e
// (test/e2e/examples), their images by make images. Each test has its own namespace,
// checks real objects, devices, mounts and files on the node, and cleans up.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/nodeserver"
	"github.com/pods-as-volumes/pav/podrunner"
)

const (
	loopBlockDir   = "/var/lib/pav-loop-block"
	encryptionImg  = "pav.local/encryption:dev"
	storeNamespace = "pav-object-store"
)

// waitExample waits until an example's PavProvisioner is Ready, its plugins
// are ready and the kubelet has registered its driver.
func waitExample(t *testing.T, name string) {
	t.Helper()
	if err := waitProvisionerReady(bgCtx(), name, 3*time.Minute); err != nil {
		t.Fatalf("the %s example's driver is not ready (make deploy-e2e deploys it): %v", name, err)
	}
}

// exampleSC makes a StorageClass of one of the examples, deleted with the test, whose
// volumes are made on one of the nodes given (allowedTopologies on kubernetes.io/hostname;
// none: any node). A node-local example's volumes (loop-block) are made where its
// StorageClass allows: on node 1 for the tests that check its files.
func (e *env) exampleSC(provisioner string, params map[string]string, binding storagev1.VolumeBindingMode, nodes ...string) string {
	e.t.Helper()
	return e.createSC(e.newSC(provisioner, params, binding, nodes...))
}

// newSC is the StorageClass exampleSC makes, not yet created.
func (e *env) newSC(provisioner string, params map[string]string, binding storagev1.VolumeBindingMode, nodes ...string) *storagev1.StorageClass {
	name := e.ns + "-" + provisioner + "-" + strings.ToLower(rand.String(4))
	reclaim := corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, Parameters: params,
		ReclaimPolicy: &reclaim, VolumeBindingMode: &binding}
	if len(nodes) > 0 {
		sc.AllowedTopologies = []corev1.TopologySelectorTerm{{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{
			{Key: hostnameKey, Values: nodes}}}}
	}
	return sc
}

// createSC creates a StorageClass, deleted with the test, and returns its name.
func (e *env) createSC(sc *storagev1.StorageClass) string {
	e.t.Helper()
	name := sc.Name
	if _, err := client.StorageV1().StorageClasses().Create(e.ctx, sc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = client.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// annotatedClaim is e.claim with annotations.
func (e *env) annotatedClaim(name, sc string, o claimOpts, annotations map[string]string) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	if o.mode == "" {
		o.mode = corev1.PersistentVolumeFilesystem
	}
	if o.access == "" {
		o.access = corev1.ReadWriteOnce
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns, Annotations: annotations},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeMode: &o.mode, AccessModes: []corev1.PersistentVolumeAccessMode{o.access},
			VolumeName: o.volume,
			Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(o.size)}}}}
	pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pvc
}

func (e *env) secret(name string, data map[string]string) {
	e.t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, StringData: data}
	if _, err := client.CoreV1().Secrets(e.ns).Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// runPrivileged runs a privileged pod of an image with the claims (Block at /dev/<claim>,
// Filesystem at /data/<claim>) to completion and returns its log.
func (e *env) runPrivileged(name, image, script string, claims ...string) string {
	e.t.Helper()
	c := corev1.Container{Name: "inspect", Image: image, ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"sh", "-c", script},
		SecurityContext: &corev1.SecurityContext{Privileged: ptr(true)}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr(int64(1)),
			NodeSelector: map[string]string{hostnameKey: hostNode()}}} // as clientPod's
	for _, cl := range claims {
		pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, cl, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: cl, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: cl}}})
		if pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock {
			c.VolumeDevices = append(c.VolumeDevices, corev1.VolumeDevice{Name: cl, DevicePath: "/dev/" + cl})
		} else {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: cl, MountPath: "/data/" + cl})
		}
	}
	pod.Spec.Containers = []corev1.Container{c}
	if _, err := client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.waitPodPhase(name, corev1.PodSucceeded)
	out := e.logs(name)
	e.deletePod(name)
	return out
}

// pavPods lists a provisioner's pods of one phase whose volume key starts with prefix.
func pavPods(provisioner, phase, prefix string) []corev1.Pod {
	pods, _ := client.CoreV1().Pods("").List(bgCtx(), metav1.ListOptions{LabelSelector: podrunner.LabelProvisioner + "=" + provisioner + "," + podrunner.LabelPhase + "=" + phase})
	var out []corev1.Pod
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Annotations[podrunner.AnnotationVolumeKey], prefix) {
			out = append(out, p)
		}
	}
	return out
}

// waitUnstaged waits until a volume is unstaged on node 1: no staging or unstaging pod, no
// mount left in its state directory, and the directory gone (a staging whose pod completed
// leaves neither pod nor mount: only the directory says it is still staged).
func (e *env) waitUnstaged(provisioner, handle string) {
	e.t.Helper()
	dir := nodeserver.VolumeDir(pluginVolumes(provisioner), handle)
	e.poll(provisioner+" volume "+handle+" unstaged", func() (bool, error) {
		if len(pavPods(provisioner, "staging", handle+"@")) > 0 || len(pavPods(provisioner, "unstaging", handle+"@")) > 0 || len(hostMounts(dir)) > 0 {
			return false, nil
		}
		_, err := os.Stat(dir)
		return os.IsNotExist(err), nil
	})
}

// fuseMounts lists the node's FUSE mounts of a type (fuse.gocryptfs, fuse.rclone).
func fuseMounts(fstype string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if _, post, ok := strings.Cut(l, " - "); ok && strings.HasPrefix(post, fstype+" ") {
			out = append(out, l)
		}
	}
	return out
}

// loopDevicesOf lists the loop devices attached to a file on the node.
func loopDevicesOf(t *testing.T, file string) []string {
	t.Helper()
	out, err := exec.Command("losetup", "--noheadings", "--output", "NAME", "--associated", file).Output()
	if err != nil {
		t.Fatalf("losetup --associated %s: %v", file, err)
	}
	return strings.Fields(string(out))
}

// nodeName is node 1 of the local cluster, this machine: where the suite's client pods
// run (clientPod), so where their volumes are staged and checked.
func nodeName(t *testing.T) string {
	t.Helper()
	n := hostNode()
	if _, err := client.CoreV1().Nodes().Get(bgCtx(), n, metav1.GetOptions{}); err != nil {
		t.Fatalf("node 1 of the local cluster, where the suite's clients run: %v", err)
	}
	return n
}

// kubectlCmd is the cluster's kubectl with args.
func kubectlCmd(args ...string) *exec.Cmd {
	kubeconfig := os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		kubeconfig = filepath.Join(repo, "_output", "cluster", "kubeconfig")
	}
	return exec.Command(filepath.Join(repo, "_output", "bin", "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
}

// kubectl runs the cluster's kubectl and returns its standard output.
func kubectl(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := kubectlCmd(args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl %v: %v\n%s%s", args, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// TestExampleLoopBlock: a Block volume (Immediate binding) and a Filesystem volume
// (WaitForFirstConsumer) of examples/loop-block, each written, unstaged, restaged and read
// back; the data is in the backing file on the node; nothing stays attached or mounted;
// deleting the claims removes the files.
func TestExampleLoopBlock(t *testing.T) {
	inLane(t, laneLoopBlock)
	start := time.Now()
	waitExample(t, "loop-block")
	e := newEnv(t)
	node := nodeName(t)
	immediate := e.exampleSC("loop-block", nil, storagev1.VolumeBindingImmediate, node)
	late := e.exampleSC("loop-block", nil, storagev1.VolumeBindingWaitForFirstConsumer, node)

	// Block.
	disk := e.claim("disk", immediate, claimOpts{size: "16Mi", mode: corev1.PersistentVolumeBlock})
	pv := e.waitBound("disk")
	handle := pv.Spec.CSI.VolumeHandle
	if want := "pvc-" + string(disk.UID) + "." + node; handle != want {
		t.Fatalf("handle %q, want %q (pvc-<uid>.<node>)", handle, want)
	}
	file := filepath.Join(loopBlockDir, handle+".img")
	if st, err := os.Stat(file); err != nil || st.Size() != 16<<20 {
		t.Fatalf("backing file %s: %v (size %v), want 16Mi", file, err, st)
	}
	marker := "pav-loop-block-" + e.ns
	out := e.runClient("writer", "blockdev --getsize64 /dev/disk && echo "+marker+" | dd of=/dev/disk bs=512 seek=2048 count=1 conv=sync 2>/dev/null && sync", "disk")
	if out != "16777216\n" {
		t.Fatalf("writer saw %q, want the 16Mi device", out)
	}
	e.deletePod("writer")
	e.waitUnstaged("loop-block", handle)
	e.poll("no loop device on "+file, func() (bool, error) { return len(loopDevicesOf(t, file)) == 0, nil })
	raw, err := os.ReadFile(file)
	if err != nil || !bytes.HasPrefix(raw[1<<20:], []byte(marker+"\n")) {
		t.Fatalf("the backing file does not hold what the pod wrote at 1 MiB (%v)", err)
	}
	if out := e.runClient("reader", "dd if=/dev/disk bs=512 skip=2048 count=1 2>/dev/null | head -n 1", "disk"); out != marker+"\n" {
		t.Fatalf("reader read %q after restaging, want %q", out, marker)
	}
	e.deletePod("reader")
	e.waitUnstaged("loop-block", handle)

	// Filesystem, made on the node of its first pod.
	fs := e.claim("fs", late, claimOpts{size: "32Mi"})
	e.clientPod("fswriter", "grep ' /data/fs ' /proc/mounts | cut -d' ' -f3 && echo "+marker+" > /data/fs/file && sync", "fs")
	e.waitPodPhase("fswriter", corev1.PodSucceeded)
	if out := e.logs("fswriter"); out != "ext4\n" {
		t.Fatalf("fswriter saw %q, want an ext4 mount", out)
	}
	fsPV := e.waitBound("fs")
	got, _ := client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, "fs", metav1.GetOptions{})
	if got.Annotations["volume.kubernetes.io/selected-node"] != node || fsPV.Spec.CSI.VolumeHandle != "pvc-"+string(fs.UID)+"."+node {
		t.Fatalf("WaitForFirstConsumer: selected node %q, handle %q", got.Annotations["volume.kubernetes.io/selected-node"], fsPV.Spec.CSI.VolumeHandle)
	}
	// Node-local through CSI topology: the PV's node affinity names the node that holds
	// its file, so the scheduler never sends its pods elsewhere (the External Storage
	// suite's topology and multi-node specs rely on it).
	if !pvAffinityNames(fsPV, "kubernetes.io/hostname", node) {
		t.Fatalf("PV %s node affinity %v, want kubernetes.io/hostname %s", fsPV.Name, fsPV.Spec.NodeAffinity, node)
	}
	fsFile := filepath.Join(loopBlockDir, fsPV.Spec.CSI.VolumeHandle+".img")
	e.deletePod("fswriter")
	e.waitUnstaged("loop-block", fsPV.Spec.CSI.VolumeHandle)
	e.poll("no loop device on "+fsFile, func() (bool, error) { return len(loopDevicesOf(t, fsFile)) == 0, nil })
	if out := e.runClient("fsreader", "cat /data/fs/file", "fs"); out != marker+"\n" {
		t.Fatalf("fsreader read %q, want %q", out, marker)
	}
	e.deletePod("fsreader")
	e.waitUnstaged("loop-block", fsPV.Spec.CSI.VolumeHandle)

	e.deleteClaim("disk")
	e.deleteClaim("fs")
	e.waitPVGone(pv.Name)
	e.waitPVGone(fsPV.Name)
	for _, f := range []string{file, fsFile} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Fatalf("backing file %s still there after deletion: %v", f, err)
		}
	}
	t.Logf("TestExampleLoopBlock took %v", time.Since(start).Round(time.Second))
}

// pvAffinityNames tells whether a PV's required node affinity is exactly key = value.
func pvAffinityNames(pv *corev1.PersistentVolume, key, value string) bool {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return false
	}
	terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 {
		return false
	}
	m := terms[0].MatchExpressions[0]
	return m.Key == key && m.Operator == corev1.NodeSelectorOpIn && len(m.Values) == 1 && m.Values[0] == value
}

// dmAvailable tells whether this node's kernel has device-mapper. /proc/misc is the
// kernel's own list; /dev/mapper/control alone proves nothing (libdevmapper creates that
// node itself, even where the kernel has no device-mapper).
func dmAvailable() bool {
	b, err := os.ReadFile("/proc/misc")
	return err == nil && regexp.MustCompile(`(?m)\sdevice-mapper$`).Match(b)
}

// TestExampleEncryption: examples/encryption over a loop-block Block claim. Creation
// LUKS2-formats the underlying device with the Secret's passphrase (checked from a pod with
// luksDump and --test-passphrase) and reports its size less the LUKS2 data offset; deletion
// destroys the key slots and zeroes the header area. Opening needs device-mapper: where the
// kernel has it, a pod writes and reads the decrypted device and the ciphertext never holds
// the plaintext; where it has none, staging fails with that reason (checked as such).
func TestExampleEncryption(t *testing.T) {
	inLane(t, laneLoopBlock)
	start := time.Now()
	waitExample(t, "loop-block")
	waitExample(t, "encryption")
	e := newEnv(t)
	lb := e.exampleSC("loop-block", nil, storagev1.VolumeBindingWaitForFirstConsumer, hostNode()) // the underlying volume where the clients run
	// pbkdf2 with a short iteration time: argon2id's default would take seconds and up to
	// 1 GiB of memory per luksFormat and open.
	enc := e.exampleSC("encryption", map[string]string{"pbkdf": "pbkdf2", "iterTime": "100"}, storagev1.VolumeBindingImmediate)
	passphrase := "correct horse " + e.ns
	e.secret("passphrase", map[string]string{"passphrase": passphrase})
	e.claim("ciphertext", lb, claimOpts{size: "64Mi", mode: corev1.PersistentVolumeBlock})
	e.annotatedClaim("plaintext", enc, claimOpts{size: "32Mi", mode: corev1.PersistentVolumeBlock},
		map[string]string{"crypt/underlyingClaimName": "ciphertext", "crypt/secretName": "passphrase"})
	pv := e.waitBound("plaintext")
	if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Value() != 48<<20 {
		t.Fatalf("capacity %s, want 48Mi (64Mi less the 16 MiB LUKS2 header area)", got.String())
	}
	handle := pv.Spec.CSI.VolumeHandle

	out := e.runPrivileged("luks-check", encryptionImg, fmt.Sprintf(`
		cryptsetup isLuks /dev/ciphertext && echo isLuks
		cryptsetup luksDump /dev/ciphertext | grep -E '^Version:' | tr -d ' \t'
		printf '%%s' '%s' > /tmp/key
		cryptsetup open --test-passphrase --key-file /tmp/key /dev/ciphertext && echo passphrase-ok
		printf wrong > /tmp/wrong
		cryptsetup open --test-passphrase --key-file /tmp/wrong /dev/ciphertext 2>/dev/null || echo wrong-refused
	`, passphrase), "ciphertext")
	if out != "isLuks\nVersion:2\npassphrase-ok\nwrong-refused\n" {
		t.Fatalf("the underlying device after creation:\n%s\nwant a LUKS2 header that the Secret's passphrase (only) opens", out)
	}

	t.Run("open, write, close", func(t *testing.T) {
		e := e.in(t)
		if !dmAvailable() {
			e.clientPod("opener", "true", "plaintext")
			msg := e.waitEvent("Pod", "opener", "FailedMapVolume", timeout, "volume staging failed", "has no device-mapper")
			t.Logf("staging failed as it must without device-mapper: %s", msg)
			e.deletePod("opener")
			e.waitUnstaged("encryption", handle)
			why := "the kernel lists no device-mapper in /proc/misc"
			if _, err := os.Stat("/dev/mapper/control"); err != nil {
				why += " and /dev/mapper/control is absent"
			} else {
				why += " (a /dev/mapper/control node exists, with no driver behind it)"
			}
			t.Skip("no device-mapper on this node (" + why + "): dm-crypt cannot open the volume here, so writing and reading " +
				"through it is not tested; staging was checked to fail with that reason")
		}
		secret := "pav-encryption-plaintext-" + e.ns
		out := e.runClient("writer", "blockdev --getsize64 /dev/plaintext && echo "+secret+" | dd of=/dev/plaintext bs=512 count=1 conv=sync 2>/dev/null && sync", "plaintext")
		if out != "50331648\n" {
			t.Fatalf("writer saw %q, want the 48Mi decrypted device", out)
		}
		e.deletePod("writer")
		e.waitUnstaged("encryption", handle)
		if b, _ := exec.Command("sh", "-c", "cat /sys/block/dm-*/dm/name 2>/dev/null").Output(); strings.Contains(string(b), "pav-crypt-"+handle) {
			t.Fatalf("dm-crypt mapping still open after unstaging: %s", b)
		}
		if out := e.runPrivileged("raw-check", encryptionImg, "grep -c "+secret+" /dev/ciphertext || true", "ciphertext"); out != "0\n" {
			t.Fatalf("the plaintext is on the underlying device: grep -c says %q", out)
		}
		if out := e.runClient("reader", "dd if=/dev/plaintext bs=512 count=1 2>/dev/null | head -n 1", "plaintext"); out != secret+"\n" {
			t.Fatalf("reader read %q, want %q", out, secret)
		}
		e.deletePod("reader")
		e.waitUnstaged("encryption", handle)
	})

	e.deleteClaim("plaintext")
	e.waitPVGone(pv.Name)
	out = e.runPrivileged("erase-check", encryptionImg, `
		cryptsetup isLuks /dev/ciphertext && echo still-LUKS
		echo signatures: $(wipefs --noheadings /dev/ciphertext | wc -l)
		echo non-zero bytes in the header area: $(head -c 16777216 /dev/ciphertext | tr -d '\000' | wc -c)
	`, "ciphertext")
	if out != "signatures: 0\nnon-zero bytes in the header area: 0\n" {
		t.Fatalf("the underlying device after deletion:\n%s\nwant no LUKS header left", out)
	}
	e.deleteClaim("ciphertext")
	t.Logf("TestExampleEncryption took %v", time.Since(start).Round(time.Second))
}

// TestExampleEncryptedFS: examples/encrypted-fs (gocryptfs) over a loop-block Filesystem
// claim. A pod writes a file; the underlying volume, seen by a pod and as the raw backing
// file on the node, holds neither its contents nor its name; a new pod reads it back; no
// FUSE mount outlives unstaging; deletion removes the encrypted directory.
func TestExampleEncryptedFS(t *testing.T) {
	inLane(t, laneLoopBlock)
	start := time.Now()
	waitExample(t, "loop-block")
	waitExample(t, "encrypted-fs")
	e := newEnv(t)
	lb := e.exampleSC("loop-block", nil, storagev1.VolumeBindingWaitForFirstConsumer, hostNode()) // the underlying volume where the clients run
	efs := e.exampleSC("encrypted-fs", nil, storagev1.VolumeBindingImmediate)
	e.secret("passphrase", map[string]string{"passphrase": "correct horse " + e.ns})
	e.claim("ciphertext", lb, claimOpts{size: "64Mi"})
	e.annotatedClaim("private", efs, claimOpts{size: "32Mi"},
		map[string]string{"encrypted-fs/underlyingClaimName": "ciphertext", "encrypted-fs/secretName": "passphrase"})
	pv := e.waitBound("private")
	handle := pv.Spec.CSI.VolumeHandle
	if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Value() != 32<<20 {
		t.Fatalf("capacity %s, want 32Mi", got.String())
	}
	under := e.waitBound("ciphertext")

	secret := "pav-plaintext-" + rand.String(12)
	name := "diary-" + secret + ".txt"
	if out := e.runClient("writer", "echo "+secret+" > /data/private/"+name+" && ls /data/private", "private"); out != name+"\n" {
		t.Fatalf("writer listed %q", out)
	}
	e.deletePod("writer")
	e.waitUnstaged("encrypted-fs", handle)
	if m := fuseMounts("fuse.gocryptfs"); len(m) != 0 {
		t.Fatalf("gocryptfs mounts left on the node after unstaging: %v", m)
	}

	// The ciphertext, as a pod of the underlying claim sees it.
	out := e.runClient("inspect", "cd /data/ciphertext/"+handle+" && ls && echo files: $(ls | wc -l) && ! grep -r -l "+secret+" . && ! ls -R . | grep "+secret, "ciphertext")
	if !strings.Contains(out, "gocryptfs.conf\n") || !strings.HasSuffix(out, "files: 3\n") {
		t.Fatalf("the underlying volume holds:\n%s\nwant gocryptfs.conf, gocryptfs.diriv and one encrypted file, without the plaintext", out)
	}
	e.deletePod("inspect")
	// And as raw bytes on the node, once its ext4 is unmounted: the file's contents and
	// name must be absent, while gocryptfs.conf (plain JSON naming gocryptfs) is found,
	// which shows the search would see a plaintext.
	e.waitUnstaged("loop-block", under.Spec.CSI.VolumeHandle)
	raw, err := os.ReadFile(filepath.Join(loopBlockDir, under.Spec.CSI.VolumeHandle+".img"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(secret)) {
		t.Fatal("the plaintext is in the underlying volume's backing file")
	}
	if !bytes.Contains(raw, []byte(`"Creator": "gocryptfs`)) {
		t.Fatal("gocryptfs.conf not found in the backing file: the raw search proves nothing")
	}

	if out := e.runClient("reader", "cat /data/private/"+name, "private"); out != secret+"\n" {
		t.Fatalf("reader read %q, want %q", out, secret)
	}
	e.deletePod("reader")

	// A container deletes the directory of its own subPath (the External Storage suite's
	// "should be able to unmount after the subpath directory is deleted"). gocryptfs
	// answers ENOENT for the removed directory, which the kubelet takes for "not
	// mounted": it would retry removing the mount's directory for ever, the pod staying
	// Terminating (kubernetes/kubernetes#139535). The node plugin unmounts it for the
	// kubelet, within its check interval (15 s) and the kubelet's back-off.
	e.mountsPod("subpath", "private", []string{"sleep", "3600"},
		corev1.VolumeMount{Name: "private", MountPath: "/data/private"}, corev1.VolumeMount{Name: "private", MountPath: "/sub", SubPath: "sub"})
	e.waitPodRunning("subpath")
	e.exec("subpath", "rm -r /data/private/sub && ! stat /sub")
	deleted := time.Now()
	e.deletePod("subpath")
	t.Logf("the pod whose subPath directory was deleted terminated in %v", time.Since(deleted).Round(time.Second))
	e.waitEvent("PersistentVolumeClaim", "private", nodeserver.ReasonStaleSubPathReleased, 10*time.Second, "volume-subpaths/"+pv.Name+"/client/1 ")
	e.waitUnstaged("encrypted-fs", handle)
	if m := fuseMounts("fuse.gocryptfs"); len(m) != 0 {
		t.Fatalf("gocryptfs mounts left on the node after unstaging: %v", m)
	}

	e.deleteClaim("private")
	e.waitPVGone(pv.Name)
	if out := e.runClient("after", "ls -a /data/ciphertext", "ciphertext"); strings.Contains(out, handle) {
		t.Fatalf("the encrypted directory is still on the underlying volume after deletion:\n%s", out)
	}
	e.deletePod("after")
	e.deleteClaim("ciphertext")
	e.waitPVGone(under.Name)
	t.Logf("TestExampleEncryptedFS took %v", time.Since(start).Round(time.Second))
}

// objectBucketEnv waits for the object-bucket example's driver, starts its in-cluster
// store (store.yaml, removed with the test) and returns the test's env and the
// StorageClass parameters that reach the store.
func objectBucketEnv(t *testing.T) (*env, map[string]string) {
	t.Helper()
	waitExample(t, "object-bucket")
	store := filepath.Join(repo, "examples", "object-bucket", "store.yaml")
	// A store that was there before the test is someone else's (a conformance run's
	// setup.sh, a README test): it stays.
	_, err := client.AppsV1().Deployments(storeNamespace).Get(bgCtx(), "object-store", metav1.GetOptions{})
	theirs := err == nil
	kubectl(t, "apply", "-f", store)
	// Registered before newEnv, so it runs after the test namespace (and its claims,
	// whose deletion pods need the store) is gone.
	t.Cleanup(func() {
		if theirs {
			return
		}
		if out, err := kubectlCmd("delete", "--ignore-not-found", "--wait", "--timeout=120s", "-f", store).CombinedOutput(); err != nil {
			t.Errorf("deleting the store: %v\n%s", err, out)
		}
	})
	e := newEnv(t)
	e.poll("the object store ready", func() (bool, error) {
		d, err := client.AppsV1().Deployments(storeNamespace).Get(e.ctx, "object-store", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == 1 && d.Status.UpdatedReplicas == 1, err
	})
	svc, err := client.CoreV1().Services(storeNamespace).Get(e.ctx, "object-store", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No cluster DNS here: the Service's cluster IP instead of object-store.pav-object-store.svc.
	return e, map[string]string{"endpoint": "http://" + svc.Spec.ClusterIP + ":9000",
		"secretName": "object-store-credentials", "secretNamespace": storeNamespace}
}

// s3 runs a shell script in the example store's pod, where rclone reaches the store's own
// S3 API with its credentials through the remote that s3path(path) names, as
// usage-static.yaml shows.
func s3(t *testing.T, script string) string {
	t.Helper()
	return kubectl(t, "-n", storeNamespace, "exec", "deploy/object-store", "--", "sh", "-c", "export RCLONE_CONFIG=/dev/null; "+script)
}

// s3path is the rclone remote (double-quoted for sh) of a bucket or object of the store.
func s3path(path string) string {
	return `":s3,provider=Other,endpoint=\"http://127.0.0.1:9000\",access_key_id=$ACCESS_KEY_ID,secret_access_key=$SECRET_ACCESS_KEY:` + path + `"`
}

// staticExamplePV makes a static PV of an example's driver and its claim (see staticPV).
func staticExamplePV(e *env, driverName, name, handle, size string, access corev1.PersistentVolumeAccessMode, attrs map[string]string) {
	e.t.Helper()
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{access},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef:                      &corev1.ObjectReference{Namespace: e.ns, Name: name},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driverName, VolumeHandle: handle, VolumeAttributes: attrs}},
		}}
	if _, err := client.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = client.CoreV1().PersistentVolumes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	e.claim(name, "", claimOpts{size: size, access: access, volume: name})
}

// TestExampleObjectBucket: examples/object-bucket against its own in-cluster store
// (store.yaml). A bucket per ReadWriteMany claim; two client pods see each other's
// writes through one rclone FUSE mount; the objects are in the bucket after unstaging,
// which leaves no FUSE mount; a static PV mounts an existing bucket, a missing one fails
// to stage; deleting the dynamic claim removes its bucket, the static bucket stays.
func TestExampleObjectBucket(t *testing.T) {
	inLane(t, laneObjectBucket)
	start := time.Now()
	e, params := objectBucketEnv(t)
	sc := e.exampleSC("object-bucket", params, storagev1.VolumeBindingImmediate)

	e.claim("shared", sc, claimOpts{size: "1Gi", access: corev1.ReadWriteMany})
	pv := e.waitBound("shared")
	bucket := pv.Spec.CSI.VolumeHandle
	if !strings.Contains(s3(t, "rclone lsf --dirs-only "+s3path("")), bucket+"/\n") {
		t.Fatalf("bucket %s not in the store after creation", bucket)
	}
	// The writers keep running: the kubelet unstages a volume once its pods have ended.
	for _, p := range [][2]string{{"a", "b"}, {"b", "a"}} {
		e.clientPod("writer-"+p[0], fmt.Sprintf("echo from-%s > /data/shared/%s.txt && until [ -f /data/shared/%s.txt ]; do sleep 0.5; done && cat /data/shared/%s.txt && sleep 3600",
			p[0], p[0], p[1], p[1]), "shared")
	}
	e.poll("each writer reading the other's file", func() (bool, error) {
		// What each printed so far is the last error: a timeout shows which
		// side never saw the other's file (it failed once, in a full run).
		a, b := e.logs("writer-a"), e.logs("writer-b")
		return a == "from-b\n" && b == "from-a\n", fmt.Errorf("writer-a printed %q, writer-b printed %q", a, b)
	})
	if n := len(pavPods("object-bucket", "staging", bucket+"@")); n != 1 {
		t.Fatalf("%d staging pods for one volume on one node, want 1", n)
	}
	// One FUSE file system (one device number), mounted at the staging pod's /pav/volume
	// and bound into each writer.
	devices, staged := map[string]bool{}, 0
	for _, l := range fuseMounts("fuse.rclone") {
		f := strings.Fields(l)
		devices[f[2]] = true
		if strings.HasPrefix(f[4], "/var/lib/kubelet/plugins/object-bucket/volumes/") && strings.HasSuffix(f[4], "/pav/volume") {
			staged++
		}
	}
	if len(devices) != 1 || staged != 1 {
		t.Fatalf("want one rclone FUSE file system on the node, at the staging pod's /pav/volume: %v", fuseMounts("fuse.rclone"))
	}
	// Symbolic links are kept in the bucket (rclone's --vfs-links: an object <link>.rclonelink
	// holding the target), as the suite's subPath specs need.
	if out := e.runClient("linker", "ln -s a.txt /data/shared/link && readlink /data/shared/link && cat /data/shared/link", "shared"); out != "a.txt\nfrom-a\n" {
		t.Fatalf("linker printed %q, want the link's target and a.txt's content", out)
	}
	e.deletePod("linker")
	// A file of the volume as a subPath: the kubelet opens the file, lstats its path, and
	// binds the opened file. That needs one inode per file between lookups: with rclone
	// forgetting a directory's files as soon as it lists them (dirCacheTime 0s), the lstat
	// gave the file a new inode and the bind failed ("failed to prepare subPath").
	e.mountsPod("subpath", "shared", []string{"cat", "/a.txt"}, corev1.VolumeMount{Name: "shared", MountPath: "/a.txt", SubPath: "a.txt"})
	e.pollFor("the pod with a.txt as its subPath done", 2*time.Minute, func() (bool, error) {
		p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, "subpath", metav1.GetOptions{})
		if err != nil || p.Status.Phase == corev1.PodSucceeded {
			return err == nil, err
		}
		for _, c := range p.Status.ContainerStatuses {
			if w := c.State.Waiting; w != nil {
				return false, fmt.Errorf("%s: %s", w.Reason, w.Message)
			}
		}
		return false, fmt.Errorf("phase %s", p.Status.Phase)
	})
	if out := e.logs("subpath"); out != "from-a\n" {
		t.Fatalf("the pod with a.txt as its subPath printed %q, want from-a", out)
	}
	e.deletePod("subpath")
	e.deletePod("writer-a")
	e.deletePod("writer-b")
	e.waitUnstaged("object-bucket", bucket)
	if out := s3(t, "rclone cat "+s3path(bucket+"/link.rclonelink")); out != "a.txt" {
		t.Fatalf("the bucket holds %q for the link, want its target a.txt", out)
	}
	if m := fuseMounts("fuse.rclone"); len(m) != 0 {
		t.Fatalf("rclone mounts left on the node after unstaging: %v", m)
	}
	if out := s3(t, "rclone cat "+s3path(bucket+"/a.txt")+" && rclone cat "+s3path(bucket+"/b.txt")); out != "from-a\nfrom-b\n" {
		t.Fatalf("the bucket holds %q after unstaging, want both files", out)
	}

	// Static provisioning of an existing bucket, made the way usage-static.yaml shows.
	static := "static-" + e.ns
	s3(t, "rclone mkdir "+s3path(static)+" && echo hello from the bucket | rclone rcat "+s3path(static+"/hello.txt"))
	t.Cleanup(func() { s3(t, "rclone purge "+s3path(static)) })
	staticExamplePV(e, "object-bucket", "existing", static, "1Ei", corev1.ReadWriteMany, params)
	e.waitBound("existing")
	if out := e.runClient("static-reader", "cat /data/existing/hello.txt && echo written by a pod > /data/existing/new.txt", "existing"); out != "hello from the bucket\n" {
		t.Fatalf("static-reader read %q", out)
	}
	e.deletePod("static-reader")
	e.waitUnstaged("object-bucket", static)
	if out := s3(t, "rclone cat "+s3path(static+"/new.txt")); out != "written by a pod\n" {
		t.Fatalf("new.txt in the static bucket: %q", out)
	}
	staticExamplePV(e, "object-bucket", "missing", "no-such-bucket-"+e.ns, "1Ei", corev1.ReadWriteMany, params)
	e.waitBound("missing")
	e.clientPod("missing-reader", "true", "missing")
	e.waitEvent("Pod", "missing-reader", "FailedMount", timeout, "volume staging failed", "directory not found")
	e.deletePod("missing-reader")

	e.deleteClaim("shared")
	e.waitPVGone(pv.Name)
	buckets := s3(t, "rclone lsf --dirs-only "+s3path(""))
	if strings.Contains(buckets, bucket+"/") || !strings.Contains(buckets, static+"/") {
		t.Fatalf("after deleting the dynamic claim the store lists:\n%s\nwant %s gone and %s kept", buckets, bucket, static)
	}
	e.deleteClaim("existing")
	t.Logf("TestExampleObjectBucket took %v", time.Since(start).Round(time.Second))
}

// TestPaVExamplesOnTheAPIServer: PaV 0.1.1's three example provisioners (test/pav-0.1.1)
// are created on the cluster and deleted again within 60 s, as PaV's own
// create-example-provisioners system test does; every examples/<name>/provisioner.yaml
// (deployed already, under its own name) passes a server-side dry-run create under another.
func TestPaVExamplesOnTheAPIServer(t *testing.T) {
	inLane(t, laneOwn)
	files, _ := filepath.Glob(filepath.Join(repo, "test", "pav-0.1.1", "examples", "*", "provisioner.yaml"))
	if len(files) != 3 {
		t.Fatalf("PaV's examples: %v", files)
	}
	for _, f := range files {
		kubectl(t, "create", "-f", f)
		kubectl(t, "delete", "-f", f, "--timeout=60s")
	}
	ours, _ := filepath.Glob(filepath.Join(repo, "examples", "*", "provisioner.yaml"))
	for _, f := range ours {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			t.Fatal(err)
		}
		u.SetName("e2e-dry-run-" + u.GetName())
		if _, err := dyn.Resource(v1alpha1.GroupVersionResource).Create(bgCtx(), u, metav1.CreateOptions{
			DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}); err != nil {
			t.Errorf("%s: the API server refuses it: %v", f, err)
		}
	}
}
