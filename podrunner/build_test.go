package podrunner_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/podrunner"
)

func TestPodName(t *testing.T) {
	long := strings.Repeat("p", 63)
	cases := []struct {
		prov  string
		phase v1alpha1.Phase
		key   string
	}{
		{"hello", v1alpha1.PhaseCreation, "pvc-1234"},
		{"hello", v1alpha1.PhaseDeletion, "pvc-1234"},
		{"hello", v1alpha1.PhaseCreation, "pvc-1235"},
		{"other", v1alpha1.PhaseCreation, "pvc-1234"},
		{long, v1alpha1.PhaseValidation, "pvc-1234"},
		{long + "x", v1alpha1.PhaseValidation, "pvc-1234"}, // same truncated prefix as long
		{long, v1alpha1.PhaseUnstaging, "handle@" + strings.Repeat("n", 253)},
		{"Weird.Name_x", v1alpha1.PhaseStaging, "h@node"},
		{"", v1alpha1.PhaseCreation, ""},
	}
	seen := map[string]int{}
	for i, c := range cases {
		name := podrunner.PodName(c.prov, c.phase, c.key)
		if again := podrunner.PodName(c.prov, c.phase, c.key); again != name {
			t.Errorf("%d: not deterministic: %q vs %q", i, name, again)
		}
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Errorf("%d: %q is not a DNS label: %v", i, name, errs)
		}
		if len(name) > 63 {
			t.Errorf("%d: %q longer than 63", i, name)
		}
		if !strings.HasPrefix(name, "pav-") || !strings.Contains(name, "-"+string(c.phase)+"-") {
			t.Errorf("%d: %q does not read pav-<provisioner>-<phase>-<hash>", i, name)
		}
		if j, dup := seen[name]; dup {
			t.Errorf("%d and %d collide on %q", j, i, name)
		}
		seen[name] = i
	}
	if got := podrunner.PodName("hello", v1alpha1.PhaseCreation, "k"); !strings.HasPrefix(got, "pav-hello-creation-") || len(got) != len("pav-hello-creation-")+16 {
		t.Errorf("unexpected shape %q", got)
	}
}

// Every phase, however long its name, gives a valid pod name that reads
// pav-<provisioner>-<phase, cut at 12 characters>-<hash>, distinct from
// every other phase's for the same provisioner and volume: phases that share
// their first 12 characters (groupsnapshotcreation, groupsnapshotdeletion)
// differ by the hash, which covers the whole phase.
func TestPodNameOfEveryPhase(t *testing.T) {
	for _, prov := range []string{"hello", strings.Repeat("p", 63)} {
		seen := map[string]v1alpha1.Phase{}
		for _, ph := range v1alpha1.Phases {
			name := podrunner.PodName(prov, ph, "pvc-1234")
			if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
				t.Errorf("%s: %q is not a DNS label: %v", ph, name, errs)
			}
			cut := string(ph)
			if len(cut) > 12 {
				cut = cut[:12]
			}
			if !strings.Contains(name, "-"+cut+"-") {
				t.Errorf("%s: %q does not name the phase (%s)", ph, name, cut)
			}
			if q, dup := seen[name]; dup {
				t.Errorf("%s and %s collide on %q", q, ph, name)
			}
			seen[name] = ph
			if errs := validation.IsValidLabelValue(string(ph)); len(errs) > 0 {
				t.Errorf("%s is not a valid value of %s: %v", ph, podrunner.LabelPhase, errs)
			}
		}
	}
}

func TestNodeLabel(t *testing.T) {
	for _, node := range []string{"node-1", "worker.example.com", strings.Repeat("a", 63), strings.Repeat("a", 64),
		strings.Repeat("sub.", 60) + "x", "-odd-"} {
		l := podrunner.NodeLabel(node)
		if errs := validation.IsValidLabelValue(l); len(errs) > 0 || l == "" {
			t.Errorf("NodeLabel(%q) = %q: %v", node, l, errs)
		}
		if len(validation.IsValidLabelValue(node)) == 0 && l != node {
			t.Errorf("NodeLabel(%q) = %q, want the name itself", node, l)
		}
		if podrunner.NodeLabel(node) != l {
			t.Errorf("NodeLabel(%q) not deterministic", node)
		}
	}
	if podrunner.NodeLabel(strings.Repeat("a", 70)) == podrunner.NodeLabel(strings.Repeat("a", 71)) {
		t.Error("long node names collide")
	}
	if l := podrunner.VolumeLabel("some/handle with spaces"); len(validation.IsValidLabelValue(l)) > 0 {
		t.Errorf("VolumeLabel not label-safe: %q", l)
	}
}

func privileged(c corev1.Container) corev1.Container {
	t := true
	c.SecurityContext = &corev1.SecurityContext{Privileged: &t}
	return c
}

func baseTemplate() corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Name:         "ignored",
			GenerateName: "ignored-",
			Labels:       map[string]string{"app": "mine", podrunner.LabelProvisioner: "spoofed"},
			Annotations:  map[string]string{"note": "kept"},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:  corev1.RestartPolicyAlways, // overridden
			InitContainers: []corev1.Container{{Name: "init", Image: "busybox"}},
			Containers: []corev1.Container{
				{Name: "main", Image: "busybox", VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}},
				privileged(corev1.Container{Name: "priv", Image: "busybox"}),
			},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
}

func pavMountOf(t *testing.T, c corev1.Container) corev1.VolumeMount {
	t.Helper()
	var found []corev1.VolumeMount
	for _, m := range c.VolumeMounts {
		if m.MountPath == podrunner.MountPath {
			found = append(found, m)
		}
	}
	if len(found) != 1 || found[0].Name != podrunner.VolumeName {
		t.Fatalf("container %q: want one %s mount of volume %q, got %+v", c.Name, podrunner.MountPath, podrunner.VolumeName, c.VolumeMounts)
	}
	return found[0]
}

func propagation(m corev1.VolumeMount) string {
	if m.MountPropagation == nil {
		return ""
	}
	return string(*m.MountPropagation)
}

func TestBuildPod(t *testing.T) {
	type check func(t *testing.T, pod *corev1.Pod)
	staging := podrunner.Operation{
		Provisioner: "hello", Phase: v1alpha1.PhaseStaging, VolumeKey: "vol-1@node-a",
		Template: baseTemplate(), NodeName: "node-a", HostPath: "/var/lib/pav/hello/vol-1", KeepRunning: true,
	}
	creation := podrunner.Operation{
		Provisioner: "hello", Phase: v1alpha1.PhaseCreation, VolumeKey: "pvc-1", Template: baseTemplate(), Token: "t0k3n",
	}
	forgedToken := creation
	forgedToken.Template = baseTemplate()
	forgedToken.Template.Annotations = map[string]string{podrunner.AnnotationToken: "chosen-by-the-template"}
	noToken := forgedToken
	noToken.Token = ""
	inNS := creation
	inNS.Template = baseTemplate()
	inNS.Template.Namespace = "storage"
	// KeepRunning on an emptyDir: readiness can only come out through the sidecar.
	keepRunning := creation
	keepRunning.Template = baseTemplate()
	keepRunning.KeepRunning = true

	cases := []struct {
		name  string
		op    podrunner.Operation
		check check
	}{
		{"creation: metadata", creation, func(t *testing.T, pod *corev1.Pod) {
			if pod.Name != podrunner.PodName("hello", v1alpha1.PhaseCreation, "pvc-1") {
				t.Errorf("name %q: template name must be ignored", pod.Name)
			}
			if pod.GenerateName != "" {
				t.Errorf("generateName %q kept", pod.GenerateName)
			}
			if pod.Namespace != "pav-system" {
				t.Errorf("namespace %q, want the runner's default, pav-system", pod.Namespace)
			}
			want := map[string]string{
				"app":                      "mine",
				podrunner.LabelProvisioner: "hello", // ours win
				podrunner.LabelPhase:       "creation",
				podrunner.LabelVolume:      podrunner.VolumeLabel("pvc-1"),
			}
			for k, v := range want {
				if pod.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, pod.Labels[k], v)
				}
			}
			if _, ok := pod.Labels[podrunner.LabelNode]; ok {
				t.Error("node label on a controller pod")
			}
			if pod.Annotations["note"] != "kept" || pod.Annotations[podrunner.AnnotationVolumeKey] != "pvc-1" ||
				pod.Annotations[podrunner.AnnotationToken] != "t0k3n" {
				t.Errorf("annotations %v", pod.Annotations)
			}
			if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Errorf("restartPolicy %q", pod.Spec.RestartPolicy)
			}
			if pod.Spec.NodeName != "" {
				t.Errorf("nodeName %q", pod.Spec.NodeName)
			}
		}},
		{"the token is pav's, never the template's", forgedToken, func(t *testing.T, pod *corev1.Pod) {
			if got := pod.Annotations[podrunner.AnnotationToken]; got != "t0k3n" {
				t.Errorf("token annotation %q, want the operation's", got)
			}
		}},
		{"no token (pav render): no token annotation, not even the template's", noToken, func(t *testing.T, pod *corev1.Pod) {
			if got, ok := pod.Annotations[podrunner.AnnotationToken]; ok {
				t.Errorf("token annotation %q", got)
			}
		}},
		{"creation: emptyDir, mounts without propagation", creation, func(t *testing.T, pod *corev1.Pod) {
			var vol *corev1.Volume
			for i := range pod.Spec.Volumes {
				if pod.Spec.Volumes[i].Name == podrunner.VolumeName {
					vol = &pod.Spec.Volumes[i]
				}
			}
			if vol == nil || vol.EmptyDir == nil || vol.HostPath != nil {
				t.Fatalf("pav volume %+v", vol)
			}
			if len(pod.Spec.Volumes) != 2 {
				t.Errorf("user volumes lost: %+v", pod.Spec.Volumes)
			}
			for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
				if m := pavMountOf(t, c); propagation(m) != "" {
					t.Errorf("%s: propagation %q on an emptyDir", c.Name, propagation(m))
				}
			}
			if len(pod.Spec.Containers[0].VolumeMounts) != 2 {
				t.Errorf("user mount lost: %+v", pod.Spec.Containers[0].VolumeMounts)
			}
		}},
		{"creation: report sidecar", creation, func(t *testing.T, pod *corev1.Pod) {
			if len(pod.Spec.InitContainers) != 2 {
				t.Fatalf("init containers %d", len(pod.Spec.InitContainers))
			}
			r := pod.Spec.InitContainers[0]
			if r.Name != podrunner.ReportContainer || r.Image != "registry/pav:1" {
				t.Fatalf("first init container %q image %q", r.Name, r.Image)
			}
			if r.RestartPolicy == nil || *r.RestartPolicy != corev1.ContainerRestartPolicyAlways {
				t.Error("report is not a native sidecar")
			}
			if strings.Join(r.Command, " ") != "pav-report --dir=/pav" {
				t.Errorf("command %q", r.Command)
			}
			if r.TerminationMessagePolicy != corev1.TerminationMessageReadFile || r.TerminationMessagePath != "/dev/termination-log" {
				t.Errorf("termination message %q %q", r.TerminationMessagePolicy, r.TerminationMessagePath)
			}
			if r.ReadinessProbe != nil {
				t.Error("readiness probe on a run-to-completion pod")
			}
			if !pavMountOf(t, r).ReadOnly {
				t.Error("report mount should be read-only")
			}
			if r.Resources.Requests.Memory().IsZero() || r.Resources.Limits.Memory().IsZero() {
				t.Error("report sidecar without resources")
			}
			// 4 containers: 12 KiB / 4 = 3072 bytes for the report.
			if len(r.Env) != 1 || r.Env[0].Value != "3072" {
				t.Errorf("report budget env %+v", r.Env)
			}
			if pod.Spec.InitContainers[1].Name != "init" {
				t.Error("user init container moved")
			}
		}},
		{"template namespace", inNS, func(t *testing.T, pod *corev1.Pod) {
			if pod.Namespace != "storage" {
				t.Errorf("namespace %q", pod.Namespace)
			}
		}},
		{"keepRunning emptyDir: the sidecar probes /pav/ready", keepRunning, func(t *testing.T, pod *corev1.Pod) {
			if pod.Spec.InitContainers[0].Name != podrunner.ReportContainer {
				t.Fatalf("first init container %q, want the report sidecar", pod.Spec.InitContainers[0].Name)
			}
			p := pod.Spec.InitContainers[0].ReadinessProbe
			if p == nil || p.Exec == nil || strings.Join(p.Exec.Command, " ") != "pav-report --dir=/pav --check-ready" || p.PeriodSeconds != 1 {
				t.Errorf("readiness probe %+v", p)
			}
		}},
		{"staging: node, hostPath, propagation, no sidecar", staging, func(t *testing.T, pod *corev1.Pod) {
			if pod.Spec.NodeName != "node-a" || pod.Labels[podrunner.LabelNode] != "node-a" {
				t.Errorf("nodeName %q, label %q", pod.Spec.NodeName, pod.Labels[podrunner.LabelNode])
			}
			var vol corev1.Volume
			for _, v := range pod.Spec.Volumes {
				if v.Name == podrunner.VolumeName {
					vol = v
				}
			}
			if vol.HostPath == nil || vol.HostPath.Path != "/var/lib/pav/hello/vol-1" ||
				vol.HostPath.Type == nil || *vol.HostPath.Type != corev1.HostPathDirectoryOrCreate {
				t.Fatalf("pav volume %+v", vol)
			}
			want := map[string]string{
				"init": "HostToContainer",
				"main": "HostToContainer",
				"priv": "Bidirectional",
			}
			for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
				// The node plugin reads this /pav itself (files, and ready
				// through inotify): no sidecar, no probe, no pav image.
				if c.Name == podrunner.ReportContainer || c.ReadinessProbe != nil || c.Image == "registry/pav:1" {
					t.Errorf("node pod has pav's %s (image %s, probe %v)", c.Name, c.Image, c.ReadinessProbe)
				}
				if got := propagation(pavMountOf(t, c)); got != want[c.Name] {
					t.Errorf("%s: propagation %q, want %q", c.Name, got, want[c.Name])
				}
			}
			if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
				t.Error("KeepRunning pods must not restart either")
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := c.op.Template.DeepCopy()
			pod, err := podrunner.BuildPod(c.op, podrunner.PodConfig{ReportImage: "registry/pav:1", DefaultNamespace: "pav-system"})
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, pod)
			if c.op.Template.Labels[podrunner.LabelProvisioner] != before.Labels[podrunner.LabelProvisioner] ||
				len(c.op.Template.Spec.Volumes) != len(before.Spec.Volumes) ||
				len(c.op.Template.Spec.Containers[0].VolumeMounts) != len(before.Spec.Containers[0].VolumeMounts) {
				t.Error("the template was mutated")
			}
		})
	}
}

func TestBuildPodRefuses(t *testing.T) {
	op := func(mod func(op *podrunner.Operation)) podrunner.Operation {
		o := podrunner.Operation{Provisioner: "hello", Phase: v1alpha1.PhaseCreation, VolumeKey: "pvc-1", Template: baseTemplate()}
		mod(&o)
		return o
	}
	cases := []struct {
		name    string
		op      podrunner.Operation
		image   string
		wantErr string
	}{
		{"user volume named pav", op(func(o *podrunner.Operation) {
			o.Template.Spec.Volumes = append(o.Template.Spec.Volumes, corev1.Volume{Name: "pav"})
		}), "img", `declares a volume named "pav"`},
		{"user mount at /pav", op(func(o *podrunner.Operation) {
			o.Template.Spec.Containers[0].VolumeMounts = append(o.Template.Spec.Containers[0].VolumeMounts,
				corev1.VolumeMount{Name: "data", MountPath: "/pav/"})
		}), "img", `container "main" mounts volume "data" at /pav`},
		{"init mount at /pav", op(func(o *podrunner.Operation) {
			o.Template.Spec.InitContainers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/pav"}}
		}), "img", `init container "init" mounts`},
		{"container named pav-report", op(func(o *podrunner.Operation) {
			o.Template.Spec.Containers[0].Name = podrunner.ReportContainer
		}), "img", "reserves for its report sidecar"},
		{"conflicting nodeName", op(func(o *podrunner.Operation) {
			o.NodeName = "a"
			o.Template.Spec.NodeName = "b"
		}), "img", `pins the pod to node "b"`},
		{"hostPath without node", op(func(o *podrunner.Operation) { o.HostPath = "/x" }), "img", "without a node"},
		{"relative hostPath", op(func(o *podrunner.Operation) { o.HostPath = "x"; o.NodeName = "n" }), "img", "not absolute"},
		{"no volume key", op(func(o *podrunner.Operation) { o.VolumeKey = "" }), "img", "no volume key"},
		{"no report image", op(func(o *podrunner.Operation) {}), "", "no report image"},
		{"owner in another namespace", op(func(o *podrunner.Operation) {
			o.Owner, o.OwnerNamespace = &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "ctrl", UID: "u"}, "pav"
			o.Template.Namespace = "tenant"
		}), "img", `owner Pod ctrl is in namespace "pav", the pod in "tenant"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := podrunner.BuildPod(c.op, podrunner.PodConfig{ReportImage: c.image})
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("err %v, want %q", err, c.wantErr)
			}
			if !errors.Is(err, podrunner.ErrInvalidOperation) {
				t.Errorf("err %v is not ErrInvalidOperation", err)
			}
		})
	}
}

func TestBuildPodReportBudget(t *testing.T) {
	for n, want := range map[int]int{1: 4096, 2: 4096, 3: 3072, 5: 2048, 11: 1024} {
		tmpl := corev1.PodTemplateSpec{}
		for i := range n {
			tmpl.Spec.Containers = append(tmpl.Spec.Containers, corev1.Container{Name: "c" + strconv.Itoa(i), Image: "x"})
		}
		pod, err := podrunner.BuildPod(podrunner.Operation{Provisioner: "p", Phase: v1alpha1.PhaseValidation, VolumeKey: "k", Template: tmpl}, podrunner.PodConfig{ReportImage: "img"})
		if err != nil {
			t.Fatal(err)
		}
		if got := pod.Spec.InitContainers[0].Env[0].Value; got != strconv.Itoa(want) {
			t.Errorf("%d containers: budget %s, want %d", n, got, want)
		}
	}
}

// ReportExec wraps the command of a pod that has exactly one container and
// states its command; every other controller-side pod keeps the sidecar, and
// node pods have neither.
// node makes op a node pod's: a staging pod on its node's host directory,
// discarded once it ends.
func node(op podrunner.Operation) podrunner.Operation {
	op.Phase, op.NodeName, op.HostPath, op.EndAtExit = v1alpha1.PhaseStaging, "n", "/var/lib/pav/v", true
	return op
}

func TestBuildPodReportExec(t *testing.T) {
	one := func(mod func(s *corev1.PodSpec)) podrunner.Operation {
		op := podrunner.Operation{Provisioner: "p", Phase: v1alpha1.PhaseCreation, VolumeKey: "pvc-1",
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				InitContainers: []corev1.Container{{Name: "init", Image: "busybox"}},
				Containers: []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"sh", "-c"}, Args: []string{"echo $(X)"},
					TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError}},
			}}}
		if mod != nil {
			mod(&op.Template.Spec)
		}
		return op
	}
	always := corev1.ContainerRestartPolicyAlways
	cases := []struct {
		name string
		op   podrunner.Operation
		mode podrunner.ReportMode
		want string // "exec", "sidecar" or "none"
	}{
		{"one container with a command", one(nil), podrunner.ReportExec, "exec"},
		{"the sidecar mode", one(nil), podrunner.ReportSidecar, "sidecar"},
		{"no mode", one(nil), "", "sidecar"},
		{"the image's entrypoint", one(func(s *corev1.PodSpec) { s.Containers[0].Command = nil }), podrunner.ReportExec, "sidecar"},
		{"two containers", one(func(s *corev1.PodSpec) {
			s.Containers = append(s.Containers, corev1.Container{Name: "aux", Image: "busybox", Command: []string{"true"}})
		}), podrunner.ReportExec, "sidecar"},
		{"a sidecar of the user's", one(func(s *corev1.PodSpec) { s.InitContainers[0].RestartPolicy = &always }), podrunner.ReportExec, "sidecar"},
		{"a volume named pav-report", one(func(s *corev1.PodSpec) { s.Volumes = []corev1.Volume{{Name: podrunner.ReportVolume}} }),
			podrunner.ReportExec, "sidecar"},
		{"a mount under /.pav-report", one(func(s *corev1.PodSpec) {
			s.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "x", MountPath: podrunner.ReportDir + "/bin/"}}
		}), podrunner.ReportExec, "sidecar"},
		{"KeepRunning", func() podrunner.Operation { o := one(nil); o.KeepRunning = true; return o }(), podrunner.ReportExec, "sidecar"},
		{"a node pod", node(one(nil)), podrunner.ReportExec, "exec"},
		{"a node pod that may keep running", func() podrunner.Operation { o := node(one(nil)); o.KeepRunning = true; return o }(),
			podrunner.ReportExec, "exec"},
		{"a node pod in the sidecar mode", node(one(nil)), podrunner.ReportSidecar, "none"},
		{"a node pod waited for until it goes", func() podrunner.Operation {
			o := node(one(nil))
			o.Phase, o.EndAtExit = v1alpha1.PhaseUnstaging, false
			return o
		}(), podrunner.ReportExec, "none"},
		{"a node pod with the image's entrypoint", node(one(func(s *corev1.PodSpec) { s.Containers[0].Command = nil })),
			podrunner.ReportExec, "none"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pod, err := podrunner.BuildPod(c.op, podrunner.PodConfig{ReportImage: "registry/pav:1", Report: c.mode})
			if err != nil {
				t.Fatal(err)
			}
			name, wrapped := podrunner.Wrapped(pod)
			sidecar := false
			for _, ic := range pod.Spec.InitContainers {
				sidecar = sidecar || ic.Name == podrunner.ReportContainer
			}
			got := "none"
			switch {
			case wrapped && sidecar:
				t.Fatal("both the sidecar and a wrapped command")
			case wrapped:
				got = "exec"
			case sidecar:
				got = "sidecar"
			}
			if got != c.want {
				t.Fatalf("reports by %s, want %s", got, c.want)
			}
			if !wrapped {
				return
			}
			main := pod.Spec.Containers[0]
			// A success is also copied to /pav/.pav-ended, which the node
			// plugin of the pod's node relays.
			wantCmd := []string{podrunner.ReportExecPath, "--exec", "--dir=/pav", "--max-bytes=4096", "--ended-file=/pav/.pav-ended", "--", "sh", "-c"}
			wantTermination := corev1.TerminationMessageReadFile
			wantEnded := true
			if c.op.HostPath != "" {
				// The node plugin reads /pav itself: only the exit code is written.
				wantCmd = []string{podrunner.ReportExecPath, "--exec", "--dir=/pav", "--exit-file=/pav/.pav-exit", "--", "sh", "-c"}
				wantTermination = corev1.TerminationMessageFallbackToLogsOnError // the template's
				wantEnded = false
			}
			if vol, ctr, ok := podrunner.EndedFile(pod); ok != wantEnded || (ok && (vol != podrunner.VolumeName || ctr != "main")) {
				t.Errorf("EndedFile = %q, %q, %v; want %v", vol, ctr, ok, wantEnded)
			}
			if name != "main" || strings.Join(main.Command, " ") != strings.Join(wantCmd, " ") || strings.Join(main.Args, " ") != "echo $(X)" {
				t.Errorf("container %s runs %q %q, want %q with its args", name, main.Command, main.Args, wantCmd)
			}
			if main.TerminationMessagePolicy != wantTermination {
				t.Errorf("termination message %s, %s", main.TerminationMessagePath, main.TerminationMessagePolicy)
			}
			var vol *corev1.Volume
			for i := range pod.Spec.Volumes {
				if pod.Spec.Volumes[i].Name == podrunner.ReportVolume {
					vol = &pod.Spec.Volumes[i]
				}
			}
			if vol == nil || vol.Image == nil || vol.Image.Reference != "registry/pav:1" {
				t.Fatalf("no image volume of the report image: %+v", pod.Spec.Volumes)
			}
			mounted := false
			for _, m := range main.VolumeMounts {
				mounted = mounted || m.Name == podrunner.ReportVolume && m.MountPath == podrunner.ReportDir && m.ReadOnly
			}
			if !mounted {
				t.Errorf("the report image is not mounted read-only at %s: %+v", podrunner.ReportDir, main.VolumeMounts)
			}
			if c.op.Template.Spec.Containers[0].Command[0] != "sh" {
				t.Error("the template was mutated")
			}
		})
	}
}

// An operation's owner becomes the pod's only owner reference (the template's are
// never used), so that the garbage collector removes the pod with it.
func TestBuildPodOwner(t *testing.T) {
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "pav-x-controller-0", UID: "uid-ctrl"}
	tmpl := baseTemplate()
	tmpl.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "theirs", UID: "u2"}}
	op := podrunner.Operation{Provisioner: "x", Phase: v1alpha1.PhaseCapacity, VolumeKey: "capacity/1", Template: tmpl, Owner: &owner, OwnerNamespace: "pav"}
	pod, err := podrunner.BuildPod(op, podrunner.PodConfig{ReportImage: "img", DefaultNamespace: "pav"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0] != owner {
		t.Fatalf("owner references %+v, want only %+v", pod.OwnerReferences, owner)
	}
	op.Owner = nil
	if pod, err = podrunner.BuildPod(op, podrunner.PodConfig{ReportImage: "img", DefaultNamespace: "pav"}); err != nil || len(pod.OwnerReferences) != 0 {
		t.Fatalf("without an owner: %v, %+v", err, pod.OwnerReferences)
	}
}

// A node operation's volume key splits back into its handle and node, also
// for a handle that holds "@".
func TestNodeVolumeKey(t *testing.T) {
	for _, tc := range []struct{ handle, node string }{
		{"pvc-1", "node-a"},
		{"user@example/bucket", "n1"},
		{"", "n1"},
	} {
		key := podrunner.NodeVolumeKey(tc.handle, tc.node)
		if h, n, ok := podrunner.SplitNodeVolumeKey(key); !ok || h != tc.handle || n != tc.node {
			t.Errorf("SplitNodeVolumeKey(%q) = %q, %q, %v; want %q, %q", key, h, n, ok, tc.handle, tc.node)
		}
	}
	if _, _, ok := podrunner.SplitNodeVolumeKey("pvc-1"); ok {
		t.Error(`SplitNodeVolumeKey("pvc-1") splits a key without a node`)
	}
}
