package manager

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/yaml"
)

// The manager and the deploy/provisioner component (GitOps, no manager) deploy
// the same objects for a provisioner: the manager adds only its owner reference
// and managed-by label. Kustomize is run through kubectl (not a Go dependency).
// The component carries every sidecar, so the provisioner compared has the
// phases that bring them (volumeExpansion, snapshotCreation).
func TestManagerDeploysWhatTheComponentDoes(t *testing.T) {
	kubectl := os.Getenv("KUBECTL")
	if kubectl == "" {
		kubectl = "../../_output/bin/kubectl"
	}
	if _, err := os.Stat(kubectl); err != nil {
		t.Skipf("no kubectl at %s (make tools, or set KUBECTL): the component is not compared", kubectl)
	}
	component, err := filepath.Abs("../../deploy/provisioner")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// kustomize takes components by relative path only.
	component, err = filepath.Rel(dir, component)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"kustomization.yaml": "resources: [provisioner.yaml]\ncomponents: [" + component + "]\n",
		"provisioner.yaml":   mustYAML(t, provisionerWithPhases("my-prov", "u", 1, phaseExpansion, phaseSnapshots).Object),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", dir)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, errb.String())
	}
	fromComponent := map[string]string{}
	for _, doc := range strings.Split(out.String(), "\n---\n") {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatal(err)
		}
		var v any
		switch head.Kind {
		case "CSIDriver":
			v = &storagev1.CSIDriver{}
		case "StatefulSet":
			v = &appsv1.StatefulSet{}
		case "DaemonSet":
			v = &appsv1.DaemonSet{}
		default:
			continue
		}
		if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
			t.Fatal(err)
		}
		fromComponent[head.Kind] = mustJSON(t, v)
	}

	o, err := Render(typed(t, provisionerWithPhases("my-prov", "u", 1, phaseExpansion, phaseSnapshots)), "pav", Settings{})
	if err != nil {
		t.Fatal(err)
	}
	o.CSIDriver.OwnerReferences, o.Controller.OwnerReferences, o.Node.OwnerReferences = nil, nil, nil
	delete(o.CSIDriver.Labels, labelManagedBy)
	delete(o.Controller.Labels, labelManagedBy)
	delete(o.Node.Labels, labelManagedBy)
	// So is the digest of what it applied (drift.go).
	o.CSIDriver.Annotations, o.Controller.Annotations, o.Node.Annotations = nil, nil, nil
	// The features annotation is the manager's own: it rolls the drivers when
	// a spec edit changes their capabilities (GitOps users restart them).
	for _, t := range []map[string]string{o.Controller.Spec.Template.Annotations, o.Node.Spec.Template.Annotations} {
		delete(t, AnnotationFeatures)
	}
	o.Controller.Spec.Template.Annotations, o.Node.Spec.Template.Annotations = nil, nil
	for kind, v := range map[string]any{"CSIDriver": o.CSIDriver, "StatefulSet": o.Controller, "DaemonSet": o.Node} {
		if got := mustJSON(t, v); got != fromComponent[kind] {
			t.Errorf("%s: the manager deploys\n%s\nthe component\n%s", kind, got, fromComponent[kind])
		}
	}
}

func mustYAML(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
