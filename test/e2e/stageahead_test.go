//go:build e2e

package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/nodeserver"
)

// TestStagingAhead: the node plugin starts a volume's staging when the pod that uses it is bound
// to the node, before the kubelet's NodeStageVolume, which adopts it (nodeserver/ahead.go): the
// staging pod runs once, the unstaging pod once when the pod goes. A staging made ahead for a pod
// deleted before the kubelet started it is undone at once, well within the forgotten-staging
// grace, and the claim's deletion then finds nothing of it on the node.
func TestStagingAhead(t *testing.T) {
	e := newEnv(t)
	sc := e.wffcClass(map[string]string{"stageSleep": "2"})

	t.Run("adopted by the kubelet", func(t *testing.T) {
		e := e.in(t)
		e.claim("kept", sc, claimOpts{})
		if out := e.runClient("reader", "ls /data/kept >/dev/null && echo ok", "kept"); out != "ok\n" {
			t.Fatalf("client read %q", out)
		}
		pv := e.waitBound("kept")
		handle := pv.Spec.CSI.VolumeHandle
		// The pav container of the node plugin on the test's node.
		if log := podLog(e.ctx, "pav", e.nodePlugin().Name, "pav"); !strings.Contains(log, `"Volume staged ahead of the kubelet" claim="`+e.ns+`/kept"`) {
			t.Errorf("the node plugin did not stage %s ahead of the kubelet; the end of its log:\n%s", handle, lastLines(log, 20))
		}
		e.deletePod("reader")
		e.waitUnstaged(driver, handle)
		e.wantRuns("staging", handle, 1)
		e.wantRuns("unstaging", handle, 1)
		e.deleteClaim("kept")
		e.waitPVGone(pv.Name)
		e.wantRuns("deletion", handle, 1)
		e.assertClean(pv.Name, handle)
	})

	t.Run("pod gone before the kubelet staged", func(t *testing.T) {
		e := e.in(t)
		e.claim("dropped", sc, claimOpts{})
		// Force-deleted the moment it is bound (seen through a watch): before the kubelet's
		// NodeStageVolume, some 0.3 s later.
		w, err := client.CoreV1().Pods(e.ns).Watch(e.ctx, metav1.ListOptions{FieldSelector: "metadata.name=doomed"})
		if err != nil {
			t.Fatal(err)
		}
		e.clientPod("doomed", "true", "dropped")
		bound := time.After(time.Minute)
		for p := (*corev1.Pod)(nil); p == nil || p.Spec.NodeName == ""; {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					t.Fatal("the watch of pod doomed ended")
				}
				p, _ = ev.Object.(*corev1.Pod)
			case <-bound:
				t.Fatal("pod doomed not bound to a node within a minute")
			}
		}
		w.Stop()
		if err := client.CoreV1().Pods(e.ns).Delete(e.ctx, "doomed", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
			t.Fatal(err)
		}
		pv := e.waitBound("dropped")
		handle := pv.Spec.CSI.VolumeHandle
		// Undone by the node plugin when the pod went (or by the kubelet, had its call come
		// first): within seconds of the staging's end, not after the forgotten grace.
		start := time.Now()
		e.pollFor("the staging made ahead undone", 30*time.Second, func() (bool, error) {
			dir := nodeserver.VolumeDir(volumesDir, handle)
			_, err := os.Stat(dir)
			return runs("unstaging", handle) == 1 && len(hostMounts(dir)) == 0 && os.IsNotExist(err), nil
		})
		t.Logf("undone %v after the pod's deletion", time.Since(start).Round(100*time.Millisecond))
		e.waitUnstaged(driver, handle)
		e.wantRuns("staging", handle, 1)
		e.noEvent("PersistentVolumeClaim", "dropped", nodeserver.ReasonForgottenUnstaged)
		e.deleteClaim("dropped")
		e.waitPVGone(pv.Name)
		e.wantRuns("deletion", handle, 1)
		e.assertClean(pv.Name, handle)
	})
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
