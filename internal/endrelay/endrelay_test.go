package endrelay_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/endrelay"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
	"github.com/pods-as-volumes/pav/internal/report"
	"github.com/pods-as-volumes/pav/podrunner"
)

// pod is a wrapped creation pod of provisioner p, as the driver builds it, on node.
func pod(t *testing.T, key, node string, uid types.UID) *corev1.Pod {
	t.Helper()
	op := podrunner.Operation{Provisioner: "p", Phase: v1alpha1.PhaseCreation, VolumeKey: key, Token: podrunner.NewToken(),
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "main", Image: "busybox", Command: []string{"true"}}}}}}
	p, err := podrunner.BuildPod(op, podrunner.PodConfig{ReportImage: "pav:dev", DefaultNamespace: "pav", Report: podrunner.ReportExec})
	if err != nil {
		t.Fatal(err)
	}
	p.UID, p.Spec.NodeName = uid, node
	return p
}

// end writes what pav-report writes for a success, as it does: a temporary
// file, then a rename.
func end(t *testing.T, kubeletDir string, uid types.UID, msg string, symlink bool) {
	t.Helper()
	dir := endrelay.PodDir(kubeletDir, uid, podrunner.VolumeName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, report.FileEnded)
	if symlink {
		target := filepath.Join(t.TempDir(), "elsewhere")
		if err := os.WriteFile(target, []byte(msg), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := os.WriteFile(path+".tmp", []byte(msg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func TestRelay(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kubeletDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(kubeletDir, "pods"), 0o755); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset()
	create := func(p *corev1.Pod) {
		t.Helper()
		if _, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	annotation := func(p *corev1.Pod) (string, bool) {
		got, err := client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := got.Annotations[podrunner.AnnotationEnded]
		return v, ok
	}

	// Ended before the relay started (a restarted node plugin).
	early := pod(t, "early", "n1", "u-early")
	create(early)
	end(t, kubeletDir, early.UID, `{"handle":"early"}`, false)

	r := endrelay.New(endrelay.Config{Client: kubetest.Wrap(client), Namespace: "pav", Provisioner: "p", Node: "n1", KubeletDir: kubeletDir})
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}

	// Known before the kubelet made any of its directories.
	late := pod(t, "late", "n1", "u-late")
	create(late)
	// Another node's, a failure's (no copy) and one whose copy is a symlink.
	other := pod(t, "other", "n2", "u-other")
	create(other)
	end(t, kubeletDir, other.UID, `{"handle":"other"}`, false)
	failed := pod(t, "failed", "n1", "u-failed")
	create(failed)
	if err := os.MkdirAll(endrelay.PodDir(kubeletDir, failed.UID, podrunner.VolumeName), 0o755); err != nil {
		t.Fatal(err)
	}
	link := pod(t, "link", "n1", "u-link")
	create(link)
	end(t, kubeletDir, link.UID, `{"handle":"link"}`, true)
	// A pod its template put in a tenant's namespace: the driver would not
	// believe its annotation, and the relay does not write one.
	tenant := pod(t, "tenant", "n1", "u-tenant")
	tenant.Namespace = "tenant"
	create(tenant)
	end(t, kubeletDir, tenant.UID, `{"handle":"tenant"}`, false)

	time.Sleep(100 * time.Millisecond) // the informer has them, and watches their way
	end(t, kubeletDir, late.UID, `{"handle":"late"}`, false)

	for p, want := range map[*corev1.Pod]string{early: `{"handle":"early"}`, late: `{"handle":"late"}`} {
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
			_, ok := annotation(p)
			return ok, nil
		}); err != nil {
			t.Fatalf("pod %s: no relayed end", p.Name)
		}
		if got, _ := annotation(p); got != want {
			t.Errorf("pod %s: relayed %q, want %q", p.Name, got, want)
		}
	}
	for _, p := range []*corev1.Pod{other, failed, link, tenant} {
		if got, ok := annotation(p); ok {
			t.Errorf("pod %s: relayed %q", p.Name, got)
		}
	}
}
