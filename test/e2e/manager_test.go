//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// The pav manager end to end: a PavProvisioner applied alone becomes a working
// provisioner; edits apply; deletion is guarded (spec §6) and leaves nothing;
// a manager killed mid-reconcile converges.

// kubectlErr runs kubectl and returns its output and error (for commands that may fail).
func kubectlErr(args ...string) (string, error) {
	out, err := exec.Command(filepath.Join(repo, "_output", "bin", "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...).CombinedOutput()
	return string(out), err
}

func provisionerCondition(ctx context.Context, name, typ string) (metav1.Condition, error) {
	p, err := getProvisioner(ctx, name)
	if err != nil {
		return metav1.Condition{}, err
	}
	if c := meta.FindStatusCondition(p.Status.Conditions, typ); c != nil {
		return *c, nil
	}
	return metav1.Condition{}, fmt.Errorf("no condition %s yet", typ)
}

func getProvisioner(ctx context.Context, name string) (*v1alpha1.PavProvisioner, error) {
	u, err := dyn.Resource(v1alpha1.GroupVersionResource).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	p := &v1alpha1.PavProvisioner{}
	return p, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p)
}

// greeter is a small provisioner (Dynamic and Static): each volume is a
// directory the staging pod fills with the greeting and the claim's name; with
// a deletion pod so that deletion has something to run.
func greeter(name, greeting string) string {
	return fmt.Sprintf(`apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: %s
spec:
  provisioningModes: [Dynamic, Static]
  volumeCreation:
    capacity: 1Mi
  volumeDeletion:
    podTemplate:
      spec:
        containers:
          - {name: delete, image: %s, imagePullPolicy: IfNotPresent, command: [sh, -c, "echo deleting {{ handle }}"]}
  volumeStaging:
    podTemplate:
      spec:
        containers:
          - name: stage
            image: %s
            imagePullPolicy: IfNotPresent
            command:
              - sh
              - -c
              - |
                mkdir -p /pav/volume
                echo %s > /pav/volume/greeting
                echo {{ pvc.metadata.name if pvc is defined else 'none' }} > /pav/volume/claim
`, name, busybox, busybox, greeting)
}

func toObject(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(y), &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

// newProvisioner creates a PavProvisioner (and deletes it, waiting, at the end
// of the test) and returns how long the manager took to make it Ready.
func (e *env) newProvisioner(y string) time.Duration {
	e.t.Helper()
	u := toObject(e.t, y)
	start := time.Now()
	if _, err := dyn.Resource(v1alpha1.GroupVersionResource).Create(e.ctx, u, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		e.t.Fatal(err)
	}
	name := u.GetName()
	e.t.Cleanup(func() {
		// This runs before the namespace goes (cleanups run last in, first out):
		// its claims go first, or the deletion would wait for their volumes.
		ctx := context.Background()
		_ = client.CoreV1().Pods(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = client.CoreV1().PersistentVolumeClaims(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		_ = dyn.Resource(v1alpha1.GroupVersionResource).Delete(ctx, name, metav1.DeleteOptions{})
		if err := waitGone(ctx, name, 2*time.Minute); err != nil {
			e.t.Errorf("cleanup: %v", err)
		}
	})
	if err := waitProvisionerReady(e.ctx, name, 2*time.Minute); err != nil {
		c, _ := provisionerCondition(e.ctx, name, v1alpha1.ConditionReady)
		e.t.Fatalf("PavProvisioner %s not Ready: %v (Ready: %s %s)", name, err, c.Reason, c.Message)
	}
	return time.Since(start)
}

// storageClassOf makes a StorageClass of any provisioner.
func (e *env) storageClassOf(provisioner string) string {
	e.t.Helper()
	name := e.ns + "-" + strings.ToLower(rand.String(4))
	kubectlApply(e.t, fmt.Sprintf("apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: %s}\nprovisioner: %s\n", name, provisioner))
	e.t.Cleanup(func() { _, _ = kubectlErr("delete", "storageclass", name, "--ignore-not-found") })
	return name
}

func kubectlApply(t *testing.T, y string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(repo, "_output", "bin", "kubectl"), "--kubeconfig", kubeconfig, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(y)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

// waitGone waits until a PavProvisioner no longer exists.
func waitGone(ctx context.Context, name string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		_, err := dyn.Resource(v1alpha1.GroupVersionResource).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("PavProvisioner %s still exists after %v", name, within)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// leftovers lists what remains of a provisioner's drivers.
func leftovers(ctx context.Context, name string) []string {
	var out []string
	if _, err := client.StorageV1().CSIDrivers().Get(ctx, name, metav1.GetOptions{}); err == nil {
		out = append(out, "CSIDriver "+name)
	}
	if _, err := client.AppsV1().StatefulSets("pav").Get(ctx, "pav-"+name+"-controller", metav1.GetOptions{}); err == nil {
		out = append(out, "StatefulSet")
	}
	if _, err := client.AppsV1().DaemonSets("pav").Get(ctx, "pav-"+name+"-node", metav1.GetOptions{}); err == nil {
		out = append(out, "DaemonSet")
	}
	pods, _ := client.CoreV1().Pods("pav").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name})
	for _, p := range pods.Items {
		out = append(out, "pod "+p.Name)
	}
	return out
}

// deleteProvisioner deletes a PavProvisioner as `kubectl delete pav NAME
// --timeout=60s` does (PaV's system tests), checks it is gone in time with
// nothing left, and returns how long it took.
func deleteProvisioner(t *testing.T, name string) time.Duration {
	t.Helper()
	start := time.Now()
	kubectl(t, "delete", "pav", name, "--timeout=60s")
	took := time.Since(start)
	if left := leftovers(context.Background(), name); len(left) > 0 {
		t.Fatalf("PavProvisioner %s deleted, but left: %v", name, left)
	}
	t.Logf("kubectl delete pav %s took %v", name, took.Round(100*time.Millisecond))
	return took
}

// A PavProvisioner applied alone serves volumes: the manager deploys its
// drivers, owned by it; an edit to its templates applies to new operations and
// changes nothing the manager applied (server-side apply, nothing re-applied);
// deleting it leaves nothing.
func TestProvisionerAppliedAlone(t *testing.T) {
	inLane(t, laneOwn)
	e := newEnv(t)
	name := "e2e-alone-" + strings.ToLower(rand.String(4))
	took := e.newProvisioner(greeter(name, "v1"))
	t.Logf("PavProvisioner %s Ready %v after kubectl create", name, took.Round(100*time.Millisecond))

	for _, what := range []struct {
		get func() (metav1.Object, error)
	}{
		{func() (metav1.Object, error) {
			return client.StorageV1().CSIDrivers().Get(e.ctx, name, metav1.GetOptions{})
		}},
		{func() (metav1.Object, error) {
			return client.AppsV1().StatefulSets("pav").Get(e.ctx, "pav-"+name+"-controller", metav1.GetOptions{})
		}},
		{func() (metav1.Object, error) {
			return client.AppsV1().DaemonSets("pav").Get(e.ctx, "pav-"+name+"-node", metav1.GetOptions{})
		}},
	} {
		o, err := what.get()
		if err != nil {
			t.Fatal(err)
		}
		if ref := metav1.GetControllerOf(o); ref == nil || ref.Kind != v1alpha1.Kind || ref.Name != name {
			t.Errorf("%s is not controlled by the PavProvisioner: %v", o.GetName(), o.GetOwnerReferences())
		}
	}
	out := kubectl(t, "get", "pav", name)
	if !strings.Contains(out, "READY") || !strings.Contains(out, "VOLUMES") || !strings.Contains(out, "True") {
		t.Errorf("kubectl get pav:\n%s", out)
	}

	sc := e.storageClassOf(name)
	e.claim("first", sc, claimOpts{})
	e.waitBound("first")
	if got := e.runClient("reader1", "cat /data/first/greeting /data/first/claim", "first"); got != "v1\nfirst\n" {
		t.Fatalf("first volume reads %q", got)
	}
	if p, _ := getProvisioner(e.ctx, name); p.Status.Volumes == nil || *p.Status.Volumes != 1 {
		t.Errorf("status.volumes = %v, want 1", p.Status.Volumes)
	}

	// Edit the templates: new operations use the new version; the drivers are
	// not touched (their resourceVersions stay).
	rv := func() string {
		s, _ := client.AppsV1().StatefulSets("pav").Get(e.ctx, "pav-"+name+"-controller", metav1.GetOptions{})
		d, _ := client.AppsV1().DaemonSets("pav").Get(e.ctx, "pav-"+name+"-node", metav1.GetOptions{})
		c, _ := client.StorageV1().CSIDrivers().Get(e.ctx, name, metav1.GetOptions{})
		return s.ResourceVersion + "/" + d.ResourceVersion + "/" + c.ResourceVersion
	}
	before := rv()
	kubectlApply(t, greeter(name, "v2"))
	e.poll("the manager to see generation 2", func() (bool, error) {
		p, err := getProvisioner(e.ctx, name)
		return err == nil && p.Status.ObservedGeneration == 2 && p.Status.LastValidGeneration == 2, err
	})
	if after := rv(); after != before {
		t.Errorf("a template edit re-applied the drivers: resourceVersions %s -> %s", before, after)
	}
	e.claim("second", sc, claimOpts{})
	e.waitBound("second")
	if got := e.runClient("reader2", "cat /data/second/greeting", "second"); got != "v2\n" {
		t.Fatalf("a volume staged after the edit reads %q, want v2", got)
	}
	e.deletePod("reader1")
	e.deletePod("reader2")
	pv1, pv2 := e.waitBound("first"), e.waitBound("second")
	e.deleteClaim("first")
	e.deleteClaim("second")
	e.waitPVGone(pv1.Name)
	e.waitPVGone(pv2.Name)
	deleteProvisioner(t, name)
}

// Deleting a PavProvisioner while a volume exists is held (spec §6): it stays
// Terminating, saying why; new provisioning and staging are refused; an edit
// that makes the spec invalid, and a controller plugin restarted after it,
// still delete the volume (with the last valid spec); then the deletion
// completes and leaves nothing.
func TestDeletionHeldWhileVolumesExist(t *testing.T) {
	inLane(t, laneOwn)
	e := newEnv(t)
	name := "e2e-held-" + strings.ToLower(rand.String(4))
	e.newProvisioner(greeter(name, "hi"))
	sc := e.storageClassOf(name)
	e.claim("kept", sc, claimOpts{})
	pv := e.waitBound("kept")

	// An invalid edit: new volumes refused, Valid=False; the controller plugin
	// restarts, so only status.lastValidSpec can still delete the volume.
	broken := strings.Replace(greeter(name, "hi"), `"echo deleting {{ handle }}"`, `"echo {{ oops"`, 1)
	kubectlApply(t, broken)
	e.poll("Valid=False", func() (bool, error) {
		c, err := provisionerCondition(e.ctx, name, v1alpha1.ConditionValid)
		return c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "spec.volumeDeletion"), err
	})
	ctrl := "pav-" + name + "-controller-0"
	old, err := client.CoreV1().Pods("pav").Get(e.ctx, ctrl, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubectl(t, "-n", "pav", "delete", "pod", ctrl)
	e.poll("the controller plugin back", func() (bool, error) {
		p, err := client.CoreV1().Pods("pav").Get(e.ctx, ctrl, metav1.GetOptions{})
		return err == nil && p.UID != old.UID && podReady(p), nil
	})

	if out, err := kubectlErr("delete", "pav", name, "--timeout=1s"); err == nil {
		t.Fatalf("kubectl delete pav returned at once with a volume left: %s", out)
	}
	e.poll("Terminating=True naming the PV", func() (bool, error) {
		c, err := provisionerCondition(e.ctx, name, v1alpha1.ConditionTerminating)
		return c.Status == metav1.ConditionTrue && strings.Contains(c.Message, pv.Name), err
	})
	c, _ := provisionerCondition(e.ctx, name, v1alpha1.ConditionTerminating)
	t.Logf("Terminating: %s", c.Message)

	// Refused meanwhile: a new claim, and staging the existing volume.
	e.claim("refused", sc, claimOpts{})
	e.waitEvent("PersistentVolumeClaim", "refused", "ProvisioningFailed", timeout, "being deleted")
	e.clientPod("blocked", "cat /data/kept/greeting", "kept")
	e.waitEvent("Pod", "blocked", "FailedMount", timeout, "being deleted")
	time.Sleep(10 * time.Second)
	if _, err := getProvisioner(e.ctx, name); err != nil {
		t.Fatalf("the PavProvisioner went while a volume exists: %v", err)
	}
	if p, _ := client.CoreV1().Pods(e.ns).Get(e.ctx, "blocked", metav1.GetOptions{}); p.Status.Phase != corev1.PodPending {
		t.Fatalf("a pod staged a volume of a provisioner being deleted: %s", p.Status.Phase)
	}
	if left := leftovers(e.ctx, name); len(left) < 5 {
		t.Fatalf("the drivers went while a volume exists; left: %v", left)
	}

	// Deletion still works (last valid spec, after a restart): then everything goes.
	e.deletePod("blocked")
	start := time.Now()
	e.deleteClaim("kept")
	e.waitPVGone(pv.Name)
	if err := waitGone(e.ctx, name, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("PavProvisioner gone %v after its last claim was deleted", time.Since(start).Round(100*time.Millisecond))
	if left := leftovers(e.ctx, name); len(left) > 0 {
		t.Fatalf("left: %v", left)
	}
	if got, _ := client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, "refused", metav1.GetOptions{}); got.Status.Phase != corev1.ClaimPending {
		t.Fatalf("the refused claim is %s", got.Status.Phase)
	}
}

// The manager killed (no graceful hand-over of its Lease) right after a
// PavProvisioner is created, and a workload of another deleted behind its back
// meanwhile: the restarted manager converges both.
func TestManagerKilledConverges(t *testing.T) {
	e := newEnv(t)
	name := "e2e-kill-" + strings.ToLower(rand.String(4))
	other := "e2e-other-" + strings.ToLower(rand.String(4))
	e.newProvisioner(greeter(other, "x"))

	u := toObject(t, greeter(name, "y"))
	if _, err := dyn.Resource(v1alpha1.GroupVersionResource).Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(v1alpha1.GroupVersionResource).Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = waitGone(context.Background(), name, 2*time.Minute)
	})
	// SIGKILL, not a pod deletion (whose SIGTERM hands the Lease over at once):
	// the restarted manager must wait for the Lease to expire, and take over
	// whatever the killed one left half done.
	killManager(t)
	kubectl(t, "-n", "pav", "delete", "daemonset", "pav-"+other+"-node", "--wait=false")
	start := time.Now()
	for _, n := range []string{name, other} {
		if err := waitProvisionerReady(e.ctx, n, 3*time.Minute); err != nil {
			t.Fatalf("%s after the manager was killed: %v", n, err)
		}
	}
	t.Logf("both Ready %v after the manager was killed", time.Since(start).Round(100*time.Millisecond))
	// One controller plugin, and one node plugin per node.
	pods, _ := client.CoreV1().Pods("pav").List(e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name})
	nodes, err := client.CoreV1().Nodes().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := 1 + len(nodes.Items); len(pods.Items) != want {
		t.Errorf("%d driver pods for %s, want %d (a controller plugin, and a node plugin on each of %d nodes)", len(pods.Items), name, want, len(nodes.Items))
	}
}

// killManager SIGKILLs the pav manager's process (the test runs on the node);
// kubelet restarts the container.
func killManager(t *testing.T) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	killed := 0
	for _, f := range procs {
		b, err := os.ReadFile(f)
		if err != nil || !strings.HasPrefix(string(b), "/usr/local/bin/pav\x00manager\x00") {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		if err != nil {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			killed++
		}
	}
	if killed != 1 {
		t.Fatalf("killed %d pav manager processes, want 1", killed)
	}
}
