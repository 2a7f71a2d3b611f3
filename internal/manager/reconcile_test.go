package manager

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/kube/kubetest"
)

// restart is a new manager (new settings, empty caches) on the same cluster,
// and newFixture's first.
func (f *fixture) restart(s Settings) {
	f.t.Helper()
	c, err := New(Config{Kube: kubetest.Wrap(f.kube), Apps: kubetest.WrapManager(f.kube), Dynamic: f.dyn, Namespace: ns, Settings: s, Recorder: f.events})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := c.Start(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	f.c = c
	f.settle()
}

func mustReconcile(t *testing.T, f *fixture, name string) {
	t.Helper()
	if err := f.reconcile(name); err != nil {
		t.Fatalf("reconcile %s: %v", name, err)
	}
}

func wantWrites(t *testing.T, f *fixture, want ...string) {
	t.Helper()
	slices.Sort(want)
	if !slices.Equal(f.lastWrites, want) {
		t.Fatalf("writes:\n  %s\nwant:\n  %s", strings.Join(f.lastWrites, "\n  "), strings.Join(want, "\n  "))
	}
}

func checkOwner(t *testing.T, what string, o metav1.Object, uid types.UID) {
	t.Helper()
	ref := metav1.GetControllerOf(o)
	if ref == nil || ref.Kind != v1alpha1.Kind || ref.APIVersion != v1alpha1.SchemeGroupVersion.String() ||
		ref.UID != uid || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Errorf("%s: owner %+v, want a controlling, blocking reference to PavProvisioner uid %s", what, ref, uid)
	}
	if o.GetLabels()[labelManagedBy] != FieldManager || o.GetLabels()[labelInstance] == "" {
		t.Errorf("%s: labels %v", what, o.GetLabels())
	}
}

func TestReconcileCreatesAndIsIdempotent(t *testing.T) {
	f := newFixture(t, Settings{})
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	wantWrites(t, f,
		"apply pavprovisioners p1", // the finalizer
		"apply csidrivers p1",
		"apply statefulsets pav-p1-controller",
		"apply daemonsets pav-p1-node",
		"apply pavprovisioners/status p1")

	p := f.provisioner("p1")
	if !slices.Equal(p.Finalizers, []string{v1alpha1.FinalizerVolumes}) {
		t.Errorf("finalizers %v", p.Finalizers)
	}
	sts, ds, csi := f.statefulSet("p1"), f.daemonSet("p1"), f.csiDriver("p1")
	checkOwner(t, "CSIDriver", csi, "uid-1")
	checkOwner(t, "StatefulSet", sts, "uid-1")
	checkOwner(t, "DaemonSet", ds, "uid-1")
	if csi.Spec.AttachRequired == nil || *csi.Spec.AttachRequired {
		t.Errorf("CSIDriver attachRequired %v, want false (from deploy/provisioner/csidriver.yaml)", csi.Spec.AttachRequired)
	}
	ctrl := sts.Spec.Template.Spec.Containers[0]
	if !slices.Contains(ctrl.Args, "--provisioner=p1") || ctrl.Image != "ghcr.io/pods-as-volumes/pav:v0.2.0" {
		t.Errorf("controller container: image %s args %v", ctrl.Image, ctrl.Args)
	}
	reg := ds.Spec.Template.Spec.Containers[1]
	if !slices.Contains(reg.Args, "--kubelet-registration-path=/var/lib/kubelet/plugins/p1/csi.sock") {
		t.Errorf("registrar args %v", reg.Args)
	}
	if sel := sts.Spec.Selector.MatchLabels[labelInstance]; sel != "p1" {
		t.Errorf("StatefulSet selects instance %q", sel)
	}

	st := p.Status
	if st.ObservedGeneration != 1 || st.Volumes == nil || *st.Volumes != 0 || st.LastValidGeneration != 1 || st.LastValidSpec == nil {
		t.Errorf("status %+v", st)
	}
	for typ, want := range map[string]string{
		v1alpha1.ConditionValid:       "True/Valid",
		v1alpha1.ConditionReady:       "False/Deploying",
		v1alpha1.ConditionTerminating: "False/NotDeleting",
	} {
		if c := f.condition("p1", typ); string(c.Status)+"/"+c.Reason != want || c.ObservedGeneration != 1 {
			t.Errorf("condition %s = %s/%s (generation %d), want %s", typ, c.Status, c.Reason, c.ObservedGeneration, want)
		}
	}
	if ev := f.drainEvents(); !hasEvent(ev, "Normal Applied", "created CSIDriver p1", "created StatefulSet pav/pav-p1-controller", "created DaemonSet pav/pav-p1-node") {
		t.Errorf("events %v", ev)
	}

	// Nothing changed: nothing is written (not even a no-op apply).
	mustReconcile(t, f, "p1")
	wantWrites(t, f)
	// The rollout finishes: only the status changes.
	f.setWorkloadStatus("p1", 1, 1, 1)
	mustReconcile(t, f, "p1")
	wantWrites(t, f, "apply pavprovisioners/status p1")
	mustReconcile(t, f, "p1")
	wantWrites(t, f)

	// A new manager with the same settings changes nothing either.
	f.restart(Settings{})
	mustReconcile(t, f, "p1")
	wantWrites(t, f)
	if ev := f.drainEvents(); !hasEvent(ev, "Normal Ready") || hasEvent(ev, "Normal Applied") {
		t.Errorf("events %v", ev)
	}
}

// Someone else edits a field the manager owns: the next reconcile puts it back.
func TestReconcileRevertsDrift(t *testing.T) {
	f := newFixture(t, Settings{})
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	ds := f.daemonSet("p1")
	ds.Spec.Template.Spec.Containers[0].Image = "evil/pav:1"
	if _, err := f.kube.AppsV1().DaemonSets(ns).Update(f.ctx, ds, metav1.UpdateOptions{FieldManager: "kubectl-edit"}); err != nil {
		t.Fatal(err)
	}
	f.settle()
	mustReconcile(t, f, "p1")
	wantWrites(t, f, "apply daemonsets pav-p1-node")
	if img := f.daemonSet("p1").Spec.Template.Spec.Containers[0].Image; img != "ghcr.io/pods-as-volumes/pav:v0.2.0" {
		t.Fatalf("image %s after reconcile", img)
	}
}

// What the manager does not set is not drift: another tool's additions stay
// and cost no apply; removing something the manager sets is put back.
func TestReconcileLeavesOthersFieldsAlone(t *testing.T) {
	f := newFixture(t, Settings{})
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	ds := f.daemonSet("p1")
	ds.Spec.Template.Spec.Containers[0].Env = append(ds.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "HTTP_PROXY", Value: "http://proxy"})
	ds.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] = "now"
	if _, err := f.kube.AppsV1().DaemonSets(ns).Update(f.ctx, ds, metav1.UpdateOptions{FieldManager: "kubectl-edit"}); err != nil {
		t.Fatal(err)
	}
	f.settle()
	mustReconcile(t, f, "p1")
	wantWrites(t, f)

	ds = f.daemonSet("p1")
	ds.Spec.Template.Spec.Tolerations = nil
	if _, err := f.kube.AppsV1().DaemonSets(ns).Update(f.ctx, ds, metav1.UpdateOptions{FieldManager: "kubectl-edit"}); err != nil {
		t.Fatal(err)
	}
	f.settle()
	mustReconcile(t, f, "p1")
	wantWrites(t, f, "apply daemonsets pav-p1-node")
	if tol := f.daemonSet("p1").Spec.Template.Spec.Tolerations; len(tol) != 1 || tol[0].Operator != corev1.TolerationOpExists {
		t.Errorf("tolerations after reconcile: %v", tol)
	}
}

// A manager restarted with other settings updates the workloads, not the CSIDriver.
func TestSettingsChangeRollsWorkloads(t *testing.T) {
	f := newFixture(t, Settings{})
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	f.drainEvents()
	f.restart(Settings{Images: Images{Pav: "my.registry/pav:v9"}})
	mustReconcile(t, f, "p1")
	wantWrites(t, f, "apply daemonsets pav-p1-node", "apply statefulsets pav-p1-controller")
	if img := f.statefulSet("p1").Spec.Template.Spec.Containers[0].Image; img != "my.registry/pav:v9" {
		t.Errorf("controller image %s", img)
	}
	if ev := f.drainEvents(); !hasEvent(ev, "Normal Applied", "updated StatefulSet pav/pav-p1-controller", "updated DaemonSet pav/pav-p1-node") {
		t.Errorf("events %v", ev)
	}
}

func TestInvalidSpecKeepsLastValid(t *testing.T) {
	f := newFixture(t, Settings{})
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	f.drainEvents()
	f.edit("p1", func(u *unstructured.Unstructured) {
		u.Object["spec"] = provisionerWith("p1", "uid-1", 2, "{{ oops").Object["spec"]
		u.SetGeneration(2)
	})
	mustReconcile(t, f, "p1")
	// Only the status: the drivers stay, to delete and unstage existing volumes.
	wantWrites(t, f, "apply pavprovisioners/status p1")
	c := f.condition("p1", v1alpha1.ConditionValid)
	if c.Status != metav1.ConditionFalse || c.Reason != "Invalid" || !strings.Contains(c.Message, "spec.volumeStaging.podTemplate.spec.containers[0].image") || c.ObservedGeneration != 2 {
		t.Errorf("Valid = %+v", c)
	}
	st := f.provisioner("p1").Status
	if st.ObservedGeneration != 2 || st.LastValidGeneration != 1 || !strings.Contains(mustJSON(t, st.LastValidSpec), `"image":"busybox"`) {
		t.Errorf("status after an invalid edit: observed %d, lastValid %d %s", st.ObservedGeneration, st.LastValidGeneration, mustJSON(t, st.LastValidSpec))
	}
	if ev := f.drainEvents(); !hasEvent(ev, "Warning InvalidSpec", "containers[0].image", "generation 1") {
		t.Errorf("events %v", ev)
	}

	f.edit("p1", func(u *unstructured.Unstructured) {
		u.Object["spec"] = provisionerWith("p1", "uid-1", 3, "busybox:2").Object["spec"]
		u.SetGeneration(3)
	})
	mustReconcile(t, f, "p1")
	st = f.provisioner("p1").Status
	if c := f.condition("p1", v1alpha1.ConditionValid); c.Status != metav1.ConditionTrue || st.LastValidGeneration != 3 ||
		!strings.Contains(mustJSON(t, st.LastValidSpec), `"image":"busybox:2"`) {
		t.Errorf("after the fix: %+v, lastValid %d", c, st.LastValidGeneration)
	}
	if ev := f.drainEvents(); !hasEvent(ev, "Normal ValidSpec") {
		t.Errorf("events %v", ev)
	}
}

func TestReadyCondition(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		sts, desired, nodesOK int32
		status, reason, inMsg string
		event                 string
	}{
		{"nothing available", 0, 1, 0, "False", reasonDeploying, "the controller plugin", ""},
		{"node plugin starting", 1, 1, 0, "False", reasonDeploying, "0 of 1 available", ""},
		{"one of two nodes", 1, 2, 1, "False", reasonDeploying, "1 of 2 available", ""},
		{"all available", 1, 2, 2, "True", reasonReady, "available on 2 node(s)", "Normal Ready"},
		{"no node matches", 1, 0, 0, "False", reasonNoNodes, "nodePlugin.nodeSelector", "Warning NoNodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Settings{})
			f.create(provisioner("p1", "uid-1", 1))
			mustReconcile(t, f, "p1")
			f.drainEvents()
			f.setWorkloadStatus("p1", tc.sts, tc.desired, tc.nodesOK)
			mustReconcile(t, f, "p1")
			c := f.condition("p1", v1alpha1.ConditionReady)
			if string(c.Status) != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, tc.inMsg) {
				t.Errorf("Ready = %s/%s %q, want %s/%s containing %q", c.Status, c.Reason, c.Message, tc.status, tc.reason, tc.inMsg)
			}
			ev := f.drainEvents()
			if tc.event != "" && !hasEvent(ev, tc.event) || tc.event == "" && len(ev) > 0 {
				t.Errorf("events %v, want %q", ev, tc.event)
			}
		})
	}
}

func TestObjectsNotMadeByTheManager(t *testing.T) {
	foreignSTS := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "pav-p1-controller", Namespace: ns,
		Labels: map[string]string{labelInstance: "p1"}}}
	foreignCSI := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "p1"}}
	staleRef := []metav1.OwnerReference{{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.Kind, Name: "p1",
		UID: "uid-0", Controller: ptr.To(true)}}
	staleDS := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "pav-p1-node", Namespace: ns, UID: "ds-0", OwnerReferences: staleRef}}
	for _, tc := range []struct {
		name      string
		objs      []runtime.Object
		reason    string
		msg       string
		writes    []string
		deleteUID types.UID
	}{
		{name: "a StatefulSet of the component", objs: []runtime.Object{foreignSTS}, reason: reasonConflict,
			msg:    "StatefulSet pav/pav-p1-controller exists and was not made by pav-manager",
			writes: []string{"apply csidrivers p1", "apply daemonsets pav-p1-node"}},
		{name: "another CSI driver of that name", objs: []runtime.Object{foreignCSI}, reason: reasonConflict,
			msg:    "CSIDriver p1 exists",
			writes: []string{"apply statefulsets pav-p1-controller", "apply daemonsets pav-p1-node"}},
		{name: "left by an earlier PavProvisioner of this name", objs: []runtime.Object{staleDS}, reason: reasonReplacing,
			msg:    "left by an earlier PavProvisioner",
			writes: []string{"apply csidrivers p1", "apply statefulsets pav-p1-controller", "delete daemonsets pav-p1-node"}, deleteUID: "ds-0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Settings{}, tc.objs...)
			f.create(provisioner("p1", "uid-1", 1))
			f.settle()
			err := f.reconcile("p1")
			if err != nil {
				t.Fatalf("a conflict is no error to retry (it waits for the object to change): %v", err)
			}
			want := append([]string{"apply pavprovisioners p1", "apply pavprovisioners/status p1"}, tc.writes...)
			wantWrites(t, f, want...)
			c := f.condition("p1", v1alpha1.ConditionReady)
			if c.Status != metav1.ConditionFalse || c.Reason != tc.reason || !strings.Contains(c.Message, tc.msg) {
				t.Errorf("Ready = %s/%s %q", c.Status, c.Reason, c.Message)
			}
			if tc.reason == reasonConflict {
				if ev := f.drainEvents(); !hasEvent(ev, "Warning Conflict", tc.msg) {
					t.Errorf("events %v", ev)
				}
				return
			}
			// The leftover is gone: the next reconcile creates the real one.
			mustReconcile(t, f, "p1")
			wantWrites(t, f, "apply daemonsets pav-p1-node", "apply pavprovisioners/status p1")
			checkOwner(t, "DaemonSet", f.daemonSet("p1"), "uid-1")
		})
	}
}

func TestNameLength(t *testing.T) {
	for _, n := range []int{maxNameLength, maxNameLength + 1} {
		name := strings.Repeat("a", n)
		f := newFixture(t, Settings{})
		f.create(provisioner(name, "uid-1", 1))
		mustReconcile(t, f, name)
		c := f.condition(name, v1alpha1.ConditionReady)
		deployed := slices.Contains(f.lastWrites, "apply statefulsets "+ControllerName(name))
		if n <= maxNameLength && (!deployed || c.Reason != reasonDeploying) {
			t.Errorf("%d characters: deployed %v, Ready %s", n, deployed, c.Reason)
		}
		if n > maxNameLength && (deployed || c.Reason != reasonCannotDeploy || !strings.Contains(c.Message, "at most 37")) {
			t.Errorf("%d characters: deployed %v, Ready %s %q", n, deployed, c.Reason, c.Message)
		}
	}
}

func TestVolumeCount(t *testing.T) {
	f := newFixture(t, Settings{},
		dynamicPV("pv-1", "p1", corev1.VolumeBound), staticPV("pv-2", "p1", corev1.VolumeReleased),
		dynamicPV("pv-3", "other", corev1.VolumeBound))
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	if v := f.provisioner("p1").Status.Volumes; v == nil || *v != 2 {
		t.Fatalf("volumes %v, want 2", v)
	}
	if err := f.kube.CoreV1().PersistentVolumes().Delete(f.ctx, "pv-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.settle()
	mustReconcile(t, f, "p1")
	if v := f.provisioner("p1").Status.Volumes; v == nil || *v != 1 {
		t.Fatalf("volumes %v, want 1", v)
	}
}

// The deletion guard: what keeps a PavProvisioner (and its drivers), what not.
func TestDeletionGuard(t *testing.T) {
	for _, tc := range []struct {
		name    string
		objs    []runtime.Object
		records map[string]string // PavVolumes: name -> provisioner
		snaps   map[string]string // PavSnapshots: name -> provisioner
		groups  map[string]string // PavGroupSnapshots: name -> provisioner
		blocked []string          // substrings of the Terminating message; none: not blocked
	}{
		{name: "nothing"},
		{name: "dynamic PV bound", objs: []runtime.Object{dynamicPV("pv-1", "p1", corev1.VolumeBound)}, blocked: []string{"PV pv-1 (Bound)"}},
		{name: "dynamic PV released (Retain)", objs: []runtime.Object{dynamicPV("pv-1", "p1", corev1.VolumeReleased)}, blocked: []string{"PV pv-1 (Released)"}},
		{name: "static PV bound", objs: []runtime.Object{staticPV("pv-1", "p1", corev1.VolumeBound)}, blocked: []string{"static PV pv-1 (bound to ns1/claim-pv-1)"}},
		{name: "static PV released", objs: []runtime.Object{staticPV("pv-1", "p1", corev1.VolumeReleased)}},
		{name: "static PV available", objs: []runtime.Object{staticPV("pv-1", "p1", corev1.VolumeAvailable)}},
		{name: "another driver's PV", objs: []runtime.Object{dynamicPV("pv-1", "p2", corev1.VolumeBound)}},
		{name: "staging pod finished (volume staged)", objs: []runtime.Object{pavPod("s1", "p1", "staging", corev1.PodSucceeded)}, blocked: []string{"staging pod ns1/s1", "node1"}},
		{name: "creation pod running", objs: []runtime.Object{pavPod("c1", "p1", "creation", corev1.PodRunning)}, blocked: []string{"creation pod ns1/c1 (Running)"}},
		{name: "creation pod finished", objs: []runtime.Object{pavPod("c1", "p1", "creation", corev1.PodSucceeded)}},
		{name: "capacity pod running (a report nobody waits for)", objs: []runtime.Object{pavPod("k1", "p1", "capacity", corev1.PodRunning)}},
		{name: "volume record, no PV yet (creation in progress)", records: map[string]string{"pvc-1": "p1"}, blocked: []string{"PavVolume pvc-1 (Creating)"}},
		{name: "another provisioner's volume record", records: map[string]string{"pvc-1": "p2"}},
		{name: "snapshot record (it outlives its volume)", snaps: map[string]string{"snapshot-1": "p1"}, blocked: []string{"PavSnapshot snapshot-1 (Created)"}},
		{name: "another provisioner's snapshot record", snaps: map[string]string{"snapshot-1": "p2"}},
		{name: "group snapshot record (its members may be gone)", groups: map[string]string{"groupsnapshot-1": "p1"}, blocked: []string{"PavGroupSnapshot groupsnapshot-1 (Created)"}},
		{name: "another provisioner's group snapshot record", groups: map[string]string{"groupsnapshot-1": "p2"}},
		{name: "another provisioner's pod", objs: []runtime.Object{pavPod("s1", "p2", "staging", corev1.PodRunning)}},
		{name: "many", objs: []runtime.Object{
			dynamicPV("pv-1", "p1", corev1.VolumeBound), dynamicPV("pv-2", "p1", corev1.VolumeBound), dynamicPV("pv-3", "p1", corev1.VolumeBound),
			dynamicPV("pv-4", "p1", corev1.VolumeBound), dynamicPV("pv-5", "p1", corev1.VolumeBound), dynamicPV("pv-6", "p1", corev1.VolumeBound),
			dynamicPV("pv-7", "p1", corev1.VolumeBound)}, blocked: []string{"waits for 7:", "PV pv-5 (Bound) and 2 more"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Settings{}, tc.objs...)
			for name, p := range tc.records {
				f.record(name, p, v1alpha1.VolumeCreating)
			}
			for name, p := range tc.snaps {
				f.snapshot(name, p)
			}
			for name, p := range tc.groups {
				f.groupSnapshot(name, p)
			}
			f.create(provisioner("p1", "uid-1", 1))
			mustReconcile(t, f, "p1")
			f.drainEvents()
			f.markDeleted("p1")
			if err := f.reconcile("p1"); err != nil {
				t.Fatal(err)
			}
			term := f.condition("p1", v1alpha1.ConditionTerminating)
			if tc.blocked != nil {
				// The drivers stay (they refuse new volumes themselves); only the status changes.
				wantWrites(t, f, "apply pavprovisioners/status p1")
				if term.Status != metav1.ConditionTrue || term.Reason != "WaitingForVolumes" {
					t.Fatalf("Terminating = %s/%s", term.Status, term.Reason)
				}
				for _, s := range tc.blocked {
					if !strings.Contains(term.Message, s) {
						t.Errorf("Terminating message %q lacks %q", term.Message, s)
					}
				}
				if ev := f.drainEvents(); !hasEvent(ev, "Normal WaitingForVolumes", tc.blocked[0]) {
					t.Errorf("events %v", ev)
				}
				// Asked again, with nothing changed: nothing is written.
				mustReconcile(t, f, "p1")
				wantWrites(t, f)
				return
			}
			// Not blocked: the drivers go first, in the foreground, exactly the objects seen.
			wantWrites(t, f, "apply pavprovisioners/status p1",
				"delete csidrivers p1", "delete daemonsets pav-p1-node", "delete statefulsets pav-p1-controller")
			if term.Status != metav1.ConditionTrue || term.Reason != reasonDriversLeaving {
				t.Errorf("Terminating = %s/%s", term.Status, term.Reason)
			}
			// The fake API deletes at once; the next reconcile sees them gone and lets go.
			mustReconcile(t, f, "p1")
			wantWrites(t, f, "patch pavprovisioners p1")
			if fin := f.provisioner("p1").Finalizers; len(fin) != 0 {
				t.Fatalf("finalizers %v after the drivers are gone", fin)
			}
			if ev := f.drainEvents(); !hasEvent(ev, "Normal Deleted") {
				t.Errorf("events %v", ev)
			}
		})
	}
}

func TestDeleteOptions(t *testing.T) {
	f := newFixture(t, Settings{})
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	uid := f.statefulSet("p1").UID
	f.markDeleted("p1")
	f.kube.ClearActions()
	if err := f.c.reconcile(f.ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	for _, a := range f.kube.Actions() {
		d, ok := a.(k8stesting.DeleteAction)
		if !ok || a.GetResource().Resource != "statefulsets" {
			continue
		}
		o := d.GetDeleteOptions()
		if o.PropagationPolicy == nil || *o.PropagationPolicy != metav1.DeletePropagationForeground ||
			o.Preconditions == nil || o.Preconditions.UID == nil || *o.Preconditions.UID != uid {
			t.Fatalf("StatefulSet deleted with %+v, want foreground with UID precondition %s", o, uid)
		}
		return
	}
	t.Fatal("the StatefulSet was not deleted")
}

// Deleting while a volume exists, then the volume goes: the drivers stay until
// then, go, and then the finalizer.
func TestDeletionWaitsForTheLastVolume(t *testing.T) {
	f := newFixture(t, Settings{}, dynamicPV("pv-1", "p1", corev1.VolumeBound))
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	// An invalid edit during deletion changes nothing about the guard.
	f.edit("p1", func(u *unstructured.Unstructured) {
		u.Object["spec"] = provisionerWith("p1", "uid-1", 2, "{{ oops").Object["spec"]
		u.SetGeneration(2)
	})
	f.markDeleted("p1")
	mustReconcile(t, f, "p1")
	if c := f.condition("p1", v1alpha1.ConditionTerminating); c.Reason != "WaitingForVolumes" {
		t.Fatalf("Terminating %s", c.Reason)
	}
	if st := f.provisioner("p1").Status; st.LastValidGeneration != 1 {
		t.Fatalf("lastValidGeneration %d", st.LastValidGeneration)
	}
	if err := f.kube.CoreV1().PersistentVolumes().Delete(f.ctx, "pv-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.settle()
	mustReconcile(t, f, "p1")
	if !slices.Contains(f.lastWrites, "delete statefulsets pav-p1-controller") {
		t.Fatalf("writes %v", f.lastWrites)
	}
	mustReconcile(t, f, "p1")
	if len(f.provisioner("p1").Finalizers) != 0 {
		t.Fatal("finalizer kept")
	}
}

// Objects the manager did not make survive the deletion; a PavProvisioner
// without the finalizer (deleted before the manager saw it) is left alone.
func TestDeletionLeavesOthersAlone(t *testing.T) {
	foreign := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "pav-p1-controller", Namespace: ns}}
	f := newFixture(t, Settings{}, foreign)
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	f.markDeleted("p1")
	mustReconcile(t, f, "p1")
	wantWrites(t, f, "apply pavprovisioners/status p1", "delete csidrivers p1", "delete daemonsets pav-p1-node")
	mustReconcile(t, f, "p1")
	wantWrites(t, f, "patch pavprovisioners p1")
	f.statefulSet("p1") // still there

	g := newFixture(t, Settings{})
	u := provisioner("p2", "uid-2", 1)
	now := metav1.Now()
	u.SetDeletionTimestamp(&now)
	g.create(u)
	mustReconcile(t, g, "p2")
	wantWrites(t, g)
}

func TestEventKeys(t *testing.T) {
	owned := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "pav-p1-controller", Labels: map[string]string{labelInstance: "p1"},
		OwnerReferences: []metav1.OwnerReference{{Kind: v1alpha1.Kind, Name: "p1", Controller: ptr.To(true)}}}}
	for _, tc := range []struct {
		name string
		keys func(any) []string
		obj  any
		want []string
	}{
		{"owned workload", ownerKeys, owned, []string{"p1", "p1"}},
		{"component workload", ownerKeys, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{labelInstance: "p2"}}}, []string{"p2"}},
		{"deleted, state unknown", ownerKeys, k8stestingTombstone(owned), []string{"p1", "p1"}},
		{"CSI PV", pvKeys, dynamicPV("pv", "p3", corev1.VolumeBound), []string{"p3"}},
		{"other PV", pvKeys, &corev1.PersistentVolume{}, nil},
		{"pav pod", podKeys, pavPod("x", "p4", "staging", corev1.PodRunning), []string{"p4"}},
		{"CSIDriver", nameOf, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "p5"}}, []string{"p5"}},
	} {
		if got := tc.keys(tc.obj); !slices.Equal(got, tc.want) {
			t.Errorf("%s: keys %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The whole loop: informer events reach the queue and the workers converge,
// from creation to deletion, without a reconcile being called by hand.
func TestRunConverges(t *testing.T) {
	f := newFixture(t, Settings{})
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	go f.c.Run(ctx, 2)
	f.create(provisioner("p1", "uid-1", 1))
	eventually(t, "workloads and finalizer", func() bool {
		_, err := f.kube.AppsV1().DaemonSets(ns).Get(ctx, "pav-p1-node", metav1.GetOptions{})
		return err == nil && len(f.provisioner("p1").Finalizers) == 1
	})
	f.setWorkloadStatus("p1", 1, 1, 1)
	eventually(t, "Ready", func() bool { return f.condition("p1", v1alpha1.ConditionReady).Status == metav1.ConditionTrue })
	f.markDeleted("p1")
	eventually(t, "the finalizer to go", func() bool { return len(f.provisioner("p1").Finalizers) == 0 })
	if _, err := f.kube.AppsV1().StatefulSets(ns).Get(ctx, "pav-p1-controller", metav1.GetOptions{}); err == nil {
		t.Fatal("the StatefulSet is left")
	}
}

// A manager that leads again after a lost Lease (a term ended, another
// begins in the same process, with the caches it kept) reconciles what
// changed in between: the events of that time went to no worker.
func TestRunAgainAfterATermEnded(t *testing.T) {
	f := newFixture(t, Settings{})
	term, end := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { defer close(done); f.c.Run(term, 2) }()
	f.create(provisioner("p1", "uid-1", 1))
	eventually(t, "the DaemonSet", func() bool {
		_, err := f.kube.AppsV1().DaemonSets(ns).Get(f.ctx, "pav-p1-node", metav1.GetOptions{})
		return err == nil
	})
	end()
	<-done
	// Between the terms: the DaemonSet deleted behind the manager's back.
	if err := f.kube.AppsV1().DaemonSets(ns).Delete(f.ctx, "pav-p1-node", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deletion in the cache", func() bool {
		_, err := f.c.daemonSets.Get("pav-p1-node")
		return err != nil
	})
	time.Sleep(100 * time.Millisecond)
	if _, err := f.kube.AppsV1().DaemonSets(ns).Get(f.ctx, "pav-p1-node", metav1.GetOptions{}); err == nil {
		t.Fatal("reconciled between two terms")
	}
	term2, end2 := context.WithCancel(f.ctx)
	defer end2()
	go f.c.Run(term2, 2)
	eventually(t, "the DaemonSet again, in the second term", func() bool {
		_, err := f.kube.AppsV1().DaemonSets(ns).Get(f.ctx, "pav-p1-node", metav1.GetOptions{})
		return err == nil
	})
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// recordingQueue records what is queued, now and later.
type recordingQueue struct {
	workqueue.TypedRateLimitingInterface[string]
	mu           sync.Mutex
	now, delayed []string
}

func (q *recordingQueue) Add(k string) { q.mu.Lock(); q.now = append(q.now, k); q.mu.Unlock() }
func (q *recordingQueue) AddAfter(k string, _ time.Duration) {
	q.mu.Lock()
	q.delayed = append(q.delayed, k)
	q.mu.Unlock()
}

// Which events reconcile a provisioner: its own objects always; PVs coming and
// going (status.volumes) after volumeCountDelay; PV updates, pav's pods and
// records only while it is being deleted (the deletion guard).
func TestEventRouting(t *testing.T) {
	f := newFixture(t, Settings{})
	f.create(provisioner("live", "uid-1", 1))
	f.create(provisioner("leaving", "uid-2", 1))
	f.markDeleted("leaving")
	for _, tc := range []struct {
		name         string
		provisioner  string
		route        routing
		arrival      bool
		now, delayed bool
	}{
		{"own object", "live", always, false, true, false},
		{"PV created", "live", counted, true, false, true},
		{"PV updated", "live", counted, false, false, false},
		{"pod or record", "live", guarding, true, false, false},
		{"pod or record updated", "live", guarding, false, false, false},
		{"unknown provisioner's pod", "gone", guarding, true, false, false},
		{"PV created, provisioner being deleted", "leaving", counted, true, true, false},
		{"PV updated, provisioner being deleted", "leaving", counted, false, true, false},
		{"pod or record, provisioner being deleted", "leaving", guarding, false, true, false},
	} {
		q := &recordingQueue{}
		c := &Controller{cfg: f.c.cfg, provisioners: f.c.provisioners, queue: q}
		c.route(tc.provisioner, tc.route, tc.arrival)
		if got := len(q.now) == 1; got != tc.now {
			t.Errorf("%s: queued now %v, want %v", tc.name, q.now, tc.now)
		}
		if got := len(q.delayed) == 1; got != tc.delayed {
			t.Errorf("%s: queued later %v, want %v", tc.name, q.delayed, tc.delayed)
		}
	}
}
