package helmchart

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/pods-as-volumes/pav/internal/manager"
)

// root is the repository, seen from this package's directory.
const root = "../.."

var update = flag.Bool("update", false, "rewrite charts/pav from deploy/")

var chartDir = filepath.Join(root, "charts", "pav")

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func generate(t *testing.T) map[string][]byte {
	t.Helper()
	files, err := Chart(read(t, "deploy/pav.yaml"), read(t, "deploy/manager/config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestChartIsCurrent: charts/pav is what deploy/ says, file for file, and holds
// nothing else. `make manifests` (go generate ./internal/helmchart) rewrites it.
// No helm needed: this check runs wherever go test does.
func TestChartIsCurrent(t *testing.T) {
	files := generate(t)
	if *update {
		if err := os.RemoveAll(chartDir); err != nil {
			t.Fatal(err)
		}
		for p, b := range files {
			path := filepath.Join(chartDir, p)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	const fix = "charts/pav is generated from deploy/: run `make manifests` (or go generate ./internal/helmchart)"
	seen := map[string]bool{}
	err := filepath.WalkDir(chartDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(chartDir, path)
		rel = filepath.ToSlash(rel)
		seen[rel] = true
		want, ok := files[rel]
		if !ok {
			t.Errorf("charts/pav/%s is not generated: %s", rel, fix)
			return nil
		}
		got, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, want) {
			t.Errorf("charts/pav/%s is not what deploy/ says (%s): %s", rel, firstDiff(string(got), string(want)), fix)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for p := range files {
		if !seen[p] {
			t.Errorf("charts/pav/%s is missing: %s", p, fix)
		}
	}
}

// firstDiff names the first line where committed and generated differ.
func firstDiff(committed, generated string) string {
	c, g := strings.Split(committed, "\n"), strings.Split(generated, "\n")
	i := 0
	for i < len(c) && i < len(g) && c[i] == g[i] {
		i++
	}
	line := func(l []string) string {
		if i < len(l) {
			return l[i]
		}
		return "(end of file)"
	}
	return fmt.Sprintf("line %d: committed %q, generated %q", i+1, line(c), line(g))
}

// The generator refuses what it cannot template faithfully rather than
// writing a chart that installs something else.
func TestChartRefuses(t *testing.T) {
	install, config := read(t, "deploy/pav.yaml"), read(t, "deploy/manager/config.yaml")
	for _, c := range []struct {
		name            string
		install, config string
		want            string
	}{
		{"another namespace", strings.Replace(string(install), "  namespace: pav\n", "  namespace: other\n", 1), string(config), "namespace other"},
		{"a kind it does not know", string(install) + "---\napiVersion: v1\nkind: Service\nmetadata: {name: pav, namespace: pav}\n", string(config), "does not know this object"},
		{"no manager settings", strings.Replace(string(install), "name: pav-manager-", "name: pav-settings-", 1), string(config), "no ConfigMap"},
		{"a setting named like the chart's value", string(install), string(config) + "namespace: x\n", "chart's own value"},
		{"the manager on another image than the drivers", string(install),
			strings.Replace(string(config), "pav: ghcr.io/pods-as-volumes/pav:", "pav: registry.example/pav:", 1), "one image for both"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Chart([]byte(c.install), []byte(c.config))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got error %v, want one saying %q", err, c.want)
			}
		})
	}
}

// helm finds a helm binary: $HELM (make test builds _output/bin/helm and sets
// it, so that there a missing binary is an error, not a skip), else the one
// hack/build-tools.sh builds, else PATH. Without one the helm tests skip.
func helm(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		if _, err := os.Stat(h); err != nil {
			t.Fatalf("HELM=%s: %v (hack/build-tools.sh helm builds it)", h, err)
		}
		return h
	}
	if h := filepath.Join(root, "_output", "bin", "helm"); fileExists(h) {
		return h
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h
	}
	t.Skip("no helm (hack/build-tools.sh helm builds _output/bin/helm; make test does): the chart is not rendered")
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func runHelm(t *testing.T, args ...string) []byte {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(helm(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	// No user's repositories, plugins or cache: the chart alone.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.Bytes()
}

// objects decodes a stream of YAML documents, by "Kind namespace/name".
func objects(t *testing.T, b []byte) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	d := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var o map[string]any
		err := d.Decode(&o)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if o == nil {
			continue // an empty document: a template that rendered nothing
		}
		meta, _ := o["metadata"].(map[string]any)
		key := fmt.Sprintf("%v %v/%v", o["kind"], meta["namespace"], meta["name"])
		if _, dup := out[key]; dup {
			t.Fatalf("%s twice", key)
		}
		out[key] = o
	}
}

// settings takes the manager's config.yaml out of its ConfigMap (the chart
// writes it with toYaml, kustomize as the file is: they are compared as
// objects) and returns it parsed, once the manager has loaded it as it does
// at start (strictly: an unknown key is an error).
func settings(t *testing.T, objs map[string]map[string]any, ns string) map[string]any {
	t.Helper()
	var cm map[string]any
	for k, o := range objs {
		if strings.HasPrefix(k, "ConfigMap "+ns+"/"+ConfigMap) {
			cm = o
		}
	}
	if cm == nil {
		t.Fatalf("no ConfigMap %s in namespace %s", ConfigMap, ns)
	}
	data := cm["data"].(map[string]any)
	text, _ := data[ConfigKey].(string)
	path := filepath.Join(t.TempDir(), ConfigKey)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := manager.LoadSettings(path); err != nil {
		t.Fatalf("the manager refuses its settings: %v\n%s", err, text)
	}
	var s map[string]any
	if err := yaml.Unmarshal([]byte(text), &s); err != nil {
		t.Fatal(err)
	}
	delete(data, ConfigKey)
	return s
}

// kustomized is deploy/pav.yaml as the chart names it: the manager's
// ConfigMap without kustomize's hash suffix.
func kustomized(t *testing.T) map[string]map[string]any {
	t.Helper()
	install := string(read(t, "deploy/pav.yaml"))
	objs, err := split([]byte(install))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.kind == "ConfigMap" && strings.HasPrefix(o.name, ConfigMap+"-") {
			install = strings.ReplaceAll(install, o.name, ConfigMap)
		}
	}
	return objects(t, []byte(install))
}

// managerOf is the chart's Deployment of the manager in namespace ns; its
// checksum annotation is taken out (deploy/ has none: its ConfigMap's name
// changes instead) and returned.
func managerOf(t *testing.T, objs map[string]map[string]any, ns string) (map[string]any, string) {
	t.Helper()
	d := objs["Deployment "+ns+"/"+ConfigMap]
	if d == nil {
		t.Fatalf("no Deployment %s/%s", ns, ConfigMap)
	}
	tmeta := d["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)
	ann, _ := tmeta["annotations"].(map[string]any)
	sum, _ := ann[ChecksumAnnotation].(string)
	if len(sum) != 64 {
		t.Fatalf("the manager's pod template has no %s annotation (a sha256): %v", ChecksumAnnotation, ann)
	}
	delete(ann, ChecksumAnnotation)
	if len(ann) == 0 {
		delete(tmeta, "annotations")
	}
	return d, sum
}

func render(t *testing.T, args ...string) map[string]map[string]any {
	t.Helper()
	return objects(t, runHelm(t, append([]string{"template", "pav", chartDir}, args...)...))
}

// compare reports every object that one side has and the other lacks or
// has otherwise.
func compare(t *testing.T, chart, deploy map[string]map[string]any) {
	t.Helper()
	var keys []string
	for k := range deploy {
		keys = append(keys, k)
	}
	for k := range chart {
		if _, ok := deploy[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		c, d := chart[k], deploy[k]
		switch {
		case c == nil:
			t.Errorf("%s: in deploy/, not in the chart", k)
		case d == nil:
			t.Errorf("%s: in the chart, not in deploy/", k)
		case !reflect.DeepEqual(c, d):
			cy, _ := yaml.Marshal(c)
			dy, _ := yaml.Marshal(d)
			t.Errorf("%s differs: %s", k, strings.NewReplacer("committed", "chart", "generated", "deploy/").Replace(firstDiff(string(cy), string(dy))))
		}
	}
}

// `helm template` of the chart with its default values is deploy/'s install,
// object for object, field for field: the same namespace, CRDs, policy, RBAC
// and manager, with the same settings. The differences are the ones Helm
// needs: the ConfigMap's name has no hash, and the pod template carries the
// settings' checksum instead.
func TestHelmTemplateIsTheInstall(t *testing.T) {
	chart, deploy := render(t), kustomized(t)
	if got, want := settings(t, chart, Namespace), settings(t, deploy, Namespace); !reflect.DeepEqual(got, want) {
		t.Errorf("the chart's default settings are %v, deploy/manager/config.yaml's %v", got, want)
	}
	managerOf(t, chart, Namespace)
	compare(t, chart, deploy)
}

// Installed into pav's own namespace (helm install --namespace pav), which
// Helm needs to exist already, the chart does not make it.
func TestHelmTemplateInItsNamespace(t *testing.T) {
	chart, deploy := render(t, "--namespace", Namespace), kustomized(t)
	delete(deploy, "Namespace <nil>/"+Namespace)
	settings(t, chart, Namespace)
	settings(t, deploy, Namespace)
	managerOf(t, chart, Namespace)
	compare(t, chart, deploy)
}

// Values reach what they name: namespace every namespaced object and every
// binding's subjects; images.pav the manager's container too; every other
// value the manager's settings, which it loads, with a new checksum.
func TestHelmTemplateValues(t *testing.T) {
	const ns, image = "storage", "registry.example/pav:v9.9.9"
	_, defaultSum := managerOf(t, render(t), Namespace)
	chart := render(t, "--set", "namespace="+ns, "--set", "images.pav="+image, "--set", "logLevel=5",
		"--set", "podReport=exec", "--set-json", `kubeAPI={"qps":10,"burst":20}`)
	s := settings(t, chart, ns)
	want := settings(t, kustomized(t), Namespace)
	want["images"].(map[string]any)["pav"] = image
	want["logLevel"], want["podReport"], want["kubeAPI"] = 5, "exec", map[string]any{"qps": 10, "burst": 20}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("settings %v, want %v", s, want)
	}
	d, sum := managerOf(t, chart, ns)
	if sum == defaultSum {
		t.Error("new settings, same checksum: helm upgrade would not roll the manager")
	}
	c := d["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	if c["image"] != image {
		t.Errorf("the manager's image is %v, want images.pav %s", c["image"], image)
	}
	if _, ok := chart["Namespace <nil>/"+ns]; !ok {
		t.Errorf("no Namespace %s", ns)
	}
	for k, o := range chart {
		kind, _, _ := strings.Cut(k, " ")
		meta := o["metadata"].(map[string]any)
		if n, ok := meta["namespace"]; ok && n != ns {
			t.Errorf("%s: namespace %v, want %s", k, n, ns)
		}
		if (kind == "Role" || kind == "RoleBinding" || kind == "ServiceAccount" || kind == "Deployment" || kind == "ConfigMap") && meta["namespace"] != ns {
			t.Errorf("%s is not in namespace %s", k, ns)
		}
		subjects, _ := o["subjects"].([]any)
		for _, sub := range subjects {
			if n := sub.(map[string]any)["namespace"]; n != ns {
				t.Errorf("%s: a subject in namespace %v, want %s", k, n, ns)
			}
		}
	}
}

// The local cluster's settings (test/e2e/install/config.yaml) are chart
// values as they are: the same file configures both installs.
func TestHelmTemplateLocalSettings(t *testing.T) {
	local := filepath.Join(root, "test", "e2e", "install", "config.yaml")
	chart := render(t, "--values", local)
	var want map[string]any
	if err := yaml.Unmarshal(read(t, "test/e2e/install/config.yaml"), &want); err != nil {
		t.Fatal(err)
	}
	// Keys the local file leaves out keep the chart's defaults, at every depth (Helm
	// merges --values into the chart's values map by map: images.pav set here keeps
	// images.livenessProbe's default).
	mergeDefaults(want, settings(t, kustomized(t), Namespace))
	if got := settings(t, chart, Namespace); !reflect.DeepEqual(got, want) {
		t.Errorf("settings %v, want %v", got, want)
	}
}

// mergeDefaults adds to m what defaults has and m lacks, recursively into maps.
func mergeDefaults(m, defaults map[string]any) {
	for k, v := range defaults {
		cur, ok := m[k]
		if !ok {
			m[k] = v
			continue
		}
		if cm, ok := cur.(map[string]any); ok {
			if dm, ok := v.(map[string]any); ok {
				mergeDefaults(cm, dm)
			}
		}
	}
}

func TestHelmLint(t *testing.T) {
	out := runHelm(t, "lint", "--strict", chartDir)
	t.Logf("%s", out)
}
