//go:build e2e

package e2e

// Group snapshots (issue 35, item 4): VolumeGroupSnapshots of loop-block (whose members are
// made by their own snapshot pods, on their own nodes) and of a provisioner with a group pod,
// through the cluster's snapshot-controller and each driver's stock csi-snapshotter; bad
// input ending in a clear error with nothing left behind.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

var (
	groupSnapshotGV              = schema.GroupVersion{Group: "groupsnapshot.storage.k8s.io", Version: "v1"}
	volumeGroupSnapshotClasses   = groupSnapshotGV.WithResource("volumegroupsnapshotclasses")
	volumeGroupSnapshots         = groupSnapshotGV.WithResource("volumegroupsnapshots")
	volumeGroupSnapshotContents  = groupSnapshotGV.WithResource("volumegroupsnapshotcontents")
	groupSnapshotResourcesNeeded = []string{"volumegroupsnapshotclasses", "volumegroupsnapshots", "volumegroupsnapshotcontents"}
)

// requireGroupSnapshotCRDs is requireSnapshotCRDs for group snapshots: the
// VolumeGroupSnapshot CRDs served at v1 (the snapshot-controller and csi-snapshotter of
// external-snapshotter v8.7.0 use it) and pav's PavGroupSnapshot CRD.
func requireGroupSnapshotCRDs(t *testing.T) {
	t.Helper()
	requireSnapshotCRDs(t)
	for gv, names := range map[schema.GroupVersion][]string{groupSnapshotGV: groupSnapshotResourcesNeeded, v1alpha1.SchemeGroupVersion: {"pavgroupsnapshots"}} {
		list, err := client.Discovery().ServerResourcesForGroupVersion(gv.String())
		if err != nil {
			t.Fatalf("the cluster does not serve %s (%v): install the VolumeGroupSnapshot CRDs of external-snapshotter v8.7.0 and pav's CRDs (make install does)", gv, err)
		}
		for _, n := range names {
			if !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == n }) {
				t.Fatalf("the cluster does not serve %s %s (make install installs it)", gv, n)
			}
		}
	}
}

// labelledClaim is e.claim with labels (a VolumeGroupSnapshot selects its claims by label).
func (e *env) labelledClaim(name, sc string, labels map[string]string, size string) {
	e.t.Helper()
	mode := corev1.PersistentVolumeFilesystem
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns, Labels: labels},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeMode: &mode, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
	if _, err := client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, pvc, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// groupSnapshotClass makes a VolumeGroupSnapshotClass of a driver (deletionPolicy Delete),
// deleted with the test.
func (e *env) groupSnapshotClass(driverName string, params map[string]any) string {
	e.t.Helper()
	name := e.ns + "-" + driverName + "-" + strings.ToLower(rand.String(4))
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": groupSnapshotGV.String(), "kind": "VolumeGroupSnapshotClass",
		"metadata": map[string]any{"name": name}, "driver": driverName, "deletionPolicy": "Delete", "parameters": params,
	}}
	if _, err := dyn.Resource(volumeGroupSnapshotClasses).Create(e.ctx, u, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = dyn.Resource(volumeGroupSnapshotClasses).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// volumeGroupSnapshot asks for a group snapshot of the claims with the given labels, and
// returns its UID.
func (e *env) volumeGroupSnapshot(name, class string, labels map[string]string) string {
	e.t.Helper()
	match := map[string]any{}
	for k, v := range labels {
		match[k] = v
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": groupSnapshotGV.String(), "kind": "VolumeGroupSnapshot",
		"metadata": map[string]any{"name": name, "namespace": e.ns},
		"spec": map[string]any{"volumeGroupSnapshotClassName": class,
			"source": map[string]any{"selector": map[string]any{"matchLabels": match}}},
	}}
	got, err := dyn.Resource(volumeGroupSnapshots).Namespace(e.ns).Create(e.ctx, u, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return string(got.GetUID())
}

// readyGroup is what a ready VolumeGroupSnapshot and its content say: the group's handle, and
// each member's snapshot handle by its source volume handle.
type readyGroup struct {
	content, handle string
	members         map[string]string // volume handle → snapshot handle
}

// waitGroupSnapshotReady waits for status.readyToUse; a status.error fails at once, but
// for the snapshot-controller not having seen the class yet (classNotSeenYet).
func (e *env) waitGroupSnapshotReady(name string) readyGroup {
	e.t.Helper()
	r := readyGroup{members: map[string]string{}}
	e.poll("VolumeGroupSnapshot "+name+" readyToUse", func() (bool, error) {
		u, err := dyn.Resource(volumeGroupSnapshots).Namespace(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if msg, ok, _ := unstructured.NestedString(u.Object, "status", "error", "message"); ok && msg != "" {
			if !e.classNotSeenYet(volumeGroupSnapshotClasses, u, "volumeGroupSnapshotClassName", msg) {
				e.t.Fatalf("VolumeGroupSnapshot %s: status.error: %s", name, msg)
			}
		}
		ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse")
		r.content, _, _ = unstructured.NestedString(u.Object, "status", "boundVolumeGroupSnapshotContentName")
		return ready && r.content != "", nil
	})
	c, err := dyn.Resource(volumeGroupSnapshotContents).Get(e.ctx, r.content, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	r.handle, _, _ = unstructured.NestedString(c.Object, "status", "volumeGroupSnapshotHandle")
	infos, _, _ := unstructured.NestedSlice(c.Object, "status", "volumeSnapshotInfoList")
	for _, i := range infos {
		m := i.(map[string]any)
		r.members[fmt.Sprint(m["volumeHandle"])] = fmt.Sprint(m["snapshotHandle"])
	}
	return r
}

// memberSnapshots are the VolumeSnapshots a group made of its members, by source claim.
func (e *env) memberSnapshots(groupUID string) map[string]string {
	e.t.Helper()
	l, err := dyn.Resource(volumeSnapshots).Namespace(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]string{}
	for _, vs := range l.Items {
		if !slices.ContainsFunc(vs.GetOwnerReferences(), func(o metav1.OwnerReference) bool { return string(o.UID) == groupUID }) {
			continue
		}
		claim, _, _ := unstructured.NestedString(vs.Object, "spec", "source", "persistentVolumeClaimName")
		out[claim] = vs.GetName()
	}
	return out
}

// deleteGroupSnapshot deletes a VolumeGroupSnapshot (deletionPolicy Delete) and waits until
// it, its content, and its members' VolumeSnapshots and their contents are gone.
func (e *env) deleteGroupSnapshot(name, content string) {
	e.t.Helper()
	var members []string // their contents
	l, _ := dyn.Resource(volumeSnapshotContents).List(e.ctx, metav1.ListOptions{})
	for _, c := range l.Items {
		if ref, _, _ := unstructured.NestedString(c.Object, "spec", "volumeSnapshotRef", "namespace"); ref == e.ns {
			members = append(members, c.GetName())
		}
	}
	if err := dyn.Resource(volumeGroupSnapshots).Namespace(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	e.poll("VolumeGroupSnapshot "+name+", its content and its members gone", func() (bool, error) {
		if _, err := dyn.Resource(volumeGroupSnapshots).Namespace(e.ns).Get(e.ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("VolumeGroupSnapshot %s still there (%v)", name, err)
		}
		if content != "" {
			if _, err := dyn.Resource(volumeGroupSnapshotContents).Get(e.ctx, content, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, fmt.Errorf("VolumeGroupSnapshotContent %s still there (%v)", content, err)
			}
		}
		if l, err := dyn.Resource(volumeSnapshots).Namespace(e.ns).List(e.ctx, metav1.ListOptions{}); err != nil || len(l.Items) > 0 {
			return false, fmt.Errorf("VolumeSnapshots left in %s (%v)", e.ns, err)
		}
		for _, c := range members {
			if _, err := dyn.Resource(volumeSnapshotContents).Get(e.ctx, c, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, fmt.Errorf("VolumeSnapshotContent %s still there (%v)", c, err)
			}
		}
		return true, nil
	})
}

// groupRecords lists the PavGroupSnapshots, and the PavSnapshots that are their members,
// of a provisioner whose group snapshot name holds any of the given names.
func groupRecords(ctx context.Context, provisioner string, names ...string) ([]string, error) {
	var out []string
	for _, r := range []struct {
		gvr   schema.GroupVersionResource
		field string
	}{{v1alpha1.GroupSnapshotGroupVersionResource, "groupSnapshotName"}, {v1alpha1.SnapshotGroupVersionResource, "groupSnapshotName"}} {
		l, err := dyn.Resource(r.gvr).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelVolumeProvisioner + "=" + provisioner})
		if err != nil {
			return nil, err
		}
		for _, u := range l.Items {
			g, _, _ := unstructured.NestedString(u.Object, "spec", r.field)
			if g != "" && slices.ContainsFunc(names, func(n string) bool { return strings.Contains(g, n) }) {
				out = append(out, u.GetKind()+" "+u.GetName())
			}
		}
	}
	return out, nil
}

// TestGroupSnapshotRestoresEveryMember: three loop-block claims with data, one per node where
// the cluster has several (node-local volumes: a group spans nodes), snapshotted together by
// a VolumeGroupSnapshot chosen by label. The group is ready with one member per claim, each a
// VolumeSnapshot of its own whose handle is "<group>-<index>.<node>", a copy on its volume's
// node made by that member's own snapshot pod; pav records the group (PavGroupSnapshot) and
// its members (PavSnapshots that name it). Each member restores into a new claim, on its
// member's node, holding that member's data. Deleting the group deletes every member and
// its copy; nothing is left: no VolumeSnapshotContent, record, pod or file.
func TestGroupSnapshotRestoresEveryMember(t *testing.T) {
	inLane(t, laneSelf) // its own namespace, classes, volumes and snapshots only
	start := time.Now()
	requireGroupSnapshotCRDs(t)
	waitExample(t, "loop-block")
	requireSidecar(t, "loop-block", "snapshotter")
	nodes := clusterNodes(t, 1)
	if len(nodes) > 3 {
		nodes = nodes[:3]
	}
	e := newEnv(t)
	e.waitDriverOnNodes("loop-block", nodes)
	sc := e.exampleSC("loop-block", nil, storagev1.VolumeBindingWaitForFirstConsumer)
	labels := map[string]string{"group": e.ns}

	type member struct {
		claim, node, data, handle string
		pv                        *corev1.PersistentVolume
	}
	var members []*member
	for i := range 3 {
		m := &member{claim: fmt.Sprintf("data-%d", i), node: nodes[i%len(nodes)], data: fmt.Sprintf("member-%d-%s", i, rand.String(6))}
		e.labelledClaim(m.claim, sc, labels, "8Mi")
		e.podOn("writer-"+m.claim, m.node, "echo "+m.data+" > /data/"+m.claim+"/file && sync", podOpts{}, m.claim)
		members = append(members, m)
	}
	for _, m := range members {
		e.waitPodPhase("writer-"+m.claim, corev1.PodSucceeded)
		m.pv = e.waitBound(m.claim)
		m.handle = m.pv.Spec.CSI.VolumeHandle
		e.deletePod("writer-" + m.claim)
	}

	// The group: an unknown class parameter is passed on, not refused.
	class := e.groupSnapshotClass("loop-block", map[string]any{"tier": "gold"})
	uid := e.volumeGroupSnapshot("group", class, labels)
	g := e.waitGroupSnapshotReady("group")
	groupName := "groupsnapshot-" + uid
	if g.handle != groupName || len(g.members) != 3 {
		t.Fatalf("group handle %q with members %v, want %q and 3 members", g.handle, g.members, groupName)
	}
	byClaim := e.memberSnapshots(uid)
	var snapFiles []string
	for _, m := range members {
		snap := g.members[m.handle]
		if !strings.HasPrefix(snap, groupName+"-") || !strings.HasSuffix(snap, "."+m.node) {
			t.Errorf("member of %s: snapshot handle %q, want %s-<index>.%s", m.claim, snap, groupName, m.node)
		}
		f := onNode(m.node, filepath.Join(loopBlockDir, "snapshots", snap+".img"))
		if st, err := os.Stat(f); err != nil || st.Size() != 8<<20 {
			t.Errorf("copy of member %s on node %s (%s): %v, want 8Mi", snap, m.node, f, err)
		}
		snapFiles = append(snapFiles, f)
		if byClaim[m.claim] == "" {
			t.Errorf("no VolumeSnapshot of the group for claim %s: %v", m.claim, byClaim)
		}
	}
	recs, err := groupRecords(e.ctx, "loop-block", groupName)
	if err != nil || len(recs) != 4 {
		t.Fatalf("records of the group: %v (%v), want the PavGroupSnapshot and 3 PavSnapshots", recs, err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Each member restores, onto its member's node, with that member's data.
	for _, m := range members {
		vs := byClaim[m.claim]
		e.waitSnapshotReady(vs)
		e.sourcedClaim("restored-"+m.claim, sc, claimOpts{size: "8Mi"}, snapshotSource(vs))
		e.podOn("reader-"+m.claim, m.node, "cat /data/restored-"+m.claim+"/file", podOpts{}, "restored-"+m.claim)
	}
	var restoredPVs []string
	for _, m := range members {
		e.waitPodPhase("reader-"+m.claim, corev1.PodSucceeded)
		if out := e.logs("reader-" + m.claim); out != m.data+"\n" {
			t.Errorf("the restore of %s's member holds %q, want %q", m.claim, out, m.data)
		}
		pv := e.waitBound("restored-" + m.claim)
		if !pvAffinityNames(pv, hostnameKey, m.node) {
			t.Errorf("restored PV %s node affinity %v, want %s (its member's)", pv.Name, pv.Spec.NodeAffinity, m.node)
		}
		restoredPVs = append(restoredPVs, pv.Name)
		e.deletePod("reader-" + m.claim)
		e.deleteClaim("restored-" + m.claim)
	}
	for _, pv := range restoredPVs {
		e.waitPVGone(pv)
	}

	// Deleting the group deletes every member and its copy.
	e.deleteGroupSnapshot("group", g.content)
	e.poll("no record or pod of the group left", func() (bool, error) {
		if recs, err := groupRecords(e.ctx, "loop-block", groupName); err != nil || len(recs) > 0 {
			return false, fmt.Errorf("records left: %v (%v)", recs, err)
		}
		if pods := providerPodsOf(e.ctx, "loop-block", []string{groupName}); len(pods) > 0 {
			return false, fmt.Errorf("pods left: %v", pods)
		}
		return true, nil
	})
	for _, f := range snapFiles {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s still there after the group's deletion: %v", f, err)
		}
	}
	for _, m := range members {
		e.deleteClaim(m.claim)
	}
	for _, m := range members {
		e.waitPVGone(m.pv.Name)
	}
	t.Logf("TestGroupSnapshotRestoresEveryMember took %v on %d node(s)", time.Since(start).Round(time.Second), len(nodes))
}

// TestGroupSnapshotOfAnotherDriversVolume: a VolumeGroupSnapshot whose selector takes in a
// volume of another provisioner (pav-e2e's, beside loop-block's) is refused with an event
// and an error on it that name both drivers; no group is recorded and no pod runs.
func TestGroupSnapshotOfAnotherDriversVolume(t *testing.T) {
	inLane(t, laneSelf)
	requireGroupSnapshotCRDs(t)
	waitExample(t, "loop-block")
	e := newEnv(t)
	labels := map[string]string{"group": e.ns}
	e.labelledClaim("mine", e.exampleSC("loop-block", nil, storagev1.VolumeBindingImmediate, hostNode()), labels, "8Mi")
	e.labelledClaim("theirs", e.storageClass(nil, corev1.PersistentVolumeReclaimDelete), labels, "1Mi")
	pvs := []string{e.waitBound("mine").Name, e.waitBound("theirs").Name}
	uid := e.volumeGroupSnapshot("mixed", e.groupSnapshotClass("loop-block", nil), labels)
	msg := e.waitEvent("VolumeGroupSnapshot", "mixed", "CreateGroupSnapshotContentFailed", 2*time.Minute, "pav-e2e", "loop-block")
	t.Logf("event: %s", msg)
	e.poll("the error on the VolumeGroupSnapshot", func() (bool, error) {
		u, err := dyn.Resource(volumeGroupSnapshots).Namespace(e.ns).Get(e.ctx, "mixed", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		m, _, _ := unstructured.NestedString(u.Object, "status", "error", "message")
		return strings.Contains(m, "mismatch"), fmt.Errorf("status.error %q", m)
	})
	time.Sleep(5 * time.Second) // and nothing comes of it
	if recs, err := groupRecords(e.ctx, "loop-block", "groupsnapshot-"+uid); err != nil || len(recs) > 0 {
		t.Errorf("records: %v (%v), want none", recs, err)
	}
	if pods := providerPodsOf(e.ctx, "loop-block", []string{"groupsnapshot-" + uid}); len(pods) > 0 {
		t.Errorf("pods: %v, want none", pods)
	}
	e.deleteGroupSnapshot("mixed", "")
	for _, c := range []string{"mine", "theirs"} {
		e.deleteClaim(c)
	}
	for _, pv := range pvs {
		e.waitPVGone(pv)
	}
}

// groupPodProvisioner is a provisioner of nothing (volumes and snapshots without pods) whose
// group snapshots are made by one pod, which reports the members' handles in /pav/snapshots
// and the group's in /pav/handle, and deleted by one pod; with the class parameter
// output=bad its /pav/snapshots names a volume that is not a member.
func groupPodProvisioner(name string) string {
	return fmt.Sprintf(`apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: %[1]s
spec:
  provisioningModes: [Dynamic]
  volumeCreation: {capacity: 1Mi}
  volumeStaging:
    podTemplate:
      spec:
        containers: [{name: stage, image: %[2]s, imagePullPolicy: IfNotPresent, command: [sh, -c, "mkdir -p /pav/volume"]}]
  snapshotCreation: {}
  groupSnapshotCreation:
    podTemplate:
      spec:
        containers:
          - name: snap
            image: %[2]s
            imagePullPolicy: IfNotPresent
            command:
              - sh
              - -c
              - |
                {%% if params.output == 'bad' %%}
                echo 'not-a-member: {handle: x}' > /pav/snapshots
                {%% else %%}
                echo 'cg-{{ groupSnapshotName }}' > /pav/handle
                {%% for v in volumes %%}
                echo '{{ v.handle }}: {handle: cg-{{ v.defaultHandle }}, capacity: 1Mi}' >> /pav/snapshots
                {%% endfor %%}
                {%% endif %%}
  groupSnapshotDeletion:
    podTemplate:
      spec:
        containers:
          - {name: unsnap, image: %[2]s, imagePullPolicy: IfNotPresent, command: [sh, -c, "echo deleting {{ handle }}{%% for s in snapshots %%} {{ s.handle }}{%% endfor %%}"]}
`, name, busybox)
}

// TestGroupSnapshotByGroupPod: a provisioner whose group snapshots are one pod for the whole
// group. Its group is ready with the handles the pod reported; deleting it runs the group
// deletion pod and leaves nothing. A group pod that writes a /pav/snapshots naming a volume
// that is not a member fails the group with an error on the VolumeGroupSnapshot that names
// the file and the key; its undoing leaves no record and no pod.
func TestGroupSnapshotByGroupPod(t *testing.T) {
	inLane(t, laneOwn)
	requireGroupSnapshotCRDs(t)
	e := newEnv(t)
	name := "pav-e2e-groups-" + strings.ToLower(rand.String(4))
	e.newProvisioner(groupPodProvisioner(name))
	sc := e.storageClassOf(name)
	labels := map[string]string{"group": e.ns}
	var pvs []string
	for i := range 2 {
		e.labelledClaim(fmt.Sprintf("data-%d", i), sc, labels, "1Mi")
	}
	for i := range 2 {
		pvs = append(pvs, e.waitBound(fmt.Sprintf("data-%d", i)).Name)
	}

	uid := e.volumeGroupSnapshot("good", e.groupSnapshotClass(name, nil), labels)
	g := e.waitGroupSnapshotReady("good")
	groupName := "groupsnapshot-" + uid
	if g.handle != "cg-"+groupName || len(g.members) != 2 {
		t.Fatalf("group %q with members %v, want the group pod's handle cg-%s and 2 members", g.handle, g.members, groupName)
	}
	for _, snap := range g.members {
		if !strings.HasPrefix(snap, "cg-"+groupName+"-") {
			t.Errorf("member handle %q, want the group pod's cg-%s-<index>", snap, groupName)
		}
	}
	for claim, vs := range e.memberSnapshots(uid) {
		if r := e.waitSnapshotReady(vs); r.restoreSize != 1<<20 {
			t.Errorf("the member of %s: restoreSize %d, want the 1Mi the group pod reported", claim, r.restoreSize)
		}
	}
	e.deleteGroupSnapshot("good", g.content)
	e.poll("no record or pod of the group left", func() (bool, error) {
		if recs, err := groupRecords(e.ctx, name, groupName); err != nil || len(recs) > 0 {
			return false, fmt.Errorf("records left: %v (%v)", recs, err)
		}
		if pods := providerPodsOf(e.ctx, name, []string{groupName}); len(pods) > 0 {
			return false, fmt.Errorf("pods left: %v", pods)
		}
		return true, nil
	})

	// Bad output: an error that says what is wrong, and nothing left.
	uid = e.volumeGroupSnapshot("bad", e.groupSnapshotClass(name, map[string]any{"output": "bad"}), labels)
	groupName = "groupsnapshot-" + uid
	var msg string
	e.poll("the error on VolumeGroupSnapshot bad", func() (bool, error) {
		u, err := dyn.Resource(volumeGroupSnapshots).Namespace(e.ns).Get(e.ctx, "bad", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		msg, _, _ = unstructured.NestedString(u.Object, "status", "error", "message")
		return strings.Contains(msg, "/pav/snapshots"), fmt.Errorf("status.error %q", msg)
	})
	// csi-snapshotter quotes the driver's message (%q), so its own quotes
	// come escaped: look for the words, not the quoting.
	for _, want := range []string{"not-a-member", "is not the handle of a member's source volume", "key each entry by volumes[].handle"} {
		if !strings.Contains(msg, want) {
			t.Errorf("status.error %q lacks %q", msg, want)
		}
	}
	content := ""
	if u, err := dyn.Resource(volumeGroupSnapshots).Namespace(e.ns).Get(e.ctx, "bad", metav1.GetOptions{}); err == nil {
		content, _, _ = unstructured.NestedString(u.Object, "status", "boundVolumeGroupSnapshotContentName")
	}
	e.deleteGroupSnapshot("bad", content)
	e.poll("no record or pod of the failed group left", func() (bool, error) {
		if recs, err := groupRecords(e.ctx, name, groupName); err != nil || len(recs) > 0 {
			return false, fmt.Errorf("records left: %v (%v)", recs, err)
		}
		if pods := providerPodsOf(e.ctx, name, []string{groupName}); len(pods) > 0 {
			return false, fmt.Errorf("pods left: %v", pods)
		}
		return true, nil
	})
	for i := range 2 {
		e.deleteClaim(fmt.Sprintf("data-%d", i))
	}
	for _, pv := range pvs {
		e.waitPVGone(pv)
	}
}
