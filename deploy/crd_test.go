package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder"
	"sigs.k8s.io/yaml"

	"github.com/pods-as-volumes/pav/api/v1alpha1"
)

// ---------------------------------------------------------------------------
// The manifests themselves.

func TestCRDManifestIsStrictAndMatchesTheAPI(t *testing.T) {
	onDisk, err := os.ReadFile("crd/pavprovisioners.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk, CRDYAML) {
		t.Fatal("CRDYAML differs from crd/pavprovisioners.yaml")
	}

	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(CRDYAML, crd); err != nil {
		t.Fatalf("the CRD has unknown or duplicate fields: %v", err)
	}
	n := crd.Spec.Names
	for _, c := range []struct{ what, got, want string }{
		{"metadata.name", crd.Name, v1alpha1.Resource + "." + v1alpha1.GroupName},
		{"group", crd.Spec.Group, v1alpha1.GroupName},
		{"kind", n.Kind, v1alpha1.Kind},
		{"listKind", n.ListKind, v1alpha1.Kind + "List"},
		{"plural", n.Plural, v1alpha1.Resource},
		{"singular", n.Singular, "pavprovisioner"},
		{"scope", string(crd.Spec.Scope), string(apiextensionsv1.ClusterScoped)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.what, c.got, c.want)
		}
	}
	if !slices.Equal(n.ShortNames, []string{v1alpha1.ShortName}) {
		t.Errorf("shortNames = %v, want [%s]", n.ShortNames, v1alpha1.ShortName)
	}
	if len(crd.Spec.Versions) != 1 {
		t.Fatalf("want exactly one version, got %d", len(crd.Spec.Versions))
	}
	v := crd.Spec.Versions[0]
	if v.Name != v1alpha1.Version || !v.Served || !v.Storage {
		t.Errorf("version %q served=%v storage=%v, want %q served and stored", v.Name, v.Served, v.Storage, v1alpha1.Version)
	}
	if v.Subresources == nil || v.Subresources.Status == nil || v.Subresources.Scale != nil {
		t.Errorf("want the status subresource (only), got %+v", v.Subresources)
	}
	cols := map[string]string{}
	for _, c := range v.AdditionalPrinterColumns {
		cols[c.Name] = c.JSONPath
	}
	for name, path := range map[string]string{
		"Modes":   ".spec.provisioningModes",
		"Valid":   `.status.conditions[?(@.type=="Valid")].status`,
		"Ready":   `.status.conditions[?(@.type=="Ready")].status`,
		"Volumes": ".status.volumes",
		"Age":     ".metadata.creationTimestamp",
	} {
		if cols[name] != path {
			t.Errorf("printer column %s: jsonPath %q, want %q", name, cols[name], path)
		}
	}
}

func TestCRDPassesCRDAdmission(t *testing.T) {
	// loadCRD runs ValidateCustomResourceDefinition (which includes the structural
	// schema checks, CEL compilation and the static cost estimator, per rule and
	// for the whole schema) and an explicit NewStructural + ValidateStructural.
	v, errs, err := loadCRD(CRDYAML)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) > 0 {
		t.Fatalf("the apiserver would reject the CRD:%s", errorsString(errs))
	}
	costs := celRuleCosts(t, v.structural)
	if len(costs) == 0 {
		t.Fatal("no CEL rules found")
	}
	var total uint64
	for _, c := range costs {
		t.Logf("CEL rule %s: estimated cost %d (per-rule limit %d)", c.path, c.cost, staticEstimatedCostLimit)
		if c.cost > staticEstimatedCostLimit/100 {
			t.Errorf("CEL rule %s: estimated cost %d is more than 1%% of the per-rule limit", c.path, c.cost)
		}
		total += c.cost
	}
	if total > staticEstimatedCRDCostLimit/100 {
		t.Errorf("total estimated CEL cost %d is more than 1%% of the CRD limit", total)
	}
}

// The reason for the construction of the template-or-value fields: a CEL rule on a
// node without a type (x-kubernetes-preserve-unknown-fields), or on a typed node
// below one (volumeCreation.handle), makes the CRD invalid, because the apiserver
// cannot give such a node a CEL type. If this test ever fails, the checks of the
// ValidatingAdmissionPolicy could move into the CRD.
func TestCELCannotBeUsedOnTemplateOrValueFields(t *testing.T) {
	withRule := func(t *testing.T, rule string, node ...string) []byte {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(CRDYAML, crd); err != nil {
			t.Fatal(err)
		}
		var set func(s apiextensionsv1.JSONSchemaProps, path []string) apiextensionsv1.JSONSchemaProps
		set = func(s apiextensionsv1.JSONSchemaProps, path []string) apiextensionsv1.JSONSchemaProps {
			if len(path) == 0 {
				s.XValidations = apiextensionsv1.ValidationRules{{Rule: rule, Message: "rule failed"}}
				return s
			}
			s.Properties[path[0]] = set(s.Properties[path[0]], path[1:])
			return s
		}
		root := set(*crd.Spec.Versions[0].Schema.OpenAPIV3Schema, node)
		crd.Spec.Versions[0].Schema.OpenAPIV3Schema = &root
		manifest, err := yaml.Marshal(crd)
		if err != nil {
			t.Fatal(err)
		}
		return manifest
	}

	want := "unable to convert structural schema to CEL declarations"
	for name, node := range map[string][]string{
		"on the node":                  {"spec", "volumeStaging"},
		"on a typed node below it too": {"spec", "volumeCreation", "handle"},
	} {
		t.Run(name, func(t *testing.T) {
			_, errs, err := loadCRD(withRule(t, "type(self) == string", node...))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(errorsString(errs), want) {
				t.Fatalf("want a CRD error %q, got:%s", want, errorsString(errs))
			}
		})
	}
}

// After creating a CRD the apiserver publishes its OpenAPI v2 and v3 schemas (for
// kubectl explain, client-side validation and server-side apply).
func TestCRDPublishesOpenAPI(t *testing.T) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(CRDYAML, crd); err != nil {
		t.Fatal(err)
	}
	v3, err := builder.BuildOpenAPIV3(crd, v1alpha1.Version, builder.Options{V2: false})
	if err != nil {
		t.Fatalf("OpenAPI v3: %v", err)
	}
	found := false
	for name, s := range v3.Components.Schemas {
		if strings.HasSuffix(name, "."+v1alpha1.Kind) {
			found = true
			if _, ok := s.Properties["spec"].Properties["volumeStaging"]; !ok {
				t.Errorf("published schema %s lacks spec.volumeStaging", name)
			}
		}
	}
	if !found {
		t.Errorf("no %s schema published", v1alpha1.Kind)
	}
	if _, err := builder.BuildOpenAPIV2(crd, v1alpha1.Version, builder.Options{V2: true, StripValueValidation: true, StripNullable: true}); err != nil {
		t.Fatalf("OpenAPI v2: %v", err)
	}
}

func TestPolicyManifestCompiles(t *testing.T) {
	onDisk, err := os.ReadFile("crd/pavprovisioners-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(onDisk, PolicyYAML) {
		t.Fatal("PolicyYAML differs from crd/pavprovisioners-policy.yaml")
	}
	p, errs, err := loadPolicy(PolicyYAML)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		t.Errorf("the apiserver would reject the policy: %v", e)
	}
	if p.binding.Spec.PolicyName != p.policy.Name {
		t.Errorf("binding refers to policy %q, the policy is %q", p.binding.Spec.PolicyName, p.policy.Name)
	}
	if len(p.binding.Spec.ValidationActions) != 1 || p.binding.Spec.ValidationActions[0] != "Deny" {
		t.Errorf("binding validationActions = %v, want [Deny]", p.binding.Spec.ValidationActions)
	}
	if p.binding.Spec.ParamRef != nil || p.policy.Spec.ParamKind != nil {
		t.Error("the policy takes no parameters")
	}
	// The policy must match creates and updates of PavProvisioners (not their
	// status subresource: the drivers write status whatever the spec holds).
	mc := p.policy.Spec.MatchConstraints
	if mc == nil || len(mc.ResourceRules) != 1 {
		t.Fatalf("want one resource rule, got %+v", mc)
	}
	r := mc.ResourceRules[0]
	if !slices.Equal(r.APIGroups, []string{v1alpha1.GroupName}) || !slices.Equal(r.Resources, []string{v1alpha1.Resource}) ||
		!slices.Contains(r.Operations, "CREATE") || !slices.Contains(r.Operations, "UPDATE") ||
		!(slices.Contains(r.APIVersions, "*") || slices.Contains(r.APIVersions, v1alpha1.Version)) {
		t.Errorf("resource rule %+v does not match creates and updates of %s", r, v1alpha1.GroupVersionResource)
	}
}

func TestKustomizationListsTheManifests(t *testing.T) {
	b, err := os.ReadFile("crd/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("crd/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" {
			want = append(want, base)
		}
	}
	got := slices.Sorted(slices.Values(k.Resources))
	if k.Kind != "Kustomization" || !slices.Equal(got, want) {
		t.Errorf("kustomization %s lists %v, want %v", k.Kind, got, want)
	}
}

// ---------------------------------------------------------------------------
// Objects through the whole admission path.

// rejection is one reason the apiserver refuses an object.
type rejection struct {
	layer string // "crd" (decoding and schema) or "policy"
	field string
	msg   string
}

// admitter runs objects through the CRD (decoding with strict field validation,
// then create validation) and, if the CRD accepts them, the policy, in the order a
// kube-apiserver does.
type admitter struct {
	crd    *crdValidator
	policy *policyValidator
}

func newAdmitter(t *testing.T) *admitter {
	t.Helper()
	crd, errs, err := loadCRD(CRDYAML)
	if err != nil || len(errs) > 0 {
		t.Fatalf("CRD: %v%s", err, errorsString(errs))
	}
	policy, perrs, err := loadPolicy(PolicyYAML)
	if err != nil || len(perrs) > 0 {
		t.Fatalf("policy: %v %v", err, perrs)
	}
	return &admitter{crd: crd, policy: policy}
}

// policyMessage splits a policy message "<field path>: <message>".
var policyMessage = regexp.MustCompile(`^([A-Za-z0-9_.\[\]]+): (.*)$`)

// admit returns why obj (and, for an update, oldObj) would be refused; for the
// policy only the first denial, which is the one the apiserver reports.
func (a *admitter) admit(t *testing.T, obj, oldObj string) []rejection {
	t.Helper()
	m, err := decodeObject([]byte(obj))
	if err != nil {
		t.Fatal(err)
	}
	var out []rejection
	for _, e := range a.crd.ValidateObject(m) {
		out = append(out, rejection{"crd", e.Field, e.Error()})
	}
	if len(out) > 0 {
		return out
	}
	var old map[string]any
	if oldObj != "" {
		if old, err = decodeObject([]byte(oldObj)); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range a.policy.Validate(v1alpha1.GroupVersionResource, m, old) {
		r := rejection{layer: "policy", msg: string(d.Evaluation) + ": " + d.Message}
		if sm := policyMessage.FindStringSubmatch(d.Message); sm != nil && d.Evaluation == "deny" {
			r.field = sm[1]
		}
		return append(out, r)
	}
	return out
}

func rejectionsString(rs []rejection) string {
	var b strings.Builder
	for _, r := range rs {
		b.WriteString("\n    [" + r.layer + "] " + r.field + " | " + r.msg)
	}
	return b.String()
}

// pav returns a PavProvisioner manifest with the given name and spec (a YAML flow
// mapping).
func pav(name, spec string) string {
	return "apiVersion: pav.albertofaria.github.io/v1alpha1\nkind: PavProvisioner\nmetadata:\n  name: " + name + "\nspec: " + spec + "\n"
}

// staging is a minimal literal volumeStaging.
const staging = `volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: busybox, command: [sh, -c, "mkdir /pav/volume"]}]}}}`

// static is the start of a minimal valid spec (close it with "}").
const static = `{provisioningModes: [Static], ` + staging

// dynamic is the start of a dynamic spec (add volumeCreation and close it with "}").
const dynamic = `{provisioningModes: [Dynamic], ` + staging

var validObjects = []struct{ name, obj string }{
	{"hello world", `
apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: hello-world
spec:
  provisioningModes: [Dynamic]
  volumeCreation:
    capacity: "{{ requestedMinCapacity }}"
  volumeStaging:
    podTemplate:
      spec:
        restartPolicy: Never
        containers:
          - name: hello
            image: busybox:1.36
            command: [sh, -c, 'mkdir /pav/volume && echo "Hello, world!" > /pav/volume/greeting']
`},
	{"full literal object, every field, with status", `
apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: full-literal
  labels: {app: pav}
spec:
  provisioningModes: [Dynamic, Static]
  volumeValidation:
    volumeModes: [Filesystem, Block]
    accessModes: [ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod]
    minCapacity: 1Mi
    maxCapacity: 1099511627776
    podTemplate:
      metadata: {namespace: storage, labels: {phase: validation}}
      spec: {restartPolicy: Never, containers: [{name: v, image: busybox, command: ["true"]}]}
  volumeCreation:
    handle: my-volume
    capacity: 10Gi
    podTemplate:
      metadata: {namespace: storage}
      spec: {restartPolicy: Never, containers: [{name: c, image: busybox, command: [sh, -c, "echo 10Gi > /pav/capacity"]}]}
  volumeDeletion:
    podTemplate:
      spec: {restartPolicy: Never, containers: [{name: d, image: busybox, command: ["true"]}]}
  volumeStaging:
    podTemplate:
      metadata: {namespace: storage}
      spec:
        containers:
          - name: s
            image: busybox
            command: [sh, -c, "mkdir /pav/volume && touch /pav/ready && sleep infinity"]
            securityContext: {privileged: true}
  volumeUnstaging:
    podTemplate:
      spec: {restartPolicy: Never, containers: [{name: u, image: busybox, command: ["true"]}]}
status:
  observedGeneration: 3
  conditions:
    - type: Valid
      status: "True"
      reason: Valid
      message: ""
      lastTransitionTime: "2024-05-01T10:00:00Z"
      observedGeneration: 3
`},
	{"every phase a template with yaml = true", `
apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: all-templated
spec:
  provisioningModes: [Dynamic]
  volumeValidation: |
    {% set yaml = true %}
    volumeModes: [{{ params.mode | default('Filesystem') | tojson }}]
    minCapacity: {{ params.min | default(1) }}
  volumeCreation: |
    {% set yaml = true %}
    capacity: {{ requestedMinCapacity }}
    handle: {{ defaultHandle | tojson }}
  volumeDeletion: "{% set yaml = true %}{{ {'podTemplate': {'spec': {'containers': []}}} | tojson }}"
  volumeStaging: |
    {% set yaml = true %}
    podTemplate:
      spec:
        containers:
          - name: s
            image: busybox
            command: [sh, -c, {{ ('mkdir /pav/volume && echo ' ~ handle) | tojson }}]
  volumeUnstaging: "{% set yaml = true %}{% if params.cleanup %}podTemplate: {spec: {containers: []}}{% endif %}"
`},
	{"every field inside the phases a template", `
apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: fields-templated
spec:
  provisioningModes: [Dynamic, Static]
  volumeValidation:
    volumeModes: "{% set yaml = true %}{{ params.modes | default('[Filesystem]') }}"
    accessModes: ["{{ params.accessMode }}", ReadOnlyMany]
    minCapacity: "{{ params.minCapacity | default(1) }}"
    maxCapacity: "{{ params.maxCapacity }}"
    podTemplate: "{% set yaml = true %}spec: {containers: [{name: v, image: {{ params.image | tojson }}}]}"
  volumeCreation:
    handle: "{{ params.prefix }}-{{ defaultHandle }}"
    capacity: "{{ requestedMinCapacity }}"
    podTemplate:
      metadata: "{% set yaml = true %}namespace: {{ pvc.metadata.namespace | tojson }}"
      spec: "{% set yaml = true %}{{ params.creationPodSpec }}"
  volumeStaging:
    podTemplate:
      metadata: {namespace: "{{ pvc.metadata.namespace }}"}
      spec: "{% set yaml = true %}{{ params.stagingPodSpec }}"
`},
	{"static only, staging and unstaging", `
apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: nfs-static
spec:
  provisioningModes: [Static]
  volumeValidation:
    accessModes: [ReadWriteMany, ReadOnlyMany]
  volumeStaging:
    podTemplate:
      spec:
        containers:
          - name: mount
            image: busybox
            command: [sh, -c, "mkdir /pav/volume && mount -t nfs {{ params.server }}:{{ handle }} /pav/volume"]
            securityContext: {privileged: true}
  volumeUnstaging:
    podTemplate:
      spec:
        restartPolicy: Never
        containers: [{name: umount, image: busybox, command: [umount, /pav/volume]}]
`},
	{"dynamic, capacity reported by the creation pod, anchors and merge keys", `
apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: bucket-provisioner
spec:
  provisioningModes: [Dynamic, Static]
  volumeCreation:
    podTemplate:
      metadata:
        namespace: "{{ params.secretNamespace }}"
      spec:
        restartPolicy: Never
        containers:
          - &tool
            name: tool
            image: example.com/bucket-tool:1.0
            command:
              - sh
              - -c
              - |
                make-bucket --class {{ params.storageClass | default('STANDARD') | tobash }} \
                  {% if params.location is defined %}--location {{ params.location | tobash }}{% endif %} \
                  {{ defaultHandle | tobash }} 2> /pav/error
                echo 1Ei > /pav/capacity
            volumeMounts: [{name: secret, mountPath: /secret, readOnly: true}]
        volumes: [{name: secret, secret: {secretName: "{{ params.secretName }}"}}]
  volumeDeletion:
    podTemplate:
      metadata: {namespace: "{{ params.secretNamespace }}"}
      spec:
        restartPolicy: Never
        containers:
          - <<: *tool
            command: [sh, -c, "remove-bucket {{ defaultHandle | tobash }}"]
  volumeStaging:
    podTemplate:
      spec:
        containers:
          - <<: *tool
            command: [sh, -c, "mkdir /pav/volume && mount-bucket {{ handle | tobash }} /pav/volume && touch /pav/ready && sleep infinity"]
            securityContext: {privileged: true}
`},
	{"block volumes, creation pod only", `
apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: crypt
spec:
  provisioningModes: [Dynamic]
  volumeValidation:
    volumeModes: [Block]
    accessModes: [ReadWriteOncePod]
  volumeCreation:
    podTemplate:
      metadata: {namespace: "{{ pvc.metadata.namespace }}"}
      spec:
        restartPolicy: Never
        containers: [{name: format, image: example.com/crypt:1, args: ["format /volume && size /volume > /pav/capacity"]}]
  volumeStaging:
    podTemplate:
      spec:
        containers: [{name: open, image: example.com/crypt:1, args: ["open /volume {{ handle | tobash }} && cp -p /dev/mapper/{{ handle | tobash }} /pav/volume"]}]
`},
	{"volumeCreation itself a template", pav("creation-templated", `{provisioningModes: [Dynamic], volumeCreation: "{% set yaml = true %}capacity: {{ params.size }}", `+staging+`}`)},
	{"capacities as integers, quantities, exponent, rounding up", pav("capacities", `{provisioningModes: [Dynamic], volumeValidation: {minCapacity: 1, maxCapacity: "1e3"}, volumeCreation: {capacity: 500M}, `+staging+`}`)},
	{"maxCapacity below a byte rounds up to 1", pav("tiny-max", `{provisioningModes: [Static], volumeValidation: {maxCapacity: "0.5"}, `+staging+`}`)},
	{"min equals max", pav("exact", `{provisioningModes: [Static], volumeValidation: {minCapacity: 1Ki, maxCapacity: 1024}, `+staging+`}`)},
	{"min template, max literal: not compared", pav("mixed", `{provisioningModes: [Static], volumeValidation: {minCapacity: "{{ params.min }}", maxCapacity: 1Gi}, `+staging+`}`)},
	{"63-character name with digits and dashes", pav(strings.Repeat("a1-", 20)+"end", static+`}`)},
	{"modes in the other order, single-letter name", pav("p", `{provisioningModes: [Static, Dynamic], volumeCreation: {handle: "{{ defaultHandle }}", podTemplate: {spec: {containers: [{name: c, image: b}]}}}, `+staging+`}`)},
	{"containers from a template", pav("templated-containers", `{provisioningModes: [Static], volumeStaging: {podTemplate: {metadata: {name: ignored}, spec: {containers: "{% set yaml = true %}[{name: c, image: {{ params.image }}}]"}}}}`)},
	{"null optional phases count as absent", pav("nulls", `{provisioningModes: [Static], volumeValidation: null, volumeCreation: null, `+staging+`}`)},

	// Beyond PaV: expansion, snapshots, clones and topology.
	{"every new field, literal", pav("everything", dynamic+`, volumeCreation: {capacity: 1Gi, contentSources: [Snapshot, Volume], accessibleTopology: [{topology.kubernetes.io/zone: a}, {topology.kubernetes.io/zone: b, example.com/rack: r-1}]}, `+
		`volumeExpansion: {online: false, capacity: 2Gi, podTemplate: {spec: {containers: [{name: grow, image: busybox}]}}}, `+
		`volumeNodeExpansion: {podTemplate: {spec: {containers: [{name: resize, image: busybox}]}}}, `+
		`snapshotCreation: {handle: "snap-{{ snapshotName }}", podTemplate: {spec: {containers: [{name: snap, image: busybox}]}}}, `+
		`snapshotDeletion: {podTemplate: {spec: {containers: [{name: unsnap, image: busybox}]}}}, `+
		`topology: {nodeLabels: [kubernetes.io/hostname, topology.kubernetes.io/zone, zone]}}`)},
	{"expansion without a pod: any growth", pav("grow", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeExpansion: {}}`)},
	{"whenNamespaceGone Forget beside a templated pod", pav("forget", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeDeletion: {whenNamespaceGone: Forget, podTemplate: {metadata: {namespace: "{{ pvc.metadata.namespace }}"}, spec: {containers: [{name: c, image: b}]}}}}`)},
	{"whenNamespaceGone Retry alone", pav("retry", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeDeletion: {whenNamespaceGone: Retry}}`)},
	{"new phases as templates", pav("templated-new", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeExpansion: "{% set yaml = true %}capacity: {{ requestedCapacity }}", volumeNodeExpansion: "{% set yaml = true %}podTemplate: {spec: {containers: [{name: c, image: b}]}}", snapshotCreation: "{% set yaml = true %}{}", snapshotDeletion: {podTemplate: "{% set yaml = true %}spec: {containers: [{name: c, image: b}]}"}}`)},
	{"new fields as templates", pav("templated-fields", dynamic+`, volumeCreation: {capacity: 1Gi, accessibleTopology: "{% set yaml = true %}[{zone: {{ params.zone }}}]"}, volumeExpansion: {capacity: "{{ requestedCapacity }}", podTemplate: "{% set yaml = true %}spec: {containers: [{name: c, image: b}]}"}}`)},
	{"one accessible segment with a templated value", pav("one-segment", dynamic+`, volumeCreation: {capacity: 1Gi, accessibleTopology: {topology.kubernetes.io/zone: "{{ params.zone }}"}}}`)},
	{"clones only, empty topology value", pav("clones", dynamic+`, volumeCreation: {capacity: 1Gi, contentSources: [Volume], accessibleTopology: [{example.com/pool: ""}]}}`)},
	{"topology on a static provisioner", pav("static-topology", static+`, topology: {nodeLabels: [kubernetes.io/hostname]}}`)},

	// Issue 35: capacity, VolumeAttributesClass, inline volumes, group snapshots,
	// volume limits, changed blocks.
	{"every issue 35 field, literal", `
apiVersion: pav.albertofaria.github.io/v1alpha1
kind: PavProvisioner
metadata:
  name: issue-35
spec:
  provisioningModes: [Dynamic, Static, Ephemeral]
  maxVolumesPerNode: 32
  volumeCreation: {capacity: 1Gi}
  volumeStaging:
    podTemplate: {spec: {containers: [{name: s, image: busybox}]}}
  snapshotCreation: {}
  storageCapacity:
    refreshInterval: 1m30s
    podTemplate:
      metadata: {namespace: storage}
      spec: {containers: [{name: df, image: busybox, command: [sh, -c, "df -B1 --output=avail /pool | tail -1 > /pav/capacity"]}]}
  volumeModification:
    mutableParameters: [readAheadKiB, example.com/tier, "with space", "csi.storage.k8s.io"]
    podTemplate: {spec: {containers: [{name: m, image: busybox}]}}
  groupSnapshotCreation:
    podTemplate: {spec: {containers: [{name: g, image: busybox}]}}
  groupSnapshotDeletion:
    podTemplate: {spec: {containers: [{name: d, image: busybox}]}}
  snapshotMetadata:
    podTemplate: {spec: {containers: [{name: b, image: busybox}]}}
`},
	{"issue 35 phases without their optional pods", pav("defaults-35", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, volumeModification: {mutableParameters: [iops]}, groupSnapshotCreation: {}, groupSnapshotDeletion: {}}`)},
	{"issue 35 phases as templates", pav("templated-35", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, `+
		`storageCapacity: "{% set yaml = true %}podTemplate: {{ params.capacityPod }}", `+
		`groupSnapshotCreation: "{% set yaml = true %}{}", groupSnapshotDeletion: "{% set yaml = true %}{}", `+
		`snapshotMetadata: "{% set yaml = true %}podTemplate: {spec: {containers: [{name: c, image: b}]}}"}`)},
	{"issue 35 pod templates as templates", pav("templated-pods-35", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, `+
		`storageCapacity: {refreshInterval: 10s, podTemplate: "{% set yaml = true %}{{ params.pod }}"}, `+
		`volumeModification: {mutableParameters: [iops], podTemplate: {metadata: "{% set yaml = true %}{}", spec: "{% set yaml = true %}{{ params.spec }}"}}, `+
		`groupSnapshotCreation: {podTemplate: {spec: {containers: "{% set yaml = true %}{{ params.c }}"}}}, `+
		`snapshotMetadata: {podTemplate: "{{ params.pod }}"}}`)},
	{"refresh intervals Go accepts", pav("refresh", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: "999999h999999h9h", podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`)},
	{"refresh interval in milliseconds with a fraction", pav("refresh-ms", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: "10000.5ms", podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`)},
	{"refresh interval with microseconds", pav("refresh-us", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: "10s500µs", podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`)},
	{"Ephemeral only, with creation and deletion", pav("inline", `{provisioningModes: [Ephemeral], volumeCreation: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}, volumeDeletion: {podTemplate: {spec: {containers: [{name: d, image: b}]}}}, `+staging+`}`)},
	{"Ephemeral only, staging alone", pav("inline-staging", `{provisioningModes: [Ephemeral], `+staging+`}`)},
	{"Static and Ephemeral, volume limit of 1", pav("inline-static", `{provisioningModes: [Static, Ephemeral], maxVolumesPerNode: 1, `+staging+`}`)},
	{"mutable parameter of 253 characters, not bytes", pav("long-key", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [`+strings.Repeat("é", 253)+`]}}`)},
	{"refresh interval of 16 characters, not bytes", pav("refresh-runes", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: "99999h99999h10µs", podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`)},
	{"largest volume limit", pav("limit", static+`, maxVolumesPerNode: 2147483647}`)},
	{"64 mutable parameters of 253 characters", pav("many-keys", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [`+manyKeys(64, 253)+`]}}`)},
}

// manyKeys is a YAML flow list of n distinct keys of length characters.
func manyKeys(n, length int) string {
	keys := make([]string, n)
	for i := range keys {
		k := fmt.Sprintf("k%d-", i)
		keys[i] = k + strings.Repeat("x", length-len(k))
	}
	return strings.Join(keys, ", ")
}

func TestValidObjects(t *testing.T) {
	a := newAdmitter(t)
	for _, c := range validObjects {
		t.Run(c.name, func(t *testing.T) {
			if rs := a.admit(t, c.obj, ""); len(rs) > 0 {
				t.Fatalf("rejected:%s", rejectionsString(rs))
			}
			// What is admitted also decodes into the Go types without loss.
			j, err := yaml.YAMLToJSON([]byte(c.obj))
			if err != nil {
				t.Fatal(err)
			}
			d := json.NewDecoder(bytes.NewReader(j))
			d.DisallowUnknownFields()
			var p v1alpha1.PavProvisioner
			if err := d.Decode(&p); err != nil {
				t.Fatalf("does not decode into v1alpha1.PavProvisioner: %v", err)
			}
			if p.Spec.VolumeStaging == nil || len(p.Spec.ProvisioningModes) == 0 {
				t.Fatalf("decoded spec lacks mandatory fields: %+v", p.Spec)
			}
		})
	}
}

var invalidObjects = []struct {
	name, obj    string
	layer, field string // layer: "crd" or "policy"
	msg          string // substring of the message
}{
	// metadata.name
	{"name with uppercase", pav("Hello", static+`}`), "crd", "metadata.name", "must be a DNS label"},
	{"name too long", pav(strings.Repeat("a", 64), static+`}`), "crd", "metadata.name", "must be a DNS label (at most 63 characters"},
	{"name with a leading dash", pav("-abc", static+`}`), "crd", "metadata.name", "must be a DNS label"},
	{"name with a dot (a subdomain, not a label)", pav("a.b", static+`}`), "crd", "metadata.name", "because it is also the CSI driver name"},

	// spec and provisioningModes
	{"no spec", "apiVersion: pav.albertofaria.github.io/v1alpha1\nkind: PavProvisioner\nmetadata: {name: x}\n", "crd", "spec", "Required value"},
	{"missing provisioningModes", pav("x", `{`+staging+`}`), "crd", "spec.provisioningModes", "Required value"},
	{"empty provisioningModes", pav("x", `{provisioningModes: [], `+staging+`}`), "crd", "spec.provisioningModes", "should have at least 1 items"},
	{"unknown provisioning mode", pav("x", `{provisioningModes: [Both], `+staging+`}`), "crd", "spec.provisioningModes[0]", `Unsupported value: "Both": supported values: "Dynamic", "Static"`},
	{"duplicate provisioning mode", pav("x", `{provisioningModes: [Static, Static], `+staging+`}`), "crd", "spec.provisioningModes[1]", `Duplicate value: "Static"`},
	{"templated provisioningModes", pav("x", `{provisioningModes: "{% set yaml = true %}[Static]", `+staging+`}`), "crd", "spec.provisioningModes", "must be of type array"},

	// structure
	{"missing volumeStaging", pav("x", `{provisioningModes: [Static]}`), "crd", "spec.volumeStaging", "Required value"},
	{"missing volumeStaging.podTemplate", pav("x", `{provisioningModes: [Static], volumeStaging: {}}`), "crd", "spec.volumeStaging.podTemplate", "Required value"},
	{"unknown field in spec", pav("x", static+`, volumeResizing: {}}`), "crd", "spec.volumeResizing", `unknown field "spec.volumeResizing"`},
	{"unknown field in status", pav("x", static+`}`) + "status: {ready: true}\n", "crd", "status.ready", `unknown field "status.ready"`},
	{"unknown field in volumeValidation", pav("x", static+`, volumeValidation: {volumeModes: [Block], minSize: 1Gi}}`), "policy", "spec.volumeValidation", "unknown field(s) minSize; volumeValidation may only hold volumeModes, accessModes, minCapacity, maxCapacity, podTemplate"},
	{"misspelt field in volumeCreation", pav("x", `{provisioningModes: [Dynamic], volumeCreation: {capacity: 1Gi, podTemplat: {}}, `+staging+`}`), "policy", "spec.volumeCreation", "unknown field(s) podTemplat"},
	{"unknown field in volumeStaging", pav("x", `{provisioningModes: [Static], volumeStaging: {podTemplate: {}, nodeSelector: {}}}`), "policy", "spec.volumeStaging", "unknown field(s) nodeSelector; volumeStaging may only hold podTemplate"},
	{"pod template with apiVersion and kind (a whole Pod)", pav("x", `{provisioningModes: [Static], volumeStaging: {podTemplate: {apiVersion: v1, kind: Pod, spec: {}}}}`), "policy", "spec.volumeStaging.podTemplate", "; a pod template may only hold metadata and spec"}, // the fields come in any order
	{"pod template with status", pav("x", static+`, volumeUnstaging: {podTemplate: {spec: {}, status: {}}}}`), "policy", "spec.volumeUnstaging.podTemplate", "a pod template may only hold metadata and spec"},
	{"pod template with metadata only", pav("x", `{provisioningModes: [Static], volumeStaging: {podTemplate: {metadata: {name: ignored}}}}`), "policy", "spec.volumeStaging.podTemplate.spec.containers", "needs at least one container"},
	{"pod spec without containers", pav("x", `{provisioningModes: [Dynamic], volumeCreation: {capacity: 1Gi, podTemplate: {spec: {restartPolicy: Never}}}, `+staging+`}`), "policy", "spec.volumeCreation.podTemplate.spec.containers", "needs at least one container"},
	{"empty containers list", pav("x", static+`, volumeUnstaging: {podTemplate: {spec: {containers: []}}}}`), "policy", "spec.volumeUnstaging.podTemplate.spec.containers", "needs at least one container"},

	// provisioning modes and phases
	{"volumeCreation without Dynamic", pav("x", static+`, volumeCreation: {capacity: 1Gi}}`), "crd", "spec.volumeCreation", "may only be set when spec.provisioningModes contains Dynamic"},
	{"volumeDeletion without Dynamic", pav("x", static+`, volumeDeletion: {podTemplate: {}}}`), "crd", "spec.volumeDeletion", "may only be set when spec.provisioningModes contains Dynamic or Ephemeral: add Dynamic or Ephemeral to provisioningModes, or remove volumeDeletion"},
	{"Dynamic without volumeCreation", pav("x", `{provisioningModes: [Dynamic], `+staging+`}`), "crd", "spec.volumeCreation", "is required when spec.provisioningModes contains Dynamic"},
	{"Dynamic, volumeCreation without capacity or podTemplate", pav("x", `{provisioningModes: [Dynamic], volumeCreation: {handle: h}, `+staging+`}`), "policy", "spec.volumeCreation", "must set capacity or podTemplate (or both) when spec.provisioningModes contains Dynamic"},

	// capacities
	{"zero capacity", pav("x", `{provisioningModes: [Dynamic], volumeCreation: {capacity: 0}, `+staging+`}`), "crd", "spec.volumeCreation.capacity", "should be greater than or equal to 1"},
	{"zero capacity as a string", pav("x", `{provisioningModes: [Dynamic], volumeCreation: {capacity: "0"}, `+staging+`}`), "policy", "spec.volumeCreation.capacity", `a quantity of at least 1 byte (it is rounded down) such as 1Gi, 500M or 1e3, or a template string (found "0")`},
	{"negative minCapacity", pav("x", static+`, volumeValidation: {minCapacity: -1}}`), "crd", "spec.volumeValidation.minCapacity", "should be greater than or equal to 1"},
	{"negative maxCapacity quantity", pav("x", static+`, volumeValidation: {maxCapacity: -1Gi}}`), "policy", "spec.volumeValidation.maxCapacity", `a positive quantity such as 1Gi, 500M or 1e3, or a template string (found "-1Gi")`},
	{"malformed quantity", pav("x", static+`, volumeValidation: {minCapacity: abc}}`), "policy", "spec.volumeValidation.minCapacity", `(found "abc")`},
	{"quantity with a space", pav("x", static+`, volumeValidation: {minCapacity: "1 Gi"}}`), "policy", "spec.volumeValidation.minCapacity", `(found "1 Gi")`},
	{"minCapacity rounding down to 0 bytes", pav("x", static+`, volumeValidation: {minCapacity: "0.1"}}`), "policy", "spec.volumeValidation.minCapacity", "at least 1 byte (it is rounded down)"},
	{"creation capacity in millibytes", pav("x", `{provisioningModes: [Dynamic], volumeCreation: {capacity: 500m}, `+staging+`}`), "policy", "spec.volumeCreation.capacity", `(found "500m")`},
	{"fractional capacity as a number", pav("x", `{provisioningModes: [Dynamic], volumeCreation: {capacity: 1.5}, `+staging+`}`), "crd", "spec.volumeCreation.capacity", "must be of type integer,string"},
	{"boolean capacity", pav("x", static+`, volumeValidation: {maxCapacity: true}}`), "crd", "spec.volumeValidation.maxCapacity", "must be of type integer,string"},
	{"minCapacity > maxCapacity, quantities", pav("x", static+`, volumeValidation: {minCapacity: 2Gi, maxCapacity: 1Gi}}`), "policy", "spec.volumeValidation.minCapacity", "must not be greater than spec.volumeValidation.maxCapacity (2Gi > 1Gi)"},
	{"minCapacity > maxCapacity, integer and quantity", pav("x", static+`, volumeValidation: {minCapacity: 1025, maxCapacity: 1Ki}}`), "policy", "spec.volumeValidation.minCapacity", "must not be greater than spec.volumeValidation.maxCapacity (1025 > 1Ki)"},

	// modes lists
	{"unknown volume mode", pav("x", static+`, volumeValidation: {volumeModes: [Raw]}}`), "crd", "spec.volumeValidation.volumeModes[0]", `Unsupported value: "Raw": supported values: "Filesystem", "Block"`},
	{"unknown access mode", pav("x", static+`, volumeValidation: {accessModes: [ReadWriteOnce, ReadWriteSome]}}`), "crd", "spec.volumeValidation.accessModes[1]", `Unsupported value: "ReadWriteSome": supported values: "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"`},
	{"empty accessModes", pav("x", static+`, volumeValidation: {accessModes: []}}`), "crd", "spec.volumeValidation.accessModes", "should have at least 1 items"},
	{"empty volumeModes", pav("x", static+`, volumeValidation: {volumeModes: []}}`), "crd", "spec.volumeValidation.volumeModes", "should have at least 1 items"},
	{"volume mode as a plain string, not a list", pav("x", static+`, volumeValidation: {volumeModes: Filesystem}}`), "crd", "spec.volumeValidation.volumeModes", `should match '\{\{|\{%'`},
	{"access modes as an object", pav("x", static+`, volumeValidation: {accessModes: {ReadWriteOnce: true}}}`), "policy", "spec.volumeValidation.accessModes", "must be a list or a template string containing {{ or {% (found an object)"},
	{"number in a mode list", pav("x", static+`, volumeValidation: {volumeModes: [1]}}`), "crd", "spec.volumeValidation.volumeModes[0]", "must be of type string"},

	// template-or-object fields
	{"non-template string for volumeStaging", pav("x", `{provisioningModes: [Static], volumeStaging: hello}`), "crd", "spec.volumeStaging", `should match '\{\{|\{%'`},
	{"non-template string for a pod template", pav("x", `{provisioningModes: [Static], volumeStaging: {podTemplate: "busybox"}}`), "crd", "spec.volumeStaging.podTemplate", `should match '\{\{|\{%'`},
	{"non-template string for a pod spec", pav("x", `{provisioningModes: [Static], volumeStaging: {podTemplate: {spec: "containers: []"}}}`), "crd", "spec.volumeStaging.podTemplate.spec", `should match '\{\{|\{%'`},
	{"number where a pod template is expected", pav("x", `{provisioningModes: [Static], volumeStaging: {podTemplate: 42}}`), "policy", "spec.volumeStaging.podTemplate", "must be an object or a template string containing {{ or {% (found a number)"},
	{"number for a whole phase", pav("x", static+`, volumeValidation: 42}`), "policy", "spec.volumeValidation", "must be an object or a template string containing {{ or {% (found a number)"},
	{"list for a whole phase", pav("x", static+`, volumeUnstaging: [{podTemplate: {}}]}`), "policy", "spec.volumeUnstaging", "(found a list)"},
	{"boolean pod metadata", pav("x", `{provisioningModes: [Static], volumeStaging: {podTemplate: {metadata: true}}}`), "policy", "spec.volumeStaging.podTemplate.metadata", "(found a boolean)"},
	{"number where a string (handle) is expected", pav("x", `{provisioningModes: [Dynamic], volumeCreation: {handle: 42, capacity: 1Gi}, `+staging+`}`), "crd", "spec.volumeCreation.handle", `must be of type string: "integer"`},
	{"empty handle", pav("x", `{provisioningModes: [Dynamic], volumeCreation: {handle: "", capacity: 1Gi}, `+staging+`}`), "crd", "spec.volumeCreation.handle", "should be at least 1 chars long"},

	// volumeDeletion.whenNamespaceGone: a literal, never a template
	{"whenNamespaceGone as a template", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeDeletion: {whenNamespaceGone: "{{ pvc.metadata.annotations.forget }}"}}`), "crd", "spec.volumeDeletion.whenNamespaceGone", "Unsupported value"},
	{"whenNamespaceGone misspelt", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeDeletion: {whenNamespaceGone: forget}}`), "crd", "spec.volumeDeletion.whenNamespaceGone", "Unsupported value"},
	{"whenNamespaceGone a boolean", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeDeletion: {whenNamespaceGone: true}}`), "crd", "spec.volumeDeletion.whenNamespaceGone", "must be of type string"},
	{"unknown field in volumeDeletion", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeDeletion: {whenGone: Forget}}`), "policy", "spec.volumeDeletion", "unknown field(s) whenGone; volumeDeletion may only hold podTemplate, whenNamespaceGone"},

	// volumeExpansion, volumeNodeExpansion
	{"online as a template", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, volumeExpansion: {online: "{{ params.online }}"}}`), "crd", "spec.volumeExpansion.online", "must be of type boolean"},
	{"online as a string", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, volumeExpansion: {online: "yes"}}`), "crd", "spec.volumeExpansion.online", "must be of type boolean"},
	{"unknown field in volumeExpansion", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, volumeExpansion: {offline: true}}`), "policy", "spec.volumeExpansion", "unknown field(s) offline; volumeExpansion may only hold online, capacity, podTemplate"},
	{"number for volumeExpansion", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, volumeExpansion: 1}`), "policy", "spec.volumeExpansion", "(found a number)"},
	{"zero expansion capacity", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, volumeExpansion: {capacity: "0"}}`), "policy", "spec.volumeExpansion.capacity", `(found "0")`},
	{"negative expansion capacity", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, volumeExpansion: {capacity: -1}}`), "crd", "spec.volumeExpansion.capacity", "should be greater than or equal to 1"},
	{"expansion pod without containers", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, volumeExpansion: {podTemplate: {spec: {}}}}`), "policy", "spec.volumeExpansion.podTemplate.spec.containers", "needs at least one container"},
	{"volumeNodeExpansion without volumeExpansion", pav("x", static+`, volumeNodeExpansion: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "crd", "spec.volumeNodeExpansion", "needs spec.volumeExpansion"},
	{"volumeNodeExpansion without podTemplate", pav("x", static+`, volumeExpansion: {}, volumeNodeExpansion: {}}`), "crd", "spec.volumeNodeExpansion.podTemplate", "Required value"},
	{"node expansion pod as a whole Pod", pav("x", static+`, volumeExpansion: {}, volumeNodeExpansion: {podTemplate: {kind: Pod, spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.volumeNodeExpansion.podTemplate", "unknown field(s) kind; a pod template may only hold metadata and spec"},
	{"unknown field in volumeNodeExpansion", pav("x", static+`, volumeExpansion: {}, volumeNodeExpansion: {online: true, podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.volumeNodeExpansion", "unknown field(s) online; volumeNodeExpansion may only hold podTemplate"},

	// snapshotCreation, snapshotDeletion
	{"snapshotCreation without Dynamic", pav("x", static+`, snapshotCreation: {}}`), "crd", "spec.snapshotCreation", "may only be set when spec.provisioningModes contains Dynamic"},
	{"snapshotDeletion without snapshotCreation", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, snapshotDeletion: {}}`), "crd", "spec.snapshotDeletion", "needs spec.snapshotCreation"},
	{"empty snapshot handle", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, snapshotCreation: {handle: ""}}`), "crd", "spec.snapshotCreation.handle", "should be at least 1 chars long"},
	{"unknown field in snapshotCreation", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, snapshotCreation: {capacity: 1Gi}}`), "policy", "spec.snapshotCreation", "unknown field(s) capacity; snapshotCreation may only hold handle, podTemplate"},
	{"snapshot pod metadata as a list", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, snapshotCreation: {podTemplate: {metadata: [], spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.snapshotCreation.podTemplate.metadata", "(found a list)"},
	{"snapshot deletion pod with status", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, snapshotCreation: {}, snapshotDeletion: {podTemplate: {spec: {containers: [{name: c, image: b}]}, status: {}}}}`), "policy", "spec.snapshotDeletion.podTemplate", "a pod template may only hold metadata and spec"},
	{"boolean snapshotDeletion", pav("x", dynamic+`, `+"volumeCreation: {capacity: 1Gi}"+`, snapshotCreation: {}, snapshotDeletion: true}`), "policy", "spec.snapshotDeletion", "(found a boolean)"},

	// volumeCreation.contentSources, volumeCreation.accessibleTopology
	{"restores without snapshotCreation", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, contentSources: [Volume, Snapshot]}}`), "policy", "spec.volumeCreation.contentSources", "lists Snapshot, which needs spec.snapshotCreation"},
	{"unknown content source", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, contentSources: [PVC]}}`), "crd", "spec.volumeCreation.contentSources[0]", `Unsupported value: "PVC": supported values: "Snapshot", "Volume"`},
	{"content source listed twice", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, contentSources: [Volume, Volume]}}`), "crd", "spec.volumeCreation.contentSources[1]", `Duplicate value: "Volume"`},
	{"templated contentSources", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, contentSources: "{{ params.sources }}"}}`), "crd", "spec.volumeCreation.contentSources", "must be of type array"},
	{"empty contentSources", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, contentSources: []}}`), "crd", "spec.volumeCreation.contentSources", "should have at least 1 items"},
	{"accessibleTopology as a number", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, accessibleTopology: 3}}`), "policy", "spec.volumeCreation.accessibleTopology", "(found a number)"},
	{"accessibleTopology as a plain string", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, accessibleTopology: zone-a}}`), "crd", "spec.volumeCreation.accessibleTopology", `should match '\{\{|\{%'`},
	{"accessible segment with a bad key", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, accessibleTopology: [{"zone!": a}]}}`), "policy", "spec.volumeCreation.accessibleTopology", "each segment must be a non-empty map of topology key"},
	{"accessible segment with a bad value", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, accessibleTopology: {zone: "a b"}}}`), "policy", "spec.volumeCreation.accessibleTopology", "to a label value or a template string"},
	{"accessible segment with a number value", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, accessibleTopology: [{zone: 1}]}}`), "crd", "spec.volumeCreation.accessibleTopology[0].zone", "must be of type string"},
	{"empty accessible segment", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, accessibleTopology: [{}]}}`), "crd", "spec.volumeCreation.accessibleTopology[0]", "should have at least 1 properties"},
	{"accessible segment as a string", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi, accessibleTopology: [zone-a]}}`), "crd", "spec.volumeCreation.accessibleTopology[0]", "must be of type object"},

	// topology (typed, never templated)
	{"topology without nodeLabels", pav("x", static+`, topology: {}}`), "crd", "spec.topology.nodeLabels", "Required value"},
	{"empty nodeLabels", pav("x", static+`, topology: {nodeLabels: []}}`), "crd", "spec.topology.nodeLabels", "should have at least 1 items"},
	{"templated nodeLabels", pav("x", static+`, topology: {nodeLabels: "{{ params.labels }}"}}`), "crd", "spec.topology.nodeLabels", "must be of type array"},
	{"templated topology", pav("x", static+`, topology: "{% set yaml = true %}nodeLabels: [zone]"}`), "crd", "spec.topology", "must be of type object"},
	{"node label that is not a label key", pav("x", static+`, topology: {nodeLabels: [kubernetes.io/hostname, "zone/"]}}`), "crd", "spec.topology.nodeLabels[1]", "should match"},
	{"node label with a 64-character name", pav("x", static+`, topology: {nodeLabels: [example.com/`+strings.Repeat("n", 64)+`]}}`), "crd", "spec.topology.nodeLabels[0]", "should match"},
	{"node label with a 254-character prefix", pav("x", static+`, topology: {nodeLabels: [`+strings.Repeat("a.", 127)+`b/zone]}}`), "crd", "spec.topology.nodeLabels[0]", "its prefix (before '/') is at most 253 characters"},
	{"node label listed twice", pav("x", static+`, topology: {nodeLabels: [zone, zone]}}`), "crd", "spec.topology.nodeLabels[1]", `Duplicate value: "zone"`},
	{"unknown field in topology", pav("x", static+`, topology: {nodeLabels: [zone], keys: [zone]}}`), "crd", "spec.topology.keys", `unknown field "spec.topology.keys"`},

	// Issue 35: provisioningModes with Ephemeral
	{"unknown provisioning mode lists Ephemeral", pav("x", `{provisioningModes: [Inline], `+staging+`}`), "crd", "spec.provisioningModes[0]", `Unsupported value: "Inline": supported values: "Dynamic", "Static", "Ephemeral"`},
	{"Ephemeral twice", pav("x", `{provisioningModes: [Ephemeral, Ephemeral], `+staging+`}`), "crd", "spec.provisioningModes[1]", `Duplicate value: "Ephemeral"`},
	{"volumeCreation with Static only", pav("x", static+`, volumeCreation: {capacity: 1Gi}}`), "crd", "spec.volumeCreation", "may only be set when spec.provisioningModes contains Dynamic or Ephemeral: add Dynamic or Ephemeral to provisioningModes, or remove volumeCreation"},
	{"snapshotCreation with Ephemeral only", pav("x", `{provisioningModes: [Ephemeral], snapshotCreation: {}, `+staging+`}`), "crd", "spec.snapshotCreation", "may only be set when spec.provisioningModes contains Dynamic"},

	// maxVolumesPerNode (typed, never templated)
	{"volume limit 0", pav("x", static+`, maxVolumesPerNode: 0}`), "crd", "spec.maxVolumesPerNode", "should be greater than or equal to 1"},
	{"negative volume limit", pav("x", static+`, maxVolumesPerNode: -3}`), "crd", "spec.maxVolumesPerNode", "should be greater than or equal to 1"},
	{"volume limit above int32", pav("x", static+`, maxVolumesPerNode: 2147483648}`), "crd", "spec.maxVolumesPerNode", "should be less than or equal to 2147483647"},
	{"volume limit as a string", pav("x", static+`, maxVolumesPerNode: "32"}`), "crd", "spec.maxVolumesPerNode", `must be of type integer: "string"`},
	{"templated volume limit", pav("x", static+`, maxVolumesPerNode: "{{ params.max }}"}`), "crd", "spec.maxVolumesPerNode", "must be of type integer"},
	{"fractional volume limit", pav("x", static+`, maxVolumesPerNode: 1.5}`), "crd", "spec.maxVolumesPerNode", "must be of type int64"},

	// storageCapacity
	{"storageCapacity without Dynamic", pav("x", static+`, storageCapacity: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "crd", "spec.storageCapacity", "may only be set when spec.provisioningModes contains Dynamic (capacity is asked for volumes yet to be created): add Dynamic to provisioningModes or remove storageCapacity"},
	{"storageCapacity without podTemplate", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: 1m}}`), "crd", "spec.storageCapacity.podTemplate", "Required value"},
	{"storageCapacity as a plain string", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: df}`), "crd", "spec.storageCapacity", `should match '\{\{|\{%'`},
	{"storageCapacity as a list", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: [{podTemplate: {}}]}`), "policy", "spec.storageCapacity", "must be an object or a template string containing {{ or {% (found a list)"},
	{"unknown field in storageCapacity", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {interval: 1m, podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.storageCapacity", "unknown field(s) interval; storageCapacity may only hold refreshInterval, podTemplate"},
	{"refresh interval too short", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: 5s, podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.storageCapacity.refreshInterval", `must be a literal Go duration of at least 10s, such as 30s, 1m or 1h30m (a number and a unit each time: ns, us, ms, s, m, h) (found "5s")`},
	{"refresh interval just short", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: 9999ms, podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.storageCapacity.refreshInterval", `(found "9999ms")`},
	{"refresh interval without a unit", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: "60", podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.storageCapacity.refreshInterval", `(found "60")`},
	{"refresh interval in days", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: 1d, podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.storageCapacity.refreshInterval", `(found "1d")`},
	{"negative refresh interval", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: -1m, podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.storageCapacity.refreshInterval", `(found "-1m")`},
	{"refresh interval with a space", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: "1 m", podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.storageCapacity.refreshInterval", `(found "1 m")`},
	{"refresh interval with 7 digits", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: 1000000s, podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.storageCapacity.refreshInterval", `(found "1000000s")`},
	{"templated refresh interval", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: "{{ params.i }}", podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.storageCapacity.refreshInterval", `must be a literal Go duration`},
	{"refresh interval as a number", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: 60, podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "crd", "spec.storageCapacity.refreshInterval", `must be of type string: "integer"`},
	{"refresh interval too long", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: "999999h999999h99h", podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "crd", "spec.storageCapacity.refreshInterval", "may not be more than 16 bytes"},
	{"empty refresh interval", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {refreshInterval: "", podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "crd", "spec.storageCapacity.refreshInterval", "should be at least 1 chars long"},
	{"capacity pod without containers", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {podTemplate: {spec: {}}}}`), "policy", "spec.storageCapacity.podTemplate.spec.containers", "needs at least one container"},
	{"capacity pod as a whole Pod", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {podTemplate: {kind: Pod, spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.storageCapacity.podTemplate", "unknown field(s) kind; a pod template may only hold metadata and spec"},
	{"capacity pod metadata as a number", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {podTemplate: {metadata: 1, spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.storageCapacity.podTemplate.metadata", "(found a number)"},
	{"capacity pod spec as a plain string", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, storageCapacity: {podTemplate: {spec: "containers: []"}}}`), "crd", "spec.storageCapacity.podTemplate.spec", `should match '\{\{|\{%'`},

	// volumeModification (a typed object: never a template string)
	{"volumeModification without Dynamic", pav("x", static+`, volumeModification: {mutableParameters: [iops]}}`), "crd", "spec.volumeModification", "may only be set when spec.provisioningModes contains Dynamic (pav keeps the parameters of the volumes it creates; static volumes have no record): add Dynamic to provisioningModes or remove volumeModification"},
	{"volumeModification as a template", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: "{% set yaml = true %}mutableParameters: [iops]"}`), "crd", "spec.volumeModification", `must be of type object: "string"`},
	{"volumeModification without mutableParameters", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "crd", "spec.volumeModification.mutableParameters", "Required value"},
	{"empty mutableParameters", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: []}}`), "crd", "spec.volumeModification.mutableParameters", "should have at least 1 items"},
	{"templated mutableParameters", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: "{{ params.keys }}"}}`), "crd", "spec.volumeModification.mutableParameters", "must be of type array"},
	{"mutable parameter listed twice", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [iops, tier, iops]}}`), "crd", "spec.volumeModification.mutableParameters[2]", `Duplicate value: "iops"`},
	{"reserved mutable parameter", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [iops, csi.storage.k8s.io/fstype]}}`), "crd", "spec.volumeModification.mutableParameters[1]", "starts with csi.storage.k8s.io/, which Kubernetes and the CSI sidecars reserve for their own keys: rename the parameter"},
	{"templated mutable parameter", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: ["{{ params.key }}"]}}`), "crd", "spec.volumeModification.mutableParameters[0]", "must be a literal parameter key, not a template"},
	{"empty mutable parameter", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [""]}}`), "crd", "spec.volumeModification.mutableParameters[0]", "should be at least 1 chars long"},
	{"mutable parameter of 254 characters", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [`+strings.Repeat("k", 254)+`]}}`), "crd", "spec.volumeModification.mutableParameters[0]", "may not be more than 253 bytes"},
	{"65 mutable parameters", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [`+manyKeys(65, 8)+`]}}`), "crd", "spec.volumeModification.mutableParameters", "must have at most 64 items"},
	{"mutable parameter as a number", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [1]}}`), "crd", "spec.volumeModification.mutableParameters[0]", "must be of type string"},
	{"unknown field in volumeModification", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [iops], defaults: {}}}`), "crd", "spec.volumeModification.defaults", `unknown field "spec.volumeModification.defaults"`},
	{"modification pod without containers", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [iops], podTemplate: {spec: {containers: []}}}}`), "policy", "spec.volumeModification.podTemplate.spec.containers", "needs at least one container"},
	{"modification pod as a number", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [iops], podTemplate: 7}}`), "policy", "spec.volumeModification.podTemplate", "(found a number)"},
	{"modification pod with status", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, volumeModification: {mutableParameters: [iops], podTemplate: {spec: {containers: [{name: c, image: b}]}, status: {}}}}`), "policy", "spec.volumeModification.podTemplate", "unknown field(s) status; a pod template may only hold metadata and spec"},

	// groupSnapshotCreation, groupSnapshotDeletion
	{"groupSnapshotCreation without Dynamic", pav("x", static+`, groupSnapshotCreation: {}}`), "crd", "spec.groupSnapshotCreation", "may only be set when spec.provisioningModes contains Dynamic (snapshots are taken of dynamically provisioned volumes): add Dynamic to provisioningModes or remove groupSnapshotCreation"},
	{"groupSnapshotCreation without snapshotCreation", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, groupSnapshotCreation: {}}`), "crd", "spec.groupSnapshotCreation", "needs spec.snapshotCreation (which may be just {}): a group snapshot is made of ordinary snapshots"},
	{"groupSnapshotDeletion without Dynamic", pav("x", static+`, groupSnapshotDeletion: {}}`), "crd", "spec.groupSnapshotDeletion", "may only be set when spec.provisioningModes contains Dynamic: add Dynamic to provisioningModes or remove groupSnapshotDeletion"},
	{"groupSnapshotDeletion without groupSnapshotCreation", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, groupSnapshotDeletion: {}}`), "crd", "spec.groupSnapshotDeletion", "needs spec.groupSnapshotCreation: there are no group snapshots to delete without it"},
	{"unknown field in groupSnapshotCreation", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, groupSnapshotCreation: {handle: h}}`), "policy", "spec.groupSnapshotCreation", "unknown field(s) handle; groupSnapshotCreation may only hold podTemplate"},
	{"number for groupSnapshotDeletion", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, groupSnapshotCreation: {}, groupSnapshotDeletion: 1}`), "policy", "spec.groupSnapshotDeletion", "(found a number)"},
	{"group snapshot pod without containers", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, groupSnapshotCreation: {podTemplate: {metadata: {}}}}`), "policy", "spec.groupSnapshotCreation.podTemplate.spec.containers", "needs at least one container"},
	{"group snapshot deletion pod spec as a list", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, groupSnapshotCreation: {}, groupSnapshotDeletion: {podTemplate: {spec: []}}}`), "policy", "spec.groupSnapshotDeletion.podTemplate.spec", "(found a list)"},

	// snapshotMetadata
	{"snapshotMetadata without snapshotCreation", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotMetadata: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "crd", "spec.snapshotMetadata", "needs spec.snapshotCreation: it lists the blocks of snapshots, and there are none without it"},
	{"snapshotMetadata without podTemplate", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, snapshotMetadata: {}}`), "crd", "spec.snapshotMetadata.podTemplate", "Required value"},
	{"unknown field in snapshotMetadata", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, snapshotMetadata: {blockSize: 4096, podTemplate: {spec: {containers: [{name: c, image: b}]}}}}`), "policy", "spec.snapshotMetadata", "unknown field(s) blockSize; snapshotMetadata may only hold podTemplate"},
	{"boolean snapshotMetadata", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, snapshotMetadata: true}`), "policy", "spec.snapshotMetadata", "(found a boolean)"},
	{"snapshot metadata pod without containers", pav("x", dynamic+`, volumeCreation: {capacity: 1Gi}, snapshotCreation: {}, snapshotMetadata: {podTemplate: {spec: {containers: []}}}}`), "policy", "spec.snapshotMetadata.podTemplate.spec.containers", "needs at least one container"},

	// status
	{"condition with an unknown status", pav("x", static+`}`) + "status: {conditions: [{type: Valid, status: Maybe, reason: R, message: m, lastTransitionTime: '2024-01-01T00:00:00Z'}]}\n", "crd", "status.conditions[0].status", `Unsupported value: "Maybe"`},
	{"duplicate condition type", pav("x", static+`}`) + "status: {conditions: [{type: Valid, status: 'True', reason: R, message: m, lastTransitionTime: '2024-01-01T00:00:00Z'}, {type: Valid, status: 'False', reason: R, message: m, lastTransitionTime: '2024-01-01T00:00:00Z'}]}\n", "crd", "status.conditions[1]", "Duplicate value"},
}

func TestInvalidObjects(t *testing.T) {
	a := newAdmitter(t)
	for _, c := range invalidObjects {
		t.Run(c.name, func(t *testing.T) {
			rs := a.admit(t, c.obj, "")
			if len(rs) == 0 {
				t.Fatalf("admitted, want a %s rejection of %s containing %q", c.layer, c.field, c.msg)
			}
			for _, r := range rs {
				if r.layer == c.layer && r.field == c.field && strings.Contains(r.msg, c.msg) {
					return
				}
			}
			t.Fatalf("want a %s rejection of %s containing %q, got:%s", c.layer, c.field, c.msg, rejectionsString(rs))
		})
	}
}

// Updates that leave the spec alone (the drivers adding and removing finalizers)
// must go through even for an object the policy would now refuse, else such an
// object could never be deleted; spec changes are checked.
func TestPolicyOnUpdates(t *testing.T) {
	a := newAdmitter(t)
	bad := pav("x", static+`, volumeValidation: {minCapacity: 2Gi, maxCapacity: 1Gi}}`)
	withFinalizer := strings.Replace(bad, "  name: x\n", "  name: x\n  finalizers: [pav.albertofaria.github.io/volumes]\n", 1)
	if rs := a.admit(t, withFinalizer, bad); len(rs) > 0 {
		t.Errorf("metadata-only update of an invalid object refused:%s", rejectionsString(rs))
	}
	good := pav("x", static+`}`)
	if rs := a.admit(t, bad, good); len(rs) != 1 || rs[0].field != "spec.volumeValidation.minCapacity" {
		t.Errorf("spec update to an invalid spec: got%s", rejectionsString(rs))
	}
	if rs := a.admit(t, good, bad); len(rs) > 0 {
		t.Errorf("spec update fixing the object refused:%s", rejectionsString(rs))
	}
}

// Every rejection names a field and the policy never fails with an evaluation
// error (which failurePolicy Fail would turn into an unhelpful denial), whatever
// JSON type appears where.
func TestPolicyNeverErrors(t *testing.T) {
	a := newAdmitter(t)
	values := []string{`null`, `42`, `-3`, `1.5`, `true`, `"x"`, `"{{ x }}"`, `[]`, `[1, "a", {}]`, `{}`, `{podTemplate: 7, a: [1]}`, `{metadata: 1, spec: [2]}`}
	fields := []string{
		"volumeValidation", "volumeValidation.volumeModes", "volumeValidation.minCapacity", "volumeValidation.maxCapacity",
		"volumeValidation.podTemplate", "volumeValidation.podTemplate.spec", "volumeCreation", "volumeCreation.capacity",
		"volumeCreation.podTemplate", "volumeStaging", "volumeStaging.podTemplate", "volumeStaging.podTemplate.metadata",
		"volumeDeletion", "volumeDeletion.whenNamespaceGone", "volumeUnstaging.podTemplate",
		"volumeExpansion", "volumeExpansion.capacity", "volumeExpansion.online", "volumeExpansion.podTemplate.spec",
		"volumeCreation.contentSources", "volumeCreation.accessibleTopology", "snapshotCreation.podTemplate", "topology.nodeLabels",
		"maxVolumesPerNode", "storageCapacity", "storageCapacity.refreshInterval", "storageCapacity.podTemplate", "storageCapacity.podTemplate.metadata",
		"volumeModification", "volumeModification.mutableParameters", "volumeModification.podTemplate", "volumeModification.podTemplate.spec",
		"groupSnapshotCreation", "groupSnapshotCreation.podTemplate", "groupSnapshotDeletion.podTemplate.spec",
		"snapshotMetadata", "snapshotMetadata.podTemplate", "snapshotMetadata.podTemplate.spec",
	}
	n := 0
	for _, f := range fields {
		for _, v := range values {
			// Build {a: {b: v}} for field "a.b" on top of a dynamic, valid spec.
			parts := strings.Split(f, ".")
			val := v
			for i := len(parts) - 1; i >= 1; i-- {
				val = "{" + parts[i] + ": " + val + "}"
			}
			spec := `{provisioningModes: [Dynamic], volumeCreation: {capacity: 1Gi}, volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}, ` + parts[0] + `: ` + val + `}`
			if parts[0] == "volumeCreation" || parts[0] == "volumeStaging" {
				spec = `{provisioningModes: [Dynamic], ` + map[string]string{"volumeCreation": "volumeStaging: {podTemplate: {spec: {containers: [{name: c, image: b}]}}}", "volumeStaging": "volumeCreation: {capacity: 1Gi}"}[parts[0]] + `, ` + parts[0] + `: ` + val + `}`
			}
			for _, r := range a.admit(t, pav("x", spec), "") {
				n++
				if r.field == "" {
					t.Errorf("%s = %s: rejection without a field: [%s] %s", f, v, r.layer, r.msg)
				}
			}
		}
	}
	if n == 0 {
		t.Error("nothing was rejected")
	}
}

// The status schema has exactly the fields of the Go type the manager writes:
// a field the schema lacks would be pruned by the API server without a word.
func TestStatusSchemaMatchesTheAPI(t *testing.T) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(CRDYAML, crd); err != nil {
		t.Fatal(err)
	}
	var inSchema []string
	for k := range crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"].Properties {
		inSchema = append(inSchema, k)
	}
	var inGo []string
	st := reflect.TypeOf(v1alpha1.PavProvisionerStatus{})
	for i := range st.NumField() {
		inGo = append(inGo, strings.Split(st.Field(i).Tag.Get("json"), ",")[0])
	}
	slices.Sort(inSchema)
	slices.Sort(inGo)
	if !slices.Equal(inSchema, inGo) {
		t.Errorf("status schema has %v, the Go type %v", inSchema, inGo)
	}
}
