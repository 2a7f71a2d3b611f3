package manager

import (
	"reflect"
	"sort"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

// The manager caches slimmed objects: its guard and status must read the same
// from them as from the whole objects.
func TestSlimObjectsKeepWhatTheGuardReads(t *testing.T) {
	now := metav1.Now()
	big := map[string]string{"note": string(make([]byte, 4096))}
	pvs := []*corev1.PersistentVolume{
		{ObjectMeta: metav1.ObjectMeta{Name: "dyn", Annotations: map[string]string{annProvisionedBy: "p", "other": "x"}, Labels: big},
			Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "p", VolumeHandle: "h", VolumeAttributes: big}}},
			Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeReleased}},
		{ObjectMeta: metav1.ObjectMeta{Name: "static"},
			Spec: corev1.PersistentVolumeSpec{ClaimRef: &corev1.ObjectReference{Namespace: "apps", Name: "data", UID: "u"},
				PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "p", VolumeHandle: "s"}}},
			Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}},
		{ObjectMeta: metav1.ObjectMeta{Name: "static-free"},
			Spec:   corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "p"}}},
			Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeAvailable}},
		{ObjectMeta: metav1.ObjectMeta{Name: "nfs"}, Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{}}}},
	}
	labels := func(phase v1alpha1.Phase) map[string]string {
		return map[string]string{podrunner.LabelProvisioner: "p", podrunner.LabelPhase: string(phase), "app": "x"}
	}
	pods := []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "stage", Namespace: "pav", Labels: labels(v1alpha1.PhaseStaging), Annotations: big},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}, Status: corev1.PodStatus{Phase: corev1.PodRunning}},
		{ObjectMeta: metav1.ObjectMeta{Name: "create", Namespace: "pav", Labels: labels(v1alpha1.PhaseCreation), DeletionTimestamp: &now},
			Status: corev1.PodStatus{Phase: corev1.PodPending}},
		{ObjectMeta: metav1.ObjectMeta{Name: "done", Namespace: "pav", Labels: labels(v1alpha1.PhaseDeletion)}, Status: corev1.PodStatus{Phase: corev1.PodSucceeded}},
	}
	record := func(name, phase string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "pav.albertofaria.github.io/v1alpha1", "kind": v1alpha1.VolumeKind,
			"spec":   map[string]any{"claim": map[string]any{"name": "data"}, "context": map[string]any{"note": big["note"]}},
			"status": map[string]any{"pods": []any{map[string]any{"token": "secret"}}},
		}}
		u.SetName(name)
		u.SetLabels(map[string]string{v1alpha1.LabelVolumeProvisioner: "p", v1alpha1.LabelVolumeHandle: "h"})
		if phase != "" {
			_ = unstructured.SetNestedField(u.Object, phase, "status", "phase")
		}
		return u
	}
	records := []*unstructured.Unstructured{record("pvc-1", "Created"), record("pvc-2", "")}

	index := func(slimmed bool) (pvIdx, podIdx, recIdx cache.Indexer) {
		pvIdx = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{indexByDriver: pvByDriver})
		podIdx = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{indexByProvisioner: podByProvisioner})
		recIdx = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{indexByProvisioner: recordByProvisioner})
		add := func(idx cache.Indexer, o any) {
			if slimmed {
				o, _ = slim(o)
			}
			if err := idx.Add(o); err != nil {
				t.Fatal(err)
			}
		}
		for _, o := range pvs {
			add(pvIdx, o.DeepCopy())
		}
		for _, o := range pods {
			add(podIdx, o.DeepCopy())
		}
		for _, o := range records {
			add(recIdx, o.DeepCopy())
		}
		return
	}
	fullPV, fullPod, fullRec := index(false)
	slimPVs, slimPods, slimRecs := index(true)
	for _, c := range []struct {
		name       string
		full, slim guard
	}{
		{"PVs", pvGuard(fullPV), pvGuard(slimPVs)},
		{"pods", podGuard(fullPod), podGuard(slimPods)},
		{"records", recordGuard(v1alpha1.VolumeKind, fullRec), recordGuard(v1alpha1.VolumeKind, slimRecs)},
	} {
		want, err1 := c.full("p")
		got, err2 := c.slim("p")
		sort.Strings(want) // as blockers does: indexes are maps
		sort.Strings(got)
		if err1 != nil || err2 != nil || !reflect.DeepEqual(got, want) || len(want) == 0 {
			t.Errorf("%s: slim %q (%v), whole %q (%v)", c.name, got, err2, want, err1)
		}
	}
	// status.volumes counts the driver's PVs.
	a, _ := fullPV.ByIndex(indexByDriver, "p")
	b, _ := slimPVs.ByIndex(indexByDriver, "p")
	if len(a) != 3 || len(b) != 3 {
		t.Errorf("PVs of the driver: %d whole, %d slim", len(a), len(b))
	}
	// What is dropped is dropped: no tokens, no large fields.
	if s, _ := slim(records[0].DeepCopy()); s.(*unstructured.Unstructured).Object["spec"] != nil {
		t.Error("the record's spec is cached")
	}
	if s, _ := slim(pvs[0].DeepCopy()); s.(*corev1.PersistentVolume).Labels != nil || s.(*corev1.PersistentVolume).Spec.CSI.VolumeAttributes != nil {
		t.Error("the PV's labels or attributes are cached")
	}
	if o := (cache.DeletedFinalStateUnknown{Key: "x"}); !reflect.DeepEqual(must(slim(o)), o) {
		t.Error("a tombstone must pass unchanged")
	}
}

func must(o any, _ error) any { return o }
