package manager

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/kubeconfig"
)

func renderP1(t *testing.T, s Settings) *Objects {
	t.Helper()
	o, err := Render(&v1alpha1.PavProvisioner{ObjectMeta: metav1.ObjectMeta{Name: "p1", UID: "uid-1"}}, "pav-system", s)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// containers of the rendered objects by "<workload>/<container>".
func containers(o *Objects) map[string]*corev1.Container {
	m := map[string]*corev1.Container{}
	for _, w := range []struct {
		name string
		spec *corev1.PodSpec
	}{{"controller", &o.Controller.Spec.Template.Spec}, {"node", &o.Node.Spec.Template.Spec}} {
		for i := range w.spec.Containers {
			m[w.name+"/"+w.spec.Containers[i].Name] = &w.spec.Containers[i]
		}
	}
	return m
}

func TestRenderAppliesSettings(t *testing.T) {
	defaults := renderP1(t, Settings{})
	level, timeout := 5, PodTimeout{time.Minute}
	big := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}}
	for _, tc := range []struct {
		name  string
		s     Settings
		check func(t *testing.T, o *Objects)
	}{
		{"nothing set keeps the manifests", Settings{}, func(t *testing.T, o *Objects) {
			c := containers(o)
			if c["controller/pav"].Image != "ghcr.io/pods-as-volumes/pav:v0.2.0" || c["node/pav"].ImagePullPolicy != "" ||
				!slices.Contains(c["controller/pav"].Args, "--v=2") || o.Node.Spec.Template.Spec.Tolerations == nil {
				t.Errorf("defaults changed: %+v", c["controller/pav"])
			}
		}},
		{"images", Settings{Images: Images{Pav: "r/pav:1", CSIProvisioner: "r/prov:2", NodeDriverRegistrar: "r/reg:3"}}, func(t *testing.T, o *Objects) {
			c := containers(o)
			for name, want := range map[string]string{"controller/pav": "r/pav:1", "node/pav": "r/pav:1",
				"controller/csi-provisioner": "r/prov:2", "node/node-driver-registrar": "r/reg:3"} {
				if c[name].Image != want {
					t.Errorf("%s image %s, want %s", name, c[name].Image, want)
				}
			}
		}},
		{"pull policy", Settings{ImagePullPolicy: corev1.PullNever}, func(t *testing.T, o *Objects) {
			for name, c := range containers(o) {
				if c.ImagePullPolicy != corev1.PullNever {
					t.Errorf("%s pull policy %v", name, c.ImagePullPolicy)
				}
			}
		}},
		{"log level everywhere, once", Settings{LogLevel: &level}, func(t *testing.T, o *Objects) {
			for name, c := range containers(o) {
				n := 0
				for _, a := range c.Args {
					if strings.HasPrefix(a, "--v=") {
						n++
						if a != "--v=5" {
							t.Errorf("%s: %s", name, a)
						}
					}
				}
				if n != 1 {
					t.Errorf("%s has %d --v flags: %v", name, n, c.Args)
				}
			}
		}},
		{"pod timeout for the drivers only", Settings{PodTimeout: &timeout}, func(t *testing.T, o *Objects) {
			for name, c := range containers(o) {
				has := slices.Contains(c.Args, "--pod-timeout=1m0s")
				if has != strings.HasSuffix(name, "/pav") {
					t.Errorf("%s args %v", name, c.Args)
				}
			}
		}},
		{"pod report for both plugins", Settings{PodReport: "sidecar"}, func(t *testing.T, o *Objects) {
			for name, c := range containers(o) {
				if has := slices.Contains(c.Args, "--pod-report=sidecar"); has != (name == "controller/pav" || name == "node/pav") {
					t.Errorf("%s args %v", name, c.Args)
				}
			}
		}},
		{"forgotten-staging grace for the node plugin only", Settings{NodePlugin: NodePlugin{UnstageForgottenAfter: &ForgottenGrace{30 * time.Second}}}, func(t *testing.T, o *Objects) {
			for name, c := range containers(o) {
				if has := slices.Contains(c.Args, "--unstage-forgotten-after=30s"); has != (name == "node/pav") {
					t.Errorf("%s args %v", name, c.Args)
				}
			}
		}},
		{"staging ahead turned off, for the node plugin only", Settings{NodePlugin: NodePlugin{StageAhead: new(false)}}, func(t *testing.T, o *Objects) {
			for name, c := range containers(o) {
				if has := slices.Contains(c.Args, "--stage-ahead=false"); has != (name == "node/pav") {
					t.Errorf("%s args %v", name, c.Args)
				}
			}
		}},
		{"API client rate of every container that talks to the API", Settings{KubeAPI: &kubeconfig.Rate{QPS: 200.5, Burst: 400}}, func(t *testing.T, o *Objects) {
			for name, c := range containers(o) {
				var got []string
				for _, a := range c.Args {
					if strings.HasPrefix(a, "--kube-api-") {
						got = append(got, a)
					}
				}
				want := []string{"--kube-api-qps=200.5", "--kube-api-burst=400"}
				if name == "node/node-driver-registrar" || strings.HasSuffix(name, "/liveness-probe") {
					want = nil // they make no API request
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: %v, want %v", name, got, want)
				}
			}
		}},
		{"node selector and tolerations", Settings{NodePlugin: NodePlugin{NodeSelector: map[string]string{"disk": "yes"},
			Tolerations: []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpEqual, Value: "x", Effect: corev1.TaintEffectNoSchedule}}}},
			func(t *testing.T, o *Objects) {
				spec := o.Node.Spec.Template.Spec
				if spec.NodeSelector["disk"] != "yes" || len(spec.Tolerations) != 1 || spec.Tolerations[0].Key != "gpu" ||
					spec.Tolerations[0].Effect != corev1.TaintEffectNoSchedule {
					t.Errorf("node spec %+v %+v", spec.NodeSelector, spec.Tolerations)
				}
				if o.Controller.Spec.Template.Spec.NodeSelector != nil {
					t.Error("the controller got the node plugin's selector")
				}
			}},
		{"empty tolerations remove the manifest's", Settings{NodePlugin: NodePlugin{Tolerations: []corev1.Toleration{}}}, func(t *testing.T, o *Objects) {
			if o.Node.Spec.Template.Spec.Tolerations != nil {
				t.Errorf("tolerations %v", o.Node.Spec.Template.Spec.Tolerations)
			}
		}},
		{"resources of one container", Settings{Resources: Resources{Node: &big}}, func(t *testing.T, o *Objects) {
			c := containers(o)
			got := c["node/pav"].Resources
			if got.Limits[corev1.ResourceMemory] != resource.MustParse("128Mi") {
				t.Errorf("node/pav resources %+v", got)
			}
			if mustJSON(t, c["controller/pav"].Resources) != mustJSON(t, containers(defaults)["controller/pav"].Resources) {
				t.Error("the controller's resources changed too")
			}
		}},
		{"empty resources remove the manifest's", Settings{Resources: Resources{Controller: &corev1.ResourceRequirements{}}}, func(t *testing.T, o *Objects) {
			// Applied as an empty object: the manager owns no request or limit any more.
			if r := containers(o)["controller/pav"].Resources; r.Requests != nil || r.Limits != nil {
				t.Errorf("resources %+v", r)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := renderP1(t, tc.s)
			if o.Controller.Namespace != "pav-system" || o.Node.Namespace != "pav-system" {
				t.Error("the workloads are not in the manager's namespace")
			}
			tc.check(t, o)
		})
	}
}

// The manager's settings shipped in deploy/ and in the e2e install overlay load.
func TestShippedSettingsLoad(t *testing.T) {
	for _, f := range []string{"../../deploy/manager/config.yaml", "../../test/e2e/install/config.yaml"} {
		s, err := LoadSettings(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if s.Images.Pav == "" || s.ImagePullPolicy == "" || s.LogLevel == nil || s.PodTimeout == nil {
			t.Errorf("%s: %+v", f, s)
		}
	}
}

func TestSettingsErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ yaml, want string }{
		{"imagePulPolicy: Never\n", `unknown field "imagePulPolicy"`},
		{"images: {pav: x, registrar: y}\n", `unknown field "images.registrar"`},
		{"imagePullPolicy: Sometimes\n", "imagePullPolicy must be Always, IfNotPresent or Never"},
		{"logLevel: 11\n", "logLevel must be between 0 and 10"},
		{"podTimeout: -1m\n", "podTimeout must not be negative"},
		{"kubeAPI: {qps: 0, burst: 10}\n", "kubeAPI (qps, burst) sets every container's flags: --kube-api-qps must be positive, got 0"},
		{"kubeAPI: {qps: 20}\n", "kubeAPI (qps, burst) sets every container's flags: --kube-api-burst must be at least 1, got 0"},
		{"podTimeout: soon\n", `podTimeout must be a duration such as 10m or 90s, got "soon"`},
		{"podReport: fast\n", `podReport must be auto, exec or sidecar, got "fast"`},
		{"nodePlugin: {unstageForgottenAfter: -1m}\n", "nodePlugin.unstageForgottenAfter must not be negative"},
		{"nodePlugin: {unstageForgottenAfter: later}\n", `nodePlugin.unstageForgottenAfter must be a duration such as 10m or 90s, got "later"`},
		{"resources: {node: {requests: {memory: 2Gi}, limits: {memory: 1Gi}}}\n", "resources.node: the memory request 2Gi is above its limit 1Gi"},
	} {
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadSettings(path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.want)
		}
	}
	if _, err := LoadSettings(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("a missing file loaded")
	}
}

func TestOverrides(t *testing.T) {
	base := Settings{Images: Images{Pav: "a", CSIProvisioner: "b"}, ImagePullPolicy: corev1.PullAlways}
	none := Overrides{LogLevel: -1, PodTimeout: -1}
	if s, err := none.Apply(base); err != nil || mustJSON(t, s) != mustJSON(t, base) {
		t.Errorf("no overrides changed %+v: %v", s, err)
	}
	o := Overrides{PavImage: "x", ImagePullPolicy: "Never", LogLevel: 0, PodTimeout: 0}
	s, err := o.Apply(base)
	if err != nil || s.Images.Pav != "x" || s.Images.CSIProvisioner != "b" || s.ImagePullPolicy != corev1.PullNever ||
		*s.LogLevel != 0 || s.PodTimeout.Duration != 0 {
		t.Errorf("overrides: %+v, %v", s, err)
	}
	if _, err := (Overrides{ImagePullPolicy: "nope", LogLevel: -1, PodTimeout: -1}).Apply(base); err == nil {
		t.Error("a bad override was accepted")
	}
}

func TestSetArg(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []string
	}{
		{[]string{"a", "--v=2", "b"}, []string{"a", "--v=7", "b"}},
		{[]string{"a"}, []string{"a", "--v=7"}},
		{[]string{"--v=1", "--v=2"}, []string{"--v=7"}},
		{[]string{"--vv=1"}, []string{"--vv=1", "--v=7"}},
	} {
		if got := setArg(tc.in, "--v", "7"); !slices.Equal(got, tc.want) {
			t.Errorf("setArg(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
