//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/pods-as-volumes/pav/internal/report"
	"github.com/pods-as-volumes/pav/podrunner"
)

// The node plugin of the node a creation pod runs on relays the pod's end
// (pav-report's /pav/.pav-ended, put on the pod as podrunner.AnnotationEnded,
// internal/endrelay) and the volume is made from it: on the real cluster,
// through the ServiceAccount token's node and the admission policy of
// deploy/base/pods-policy.yaml. The kubelet may publish a pod's end in the
// milliseconds before the relay does, so of three claims at least one must
// be relayed.
func TestCreationPodEndRelayed(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	sc := e.storageClass(nil, corev1.PersistentVolumeReclaimDelete)
	w, err := client.CoreV1().Pods("pav").Watch(e.ctx, metav1.ListOptions{
		LabelSelector: podrunner.LabelProvisioner + "=" + driver + "," + podrunner.LabelPhase + "=creation"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	claims := []string{"a", "b", "c"}
	handles := map[string]string{} // handle → claim
	for _, c := range claims {
		e.claim(c, sc, claimOpts{})
		handles[fmt.Sprintf("e2e-%s-%s", e.ns, c)] = c
	}
	for _, c := range claims {
		e.waitBound(c)
	}
	// A relayed end came before its claim was Bound; the watch may lag a
	// little behind.
	relayed := map[string]bool{}
	settle := time.After(10 * time.Second)
collect:
	for len(relayed) < len(claims) {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch of pav's creation pods ended")
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Error {
				continue
			}
			msg, has := p.Annotations[podrunner.AnnotationEnded]
			if !has {
				continue
			}
			files, err := report.Parse(msg)
			if err != nil {
				t.Errorf("pod %s: relayed %q: %v", p.Name, msg, err)
			}
			if c, ours := handles[strings.TrimSpace(files[report.FileHandle])]; ours {
				relayed[c] = true
			}
		case <-settle:
			break collect
		}
	}
	if len(relayed) == 0 {
		t.Fatalf("no creation pod's end was relayed by its node plugin (annotation %s) for claims %v", podrunner.AnnotationEnded, claims)
	}
	t.Logf("relayed the ends of the creation pods of %d of %d claims", len(relayed), len(claims))
}
