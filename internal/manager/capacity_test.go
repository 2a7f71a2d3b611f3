package manager

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

const phaseCapacity = "storageCapacity: {refreshInterval: 30s, podTemplate: {spec: {containers: [{name: c, image: b}]}}}\n"

// capacityArgs are external-provisioner's capacity flags among args.
func capacityArgs(args []string) []string {
	var out []string
	for _, a := range args {
		for _, f := range []string{"--enable-capacity", "--capacity-", "--kube-api-capacity-"} {
			if len(a) >= len(f) && a[:len(f)] == f {
				out = append(out, a)
			}
		}
	}
	return out
}

func envFrom(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			return e.ValueFrom.FieldRef.FieldPath
		}
	}
	return ""
}

// A provisioner with spec.storageCapacity gets a CSIDriver with
// storageCapacity: true and an external-provisioner that publishes capacity
// (with the environment it needs); one without gets neither.
func TestCapacityTracking(t *testing.T) {
	for _, tc := range []struct {
		name   string
		phases []string
		want   []string // capacity flags; nil: none, and no CSIDriver storageCapacity
	}{
		{"without", nil, nil},
		{"with", []string{phaseCapacity}, []string{"--enable-capacity=true", "--capacity-ownerref-level=1", "--capacity-poll-interval=30s",
			"--kube-api-capacity-qps=5", "--kube-api-capacity-burst=10"}},
		{"default refresh", []string{"storageCapacity: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}\n"},
			[]string{"--enable-capacity=true", "--capacity-ownerref-level=1", "--capacity-poll-interval=1m0s",
				"--kube-api-capacity-qps=5", "--kube-api-capacity-burst=10"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			level := 3
			o, err := Render(typed(t, provisionerWithPhases("p1", "uid-1", 1, tc.phases...)), ns, Settings{LogLevel: &level})
			if err != nil {
				t.Fatal(err)
			}
			c := containers(o)["controller/csi-provisioner"]
			if got := capacityArgs(c.Args); !slices.Equal(got, tc.want) {
				t.Errorf("capacity flags %v, want %v", got, tc.want)
			}
			if !slices.Contains(c.Args, "--v=3") || !slices.Contains(c.Args, "--csi-address=/csi/csi.sock") {
				t.Errorf("args %v lost the others", c.Args)
			}
			sc := o.CSIDriver.Spec.StorageCapacity
			if tc.want == nil {
				if sc != nil || envFrom(c, "NAMESPACE") != "" || envFrom(c, "POD_NAME") != "" {
					t.Errorf("without storageCapacity: CSIDriver storageCapacity %v, env %v", sc, c.Env)
				}
				return
			}
			if sc == nil || !*sc {
				t.Errorf("CSIDriver storageCapacity %v, want true", sc)
			}
			if envFrom(c, "NAMESPACE") != "metadata.namespace" || envFrom(c, "POD_NAME") != "metadata.name" || envFrom(c, "POD_NAMESPACE") != "metadata.namespace" {
				t.Errorf("env %+v: want NAMESPACE, POD_NAME and POD_NAMESPACE from the downward API", c.Env)
			}
		})
	}
}

// Adding storageCapacity applies the CSIDriver (storageCapacity may change
// on a live one) and rolls both workloads; removing it undoes both.
func TestCapacityEdit(t *testing.T) {
	f := newFixture(t, Settings{})
	f.create(provisioner("p1", "uid-1", 1))
	mustReconcile(t, f, "p1")
	for _, step := range []struct {
		name       string
		gen        int64
		phases     []string
		want       bool
		wantWrites []string
	}{
		{"add", 2, []string{phaseCapacity}, true,
			[]string{"apply csidrivers p1", "apply daemonsets pav-p1-node", "apply pavprovisioners/status p1", "apply statefulsets pav-p1-controller"}},
		{"remove", 3, nil, false,
			[]string{"apply csidrivers p1", "apply daemonsets pav-p1-node", "apply pavprovisioners/status p1", "apply statefulsets pav-p1-controller"}},
	} {
		f.edit("p1", func(u *unstructured.Unstructured) {
			u.Object["spec"] = provisionerWithPhases("p1", "uid-1", step.gen, step.phases...).Object["spec"]
			u.SetGeneration(step.gen)
		})
		mustReconcile(t, f, "p1")
		if got := f.csiDriver("p1").Spec.StorageCapacity; (got != nil && *got) != step.want {
			t.Errorf("%s: CSIDriver storageCapacity %v, want %v", step.name, got, step.want)
		}
		var c *corev1.Container
		for i := range f.statefulSet("p1").Spec.Template.Spec.Containers {
			if x := &f.statefulSet("p1").Spec.Template.Spec.Containers[i]; x.Name == containerProvision {
				c = x
			}
		}
		if got := len(capacityArgs(c.Args)) > 0; got != step.want {
			t.Errorf("%s: capacity flags %v", step.name, c.Args)
		}
		wantWrites(t, f, step.wantWrites...)
	}
}
