// Package endrelay is the node plugin's relay of controller-side pods' ends.
//
// A controller-side pod (validation, creation, deletion…) runs on whatever
// node the scheduler picks, and its /pav is an emptyDir there; its one
// container is usually wrapped by pav-report, which writes the report as the
// container's termination message. The driver learns of the pod's end from
// the pod's status, which the kubelet publishes only at its next relist of the
// node's containers (every second): on the path of every new volume, that
// wait is as long as the pod's whole run.
//
// So pav-report also copies a successful report to /pav/.pav-ended
// (report.ExecEnded), and the node plugin of each node watches, with inotify,
// the emptyDirs of its provisioner's controller-side pods on that node
// (kubelet-dir/pods/UID/volumes/kubernetes.io~empty-dir/pav). When the copy
// appears it puts it on the pod as the annotation
// podrunner.AnnotationEnded, which the driver's pod informer brings to the
// waiting operation at once (podrunner's evaluate).
//
// What a pod writes is input: the copy is read without following symlinks,
// only if it is a regular file of at most report.MaxMessage bytes and a
// well-formed report (report.ReadEnded). The annotation is written with the
// pod's UID as precondition, never over an existing one, and the driver
// believes it only on pods in its own namespace, which tenants cannot write;
// a ValidatingAdmissionPolicy (deploy/base/pods-policy.yaml) lets the node
// plugins' ServiceAccount set only this annotation, only on a pod of its own
// node. Nothing is lost when the relay is not there (a node plugin down, a
// node without one, the inotify limit reached): the pod's status still
// brings the same report, a relist later.
package endrelay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fsnotify/fsnotify"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/pods-as-volumes/pav/internal/kube"
	"github.com/pods-as-volumes/pav/internal/report"
	"github.com/pods-as-volumes/pav/podrunner"
)

// DefaultKubeletDir is the kubelet's root directory (--root-dir), as the node
// plugin mounts it.
const DefaultKubeletDir = "/var/lib/kubelet"

// Config is what a Relay needs.
type Config struct {
	Client kube.Interface
	// Namespace is the driver's own namespace: the only one whose pods'
	// relayed ends the driver believes.
	Namespace   string
	Provisioner string
	Node        string
	// KubeletDir is the kubelet's root directory; "" = DefaultKubeletDir.
	KubeletDir string
}

// Relay watches one node's controller-side pods of one provisioner and
// relays their successful ends.
type Relay struct {
	cfg     Config
	podsDir string
	watcher *fsnotify.Watcher

	mu sync.Mutex
	// pods are the pods waited for, by UID: the host directory of their /pav.
	pods map[types.UID]*tracked
	// watched are the directories watched, each the deepest existing one on
	// the way to some tracked pod's /pav (or that /pav itself).
	watched map[string]bool
	// refusedOnce: a relay has failed (logged once at Info).
	refusedOnce atomic.Bool
}

type tracked struct {
	namespace, name string
	dir             string
	relaying        bool
}

// New makes a Relay; Start runs it.
func New(cfg Config) *Relay {
	if cfg.KubeletDir == "" {
		cfg.KubeletDir = DefaultKubeletDir
	}
	return &Relay{cfg: cfg, podsDir: filepath.Join(cfg.KubeletDir, "pods"),
		pods: map[types.UID]*tracked{}, watched: map[string]bool{}}
}

// Start starts the pod informer and the inotify watch, until ctx is done. An
// inotify watch that cannot be had is logged and leaves the relay off: the
// pods' status still carries their ends.
func (r *Relay) Start(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("endrelay")
	if !isDir(r.podsDir) {
		// Not the kubelet's layout (another --root-dir than the node plugin
		// mounts): the pods' status still carries their ends.
		logger.Info("No kubelet pods directory here; controller-side pods' ends come with their status", "dir", r.podsDir)
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		logger.Info("Cannot watch controller-side pods' /pav on this node; their ends come with their status", "err", err.Error())
		return nil
	}
	r.watcher = w
	go r.loop(klog.NewContext(ctx, logger))

	sel := labels.SelectorFromSet(labels.Set{podrunner.LabelProvisioner: r.cfg.Provisioner}).String()
	field := fields.OneTermEqualSelector("spec.nodeName", r.cfg.Node).String()
	inf := kube.NewInformer(r.cfg.Client, r.cfg.Client.Pods(r.cfg.Namespace), &corev1.Pod{}, 0,
		func(o *metav1.ListOptions) { o.LabelSelector, o.FieldSelector = sel, field }, nil)
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.observe(ctx, o, false) },
		UpdateFunc: func(_, o any) { r.observe(ctx, o, false) },
		DeleteFunc: func(o any) { r.observe(ctx, o, true) },
	}); err != nil {
		return err
	}
	go func() { <-ctx.Done(); _ = w.Close() }()
	go inf.RunWithContext(ctx)
	return nil
}

// PodDir is the host directory of an emptyDir volume of a pod.
func PodDir(kubeletDir string, uid types.UID, volume string) string {
	return filepath.Join(kubeletDir, "pods", string(uid), "volumes", "kubernetes.io~empty-dir", volume)
}

// observe starts or stops waiting for a pod.
func (r *Relay) observe(ctx context.Context, obj any, deleted bool) {
	pod, ok := kube.Unwrap[*corev1.Pod](obj)
	if !ok {
		return
	}
	volume, _, relayable := podrunner.EndedFile(pod)
	_, annotated := pod.Annotations[podrunner.AnnotationEnded]
	want := !deleted && relayable && !annotated && pod.DeletionTimestamp == nil && pod.Spec.NodeName == r.cfg.Node &&
		pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed && pod.UID != ""
	r.mu.Lock()
	_, had := r.pods[pod.UID]
	switch {
	case want && !had:
		r.pods[pod.UID] = &tracked{namespace: pod.Namespace, name: pod.Name, dir: PodDir(r.cfg.KubeletDir, pod.UID, volume)}
	case !want && had:
		delete(r.pods, pod.UID)
	default:
		// Still waited for (or being relayed), or never to be.
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	r.sync(ctx)
}

// loop turns inotify events into syncs.
func (r *Relay) loop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for {
		select {
		case ev, ok := <-r.watcher.Events:
			if !ok {
				return
			}
			if r.relevant(ev.Name) {
				r.sync(ctx)
			}
		case err, ok := <-r.watcher.Errors:
			if !ok {
				return
			}
			// An overflow may have dropped the event: look again.
			logger.V(2).Info("Watching controller-side pods' /pav", "err", err.Error())
			r.sync(ctx)
		}
	}
}

// relevant: an event on name may move a tracked pod on: its copy appeared,
// or a directory on the way to its /pav did. What a pod does in its own /pav
// otherwise is none of the relay's business.
func (r *Relay) relevant(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.pods {
		if name == filepath.Join(t.dir, report.FileEnded) || name == t.dir || strings.HasPrefix(t.dir, name+"/") {
			return true
		}
	}
	return false
}

// sync moves every tracked pod on: relays its copy if it is there, else
// watches the deepest directory on its way that exists; it then drops the
// watches no pod needs.
func (r *Relay) sync(ctx context.Context) {
	logger := klog.FromContext(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	needed := map[string]bool{}
	for uid, t := range r.pods {
		if t.relaying {
			continue
		}
		// Watch first, then look: a copy made before the watch was there
		// is read now, one made after it brings an event.
		if d, err := r.watchDeepest(t.dir); err != nil {
			logger.Info("Cannot watch a controller-side pod's /pav; its end comes with its status", "pod", klog.KRef(t.namespace, t.name), "dir", d, "err", err.Error())
		} else {
			needed[d] = true
		}
		if msg, ok := report.ReadEnded(t.dir); ok {
			t.relaying = true
			go r.relay(ctx, uid, t, msg)
		}
	}
	for d := range r.watched {
		if !needed[d] {
			_ = r.watcher.Remove(d)
			delete(r.watched, d)
		}
	}
}

// watchDeepest watches the deepest existing directory between podsDir and
// dir, and returns it. A directory made after it was found and before its
// watch was is seen by looking again once the watch is there.
func (r *Relay) watchDeepest(dir string) (string, error) {
	for {
		d := dir
		for d != r.podsDir && !isDir(d) {
			d = filepath.Dir(d)
			if len(d) < len(r.podsDir) {
				return "", fmt.Errorf("%s is not under %s", dir, r.podsDir)
			}
		}
		if !r.watched[d] {
			if err := r.watcher.Add(d); err != nil {
				return d, err
			}
			r.watched[d] = true
		}
		if d == dir {
			return d, nil
		}
		if next := childOn(d, dir); !isDir(next) {
			return d, nil
		}
	}
}

// childOn is the child of ancestor on the way to dir.
func childOn(ancestor, dir string) string {
	rest := strings.TrimPrefix(dir, ancestor+"/")
	first, _, _ := strings.Cut(rest, "/")
	return filepath.Join(ancestor, first)
}

// isDir: path is a directory, not through a symlink at its end. (The
// directories on the way are the kubelet's, which pods cannot touch.)
func isDir(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.IsDir()
}

// relay puts msg on the pod as AnnotationEnded, with its UID as precondition.
func (r *Relay) relay(ctx context.Context, uid types.UID, t *tracked, msg string) {
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(t.namespace, t.name))
	patch, err := endedPatch(uid, msg)
	if err == nil {
		_, err = r.cfg.Client.Pods(t.namespace).Patch(ctx, t.name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	switch {
	case err == nil:
		logger.V(2).Info("Relayed the pod's end")
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || errors.Is(err, context.Canceled):
		// Gone, or replaced by another pod of its name.
	case r.refusedOnce.CompareAndSwap(false, true):
		// Said once at Info: refused, it is refused for every pod (a
		// cluster before 1.32 puts no node in the token, which the
		// admission policy needs).
		logger.Info("Could not relay the pod's end; it comes with the pod's status (later failures are logged at -v=2)", "err", err.Error())
	default:
		logger.V(2).Info("Could not relay the pod's end; it comes with the pod's status", "err", err.Error())
	}
	// The pod stays tracked, as relaying, until the informer sees it
	// annotated, finished or gone: an update of its status that comes
	// first must not relay it again.
}

// endedPatch is the merge patch that sets AnnotationEnded to msg on the pod
// with this UID: a uid in a patch is a precondition, so a pod of the same
// name made since is left alone.
func endedPatch(uid types.UID, msg string) ([]byte, error) {
	return json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         uid,
		"annotations": map[string]string{podrunner.AnnotationEnded: msg},
	}})
}
