package fakekubelet_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/fakekubelet"
	"github.com/pods-as-volumes/pav/internal/report"
	"github.com/pods-as-volumes/pav/podrunner"
)

func start(t *testing.T, o fakekubelet.Outcome, opts fakekubelet.Options) (context.Context, *fake.Clientset) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	client := fake.NewClientset()
	opts.Dir = t.TempDir()
	k := fakekubelet.New(client, func(*corev1.Pod) fakekubelet.Outcome { return o }, opts)
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); k.Wait() })
	return ctx, client
}

func createPod(t *testing.T, ctx context.Context, client *fake.Clientset) (*corev1.Pod, watch.Interface) {
	t.Helper()
	pod, err := podrunner.BuildPod(podrunner.Operation{
		Provisioner: "p", Phase: v1alpha1.PhaseCreation, VolumeKey: "k",
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "x"}}}},
	}, podrunner.PodConfig{ReportImage: "img", DefaultNamespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	created, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.UID == "" || created.CreationTimestamp.IsZero() {
		t.Errorf("create did not fill uid/creationTimestamp: %q %v", created.UID, created.CreationTimestamp)
	}
	return created, w
}

// step is one observed state: phase, main container state, report state.
type step struct{ phase, main, report string }

func state(s *corev1.ContainerStatus) string {
	switch {
	case s == nil:
		return "-"
	case s.State.Waiting != nil:
		return "waiting"
	case s.State.Running != nil:
		return "running"
	case s.State.Terminated != nil:
		return "terminated"
	}
	return "?"
}

func find(list []corev1.ContainerStatus, name string) *corev1.ContainerStatus {
	for i := range list {
		if list[i].Name == name {
			return &list[i]
		}
	}
	return nil
}

func collect(t *testing.T, w watch.Interface, until func(ev watch.Event) bool) []step {
	t.Helper()
	var steps []step
	timeout := time.After(10 * time.Second)
	for {
		select {
		case <-timeout:
			t.Fatalf("timed out; saw %v", steps)
		case ev := <-w.ResultChan():
			p := ev.Object.(*corev1.Pod)
			s := step{string(p.Status.Phase), state(find(p.Status.ContainerStatuses, "main")),
				state(find(p.Status.InitContainerStatuses, podrunner.ReportContainer))}
			if ev.Type == watch.Deleted {
				s = step{"deleted", "", ""}
			}
			if len(steps) == 0 || steps[len(steps)-1] != s {
				steps = append(steps, s)
			}
			if until(ev) {
				return steps
			}
		}
	}
}

func TestLifecycle(t *testing.T) {
	ctx, client := start(t, fakekubelet.Outcome{Kind: fakekubelet.Succeed, Files: map[string]string{"handle": "h"}}, fakekubelet.Options{})
	_, w := createPod(t, ctx, client)
	steps := collect(t, w, func(ev watch.Event) bool {
		p := ev.Object.(*corev1.Pod)
		return p.Status.Phase == corev1.PodSucceeded
	})
	want := []step{
		{"", "-", "-"},                            // created
		{"Pending", "waiting", "waiting"},         // scheduled
		{"Running", "running", "running"},         // started
		{"Running", "terminated", "running"},      // main exited, sidecar still up
		{"Succeeded", "terminated", "terminated"}, // sidecar stopped: phase final
	}
	if len(steps) != len(want) {
		t.Fatalf("steps %v, want %v", steps, want)
	}
	for i := range want {
		if steps[i] != want[i] {
			t.Errorf("step %d: %v, want %v", i, steps[i], want[i])
		}
	}
	p, _ := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	r := find(p.Items[0].Status.InitContainerStatuses, podrunner.ReportContainer)
	if files, err := report.Parse(r.State.Terminated.Message); err != nil || files["handle"] != "h" {
		t.Errorf("report %q: %v", r.State.Terminated.Message, err)
	}
}

func TestGracefulDeletion(t *testing.T) {
	ctx, client := start(t, fakekubelet.Outcome{Kind: fakekubelet.Run}, fakekubelet.Options{DeletionDelay: 50 * time.Millisecond})
	pod, w := createPod(t, ctx, client)
	collect(t, w, func(ev watch.Event) bool { return ev.Object.(*corev1.Pod).Status.Phase == corev1.PodRunning })

	wrong := metav1.NewUIDPreconditions("not-the-uid")
	if err := client.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: wrong}); !apierrors.IsConflict(err) {
		t.Fatalf("UID precondition not enforced: %v", err)
	}
	if err := client.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sawTerminating := false
	steps := collect(t, w, func(ev watch.Event) bool {
		if p := ev.Object.(*corev1.Pod); p.DeletionTimestamp != nil && ev.Type != watch.Deleted {
			sawTerminating = true
		}
		return ev.Type == watch.Deleted
	})
	if !sawTerminating {
		t.Error("pod removed without a deletionTimestamp first")
	}
	if last := steps[len(steps)-2]; last.phase != "Failed" || last.main != "terminated" || last.report != "terminated" {
		t.Errorf("before removal: %v", last)
	}
}

// TestWatchAfterListSeesRemovals: a watch from the resourceVersion of a list
// (an informer's, after its first list) is told of the pods removed between the
// list and the watch, as a real API server's watch would be. The fake
// clientset's tracker only replays the pods added or changed since: an
// informer would keep a pod removed in between in its cache for ever.
func TestWatchAfterListSeesRemovals(t *testing.T) {
	ctx, client := start(t, fakekubelet.Outcome{Kind: fakekubelet.Run}, fakekubelet.Options{})
	pods := client.CoreV1().Pods("default")
	for _, name := range []string{"before", "between", "after"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "x"}}}}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(name string, done func(*corev1.Pod, error) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if done(p, err) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s: timed out (%v)", name, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	remove := func(name string) {
		t.Helper()
		if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(name, func(_ *corev1.Pod, err error) bool { return apierrors.IsNotFound(err) })
	}
	for _, name := range []string{"before", "between", "after"} {
		waitFor(name, func(p *corev1.Pod, err error) bool { return err == nil && p.Status.Phase == corev1.PodRunning })
	}

	remove("before")
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	remove("between")
	w, err := pods.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	remove("after")

	var deleted []string
	timeout := time.After(10 * time.Second)
	for len(deleted) == 0 || deleted[len(deleted)-1] != "after" {
		select {
		case <-timeout:
			t.Fatalf("timed out; deletions seen: %v", deleted)
		case ev := <-w.ResultChan():
			if ev.Type == watch.Deleted {
				deleted = append(deleted, ev.Object.(*corev1.Pod).Name)
			}
		}
	}
	if want := []string{"between", "after"}; !slices.Equal(deleted, want) {
		t.Errorf("deletions seen: %v, want %v", deleted, want)
	}
}
