//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// VolumeAttributesClass (docs/beyond-pav.md): the tests of pav-e2e's volumeModification
// (mutableParameters [tier], a modification pod that logs each change in
// /srv/pav-e2e/runs/modification/<handle>); loop-block's readAheadKiB is
// loopblock_vac_test.go's.

// vac makes a VolumeAttributesClass of a driver, named after the test's namespace, and
// deletes it with the test (without waiting: Kubernetes keeps it while a claim or PV names
// it, and the namespace's claims go after it).
func (e *env) vac(suffix, driverName string, params map[string]string) string {
	e.t.Helper()
	name := e.ns + "-" + suffix
	c := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: name}, DriverName: driverName, Parameters: params}
	if _, err := client.StorageV1().VolumeAttributesClasses().Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = client.StorageV1().VolumeAttributesClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// classClaim is e.claim with a VolumeAttributesClass.
func (e *env) classClaim(name, sc, class string, o claimOpts) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	if o.size == "" {
		o.size = "1Mi"
	}
	if o.mode == "" {
		o.mode = corev1.PersistentVolumeFilesystem
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeMode: &o.mode, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeAttributesClassName: &class,
			Resources:                 corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(o.size)}}}}
	pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pvc
}

// setClass changes a claim's VolumeAttributesClass, as a user does.
func (e *env) setClass(claim, class string) {
	e.t.Helper()
	patch := fmt.Sprintf(`{"spec":{"volumeAttributesClassName":%q}}`, class)
	if _, err := client.CoreV1().PersistentVolumeClaims(e.ns).Patch(e.ctx, claim, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.t.Fatalf("setting the class of %s to %s: %v", claim, class, err)
	}
}

// waitClass waits until a claim's volume has the class (status.currentVolumeAttributesClassName,
// no modification under way or failed) and returns the claim.
func (e *env) waitClass(claim, class string) *corev1.PersistentVolumeClaim {
	e.t.Helper()
	var pvc *corev1.PersistentVolumeClaim
	e.poll(fmt.Sprintf("PVC %s with VolumeAttributesClass %s", claim, class), func() (bool, error) {
		var err error
		if pvc, err = client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, claim, metav1.GetOptions{}); err != nil {
			return false, err
		}
		for _, c := range pvc.Status.Conditions {
			if c.Type == corev1.PersistentVolumeClaimVolumeModifyVolumeError || c.Type == corev1.PersistentVolumeClaimVolumeModifyingVolume {
				return false, fmt.Errorf("condition %s: %s", c.Type, c.Message)
			}
		}
		cur := ""
		if p := pvc.Status.CurrentVolumeAttributesClassName; p != nil {
			cur = *p
		}
		return pvc.Status.Phase == corev1.ClaimBound && cur == class && pvc.Status.ModifyVolumeStatus == nil,
			fmt.Errorf("phase %s, current class %q, modifyVolumeStatus %+v", pvc.Status.Phase, cur, pvc.Status.ModifyVolumeStatus)
	})
	return pvc
}

// waitInfeasible waits until the claim says that its class cannot be applied
// (modifyVolumeStatus Infeasible, a ModifyVolumeError condition), and returns the
// condition's message.
func (e *env) waitInfeasible(claim, class string) string {
	e.t.Helper()
	var msg string
	e.poll(fmt.Sprintf("PVC %s: VolumeAttributesClass %s Infeasible", claim, class), func() (bool, error) {
		pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, claim, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		st := pvc.Status.ModifyVolumeStatus
		for _, c := range pvc.Status.Conditions {
			if c.Type == corev1.PersistentVolumeClaimVolumeModifyVolumeError {
				msg = c.Message
			}
		}
		return st != nil && st.Status == corev1.PersistentVolumeClaimModifyVolumeInfeasible && st.TargetVolumeAttributesClassName == class && msg != "",
			fmt.Errorf("modifyVolumeStatus %+v, conditions %+v", st, pvc.Status.Conditions)
	})
	return msg
}

// modifications are the lines pav-e2e's modification pods logged for a handle: the new and
// the previous parameters, as JSON ("{...} was {...}").
func modifications(handle string) []string {
	b, err := os.ReadFile(filepath.Join(markers, "runs", "modification", handle))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func (e *env) recordOf(pv *corev1.PersistentVolume) *v1alpha1.PavVolume {
	e.t.Helper()
	v, err := record(e.ctx, pv.Name)
	if err != nil || v == nil {
		e.t.Fatalf("the PavVolume of %s: %v, %v", pv.Name, v, err)
	}
	return v
}

// TestVolumeAttributesClass: a claim created with a class gets a volume with its
// parameters (CreateVolume's mutable_parameters, recorded; no modification pod), and each
// change of a bound claim's class runs the modification pod once, with the new and the
// previous parameters, recorded before the pod goes.
func TestVolumeAttributesClass(t *testing.T) {
	inLane(t, laneSelf)
	requireSidecar(t, driver, "resizer")
	e := newEnv(t)
	sc := e.storageClass(nil, corev1.PersistentVolumeReclaimDelete)
	gold := e.vac("gold", driver, map[string]string{"tier": "gold"})
	silver := e.vac("silver", driver, map[string]string{"tier": "silver"})

	e.classClaim("data", sc, gold, claimOpts{})
	pv := e.waitBound("data")
	handle := pv.Spec.CSI.VolumeHandle
	e.waitClass("data", gold)
	if c := pv.Spec.VolumeAttributesClassName; c == nil || *c != gold {
		t.Fatalf("PV %s names class %v, want %s", pv.Name, c, gold)
	}
	if v := e.recordOf(pv); !maps.Equal(v.Spec.MutableParams, map[string]string{"tier": "gold"}) || v.Status.MutableParams != nil {
		t.Fatalf("record: spec.mutableParams %v, status.mutableParams %v; want {tier: gold} and none", v.Spec.MutableParams, v.Status.MutableParams)
	}
	if m := modifications(handle); m != nil {
		t.Fatalf("a volume created with its class was modified: %v", m)
	}

	e.setClass("data", silver)
	e.waitClass("data", silver)
	if m := modifications(handle); len(m) != 1 || m[0] != `{"tier": "silver"} was {"tier": "gold"}` {
		t.Fatalf("modification pod runs %q, want one from gold to silver", m)
	}
	v := e.recordOf(pv)
	if !maps.Equal(v.Status.MutableParams, map[string]string{"tier": "silver"}) || v.Status.Modification != nil {
		t.Fatalf("record after the change: status %+v", v.Status)
	}
	for _, p := range v.Status.Pods {
		if p.Phase == v1alpha1.PhaseModification {
			t.Fatalf("the finished modification's pod entry stayed: %+v", v.Status.Pods)
		}
	}
	if ps := pavPods(driver, "modification", pv.Name); len(ps) != 0 {
		t.Fatalf("modification pod %s/%s left", ps[0].Namespace, ps[0].Name)
	}
	if got, err := client.CoreV1().PersistentVolumes().Get(e.ctx, pv.Name, metav1.GetOptions{}); err != nil || got.Spec.VolumeAttributesClassName == nil || *got.Spec.VolumeAttributesClassName != silver {
		t.Fatalf("PV after the change: %v, %v", got.Spec.VolumeAttributesClassName, err)
	}
	// Back to gold: the parameters differ from silver's, so a pod runs again.
	e.setClass("data", gold)
	e.waitClass("data", gold)
	if m := modifications(handle); len(m) != 2 || m[1] != `{"tier": "gold"} was {"tier": "silver"}` {
		t.Fatalf("modification pod runs %q", m)
	}
	e.deleteClaim("data")
	e.waitPVGone(pv.Name)
}

// TestVolumeAttributesClassUnknownParameter: bad input. A class with a parameter pav-e2e
// does not declare is refused with INVALID_ARGUMENT, which the claim shows (Infeasible, a
// ModifyVolumeError condition and a VolumeModifyFailed event naming the parameter, the
// declared ones and the field), and changes nothing (no pod, the record as it was); then a
// valid class works. A new claim of such a class fails its provisioning the same way, and
// nothing is made.
func TestVolumeAttributesClassUnknownParameter(t *testing.T) {
	inLane(t, laneSelf)
	requireSidecar(t, driver, "resizer")
	e := newEnv(t)
	sc := e.storageClass(nil, corev1.PersistentVolumeReclaimDelete)
	bad := e.vac("bad", driver, map[string]string{"tier": "gold", "iops": "3000"})
	gold := e.vac("gold", driver, map[string]string{"tier": "gold"})

	e.claim("data", sc, claimOpts{})
	pv := e.waitBound("data")
	handle := pv.Spec.CSI.VolumeHandle
	before := e.recordOf(pv)

	e.setClass("data", bad)
	msg := e.waitInfeasible("data", bad)
	for _, want := range []string{`parameter "iops" is not mutable`, `PavProvisioner "pav-e2e" declares ["tier"] in spec.volumeModification.mutableParameters`} {
		if !strings.Contains(msg, want) {
			t.Errorf("the claim's ModifyVolumeError condition %q does not say %q", msg, want)
		}
	}
	e.waitEvent("PersistentVolumeClaim", "data", "VolumeModifyFailed", timeout, "code = InvalidArgument", `parameter "iops" is not mutable`)
	if m := modifications(handle); m != nil {
		t.Fatalf("a refused class ran the modification pod: %v", m)
	}
	after := e.recordOf(pv)
	if after.Status.MutableParams != nil || after.Status.Modification != nil || after.ResourceVersion != before.ResourceVersion {
		t.Fatalf("a refused class changed the record: %+v (resourceVersion %s, was %s)", after.Status, after.ResourceVersion, before.ResourceVersion)
	}
	pvc, err := client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, "data", metav1.GetOptions{})
	if err != nil || pvc.Status.CurrentVolumeAttributesClassName != nil {
		t.Fatalf("the claim's current class is %v after a refused one (%v)", pvc.Status.CurrentVolumeAttributesClassName, err)
	}

	e.setClass("data", gold)
	e.waitClass("data", gold)
	if m := modifications(handle); len(m) != 1 || m[0] != `{"tier": "gold"} was {}` {
		t.Fatalf("modification pod runs %q, want one to gold", m)
	}

	// A new claim of the bad class: refused before anything is made.
	e.classClaim("born-bad", sc, bad, claimOpts{})
	e.waitEvent("PersistentVolumeClaim", "born-bad", "ProvisioningFailed", timeout, "InvalidArgument",
		`CreateVolume's mutable_parameters: parameter "iops" is not mutable`)
	pvc, err = client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, "born-bad", metav1.GetOptions{})
	if err != nil || pvc.Status.Phase != corev1.ClaimPending {
		t.Fatalf("claim born-bad: %v, %v", pvc.Status.Phase, err)
	}
	if r, err := record(e.ctx, "pvc-"+string(pvc.UID)); r != nil || err != nil {
		t.Fatalf("a refused claim has a record: %+v, %v", r, err)
	}
	if n := runs("creation", "pvc-"+string(pvc.UID)); n != 0 {
		t.Fatalf("a refused claim's creation pod ran %d times", n)
	}
	e.deleteClaim("born-bad")
	e.deleteClaim("data")
	e.waitPVGone(pv.Name)
	if _, err := client.CoreV1().PersistentVolumes().Get(e.ctx, pv.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}
