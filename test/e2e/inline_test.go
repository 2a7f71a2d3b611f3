//go:build e2e

package e2e

// CSI inline ephemeral volumes (a pod's csi volume) of the provisioners that opt in
// (pav-e2e, object-bucket): created, staged and published when the pod starts, unpublished,
// unstaged and deleted when it goes, across node plugin restarts; refused with a clear
// error on bad attributes or a provisioner without Ephemeral; and the admission policy that
// keeps each node plugin to its own node's records.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/controllerserver"
	"github.com/pods-as-volumes/pav/nodeserver"
)

// inlinePod makes a pod on node 1 (as clientPod) with an inline ephemeral volume "data" of
// driverName, mounted at /data, running script; it returns the pod and its volume's id.
func (e *env) inlinePod(name, driverName, script string, attrs map[string]string) (*corev1.Pod, string) {
	e.t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr(int64(1)),
			NodeSelector: map[string]string{hostnameKey: hostNode()},
			Containers: []corev1.Container{{Name: "app", Image: busybox, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", script}, VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver: driverName, VolumeAttributes: attrs}}}}}}
	pod, err := client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pod, controllerserver.InlineVolumeID(pod.UID, "data")
}

// inlineTarget is where the kubelet publishes a pod's inline volume "data".
func inlineTarget(pod *corev1.Pod) string {
	return filepath.Join("/var/lib/kubelet/pods", string(pod.UID), "volumes/kubernetes.io~csi/data/mount")
}

// inlineMarker is the node plugin's marker of an inline volume of a provisioner on node 1.
func inlineMarker(provisioner, id string) string {
	return filepath.Join(pluginVolumes(provisioner), "inline", filepath.Base(nodeserver.VolumeDir(pluginVolumes(provisioner), id))+".json")
}

// assertInlineGone waits until nothing of an inline volume is left: its record, pods,
// marker, state directory and mounts (the pod's target among them).
func (e *env) assertInlineGone(provisioner, id string, pod *corev1.Pod) {
	e.t.Helper()
	dir := nodeserver.VolumeDir(pluginVolumes(provisioner), id)
	e.poll("nothing left of inline volume "+id, func() (bool, error) {
		if v, err := record(e.ctx, id); v != nil || err != nil {
			return false, fmt.Errorf("PavVolume %s left (%v)", id, err)
		}
		for _, ph := range []string{"validation", "creation", "staging", "unstaging", "deletion"} {
			if ps := pavPods(provisioner, ph, ""); slices.ContainsFunc(ps, func(p corev1.Pod) bool {
				return strings.Contains(p.Annotations["pav.albertofaria.github.io/volume-key"], id)
			}) {
				return false, fmt.Errorf("a %s pod of the volume is left", ph)
			}
		}
		for _, path := range []string{dir, inlineMarker(provisioner, id)} {
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				return false, fmt.Errorf("%s left (%v)", path, err)
			}
		}
		if m := append(hostMounts(dir), hostMounts(inlineTarget(pod))...); len(m) > 0 {
			return false, fmt.Errorf("mounts left: %v", m)
		}
		return true, nil
	})
}

// TestInlineVolume: a pod's inline volume of pav-e2e is made for it (validation, creation
// and staging on its node, with the pod's volumeAttributes as params), written and read by
// it, recorded in a PavVolume of its node, and goes with the pod: nothing is left, and
// each phase ran once.
func TestInlineVolume(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	d, err := client.StorageV1().CSIDrivers().Get(e.ctx, driver, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Spec.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent, storagev1.VolumeLifecycleEphemeral}) ||
		d.Spec.PodInfoOnMount == nil || !*d.Spec.PodInfoOnMount {
		t.Fatalf("CSIDriver %s: modes %v, podInfoOnMount %v", driver, d.Spec.VolumeLifecycleModes, d.Spec.PodInfoOnMount)
	}
	token := "inline-" + rand.String(8)
	pod, id := e.inlinePod("app", driver, fmt.Sprintf("echo %s > /data/token && cat /data/token /data/params.json && exec sleep 3600", token),
		map[string]string{"color": "green"})
	e.waitPodRunning("app")
	e.poll("the pod wrote and read its volume", func() (bool, error) {
		out := e.logs("app")
		return strings.Contains(out, token) && strings.Contains(out, `"color": "green"`), fmt.Errorf("log %q", out)
	})

	v, err := record(e.ctx, id)
	if err != nil || v == nil {
		t.Fatalf("no PavVolume %s: %v", id, err)
	}
	if eph := v.Spec.Ephemeral; eph == nil || eph.Node != hostNode() || eph.Pod.Name != "app" || eph.Pod.Namespace != e.ns || eph.Pod.UID != pod.UID ||
		v.Status.Phase != v1alpha1.VolumeCreated || v.Status.Handle != id || v.Labels[v1alpha1.LabelVolumeNode] != hostNode() || v.Spec.Params["color"] != "green" {
		t.Fatalf("PavVolume %s: spec %+v, status %+v, labels %v", id, v.Spec, v.Status, v.Labels)
	}
	dir := nodeserver.VolumeDir(volumesDir, id)
	if b, err := os.ReadFile(filepath.Join(dir, "pav", "volume", "token")); err != nil || strings.TrimSpace(string(b)) != token {
		t.Fatalf("the volume on the node holds %q (%v)", b, err)
	}
	if !slices.Contains(hostMounts(inlineTarget(pod)), inlineTarget(pod)) {
		t.Fatalf("the pod's target %s is not mounted", inlineTarget(pod))
	}
	if _, err := os.Stat(inlineMarker(driver, id)); err != nil {
		t.Fatalf("no marker: %v", err)
	}

	e.deletePod("app")
	e.assertInlineGone(driver, id, pod)
	for _, ph := range []string{"creation", "staging", "unstaging", "deletion"} {
		e.wantRuns(ph, id, 1)
	}
	if m, ok := marker("deleted", id); !ok || m != "1" {
		t.Errorf("the deletion pod's marker: %q %v (want the capacity, 1 byte)", m, ok)
	}
}

// TestInlineVolumeNodePluginKilled: the node plugin is killed while it makes an inline
// volume (its creation pod running) and while it deletes one (its deletion pod running,
// the pod being deleted): the kubelet's retries, and the records, finish the work; each
// phase runs once and nothing is left.
func TestInlineVolumeNodePluginKilled(t *testing.T) {
	inLane(t, lanePavE2E)
	t.Run("while publishing", func(t *testing.T) {
		e := newEnv(t)
		pod, id := e.inlinePod("app", driver, "echo ok > /data/f && cat /data/f && exec sleep 3600", map[string]string{"createSleep": "12"})
		e.phasePodOf("creation", id)
		e.killNodePlugin()
		e.waitPodRunning("app")
		e.deletePod("app")
		e.assertInlineGone(driver, id, pod)
		for _, ph := range []string{"creation", "staging", "unstaging", "deletion"} {
			e.wantRuns(ph, id, 1)
		}
	})
	t.Run("while the pod is being deleted", func(t *testing.T) {
		e := newEnv(t)
		pod, id := e.inlinePod("app", driver, "exec sleep 3600", map[string]string{"deleteSleep": "12"})
		e.waitPodRunning("app")
		if err := client.CoreV1().Pods(e.ns).Delete(e.ctx, "app", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.phasePodOf("deletion", controllerserver.DeletionKey(id))
		e.killNodePlugin()
		e.poll("the pod gone", func() (bool, error) {
			_, err := client.CoreV1().Pods(e.ns).Get(e.ctx, "app", metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		e.assertInlineGone(driver, id, pod)
		for _, ph := range []string{"creation", "staging", "unstaging", "deletion"} {
			e.wantRuns(ph, id, 1)
		}
	})
}

// TestInlineVolumeBadInput: an inline volume whose attributes are refused (a key reserved
// for pav, an attribute the provisioner's validation refuses) gets pav's message, naming
// the attribute and the fix, in the pod's FailedMount event; nothing is made or left.
func TestInlineVolumeBadInput(t *testing.T) {
	inLane(t, lanePavE2E)
	e := newEnv(t)
	for _, c := range []struct {
		name  string
		attrs map[string]string
		want  []string
	}{
		{"reserved", map[string]string{"pav.albertofaria.github.io/pv": "someone-elses"},
			[]string{`volumeAttributes key "pav.albertofaria.github.io/pv" is reserved`, "remove it from the pod's csi volume"}},
		{"refused", map[string]string{"scenario": "fail-validation", "color": "red"},
			[]string{"volume validation failed", "color red is not allowed"}},
	} {
		pod, id := e.inlinePod(c.name, driver, "exec sleep 3600", c.attrs)
		e.waitEvent("Pod", c.name, "FailedMount", 2*time.Minute, c.want...)
		// (The kubelet retries while the pod exists, and every retry is refused again.)
		e.deletePod(c.name)
		e.assertInlineGone(driver, id, pod)
		if n := runs("creation", id) + runs("staging", id); n != 0 {
			t.Errorf("%s: %d creation and staging pods ran", c.name, n)
		}
	}
}

// TestInlineVolumeNotOptedIn: a provisioner without Ephemeral (loop-block) has a CSIDriver
// of persistent volumes only, without pod information, so the kubelet refuses a pod's csi
// volume of it before pav hears of it.
func TestInlineVolumeNotOptedIn(t *testing.T) {
	inLane(t, laneSelf)
	waitExample(t, "loop-block")
	e := newEnv(t)
	d, err := client.StorageV1().CSIDrivers().Get(e.ctx, "loop-block", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(d.Spec.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}) || d.Spec.PodInfoOnMount != nil && *d.Spec.PodInfoOnMount {
		t.Fatalf("CSIDriver loop-block: modes %v, podInfoOnMount %v", d.Spec.VolumeLifecycleModes, d.Spec.PodInfoOnMount)
	}
	_, id := e.inlinePod("app", "loop-block", "exec sleep 3600", nil)
	e.waitEvent("Pod", "app", "FailedMount", 2*time.Minute, `"Ephemeral"`, "not supported by driver loop-block")
	if v, err := record(e.ctx, id); v != nil || err != nil {
		t.Fatalf("a PavVolume for a refused inline volume: %v %v", v, err)
	}
	e.deletePod("app")
}

// TestInlineVolumePolicy: the node plugins' ServiceAccount token carries its node
// (authentication.kubernetes.io/node-name, which the admission policy of PavVolumes
// reads), and a token of one node's plugin can write only that node's inline volumes'
// records: another node's, or a persistent volume's, are refused with the policy's message.
func TestInlineVolumePolicy(t *testing.T) {
	inLane(t, laneSelf)
	e := newEnv(t)
	plugins, err := client.CoreV1().Pods("pav").List(e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + driver + ",app.kubernetes.io/component=node"})
	if err != nil || len(plugins.Items) == 0 {
		t.Fatalf("node plugins: %v", err)
	}
	// The token the node plugin of node 1 runs with, as the kubelet projected it.
	var local *corev1.Pod
	for i, p := range plugins.Items {
		if p.Spec.NodeName == hostNode() {
			local = &plugins.Items[i]
		}
	}
	if local == nil {
		t.Fatalf("no node plugin on %s", hostNode())
	}
	tokens, _ := filepath.Glob(filepath.Join("/var/lib/kubelet/pods", string(local.UID), "volumes/kubernetes.io~projected/*/token"))
	if len(tokens) == 0 {
		t.Fatalf("the node plugin's projected token is not on the node")
	}
	b, err := os.ReadFile(tokens[0])
	if err != nil {
		t.Fatal(err)
	}
	kube, _ := asToken(t, string(b))
	review, err := kube.AuthenticationV1().SelfSubjectReviews().Create(e.ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := review.Status.UserInfo; !strings.HasSuffix(u.Username, ":pav-node") || !slices.Equal(u.Extra["authentication.kubernetes.io/node-name"], []string{hostNode()}) {
		t.Fatalf("the node plugin's token: user %s, extra %v: want its node %s in authentication.kubernetes.io/node-name", u.Username, u.Extra, hostNode())
	}

	// A token of another node's plugin (bound to that pod, as its own is) against node 1's
	// records; on a one-node cluster, node 1's plugin's against a node that is not its.
	other, theirs := local, "not-"+hostNode()
	for i, p := range plugins.Items {
		if p.Spec.NodeName != hostNode() {
			other, theirs = &plugins.Items[i], hostNode()
			break
		}
	}
	mine := other.Spec.NodeName
	tr, err := client.CoreV1().ServiceAccounts("pav").CreateToken(e.ctx, "pav-node", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: other.Name, UID: other.UID},
		ExpirationSeconds: ptr(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, dyns := asToken(t, tr.Status.Token)
	prov := "e2e-policy-" + e.ns // no provisioner of this name: nothing acts on these records
	rec := func(name, node string) *unstructured.Unstructured {
		spec := map[string]any{"provisioner": prov, "volumeName": name, "requestedVolumeMode": "Filesystem", "requestedMinCapacity": int64(1), "defaultHandle": name}
		labels := map[string]any{v1alpha1.LabelVolumeProvisioner: prov}
		if node != "" {
			spec["ephemeral"] = map[string]any{"node": node, "pod": map[string]any{"namespace": e.ns, "name": "p", "uid": "u"}}
			labels[v1alpha1.LabelVolumeNode] = node
		}
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": v1alpha1.VolumeKind,
			"metadata": map[string]any{"name": name, "labels": labels}, "spec": spec}}
	}
	vols := dyn.Resource(v1alpha1.VolumeGroupVersionResource)
	t.Cleanup(func() {
		for _, n := range []string{"a", "b", "c", "d"} {
			_ = vols.Delete(context.Background(), prov+"-"+n, metav1.DeleteOptions{})
		}
	})
	// Another node's inline volume, made by an administrator: the plugin may neither
	// delete it, nor make one of that node's, nor a claim's record.
	if _, err := vols.Create(e.ctx, rec(prov+"-a", theirs), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	asPlugin := dyns.Resource(v1alpha1.VolumeGroupVersionResource)
	create := func(name, node string) error {
		_, err := asPlugin.Create(e.ctx, rec(name, node), metav1.CreateOptions{})
		return err
	}
	for _, c := range []struct {
		what string
		err  error
		want string
	}{
		{"delete another node's inline volume", asPlugin.Delete(e.ctx, prov+"-a", metav1.DeleteOptions{}), "is an inline volume of node " + theirs},
		{"create one of another node's", create(prov+"-b", theirs), "would be an inline volume of node " + theirs},
		{"create a persistent volume's record", create(prov+"-c", ""), "would be not an inline volume"},
	} {
		if !apierrors.IsForbidden(c.err) && !apierrors.IsInvalid(c.err) || !strings.Contains(fmt.Sprint(c.err), c.want) {
			t.Errorf("%s with node %s's plugin token: %v, want refused: %q", c.what, mine, c.err, c.want)
		}
	}
	// Its own node's: allowed.
	if err := create(prov+"-d", mine); err != nil {
		t.Fatalf("a node plugin's own node's inline volume: %v", err)
	}
	if err := asPlugin.Delete(e.ctx, prov+"-d", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting its own node's inline volume: %v", err)
	}
}

// asToken is the cluster's clients authenticated by a bearer token.
func asToken(t *testing.T, token string) (kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	cfg := restConfig(t)
	cfg.BearerToken, cfg.BearerTokenFile = strings.TrimSpace(token), ""
	cfg.CertData, cfg.KeyData, cfg.CertFile, cfg.KeyFile = nil, nil, "", ""
	cfg.Username, cfg.Password = "", ""
	return kubernetes.NewForConfigOrDie(cfg), dynamic.NewForConfigOrDie(cfg)
}

// TestExampleObjectBucketInline: examples/object-bucket's inline volumes, against its
// in-cluster store: a fresh bucket per volume, named after its id, in the store the
// administrator's Secret names; the pod's file is in it; the bucket goes with the pod; an
// attribute that would choose the store is refused and makes nothing.
func TestExampleObjectBucketInline(t *testing.T) {
	inLane(t, laneObjectBucket)
	e, params := objectBucketEnv(t)
	key := func(k string) string {
		s, err := client.CoreV1().Secrets(storeNamespace).Get(e.ctx, "object-store-credentials", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(s.Data[k])
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "object-bucket-inline", Namespace: "pav"},
		StringData: map[string]string{"endpoint": params["endpoint"], "accessKeyId": key("accessKeyId"), "secretAccessKey": key("secretAccessKey")}}
	_, err := client.CoreV1().Secrets("pav").Create(e.ctx, secret, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// After the namespace (whose pods' buckets need it) is gone: registered before it. A
	// Secret that was there before is someone else's (a conformance run's setup.sh): it stays.
	if err == nil {
		defer func() {
			_ = client.CoreV1().Secrets("pav").Delete(context.Background(), "object-bucket-inline", metav1.DeleteOptions{})
		}()
	}

	pod, id := e.inlinePod("app", "object-bucket", "echo hello > /data/hello.txt && cat /data/hello.txt && exec sleep 3600", map[string]string{"dirCacheTime": "1s"})
	bucket := "inline-" + id[4:36]
	e.waitPodRunning("app")
	e.poll("the pod wrote its file", func() (bool, error) { return e.logs("app") == "hello\n", nil })
	if out := s3(t, "rclone lsf "+s3path(bucket)); out != "hello.txt\n" {
		t.Fatalf("bucket %s holds %q, want hello.txt", bucket, out)
	}
	if v, err := record(e.ctx, id); err != nil || v == nil || v.Spec.Ephemeral == nil || v.Status.Phase != v1alpha1.VolumeCreated {
		t.Fatalf("PavVolume %s: %+v %v", id, v, err)
	}
	if st := pavPods("object-bucket", "staging", id+"@"); len(st) != 1 || st[0].Namespace != "pav" {
		t.Fatalf("staging pods %v: want one, in pav's namespace", st)
	}
	e.deletePod("app")
	e.assertInlineGone("object-bucket", id, pod)
	if out := s3(t, "rclone lsf --dirs-only "+s3path("")); strings.Contains(out, bucket) {
		t.Fatalf("bucket %s left in the store: %q", bucket, out)
	}

	buckets := s3(t, "rclone lsf --dirs-only "+s3path(""))
	pod, id = e.inlinePod("thief", "object-bucket", "exec sleep 3600", map[string]string{"endpoint": "http://elsewhere:9000"})
	e.waitEvent("Pod", "thief", "FailedMount", 2*time.Minute,
		"volumeAttributes key endpoint is not allowed on inline volumes of object-bucket", "remove it")
	e.deletePod("thief")
	e.assertInlineGone("object-bucket", id, pod)
	if out := s3(t, "rclone lsf --dirs-only "+s3path("")); out != buckets {
		t.Fatalf("the store's buckets changed: %q, then %q", buckets, out)
	}
}

// TestInlineVolumeKubeletRestarted: the kubelet restarts while an inline volume is being
// deleted with its pod (its deletion pod running). A restarted kubelet rebuilds its view
// from the pod's directory (the volume's vol_data.json) and unpublishes the volume again,
// until it succeeds: the deletion pod, adopted, runs once, and nothing is left. It restarts
// the kubelet of node 1: no lane (it runs alone).
func TestInlineVolumeKubeletRestarted(t *testing.T) {
	e := newEnv(t)
	pod, id := e.inlinePod("app", driver, "exec sleep 3600", map[string]string{"deleteSleep": "20"})
	e.waitPodRunning("app")
	if err := client.CoreV1().Pods(e.ns).Delete(e.ctx, "app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.phasePodOf("deletion", controllerserver.DeletionKey(id))
	e.reboot(func() {}) // the kubelet stopped, then started again: nothing else undone
	e.pollFor("the pod gone", 4*time.Minute, func() (bool, error) {
		_, err := client.CoreV1().Pods(e.ns).Get(e.ctx, "app", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	e.assertInlineGone(driver, id, pod)
	for _, ph := range []string{"creation", "staging", "unstaging", "deletion"} {
		e.wantRuns(ph, id, 1)
	}
}
