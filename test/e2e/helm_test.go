//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// The Helm chart (charts/pav) on the local cluster, as a user runs it: helm
// install serves a PavProvisioner, helm upgrade applies new settings, and
// helm uninstall (after kubectl delete pav --all) leaves nothing. pav is
// installed once per cluster (its CRDs, ClusterRoles and policy are
// cluster-wide, and two managers would both act on every PavProvisioner), so
// this runs inside TestUninstall, between the uninstall of the suite's install
// and its reinstall, never beside it.

const (
	// helmRelease is kept in namespace default, not in the chart's namespace,
	// which the chart then makes (and helm uninstall removes) itself.
	helmRelease   = "pav"
	helmReleaseNS = "default"
	// helmNamespace is not pav: the chart's value namespace is exercised on
	// the cluster, not only by helm template.
	helmNamespace = "pav-chart"
)

// helmCmd runs the helm that hack/build-tools.sh builds, on the suite's
// cluster, with no user's repositories, plugins or cache.
func helmCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(repo, "_output", "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: hack/build-tools.sh helm builds it (make e2e-setup does)", err)
	}
	home := filepath.Join(os.TempDir(), "pav-e2e-helm")
	var out bytes.Buffer
	cmd := exec.Command(bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func helm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := helmCmd(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// testHelmChart runs on a cluster without pav (TestUninstall has just removed
// it) and leaves it so.
func testHelmChart(t *testing.T) {
	ctx := context.Background()
	usage := filepath.Join(repo, "examples", "hello-world", "usage.yaml")
	// The local cluster's settings (its images, pull policy Never) are chart
	// values as they are: the file test/e2e/install gives kustomize.
	install := []string{filepath.Join(repo, "charts", "pav"), "--namespace", helmReleaseNS,
		"--values", filepath.Join(repo, "test", "e2e", "install", "config.yaml"),
		"--set", "namespace=" + helmNamespace, "--wait", "--timeout", "3m"}
	t.Cleanup(func() {
		// Whatever failed: nothing of the chart may stay for the reinstall
		// (a second manager would act on the suite's provisioners).
		_, _ = kubectlErr("delete", "-f", usage, "--ignore-not-found", "--timeout=120s")
		_, _ = kubectlErr("delete", "pav", "--all", "--timeout=120s")
		if out, err := helmCmd(t, "uninstall", helmRelease, "--namespace", helmReleaseNS, "--ignore-not-found", "--wait", "--timeout", "3m"); err != nil {
			t.Errorf("cleanup: helm uninstall: %v\n%s", err, out)
		}
	})

	start := time.Now()
	helm(t, append([]string{"install", helmRelease}, install...)...)
	t.Logf("helm install took %v", time.Since(start).Round(100*time.Millisecond))

	// A PavProvisioner applied alone gets its drivers in the chart's namespace
	// and serves a volume.
	start = time.Now()
	kubectl(t, "apply", "-f", filepath.Join(repo, "examples", "hello-world", "provisioner.yaml"))
	if err := waitProvisionerReadyIn(ctx, helmNamespace, "hello-world", 3*time.Minute); err != nil {
		c, _ := provisionerCondition(ctx, "hello-world", v1alpha1.ConditionReady)
		t.Fatalf("hello-world not Ready under the chart's manager: %v (Ready: %s %s)", err, c.Reason, c.Message)
	}
	t.Logf("hello-world Ready in %v", time.Since(start).Round(100*time.Millisecond))
	kubectl(t, "apply", "-f", usage)
	kubectl(t, "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/hello-reader", "--timeout=180s")
	if out := kubectl(t, "logs", "hello-reader"); !strings.Contains(out, "Hello, world!") {
		t.Fatalf("hello-reader read %q from its volume", out)
	}

	// helm upgrade with a new setting: the settings' checksum rolls the
	// manager, which re-applies the drivers with it.
	old := managerPods(t, ctx)
	start = time.Now()
	helm(t, append([]string{"upgrade", helmRelease}, append(install, "--set", "logLevel=5")...)...)
	t.Logf("helm upgrade took %v", time.Since(start).Round(100*time.Millisecond))
	if now := managerPods(t, ctx); slices.Equal(now, old) {
		t.Errorf("helm upgrade with new settings left the manager pod %v as it was", old)
	}
	var args []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := client.AppsV1().StatefulSets(helmNamespace).Get(ctx, "pav-hello-world-controller", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		args = driverArgs(s)
		return slices.Contains(args, "--v=5"), nil
	})
	if err != nil {
		t.Fatalf("after helm upgrade --set logLevel=5, hello-world's controller plugin runs pav with %v", args)
	}
	if err := waitProvisionerReadyIn(ctx, helmNamespace, "hello-world", 3*time.Minute); err != nil {
		t.Fatalf("hello-world not Ready after helm upgrade: %v", err)
	}

	// Uninstall as docs/install.md says: kubectl delete pav --all, then helm
	// uninstall. Nothing of the release is left, nor anything the manager made.
	kubectl(t, "delete", "-f", usage, "--timeout=120s")
	kubectl(t, "delete", "pav", "--all", "--timeout=120s")
	manifest := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(manifest, []byte(helm(t, "get", "manifest", helmRelease, "--namespace", helmReleaseNS)), 0o644); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	helm(t, "uninstall", helmRelease, "--namespace", helmReleaseNS, "--wait", "--timeout", "3m")
	t.Logf("helm uninstall took %v", time.Since(start).Round(100*time.Millisecond))
	// The manifest holds the chart's namespace: it is gone too.
	left := leftAfterUninstall(t, ctx, manifest)
	// Nor the release's records: Helm keeps each revision in a Secret.
	records, err := client.CoreV1().Secrets(helmReleaseNS).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=" + helmRelease})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range records.Items {
		left = append(left, "release record "+r.Name)
	}
	if len(left) > 0 {
		t.Fatalf("helm uninstall left: %v", left)
	}
}

// managerPods names the manager's pods in the chart's namespace.
func managerPods(t *testing.T, ctx context.Context) []string {
	t.Helper()
	pods, err := client.CoreV1().Pods(helmNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=manager"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	slices.Sort(names)
	return names
}

// driverArgs are the pav container's arguments in a controller StatefulSet.
func driverArgs(s *appsv1.StatefulSet) []string {
	for _, c := range s.Spec.Template.Spec.Containers {
		if c.Name == "pav" {
			return c.Args
		}
	}
	return nil
}
