//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// Dynamic provisioning end to end: PVC → creation pod → PV; the StorageClass
// may go away; the staging pod's files (from templates) reach the client; the
// deletion pod runs with the real handle and capacity; the PV goes.
func TestDynamicProvisioning(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	sc := e.storageClass(map[string]string{"color": "it's blue"}, corev1.PersistentVolumeReclaimDelete)
	e.claim("data", sc, claimOpts{size: "2Mi"})
	pv := e.waitBound("data")
	handle := pv.Spec.CSI.VolumeHandle
	if want := "e2e-" + e.ns + "-data"; handle != want {
		t.Fatalf("handle %q, want %q (from the creation pod's /pav/handle)", handle, want)
	}
	if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.Value() != 2<<20 {
		t.Fatalf("PV capacity %s, want 2Mi", got.String())
	}
	if err := clientDeleteSC(e, sc); err != nil {
		t.Fatal(err)
	}
	out := e.runClient("reader", "cat /data/data/claim /data/data/handle /data/data/params.json", "data")
	// tojson escapes ' as \u0027 (Jinja's htmlsafe JSON, spec §2).
	want := fmt.Sprintf("data\n%s\n{\"color\": \"it\\u0027s blue\"}\n", handle)
	if out != want {
		t.Fatalf("client read %q, want %q", out, want)
	}
	e.deletePod("reader")
	e.waitMarker("unstaged", handle)
	e.deleteClaim("data")
	e.waitPVGone(pv.Name)
	if got := e.waitMarker("deleted", handle); got != "2097152" {
		t.Fatalf("deletion pod saw capacity %q, want 2097152", got)
	}
}

func clientDeleteSC(e *env, name string) error {
	return client.StorageV1().StorageClasses().Delete(e.ctx, name, metav1.DeleteOptions{})
}

// A PV with reclaim policy Retain outlives its claim, and its volume is not deleted.
func TestRetainIsNeverDeleted(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	sc := e.storageClass(nil, corev1.PersistentVolumeReclaimRetain)
	e.claim("kept", sc, claimOpts{})
	pv := e.waitBound("kept")
	t.Cleanup(func() {
		_ = client.CoreV1().PersistentVolumes().Delete(e.ctx, pv.Name, metav1.DeleteOptions{})
		// The volume is kept, and so is pav's record of it (what deleting it
		// would need): an operator done with it deletes both.
		_ = dyn.Resource(v1alpha1.VolumeGroupVersionResource).Delete(e.ctx, v1alpha1.VolumeRecordName(pv.Name), metav1.DeleteOptions{})
	})
	e.deleteClaim("kept")
	e.poll("PV Released", func() (bool, error) {
		p, err := client.CoreV1().PersistentVolumes().Get(e.ctx, pv.Name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.VolumeReleased, err
	})
	time.Sleep(5 * time.Second)
	if _, err := client.CoreV1().PersistentVolumes().Get(e.ctx, pv.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("Retain PV gone: %v", err)
	}
	if _, ok := marker("deleted", pv.Spec.CSI.VolumeHandle); ok {
		t.Fatal("the deletion pod ran for a Retain volume")
	}
	if v, err := record(e.ctx, pv.Name); err != nil || v == nil || v.Status.Phase != v1alpha1.VolumeCreated {
		t.Fatalf("the record of a retained volume: %+v, %v", v, err)
	}
}

func staticPV(e *env, name, handle, size string, access corev1.PersistentVolumeAccessMode, attrs map[string]string) {
	e.t.Helper()
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{access},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "",
			ClaimRef:                      &corev1.ObjectReference{Namespace: e.ns, Name: name},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: handle, VolumeAttributes: attrs}},
		}}
	if _, err := client.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = client.CoreV1().PersistentVolumes().Delete(e.ctx, name, metav1.DeleteOptions{}) })
	e.claim(name, "", claimOpts{size: size, access: access, volume: name})
}

// Static provisioning: a PV naming the driver is staged after static
// validation (PaV documented it but never ran it); an invalid one never stages.
func TestStaticProvisioning(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	handle := "static-" + e.ns
	staticPV(e, "good", handle, "1Mi", corev1.ReadWriteOnce, map[string]string{"color": "red"})
	e.waitBound("good")
	out := e.runClient("reader", "cat /data/good/claim /data/good/handle /data/good/params.json", "good")
	if want := fmt.Sprintf("good\n%s\n{\"color\": \"red\"}\n", handle); out != want {
		t.Fatalf("client read %q, want %q", out, want)
	}

	staticPV(e, "too-big", "static-big-"+e.ns, "2Gi", corev1.ReadWriteOnce, nil)
	e.waitBound("too-big")
	e.clientPod("blocked", "true", "too-big")
	e.waitEvent("Pod", "blocked", "FailedMount", timeout, "above the provisioner's maximum 1Gi")
	if n := len(stagingPodsOf("static-big-" + e.ns)); n != 0 {
		t.Fatalf("%d staging pods for an invalid static volume", n)
	}
}

func stagingPodsOf(handle string) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range phasePods(bgCtx(), "staging") {
		if strings.HasPrefix(p.Annotations["pav.albertofaria.github.io/volume-key"], handle+"@") {
			out = append(out, p)
		}
	}
	return out
}

// A staging pod that keeps running (a FUSE daemon would): it mounts a tmpfs at
// /pav/volume and touches /pav/ready. The client sees the mount; unstaging
// removes the staging pod, runs the unstaging pod, and leaves no mount behind.
func TestLongRunningStagingPod(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	sc := e.storageClass(map[string]string{"scenario": "tmpfs"}, corev1.PersistentVolumeReclaimDelete)
	e.claim("fuse", sc, claimOpts{size: "4Mi"})
	pv := e.waitBound("fuse")
	handle := pv.Spec.CSI.VolumeHandle
	out := e.runClient("reader", "cat /data/fuse/claim; grep /data/fuse /proc/mounts | cut -d' ' -f3", "fuse")
	if out != "fuse\ntmpfs\n" {
		t.Fatalf("client read %q, want the claim name and a tmpfs mount", out)
	}
	if pods := stagingPodsOf(handle); len(pods) != 1 || pods[0].Status.Phase != corev1.PodRunning {
		t.Fatalf("want one running staging pod, got %d", len(pods))
	}
	if m := hostMounts(volumesDir); len(m) == 0 {
		t.Fatal("the staging pod's tmpfs is not visible on the host")
	}
	e.deletePod("reader")
	e.waitMarker("unstaged", handle)
	e.poll("staging pod gone", func() (bool, error) { return len(stagingPodsOf(handle)) == 0, nil })
	if m := hostMounts(volumesDir); len(m) != 0 {
		t.Fatalf("mounts left on the host: %v", m)
	}
}

// A Block volume: the staging pod exposes a loop device of the volume's size;
// the client writes and reads it through volumeDevices.
func TestBlockVolume(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	sc := e.storageClass(nil, corev1.PersistentVolumeReclaimDelete)
	e.claim("disk", sc, claimOpts{size: "8Mi", mode: corev1.PersistentVolumeBlock})
	pv := e.waitBound("disk")
	out := e.runClient("writer", "echo pav-block-data | dd of=/dev/disk bs=512 count=1 conv=sync 2>/dev/null && dd if=/dev/disk bs=14 count=1 2>/dev/null && echo && blockdev --getsize64 /dev/disk", "disk")
	if out != "pav-block-data\n8388608\n" {
		t.Fatalf("block client read %q", out)
	}
	e.deletePod("writer")
	e.waitMarker("unstaged", pv.Spec.CSI.VolumeHandle)
	if out, _ := exec.Command("losetup", "--list", "--noheadings", "--output", "BACK-FILE").Output(); strings.Contains(string(out), volumesDir) {
		t.Fatalf("loop device left attached: %s", out)
	}
}

// Two client pods on the node share one staging pod; a pod may use three volumes.
func TestSharingAndManyVolumes(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	sc := e.storageClass(map[string]string{"scenario": "tmpfs"}, corev1.PersistentVolumeReclaimDelete)
	e.claim("shared", sc, claimOpts{})
	pv := e.waitBound("shared")
	for _, name := range []string{"one", "two"} {
		e.clientPod(name, "cat /data/shared/claim; sleep 3600", "shared")
	}
	e.waitPodRunning("one")
	e.waitPodRunning("two")
	if n := len(stagingPodsOf(pv.Spec.CSI.VolumeHandle)); n != 1 {
		t.Fatalf("%d staging pods for one volume on one node, want 1", n)
	}
	e.deletePod("one")
	e.deletePod("two")
	e.waitMarker("unstaged", pv.Spec.CSI.VolumeHandle)

	plain := e.storageClass(nil, corev1.PersistentVolumeReclaimDelete)
	for _, n := range []string{"a", "b", "c"} {
		e.claim(n, plain, claimOpts{})
	}
	for _, n := range []string{"a", "b", "c"} {
		e.waitBound(n)
	}
	if out := e.runClient("three", "cat /data/a/claim /data/b/claim /data/c/claim", "a", "b", "c"); out != "a\nb\nc\n" {
		t.Fatalf("three volumes read %q", out)
	}
}

// Failures surface as readable events on the PVC (provisioning) or the pod
// (staging), and nothing hangs.
func TestProvisioningFailures(t *testing.T) {
	inLane(t, lanePavE2E)
	for _, tc := range []struct {
		name     string
		params   map[string]string
		opts     claimOpts
		within   time.Duration
		want     []string
		deletion bool // the deletion pod reverts a failed creation
	}{
		{name: "validation pod fails", params: map[string]string{"scenario": "fail-validation", "color": "pink"}, want: []string{"volume validation failed", "color pink is not allowed"}},
		{name: "creation pod fails", params: map[string]string{"scenario": "fail-creation"}, want: []string{"volume creation failed", "backend refused volume"}, deletion: true},
		{name: "bad template", params: map[string]string{"scenario": "bad-template"}, want: []string{"spec.volumeCreation.podTemplate.spec.containers[0].command[2]", "'this_variable_does_not_exist' is undefined"}},
		{name: "image does not exist", params: map[string]string{"scenario": "bad-image"}, within: 90 * time.Second, want: []string{"pav.local/does-not-exist:never"}},
		{name: "capacity out of range", opts: claimOpts{size: "2Gi"}, want: []string{"above the provisioner's maximum 1Gi"}},
		{name: "access mode not supported", opts: claimOpts{access: corev1.ReadWriteMany}, want: []string{"access mode ReadWriteMany is not supported"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each in a namespace of its own, checked by its claim's events
			e := newEnv(t)
			sc := e.storageClass(tc.params, corev1.PersistentVolumeReclaimDelete)
			pvc := e.claim("failing", sc, tc.opts)
			within := tc.within
			if within == 0 {
				within = timeout
			}
			e.waitEvent("PersistentVolumeClaim", "failing", "ProvisioningFailed", within, tc.want...)
			if tc.deletion {
				e.waitMarker("deleted", "pvc-"+string(pvc.UID))
			}
			got, _ := client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, "failing", metav1.GetOptions{})
			if got.Status.Phase == corev1.ClaimBound {
				t.Fatal("a failing claim got bound")
			}
		})
	}
}

func TestStagingFailure(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	sc := e.storageClass(map[string]string{"scenario": "fail-staging"}, corev1.PersistentVolumeReclaimDelete)
	e.claim("broken", sc, claimOpts{})
	pv := e.waitBound("broken")
	e.clientPod("client", "true", "broken")
	e.waitEvent("Pod", "client", "FailedMount", timeout, "volume staging failed", "cannot reach the storage backend")
	e.waitMarker("unstaged", pv.Spec.CSI.VolumeHandle)
}

// The API server itself rejects malformed PavProvisioners (CRD schema and the
// validating admission policy), naming the field.
func TestInvalidProvisionersRejected(t *testing.T) {
	base := "apiVersion: pav.albertofaria.github.io/v1alpha1\nkind: PavProvisioner\nmetadata: {name: e2e-invalid}\nspec:\n"
	staging := "  volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}\n"
	for _, tc := range []struct{ name, spec, want string }{
		{"no modes", staging, "spec.provisioningModes"},
		{"unknown mode", "  provisioningModes: [Sometimes]\n" + staging, "Sometimes"},
		{"no staging", "  provisioningModes: [Static]\n", "volumeStaging"},
		{"creation without Dynamic", "  provisioningModes: [Static]\n  volumeCreation: {capacity: 1Gi}\n" + staging, "Dynamic"},
		{"zero capacity", "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 0}\n" + staging, "capacity"},
		{"min above max", "  provisioningModes: [Static]\n  volumeValidation: {minCapacity: 2Gi, maxCapacity: 1Gi}\n" + staging, "minCapacity"},
		{"unknown key", "  provisioningModes: [Static]\n  volumeStagin: {}\n" + staging, "volumeStagin"},
		{"pod template key", "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {kind: Pod, spec: {containers: [{name: c, image: b}]}}}\n", "podTemplate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(base+tc.spec), &u.Object); err != nil {
				t.Fatal(err)
			}
			_, err := dyn.Resource(v1alpha1.GroupVersionResource).Create(bgCtx(), u, metav1.CreateOptions{FieldValidation: "Strict"})
			if err == nil {
				_ = dyn.Resource(v1alpha1.GroupVersionResource).Delete(bgCtx(), "e2e-invalid", metav1.DeleteOptions{})
				t.Fatal("the API server accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("rejected with %q, want it to name %q", err, tc.want)
			}
		})
	}
}

// csi-sanity (the binary) against the plugins on the running cluster: the node
// plugin's socket on the host and the controller's socket in its pod's emptyDir. The
// plugins are those of a copy of the suite's provisioner made for this test: csi-sanity
// takes minutes, and the pav-e2e lane's tests kill that provisioner's plugins, so the test
// runs in a lane of its own beside them.
func TestCSISanityOnCluster(t *testing.T) {
	inLane(t, laneSanity)
	bin := filepath.Join(repo, "_output", "bin", "csi-sanity")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("csi-sanity not built (make tools): %v", err)
	}
	e := newEnv(t)
	y, err := os.ReadFile(filepath.Join(repo, "test", "e2e", "pav-e2e", "provisioner.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// csi-sanity wants a driver name that starts and ends with a letter
	driver := "e2e-sanity-" + strings.ToLower(rand.String(4)) + "-csi"
	if !strings.Contains(string(y), "\n  name: pav-e2e\n") {
		t.Fatal("test/e2e/pav-e2e/provisioner.yaml: no metadata.name pav-e2e to rename")
	}
	e.newProvisioner(strings.Replace(string(y), "\n  name: pav-e2e\n", "\n  name: "+driver+"\n", 1))
	pods, err := client.CoreV1().Pods("pav").List(bgCtx(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + driver + ",app.kubernetes.io/component=controller"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("controller pod: %v (%d)", err, len(pods.Items))
	}
	ctrlSock, err := findSocket(pods.Items[0].Spec.NodeName, string(pods.Items[0].UID))
	if err != nil {
		t.Fatal(err)
	}
	work := filepath.Join("/var/lib/kubelet", "pav-sanity")
	_ = os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(work)
	// The socket's path in the pod's emptyDir is longer than a unix socket
	// address may be (108 bytes): connect through a short symlink.
	ctrlLink := filepath.Join(work, "controller.sock")
	if err := os.Symlink(ctrlSock, ctrlLink); err != nil {
		t.Fatal(err)
	}
	// pav-e2e snapshots and restores only volumes of its scenario backend
	// (a directory or image in /srv/pav-e2e/backend): csi-sanity's volumes
	// are of that scenario, so that its snapshot specs run too.
	params := filepath.Join(work, "params.yaml")
	if err := os.WriteFile(params, []byte("scenario: backend\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--csi.endpoint", "/var/lib/kubelet/plugins/"+driver+"/csi.sock",
		"--csi.controllerendpoint", ctrlLink,
		"--csi.testvolumeparameters", params,
		"--csi.mountdir", filepath.Join(work, "target"),
		"--csi.stagingdir", filepath.Join(work, "staging"),
		"--csi.testvolumesize", "1048576",
		"--ginkgo.no-color")
	out, err := cmd.CombinedOutput()
	summary := ""
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "Passed") || strings.Contains(l, "Ran ") {
			summary += l + "\n"
		}
	}
	t.Logf("csi-sanity on the cluster:\n%s", summary)
	if err != nil {
		t.Fatalf("csi-sanity failed: %v\n%s", err, out)
	}
}

// findSocket finds the controller's csi.sock in its pod's emptyDir on the host.
func findSocket(node, podUID string) (string, error) {
	// On another node of the local cluster, its kubelet's directory is that node's disk here.
	matches, _ := filepath.Glob(onNode(node, filepath.Join("/var/lib/kubelet/pods", podUID, "volumes", "kubernetes.io~empty-dir", "*", "csi.sock")))
	if len(matches) != 1 {
		return "", fmt.Errorf("controller socket of pod %s: found %v", podUID, matches)
	}
	return matches[0], nil
}
