package controllerserver

// Deleting a volume that a node still stages.
//
// Kubernetes calls DeleteVolume once the claim is deleted and no pod that uses
// it is left in the API (PVC protection). Nothing makes that call wait for
// the kubelet's NodeUnstageVolume when the CSIDriver needs no attachment, as
// pav's does: the kubelet tears a pod's volumes down after the pod is gone
// from the API, seconds later (measured on the local cluster: DeleteVolume
// 2 s before the NodeUnstageVolume of the same volume). A deletion pod run
// then destroys the volume's backend under a staging pod that still runs (a
// FUSE daemon, a cache that writes back when it is unmounted) and under the
// unstaging pod that comes after it, which may write to it once more: data
// in a backend its volume no longer owns.
//
// So DeleteVolume first waits for the volume's node pods to go: its staging,
// unstaging and node expansion pods on every node (the controller plugin's
// pod informer sees them all), ended or not, until they are gone; and after a
// staging pod, for the unstaging pod its node creates next. A staging whose
// pod completed and went (a plain directory, a loop device) leaves no pod to
// see until the kubelet's NodeUnstageVolume starts its unstaging pod: a
// deletion that comes before that does not wait.
//
// Only pods a tenant cannot forge count: those in pav's own namespace, and
// those in the namespace of the volume's own claim (a template may put its
// pods there; a tenant who writes there can only delay the deletion of its
// own volume, as a pod that uses the claim would). A node that is down keeps
// its pods in the API: the deletion waits until the node is back, or until
// it is declared gone (the Node deleted, or the out-of-service taint of a
// non-graceful node shutdown), when pod GC removes its pods.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/grpcerr"
	"github.com/pods-as-volumes/pav/podrunner"
)

// NodePods is the controller plugin's view of the pods nodes run for its
// provisioner's volumes (podrunner.Runner, in controller mode: every node's
// pods of the provisioner).
type NodePods interface {
	CachedList(sel labels.Selector) ([]*corev1.Pod, error)
	WaitGone(ctx context.Context, pod *corev1.Pod) error
	WaitCreated(ctx context.Context, name string, namespaces ...string) (*corev1.Pod, error)
	OnPodEvent(h podrunner.PodEventHandler)
}

// SetNodePods makes DeleteVolume wait for the pods nodes run for a volume
// (see the file comment): np is the controller plugin's pod runner.
func (s *Server) SetNodePods(np NodePods) {
	s.nodePods = np
	np.OnPodEvent(s.gone.podEvent)
}

// DefaultUnstagedWait bounds how long one DeleteVolume waits for a volume's
// node pods to go before it answers FAILED_PRECONDITION (external-provisioner
// then calls again, after its backoff). The kubelet's unstaging usually comes
// within seconds of the pod's deletion.
const DefaultUnstagedWait = time.Minute

// unstagingFollows bounds the wait, after a volume's staging pod went, for
// the unstaging pod its node creates next: the node plugin removes the
// staging pod first, then creates the unstaging pod, and in between no pod
// of the volume is left to see. It is the node plugin's own delay (its
// informer's event, a template's evaluation, one API request); an unstaging
// template that makes no pod for the volume costs its deletion this much.
const unstagingFollows = 5 * time.Second

// nodePodSelector selects the pods of the phases nodes run for a volume (the
// pod runner holds only its provisioner's pods).
var nodePodSelector = func() labels.Selector {
	phases := []string{string(v1alpha1.PhaseStaging), string(v1alpha1.PhaseUnstaging), string(v1alpha1.PhaseNodeExpansion)}
	r, err := labels.NewRequirement(podrunner.LabelPhase, selection.In, phases)
	if err != nil {
		panic(err) // constants
	}
	return labels.NewSelector().Add(*r)
}()

// awaitUnstaged waits until no node runs a pod for v (see the file comment),
// for s.unstagedWait (DefaultUnstagedWait if 0) at most; then it fails with
// FAILED_PRECONDITION naming the node and the pod.
func (s *Server) awaitUnstaged(ctx context.Context, p *v1alpha1.PavProvisioner, v *v1alpha1.PavVolume) error {
	if s.nodePods == nil {
		return nil
	}
	wait := s.unstagedWait
	if wait <= 0 {
		wait = DefaultUnstagedWait
	}
	waitCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	waited := false
	for {
		pod, err := s.nodePodOf(v)
		if err != nil {
			return err
		}
		if pod == nil {
			// A staging pod that went a moment ago (seen here or by the
			// informer's handler), its unstaging pod not created yet.
			node, at, ok := s.gone.latest(v.Status.Handle, s.trustedNamespaces(v))
			if !ok || p.Spec.VolumeUnstaging == nil {
				return nil
			}
			if !s.awaitUnstagingPod(waitCtx, p.Name, v, node, unstagingFollows-time.Since(at)) {
				return ctx.Err()
			}
			continue
		}
		if !waited {
			waited = true
			klog.FromContext(ctx).Info("The deletion waits for the volume's pod on a node to go (the kubelet's unstaging)",
				"handle", v.Status.Handle, "node", pod.Spec.NodeName, "pod", klog.KObj(pod), "phase", pod.Labels[podrunner.LabelPhase])
		}
		if err := s.nodePods.WaitGone(waitCtx, pod); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				return grpcerr.Errorf(codes.FailedPrecondition,
					"volume %s (handle %q) is still in use on node %s: its %s pod %s/%s is still there after %v; the deletion goes on once the kubelet unstaged the volume "+
						"(if the node is down for good, delete the Node or give it the taint node.kubernetes.io/out-of-service, and pod GC removes its pods)",
					v.Spec.VolumeName, v.Status.Handle, pod.Spec.NodeName, pod.Labels[podrunner.LabelPhase], pod.Namespace, pod.Name, wait)
			}
			return err
		}
		// The informer tells its waiters before its handlers: s.gone may
		// not know yet.
		s.gone.podEvent(pod, true)
	}
}

// awaitUnstagingPod waits, within at most, for the unstaging pod of v on
// node that follows a staging pod gone (see unstagingFollows), and says
// whether it came; the loop of awaitUnstaged then waits for it to go.
func (s *Server) awaitUnstagingPod(ctx context.Context, provisioner string, v *v1alpha1.PavVolume, node string, within time.Duration) bool {
	if within <= 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	name := podrunner.PodName(provisioner, v1alpha1.PhaseUnstaging, podrunner.NodeVolumeKey(v.Status.Handle, node))
	_, err := s.nodePods.WaitCreated(ctx, name, s.trustedNamespaces(v)...)
	return err == nil
}

// goneStagings remembers, for unstagingFollows, the staging pods that went
// and whose unstaging pod has not been seen since: the informer tells their
// deletion before their unstaging pod's creation.
type goneStagings struct {
	mu sync.Mutex
	at map[goneStaging]time.Time
}

// goneStaging is a staging pod's volume and place.
type goneStaging struct {
	handle, node, namespace string
}

// podEvent is the pod runner's event handler.
func (g *goneStagings) podEvent(pod *corev1.Pod, deleted bool) {
	ph := pod.Labels[podrunner.LabelPhase]
	handle, node, ok := podrunner.SplitNodeVolumeKey(pod.Annotations[podrunner.AnnotationVolumeKey])
	if !ok || (ph != string(v1alpha1.PhaseStaging) || !deleted) && ph != string(v1alpha1.PhaseUnstaging) {
		return
	}
	key := goneStaging{handle: handle, node: node, namespace: pod.Namespace}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	for k, at := range g.at {
		if now.Sub(at) > unstagingFollows {
			delete(g.at, k)
		}
	}
	if ph == string(v1alpha1.PhaseUnstaging) {
		delete(g.at, key)
		return
	}
	if g.at == nil {
		g.at = map[goneStaging]time.Time{}
	}
	g.at[key] = now
}

// latest is the staging of handle that went last, within unstagingFollows,
// in one of namespaces, and when it went.
func (g *goneStagings) latest(handle string, namespaces []string) (node string, at time.Time, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, t := range g.at {
		if k.handle == handle && slices.Contains(namespaces, k.namespace) && time.Since(t) <= unstagingFollows && t.After(at) {
			node, at, ok = k.node, t, true
		}
	}
	return node, at, ok
}

// nodePodOf is a pod that a node runs for v, or nil. One that has ended
// counts as long as it is there: its node has not finished with it (a
// staging pod stopped for the unstaging ends before it goes).
func (s *Server) nodePodOf(v *v1alpha1.PavVolume) (*corev1.Pod, error) {
	pods, err := s.nodePods.CachedList(nodePodSelector)
	if err != nil {
		return nil, fmt.Errorf("listing the volume's node pods: %w", err)
	}
	trusted := s.trustedNamespaces(v)
	for _, pod := range pods {
		handle, _, ok := podrunner.SplitNodeVolumeKey(pod.Annotations[podrunner.AnnotationVolumeKey])
		if ok && handle == v.Status.Handle && slices.Contains(trusted, pod.Namespace) {
			return pod, nil
		}
	}
	return nil, nil
}

// trustedNamespaces are the namespaces whose pods are the word of v's nodes:
// pav's own and v's claim's (see the file comment).
func (s *Server) trustedNamespaces(v *v1alpha1.PavVolume) []string {
	ns := []string{s.Pods.Namespace(podrunner.Operation{})}
	if v.Spec.PVC != nil && v.Spec.PVC.Namespace != "" && v.Spec.PVC.Namespace != ns[0] {
		ns = append(ns, v.Spec.PVC.Namespace)
	}
	return ns
}
