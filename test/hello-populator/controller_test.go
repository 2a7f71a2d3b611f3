package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic/dynamicinformer"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

const (
	popNS   = "hello-pop" // the populator's namespace
	testNS  = "test"      // the user's
	image   = "registry.k8s.io/sig-storage/hello-populator:v1.0.1"
	uid     = types.UID("uid-1")
	node    = "node-1"
	prime1  = "prime-uid-1"
	pod1    = "populate-uid-1"
	pvName  = "pv-1"
	content = "Hello from namespace test"
)

func ptr[T any](v T) *T { return &v }

func class(name string, mode storagev1.VolumeBindingMode, provisioner string) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: provisioner, VolumeBindingMode: &mode}
}

func classes() []runtime.Object {
	return []runtime.Object{
		class("wffc", storagev1.VolumeBindingWaitForFirstConsumer, "loop-block"),
		class("immediate", storagev1.VolumeBindingImmediate, "pav-e2e"),
		class("intree", storagev1.VolumeBindingImmediate, "kubernetes.io/gce-pd"),
	}
}

// claim is the user's claim, as the e2e spec makes it: a Hello data source, a
// WaitForFirstConsumer class, its node selected, unbound.
func claim(mods ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: testNS, UID: uid, ResourceVersion: "7",
			Annotations: map[string]string{annSelectedNode: node},
			Finalizers:  []string{"kubernetes.io/pvc-protection"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
			StorageClassName: ptr("wffc"),
			VolumeMode:       ptr(corev1.PersistentVolumeFilesystem),
			DataSourceRef:    &corev1.TypedObjectReference{APIGroup: ptr(helloGroup), Kind: helloKind, Name: "example-hello"},
		},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
	for _, m := range mods {
		m(pvc)
	}
	return pvc
}

func ours(pvc *corev1.PersistentVolumeClaim) {
	pvc.Finalizers = append(pvc.Finalizers, pvcFinalizer)
}

func bound(pvc *corev1.PersistentVolumeClaim) {
	pvc.Spec.VolumeName = pvName
	pvc.Status.Phase = corev1.ClaimBound
}

func hello(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": helloGroup + "/v1alpha1",
		"kind":       helloKind,
		"metadata":   map[string]any{"name": name, "namespace": testNS},
		"spec":       map[string]any{"fileName": "example-test.txt", "fileContents": content},
	}}
}

func primeOf(phase corev1.PersistentVolumeClaimPhase, volume string) *corev1.PersistentVolumeClaim {
	p := primeClaim(claim(), popNS, node)
	p.Spec.VolumeName = volume
	p.Status.Phase = phase
	return p
}

func podOf(phase corev1.PodPhase) *corev1.Pod {
	p, err := populatorPod(claim(), hello("example-hello"), prime1, popNS, image, node)
	if err != nil {
		panic(err)
	}
	p.Status.Phase = phase
	return p
}

// pvFor is the PV provisioned for the claim ref namespace/name/uid.
func pvFor(namespace, name string, claimUID types.UID) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName, Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": "loop-block"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			StorageClassName:              "wffc",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "loop-block", VolumeHandle: "vol-1"}},
			ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: namespace, Name: name, UID: claimUID},
		},
	}
}

// harness is a controller on a fake clientset and a fake dynamic client
// holding objs, with synced informers (not running: tests call sync).
func harness(t *testing.T, objs ...runtime.Object) (*controller, *kubefake.Clientset, *record.FakeRecorder, context.Context) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var kubeObjs, dynObjs []runtime.Object
	for _, o := range objs {
		if _, ok := o.(*unstructured.Unstructured); ok {
			dynObjs = append(dynObjs, o)
		} else {
			kubeObjs = append(kubeObjs, o)
		}
	}
	kube := kubefake.NewClientset(kubeObjs...)
	dynClient := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{helloGVR: "HelloList"}, dynObjs...)
	f := informers.NewSharedInformerFactory(kube, 0)
	nsf := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(popNS))
	dyn := dynamicinformer.NewDynamicSharedInformerFactory(dynClient, 0)
	rec := record.NewFakeRecorder(20)
	c, err := newController(kube, f, nsf, dyn, popNS, image, rec)
	if err != nil {
		t.Fatal(err)
	}
	f.Start(ctx.Done())
	nsf.Start(ctx.Done())
	dyn.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	nsf.WaitForCacheSync(ctx.Done())
	dyn.WaitForCacheSync(ctx.Done())
	return c, kube, rec, ctx
}

// writes are the changes the controller asked of the API server: "verb
// resource namespace/name".
func writes(kube *kubefake.Clientset) []string {
	var out []string
	for _, a := range kube.Actions() {
		var name string
		switch a := a.(type) {
		case k8stesting.CreateAction:
			name = a.GetObject().(interface{ GetName() string }).GetName()
		case k8stesting.PatchAction:
			name = a.GetName()
		case k8stesting.DeleteAction:
			name = a.GetName()
		case k8stesting.UpdateAction:
			name = a.GetObject().(interface{ GetName() string }).GetName()
		default:
			continue
		}
		w := a.GetVerb() + " " + a.GetResource().Resource + " "
		if ns := a.GetNamespace(); ns != "" {
			w += ns + "/"
		}
		out = append(out, w+name)
	}
	return out
}

func events(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// Which claims the populator acts on, and what it does at each step of the flow.
func TestSync(t *testing.T) {
	key := testNS + "/claim"
	createPrime := "create persistentvolumeclaims " + popNS + "/" + prime1
	addFinalizer := "patch persistentvolumeclaims " + key
	createPod := "create pods " + popNS + "/" + pod1
	for _, tc := range []struct {
		name   string
		key    string // default: the claim's
		objs   []runtime.Object
		writes []string
		events []string
	}{
		{name: "no data source", objs: []runtime.Object{claim(func(p *corev1.PersistentVolumeClaim) { p.Spec.DataSourceRef = nil })}},
		{name: "another kind", objs: []runtime.Object{claim(func(p *corev1.PersistentVolumeClaim) {
			p.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "snap"}
		})}},
		{name: "another group", objs: []runtime.Object{hello("example-hello"), claim(func(p *corev1.PersistentVolumeClaim) {
			p.Spec.DataSourceRef.APIGroup = ptr("other.example.com")
		})}},
		{name: "a Hello in another namespace (cross-namespace data sources are not handled)", objs: []runtime.Object{hello("example-hello"), claim(func(p *corev1.PersistentVolumeClaim) {
			p.Spec.DataSourceRef.Namespace = ptr("elsewhere")
		})}},
		{name: "a claim in the populator's namespace", key: popNS + "/" + prime1, objs: []runtime.Object{hello("example-hello"), primeOf(corev1.ClaimPending, "")}},
		{name: "claim gone", objs: []runtime.Object{hello("example-hello")}},
		{name: "Hello not there yet", objs: []runtime.Object{claim()}},
		{name: "storage class not there yet", objs: []runtime.Object{hello("example-hello"), claim(func(p *corev1.PersistentVolumeClaim) {
			p.Spec.StorageClassName = ptr("later")
		})}},
		{name: "in-tree storage class", objs: []runtime.Object{hello("example-hello"), claim(func(p *corev1.PersistentVolumeClaim) {
			p.Spec.StorageClassName = ptr("intree")
		})}},
		{name: "WaitForFirstConsumer, no node selected yet", objs: []runtime.Object{hello("example-hello"), claim(func(p *corev1.PersistentVolumeClaim) {
			p.Annotations = nil
		})}},
		{
			name:   "WaitForFirstConsumer, node selected: prime claim, finalizer, pod",
			objs:   []runtime.Object{hello("example-hello"), claim()},
			writes: []string{createPrime, addFinalizer, createPod},
			events: []string{"Normal PopulatorCreated Populator started"},
		},
		{
			name:   "Immediate binding: no node needed",
			objs:   []runtime.Object{hello("example-hello"), claim(func(p *corev1.PersistentVolumeClaim) { p.Annotations = nil; p.Spec.StorageClassName = ptr("immediate") })},
			writes: []string{createPrime, addFinalizer, createPod},
			events: []string{"Normal PopulatorCreated Populator started"},
		},
		{
			name:   "restarted after the prime claim was made",
			objs:   []runtime.Object{hello("example-hello"), claim(), primeOf(corev1.ClaimPending, "")},
			writes: []string{addFinalizer, createPod},
			events: []string{"Normal PopulatorCreated Populator started"},
		},
		{name: "pod running", objs: []runtime.Object{hello("example-hello"), claim(ours), primeOf(corev1.ClaimBound, pvName), podOf(corev1.PodRunning)}},
		{
			name:   "pod failed: deleted, to be made again",
			objs:   []runtime.Object{hello("example-hello"), claim(ours), primeOf(corev1.ClaimBound, pvName), podOf(corev1.PodFailed)},
			writes: []string{"delete pods " + popNS + "/" + pod1},
			events: []string{"Warning PopulatorFailed Populator failed: "},
		},
		{
			name: "pod succeeded: the PV goes to the claim",
			objs: []runtime.Object{hello("example-hello"), claim(ours), primeOf(corev1.ClaimBound, pvName), podOf(corev1.PodSucceeded),
				pvFor(popNS, prime1, "prime-uid")},
			writes: []string{"patch persistentvolumes " + pvName},
		},
		{
			name: "PV handed over, the PV controller has not bound the claim yet",
			objs: []runtime.Object{hello("example-hello"), claim(ours), primeOf(corev1.ClaimBound, pvName), podOf(corev1.PodSucceeded),
				pvFor(testNS, "claim", uid)},
		},
		{
			name: "claim bound, prime claim not yet Lost",
			objs: []runtime.Object{hello("example-hello"), claim(ours, bound), primeOf(corev1.ClaimBound, pvName), podOf(corev1.PodSucceeded),
				pvFor(testNS, "claim", uid)},
		},
		{
			name: "claim bound, prime claim Lost: clean-up",
			objs: []runtime.Object{hello("example-hello"), claim(ours, bound), primeOf(corev1.ClaimLost, pvName), podOf(corev1.PodSucceeded),
				pvFor(testNS, "claim", uid)},
			writes: []string{"delete pods " + popNS + "/" + pod1, "delete persistentvolumeclaims " + popNS + "/" + prime1, "patch persistentvolumeclaims " + key},
			events: []string{"Normal PopulatorFinished Populator finished"},
		},
		{
			name:   "clean-up needs neither the Hello nor the class any more",
			objs:   []runtime.Object{claim(ours, bound, func(p *corev1.PersistentVolumeClaim) { p.Spec.StorageClassName = ptr("gone") }), primeOf(corev1.ClaimLost, pvName)},
			writes: []string{"delete persistentvolumeclaims " + popNS + "/" + prime1, "patch persistentvolumeclaims " + key},
			events: []string{"Normal PopulatorFinished Populator finished"},
		},
		{name: "populated and cleaned up", objs: []runtime.Object{hello("example-hello"), claim(bound), pvFor(testNS, "claim", uid)}},
		{name: "bound without the populator", objs: []runtime.Object{hello("example-hello"), claim(bound)}},
		{
			name: "claim deleted before it was populated: clean-up",
			objs: []runtime.Object{hello("example-hello"), claim(ours, func(p *corev1.PersistentVolumeClaim) {
				p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
			}), primeOf(corev1.ClaimBound, pvName), podOf(corev1.PodRunning)},
			writes: []string{"delete pods " + popNS + "/" + pod1, "delete persistentvolumeclaims " + popNS + "/" + prime1, "patch persistentvolumeclaims " + key},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, kube, rec, ctx := harness(t, append(classes(), tc.objs...)...)
			kube.ClearActions()
			k := tc.key
			if k == "" {
				k = key
			}
			if err := c.sync(ctx, k); err != nil {
				t.Fatalf("sync: %v", err)
			}
			if got := writes(kube); !slices.Equal(got, tc.writes) {
				t.Errorf("writes:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.writes, "\n  "))
			}
			if got := events(rec); !slices.Equal(got, tc.events) {
				t.Errorf("events %q, want %q", got, tc.events)
			}
		})
	}
}

// The prime claim is the original's twin in the populator's namespace, on the
// selected node; the pod runs this image on that node in populate mode, the
// prime claim mounted where upstream mounts it.
func TestPrimeClaimAndPod(t *testing.T) {
	for _, tc := range []struct {
		name     string
		claim    *corev1.PersistentVolumeClaim
		node     string
		args     []string
		mount    string // the mount path, or the device path of a Block claim
		rawBlock bool
	}{
		{name: "filesystem, WaitForFirstConsumer", claim: claim(), node: node,
			args: []string{"--mode=populate", "--file-name=/mnt/example-test.txt", "--file-contents=" + content}, mount: "/mnt"},
		{name: "filesystem, Immediate", claim: claim(func(p *corev1.PersistentVolumeClaim) { p.Spec.StorageClassName = ptr("immediate") }),
			args: []string{"--mode=populate", "--file-name=/mnt/example-test.txt", "--file-contents=" + content}, mount: "/mnt"},
		{name: "block", claim: claim(func(p *corev1.PersistentVolumeClaim) { p.Spec.VolumeMode = ptr(corev1.PersistentVolumeBlock) }), node: node,
			args: []string{"--mode=populate", "--file-name=/dev/block", "--file-contents=" + content}, mount: "/dev/block", rawBlock: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, kube, _, ctx := harness(t, append(classes(), hello("example-hello"), tc.claim)...)
			if err := c.sync(ctx, testNS+"/claim"); err != nil {
				t.Fatal(err)
			}
			prime, err := kube.CoreV1().PersistentVolumeClaims(popNS).Get(ctx, prime1, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			o := tc.claim.Spec
			if !slices.Equal(prime.Spec.AccessModes, o.AccessModes) || *prime.Spec.StorageClassName != *o.StorageClassName ||
				*prime.Spec.VolumeMode != *o.VolumeMode || !prime.Spec.Resources.Requests.Storage().Equal(*o.Resources.Requests.Storage()) {
				t.Errorf("prime claim spec %+v, want the original's %+v", prime.Spec, o)
			}
			if prime.Spec.DataSourceRef != nil || prime.Spec.DataSource != nil {
				t.Errorf("prime claim has a data source: %+v", prime.Spec)
			}
			if got := prime.Annotations[annSelectedNode]; got != tc.node {
				t.Errorf("prime claim's selected node %q, want %q", got, tc.node)
			}

			pod, err := kube.CoreV1().Pods(popNS).Get(ctx, pod1, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if pod.Spec.NodeName != tc.node || pod.Spec.RestartPolicy != corev1.RestartPolicyNever || len(pod.Spec.Containers) != 1 {
				t.Errorf("pod spec: node %q, restart %q, %d containers", pod.Spec.NodeName, pod.Spec.RestartPolicy, len(pod.Spec.Containers))
			}
			con := pod.Spec.Containers[0]
			if con.Image != image || con.ImagePullPolicy != corev1.PullIfNotPresent || !slices.Equal(con.Args, tc.args) {
				t.Errorf("container image %q (%s), args %q; want %q, IfNotPresent, %q", con.Image, con.ImagePullPolicy, con.Args, image, tc.args)
			}
			if v := pod.Spec.Volumes; len(v) != 1 || v[0].PersistentVolumeClaim == nil || v[0].PersistentVolumeClaim.ClaimName != prime1 {
				t.Errorf("pod volumes %+v, want the prime claim", v)
			}
			var path string
			switch {
			case tc.rawBlock && len(con.VolumeDevices) == 1 && len(con.VolumeMounts) == 0:
				path = con.VolumeDevices[0].DevicePath
			case !tc.rawBlock && len(con.VolumeMounts) == 1 && len(con.VolumeDevices) == 0:
				path = con.VolumeMounts[0].MountPath
			}
			if path != tc.mount {
				t.Errorf("mounts %+v, devices %+v; want the volume at %s", con.VolumeMounts, con.VolumeDevices, tc.mount)
			}
		})
	}
}

// The patch points the PV's claimRef at the original claim (namespace, name,
// UID) and leaves the rest of the PV alone.
func TestClaimRefPatch(t *testing.T) {
	c, kube, _, ctx := harness(t, append(classes(), hello("example-hello"), claim(ours), primeOf(corev1.ClaimBound, pvName),
		podOf(corev1.PodSucceeded), pvFor(popNS, prime1, "prime-uid"))...)
	if err := c.sync(ctx, testNS+"/claim"); err != nil {
		t.Fatal(err)
	}
	pv, err := kube.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ref := pv.Spec.ClaimRef
	if ref.Namespace != testNS || ref.Name != "claim" || ref.UID != uid || ref.ResourceVersion != "7" {
		t.Errorf("claimRef %+v, want %s/claim uid %s resourceVersion 7", ref, testNS, uid)
	}
	if got := pv.Annotations[populatedFromAnno]; got != testNS+"/example-hello" {
		t.Errorf("%s = %q", populatedFromAnno, got)
	}
	if pv.Annotations["pv.kubernetes.io/provisioned-by"] != "loop-block" || pv.Spec.CSI == nil || pv.Spec.CSI.VolumeHandle != "vol-1" ||
		pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("the patch changed more than the claimRef: %+v", pv)
	}

	var patch map[string]any
	data, err := claimRefPatch(pvName, claim())
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &patch); err != nil {
		t.Fatal(err)
	}
	spec := patch["spec"].(map[string]any)
	if len(spec) != 1 || spec["claimRef"] == nil {
		t.Errorf("the patch sets spec %v, want only claimRef", spec)
	}
}

// The finalizer goes on before the pod is made, and off at clean-up; the
// patch tests the list it changes.
func TestFinalizer(t *testing.T) {
	c, kube, _, ctx := harness(t, claim())
	get := func() []string {
		p, err := kube.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, "claim", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Finalizers
	}
	if err := c.ensureFinalizer(ctx, claim(), true); err != nil {
		t.Fatal(err)
	}
	if got := get(); !slices.Equal(got, []string{"kubernetes.io/pvc-protection", pvcFinalizer}) {
		t.Errorf("finalizers %q after adding", got)
	}
	// A stale claim (its list changed since): the test fails, nothing changes.
	if err := c.ensureFinalizer(ctx, claim(func(p *corev1.PersistentVolumeClaim) { p.Finalizers = nil }), true); err == nil {
		t.Error("adding to a stale list succeeded")
	}
	if err := c.ensureFinalizer(ctx, claim(ours), false); err != nil {
		t.Fatal(err)
	}
	if got := get(); !slices.Equal(got, []string{"kubernetes.io/pvc-protection"}) {
		t.Errorf("finalizers %q after removing", got)
	}
	kube.ClearActions()
	if err := c.ensureFinalizer(ctx, claim(), false); err != nil {
		t.Fatal(err)
	}
	if w := writes(kube); len(w) != 0 {
		t.Errorf("removing an absent finalizer wrote %q", w)
	}
}

// The whole flow, each step a new controller on the objects the previous one
// left (as after a restart), with the cluster's part (provisioning, the pod
// running, the PV controller binding) played by the test.
func TestFlowAcrossRestarts(t *testing.T) {
	objs := append(classes(), hello("example-hello"), claim())
	step := func(name string, play func(kube *kubefake.Clientset, ctx context.Context), want []string) {
		t.Helper()
		c, kube, _, ctx := harness(t, objs...)
		if play != nil {
			play(kube, ctx)
			c, kube, _, ctx = harness(t, snapshot(t, kube, ctx)...)
		}
		kube.ClearActions()
		if err := c.sync(ctx, testNS+"/claim"); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := writes(kube); !slices.Equal(got, want) {
			t.Errorf("%s: writes %q, want %q", name, got, want)
		}
		objs = snapshot(t, kube, ctx)
	}
	step("start", nil, []string{"create persistentvolumeclaims " + popNS + "/" + prime1,
		"patch persistentvolumeclaims " + testNS + "/claim", "create pods " + popNS + "/" + pod1})
	step("again", nil, nil)
	step("populated", func(kube *kubefake.Clientset, ctx context.Context) {
		must(t, kube.Tracker().Add(pvFor(popNS, prime1, "prime-uid")))
		p := primeOf(corev1.ClaimBound, pvName)
		must(t, kube.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), p, popNS))
		must(t, kube.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), podOf(corev1.PodSucceeded), popNS))
	}, []string{"patch persistentvolumes " + pvName})
	step("again", nil, nil)
	step("rebound", func(kube *kubefake.Clientset, ctx context.Context) {
		pvc, err := kube.CoreV1().PersistentVolumeClaims(testNS).Get(ctx, "claim", metav1.GetOptions{})
		must(t, err)
		bound(pvc)
		must(t, kube.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), pvc, testNS))
		must(t, kube.Tracker().Update(corev1.SchemeGroupVersion.WithResource("persistentvolumeclaims"), primeOf(corev1.ClaimLost, pvName), popNS))
	}, []string{"delete pods " + popNS + "/" + pod1, "delete persistentvolumeclaims " + popNS + "/" + prime1,
		"patch persistentvolumeclaims " + testNS + "/claim"})
	step("again", nil, nil)

	var pvc *corev1.PersistentVolumeClaim
	var pv *corev1.PersistentVolume
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.PersistentVolumeClaim:
			if o.Namespace == popNS {
				t.Errorf("prime claim %s left", o.Name)
			}
			pvc = o
		case *corev1.Pod:
			t.Errorf("pod %s left", o.Name)
		case *corev1.PersistentVolume:
			pv = o
		}
	}
	if pvc == nil || pv == nil || slices.Contains(pvc.Finalizers, pvcFinalizer) || pv.Spec.ClaimRef.UID != uid {
		t.Errorf("end: claim %+v, PV %+v", pvc, pv)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// snapshot is every object in kube (claims, PVs, pods, classes) and the Hello.
func snapshot(t *testing.T, kube *kubefake.Clientset, ctx context.Context) []runtime.Object {
	t.Helper()
	out := []runtime.Object{hello("example-hello")}
	pvcs, err := kube.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	must(t, err)
	for i := range pvcs.Items {
		out = append(out, &pvcs.Items[i])
	}
	pvs, err := kube.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	must(t, err)
	for i := range pvs.Items {
		out = append(out, &pvs.Items[i])
	}
	pods, err := kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	must(t, err)
	for i := range pods.Items {
		out = append(out, &pods.Items[i])
	}
	scs, err := kube.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	must(t, err)
	for i := range scs.Items {
		out = append(out, &scs.Items[i])
	}
	return out
}

// A change to anything the flow waits for queues the original claim; claims
// without a Hello data source are never queued.
func TestEventsQueueTheOriginalClaim(t *testing.T) {
	other := claim(func(p *corev1.PersistentVolumeClaim) {
		p.Name, p.UID, p.Spec.DataSourceRef = "plain", "uid-2", nil
	})
	c, _, _, _ := harness(t, append(classes(), hello("example-hello"), claim(), other)...)
	want := testNS + "/claim"
	for _, tc := range []struct {
		name string
		fire func()
		want string
	}{
		{"the claim", func() { c.onPVC(claim()) }, want},
		{"a claim without a Hello", func() { c.onPVC(other) }, ""},
		{"its prime claim", func() { c.onPVC(primeOf(corev1.ClaimLost, pvName)) }, want},
		{"another claim in the populator's namespace", func() {
			c.onPVC(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: popNS}})
		}, ""},
		{"its pod", func() { c.onPod(podOf(corev1.PodSucceeded)) }, want},
		{"its pod, deleted", func() { c.onPod(cacheTombstone(podOf(corev1.PodSucceeded))) }, want},
		{"the prime claim's PV", func() { c.onPV(pvFor(popNS, prime1, "prime-uid")) }, want},
		{"the PV handed over", func() {
			pv := pvFor(testNS, "claim", uid)
			pv.Annotations[populatedFromAnno] = testNS + "/example-hello"
			c.onPV(pv)
		}, want},
		{"another PV", func() { c.onPV(pvFor("elsewhere", "claim", "uid-3")) }, ""},
		{"its Hello", func() { c.onHello(hello("example-hello")) }, want},
		{"another Hello", func() { c.onHello(hello("other")) }, ""},
		{"its storage class", func() { c.onClass(class("wffc", storagev1.VolumeBindingWaitForFirstConsumer, "loop-block")) }, want},
		{"another storage class", func() { c.onClass(class("immediate", storagev1.VolumeBindingImmediate, "x")) }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.fire()
			var got string
			if c.queue.Len() > 0 {
				got, _ = c.queue.Get()
				c.queue.Done(got)
				c.queue.Forget(got)
			}
			if got != tc.want {
				t.Errorf("queued %q, want %q", got, tc.want)
			}
			if n := c.queue.Len(); n != 0 {
				t.Errorf("%d more queued", n)
			}
		})
	}
}

// cacheTombstone is what an informer hands a delete handler that missed the deletion.
func cacheTombstone(obj runtime.Object) any {
	return cache.DeletedFinalStateUnknown{Key: "x", Obj: obj}
}

// Populate mode writes the contents, ending in one newline.
func TestPopulate(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ contents, want string }{
		{content, content + "\n"},
		{"two\nlines\n", "two\nlines\n"},
	} {
		f := filepath.Join(dir, "f.txt")
		if err := populate(f, tc.contents); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.want {
			t.Errorf("populate(%q) wrote %q, want %q", tc.contents, got, tc.want)
		}
	}
	if err := populate(filepath.Join(dir, "missing", "f"), "x"); err == nil {
		t.Error("populating a file in a missing directory succeeded")
	}
}

// The stand-in accepts the arguments the e2e spec gives it: the deployment's
// (test/e2e/testing-manifests/storage-csi/any-volume-datasource/hello-populator-deploy.yaml
// in k8s.io/kubernetes v1.36.3) with the --namespace the spec appends, and
// those it gives the populator pods.
func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want options
	}{
		{
			args: []string{"--mode=controller", "--image-name=" + image, "--http-endpoint=:8080", "--namespace=provisioning-1234-pop-5678"},
			want: options{mode: "controller", imageName: image, httpEndpoint: ":8080", metricsPath: "/metrics", namespace: "provisioning-1234-pop-5678"},
		},
		{
			args: []string{"--mode=populate", "--file-name=/mnt/example.txt", "--file-contents=" + content},
			want: options{mode: "populate", fileName: "/mnt/example.txt", fileContents: content, metricsPath: "/metrics", namespace: "hello"},
		},
		{
			args: []string{"--mode=controller", "--image-name=" + image, "--v=5", "--kubeconfig=/k", "--master=https://x", "--metrics-path=/m"},
			want: options{mode: "controller", imageName: image, kubeconfig: "/k", master: "https://x", metricsPath: "/m", namespace: "hello"},
		},
	} {
		o, err := parseFlags(tc.args)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if err := o.validate(); err != nil {
			t.Errorf("%q: %v", tc.args, err)
		}
		if *o != tc.want {
			t.Errorf("%q: %+v, want %+v", tc.args, *o, tc.want)
		}
	}
	for _, args := range [][]string{
		{"--mode=controller"},                 // no image
		{"--mode=populate", "--file-name=/x"}, // no contents
		{"--mode=other"},
		{},
	} {
		o, err := parseFlags(args)
		if err == nil {
			err = o.validate()
		}
		if err == nil {
			t.Errorf("%q accepted", args)
		}
	}
	if _, err := parseFlags([]string{"--no-such-flag"}); err == nil {
		t.Error("an unknown flag was accepted")
	}
}
