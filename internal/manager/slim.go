package manager

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/pods-as-volumes/pav/podrunner"
)

// What the manager caches, and how much. One manager serves the whole
// cluster, so every informer it keeps is bounded by what it must count, and
// each cached object keeps only the fields the manager reads:
//
//   - PersistentVolumes, all of them (a PV's driver cannot be selected on by
//     the API): name, the provisioned-by annotation, the CSI driver, the claim
//     and the phase, for the deletion guard and status.volumes (slimPV);
//   - pav's operation and staging pods (label selector): name, labels, node,
//     phase and deletion, for the deletion guard (slimPod);
//   - PavVolumes, PavSnapshots and PavGroupSnapshots: name, labels and phase
//     (slimRecord);
//   - PavProvisioners: whole; CSIDrivers, and the StatefulSets and DaemonSets in
//     the manager's namespace: without their managedFields (few; the manager
//     compares them with what it applies by value, see drift.go).
//
// The drivers keep their own, narrower informers (podrunner: the pods of one
// provisioner, or of one node; records: one provisioner's PavVolumes,
// PavSnapshots and PavGroupSnapshots), none of them cluster-wide.

// slimPV keeps what pvGuard, pvByDriver and the status read of a PV.
func slimPV(pv *corev1.PersistentVolume) *corev1.PersistentVolume {
	out := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pv.Name, UID: pv.UID, ResourceVersion: pv.ResourceVersion},
		Status:     corev1.PersistentVolumeStatus{Phase: pv.Status.Phase},
	}
	if v, ok := pv.Annotations[annProvisionedBy]; ok {
		out.Annotations = map[string]string{annProvisionedBy: v}
	}
	if pv.Spec.CSI != nil {
		out.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: pv.Spec.CSI.Driver}
	}
	if r := pv.Spec.ClaimRef; r != nil {
		out.Spec.ClaimRef = &corev1.ObjectReference{Namespace: r.Namespace, Name: r.Name}
	}
	return out
}

// slimPod keeps what podGuard and podByProvisioner read of a pav pod.
func slimPod(p *corev1.Pod) *corev1.Pod {
	labels := map[string]string{}
	for _, k := range []string{podrunner.LabelProvisioner, podrunner.LabelPhase} {
		if v, ok := p.Labels[k]; ok {
			labels[k] = v
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: labels, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName},
		Status: corev1.PodStatus{Phase: p.Status.Phase},
	}
}

// slimRecord keeps what recordGuard and recordByProvisioner read of a
// PavVolume, PavSnapshot or PavGroupSnapshot: not its claim snapshot, pod
// tokens or context.
func slimRecord(u *unstructured.Unstructured) *unstructured.Unstructured {
	out := &unstructured.Unstructured{Object: map[string]any{}}
	out.SetAPIVersion(u.GetAPIVersion())
	out.SetKind(u.GetKind())
	out.SetName(u.GetName())
	out.SetUID(u.GetUID())
	out.SetResourceVersion(u.GetResourceVersion())
	out.SetLabels(u.GetLabels())
	if phase, ok, _ := unstructured.NestedString(u.Object, "status", "phase"); ok {
		_ = unstructured.SetNestedField(out.Object, phase, "status", "phase")
	}
	return out
}

// withoutManagedFields is the informer transform of CSIDrivers and workloads:
// their managedFields, often the largest part of them, are never read.
func withoutManagedFields(o any) (any, error) {
	if m, ok := o.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return o, nil
}

// slim is the manager's informer transform for PVs, pods and records
// (anything else, and client-go's DeletedFinalStateUnknown, pass unchanged).
func slim(o any) (any, error) {
	switch t := o.(type) {
	case *corev1.PersistentVolume:
		return slimPV(t), nil
	case *corev1.Pod:
		return slimPod(t), nil
	case *unstructured.Unstructured:
		return slimRecord(t), nil
	}
	return o, nil
}
