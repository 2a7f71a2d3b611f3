package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"sigs.k8s.io/yaml"
)

// v020 is test/pav-0.2.0: v0.2.0's PavProvisioner CRD and policy, and provisioners
// it admitted.
const v020 = "../test/pav-0.2.0"

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCRDChangesSince020AreAdditive: an upgrade from v0.2.0 needs no conversion of
// PavProvisioners: every field of v0.2.0's schema is still there, of the same type,
// with every value its enums allowed, and no field became required where v0.2.0 did
// not require it. (PavVolume and PavSnapshot are new since.)
func TestCRDChangesSince020AreAdditive(t *testing.T) {
	old, errs, err := loadCRD(readFile(t, v020+"/crd/pavprovisioners.yaml"))
	if err != nil || len(errs) > 0 {
		t.Fatalf("v0.2.0's CRD: %v%s", err, errorsString(errs))
	}
	cur, errs, err := loadCRD(CRDYAML)
	if err != nil || len(errs) > 0 {
		t.Fatalf("CRD: %v%s", err, errorsString(errs))
	}
	walked := 0
	var walk func(path string, o, n *structuralschema.Structural)
	walk = func(path string, o, n *structuralschema.Structural) {
		walked++
		if n == nil {
			t.Errorf("%s: v0.2.0 has it, this version does not", path)
			return
		}
		if o.Type != n.Type {
			t.Errorf("%s: type %q in v0.2.0, %q now", path, o.Type, n.Type)
		}
		if o.XPreserveUnknownFields && !n.XPreserveUnknownFields {
			t.Errorf("%s: kept unknown fields in v0.2.0, prunes them now", path)
		}
		if o.XIntOrString && !n.XIntOrString {
			t.Errorf("%s: int-or-string in v0.2.0, not now", path)
		}
		if o.ValueValidation != nil && len(o.ValueValidation.Enum) > 0 {
			for _, v := range o.ValueValidation.Enum {
				if n.ValueValidation == nil || len(n.ValueValidation.Enum) > 0 && !slices.ContainsFunc(n.ValueValidation.Enum, func(x structuralschema.JSON) bool { return x.Object == v.Object }) {
					t.Errorf("%s: v0.2.0 allowed %v, this version does not", path, v.Object)
				}
			}
		}
		if n.ValueValidation != nil {
			for _, r := range n.ValueValidation.Required {
				if o.ValueValidation == nil || !slices.Contains(o.ValueValidation.Required, r) {
					if _, existed := o.Properties[r]; existed || o.Properties != nil {
						t.Errorf("%s.%s: required now, not in v0.2.0", path, r)
					}
				}
			}
		}
		for name, op := range o.Properties {
			var np *structuralschema.Structural
			if p, ok := n.Properties[name]; ok {
				np = &p
			}
			walk(path+"."+name, &op, np)
		}
		if o.Items != nil {
			walk(path+"[]", o.Items, n.Items)
		}
		if o.AdditionalProperties != nil && o.AdditionalProperties.Structural != nil {
			var np *structuralschema.Structural
			if n.AdditionalProperties != nil {
				np = n.AdditionalProperties.Structural
			}
			walk(path+"{}", o.AdditionalProperties.Structural, np)
		}
	}
	walk("", old.structural, cur.structural)
	if walked < 50 {
		t.Errorf("only %d schema nodes compared: v0.2.0's schema was not read", walked)
	}
}

// TestProvisionersOf020AreAdmitted: what v0.2.0 admitted (its examples, its e2e
// provisioner) this version's CRD and policy admit too, so that they stay valid and
// editable after an upgrade.
func TestProvisionersOf020AreAdmitted(t *testing.T) {
	files, err := filepath.Glob(v020 + "/examples/*/provisioner.yaml")
	if err != nil || len(files) != 2 {
		t.Fatalf("v0.2.0's provisioners: %v %v", files, err)
	}
	admitFiles(t, files)
}

// TestUpgradeTestProvisioner: the upgrade test applies test/e2e/upgrade/provisioner.yaml
// while v0.2.0 runs, so v0.2.0's CRD and policy must admit it as it is, and this
// version's must admit it with phases.yaml merged in (what the test applies after the
// upgrade).
func TestUpgradeTestProvisioner(t *testing.T) {
	base := readFile(t, "../test/e2e/upgrade/provisioner.yaml")
	crd, errs, err := loadCRD(readFile(t, v020+"/crd/pavprovisioners.yaml"))
	if err != nil || len(errs) > 0 {
		t.Fatalf("v0.2.0's CRD: %v%s", err, errorsString(errs))
	}
	policy, perrs, err := loadPolicy(readFile(t, v020+"/crd/pavprovisioners-policy.yaml"))
	if err != nil || len(perrs) > 0 {
		t.Fatalf("v0.2.0's policy: %v %v", err, perrs)
	}
	old := &admitter{crd: crd, policy: policy}
	if rs := old.admit(t, string(base), ""); len(rs) > 0 {
		t.Errorf("v0.2.0 refuses test/e2e/upgrade/provisioner.yaml:%s", rejectionsString(rs))
	}
	if rs := newAdmitter(t).admit(t, string(base), ""); len(rs) > 0 {
		t.Errorf("this version refuses test/e2e/upgrade/provisioner.yaml:%s", rejectionsString(rs))
	}
	merged := mergePatch(t, base, readFile(t, "../test/e2e/upgrade/phases.yaml"))
	if rs := newAdmitter(t).admit(t, merged, string(base)); len(rs) > 0 {
		t.Errorf("this version refuses test/e2e/upgrade/provisioner.yaml with phases.yaml:%s", rejectionsString(rs))
	}
	if !strings.Contains(merged, "snapshotCreation") || !strings.Contains(merged, "volumeNodeExpansion") {
		t.Errorf("phases.yaml added no phases:\n%s", merged)
	}
}

// mergePatch applies a JSON merge patch (RFC 7386), both YAML, as kubectl patch
// --type merge does, and returns the result as YAML.
func mergePatch(t *testing.T, doc, patch []byte) string {
	t.Helper()
	var d, p any
	if err := yaml.Unmarshal(doc, &d); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(patch, &p); err != nil {
		t.Fatal(err)
	}
	var merge func(d, p any) any
	merge = func(d, p any) any {
		pm, ok := p.(map[string]any)
		if !ok {
			return p
		}
		dm, ok := d.(map[string]any)
		if !ok {
			dm = map[string]any{}
		}
		for k, v := range pm {
			if v == nil {
				delete(dm, k)
			} else {
				dm[k] = merge(dm[k], v)
			}
		}
		return dm
	}
	out, err := yaml.Marshal(merge(d, p))
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
