package deploy

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// PaV 0.1.1's three example PavProvisioners (test/pav-0.1.1, unchanged copies: see its
// README) pass the API server's admission of PavProvisioners: the CRD's schema and CEL
// rules with strict field validation, then the validating admission policy.
func TestPaVExamplesAreAdmitted(t *testing.T) {
	files, err := filepath.Glob("../test/pav-0.1.1/examples/*/provisioner.yaml")
	if err != nil || len(files) != 3 {
		t.Fatalf("PaV's examples: %v %v", files, err)
	}
	admitFiles(t, files)
}

// Every examples/<name>/provisioner.yaml holds exactly one object, a PavProvisioner that
// the API server admits: `kubectl create -f examples/<name>/provisioner.yaml` works alone.
func TestExampleProvisionersAreAdmitted(t *testing.T) {
	files, err := filepath.Glob("../examples/*/provisioner.yaml")
	if err != nil || len(files) < 5 {
		t.Fatalf("examples: %v %v", files, err)
	}
	admitFiles(t, files)
}

func admitFiles(t *testing.T, files []string) {
	t.Helper()
	a := newAdmitter(t)
	for _, f := range files {
		t.Run(filepath.Base(filepath.Dir(f)), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			// One document (comment-only documents aside).
			var docs [][]byte
			r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
			for {
				d, err := r.Read()
				if err != nil {
					break
				}
				if j, err := yaml.YAMLToJSON(d); err != nil || string(j) != "null" {
					docs = append(docs, d)
				}
			}
			if len(docs) != 1 {
				t.Fatalf("%s holds %d YAML documents, want only the PavProvisioner", f, len(docs))
			}
			if rs := a.admit(t, string(docs[0]), ""); len(rs) > 0 {
				t.Fatalf("%s rejected:%s", f, rejectionsString(rs))
			}
		})
	}
}
