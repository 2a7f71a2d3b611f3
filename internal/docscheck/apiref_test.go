package docscheck

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite docs/api-reference.md from deploy/crd")

// crdManifests are the files deploy/crd/kustomization.yaml installs, in its
// order: what a cluster gets is what the reference describes.
func crdManifests(t *testing.T) [][]byte {
	t.Helper()
	dir := filepath.Join(root, "deploy", "crd")
	k, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var kust struct {
		Resources []string `yaml:"resources"`
	}
	if err := yaml.Unmarshal(k, &kust); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, r := range kust.Resources {
		b, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestAPIReference: docs/api-reference.md is what the CRDs say. After a CRD
// change, `go generate ./internal/docscheck` rewrites it.
func TestAPIReference(t *testing.T) {
	got, err := APIReference(crdManifests(t)...)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "docs", "api-reference.md")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got == string(want) {
		return
	}
	g, w := strings.Split(got, "\n"), strings.Split(string(want), "\n")
	i := 0
	for i < len(g) && i < len(w) && g[i] == w[i] {
		i++
	}
	line := func(l []string) string {
		if i < len(l) {
			return l[i]
		}
		return "(end of file)"
	}
	t.Fatalf("docs/api-reference.md is not what deploy/crd says; run `go generate ./internal/docscheck`.\n"+
		"First difference, line %d:\n  committed: %s\n  generated: %s", i+1, line(w), line(g))
}

func TestTypeOf(t *testing.T) {
	for _, c := range []struct{ name, schema, want string }{
		{"a template-or-object field", "x-kubernetes-preserve-unknown-fields: true\npattern: '\\{\\{|\\{%'\nproperties: {a: {type: string}}",
			"object, or *template*"},
		{"a template-or-list of enums", "x-kubernetes-preserve-unknown-fields: true\npattern: '\\{\\{|\\{%'\nminItems: 1\n" +
			"items: {type: string, anyOf: [{enum: [Filesystem, Block]}, {pattern: '\\{\\{|\\{%'}]}",
			"list of string: `Filesystem`, `Block` or *template* (at least 1 item), or *template*"},
		{"a capacity", "x-kubernetes-int-or-string: true\nminimum: 1", "integer or string (≥ 1)"},
		{"a set", "type: array\nminItems: 1\nmaxItems: 2\nx-kubernetes-list-type: set\nitems: {type: string, enum: [Dynamic, Static]}",
			"set of string: `Dynamic`, `Static` (1–2 items)"},
		{"a map-list", "type: array\nx-kubernetes-list-type: map\nx-kubernetes-list-map-keys: [type]\nitems: {type: object}",
			"list of object keyed by `type`"},
		{"a map", "type: object\nadditionalProperties: {type: string}", "map of string to string"},
		{"a bounded map", "type: object\nminProperties: 1\nmaxProperties: 64\nadditionalProperties: {type: string}", "map of string to string (1–64 entries)"},
		{"a map of at most", "type: object\nmaxProperties: 64\nadditionalProperties: {type: string}", "map of string to string (at most 64 entries)"},
		{"bounded items", "type: array\nmaxItems: 16\nitems: {type: string, maxLength: 317}", "list of string (at most 16 items, each at most 317 characters)"},
		{"a free-form object", "type: object\nx-kubernetes-preserve-unknown-fields: true", "object (any fields)"},
		{"a bounded string", "type: string\nminLength: 1\nmaxLength: 63\npattern: '^[a-z]+$'", "string (1–63 characters, matching `^[a-z]+$`)"},
		{"a formatted integer", "type: integer\nformat: int64\nminimum: 0", "integer (int64, ≥ 0)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &schema{}
			var n yaml.Node
			if err := yaml.Unmarshal([]byte(c.schema), &n); err != nil {
				t.Fatal(err)
			}
			if err := decodeDocument(&n, s); err != nil {
				t.Fatal(err)
			}
			got, err := typeOf(s)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("typeOf:\n got %s\nwant %s", got, c.want)
			}
		})
	}
}

// TestAPIReferenceRefusesWhatItCannotShow: a schema keyword the reference
// does not render is an error, not a silent omission.
func TestAPIReferenceRefusesWhatItCannotShow(t *testing.T) {
	const m = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: things.example.com}
spec:
  group: example.com
  names: {kind: Thing, plural: things}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: string, x-kubernetes-embedded-resource: true}
`
	if _, err := APIReference([]byte(m)); err == nil || !strings.Contains(err.Error(), "x-kubernetes-embedded-resource") {
		t.Errorf("APIReference of a schema with an unknown keyword: %v, want an error naming it", err)
	}
}
