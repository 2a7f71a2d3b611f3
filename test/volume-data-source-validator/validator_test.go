package main

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

func ptr[T any](v T) *T { return &v }

func populator(name, group, kind string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "populator.storage.k8s.io/v1beta1",
		"kind":       "VolumePopulator",
		"metadata":   map[string]any{"name": name},
		"sourceKind": map[string]any{"group": group, "kind": kind},
	}}
}

func claim(mods ...func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "test", UID: "uid-1"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		},
	}
	for _, m := range mods {
		m(pvc)
	}
	return pvc
}

func ref(group *string, kind string) func(*corev1.PersistentVolumeClaim) {
	return func(p *corev1.PersistentVolumeClaim) {
		p.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: group, Kind: kind, Name: "src"}
	}
}

// harness is a validator on a fake clientset and a fake dynamic client, with
// synced informers (not running: tests call sync, or run).
func harness(t *testing.T, recorder record.EventRecorder, objs ...runtime.Object) (*validator, *kubefake.Clientset, context.Context) {
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
		map[schema.GroupVersionResource]string{populatorGVR: "VolumePopulatorList"}, dynObjs...)
	f := informers.NewSharedInformerFactory(kube, 0)
	dyn := dynamicinformer.NewDynamicSharedInformerFactory(dynClient, 0)
	v, err := newValidator(f, dyn, recorder)
	if err != nil {
		t.Fatal(err)
	}
	f.Start(ctx.Done())
	dyn.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	dyn.WaitForCacheSync(ctx.Done())
	return v, kube, ctx
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

// Which claims get the warning.
func TestSync(t *testing.T) {
	warning := []string{"Warning " + reasonUnrecognized + " " + messageUnrecognized}
	hello := populator("hello-populator", "hello.example.com", "Hello")
	for _, tc := range []struct {
		name       string
		claim      *corev1.PersistentVolumeClaim
		populators []runtime.Object
		want       []string
	}{
		{name: "no data source", claim: claim(), populators: []runtime.Object{hello}},
		{name: "a PVC to clone (core)", claim: claim(ref(nil, "PersistentVolumeClaim"))},
		{name: "a core kind with an empty group", claim: claim(ref(ptr(""), "PersistentVolumeClaim"))},
		{name: "a VolumeSnapshot (special case)", claim: claim(ref(ptr("snapshot.storage.k8s.io"), "VolumeSnapshot"))},
		{name: "a registered kind", claim: claim(ref(ptr("hello.example.com"), "Hello")), populators: []runtime.Object{hello}},
		{name: "a registered kind among others", claim: claim(ref(ptr("hello.example.com"), "Hello")),
			populators: []runtime.Object{populator("a", "a.example.com", "A"), hello}},
		{name: "no VolumePopulator at all", claim: claim(ref(ptr("hello.example.com"), "Hello")), want: warning},
		{name: "same kind, another group", claim: claim(ref(ptr("other.example.com"), "Hello")),
			populators: []runtime.Object{hello}, want: warning},
		{name: "same group, another kind", claim: claim(ref(ptr("hello.example.com"), "Goodbye")),
			populators: []runtime.Object{hello}, want: warning},
		{name: "another kind of snapshot.storage.k8s.io", claim: claim(ref(ptr("snapshot.storage.k8s.io"), "VolumeGroupSnapshot")), want: warning},
		{name: "only spec.dataSource set", claim: claim(func(p *corev1.PersistentVolumeClaim) {
			p.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr("hello.example.com"), Kind: "Hello", Name: "src"}
		}), want: warning},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := record.NewFakeRecorder(10)
			v, _, _ := harness(t, rec, append(tc.populators, tc.claim)...)
			if err := v.sync("test/claim"); err != nil {
				t.Fatal(err)
			}
			if got := events(rec); !slices.Equal(got, tc.want) {
				t.Errorf("events %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("claim gone", func(t *testing.T) {
		rec := record.NewFakeRecorder(10)
		v, _, _ := harness(t, rec)
		if err := v.sync("test/claim"); err != nil {
			t.Fatal(err)
		}
		if got := events(rec); len(got) != 0 {
			t.Errorf("events %q", got)
		}
	})
}

// Running, it records the warning as an Event on the claim through the API.
func TestRunRecordsTheEvent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kube := kubefake.NewClientset()
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "data-source-validator"})

	dynClient := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{populatorGVR: "VolumePopulatorList"}, populator("hello-populator", "hello.example.com", "Hello"))
	f := informers.NewSharedInformerFactory(kube, 0)
	dyn := dynamicinformer.NewDynamicSharedInformerFactory(dynClient, 0)
	v, err := newValidator(f, dyn, recorder)
	if err != nil {
		t.Fatal(err)
	}
	f.Start(ctx.Done())
	dyn.Start(ctx.Done())
	done := make(chan struct{})
	go func() { v.run(ctx, 2); close(done) }()

	for _, c := range []*corev1.PersistentVolumeClaim{
		claim(func(p *corev1.PersistentVolumeClaim) { p.Name = "good"; p.UID = "uid-good" }, ref(ptr("hello.example.com"), "Hello")),
		claim(func(p *corev1.PersistentVolumeClaim) { p.Name = "bad"; p.UID = "uid-bad" }, ref(ptr("unknown.example.com"), "Unknown")),
	} {
		if _, err := kube.CoreV1().PersistentVolumeClaims("test").Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := kube.CoreV1().Events("test").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs.Items) > 0 {
			// Give a wrongly warned "good" claim the time to show too.
			time.Sleep(200 * time.Millisecond)
			evs, _ = kube.CoreV1().Events("test").List(ctx, metav1.ListOptions{})
			for _, e := range evs.Items {
				if e.InvolvedObject.Name != "bad" || e.Type != corev1.EventTypeWarning || e.Reason != reasonUnrecognized ||
					e.Source.Component != "data-source-validator" {
					t.Errorf("event %s on %s %s/%s: %s %s: %s", e.Name, e.InvolvedObject.Kind, e.InvolvedObject.Namespace,
						e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no event recorded")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-done
}

// The stand-in accepts the arguments the e2e spec's StatefulSet gives it
// (test/e2e/testing-manifests/storage-csi/any-volume-datasource/volume-data-source-validator/
// setup-data-source-validator.yaml in k8s.io/kubernetes v1.36.3), and upstream's others.
func TestFlags(t *testing.T) {
	o, err := parseFlags([]string{"--v=5", "--leader-election=false"})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	if o.leaderElect || o.threads != 10 || o.resyncPeriod != time.Minute || o.metricsPath != "/metrics" {
		t.Errorf("defaults: %+v", *o)
	}
	o, err = parseFlags([]string{"--kubeconfig=/k", "--resync-period=30s", "--worker-threads=2", "--leader-election",
		"--leader-election-namespace=ns", "--leader-election-lease-duration=20s", "--leader-election-renew-deadline=15s",
		"--leader-election-retry-period=3s", "--http-endpoint=:8080", "--metrics-path=/m", "--version"})
	if err != nil {
		t.Fatal(err)
	}
	want := options{kubeconfig: "/k", resyncPeriod: 30 * time.Second, showVersion: true, threads: 2, leaderElect: true, leNamespace: "ns",
		leaseDuration: 20 * time.Second, renewDeadline: 15 * time.Second, retryPeriod: 3 * time.Second, httpEndpoint: ":8080", metricsPath: "/m"}
	if *o != want {
		t.Errorf("%+v, want %+v", *o, want)
	}
	if o, err := parseFlags([]string{"--worker-threads=0"}); err != nil || o.validate() == nil {
		t.Error("--worker-threads=0 accepted")
	}
}
