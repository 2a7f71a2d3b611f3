package manager

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/phase"
)

// Phases that bring a sidecar along (see sidecars).
const (
	phaseExpansion    = "volumeExpansion: {}\n"
	phaseSnapshots    = "snapshotCreation: {}\n"
	phaseModification = "volumeModification: {mutableParameters: [readAheadKiB]}\n"
)

// provisionerWithPhases is provisioner(name) with extra top-level spec keys.
func provisionerWithPhases(name, uid string, generation int64, phases ...string) *unstructured.Unstructured {
	u := provisioner(name, uid, generation)
	for _, p := range phases {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(p), &m); err != nil {
			panic(err)
		}
		for k, v := range m {
			u.Object["spec"].(map[string]any)[k] = v
		}
	}
	return u
}

func typed(t *testing.T, u *unstructured.Unstructured) *v1alpha1.PavProvisioner {
	t.Helper()
	p := &v1alpha1.PavProvisioner{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func controllerContainers(o *Objects) []string {
	var names []string
	for _, c := range o.Controller.Spec.Template.Spec.Containers {
		names = append(names, c.Name)
	}
	return names
}

// A provisioner's controller pod gets csi-resizer only with spec.volumeExpansion
// or spec.volumeModification (external-resizer serves both) and csi-snapshotter
// only with spec.snapshotCreation: the stock sidecars exit when the driver
// lacks the capability. An invalid spec counts by its last valid version, the
// one the drivers fall back to.
func TestSidecarsFollowPhases(t *testing.T) {
	base := []string{containerPav, containerProvision}
	// livenessprobe, last in the manifest, runs in every controller pod.
	with := func(sidecars ...string) []string {
		return append(append(slices.Clone(base), sidecars...), containerLiveness)
	}
	invalid := func(lastValid ...string) *v1alpha1.PavProvisioner {
		saved := typed(t, provisionerWithPhases("p1", "uid-1", 1, lastValid...))
		p := typed(t, provisionerWithPhases("p1", "uid-1", 2, phaseExpansion, phaseSnapshots))
		p.Spec.VolumeStaging = typed(t, provisionerWith("p1", "uid-1", 2, "{{ oops")).Spec.VolumeStaging
		if lastValid != nil {
			p.Status.LastValidSpec, p.Status.LastValidGeneration = &saved.Spec, 1
		}
		return p
	}
	for _, tc := range []struct {
		name string
		p    *v1alpha1.PavProvisioner
		want []string
	}{
		{"no phases", typed(t, provisioner("p1", "uid-1", 1)), with()},
		{"expansion", typed(t, provisionerWithPhases("p1", "uid-1", 1, phaseExpansion)), with(containerResizer)},
		{"snapshots", typed(t, provisionerWithPhases("p1", "uid-1", 1, phaseSnapshots)), with(containerSnapshot)},
		{"both", typed(t, provisionerWithPhases("p1", "uid-1", 1, phaseExpansion, phaseSnapshots)),
			with(containerResizer, containerSnapshot)},
		{"online expansion is expansion", typed(t, provisionerWithPhases("p1", "uid-1", 1, "volumeExpansion: {online: false}\n")),
			with(containerResizer)},
		{"modification alone", typed(t, provisionerWithPhases("p1", "uid-1", 1, phaseModification)), with(containerResizer)},
		{"modification and expansion: one resizer", typed(t, provisionerWithPhases("p1", "uid-1", 1, phaseModification, phaseExpansion)),
			with(containerResizer)},
		{"modification and snapshots", typed(t, provisionerWithPhases("p1", "uid-1", 1, phaseModification, phaseSnapshots)),
			with(containerResizer, containerSnapshot)},
		{"invalid, last valid had modification", invalid(phaseModification), with(containerResizer)},
		{"invalid, last valid had expansion", invalid(phaseExpansion), with(containerResizer)},
		{"invalid, last valid had none", invalid(""), with()},
		{"invalid, nothing valid known", invalid(), with()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := Render(tc.p, ns, Settings{})
			if err != nil {
				t.Fatal(err)
			}
			if got := controllerContainers(o); !slices.Equal(got, tc.want) {
				t.Errorf("controller containers %v, want %v", got, tc.want)
			}
		})
	}
}

// The sidecars get their settings like the other containers.
func TestSidecarSettings(t *testing.T) {
	level := 4
	s := Settings{Images: Images{CSIResizer: "r/resizer:1", CSISnapshotter: "r/snap:2", LivenessProbe: "r/probe:3"}, ImagePullPolicy: "Never", LogLevel: &level}
	o, err := Render(typed(t, provisionerWithPhases("p1", "uid-1", 1, phaseExpansion, phaseSnapshots)), ns, s)
	if err != nil {
		t.Fatal(err)
	}
	c := containers(o)
	for name, want := range map[string]string{"controller/csi-resizer": "r/resizer:1", "controller/csi-snapshotter": "r/snap:2"} {
		ct := c[name]
		if ct == nil {
			t.Fatalf("no %s", name)
		}
		if ct.Image != want || ct.ImagePullPolicy != "Never" || !slices.Contains(ct.Args, "--v=4") {
			t.Errorf("%s: image %s, pull policy %v, args %v", name, ct.Image, ct.ImagePullPolicy, ct.Args)
		}
		if !slices.Contains(ct.Args, "--csi-address=/csi/csi.sock") || !slices.Contains(ct.Args, "--leader-election") {
			t.Errorf("%s args %v: not on the driver's socket with leader election", name, ct.Args)
		}
	}
	for _, name := range []string{"controller/liveness-probe", "node/liveness-probe"} {
		ct := c[name]
		if ct == nil || ct.Image != "r/probe:3" || ct.ImagePullPolicy != "Never" || !slices.Contains(ct.Args, "--v=4") ||
			!slices.Contains(ct.Args, "--csi-address=/csi/csi.sock") {
			t.Errorf("%s = %+v: want image r/probe:3, pull policy Never, --v=4, on the driver's socket", name, ct)
		}
	}
	if !slices.Contains(c["controller/csi-snapshotter"].Args, "--extra-create-metadata") {
		t.Errorf("csi-snapshotter args %v", c["controller/csi-snapshotter"].Args)
	}
}

// Adding a phase to the spec adds its sidecar to the StatefulSet, removing it
// removes the sidecar; either changes the features annotation, which rolls the
// node plugins too (kubelet and the sidecars read capabilities only at start);
// an edit that changes no feature leaves both workloads alone.
func TestPhaseEditUpdatesStatefulSet(t *testing.T) {
	f := newFixture(t, Settings{})
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	names := func() []string {
		var n []string
		for _, c := range f.statefulSet("p1").Spec.Template.Spec.Containers {
			n = append(n, c.Name)
		}
		return n
	}
	if got := names(); !slices.Equal(got, []string{containerPav, containerProvision, containerLiveness}) {
		t.Fatalf("containers %v", got)
	}
	for _, step := range []struct {
		name       string
		gen        int64
		phases     []string
		want       []string
		wantWrites []string
		features   string
	}{
		{"add both", 2, []string{phaseExpansion, phaseSnapshots}, []string{containerPav, containerProvision, containerResizer, containerSnapshot, containerLiveness},
			[]string{"apply daemonsets pav-p1-node", "apply pavprovisioners/status p1", "apply statefulsets pav-p1-controller"}, "expansion=online,snapshots"},
		{"other edit", 3, []string{phaseExpansion, phaseSnapshots, "snapshotDeletion: {}\n"}, []string{containerPav, containerProvision, containerResizer, containerSnapshot, containerLiveness},
			[]string{"apply pavprovisioners/status p1"}, "expansion=online,snapshots"},
		{"drop snapshots", 4, []string{phaseExpansion}, []string{containerPav, containerProvision, containerResizer, containerLiveness},
			[]string{"apply daemonsets pav-p1-node", "apply pavprovisioners/status p1", "apply statefulsets pav-p1-controller"}, "expansion=online"},
		{"expansion for modification: the resizer stays", 5, []string{phaseModification}, []string{containerPav, containerProvision, containerResizer, containerLiveness},
			[]string{"apply daemonsets pav-p1-node", "apply pavprovisioners/status p1", "apply statefulsets pav-p1-controller"}, "modification=readAheadKiB"},
		{"drop modification", 6, nil, []string{containerPav, containerProvision, containerLiveness},
			[]string{"apply daemonsets pav-p1-node", "apply pavprovisioners/status p1", "apply statefulsets pav-p1-controller"}, "none"},
	} {
		f.edit("p1", func(u *unstructured.Unstructured) {
			u.Object["spec"] = provisionerWithPhases("p1", "uid-1", step.gen, step.phases...).Object["spec"]
			u.SetGeneration(step.gen)
		})
		mustReconcile(t, f, "p1")
		if got := names(); !slices.Equal(got, step.want) {
			t.Errorf("%s: containers %v, want %v", step.name, got, step.want)
		}
		if c, n := f.statefulSet("p1").Spec.Template.Annotations[AnnotationFeatures], f.daemonSet("p1").Spec.Template.Annotations[AnnotationFeatures]; c != step.features || n != step.features {
			t.Errorf("%s: features annotations %q (controller), %q (node), want %q", step.name, c, n, step.features)
		}
		wantWrites(t, f, step.wantWrites...)
	}
}

// The features annotation names every feature a spec has (so that an edit
// that adds, removes or changes one rolls the drivers) and nothing for the
// ones it lacks (so that an upgrade leaves older specs' drivers alone).
func TestFeatureSummary(t *testing.T) {
	const pod = "{spec: {containers: [{name: c, image: b}]}}"
	for _, tc := range []struct {
		name   string
		phases []string
		want   string
	}{
		{"none", nil, "none"},
		{"expansion and snapshots", []string{phaseExpansion, phaseSnapshots}, "expansion=online,snapshots"},
		{"maxVolumesPerNode", []string{"maxVolumesPerNode: 32\n"}, "maxvolumes=32"},
		{"capacity, default refresh", []string{"storageCapacity: {podTemplate: " + pod + "}\n"}, "capacity=1m0s"},
		{"capacity refresh", []string{"storageCapacity: {refreshInterval: 90s, podTemplate: " + pod + "}\n"}, "capacity=1m30s"},
		{"modification", []string{"volumeModification: {mutableParameters: [readAheadKiB]}\n"}, "modification=readAheadKiB"},
		{"modification keys sorted", []string{"volumeModification: {mutableParameters: [tier, iops, example.com/qos]}\n"}, "modification=example.com/qos+iops+tier"},
		{"modification keys escaped", []string{"volumeModification: {mutableParameters: [\"a+b\", \"c,d\", \"e%f\"]}\n"}, "modification=a%2Bb+c%2Cd+e%25f"},
		{"group snapshots", []string{phaseSnapshots, "groupSnapshotCreation: {}\ngroupSnapshotDeletion: {}\n"}, "snapshots,groupsnapshots"},
		{"snapshot metadata", []string{phaseSnapshots, "snapshotMetadata: {podTemplate: " + pod + "}\n"}, "snapshots,snapshotmetadata"},
		{"ephemeral", []string{"provisioningModes: [Dynamic, Static, Ephemeral]\n"}, "ephemeral"},
		{"everything", []string{phaseExpansion, phaseSnapshots, "volumeNodeExpansion: {podTemplate: " + pod + "}\n",
			"volumeCreation: {capacity: 1Gi, contentSources: [Volume, Snapshot]}\ntopology: {nodeLabels: [kubernetes.io/hostname]}\n",
			"maxVolumesPerNode: 2\nstorageCapacity: {refreshInterval: 10s, podTemplate: " + pod + "}\nvolumeModification: {mutableParameters: [iops]}\n",
			"groupSnapshotCreation: {}\nsnapshotMetadata: {podTemplate: " + pod + "}\nprovisioningModes: [Ephemeral, Dynamic]\n"},
			"expansion=online,nodeexpansion,snapshots,sources=Snapshot+Volume,topology=kubernetes.io/hostname," +
				"capacity=10s,modification=iops,groupsnapshots,snapshotmetadata,maxvolumes=2,ephemeral"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := typed(t, provisionerWithPhases("p1", "uid-1", 1, tc.phases...))
			if got := featureSummary(features(p)); got != tc.want {
				t.Errorf("featureSummary = %q, want %q", got, tc.want)
			}
		})
	}
	// Two different key sets never share a summary.
	a := featureSummary(phase.Features{Modification: true, MutableParameters: []string{"a+b"}})
	b := featureSummary(phase.Features{Modification: true, MutableParameters: []string{"a", "b"}})
	if a == b {
		t.Errorf("[a+b] and [a, b] both summarize as %q", a)
	}
}
