package phase

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
	"github.com/pods-as-volumes/pav/internal/templating"
)

// The start of a dynamic spec that any of issue 35's phases may extend.
const (
	dynamicSpec   = "  provisioningModes: [Dynamic]\n  volumeCreation: {capacity: 1Gi}\n" + staging
	snapshotsSpec = dynamicSpec + "  snapshotCreation: {}\n"
	pod           = "{spec: {containers: [{name: c, image: busybox}]}}"
)

// FeaturesOf reads issue 35's literals and refuses bad ones naming the field
// and the fix; Check (which runs it) agrees.
func TestFeaturesOfIssue35(t *testing.T) {
	for _, tc := range []struct {
		name, spec string
		want       func(Features) bool
		wantErr    string // "path: substring"
	}{
		{name: "none", spec: dynamicSpec, want: func(f Features) bool {
			return f.MaxVolumesPerNode == 0 && !f.Capacity && f.CapacityRefresh == 0 && !f.Modification && f.MutableParameters == nil &&
				!f.GroupSnapshots && !f.SnapshotMetadata && !f.Ephemeral
		}},
		{name: "maxVolumesPerNode", spec: dynamicSpec + "  maxVolumesPerNode: 32\n", want: func(f Features) bool { return f.MaxVolumesPerNode == 32 }},
		{name: "maxVolumesPerNode 0", spec: dynamicSpec + "  maxVolumesPerNode: 0\n", wantErr: "spec.maxVolumesPerNode: must be an integer from 1 to 2147483647"},
		{name: "maxVolumesPerNode negative", spec: dynamicSpec + "  maxVolumesPerNode: -1\n", wantErr: "spec.maxVolumesPerNode: must be an integer from 1 to 2147483647 (the most volumes of this provisioner one node takes), got -1; omit it for no limit"},
		{name: "maxVolumesPerNode above int32", spec: dynamicSpec + "  maxVolumesPerNode: 2147483648\n", wantErr: "spec.maxVolumesPerNode: must be an integer from 1 to 2147483647"},

		{name: "capacity, default refresh", spec: dynamicSpec + "  storageCapacity: {podTemplate: " + pod + "}\n", want: func(f Features) bool {
			return f.Capacity && f.CapacityRefresh == time.Minute
		}},
		{name: "capacity refresh", spec: dynamicSpec + "  storageCapacity: {refreshInterval: 1m30s, podTemplate: " + pod + "}\n", want: func(f Features) bool {
			return f.Capacity && f.CapacityRefresh == 90*time.Second
		}},
		{name: "capacity refresh at the minimum", spec: dynamicSpec + "  storageCapacity: {refreshInterval: 10000ms, podTemplate: " + pod + "}\n", want: func(f Features) bool {
			return f.CapacityRefresh == 10*time.Second
		}},
		{name: "capacity as a whole template: default refresh", spec: dynamicSpec + "  storageCapacity: \"{% set yaml = true %}podTemplate: {{ params.pod }}\"\n", want: func(f Features) bool {
			return f.Capacity && f.CapacityRefresh == time.Minute
		}},
		{name: "capacity refresh too short", spec: dynamicSpec + "  storageCapacity: {refreshInterval: 9s, podTemplate: " + pod + "}\n", wantErr: "spec.storageCapacity.refreshInterval: must be at least 10s"},
		{name: "capacity refresh not a duration", spec: dynamicSpec + "  storageCapacity: {refreshInterval: 1 minute, podTemplate: " + pod + "}\n", wantErr: "spec.storageCapacity.refreshInterval: \"1 minute\" is not a Go duration with at most 6 digits before each unit: write numbers and units (h, m, s, ms, us, ns), such as 30s, 1m or 1h30m"},
		{name: "capacity refresh with 7 digits", spec: dynamicSpec + "  storageCapacity: {refreshInterval: 1000000s, podTemplate: " + pod + "}\n", wantErr: "spec.storageCapacity.refreshInterval: \"1000000s\" is not a Go duration with at most 6 digits before each unit"},
		{name: "capacity refresh too long", spec: dynamicSpec + "  storageCapacity: {refreshInterval: 999999h999999h99h, podTemplate: " + pod + "}\n", wantErr: "spec.storageCapacity.refreshInterval: must be at most 16 characters, got \"999999h999999h99h\""},
		{name: "capacity refresh at the largest", spec: dynamicSpec + "  storageCapacity: {refreshInterval: 999999h999999h9h, podTemplate: " + pod + "}\n", want: func(f Features) bool {
			return f.CapacityRefresh == 2000007*time.Hour
		}},
		{name: "capacity refresh without a unit", spec: dynamicSpec + "  storageCapacity: {refreshInterval: \"60\", podTemplate: " + pod + "}\n", wantErr: "spec.storageCapacity.refreshInterval: \"60\" is not a Go duration"},
		{name: "capacity refresh a number", spec: dynamicSpec + "  storageCapacity: {refreshInterval: 60, podTemplate: " + pod + "}\n", wantErr: "spec.storageCapacity.refreshInterval: must be a Go duration such as 30s, 1m or 1h30m, got number"},
		{name: "capacity refresh a template", spec: dynamicSpec + "  storageCapacity: {refreshInterval: \"{{ params.every }}\", podTemplate: " + pod + "}\n", wantErr: "spec.storageCapacity.refreshInterval: must be a literal Go duration"},
		{name: "capacity without podTemplate", spec: dynamicSpec + "  storageCapacity: {refreshInterval: 1m}\n", wantErr: "spec.storageCapacity.podTemplate: is required"},
		{name: "capacity without Dynamic", spec: "  provisioningModes: [Static]\n" + staging + "  storageCapacity: {podTemplate: " + pod + "}\n", wantErr: "spec.storageCapacity: is only allowed when spec.provisioningModes contains Dynamic"},

		{name: "modification", spec: dynamicSpec + "  volumeModification: {mutableParameters: [readAheadKiB, example.com/tier, \"with space\"]}\n", want: func(f Features) bool {
			return f.Modification && slices.Equal(f.MutableParameters, []string{"readAheadKiB", "example.com/tier", "with space"})
		}},
		{name: "modification with a templated pod", spec: dynamicSpec + "  volumeModification: {mutableParameters: [iops], podTemplate: \"{% set yaml = true %}{{ params.pod }}\"}\n", want: func(f Features) bool {
			return f.Modification && slices.Equal(f.MutableParameters, []string{"iops"})
		}},
		{name: "modification as a whole template", spec: dynamicSpec + "  volumeModification: \"{% set yaml = true %}mutableParameters: [iops]\"\n", wantErr: "spec.volumeModification: must be an object, not a template string: its mutableParameters is a literal list"},
		{name: "modification without mutableParameters", spec: dynamicSpec + "  volumeModification: {podTemplate: " + pod + "}\n", wantErr: "spec.volumeModification.mutableParameters: is required: list the parameter keys"},
		{name: "mutableParameters empty", spec: dynamicSpec + "  volumeModification: {mutableParameters: []}\n", wantErr: "spec.volumeModification.mutableParameters: must not be empty"},
		{name: "mutableParameters a template", spec: dynamicSpec + "  volumeModification: {mutableParameters: \"{{ params.keys }}\"}\n", wantErr: "spec.volumeModification.mutableParameters: must be a literal list, not a template"},
		{name: "mutableParameters a string", spec: dynamicSpec + "  volumeModification: {mutableParameters: iops}\n", wantErr: "spec.volumeModification.mutableParameters: must be a list of parameter keys, got string"},
		{name: "mutableParameters item a template", spec: dynamicSpec + "  volumeModification: {mutableParameters: [iops, \"{{ params.key }}\"]}\n", wantErr: "spec.volumeModification.mutableParameters[1]: \"{{ params.key }}\" must be a literal parameter key"},
		{name: "mutableParameters item a number", spec: dynamicSpec + "  volumeModification: {mutableParameters: [1]}\n", wantErr: "spec.volumeModification.mutableParameters[0]: must be a string (a parameter key), got number"},
		{name: "mutableParameters item empty", spec: dynamicSpec + "  volumeModification: {mutableParameters: [\"\"]}\n", wantErr: "spec.volumeModification.mutableParameters[0]: must not be empty"},
		{name: "mutableParameters item reserved", spec: dynamicSpec + "  volumeModification: {mutableParameters: [iops, csi.storage.k8s.io/fstype]}\n", wantErr: "spec.volumeModification.mutableParameters[1]: \"csi.storage.k8s.io/fstype\" starts with csi.storage.k8s.io/, which Kubernetes and the CSI sidecars reserve"},
		{name: "mutableParameters item too long", spec: dynamicSpec + "  volumeModification: {mutableParameters: [" + strings.Repeat("k", 254) + "]}\n", wantErr: "spec.volumeModification.mutableParameters[0]: must be at most 253 characters"},
		{name: "mutableParameters item of 253 characters, not bytes", spec: dynamicSpec + "  volumeModification: {mutableParameters: [" + strings.Repeat("é", 253) + "]}\n", want: func(f Features) bool { return f.Modification }},
		{name: "capacity refresh of 16 characters, not bytes", spec: dynamicSpec + "  storageCapacity: {refreshInterval: 99999h99999h10µs, podTemplate: " + pod + "}\n", want: func(f Features) bool { return f.Capacity }},
		{name: "mutableParameters too many", spec: dynamicSpec + "  volumeModification: {mutableParameters: [" + strings.Repeat("k,", 64) + "k]}\n", wantErr: "spec.volumeModification.mutableParameters: must list at most 64 keys, got 65"},
		{name: "mutableParameters item twice", spec: dynamicSpec + "  volumeModification: {mutableParameters: [iops, tier, iops]}\n", wantErr: "spec.volumeModification.mutableParameters[2]: \"iops\" is listed twice"},
		{name: "unknown field in volumeModification", spec: dynamicSpec + "  volumeModification: {mutableParameters: [iops], defaults: {}}\n", wantErr: "spec.volumeModification.defaults: unknown field (volumeModification may only hold mutableParameters, podTemplate)"},
		{name: "modification without Dynamic", spec: "  provisioningModes: [Static]\n" + staging + "  volumeModification: {mutableParameters: [iops]}\n", wantErr: "spec.volumeModification: is only allowed when spec.provisioningModes contains Dynamic"},

		{name: "group snapshots, no pods", spec: snapshotsSpec + "  groupSnapshotCreation: {}\n  groupSnapshotDeletion: {}\n", want: func(f Features) bool { return f.GroupSnapshots && f.Snapshots }},
		{name: "group snapshots with pods", spec: snapshotsSpec + "  groupSnapshotCreation: {podTemplate: " + pod + "}\n  groupSnapshotDeletion: \"{% set yaml = true %}podTemplate: {{ params.pod }}\"\n", want: func(f Features) bool { return f.GroupSnapshots }},
		{name: "group snapshots without snapshotCreation", spec: dynamicSpec + "  groupSnapshotCreation: {}\n", wantErr: "spec.groupSnapshotCreation: needs spec.snapshotCreation"},
		{name: "group snapshot deletion alone", spec: snapshotsSpec + "  groupSnapshotDeletion: {}\n", wantErr: "spec.groupSnapshotDeletion: needs spec.groupSnapshotCreation"},
		{name: "group snapshots without Dynamic", spec: "  provisioningModes: [Static]\n" + staging + "  groupSnapshotCreation: {}\n", wantErr: "spec.groupSnapshotCreation: is only allowed when spec.provisioningModes contains Dynamic"},
		{name: "group snapshot pod without containers", spec: snapshotsSpec + "  groupSnapshotCreation: {podTemplate: {spec: {}}}\n", wantErr: "spec.groupSnapshotCreation.podTemplate.spec.containers: needs at least one container"},
		{name: "unknown field in groupSnapshotDeletion", spec: snapshotsSpec + "  groupSnapshotCreation: {}\n  groupSnapshotDeletion: {handle: x}\n", wantErr: "spec.groupSnapshotDeletion: unknown field \"handle\" (allowed: podTemplate)"},

		{name: "snapshot metadata", spec: snapshotsSpec + "  snapshotMetadata: {podTemplate: " + pod + "}\n", want: func(f Features) bool { return f.SnapshotMetadata }},
		{name: "snapshot metadata without snapshotCreation", spec: dynamicSpec + "  snapshotMetadata: {podTemplate: " + pod + "}\n", wantErr: "spec.snapshotMetadata: needs spec.snapshotCreation"},
		{name: "snapshot metadata without podTemplate", spec: snapshotsSpec + "  snapshotMetadata: {}\n", wantErr: "spec.snapshotMetadata.podTemplate: is required"},

		{name: "ephemeral", spec: "  provisioningModes: [Dynamic, Ephemeral]\n  volumeCreation: {capacity: 1Gi}\n" + staging, want: func(f Features) bool { return f.Ephemeral }},
		{name: "ephemeral alone, with creation and deletion", spec: "  provisioningModes: [Ephemeral]\n  volumeCreation: {podTemplate: " + pod + "}\n  volumeDeletion: {podTemplate: " + pod + "}\n" + staging, want: func(f Features) bool { return f.Ephemeral }},
		{name: "ephemeral alone, without creation", spec: "  provisioningModes: [Ephemeral]\n" + staging, want: func(f Features) bool { return f.Ephemeral }},
		{name: "static and ephemeral, all three", spec: "  provisioningModes: [Static, Ephemeral, Dynamic]\n  volumeCreation: {capacity: 1Gi}\n" + staging, want: func(f Features) bool { return f.Ephemeral }},
		{name: "creation without Dynamic or Ephemeral", spec: "  provisioningModes: [Static]\n  volumeCreation: {capacity: 1}\n" + staging, wantErr: "spec.volumeCreation: is only allowed when spec.provisioningModes contains Dynamic or Ephemeral"},
		{name: "snapshots with Ephemeral only", spec: "  provisioningModes: [Ephemeral]\n  snapshotCreation: {}\n" + staging, wantErr: "spec.snapshotCreation: is only allowed when spec.provisioningModes contains Dynamic"},
		{name: "unknown mode", spec: "  provisioningModes: [Inline]\n" + staging, wantErr: "spec.provisioningModes[0]: must be Dynamic, Static or Ephemeral, got \"Inline\""},
		{name: "Ephemeral twice", spec: "  provisioningModes: [Ephemeral, Ephemeral]\n" + staging, wantErr: "spec.provisioningModes[1]: \"Ephemeral\" is listed twice"},

		{name: "every feature", spec: snapshotsSpec + "  maxVolumesPerNode: 1\n  storageCapacity: {refreshInterval: 2h, podTemplate: " + pod + "}\n  volumeModification: {mutableParameters: [b, a], podTemplate: " + pod + "}\n  groupSnapshotCreation: {}\n  snapshotMetadata: {podTemplate: " + pod + "}\n",
			want: func(f Features) bool {
				return f.MaxVolumesPerNode == 1 && f.Capacity && f.CapacityRefresh == 2*time.Hour && f.Modification &&
					slices.Equal(f.MutableParameters, []string{"b", "a"}) && f.GroupSnapshots && f.SnapshotMetadata && !f.Ephemeral
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := load(t, tc.spec)
			err := Check(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Check() = %v, want %q", err, tc.wantErr)
				}
				var fe *FieldError
				if !errors.As(err, &fe) || !strings.HasPrefix(tc.wantErr, fe.Path+":") {
					t.Fatalf("Check() = %v: not a FieldError on the path %q names", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check() = %v", err)
			}
			f, err := FeaturesOf(&p.Spec)
			if err != nil {
				t.Fatalf("FeaturesOf() = %v", err)
			}
			if !tc.want(f) {
				t.Fatalf("unexpected features %+v", f)
			}
		})
	}
}

// The evaluators of issue 35's phases: nil when the phase is absent, typed
// configs otherwise, the defaults applied and literal-only fields refused
// where a template would make them.
func TestIssue35Evaluators(t *testing.T) {
	ctx := context.Background()
	e := NewEvaluator(nil)
	vars := templating.Vars{"params": map[string]any{"image": "busybox:1.37", "every": "30s"}}
	podOf := func(image string) string {
		return "{spec: {containers: [{name: c, image: \"" + image + "\"}]}}"
	}

	// Absent phases.
	none := load(t, dynamicSpec)
	if c, err := e.Capacity(ctx, none, vars); c != nil || err != nil {
		t.Errorf("Capacity of a spec without it = %+v, %v", c, err)
	}
	if c, err := e.Modification(ctx, none, vars); c != nil || err != nil {
		t.Errorf("Modification of a spec without it = %+v, %v", c, err)
	}
	for name, f := range map[string]func(context.Context, *v1alpha1.PavProvisioner, templating.Vars) (*PodConfig, error){
		"GroupSnapshotCreation": e.GroupSnapshotCreation, "GroupSnapshotDeletion": e.GroupSnapshotDeletion, "SnapshotMetadata": e.SnapshotMetadata,
	} {
		if c, err := f(ctx, none, vars); c != nil || err != nil {
			t.Errorf("%s of a spec without it = %+v, %v", name, c, err)
		}
	}

	p := load(t, snapshotsSpec+
		"  storageCapacity: {refreshInterval: 5m, podTemplate: "+podOf("{{ params.image }}")+"}\n"+
		"  volumeModification: {mutableParameters: [readAheadKiB], podTemplate: "+podOf("{{ params.image }}")+"}\n"+
		"  groupSnapshotCreation: {podTemplate: "+podOf("{{ params.image }}")+"}\n"+
		"  groupSnapshotDeletion: {}\n"+
		"  snapshotMetadata: {podTemplate: "+podOf("{{ params.image }}")+"}\n")
	if err := Check(p); err != nil {
		t.Fatal(err)
	}
	capc, err := e.Capacity(ctx, p, vars)
	if err != nil || capc.RefreshInterval != 5*time.Minute || capc.PodTemplate.Spec.Containers[0].Image != "busybox:1.37" {
		t.Errorf("Capacity = %+v, %v", capc, err)
	}
	mod, err := e.Modification(ctx, p, vars)
	if err != nil || !slices.Equal(mod.MutableParameters, []string{"readAheadKiB"}) || mod.PodTemplate.Spec.Containers[0].Image != "busybox:1.37" {
		t.Errorf("Modification = %+v, %v", mod, err)
	}
	for name, f := range map[string]func(context.Context, *v1alpha1.PavProvisioner, templating.Vars) (*PodConfig, error){
		"GroupSnapshotCreation": e.GroupSnapshotCreation, "SnapshotMetadata": e.SnapshotMetadata,
	} {
		if c, err := f(ctx, p, vars); err != nil || c.PodTemplate.Spec.Containers[0].Image != "busybox:1.37" {
			t.Errorf("%s = %+v, %v", name, c, err)
		}
	}
	// Present without a pod: each member's own snapshot pods.
	if c, err := e.GroupSnapshotDeletion(ctx, p, vars); err != nil || c == nil || c.PodTemplate != nil {
		t.Errorf("GroupSnapshotDeletion = %+v, %v", c, err)
	}

	for _, tc := range []struct{ name, spec, wantErr string }{
		{"capacity: a whole template yields the pod", "  storageCapacity: '{% set yaml = true %}podTemplate: " + podOf("{{ params.image }}") + "'\n", ""},
		{"capacity: a whole template may not say refreshInterval", "  storageCapacity: '{% set yaml = true %}{refreshInterval: {{ params.every }}, podTemplate: " + podOf("b") + "}'\n",
			"spec.storageCapacity.refreshInterval: must be written in a literal spec.storageCapacity object"},
		{"capacity: a template yields no pod", "  storageCapacity: {podTemplate: \"{% set yaml = true %}\"}\n", "spec.storageCapacity.podTemplate: is required"},
		{"modification: a template yields a bad pod", "  volumeModification: {mutableParameters: [a], podTemplate: \"{% set yaml = true %}spec: {containers: []}\"}\n",
			"spec.volumeModification.podTemplate.spec.containers: needs at least one container"},
		{"snapshot metadata: a template yields no pod", "  snapshotMetadata: \"{% set yaml = true %}{}\"\n", "spec.snapshotMetadata.podTemplate: is required"},
		{"group snapshot: a template yields an unknown field", "  groupSnapshotCreation: \"{% set yaml = true %}{volumes: []}\"\n", "spec.groupSnapshotCreation: unknown field \"volumes\" (allowed: podTemplate)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := load(t, snapshotsSpec+tc.spec)
			var err error
			switch {
			case strings.Contains(tc.spec, "storageCapacity"):
				_, err = e.Capacity(ctx, p, vars)
			case strings.Contains(tc.spec, "volumeModification"):
				_, err = e.Modification(ctx, p, vars)
			case strings.Contains(tc.spec, "snapshotMetadata"):
				_, err = e.SnapshotMetadata(ctx, p, vars)
			default:
				_, err = e.GroupSnapshotCreation(ctx, p, vars)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
