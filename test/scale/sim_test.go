//go:build scale

package scale

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

// The simulated nodes: kwok manages those with kwokAnnotation (kwok/kwok.yaml); pav-sim's
// pod templates select nodeSelectorLabel and tolerate taintKey; the run finds (and
// removes) what it made by simLabel.
const (
	kwokAnnotation    = "kwok.x-k8s.io/node"
	taintKey          = "kwok.x-k8s.io/node"
	nodeSelectorLabel = "type"
	nodeSelectorValue = "kwok"
	simLabel          = "pav-scale"
	simValue          = "sim"
	nodePrefix        = "pav-sim-node-"
)

// forEach runs f on every item with `workers` goroutines and returns the first error.
func forEach[T any](items []T, workers int, f func(T) error) error {
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	ch := make(chan T)
	for range min(workers, max(len(items), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range ch {
				if err := f(it); err != nil {
					once.Do(func() { first = err })
				}
			}
		}()
	}
	for _, it := range items {
		ch <- it
	}
	close(ch)
	wg.Wait()
	return first
}

// startKwok runs kwok with the configuration and stages of kwok/, logging to
// _output/scale/kwok.log; it is stopped at cleanup. If it exits, every wait fails.
func (s *sim) startKwok(ctx context.Context) {
	s.t.Helper()
	files, err := filepath.Glob("kwok/*.yaml")
	if err != nil || len(files) == 0 {
		s.t.Fatalf("no kwok configuration in test/scale/kwok: %v", err)
	}
	args := []string{"--kubeconfig=" + os.Getenv("KUBECONFIG")}
	for _, f := range files {
		abs, _ := filepath.Abs(f)
		args = append(args, "--config="+abs)
	}
	logPath := filepath.Join(s.logDir, "kwok.log")
	lf, err := os.Create(logPath)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(s.kwokBinary(), args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	// Its own process group: a Ctrl-C in the terminal reaches the test, which stops
	// kwok only after the cleanup that still needs it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("starting kwok: %v", err)
	}
	s.kwok = cmd
	s.kwokExit = make(chan error, 1)
	go func() {
		err := cmd.Wait()
		lf.Close()
		s.rec.stop(fmt.Sprintf("kwok exited (%v); see %s", err, logPath))
		s.kwokExit <- err
	}()
	s.t.Cleanup(s.stopKwok)
	s.t.Logf("kwok started (pid %d, log %s): %s", cmd.Process.Pid, logPath, strings.Join(args[1:], " "))
}

func (s *sim) stopKwok() {
	if s.kwok == nil {
		return
	}
	_ = s.kwok.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.kwokExit:
	case <-time.After(10 * time.Second):
		_ = s.kwok.Process.Kill()
		<-s.kwokExit
	}
	s.t.Logf("kwok stopped")
}

func nodeName(i int) string { return fmt.Sprintf("%s%04d", nodePrefix, i) }

func simNode(name string) *corev1.Node {
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				simLabel:                        simValue,
				nodeSelectorLabel:               nodeSelectorValue,
				corev1.LabelHostname:            name,
				corev1.LabelOSStable:            "linux",
				corev1.LabelArchStable:          "amd64",
				"node-role.kubernetes.io/agent": "",
			},
			Annotations: map[string]string{kwokAnnotation: "fake", "node.alpha.kubernetes.io/ttl": "0"},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: taintKey, Value: "fake", Effect: corev1.TaintEffectNoSchedule}}},
		// kwok's node-initialize stage keeps a capacity given at creation.
		Status: corev1.NodeStatus{Capacity: res, Allocatable: res},
	}
}

// createNodes creates the simulated nodes and waits until kwok made them all Ready.
func (s *sim) createNodes(ctx context.Context) {
	s.t.Helper()
	s.trackNodes(ctx)
	names := make([]string, s.nodes)
	for i := range names {
		names[i] = nodeName(i)
	}
	begin := time.Now()
	err := forEach(names, 32, func(n string) error {
		_, err := s.client.CoreV1().Nodes().Create(ctx, simNode(n), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		s.t.Fatalf("creating nodes: %v", err)
	}
	created := time.Since(begin)
	if err := s.rec.wait(ctx, s.t.Logf, fmt.Sprintf("%d simulated nodes Ready", s.nodes),
		func() bool { return s.rec.count(stepNodeReady) >= s.nodes },
		func() string { return fmt.Sprintf("%d Ready", s.rec.count(stepNodeReady)) }); err != nil {
		s.t.Fatal(err)
	}
	ready := time.Since(begin)
	s.out.setup = append(s.out.setup, []string{fmt.Sprintf("%d simulated nodes created (32 at a time) → all Ready (kwok)", s.nodes),
		fmt.Sprintf("%s (created in %s)", secs(ready), secs(created))})
	s.t.Logf("%d nodes created in %s, all Ready after %s", s.nodes, created, ready)
}

// applyProvisioner applies provisioner.yaml and waits until the manager reports it Ready.
func (s *sim) applyProvisioner(ctx context.Context) {
	s.t.Helper()
	b, err := os.ReadFile("provisioner.yaml")
	if err != nil {
		s.t.Fatal(err)
	}
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(b, &obj.Object); err != nil {
		s.t.Fatalf("provisioner.yaml: %v", err)
	}
	begin := time.Now()
	res := s.dyn.Resource(v1alpha1.GroupVersionResource)
	if _, err := res.Apply(ctx, provisionerName, obj, metav1.ApplyOptions{FieldManager: "pav-scale", Force: true}); err != nil {
		s.t.Fatalf("applying the PavProvisioner: %v", err)
	}
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", provisionerName).String()
			return res.List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", provisionerName).String()
			return res.Watch(ctx, o)
		},
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	last := ""
	_, err = watchtools.UntilWithSync(wctx, lw, &unstructured.Unstructured{}, nil, func(e watch.Event) (bool, error) {
		u, ok := e.Object.(*unstructured.Unstructured)
		if !ok {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == v1alpha1.ConditionReady {
				last = fmt.Sprintf("%v: %v", m["reason"], m["message"])
				if m["status"] == "True" {
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		s.t.Fatalf("waiting for PavProvisioner %s Ready: %v (last: %s)", provisionerName, err, last)
	}
	s.out.setup = append(s.out.setup, []string{"PavProvisioner " + provisionerName + " applied → Ready (its controller, and its node plugin on every node)", secs(time.Since(begin))})
}

// waitDaemonSetsSettled waits until every DaemonSet in pav's namespace (every
// provisioner's node plugins: the manager's default tolerates every taint, so they go
// to the simulated nodes too, where kwok runs them) has all its pods available, so that
// their creation does not overlap the measurement.
func (s *sim) waitDaemonSetsSettled(ctx context.Context) {
	s.t.Helper()
	begin := time.Now()
	dss := s.client.AppsV1().DaemonSets(pavNS)
	lw := &cache.ListWatch{
		ListFunc:  func(o metav1.ListOptions) (runtime.Object, error) { return dss.List(ctx, o) },
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) { return dss.Watch(ctx, o) },
	}
	seen := map[string]*appsv1.DaemonSet{}
	settled := func() bool {
		for _, d := range seen {
			st := d.Status
			if st.ObservedGeneration < d.Generation || st.NumberAvailable != st.DesiredNumberScheduled ||
				st.UpdatedNumberScheduled != st.DesiredNumberScheduled {
				return false
			}
		}
		return len(seen) > 0
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	nudged := make(chan int, 1)
	go func() { nudged <- s.nudgeMissedPods(wctx) }()
	// The precondition sees the whole initial list: deciding on the first Added event
	// alone would judge one DaemonSet.
	pre := func(store cache.Store) (bool, error) {
		for _, o := range store.List() {
			d := o.(*appsv1.DaemonSet)
			seen[d.Name] = d
		}
		return settled(), nil
	}
	_, err := watchtools.UntilWithSync(wctx, lw, &appsv1.DaemonSet{}, pre, func(e watch.Event) (bool, error) {
		d, ok := e.Object.(*appsv1.DaemonSet)
		if !ok {
			return false, nil
		}
		if e.Type == watch.Deleted {
			delete(seen, d.Name)
		} else {
			seen[d.Name] = d
		}
		return settled(), nil
	})
	var desc []string
	total := 0
	for _, d := range seen {
		desc = append(desc, fmt.Sprintf("%s %d/%d", strings.TrimSuffix(strings.TrimPrefix(d.Name, "pav-"), "-node"),
			d.Status.NumberAvailable, d.Status.DesiredNumberScheduled))
		total += int(d.Status.DesiredNumberScheduled)
	}
	cancel()
	n := <-nudged
	if err != nil {
		s.t.Fatalf("waiting for the DaemonSets in %s to settle: %v (%s)", pavNS, err, strings.Join(desc, ", "))
	}
	sort.Strings(desc)
	s.out.setup = append(s.out.setup, []string{fmt.Sprintf("node-plugin pods (DaemonSets in %s, all nodes): %d in %d DaemonSets (%s), all available; pods kwok had missed, nudged: %d",
		pavNS, total, len(seen), strings.Join(desc, ", "), n), secs(time.Since(begin))})
	s.out.daemonSets = len(seen)
	s.out.dsPods = total
}

// nudgeMissedPods works around a race in kwok v0.8.0: a pod bound to a node in the
// moment kwok starts to manage that node (a DaemonSet's pod, created as the node is) can
// be missed, and stays Pending until its next change. Every 10 s until ctx ends it
// touches (an annotation) the pods bound to simulated nodes that are still Pending after
// 10 s, which kwok then sees; it returns how many pods it touched.
func (s *sim) nudgeMissedPods(ctx context.Context) int {
	touched := map[string]bool{}
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return len(touched)
		case <-tick.C:
		}
		pods, err := s.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Pending"})
		if err != nil {
			continue
		}
		for _, p := range pods.Items {
			if !strings.HasPrefix(p.Spec.NodeName, nodePrefix) || time.Since(p.CreationTimestamp.Time) < 10*time.Second {
				continue
			}
			patch := fmt.Sprintf(`{"metadata":{"annotations":{"pav-scale/resync":"%d"}}}`, time.Now().UnixNano())
			if _, err := s.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err == nil {
				if !touched[p.Namespace+"/"+p.Name] {
					s.t.Logf("pod %s/%s on %s still Pending %s after its creation: touched so that kwok sees it",
						p.Namespace, p.Name, p.Spec.NodeName, time.Since(p.CreationTimestamp.Time).Round(time.Second))
				}
				touched[p.Namespace+"/"+p.Name] = true
			}
		}
	}
}

// storageClass makes the StorageClass pav-sim (Immediate binding, Delete reclaim).
func (s *sim) storageClass(ctx context.Context) {
	s.t.Helper()
	del := corev1.PersistentVolumeReclaimDelete
	imm := storagev1.VolumeBindingImmediate
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: provisionerName, Labels: map[string]string{simLabel: simValue}},
		Provisioner: provisionerName, ReclaimPolicy: &del, VolumeBindingMode: &imm}
	if _, err := s.client.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		s.t.Fatal(err)
	}
}

// cleanupLeftovers removes what an interrupted earlier run left (same names).
func (s *sim) cleanupLeftovers(ctx context.Context) {
	nodes, err := s.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: simLabel + "=" + simValue, Limit: 1})
	if err != nil {
		s.t.Fatal(err)
	}
	_, errP := s.dyn.Resource(v1alpha1.GroupVersionResource).Get(ctx, provisionerName, metav1.GetOptions{})
	nss, _ := s.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: simLabel + "=" + simValue, Limit: 1})
	if len(nodes.Items) == 0 && apierrors.IsNotFound(errP) && (nss == nil || len(nss.Items) == 0) {
		return
	}
	s.t.Logf("an earlier run left simulated nodes, namespaces or the %s provisioner: removing them first", provisionerName)
	s.removeAll(ctx)
}

// cleanup removes everything the run made (kwok is stopped by its own cleanup, after).
func (s *sim) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	s.removeAll(ctx)
}

// removeAll removes, in this order: the claims' namespaces (pav-sim deletes their
// volumes; kwok completes the deletion pods), the StorageClass, the PavProvisioner (its
// drivers go with it), the simulated nodes, and the pods left bound to them (node
// plugins, which the pod GC would only take after 40 s). Best effort: it logs what it
// could not remove.
func (s *sim) removeAll(ctx context.Context) {
	logf := s.t.Logf
	sel := metav1.ListOptions{LabelSelector: simLabel + "=" + simValue}
	if nss, err := s.client.CoreV1().Namespaces().List(ctx, sel); err == nil {
		for _, ns := range nss.Items {
			if err := s.client.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				logf("cleanup: deleting namespace %s: %v", ns.Name, err)
			}
		}
	}
	pvsLeft := func() ([]string, error) {
		l, err := s.client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var out []string
		for _, pv := range l.Items {
			if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == provisionerName {
				out = append(out, pv.Name)
			}
		}
		return out, nil
	}
	if left, err := pvsLeft(); err == nil && len(left) > 0 {
		logf("cleanup: waiting for %d %s volumes to be deleted", len(left), provisionerName)
		err := untilEmpty(ctx, 15*time.Minute, func(o metav1.ListOptions) (runtime.Object, error) {
			return s.client.CoreV1().PersistentVolumes().List(ctx, o)
		}, func(o metav1.ListOptions) (watch.Interface, error) {
			return s.client.CoreV1().PersistentVolumes().Watch(ctx, o)
		}, &corev1.PersistentVolume{}, func(o runtime.Object) bool {
			pv := o.(*corev1.PersistentVolume)
			return pv.Spec.CSI != nil && pv.Spec.CSI.Driver == provisionerName
		})
		if err != nil {
			left, _ := pvsLeft()
			logf("cleanup: %d %s PVs are left (%v): %v", len(left), provisionerName, err, first(left, 5))
		}
	}
	if err := s.client.StorageV1().StorageClasses().Delete(ctx, provisionerName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		logf("cleanup: deleting StorageClass %s: %v", provisionerName, err)
	}
	res := s.dyn.Resource(v1alpha1.GroupVersionResource)
	if err := res.Delete(ctx, provisionerName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		logf("cleanup: deleting PavProvisioner %s: %v", provisionerName, err)
	} else if err == nil {
		err := untilEmpty(ctx, 3*time.Minute, func(o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = "metadata.name=" + provisionerName
			return res.List(ctx, o)
		}, func(o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = "metadata.name=" + provisionerName
			return res.Watch(ctx, o)
		}, &unstructured.Unstructured{}, nil)
		if err != nil {
			u, _ := res.Get(ctx, provisionerName, metav1.GetOptions{})
			msg := ""
			if u != nil {
				conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
				msg = fmt.Sprint(conds)
			}
			logf("cleanup: PavProvisioner %s is not gone (%v): %s", provisionerName, err, msg)
		}
	}
	if err := s.client.CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		logf("cleanup: deleting the simulated nodes: %v", err)
	}
	err := untilEmpty(ctx, 5*time.Minute, func(o metav1.ListOptions) (runtime.Object, error) {
		o.LabelSelector = sel.LabelSelector
		return s.client.CoreV1().Nodes().List(ctx, o)
	}, func(o metav1.ListOptions) (watch.Interface, error) {
		o.LabelSelector = sel.LabelSelector
		return s.client.CoreV1().Nodes().Watch(ctx, o)
	}, &corev1.Node{}, nil)
	if err != nil {
		logf("cleanup: simulated nodes left: %v", err)
	}
	// Pods bound to the nodes that are gone, and pav-sim's own pods (Pending ones, with
	// no node left for them).
	zero := int64(0)
	if pods, err := s.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{ResourceVersion: "0"}); err == nil {
		var left []corev1.Pod
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Spec.NodeName, nodePrefix) || p.Labels[podrunner.LabelProvisioner] == provisionerName {
				left = append(left, p)
			}
		}
		if len(left) > 0 {
			logf("cleanup: deleting %d pods left on the simulated nodes or of %s", len(left), provisionerName)
		}
		_ = forEach(left, 16, func(p corev1.Pod) error {
			err := s.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			if err != nil && !apierrors.IsNotFound(err) {
				logf("cleanup: deleting pod %s/%s: %v", p.Namespace, p.Name, err)
			}
			return nil
		})
	}
	if leases, err := s.client.CoordinationV1().Leases(corev1.NamespaceNodeLease).List(ctx, metav1.ListOptions{}); err == nil {
		for _, l := range leases.Items {
			if strings.HasPrefix(l.Name, nodePrefix) {
				_ = s.client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, l.Name, metav1.DeleteOptions{})
			}
		}
	}
}

// untilEmpty waits (by a watch) until no object matching keep (nil: any) is listed.
func untilEmpty(ctx context.Context, timeout time.Duration, list cache.ListFunc, w cache.WatchFunc, obj runtime.Object, keep func(runtime.Object) bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	present := map[string]bool{}
	synced := false
	_, err := watchtools.UntilWithSync(ctx, &cache.ListWatch{ListFunc: list, WatchFunc: w}, obj,
		func(store cache.Store) (bool, error) {
			for _, o := range store.List() {
				if keep == nil || keep(o.(runtime.Object)) {
					m, _ := meta.Accessor(o)
					present[m.GetName()] = true
				}
			}
			synced = true
			return len(present) == 0, nil
		},
		func(e watch.Event) (bool, error) {
			m, err := meta.Accessor(e.Object)
			if err != nil || (keep != nil && !keep(e.Object)) {
				return synced && len(present) == 0, nil
			}
			if e.Type == watch.Deleted {
				delete(present, m.GetName())
			} else {
				present[m.GetName()] = true
			}
			return len(present) == 0, nil
		})
	if errors.Is(err, watchtools.ErrWatchClosed) {
		return fmt.Errorf("watch closed")
	}
	return err
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }
