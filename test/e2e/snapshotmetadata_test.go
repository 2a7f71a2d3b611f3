//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// Changed block tracking (spec.snapshotMetadata), as a backup application uses it: a client
// in the cluster, with a ServiceAccount bound to external-snapshot-metadata's client role,
// finds the driver's SnapshotMetadataService, gets a token for its audience and calls the
// csi-snapshot-metadata sidecar over TLS (hack/tools/snapshot-metadata: upstream's own client
// library, pav.local/snapshot-metadata-client:dev).

var snapshotMetadataServices = schema.GroupVersionResource{Group: "cbt.storage.k8s.io", Version: "v1beta1", Resource: "snapshotmetadataservices"}

const snapshotMetadataClientImage = "pav.local/snapshot-metadata-client:dev"

// cbtClientRole is external-snapshot-metadata v1.1.0's
// deploy/snapshot-metadata-client-cluster-role.yaml, vendored in testdata.
const cbtClientRole = "testdata/snapshot-metadata-client-cluster-role.yaml"

// listing is what the client prints (hack/tools/snapshot-metadata).
type listing struct {
	Type     string     `json:"type"`
	Capacity int64      `json:"capacity"`
	Messages int        `json:"messages"`
	Ranges   [][2]int64 `json:"ranges"`
	Verified bool       `json:"verified"`
	Error    string     `json:"error"`
	Code     string     `json:"code"`
}

// backupClient is a running client pod and what it needs.
type backupClient struct {
	e   *env
	pod string
}

// newBackupClient makes a ServiceAccount bound to the client role, and a pod of it that
// can reach the sidecars of the given provisioners: the local cluster has no DNS, so the
// pod's /etc/hosts maps each SnapshotMetadataService's host to its Service's cluster IP (a
// real cluster's DNS resolves "<service>.<namespace>"). claims are attached at
// /dev/<name> (Block).
func (e *env) newBackupClient(name string, provisioners []string, devices map[string]string) *backupClient {
	e.t.Helper()
	sa := name
	if _, err := client.CoreV1().ServiceAccounts(e.ns).Create(e.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	b, err := os.ReadFile(cbtClientRole)
	if err != nil {
		e.t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(b, role); err != nil {
		e.t.Fatal(err)
	}
	role.Name = e.ns + "-cbt-client"
	if _, err := client.RbacV1().ClusterRoles().Create(e.ctx, role, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: e.ns}},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name}}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(e.ctx, binding, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = client.RbacV1().ClusterRoleBindings().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
		_ = client.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{})
	})
	var aliases []corev1.HostAlias
	for _, p := range provisioners {
		host, svc := e.snapshotMetadataService(p)
		aliases = append(aliases, corev1.HostAlias{IP: svc.Spec.ClusterIP, Hostnames: []string{host}})
	}
	c := corev1.Container{Name: "client", Image: snapshotMetadataClientImage, ImagePullPolicy: corev1.PullIfNotPresent,
		Command: []string{"sleep", "3600"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{ServiceAccountName: sa, RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr(int64(1)),
			HostAliases: aliases}}
	for claim, dev := range devices {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: claim, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
		c.VolumeDevices = append(c.VolumeDevices, corev1.VolumeDevice{Name: claim, DevicePath: dev})
	}
	pod.Spec.Containers = []corev1.Container{c}
	if _, err := client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.waitPodRunning(name)
	return &backupClient{e: e, pod: name}
}

// snapshotMetadataService waits for a provisioner's SnapshotMetadataService and its
// condition, and returns the host of its address and its Service.
func (e *env) snapshotMetadataService(provisioner string) (string, *corev1.Service) {
	e.t.Helper()
	var address string
	e.poll("SnapshotMetadataService "+provisioner+" and condition SnapshotMetadata", func() (bool, error) {
		u, err := dyn.Resource(snapshotMetadataServices).Get(e.ctx, provisioner, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		address, _, _ = unstructured.NestedString(u.Object, "spec", "address")
		c, err := provisionerCondition(e.ctx, provisioner, v1alpha1.ConditionSnapshotMetadata)
		if err != nil {
			return false, err
		}
		if c.Status != metav1.ConditionTrue {
			return false, fmt.Errorf("condition SnapshotMetadata %s: %s", c.Reason, c.Message)
		}
		return address != "", nil
	})
	host, _, _ := strings.Cut(address, ":")
	svcName, ns, _ := strings.Cut(host, ".")
	svc, err := client.CoreV1().Services(ns).Get(e.ctx, svcName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("the Service of SnapshotMetadataService %s (address %s): %v", provisioner, address, err)
	}
	return host, svc
}

// list runs the client with args; an error answer is returned, not fatal.
func (c *backupClient) list(args ...string) listing {
	c.e.t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := kubectlCmd(append([]string{"exec", "-n", c.e.ns, c.pod, "--", "/snapshot-metadata-client", "-namespace", c.e.ns}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var l listing
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &l); err != nil {
		c.e.t.Fatalf("client %v: %v (run: %v)\n%s%s", args, err, runErr, stdout.String(), stderr.String())
	}
	if (runErr != nil) != (l.Error != "") {
		c.e.t.Fatalf("client %v: exit %v with %+v", args, runErr, l)
	}
	return l
}

// mustList is list that fails the test on an error answer.
func (c *backupClient) mustList(args ...string) listing {
	c.e.t.Helper()
	l := c.list(args...)
	if l.Error != "" {
		c.e.t.Fatalf("client %v: %s (%s)", args, l.Error, l.Code)
	}
	return l
}

// blocks is a set of 4 KiB blocks, by index.
type blocks map[int64]bool

// of is the set of 4 KiB blocks the ranges touch.
func blocksOf(ranges [][2]int64) blocks {
	b := blocks{}
	for _, r := range ranges {
		for i := r[0] / 4096; i*4096 < r[0]+r[1]; i++ {
			b[i] = true
		}
	}
	return b
}

func (b blocks) String() string {
	var l []int64
	for i := range b {
		l = append(l, i)
	}
	slices.Sort(l)
	return fmt.Sprint(l)
}

// TestLoopBlockChangedBlocks: a Block volume of examples/loop-block is written, snapshot 1
// is cut, more blocks are written (one rewritten, one new), snapshot 2 is cut. Through the
// csi-snapshot-metadata sidecar, as a backup application: snapshot 1's allocated ranges are
// exactly the written blocks (FIXED or VARIABLE, in pages of max_results); the ranges
// changed between 1 and 2 are exactly the two blocks written since, also when resumed at an
// offset; a restore of snapshot 1 with the changed ranges copied from a restore of snapshot
// 2 equals that restore (upstream's verifier); a base snapshot of another volume is refused
// (INVALID_ARGUMENT). One pod per listing, none left, no listing left in the records.
func TestLoopBlockChangedBlocks(t *testing.T) {
	inLane(t, laneLoopBlock)
	start := time.Now()
	requireSnapshotCRDs(t)
	waitExample(t, "loop-block")
	requireSidecar(t, "loop-block", "snapshot-metadata")
	e := newEnv(t)
	node := nodeName(t)
	sc := e.exampleSC("loop-block", nil, storagev1.VolumeBindingImmediate, node)
	vsc := e.snapshotClass("loop-block")
	const mib = 1 << 20

	// Written 4 KiB blocks (by index), with data of their own (no block of zeros, which a
	// sparse copy would not keep).
	write := func(pod, claim string, idx ...int64) {
		var s []string
		for _, i := range idx {
			s = append(s, fmt.Sprintf("dd if=/dev/urandom of=/dev/%s bs=4096 seek=%d count=1 conv=notrunc 2>/dev/null", claim, i))
		}
		e.runClient(pod, strings.Join(s, " && ")+" && sync", claim)
		e.deletePod(pod)
	}
	e.claim("data", sc, claimOpts{size: "64Mi", mode: corev1.PersistentVolumeBlock})
	handle := e.waitBound("data").Spec.CSI.VolumeHandle
	first := []int64{0, 1, mib / 4096, (4*mib + 8192) / 4096}
	write("writer-1", "data", first...)
	e.waitUnstaged("loop-block", handle)
	e.volumeSnapshot("snap-1", vsc, "data")
	s1 := e.waitSnapshotReady("snap-1")
	second := []int64{mib / 4096, 8 * mib / 4096}
	write("writer-2", "data", second...)
	e.waitUnstaged("loop-block", handle)
	e.volumeSnapshot("snap-2", vsc, "data")
	s2 := e.waitSnapshotReady("snap-2")

	// Another volume, and its snapshot: never a base of data's.
	e.claim("other", sc, claimOpts{size: "1Mi", mode: corev1.PersistentVolumeBlock})
	e.waitBound("other")
	e.volumeSnapshot("other-snap", vsc, "other")
	e.waitSnapshotReady("other-snap")

	// Restores of both snapshots, for the verifier.
	e.sourcedClaim("restored-1", sc, claimOpts{size: "64Mi", mode: corev1.PersistentVolumeBlock}, snapshotSource("snap-1"))
	e.sourcedClaim("restored-2", sc, claimOpts{size: "64Mi", mode: corev1.PersistentVolumeBlock}, snapshotSource("snap-2"))
	e.waitBound("restored-1")
	e.waitBound("restored-2")
	c := e.newBackupClient("backup", []string{"loop-block"}, map[string]string{"restored-2": "/dev/source", "restored-1": "/dev/target"})

	// Allocated: exactly the written blocks, in pages of at most 2 ranges.
	alloc := c.mustList("-snapshot", "snap-1", "-max-results", "2")
	if got, want := blocksOf(alloc.Ranges), blocksOf(rangesOf(first)); got.String() != want.String() {
		t.Errorf("snapshot 1's allocated blocks %v, want the written %v (ranges %v)", got, want, alloc.Ranges)
	}
	if alloc.Capacity != 64*mib || alloc.Messages != (len(alloc.Ranges)+1)/2 {
		t.Errorf("capacity %d in %d messages for %d ranges (max_results 2)", alloc.Capacity, alloc.Messages, len(alloc.Ranges))
	}
	// Changed since snapshot 1: exactly the two blocks written since.
	delta := c.mustList("-snapshot", "snap-2", "-prev-snapshot", "snap-1")
	if got, want := blocksOf(delta.Ranges), blocksOf(rangesOf(second)); got.String() != want.String() {
		t.Errorf("changed blocks %v, want %v (ranges %v)", got, want, delta.Ranges)
	}
	// Resumed just past the start of the first changed block: from that block on.
	resumed := c.mustList("-snapshot", "snap-2", "-prev-snapshot", "snap-1", "-starting-offset", fmt.Sprint(mib+1))
	if got, want := blocksOf(resumed.Ranges), blocksOf(rangesOf(second)); got.String() != want.String() {
		t.Errorf("resumed at %d: %v, want %v", mib+1, got, want)
	}
	// Restore of 1 + the changed ranges copied from a restore of 2 = the restore of 2.
	if v := c.mustList("-snapshot", "snap-2", "-prev-snapshot", "snap-1", "-verify-source", "/dev/source", "-verify-target", "/dev/target"); !v.Verified {
		t.Errorf("verifier: %+v", v)
	}
	// A base snapshot of another volume: refused, and said why.
	bad := c.list("-snapshot", "snap-2", "-prev-snapshot", "other-snap")
	if bad.Code != "InvalidArgument" || !strings.Contains(bad.Error, "changed blocks are listed between two snapshots of one volume") {
		t.Errorf("a base of another volume: %s (%s), want InvalidArgument", bad.Error, bad.Code)
	}
	// Past the end: OUT_OF_RANGE.
	if past := c.list("-snapshot", "snap-1", "-starting-offset", fmt.Sprint(64*mib+1)); past.Code != "OutOfRange" {
		t.Errorf("starting_offset past the capacity: %s (%s), want OutOfRange", past.Error, past.Code)
	}

	// One pod per listing (allocated, changed; the resumed and verified calls were
	// served by the changed listing's result), none left, no listing in the records.
	if pods := pavPods("loop-block", string(v1alpha1.PhaseSnapshotMetadata), ""); len(pods) != 0 {
		t.Errorf("snapshotMetadata pods left: %v", podNames(pods))
	}
	for _, s := range []readySnapshot{s1, s2} {
		if n := metadataListings(t, s.uid); n != 0 {
			t.Errorf("snapshot %s keeps %d listings in its PavSnapshot", s.handle, n)
		}
	}
	t.Logf("changed block tracking: %v", time.Since(start).Round(time.Second))
}

func rangesOf(idx []int64) [][2]int64 {
	var out [][2]int64
	for _, i := range idx {
		out = append(out, [2]int64{i * 4096, 4096})
	}
	return out
}

func podNames(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	return out
}

// metadataListings counts the listings recorded in the PavSnapshot of a VolumeSnapshot
// (by its UID: csi-snapshotter names the CSI snapshot snapshot-<uid>).
func metadataListings(t *testing.T, uid string) int {
	t.Helper()
	u, err := dyn.Resource(pavSnapshotsResource).Get(bgCtx(), "snapshot-"+uid, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	l, _, _ := unstructured.NestedSlice(u.Object, "status", "metadataListings")
	return len(l)
}

// badBlocks is a provisioner whose volumes and snapshots need no pod, and whose
// snapshotMetadata pod lists its ranges out of order.
func badBlocks(name string) string {
	return fmt.Sprintf(`apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: %s
spec:
  provisioningModes: [Dynamic]
  volumeValidation: {volumeModes: [Block]}
  volumeCreation: {capacity: 1Mi}
  volumeStaging:
    podTemplate:
      spec:
        containers:
          - {name: stage, image: %s, imagePullPolicy: IfNotPresent, command: [sh, -c, "true"]}
  snapshotCreation: {}
  snapshotMetadata:
    podTemplate:
      spec:
        containers:
          - name: list
            image: %s
            imagePullPolicy: IfNotPresent
            command: [sh, -c, "printf '8192 4096\n0 4096\n' > /pav/blocks"]
`, name, busybox, busybox)
}

// TestSnapshotMetadataBadBlocks: a snapshotMetadata pod that lists its ranges out of order
// fails the backup application's call with the line and the fix (INTERNAL, through the
// sidecar), puts a Warning event on the VolumeSnapshot, and leaves no pod or listing.
func TestSnapshotMetadataBadBlocks(t *testing.T) {
	inLane(t, laneOwn)
	requireSnapshotCRDs(t)
	e := newEnv(t)
	name := "cbt-" + e.ns
	e.newProvisioner(badBlocks(name))
	requireSidecar(t, name, "snapshot-metadata")
	sc := e.storageClassOf(name)
	vsc := e.snapshotClass(name)
	e.claim("data", sc, claimOpts{size: "1Mi", mode: corev1.PersistentVolumeBlock})
	e.waitBound("data")
	e.volumeSnapshot("snap", vsc, "data")
	s := e.waitSnapshotReady("snap")
	c := e.newBackupClient("backup", []string{name}, nil)

	got := c.list("-snapshot", "snap")
	if got.Code != "Internal" || !strings.Contains(got.Error, `/pav/blocks line 2 ("0 4096"): not sorted: it starts before the range above it (8192 4096)`) ||
		!strings.Contains(got.Error, "write one range per line") {
		t.Errorf("a bad list: %s (%s), want INTERNAL naming the line and the fix", got.Error, got.Code)
	}
	e.waitEvent("VolumeSnapshot", "snap", "InvalidSnapshotMetadata", time.Minute, "line 2")
	if pods := pavPods(name, string(v1alpha1.PhaseSnapshotMetadata), ""); len(pods) != 0 {
		t.Errorf("snapshotMetadata pods left: %v", podNames(pods))
	}
	if n := metadataListings(t, s.uid); n != 0 {
		t.Errorf("%d listings left in the PavSnapshot", n)
	}
	e.deleteSnapshot("snap", s.content)
}
