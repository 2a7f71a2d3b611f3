//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Uninstall as docs/install.md says: `kubectl delete pav --all` (waits until no
// volume needs a provisioner), then `kubectl delete -k` of what was installed.
// Nothing of pav may be left. The file name makes it run last (afterLanes: after every
// lane too); it reinstalls what the suite's setup installed, so that the cluster is as it
// found it. In between, on a cluster without pav, the Helm chart is installed, upgraded
// and uninstalled (helm_test.go).
func TestUninstall(t *testing.T) {
	afterLanes(t)
	ctx := context.Background()
	// make demo's claim and pod, if the demo ran on this cluster.
	kubectl(t, "delete", "-f", repo+"/examples/hello-world/usage.yaml", "--ignore-not-found", "--timeout=120s")
	// `kubectl delete pav --all` rightly waits for every volume of every
	// provisioner: on a cluster shared with other work, a volume this suite did
	// not make (and cannot delete) would hold it.
	if pv := volumeHoldingUninstall(t, ctx); pv != "" {
		t.Skipf("%s, which this suite did not make, exists: uninstalling would (rightly) wait for it; run on a cluster of its own", pv)
	}
	t.Cleanup(func() {
		start := time.Now()
		// As make deploy-e2e installs it.
		examples, err := filepath.Glob(repo + "/examples/*/provisioner.yaml")
		if err != nil {
			t.Fatal(err)
		}
		run(t, repo+"/hack/install-local.sh", append([]string{repo + "/test/e2e/pav-e2e/provisioner.yaml"}, examples...)...)
		t.Logf("reinstalled in %v", time.Since(start).Round(time.Second))
	})
	start := time.Now()
	kubectl(t, "delete", "pav", "--all", "--timeout=120s")
	t.Logf("kubectl delete pav --all took %v", time.Since(start).Round(100*time.Millisecond))
	start = time.Now()
	kubectl(t, "delete", "-k", repo+"/test/e2e/install", "--timeout=120s")
	t.Logf("kubectl delete -k took %v", time.Since(start).Round(100*time.Millisecond))

	// Nothing of what was installed (every object of the install's kustomization),
	// nor anything the manager made.
	rendered := filepath.Join(t.TempDir(), "install.yaml")
	if err := os.WriteFile(rendered, []byte(kubectl(t, "kustomize", repo+"/test/e2e/install")), 0o644); err != nil {
		t.Fatal(err)
	}
	if left := leftAfterUninstall(t, ctx, rendered); len(left) > 0 {
		t.Fatalf("uninstalled, but left: %v", left)
	}
	// The Helm chart, on this cluster without pav (before the reinstall above).
	t.Run("HelmChart", testHelmChart)
}

// volumeHoldingUninstall names a provisioned PV of a PavProvisioner that exists ("PV x
// of provisioner y"), which `kubectl delete pav --all` would rightly wait for, or "".
func volumeHoldingUninstall(t *testing.T, ctx context.Context) string {
	t.Helper()
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		if d := pv.Annotations["pv.kubernetes.io/provisioned-by"]; pv.Spec.CSI != nil && d == pv.Spec.CSI.Driver {
			if _, err := getProvisioner(ctx, d); err == nil {
				return fmt.Sprintf("PV %s of provisioner %s", pv.Name, d)
			}
		}
	}
	return ""
}

// leftAfterUninstall lists what remains of an install: the objects of its
// manifest (a file), and anything the manager made.
func leftAfterUninstall(t *testing.T, ctx context.Context, manifest string) []string {
	t.Helper()
	var left []string
	for _, l := range strings.Split(strings.TrimSpace(kubectl(t, "get", "-f", manifest, "--ignore-not-found", "-o", "name")), "\n") {
		if l != "" {
			left = append(left, l)
		}
	}
	drivers, _ := client.StorageV1().CSIDrivers().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=pav"})
	for _, d := range drivers.Items {
		left = append(left, "CSIDriver "+d.Name)
	}
	pods, _ := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=pav"})
	for _, p := range pods.Items {
		left = append(left, "pod "+p.Namespace+"/"+p.Name)
	}
	return left
}
