package deploy

import (
	"strings"
	"testing"
)

const scratchCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: things.example.com
spec:
  group: example.com
  names: {kind: Thing, listKind: ThingList, plural: things, singular: thing}
  scope: Cluster
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            RULES
            properties:
              typed:
                type: string
              u:
                x-kubernetes-preserve-unknown-fields: true
                UEXTRA
                properties:
                  a:
                    type: string
                    minLength: 2
                  l:
                    x-kubernetes-preserve-unknown-fields: true
                    minItems: 1
                    items:
                      type: string
                      enum: [x, y]
`

func scratch(t *testing.T, rules, uextra string, objs ...string) {
	m := strings.Replace(scratchCRD, "RULES", rules, 1)
	m = strings.Replace(m, "UEXTRA", uextra, 1)
	v, errs, err := loadCRD([]byte(m))
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) > 0 {
		t.Logf("CRD errors: %s", errorsString(errs))
		return
	}
	for _, o := range objs {
		t.Logf("%s => %s", o, errorsString(v.Validate([]byte("apiVersion: example.com/v1\nkind: Thing\nmetadata: {name: x}\nspec: "+o))))
	}
}

func TestScratch(t *testing.T) {
	t.Run("cel-on-typeless", func(t *testing.T) {
		scratch(t, "- rule: 'true'", "x-kubernetes-validations: [{rule: 'type(self) == string'}]")
	})
	t.Run("dyn-has", func(t *testing.T) {
		scratch(t, "- {rule: '!has(dyn(self).u)', message: 'u present'}\n            - {rule: 'dyn(self).u == \"hi\"', message: 'u not hi'}", "",
			`{}`, `{u: hi}`, `{u: {a: bb}}`, `{u: 42}`)
	})
	t.Run("openapi-typeless", func(t *testing.T) {
		scratch(t, "- rule: 'true'", "required: [a]\n                pattern: '\\{\\{|\\{%'",
			`{u: hello}`, `{u: "{{ x }}"}`, `{u: {}}`, `{u: {a: b}}`, `{u: {a: bb, l: []}}`, `{u: {a: bb, l: [z]}}`, `{u: {a: bb, l: "s"}}`, `{u: {a: bb, l: 42, zz: 1}}`, `{u: 42}`, `{u: [1]}`, `{u: {a: bb, l: {q: 1}}}`)
	})
}
