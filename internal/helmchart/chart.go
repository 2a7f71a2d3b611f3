// Package helmchart makes the Helm chart charts/pav from deploy/, so that the
// two installs cannot drift apart: deploy/ (kustomize) stays the one source,
// because `kubectl apply -k deploy`, `kubectl apply -f deploy/pav.yaml`, the
// component deploy/provisioner and overlays such as test/e2e/install all build
// on its files, and Helm can render a chart from objects while kustomize cannot
// render objects from a chart.
//
// Chart reads deploy/pav.yaml (deploy/ rendered by `make manifests`, which a
// test in deploy keeps current) and deploy/manager/config.yaml, and returns
// every file of the chart:
//
//   - the objects of deploy/pav.yaml, with their namespace the value
//     `namespace`, the manager's image the value `images.pav`, and the manager's
//     ConfigMap named pav-manager (kustomize's content hash in its name becomes
//     a checksum annotation on the manager's pod template, which rolls it on a
//     change of settings, as the hash does);
//   - the CRDs and the ValidatingAdmissionPolicy as files/, read back by
//     .Files.Get: they hold Jinja's `{{`, which Helm would take for its own;
//   - values.yaml: `namespace`, then deploy/manager/config.yaml, comments
//     included: the manager's settings are the chart's values, key for key,
//     and the ConfigMap's config.yaml is every value but the chart's own.
//
// `go generate ./internal/helmchart` (run by `make manifests`) rewrites
// charts/pav; TestChartIsCurrent fails when it is not what deploy/ says, and
// the tests with a helm binary check that `helm template` gives deploy/'s
// objects back.
package helmchart

//go:generate go test -run ^TestChartIsCurrent$ -update .

import (
	"bytes"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

const (
	// Namespace is where deploy/ installs pav: the chart's default.
	Namespace = "pav"
	// ConfigMap is the name of the manager's settings in the chart (kustomize
	// adds a hash of their content to it).
	ConfigMap = "pav-manager"
	// ConfigKey is the ConfigMap's file, the manager's --config.
	ConfigKey = "config.yaml"
	// ChecksumAnnotation on the manager's pod template changes with its
	// settings, so that `helm upgrade` with new settings rolls the manager.
	ChecksumAnnotation = "checksum/config"
)

// The template actions the chart puts where deploy/ has a value. Sentinels
// stand for them while the objects are YAML nodes, then are replaced in the
// encoded text (an action is not YAML).
const (
	sentinelNamespace = "__PAV_CHART_NAMESPACE__"
	sentinelImage     = "__PAV_CHART_IMAGE__"
	sentinelChecksum  = "__PAV_CHART_CHECKSUM__"
	sentinelConfig    = "__PAV_CHART_CONFIG__"
)

var actions = strings.NewReplacer(
	sentinelNamespace, `{{ .Values.namespace | quote }}`,
	sentinelImage, `{{ .Values.images.pav | quote }}`,
	sentinelChecksum, `{{ include "pav.config" . | sha256sum }}`,
	sentinelConfig, "|\n    {{- include \"pav.config\" . | nindent 4 }}",
)

// generated heads every file that is YAML or a template.
const generated = "# Generated from deploy/ by `make manifests` (go generate ./internal/helmchart): do not edit.\n"

// object is one document of deploy/pav.yaml.
type object struct {
	text       string // as kustomize wrote it
	node       *yaml.Node
	kind, name string
}

// Chart returns the files of charts/pav, by path relative to it, made from
// install (deploy/pav.yaml) and config (deploy/manager/config.yaml).
func Chart(install, config []byte) (map[string][]byte, error) {
	objs, err := split(install)
	if err != nil {
		return nil, err
	}
	var (
		files                   = map[string][]byte{}
		crds, policy, rbac, mgr []string
		namespace, configMap    string
		image                   string
	)
	for _, o := range objs {
		if o.kind == "ConfigMap" && strings.HasPrefix(o.name, ConfigMap+"-") {
			configMap = o.name
		}
	}
	if configMap == "" {
		return nil, fmt.Errorf("deploy/pav.yaml has no ConfigMap %s-HASH (the manager's settings)", ConfigMap)
	}
	for _, o := range objs {
		switch o.kind {
		case "CustomResourceDefinition":
			crds = append(crds, o.text)
			continue
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			policy = append(policy, o.text)
			continue
		}
		var out *[]string
		switch {
		case o.kind == "Namespace" && o.name == Namespace:
		case (o.kind == "ConfigMap" && o.name == configMap) || (o.kind == "Deployment" && o.name == ConfigMap):
			out = &mgr
		case strings.HasSuffix(o.kind, "Role") || strings.HasSuffix(o.kind, "RoleBinding") || o.kind == "ServiceAccount":
			out = &rbac
		default:
			// A new object in deploy/ needs a decision here: which file, what is a value.
			return nil, fmt.Errorf("deploy/pav.yaml: %s %s: the chart generator does not know this object", o.kind, o.name)
		}
		err := template(o, configMap)
		if err == nil && o.kind == "Deployment" {
			if image, err = managerImage(o.node); err == nil {
				err = deployment(o.node)
			}
		}
		var text string
		if err == nil {
			text, err = encode(o.node)
		}
		if err != nil {
			return nil, fmt.Errorf("deploy/pav.yaml: %s %s: %w", o.kind, o.name, err)
		}
		if out == nil {
			namespace = text
		} else {
			*out = append(*out, text)
		}
	}
	if namespace == "" || image == "" || len(crds) == 0 || len(policy) == 0 || len(rbac) == 0 {
		return nil, fmt.Errorf("deploy/pav.yaml lacks the namespace, the manager's Deployment, the CRDs, the policy or the RBAC")
	}
	version, err := appVersion(image)
	if err != nil {
		return nil, err
	}
	var settings struct {
		Images struct{ Pav string }
	}
	if err := yaml.Unmarshal(config, &settings); err != nil {
		return nil, fmt.Errorf("deploy/manager/config.yaml: %w", err)
	}
	if settings.Images.Pav != image {
		// One value, images.pav, is both in the chart.
		return nil, fmt.Errorf("deploy/ runs the manager on %s and its drivers on %s (images.pav): the chart takes one image for both", image, settings.Images.Pav)
	}

	files["Chart.yaml"] = []byte(fmt.Sprintf(chartYAML, strings.TrimPrefix(version, "v"), version))
	files["values.yaml"], err = values(config)
	if err != nil {
		return nil, err
	}
	files["files/crds.yaml"] = []byte(strings.Join(crds, "---\n"))
	files["files/policy.yaml"] = []byte(strings.Join(policy, "---\n"))
	files["templates/_helpers.tpl"] = []byte(helpers)
	files["templates/NOTES.txt"] = []byte(notes)
	files["templates/crds.yaml"] = []byte(generated + "# The CRDs of deploy/crd, as they are (they hold Jinja's braces, which a template would take for Helm's).\n" +
		`{{ .Files.Get "files/crds.yaml" }}` + "\n")
	files["templates/policy.yaml"] = []byte(generated + "# The ValidatingAdmissionPolicies of deploy/crd (PavProvisioners, PavVolumes) and their bindings, as they are.\n" +
		`{{ .Files.Get "files/policy.yaml" }}` + "\n")
	files["templates/namespace.yaml"] = []byte(generated + namespaceHead + namespace + "{{- end }}\n")
	files["templates/rbac.yaml"] = []byte(generated + "# The ServiceAccounts and RBAC of the drivers (deploy/base) and of the manager (deploy/manager).\n" +
		strings.Join(rbac, "---\n"))
	files["templates/manager.yaml"] = []byte(generated + "# The pav manager (deploy/manager): its settings, every value but `namespace`, and its Deployment.\n" +
		strings.Join(mgr, "---\n"))
	for p, b := range files {
		if bytes.Contains(b, []byte("__PAV_CHART_")) {
			return nil, fmt.Errorf("%s: a sentinel was left in place of a template action", p)
		}
	}
	return files, nil
}

// split parses deploy/pav.yaml into its documents, keeping each one's text.
func split(install []byte) ([]*object, error) {
	var objs []*object
	for i, text := range strings.Split("\n"+string(install), "\n---\n") {
		// The first document starts after the file's header comment.
		if i == 0 {
			var body []string
			for _, l := range strings.Split(strings.TrimPrefix(text, "\n"), "\n") {
				if len(body) == 0 && (strings.HasPrefix(l, "#") || l == "") {
					continue
				}
				body = append(body, l)
			}
			text = strings.Join(body, "\n")
		}
		if !strings.HasSuffix(text, "\n") {
			text += "\n"
		}
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
			return nil, fmt.Errorf("deploy/pav.yaml, document %d: %w", i+1, err)
		}
		if len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
			return nil, fmt.Errorf("deploy/pav.yaml, document %d: not an object", i+1)
		}
		o := &object{text: text, node: doc.Content[0]}
		o.kind = scalar(o.node, "kind")
		o.name = scalar(get(o.node, "metadata"), "name")
		if o.kind == "" || o.name == "" {
			return nil, fmt.Errorf("deploy/pav.yaml, document %d: no kind or metadata.name", i+1)
		}
		objs = append(objs, o)
	}
	return objs, nil
}

// template puts the values' sentinels into an object: its namespace (and its
// subjects', for bindings) where deploy/ says pav; the manager's ConfigMap
// under its chart name, its config.yaml from the values.
func template(o *object, configMap string) error {
	meta := get(o.node, "metadata")
	if o.kind == "Namespace" {
		set(meta, "name", sentinelNamespace)
	}
	if ns := get(meta, "namespace"); ns != nil {
		if ns.Value != Namespace {
			return fmt.Errorf("namespace %s: the chart expects every object in %s", ns.Value, Namespace)
		}
		ns.Value = sentinelNamespace
	}
	if subjects := get(o.node, "subjects"); subjects != nil {
		for _, s := range subjects.Content {
			if ns := get(s, "namespace"); ns != nil && ns.Value == Namespace {
				ns.Value = sentinelNamespace
			}
		}
	}
	// Wherever deploy/ names the ConfigMap (its own name, the Deployment's volume).
	walk(o.node, func(n *yaml.Node) {
		if n.Kind == yaml.ScalarNode && n.Value == configMap {
			n.Value = ConfigMap
		}
	})
	if o.kind == "ConfigMap" && o.name == configMap {
		data := get(o.node, "data")
		if data == nil || len(data.Content) != 2 || data.Content[0].Value != ConfigKey {
			return fmt.Errorf("the manager's ConfigMap holds %s alone in deploy/", ConfigKey)
		}
		data.Content[1] = &yaml.Node{Kind: yaml.ScalarNode, Value: sentinelConfig}
	}
	return nil
}

// managerImage is the image of the manager's container.
func managerImage(deploy *yaml.Node) (string, error) {
	c := containers(deploy)
	if len(c) != 1 || scalar(c[0], "image") == "" {
		return "", fmt.Errorf("the manager's Deployment has one container with an image in deploy/")
	}
	return scalar(c[0], "image"), nil
}

// deployment makes the manager's image the value images.pav (the same image
// its settings give the drivers) and adds the settings' checksum to its pod
// template.
func deployment(deploy *yaml.Node) error {
	for _, c := range containers(deploy) {
		set(c, "image", sentinelImage)
	}
	tmeta := get(get(get(deploy, "spec"), "template"), "metadata")
	if tmeta == nil {
		return fmt.Errorf("no spec.template.metadata")
	}
	ann := get(tmeta, "annotations")
	if ann == nil {
		ann = &yaml.Node{Kind: yaml.MappingNode}
		// kustomize sorts keys: annotations come before labels.
		tmeta.Content = append([]*yaml.Node{{Kind: yaml.ScalarNode, Value: "annotations"}, ann}, tmeta.Content...)
	}
	set(ann, ChecksumAnnotation, sentinelChecksum)
	return nil
}

func containers(deploy *yaml.Node) []*yaml.Node {
	c := get(get(get(get(deploy, "spec"), "template"), "spec"), "containers")
	if c == nil {
		return nil
	}
	return c.Content
}

var imageTag = regexp.MustCompile(`^ghcr\.io/pods-as-volumes/pav:(v\d+\.\d+\.\d+\S*)$`)

// appVersion is the tag of pav's image: the chart's appVersion, and without its
// v the chart's version (the chart is released with pav).
func appVersion(image string) (string, error) {
	m := imageTag.FindStringSubmatch(image)
	if m == nil {
		return "", fmt.Errorf("the manager's image %s is not ghcr.io/pods-as-volumes/pav:vX.Y.Z", image)
	}
	return m[1], nil
}

// values is values.yaml: the chart's own value, then the manager's settings as
// deploy/manager/config.yaml writes them (without its opening paragraph, which
// is about kustomize).
func values(config []byte) ([]byte, error) {
	var probe map[string]any
	if err := yaml.Unmarshal(config, &probe); err != nil {
		return nil, fmt.Errorf("deploy/manager/config.yaml: %w", err)
	}
	if _, ok := probe["namespace"]; ok {
		return nil, fmt.Errorf("deploy/manager/config.yaml has a key namespace, which is the chart's own value")
	}
	lines := strings.Split(string(config), "\n")
	i := 0
	for i < len(lines) && strings.HasPrefix(lines[i], "#") {
		i++
	}
	for i < len(lines) && lines[i] == "" {
		i++
	}
	return []byte(valuesHead + strings.Join(lines[i:], "\n")), nil
}

// get is the value of key in a mapping node, or nil.
func get(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func scalar(n *yaml.Node, key string) string {
	if v := get(n, key); v != nil && v.Kind == yaml.ScalarNode {
		return v.Value
	}
	return ""
}

// set sets key of a mapping node to a plain scalar, adding it in key order.
func set(n *yaml.Node, key, value string) {
	if v := get(n, key); v != nil {
		*v = yaml.Node{Kind: yaml.ScalarNode, Value: value}
		return
	}
	i := sort.Search(len(n.Content)/2, func(i int) bool { return n.Content[2*i].Value > key })
	kv := []*yaml.Node{{Kind: yaml.ScalarNode, Value: key}, {Kind: yaml.ScalarNode, Value: value}}
	n.Content = append(n.Content[:2*i], append(kv, n.Content[2*i:]...)...)
}

func walk(n *yaml.Node, f func(*yaml.Node)) {
	f(n)
	for _, c := range n.Content {
		walk(c, f)
	}
}

// encode writes an object as kustomize does (two-space indents, lists not
// indented under their key), then puts the template actions in place of the
// sentinels, and escapes any other `{{` from Helm.
func encode(n *yaml.Node) (string, error) {
	var b bytes.Buffer
	e := yaml.NewEncoder(&b)
	e.CompactSeqIndent()
	e.SetIndent(2)
	if err := e.Encode(n); err != nil {
		return "", err
	}
	if err := e.Close(); err != nil {
		return "", err
	}
	s := strings.ReplaceAll(b.String(), "{{", `{{ "{{" }}`)
	return actions.Replace(s), nil
}
