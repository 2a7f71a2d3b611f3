//go:build e2e

package e2e

// The fault-injection suite, controller side (issue 12): a hostile tenant and
// an unlucky operator against the real cluster. After each case: every phase's
// pod ran exactly once for the volume (the pav-e2e pods count their runs in
// /srv/pav-e2e/runs), and nothing is left: no pod, record, PV, state
// directory or mount.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/nodeserver"
	"github.com/pods-as-volumes/pav/podrunner"
)

// runs is how many times a phase's pod ever ran for a volume key (creation:
// the default handle pvc-<uid>; the other phases: the handle).
func runs(phase, key string) int {
	b, err := os.ReadFile(filepath.Join(markers, "runs", phase, key))
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "run\n")
}

func (e *env) wantRuns(phase, key string, n int) {
	e.t.Helper()
	if got := runs(phase, key); got != n {
		e.t.Errorf("the %s pod ran %d times for %s, want %d", phase, got, key, n)
	}
}

// record is the PavVolume of a CSI volume name, or nil.
func record(ctx context.Context, volumeName string) (*v1alpha1.PavVolume, error) {
	u, err := dyn.Resource(v1alpha1.VolumeGroupVersionResource).Get(ctx, v1alpha1.VolumeRecordName(volumeName), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	v := &v1alpha1.PavVolume{}
	return v, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, v)
}

// volumePods are pav's pods of a volume: volume key = the volume name or the
// handle (or handle@node, or delete/handle).
func volumePods(ctx context.Context, volumeName, handle string) []corev1.Pod {
	pods, _ := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: podrunner.LabelProvisioner + "=" + driver})
	var out []corev1.Pod
	for _, p := range pods.Items {
		k := p.Annotations[podrunner.AnnotationVolumeKey]
		if k == volumeName || handle != "" && (k == handle || strings.HasPrefix(k, handle+"@") || k == "delete/"+handle) {
			out = append(out, p)
		}
	}
	return out
}

// phasePodOf waits for the running pod of a phase whose volume key is key.
func (e *env) phasePodOf(phase, key string) *corev1.Pod {
	e.t.Helper()
	var found *corev1.Pod
	e.poll(phase+" pod of "+key+" running", func() (bool, error) {
		for _, p := range phasePods(e.ctx, phase) {
			if p.Annotations[podrunner.AnnotationVolumeKey] == key && p.Status.Phase == corev1.PodRunning {
				found = &p
				return true, nil
			}
		}
		return false, nil
	})
	return found
}

// assertClean waits until nothing of a volume is left: pods, record, PV, the
// node's state directory and mounts.
func (e *env) assertClean(volumeName, handle string) {
	e.t.Helper()
	e.poll("no pod, record or PV left for "+volumeName, func() (bool, error) {
		if ps := volumePods(e.ctx, volumeName, handle); len(ps) > 0 {
			return false, fmt.Errorf("pod %s/%s left", ps[0].Namespace, ps[0].Name)
		}
		if v, err := record(e.ctx, volumeName); v != nil || err != nil {
			return false, fmt.Errorf("PavVolume %s left (%v)", volumeName, err)
		}
		if _, err := client.CoreV1().PersistentVolumes().Get(e.ctx, volumeName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("PV %s left (%v)", volumeName, err)
		}
		return true, nil
	})
	if handle != "" {
		dir := nodeserver.VolumeDir(volumesDir, handle)
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			e.t.Errorf("state directory %s left (%v)", dir, err)
		}
		if m := hostMounts(dir); len(m) > 0 {
			e.t.Errorf("mounts left: %v", m)
		}
	}
}

// wffcClass is a StorageClass of pav-e2e that provisions only once a pod uses
// the claim, so a tenant has time to prepare its claim (or pods) first.
func (e *env) wffcClass(params map[string]string) string {
	e.t.Helper()
	name := e.ns + "-wffc-" + strings.ToLower(rand.String(4))
	mode := storagev1.VolumeBindingWaitForFirstConsumer
	reclaim := corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: driver, Parameters: params,
		ReclaimPolicy: &reclaim, VolumeBindingMode: &mode}
	if _, err := client.StorageV1().StorageClasses().Create(e.ctx, sc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = client.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// tenant is a user bound to the `edit` ClusterRole in the test's namespace
// only, as a tenant is: the suite's clients act as it by impersonation.
func (e *env) tenant() (kubernetes.Interface, dynamic.Interface) {
	e.t.Helper()
	user := "e2e-tenant-" + e.ns
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: e.ns},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user, APIGroup: rbacv1.GroupName}},
		RoleRef:  rbacv1.RoleRef{Kind: "ClusterRole", Name: "edit", APIGroup: rbacv1.GroupName}}
	if _, err := client.RbacV1().RoleBindings(e.ns).Create(e.ctx, rb, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	cfg := restConfig(e.t)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	return kubernetes.NewForConfigOrDie(cfg), dynamic.NewForConfigOrDie(cfg)
}

func restConfig(t *testing.T) *rest.Config {
	t.Helper()
	kubeconfig := os.Getenv("KUBECONFIG")
	if kubeconfig == "" {
		kubeconfig = filepath.Join(repo, "_output", "cluster", "kubeconfig")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// killController kills the controller plugin's pod (no grace: a crash) and
// waits for its replacement to be ready.
func (e *env) killController() {
	e.t.Helper()
	pods, err := client.CoreV1().Pods("pav").List(e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + driver + ",app.kubernetes.io/component=controller"})
	if err != nil || len(pods.Items) != 1 {
		e.t.Fatalf("controller pod: %v (%d)", err, len(pods.Items))
	}
	old := pods.Items[0]
	if err := client.CoreV1().Pods("pav").Delete(e.ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		e.t.Fatal(err)
	}
	e.poll("a new controller pod ready", func() (bool, error) {
		p, err := client.CoreV1().Pods("pav").Get(e.ctx, old.Name, metav1.GetOptions{})
		return err == nil && p.UID != old.UID && podReady(p), nil
	})
}

func volumeName(pvc *corev1.PersistentVolumeClaim) string { return "pvc-" + string(pvc.UID) }

// TestForgedRecordRefused is finding 1. A tenant annotates its claim, of a
// WaitForFirstConsumer class and before its consumer exists, with the record
// PaV trusted: its own volume name and another tenant's handle. pav takes no
// record from a claim: it gets a new volume of its own, the victim's is
// untouched and deletable. And tenants can neither read nor write pav's
// records, nor see the pods in pav's namespace (they carry tokens).
func TestForgedRecordRefused(t *testing.T) {
	inLane(t, lanePavE2E)
	victim := newEnv(t)
	vsc := victim.storageClass(nil, corev1.PersistentVolumeReclaimDelete)
	victim.claim("precious", vsc, claimOpts{})
	vpv := victim.waitBound("precious")
	vhandle := vpv.Spec.CSI.VolumeHandle
	// The victim keeps using its volume meanwhile. (pav-e2e's default
	// scenario keeps its data in the staged directory, which unstaging
	// removes: the writer stays so that the data does too.)
	victim.clientPod("writer", "echo mine > /data/precious/secret; sleep 3600", "precious")
	victim.waitPodRunning("writer")

	e := newEnv(t)
	kube, dyns := e.tenant()
	sc := e.wffcClass(nil)
	pvc := e.claim("thief", sc, claimOpts{})
	forged, _ := json.Marshal(map[string]any{"name": volumeName(pvc), "handle": vhandle, "capacity": 1 << 20})
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.GroupName + "/created-volume": string(forged)}}})
	if _, err := kube.CoreV1().PersistentVolumeClaims(e.ns).Patch(e.ctx, "thief", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("the tenant may edit its own claim: %v", err)
	}
	out := e.runClient("consumer", "cat /data/thief/claim /data/thief/handle; ls /data/thief", "thief")
	pv := e.waitBound("thief")
	if h := pv.Spec.CSI.VolumeHandle; h == vhandle || h != "e2e-"+e.ns+"-thief" || strings.Contains(out, "secret") {
		t.Fatalf("the forged record was used: handle %q, client read %q", h, out)
	}
	e.wantRuns("creation", volumeName(pvc), 1)

	// The tenant cannot touch pav's records or see pav's pods.
	for _, tc := range []struct {
		what string
		err  error
	}{
		{"list PavVolumes", func() error {
			_, err := dyns.Resource(v1alpha1.VolumeGroupVersionResource).List(e.ctx, metav1.ListOptions{})
			return err
		}()},
		{"get the victim's PavVolume", func() error {
			_, err := dyns.Resource(v1alpha1.VolumeGroupVersionResource).Get(e.ctx, vpv.Name, metav1.GetOptions{})
			return err
		}()},
		{"create a PavVolume", func() error {
			u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": v1alpha1.VolumeKind,
				"metadata": map[string]any{"name": "forged-" + e.ns}, "spec": map[string]any{"provisioner": driver, "volumeName": "forged",
					"requestedVolumeMode": "Filesystem", "requestedMinCapacity": 1, "defaultHandle": vhandle}}}
			_, err := dyns.Resource(v1alpha1.VolumeGroupVersionResource).Create(e.ctx, u, metav1.CreateOptions{})
			return err
		}()},
		{"list PavGroupSnapshots", func() error {
			_, err := dyns.Resource(v1alpha1.GroupSnapshotGroupVersionResource).List(e.ctx, metav1.ListOptions{})
			return err
		}()},
		{"list pods in pav's namespace", func() error {
			_, err := kube.CoreV1().Pods("pav").List(e.ctx, metav1.ListOptions{})
			return err
		}()},
	} {
		if !apierrors.IsForbidden(tc.err) {
			t.Errorf("the tenant may %s: %v", tc.what, tc.err)
		}
	}

	// The victim's volume is intact and still deletable.
	if out := victim.runClient("reader", "cat /data/precious/secret", "precious"); out != "mine\n" {
		t.Fatalf("victim's data: %q", out)
	}
	victim.deletePod("reader")
	victim.deletePod("writer")
	victim.deleteClaim("precious")
	victim.waitPVGone(vpv.Name)
	victim.waitMarker("deleted", vhandle)
	victim.wantRuns("deletion", vhandle, 1)
	victim.assertClean(vpv.Name, vhandle)

	e.deletePod("consumer")
	e.deleteClaim("thief")
	e.waitPVGone(pv.Name)
	e.wantRuns("deletion", pv.Spec.CSI.VolumeHandle, 1)
	e.assertClean(pv.Name, pv.Spec.CSI.VolumeHandle)
}

// TestLeastPrivilege is finding 7: the node plugin's ServiceAccount has what
// staging needs and no more (no PVC or status writes, no records beyond its inline
// volumes' by name), and the
// controller's cannot write PVs or PVCs.
func TestLeastPrivilege(t *testing.T) {
	ctx := bgCtx()
	// A cluster deployed before issue 12 keeps the bindings of the single
	// pav-driver role (roleRef is immutable, so the new roles have new
	// bindings): remove them, so that what is checked is this tree's RBAC.
	for _, name := range []string{"pav-controller-driver", "pav-node-driver"} {
		if b, err := client.RbacV1().ClusterRoleBindings().Get(ctx, name, metav1.GetOptions{}); err == nil && b.RoleRef.Name == "pav-driver" {
			if err := client.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	const pav = "pav.albertofaria.github.io"
	for _, tc := range []struct {
		sa, group, resource, verb string
		want                      bool
	}{
		// Its inline volumes' records, by name (the PavVolume policy keeps its writes
		// to its own node's: TestInlineVolumePolicy).
		{"pav-node", pav, "pavvolumes", "get", true},
		{"pav-node", pav, "pavvolumes", "list", false},
		{"pav-node", pav, "pavvolumes", "watch", false},
		{"pav-node", pav, "pavprovisioners/status", "patch", false},
		{"pav-node", "", "persistentvolumeclaims", "patch", false},
		{"pav-node", "", "persistentvolumes", "delete", false},
		{"pav-node", "", "pods", "create", true},
		{"pav-node", "", "persistentvolumes", "get", true},
		{"pav-controller", pav, "pavvolumes", "update", true},
		{"pav-controller", "", "persistentvolumeclaims", "patch", false},
		{"pav-node", pav, "pavgroupsnapshots", "get", false},
		{"pav-controller", pav, "pavgroupsnapshots", "update", true},
		{"pav-controller", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents/status", "patch", true},
		{"pav-controller", "groupsnapshot.storage.k8s.io", "volumegroupsnapshotcontents", "delete", false},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:pav:" + tc.sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:pav", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Group: tc.group, Resource: strings.Split(tc.resource, "/")[0], Subresource: subresource(tc.resource), Verb: tc.verb},
		}}
		got, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != tc.want {
			t.Errorf("%s may %s %s: %v, want %v (%s)", tc.sa, tc.verb, tc.resource, got.Status.Allowed, tc.want, got.Status.Reason)
		}
	}
}

func subresource(r string) string {
	if _, s, ok := strings.Cut(r, "/"); ok {
		return s
	}
	return ""
}

// TestForeignPodRefused is finding 6: for a provisioner whose template puts
// the creation pod in the claim's namespace, a tenant pre-creates the pod of
// the deterministic name with pav's labels and annotations and a fake report
// container. pav refuses it (a ForeignPod event on it, ProvisioningFailed on
// the claim naming it), never adopts or deletes it; once the tenant deletes it,
// provisioning proceeds.
func TestForeignPodRefused(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	kube, _ := e.tenant()
	sc := e.wffcClass(map[string]string{"podNamespace": "claim"})
	pvc := e.claim("data", sc, claimOpts{})
	vol := volumeName(pvc)
	name := podrunner.PodName(driver, v1alpha1.PhaseCreation, vol)
	fake := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns,
			Labels: map[string]string{podrunner.LabelProvisioner: driver, podrunner.LabelPhase: string(v1alpha1.PhaseCreation),
				podrunner.LabelVolume: podrunner.VolumeLabel(vol)},
			Annotations: map[string]string{podrunner.AnnotationVolumeKey: vol, podrunner.AnnotationToken: "0123456789abcdef0123456789abcdef"}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{Name: podrunner.ReportContainer, Image: busybox, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", `echo '{"handle":"someone-elses"}' > /dev/termination-log`}}}},
	}
	fake, err := kube.CoreV1().Pods(e.ns).Create(e.ctx, fake, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the tenant may create pods in its namespace: %v", err)
	}
	e.clientPod("consumer", "cat /data/data/handle", "data")
	e.waitEvent("Pod", name, podrunner.ReasonForeignPod, timeout, "refuses to use this pod for phase creation", "pav did not create it")
	e.waitEvent("PersistentVolumeClaim", "data", "ProvisioningFailed", timeout, name, "delete it")
	if p, err := client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{}); err != nil || p.UID != fake.UID {
		t.Fatalf("the tenant's pod was touched: %v", err)
	}
	if v, _ := record(e.ctx, vol); v != nil && v.Status.Phase == v1alpha1.VolumeCreated {
		t.Fatal("a volume was created from the tenant's pod")
	}
	e.wantRuns("creation", vol, 0)

	if err := kube.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := e.waitBound("data")
	e.waitPodPhase("consumer", corev1.PodSucceeded)
	if h := pv.Spec.CSI.VolumeHandle; h != "e2e-"+e.ns+"-data" || e.logs("consumer") != h+"\n" {
		t.Fatalf("handle %q, client read %q", h, e.logs("consumer"))
	}
	e.wantRuns("creation", vol, 1)
	e.deletePod("consumer")
	e.deleteClaim("data")
	e.waitPVGone(pv.Name)
	e.wantRuns("deletion", pv.Spec.CSI.VolumeHandle, 1)
	e.assertClean(vol, pv.Spec.CSI.VolumeHandle)
}

// TestControllerKilledDuringCreation is finding 2: the controller plugin dies
// while the creation pod runs; its successor adopts the pod by the UID in the
// record and the volume is created once.
func TestControllerKilledDuringCreation(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	sc := e.storageClass(map[string]string{"createSleep": "15"}, corev1.PersistentVolumeReclaimDelete)
	pvc := e.claim("data", sc, claimOpts{})
	vol := volumeName(pvc)
	e.phasePodOf("creation", vol)
	e.poll("the creation pod's UID recorded", func() (bool, error) {
		v, err := record(e.ctx, vol)
		return v != nil && len(v.Status.Pods) > 0 && v.Status.Pods[0].UID != "", err
	})
	e.killController()
	pv := e.waitBound("data")
	handle := pv.Spec.CSI.VolumeHandle
	e.wantRuns("creation", vol, 1)
	if out := e.runClient("reader", "cat /data/data/claim", "data"); out != "data\n" {
		t.Fatalf("client read %q", out)
	}
	e.deletePod("reader")
	e.deleteClaim("data")
	e.waitPVGone(pv.Name)
	e.wantRuns("creation", vol, 1)
	e.wantRuns("deletion", handle, 1)
	e.wantRuns("staging", handle, 1)
	e.assertClean(vol, handle)
}

// TestControllerKilledDuringDeletion is finding 2: the controller plugin dies
// while the deletion pod runs; its successor (which has lost everything but the
// record) finishes the deletion with the same pod, and the context creation
// had.
func TestControllerKilledDuringDeletion(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	sc := e.storageClass(map[string]string{"deleteSleep": "15"}, corev1.PersistentVolumeReclaimDelete)
	e.claim("data", sc, claimOpts{size: "3Mi"})
	pv := e.waitBound("data")
	handle := pv.Spec.CSI.VolumeHandle
	e.deleteClaim("data")
	e.phasePodOf("deletion", "delete/"+handle)
	e.killController()
	e.waitPVGone(pv.Name)
	if got := e.waitMarker("deleted", handle); got != "3145728" {
		t.Fatalf("the deletion pod saw capacity %q, want 3145728", got)
	}
	e.wantRuns("deletion", handle, 1)
	e.assertClean(pv.Name, handle)
}

// TestClaimDeletedMidCreation is finding 3: the claim goes while its creation
// pod runs. external-provisioner keeps calling CreateVolume for a claim whose
// provisioning is in progress (pav answers DEADLINE_EXCEEDED meanwhile), even
// once it is deleted; pav resumes from the record (it needs the claim no
// more), the creation finishes once, and external-provisioner deletes the PV
// it then makes: the deletion pod runs once, with the handle and capacity the
// creation gave. Finishing rather than reverting keeps one path for both (the
// deletion pod with the real handle), and needs no watch on claims.
func TestClaimDeletedMidCreation(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	sc := e.storageClass(map[string]string{"createSleep": "10"}, corev1.PersistentVolumeReclaimDelete)
	pvc := e.claim("data", sc, claimOpts{size: "2Mi"})
	vol := volumeName(pvc)
	e.phasePodOf("creation", vol)
	e.deleteClaim("data")
	handle := "e2e-" + e.ns + "-data" // what the creation pod reports
	within := 4 * time.Minute
	e.pollFor("the volume created and deleted", within, func() (bool, error) {
		_, ok := marker("deleted", handle)
		return ok, nil
	})
	if got, _ := marker("deleted", handle); got != "2097152" {
		t.Errorf("the deletion pod saw capacity %q, want 2097152", got)
	}
	e.wantRuns("creation", vol, 1)
	e.wantRuns("deletion", handle, 1)
	e.assertClean(vol, handle)
}
