package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

const ns = "pav"

// fixture is a Controller on fake clients with running informers. The kube fake
// is NewClientset, whose tracker does real server-side apply (managed fields),
// so what the manager reads back from its own applies is what an API server
// would give.
type fixture struct {
	t      *testing.T
	ctx    context.Context
	kube   *kubefake.Clientset
	dyn    *dynamicfake.FakeDynamicClient
	events *record.FakeRecorder
	c      *Controller
	// lastWrites are the write calls of the last reconcile (see writes).
	lastWrites []string
}

func newFixture(t *testing.T, s Settings, objs ...runtime.Object) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f := &fixture{t: t, ctx: ctx, kube: kubefake.NewClientset(objs...),
		dyn: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{v1alpha1.GroupVersionResource: "PavProvisionerList", v1alpha1.VolumeGroupVersionResource: "PavVolumeList",
				v1alpha1.SnapshotGroupVersionResource: "PavSnapshotList", v1alpha1.GroupSnapshotGroupVersionResource: "PavGroupSnapshotList"}),
		events: record.NewFakeRecorder(100)}
	f.dyn.PrependReactor("patch", v1alpha1.Resource, applyAsMergePatch(f.dyn.Tracker()))
	f.restart(s) // the first manager
	return f
}

// applyAsMergePatch stands in for server-side apply of PavProvisioners, which
// the dynamic fake cannot do on unstructured objects: a JSON merge patch of the
// main resource (status left alone) or of the status subresource (status only).
// For the manager's applies (its finalizer alone; the whole status) the result
// is the same as the API server's; the e2e suite runs the real thing.
func applyAsMergePatch(tracker k8stesting.ObjectTracker) k8stesting.ReactionFunc {
	return func(action k8stesting.Action) (bool, runtime.Object, error) {
		pa, ok := action.(k8stesting.PatchAction)
		if !ok || pa.GetPatchType() != types.ApplyPatchType {
			return false, nil, nil
		}
		gvr := action.GetResource()
		cur, err := tracker.Get(gvr, "", pa.GetName())
		if err != nil {
			return true, nil, err
		}
		curJSON, err := json.Marshal(cur)
		if err != nil {
			return true, nil, err
		}
		patch := map[string]any{}
		if err := yaml.Unmarshal(pa.GetPatch(), &patch); err != nil {
			return true, nil, err
		}
		if md, ok := patch["metadata"].(map[string]any); ok {
			if uid, ok := md["uid"]; ok && uid != cur.(*unstructured.Unstructured).GetUID() && uid != string(cur.(*unstructured.Unstructured).GetUID()) {
				return true, nil, fmt.Errorf("metadata.uid: field is immutable")
			}
		}
		if action.GetSubresource() == "status" {
			patch = map[string]any{"status": patch["status"]}
		} else {
			delete(patch, "status")
		}
		patchJSON, err := json.Marshal(patch)
		if err != nil {
			return true, nil, err
		}
		merged, err := jsonpatch.MergePatch(curJSON, patchJSON)
		if err != nil {
			return true, nil, err
		}
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal(merged, &u.Object); err != nil {
			return true, nil, err
		}
		if err := tracker.Update(gvr, u, ""); err != nil {
			return true, nil, err
		}
		return true, u, nil
	}
}

// provisioner is a valid PavProvisioner (the staging image tells versions apart).
func provisioner(name, uid string, generation int64) *unstructured.Unstructured {
	return provisionerWith(name, uid, generation, "busybox")
}

func provisionerWith(name, uid string, generation int64, image string) *unstructured.Unstructured {
	y := fmt.Sprintf(`apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata: {name: %s, uid: %s, generation: %d}
spec:
  provisioningModes: [Dynamic, Static]
  volumeCreation: {capacity: 1Gi}
  volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: %q}]}}}
`, name, uid, generation, image)
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(y), &u.Object); err != nil {
		panic(err)
	}
	return u
}

func (f *fixture) create(u *unstructured.Unstructured) {
	f.t.Helper()
	if _, err := f.dyn.Resource(v1alpha1.GroupVersionResource).Create(f.ctx, u, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.settle()
}

// record creates a PavVolume of provisioner in phase and waits for the informer.
func (f *fixture) record(name, provisioner string, phase v1alpha1.VolumePhase) {
	f.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": v1alpha1.VolumeKind,
		"metadata": map[string]any{"name": name, "labels": map[string]any{v1alpha1.LabelVolumeProvisioner: provisioner}},
		"spec":     map[string]any{"provisioner": provisioner, "volumeName": name},
		"status":   map[string]any{"phase": string(phase)},
	}}
	if _, err := f.dyn.Resource(v1alpha1.VolumeGroupVersionResource).Create(f.ctx, u, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok, _ := f.c.records.GetByKey(name); ok {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("PavVolume %s not in the manager's cache", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// edit changes the stored PavProvisioner (keeping its finalizers and status,
// as the API server would) and waits for the informer.
func (f *fixture) edit(name string, change func(u *unstructured.Unstructured)) {
	f.t.Helper()
	res := f.dyn.Resource(v1alpha1.GroupVersionResource)
	u, err := res.Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	change(u)
	if _, err := res.Update(f.ctx, u, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.settle()
}

// markDeleted sets a deletion timestamp, as `kubectl delete` does to an object
// with finalizers.
func (f *fixture) markDeleted(name string) {
	f.edit(name, func(u *unstructured.Unstructured) {
		now := metav1.Now()
		u.SetDeletionTimestamp(&now)
	})
}

// reconcile runs one reconcile with a clean action log, then waits until the
// informers have seen what it wrote.
func (f *fixture) reconcile(name string) error {
	f.t.Helper()
	f.kube.ClearActions()
	f.dyn.ClearActions()
	err := f.c.reconcile(f.ctx, name)
	writes := f.writes()
	f.settle()
	f.kube.ClearActions()
	f.dyn.ClearActions()
	f.lastWrites = writes
	return err
}

// writes lists the write calls since the last ClearActions, as
// "verb resource[/subresource] name" (the listing of settle is not a write).
func (f *fixture) writes() []string {
	var out []string
	for _, a := range append(f.kube.Actions(), f.dyn.Actions()...) {
		v := a.GetVerb()
		if v == "get" || v == "list" || v == "watch" {
			continue
		}
		r := a.GetResource().Resource
		if s := a.GetSubresource(); s != "" {
			r += "/" + s
		}
		name := ""
		switch x := a.(type) {
		case k8stesting.PatchAction:
			name = x.GetName()
			if x.GetPatchType() == types.ApplyPatchType {
				v = "apply"
			}
		case k8stesting.DeleteAction:
			name = x.GetName()
		case k8stesting.CreateAction:
			if m, err := meta.Accessor(x.GetObject()); err == nil {
				name = m.GetName()
			}
		case k8stesting.UpdateAction:
			if m, err := meta.Accessor(x.GetObject()); err == nil {
				name = m.GetName()
			}
		}
		out = append(out, v+" "+r+" "+name)
	}
	sort.Strings(out)
	return out
}

// settle waits until every informer holds exactly what the fake API holds.
func (f *fixture) settle() {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		diff := f.cacheDiff()
		if diff == "" {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("informers did not catch up: %s", diff)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *fixture) cacheDiff() string {
	// Compared without managedFields, which the informers of workloads and
	// CSIDrivers drop.
	keyed := func(items []any) string {
		m := map[string]any{}
		for _, o := range items {
			acc, _ := meta.Accessor(o)
			var v map[string]any
			j, _ := json.Marshal(o)
			_ = json.Unmarshal(j, &v)
			if md, ok := v["metadata"].(map[string]any); ok {
				delete(md, "managedFields")
			}
			m[acc.GetNamespace()+"/"+acc.GetName()] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	strip := func(items []any) []any {
		for i, o := range items {
			items[i], _ = slim(o) // what the informers keep of PVs and pods
		}
		return items
	}
	ctx := f.ctx
	var apiItems, cacheItems []any
	provs, _ := f.dyn.Resource(v1alpha1.GroupVersionResource).List(ctx, metav1.ListOptions{})
	for i := range provs.Items {
		apiItems = append(apiItems, &provs.Items[i])
	}
	cached, _ := f.c.provisioners.List(labels.Everything())
	for _, o := range cached {
		cacheItems = append(cacheItems, o)
	}
	if a, b := keyed(apiItems), keyed(cacheItems); a != b {
		return "PavProvisioners: " + a + " vs " + b
	}
	sts, _ := f.kube.AppsV1().StatefulSets(ns).List(ctx, metav1.ListOptions{})
	csts, _ := f.c.statefulSets.List(labels.Everything())
	if a, b := keyed(anyOf(sts.Items)), keyed(anyOfPtr(csts)); a != b {
		return "StatefulSets differ"
	}
	ds, _ := f.kube.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{})
	cds, _ := f.c.daemonSets.List(labels.Everything())
	if a, b := keyed(anyOf(ds.Items)), keyed(anyOfPtr(cds)); a != b {
		return "DaemonSets differ"
	}
	csi, _ := f.kube.StorageV1().CSIDrivers().List(ctx, metav1.ListOptions{})
	ccsi, _ := f.c.csiDrivers.List(labels.Everything())
	if a, b := keyed(anyOf(csi.Items)), keyed(anyOfPtr(ccsi)); a != b {
		return "CSIDrivers differ"
	}
	svcs, _ := f.kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{LabelSelector: labelComponent + "=" + componentSnapshotMetadata})
	csvcs, _ := f.c.services.List(labels.Everything())
	if a, b := keyed(anyOf(svcs.Items)), keyed(anyOfPtr(csvcs)); a != b {
		return "Services differ"
	}
	secs, _ := f.kube.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: labelComponent + "=" + componentSnapshotMetadata})
	csecs, _ := f.c.secrets.List(labels.Everything())
	if a, b := keyed(anyOf(secs.Items)), keyed(anyOfPtr(csecs)); a != b {
		return "Secrets differ"
	}
	pvs, _ := f.kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if a, b := keyed(strip(anyOf(pvs.Items))), keyed(f.c.pvs.List()); a != b {
		return "PVs differ"
	}
	pods, _ := f.kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	var pavPods []corev1.Pod
	for _, p := range pods.Items {
		if p.Labels["pav.albertofaria.github.io/provisioner"] != "" {
			pavPods = append(pavPods, p)
		}
	}
	if a, b := keyed(strip(anyOf(pavPods))), keyed(f.c.pods.List()); a != b {
		return "pods differ"
	}
	return ""
}

func anyOf[T any](items []T) []any {
	out := make([]any, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

func anyOfPtr[T any](items []*T) []any {
	out := make([]any, len(items))
	for i := range items {
		out[i] = items[i]
	}
	return out
}

// Reads of the fake API.

func (f *fixture) provisioner(name string) *v1alpha1.PavProvisioner {
	f.t.Helper()
	u, err := f.dyn.Resource(v1alpha1.GroupVersionResource).Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	p, err := toProvisioner(u)
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

func (f *fixture) condition(name, typ string) metav1.Condition {
	f.t.Helper()
	c := meta.FindStatusCondition(f.provisioner(name).Status.Conditions, typ)
	if c == nil {
		f.t.Fatalf("%s has no condition %s", name, typ)
	}
	return *c
}

func (f *fixture) statefulSet(name string) *appsv1.StatefulSet {
	f.t.Helper()
	s, err := f.kube.AppsV1().StatefulSets(ns).Get(f.ctx, ControllerName(name), metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *fixture) daemonSet(name string) *appsv1.DaemonSet {
	f.t.Helper()
	d, err := f.kube.AppsV1().DaemonSets(ns).Get(f.ctx, NodeName(name), metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

func (f *fixture) csiDriver(name string) *storagev1.CSIDriver {
	f.t.Helper()
	d, err := f.kube.StorageV1().CSIDrivers().Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

// setWorkloadStatus makes the fake workloads report a rollout state.
func (f *fixture) setWorkloadStatus(name string, stsAvailable int32, dsDesired, dsAvailable int32) {
	f.t.Helper()
	s := f.statefulSet(name)
	s.Generation = 1 // the fake API server keeps no generation
	s.Status = appsv1.StatefulSetStatus{ObservedGeneration: 1, Replicas: 1, ReadyReplicas: stsAvailable,
		AvailableReplicas: stsAvailable, UpdatedReplicas: 1}
	if _, err := f.kube.AppsV1().StatefulSets(ns).UpdateStatus(f.ctx, s, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	d := f.daemonSet(name)
	d.Generation = 1
	d.Status = appsv1.DaemonSetStatus{ObservedGeneration: 1, DesiredNumberScheduled: dsDesired,
		NumberAvailable: dsAvailable, UpdatedNumberScheduled: dsDesired, NumberReady: dsAvailable, CurrentNumberScheduled: dsDesired}
	if _, err := f.kube.AppsV1().DaemonSets(ns).UpdateStatus(f.ctx, d, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.settle()
}

// drainEvents returns the events recorded so far ("Type Reason message").
func (f *fixture) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-f.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func hasEvent(events []string, prefix string, substrings ...string) bool {
	for _, e := range events {
		if !strings.HasPrefix(e, prefix) {
			continue
		}
		ok := true
		for _, s := range substrings {
			ok = ok && strings.Contains(e, s)
		}
		if ok {
			return true
		}
	}
	return false
}

// Objects the tests put in the cluster.

func dynamicPV(name, driver string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
	pv := staticPV(name, driver, phase)
	pv.Annotations = map[string]string{annProvisionedBy: driver}
	return pv
}

func staticPV(name, driver string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
			CSI: &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: name}}},
		Status: corev1.PersistentVolumeStatus{Phase: phase}}
	if phase == corev1.VolumeBound {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns1", Name: "claim-" + name}
	}
	return pv
}

func pavPod(name, provisioner, phase string, podPhase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns1", Labels: map[string]string{
		"pav.albertofaria.github.io/provisioner": provisioner, "pav.albertofaria.github.io/phase": phase}},
		Spec:   corev1.PodSpec{NodeName: "node1"},
		Status: corev1.PodStatus{Phase: podPhase}}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func k8stestingTombstone(o any) any { return cache.DeletedFinalStateUnknown{Key: "x", Obj: o} }

// snapshot creates a Created PavSnapshot of provisioner and waits until the
// manager's informer has it (its guard names it, or the informer's lister
// lists it).
func (f *fixture) snapshot(name, provisioner string) {
	f.t.Helper()
	f.snapshotRecord(v1alpha1.SnapshotGroupVersionResource, v1alpha1.SnapshotKind, name, provisioner)
}

// groupSnapshot is snapshot for a PavGroupSnapshot.
func (f *fixture) groupSnapshot(name, provisioner string) {
	f.t.Helper()
	f.snapshotRecord(v1alpha1.GroupSnapshotGroupVersionResource, v1alpha1.GroupSnapshotKind, name, provisioner)
}

func (f *fixture) snapshotRecord(gvr schema.GroupVersionResource, kind, name, provisioner string) {
	f.t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": kind,
		"metadata": map[string]any{"name": name, "labels": map[string]any{v1alpha1.LabelVolumeProvisioner: provisioner}},
		"spec":     map[string]any{"provisioner": provisioner, "snapshotName": name},
		"status":   map[string]any{"phase": string(v1alpha1.SnapshotCreated)},
	}}
	if _, err := f.dyn.Resource(gvr).Create(f.ctx, u, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	want := fmt.Sprintf("%s %s (", kind, name)
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := f.c.blockers(provisioner)
		if err != nil {
			f.t.Fatal(err)
		}
		for _, s := range b {
			if strings.HasPrefix(s, want) {
				return
			}
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s %s not in the manager's cache", kind, name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
