package phase

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

func load(t *testing.T, spec string) *v1alpha1.PavProvisioner {
	t.Helper()
	p := &v1alpha1.PavProvisioner{}
	if err := yaml.UnmarshalStrict([]byte("metadata: {name: test}\nspec:\n"+spec), p); err != nil {
		t.Fatal(err)
	}
	return p
}

const staging = "  volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: busybox}]}}}\n"

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, spec, wantErr string
		pname               string
	}{
		{name: "minimal static", spec: "  provisioningModes: [Static]\n" + staging},
		{name: "minimal dynamic", spec: "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Gi}\n" + staging},
		{name: "whole phases templated", spec: "  provisioningModes: [Dynamic]\n  volumeCreation: \"{% set yaml = true %}capacity: 1Gi\"\n  volumeStaging: \"{% set yaml = true %}podTemplate: {}\"\n"},
		{name: "templated fields are not checked literally", spec: "  provisioningModes: [Dynamic]\n  volumeValidation: {minCapacity: \"{{ x }}\", maxCapacity: 1}\n  volumeCreation: {capacity: \"{{ params.size }}\"}\n" + staging},
		{name: "bad name", pname: "Bad_Name", spec: "  provisioningModes: [Static]\n" + staging, wantErr: "metadata.name: \"Bad_Name\" must be a DNS label"},
		{name: "name too long", pname: strings.Repeat("a", 64), spec: "  provisioningModes: [Static]\n" + staging, wantErr: "at most 63"},
		{name: "63-character name", pname: strings.Repeat("a1-", 20) + "end", spec: "  provisioningModes: [Static]\n" + staging},
		{name: "name with a leading dash", pname: "-abc", spec: "  provisioningModes: [Static]\n" + staging, wantErr: "metadata.name: \"-abc\" must be a DNS label: lowercase letters, digits and '-', starting and ending with a letter or digit"},
		{name: "name with a trailing dash", pname: "abc-", spec: "  provisioningModes: [Static]\n" + staging, wantErr: "must be a DNS label"},
		{name: "name with a dot", pname: "a.b", spec: "  provisioningModes: [Static]\n" + staging, wantErr: "must be a DNS label"},
		{name: "no modes", spec: "  provisioningModes: []\n" + staging, wantErr: "spec.provisioningModes: must list"},
		{name: "unknown mode", spec: "  provisioningModes: [Sometimes]\n" + staging, wantErr: "spec.provisioningModes[0]: must be Dynamic, Static or Ephemeral"},
		{name: "duplicate mode", spec: "  provisioningModes: [Static, Static]\n" + staging, wantErr: "listed twice"},
		{name: "no staging", spec: "  provisioningModes: [Static]\n", wantErr: "spec.volumeStaging: is required"},
		{name: "staging without pod", spec: "  provisioningModes: [Static]\n  volumeStaging: {}\n", wantErr: "spec.volumeStaging.podTemplate: is required"},
		{name: "creation without Dynamic", spec: "  provisioningModes: [Static]\n  volumeCreation: {capacity: 1}\n" + staging, wantErr: "spec.volumeCreation: is only allowed when spec.provisioningModes contains Dynamic"},
		{name: "deletion without Dynamic", spec: "  provisioningModes: [Static]\n  volumeDeletion: {}\n" + staging, wantErr: "spec.volumeDeletion: is only allowed"},
		{name: "dynamic without creation", spec: "  provisioningModes: [Dynamic]\n" + staging, wantErr: "spec.volumeCreation: is required when"},
		{name: "dynamic creation without capacity or pod", spec: "  provisioningModes: [Dynamic]\n  volumeCreation: {handle: x}\n" + staging, wantErr: "needs capacity or podTemplate"},
		{name: "unknown key", spec: "  provisioningModes: [Static]\n  volumeValidation: {minCapacty: 1}\n" + staging, wantErr: "spec.volumeValidation: unknown field \"minCapacty\""},
		{name: "zero capacity", spec: "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 0}\n" + staging, wantErr: "spec.volumeCreation.capacity: capacity values must be positive"},
		{name: "bad quantity", spec: "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: lots}\n" + staging, wantErr: "\"lots\" is not a quantity"},
		{name: "min above max", spec: "  provisioningModes: [Static]\n  volumeValidation: {minCapacity: 2Gi, maxCapacity: 1Gi}\n" + staging, wantErr: "spec.volumeValidation.minCapacity: must not be greater than maxCapacity (2147483648 bytes > 1073741824 bytes)"},
		{name: "bad volume mode", spec: "  provisioningModes: [Static]\n  volumeValidation: {volumeModes: [Disk]}\n" + staging, wantErr: "spec.volumeValidation.volumeModes[0]: must be one of Filesystem, Block"},
		{name: "empty access modes", spec: "  provisioningModes: [Static]\n  volumeValidation: {accessModes: []}\n" + staging, wantErr: "must not be empty"},
		{name: "pod template extra key", spec: "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: b}]}, kind: Pod}}\n", wantErr: "spec.volumeStaging.podTemplate: unknown field \"kind\""},
		{name: "pod template typo", spec: "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {spec: {containers: [{name: c, imag: b}]}}}\n", wantErr: "unknown field \"spec.containers[0].imag\""},
		{name: "pod without containers", spec: "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {spec: {}}}\n", wantErr: "spec.volumeStaging.podTemplate.spec.containers: needs at least one container"},
		{name: "template syntax error", spec: "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: \"{{ oops\"}]}}}\n", wantErr: "spec.volumeStaging.podTemplate.spec.containers[0].image"},
		{name: "templated item in a mode list", spec: "  provisioningModes: [Static]\n  volumeValidation: {accessModes: [\"{{ params.mode }}\", ReadOnlyMany]}\n" + staging},
		{name: "literal item beside a templated one is checked", spec: "  provisioningModes: [Static]\n  volumeValidation: {accessModes: [\"{{ params.mode }}\", ReadOnlyOnce]}\n" + staging, wantErr: "spec.volumeValidation.accessModes[1]: must be one of"},
		{name: "templated pod spec and metadata", spec: "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {metadata: \"{% set yaml = true %}{}\", spec: \"{% set yaml = true %}{{ params.spec }}\"}}\n"},
		{name: "templated containers", spec: "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {spec: {containers: \"{% set yaml = true %}{{ params.c }}\"}}}\n"},
		{name: "template where the pod needs a number", spec: "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {spec: {terminationGracePeriodSeconds: \"{{ params.grace }}\", containers: [{name: c, image: b}]}}}\n"},
		{name: "typo beside a template", spec: "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {spec: {containers: [{name: c, imag: \"{{ params.image }}\"}]}}}\n", wantErr: "unknown field \"spec.containers[0].imag\""},
		{name: "no containers beside a template", spec: "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {metadata: {namespace: \"{{ params.ns }}\"}}}\n", wantErr: "spec.volumeStaging.podTemplate.spec.containers: needs at least one container"},
		{name: "pod spec not an object", spec: "  provisioningModes: [Static]\n  volumeStaging: {podTemplate: {spec: [1]}}\n", wantErr: "spec.volumeStaging.podTemplate.spec: must be an object, got list"},
		{name: "phase not an object", spec: "  provisioningModes: [Static]\n  volumeStaging: hello\n", wantErr: "spec.volumeStaging: must be an object, got string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := load(t, tc.spec)
			if tc.pname != "" {
				p.Name = tc.pname
			}
			err := Check(p)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Check() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestValidationEvaluation(t *testing.T) {
	ctx := context.Background()
	e := NewEvaluator(nil)
	vars, err := ValidationVars(Request{VolumeMode: corev1.PersistentVolumeBlock, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		MinCapacity: 1 << 30, Params: map[string]string{"max": "2Gi"}}, Objects{}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, spec, wantErr string
		check               func(*ValidationConfig) bool
	}{
		{name: "defaults", spec: "  provisioningModes: [Static]\n", check: func(c *ValidationConfig) bool {
			return len(c.VolumeModes) == 1 && c.VolumeModes[0] == "Filesystem" && len(c.AccessModes) == 3 && c.MinCapacity == 1 && c.MaxCapacity == nil && c.PodTemplate == nil
		}},
		{name: "templated fields", spec: "  volumeValidation:\n    volumeModes: \"{% set yaml = true %}[{{ requestedVolumeMode }}]\"\n    maxCapacity: \"{{ params.max }}\"\n    minCapacity: 1.5\n",
			wantErr: "whole number"},
		{name: "templated fields ok", spec: "  volumeValidation:\n    volumeModes: \"{% set yaml = true %}[{{ requestedVolumeMode }}]\"\n    maxCapacity: \"{{ params.max }}\"\n",
			check: func(c *ValidationConfig) bool { return c.VolumeModes[0] == "Block" && *c.MaxCapacity == 2<<30 }},
		{name: "whole phase from yaml", spec: "  volumeValidation: \"{% set yaml = true %}{accessModes: [ReadWriteOncePod], minCapacity: {{ requestedMinCapacity }}}\"\n",
			check: func(c *ValidationConfig) bool {
				return c.AccessModes[0] == "ReadWriteOncePod" && c.MinCapacity == 1<<30
			}},
		{name: "null phase is absent", spec: "  volumeValidation: \"{% set yaml = true %}\"\n", check: func(c *ValidationConfig) bool { return c.MinCapacity == 1 }},
		{name: "null field is absent", spec: "  volumeValidation: {maxCapacity: \"{% set yaml = true %}{{ '' }}\"}\n", check: func(c *ValidationConfig) bool { return c.MaxCapacity == nil }},
		{name: "undefined variable", spec: "  volumeValidation: {maxCapacity: \"{{ params.nope }}\"}\n", wantErr: "spec.volumeValidation.maxCapacity"},
		{name: "template yields a list where an object goes", spec: "  volumeValidation: \"{% set yaml = true %}[1]\"\n", wantErr: "spec.volumeValidation: must be an object, got list"},
		{name: "yaml yields an unknown key", spec: "  volumeValidation: \"{% set yaml = true %}{color: blue}\"\n", wantErr: "unknown field \"color\""},
		{name: "access modes not a list", spec: "  volumeValidation: {accessModes: ReadWriteOnce}\n", wantErr: "spec.volumeValidation.accessModes: must be a list, got string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := load(t, tc.spec)
			c, err := e.Validation(ctx, p, vars)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Fatalf("unexpected config %+v", c)
			}
		})
	}
}

func TestStagingEvaluationAndContext(t *testing.T) {
	mode := corev1.PersistentVolumeFilesystem
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "it's mine", Namespace: "ns"}, Spec: corev1.PersistentVolumeClaimSpec{VolumeMode: &mode}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	vars, err := StagingVars(Staged{VolumeMode: mode, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Capacity: 42, Handle: "h", ReadOnly: true, Params: map[string]string{"a": "b"}}, Objects{PVC: pvc, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	if vars["pvc"].(map[string]any)["kind"] != "PersistentVolumeClaim" {
		t.Fatalf("pvc lacks kind: %v", vars["pvc"])
	}
	if _, ok := vars["pv"]; ok {
		t.Fatal("absent objects must be absent, not null")
	}
	p := load(t, `  volumeStaging:
    podTemplate:
      metadata: {namespace: "{{ pvc.metadata.namespace }}"}
      spec:
        containers:
          - name: c
            image: busybox
            command: [sh, -c, "echo {{ pvc.metadata.name | tobash }} {{ capacity }} {{ 'ro' if readOnly else 'rw' }} {{ node.metadata.name }} {{ params | tojson | tobash }}"]
`)
	c, err := NewEvaluator(nil).Staging(context.Background(), p, vars)
	if err != nil {
		t.Fatal(err)
	}
	if c.PodTemplate.Namespace != "ns" {
		t.Fatalf("namespace %q", c.PodTemplate.Namespace)
	}
	want := `echo 'it'"'"'s mine' 42 ro n1 '{"a": "b"}'`
	if got := c.PodTemplate.Spec.Containers[0].Command[2]; got != want {
		t.Fatalf("command = %s\nwant      %s", got, want)
	}
	if p.Spec.VolumeStaging.Data.(map[string]any)["podTemplate"].(map[string]any)["metadata"].(map[string]any)["namespace"] != "{{ pvc.metadata.namespace }}" {
		t.Fatal("evaluation mutated the provisioner")
	}
}

func TestDeletionContextHasHandleAndCapacity(t *testing.T) {
	vars, err := DeletionVars(Request{Params: map[string]string{}}, Objects{}, "pvc-1", "real-handle", 7)
	if err != nil {
		t.Fatal(err)
	}
	if vars["handle"] != "real-handle" || vars["capacity"] != int64(7) || vars["defaultHandle"] != "pvc-1" || vars["requestedMaxCapacity"] != nil {
		t.Fatalf("deletion vars = %v", vars)
	}
	unknown, _ := DeletionVars(Request{}, Objects{}, "d", "h", 0)
	if unknown["capacity"] != nil {
		t.Fatal("unknown capacity must be null")
	}
	var _ templating.Vars = vars
}
