//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDeletionWaitsForUnstaging: a claim deleted together with its pod, as users do, is
// deleted by Kubernetes once the pod is gone from the API, which is before the kubelet
// unstages the volume (it tears a pod's volumes down afterwards). The deletion pod must
// not destroy the backend under the staging pod that still serves it, nor under the
// unstaging pod after it (controllerserver/unstaged.go): the deletion pod starts only
// once the unstaging pod has finished.
func TestDeletionWaitsForUnstaging(t *testing.T) {
	inLane(t, laneSelf)
	e := newEnv(t)
	// backend: the staging pod bind-mounts the volume's backend directory and keeps
	// running; the unstaging pod takes 5 s before it unmounts it.
	sc := e.storageClass(map[string]string{"scenario": "backend", "unstageSleep": "5"}, corev1.PersistentVolumeReclaimDelete)
	e.claim("data", sc, claimOpts{})
	e.clientPod("client", "echo kept > /data/data/f && trap 'exit 0' TERM; sleep 3600 & wait", "data")
	e.waitPodRunning("client")
	pv := e.waitBound("data")
	handle := pv.Spec.CSI.VolumeHandle

	if err := client.CoreV1().Pods(e.ns).Delete(e.ctx, "client", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.deleteClaim("data")
	e.waitPVGone(pv.Name)

	// The unstaging pod writes its marker last; the deletion pod counts its run first.
	unstaged, err := os.Stat(filepath.Join(markers, "unstaged", handle))
	if err != nil {
		t.Fatalf("the unstaging pod did not finish before the PV went: %v", err)
	}
	deletion, err := os.Stat(filepath.Join(markers, "runs", "deletion", handle))
	if err != nil {
		t.Fatal(err)
	}
	if !deletion.ModTime().After(unstaged.ModTime()) {
		t.Errorf("the deletion pod started at %v, before the unstaging pod finished at %v",
			deletion.ModTime().Format("15:04:05.000"), unstaged.ModTime().Format("15:04:05.000"))
	}
	if log := podLog(e.ctx, "pav", "pav-"+driver+"-controller-0", "pav"); !strings.Contains(log, `"The deletion waits for the volume's pod on a node to go (the kubelet's unstaging)" method="DeleteVolume" handle="`+handle+`"`) {
		t.Errorf("the controller plugin's log does not say that the deletion of %s waited", handle)
	}
	e.wantRuns("staging", handle, 1)
	e.wantRuns("unstaging", handle, 1)
	e.wantRuns("deletion", handle, 1)
	e.assertClean(pv.Name, handle)
}
