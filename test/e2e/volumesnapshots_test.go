//go:build e2e

package e2e

// Helpers for expansion, snapshots and clones (issue 8): StorageClasses that allow
// expansion, VolumeSnapshotClasses and VolumeSnapshots through the dynamic client (pav's
// go.mod does not carry the external-snapshotter client), claims with a dataSource, and
// kubectl exec into a running client.

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

var (
	snapshotGV                = schema.GroupVersion{Group: "snapshot.storage.k8s.io", Version: "v1"}
	volumeSnapshotClasses     = snapshotGV.WithResource("volumesnapshotclasses")
	volumeSnapshots           = snapshotGV.WithResource("volumesnapshots")
	volumeSnapshotContents    = snapshotGV.WithResource("volumesnapshotcontents")
	pavSnapshotsResource      = v1alpha1.SchemeGroupVersion.WithResource("pavsnapshots")
	snapshotResourcesRequired = []string{"volumesnapshotclasses", "volumesnapshots", "volumesnapshotcontents"}
)

// requireSnapshotCRDs fails the test unless the cluster serves what snapshots need: the
// VolumeSnapshot CRDs (snapshot.storage.k8s.io/v1), the snapshot-controller that binds
// them, and pav's PavSnapshot CRD. Without them these tests cannot run, and CI must not
// pass by skipping them: make cluster-up installs the CRDs and the controller.
func requireSnapshotCRDs(t *testing.T) {
	t.Helper()
	served := func(gv schema.GroupVersion, names ...string) []string {
		list, err := client.Discovery().ServerResourcesForGroupVersion(gv.String())
		if err != nil {
			return names
		}
		have := map[string]bool{}
		for _, r := range list.APIResources {
			have[r.Name] = true
		}
		var missing []string
		for _, n := range names {
			if !have[n] {
				missing = append(missing, n)
			}
		}
		return missing
	}
	if m := served(snapshotGV, snapshotResourcesRequired...); len(m) > 0 {
		t.Fatalf("the cluster does not serve %s %s: install the external-snapshotter's CRDs and snapshot-controller (make cluster-up does)", snapshotGV, strings.Join(m, ", "))
	}
	if m := served(v1alpha1.SchemeGroupVersion, "pavsnapshots"); len(m) > 0 {
		t.Fatalf("the cluster does not serve %s pavsnapshots: pav's PavSnapshot CRD is not installed (make install)", v1alpha1.SchemeGroupVersion)
	}
	// The controller is found by its pods' names (its Deployment's, whatever the
	// namespace and labels of the installation).
	pods, err := client.CoreV1().Pods("").List(bgCtx(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if strings.Contains(p.Name, "snapshot-controller") && p.Status.Phase == corev1.PodRunning {
			return
		}
	}
	t.Fatalf("no running snapshot-controller pod: VolumeSnapshots would never be bound (make cluster-up installs it)")
}

// expandableSC is exampleSC with allowVolumeExpansion: true, on node 1 (whose files
// the expansion tests check).
func (e *env) expandableSC(provisioner string, binding storagev1.VolumeBindingMode) string {
	e.t.Helper()
	sc := e.newSC(provisioner, nil, binding, hostNode())
	sc.AllowVolumeExpansion = ptr(true)
	return e.createSC(sc)
}

// snapshotClass makes a VolumeSnapshotClass of a driver (deletionPolicy Delete), deleted
// with the test.
func (e *env) snapshotClass(driverName string) string {
	e.t.Helper()
	name := e.ns + "-" + driverName
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": snapshotGV.String(), "kind": "VolumeSnapshotClass",
		"metadata": map[string]any{"name": name}, "driver": driverName, "deletionPolicy": "Delete",
	}}
	if _, err := dyn.Resource(volumeSnapshotClasses).Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = dyn.Resource(volumeSnapshotClasses).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// volumeSnapshot asks for a snapshot of a claim.
func (e *env) volumeSnapshot(name, class, claim string) {
	e.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": snapshotGV.String(), "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": name, "namespace": e.ns},
		"spec": map[string]any{"volumeSnapshotClassName": class,
			"source": map[string]any{"persistentVolumeClaimName": claim}},
	}}
	if _, err := dyn.Resource(volumeSnapshots).Namespace(e.ns).Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// classNotSeenYet: a snapshot or group snapshot made right after its class can find the
// snapshot-controller's cache without the class yet (a busy API server delays its watch
// event). The controller then sets status.error ("Failed to get snapshot class with error
// … not found", "failed to get group snapshot class …"), requeues the object and clears the
// error once it is ready (external-snapshotter v8.7.0, checkAndUpdate(Group)SnapshotClass).
// Only that error, while the class named in spec.<classField> does exist, is waited out.
func (e *env) classNotSeenYet(classes schema.GroupVersionResource, u *unstructured.Unstructured, classField, msg string) bool {
	m := strings.ToLower(msg)
	if !strings.Contains(m, "snapshot class") || !strings.Contains(m, "not found") {
		return false
	}
	class, _, _ := unstructured.NestedString(u.Object, "spec", classField)
	if class == "" {
		return false
	}
	if _, err := dyn.Resource(classes).Get(e.ctx, class, metav1.GetOptions{}); err != nil {
		return false
	}
	e.t.Logf("%s %s: status.error %q while its class %s exists: the snapshot-controller retries", u.GetKind(), u.GetName(), msg, class)
	return true
}

// readySnapshot is what a ready VolumeSnapshot and its content say.
type readySnapshot struct {
	uid, content, handle string
	restoreSize          int64
}

// waitSnapshotReady waits for status.readyToUse and returns the snapshot's content and
// the CSI snapshot handle it holds. A snapshot error (status.error) fails at once, but for
// the snapshot-controller not having seen the class yet (classNotSeenYet).
func (e *env) waitSnapshotReady(name string) readySnapshot {
	e.t.Helper()
	var r readySnapshot
	e.poll("VolumeSnapshot "+name+" readyToUse", func() (bool, error) {
		u, err := dyn.Resource(volumeSnapshots).Namespace(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if msg, ok, _ := unstructured.NestedString(u.Object, "status", "error", "message"); ok && msg != "" &&
			!e.classNotSeenYet(volumeSnapshotClasses, u, "volumeSnapshotClassName", msg) {
			return false, fmt.Errorf("status.error: %s", msg)
		}
		ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse")
		r.content, _, _ = unstructured.NestedString(u.Object, "status", "boundVolumeSnapshotContentName")
		r.uid = string(u.GetUID())
		if size, ok, _ := unstructured.NestedString(u.Object, "status", "restoreSize"); ok {
			q, err := resource.ParseQuantity(size)
			if err != nil {
				return false, err
			}
			r.restoreSize = q.Value()
		}
		return ready && r.content != "", nil
	})
	c, err := dyn.Resource(volumeSnapshotContents).Get(e.ctx, r.content, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	r.handle, _, _ = unstructured.NestedString(c.Object, "status", "snapshotHandle")
	return r
}

// deleteSnapshot deletes a VolumeSnapshot and waits for it and its content to be gone
// (deletionPolicy Delete: the content goes after DeleteSnapshot succeeded).
func (e *env) deleteSnapshot(name, content string) {
	e.t.Helper()
	if err := dyn.Resource(volumeSnapshots).Namespace(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	e.poll("VolumeSnapshot "+name+" and VolumeSnapshotContent "+content+" gone", func() (bool, error) {
		if _, err := dyn.Resource(volumeSnapshots).Namespace(e.ns).Get(e.ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, err
		}
		_, err := dyn.Resource(volumeSnapshotContents).Get(e.ctx, content, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// sourcedClaim is e.claim with a dataSource: a VolumeSnapshot (restore) or a
// PersistentVolumeClaim (clone).
func (e *env) sourcedClaim(name, sc string, o claimOpts, source corev1.TypedLocalObjectReference) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	if o.mode == "" {
		o.mode = corev1.PersistentVolumeFilesystem
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeMode: &o.mode,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, DataSource: &source,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(o.size)}}}}
	pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pvc
}

func snapshotSource(name string) corev1.TypedLocalObjectReference {
	return corev1.TypedLocalObjectReference{APIGroup: ptr(snapshotGV.Group), Kind: "VolumeSnapshot", Name: name}
}

func claimSource(name string) corev1.TypedLocalObjectReference {
	return corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: name}
}

// exec runs a shell script in a running pod's container and returns its output.
func (e *env) exec(pod, script string) string {
	e.t.Helper()
	return kubectl(e.t, "exec", "-n", e.ns, pod, "--", "sh", "-c", script)
}

// pavSnapshotRecords lists the PavSnapshots that name any of the given CSI snapshot
// names or source volume handles.
func pavSnapshotRecords(ctx context.Context, snapshotNames, volumeHandles []string) ([]string, error) {
	l, err := dyn.Resource(pavSnapshotsResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	want := map[string]bool{}
	for _, s := range append(append([]string{}, snapshotNames...), volumeHandles...) {
		want[s] = true
	}
	var out []string
	for _, u := range l.Items {
		name, _, _ := unstructured.NestedString(u.Object, "spec", "snapshotName")
		src, _, _ := unstructured.NestedString(u.Object, "spec", "sourceVolumeID")
		if want[name] || want[src] {
			out = append(out, u.GetName())
		}
	}
	return out, nil
}

// providerPodsOf lists a provisioner's pods (any phase, any namespace) whose volume key
// mentions any of the given names or handles.
func providerPodsOf(ctx context.Context, provisioner string, ids []string) []string {
	pods, _ := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: podrunner.LabelProvisioner + "=" + provisioner})
	var out []string
	for _, p := range pods.Items {
		key := p.Annotations[podrunner.AnnotationVolumeKey]
		for _, id := range ids {
			if id != "" && strings.Contains(key, id) {
				out = append(out, p.Namespace+"/"+p.Name+" ("+key+")")
				break
			}
		}
	}
	return out
}

// requireSidecar fails the test unless a provisioner's plugin pods run a container whose
// name or image holds want ("resizer", "snapshotter"): without csi-resizer a grown claim
// just waits, without csi-snapshotter a VolumeSnapshot never becomes ready, and the
// timeout would not say why.
func requireSidecar(t *testing.T, provisioner, want string) {
	t.Helper()
	pods, err := client.CoreV1().Pods("pav").List(bgCtx(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + provisioner})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, c := range p.Spec.Containers {
			if strings.Contains(c.Name, want) || strings.Contains(c.Image, want) {
				return
			}
		}
	}
	t.Fatalf("no %s sidecar in the %s provisioner's plugin pods (namespace pav): pav deploys it when the PavProvisioner has the phase it serves", want, provisioner)
}
