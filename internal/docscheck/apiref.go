package docscheck

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// templatePattern is the pattern the PavProvisioner CRD gives a field that
// may be a Jinja template string instead of its value (deploy/crd says why).
const templatePattern = `\{\{|\{%`

// schema is the part of a CRD's OpenAPI v3 schema that the reference shows.
// It is decoded strictly (KnownFields): a keyword the reference does not
// render fails APIReference instead of silently missing from the manual.
type schema struct {
	Description     string     `yaml:"description"`
	Type            string     `yaml:"type"`
	Format          string     `yaml:"format"`
	Enum            []string   `yaml:"enum"`
	Pattern         string     `yaml:"pattern"`
	Required        []string   `yaml:"required"`
	Properties      properties `yaml:"properties"`
	Items           *schema    `yaml:"items"`
	Additional      *schema    `yaml:"additionalProperties"`
	AnyOf           []schema   `yaml:"anyOf"`
	MinItems        *int64     `yaml:"minItems"`
	MaxItems        *int64     `yaml:"maxItems"`
	MinLength       *int64     `yaml:"minLength"`
	MaxLength       *int64     `yaml:"maxLength"`
	MinProperties   *int64     `yaml:"minProperties"`
	MaxProperties   *int64     `yaml:"maxProperties"`
	Minimum         *float64   `yaml:"minimum"`
	Maximum         *float64   `yaml:"maximum"`
	IntOrString     bool       `yaml:"x-kubernetes-int-or-string"`
	PreserveUnknown bool       `yaml:"x-kubernetes-preserve-unknown-fields"`
	ListType        string     `yaml:"x-kubernetes-list-type"`
	ListMapKeys     []string   `yaml:"x-kubernetes-list-map-keys"`
	Validations     []celRule  `yaml:"x-kubernetes-validations"`
	Default         any        `yaml:"default"`
}

type celRule struct {
	Rule      string `yaml:"rule"`
	Message   string `yaml:"message"`
	FieldPath string `yaml:"fieldPath"`
	Reason    string `yaml:"reason"`
}

// properties keep the CRD's order: it is the order a reader meets the fields
// in the manifests, which alphabetical order would scatter.
type properties []property

type property struct {
	name string
	s    *schema
}

func (p *properties) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: properties must be a mapping", n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		s := &schema{}
		if err := decodeStrict(n.Content[i+1], s); err != nil {
			return err
		}
		*p = append(*p, property{name: n.Content[i].Value, s: s})
	}
	return nil
}

// decodeStrict decodes a node refusing unknown keys (yaml.Node.Decode has no
// such option, so the node is re-encoded and read by a strict Decoder).
func decodeStrict(n *yaml.Node, v any) error {
	b, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	d := yaml.NewDecoder(bytes.NewReader(b))
	d.KnownFields(true)
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("near line %d: %w", n.Line, err)
	}
	return nil
}

// crd is the part of a CustomResourceDefinition the reference shows.
type crd struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name        string            `yaml:"name"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Spec struct {
		Group string `yaml:"group"`
		Names struct {
			Kind       string   `yaml:"kind"`
			ListKind   string   `yaml:"listKind"`
			Plural     string   `yaml:"plural"`
			Singular   string   `yaml:"singular"`
			ShortNames []string `yaml:"shortNames"`
		} `yaml:"names"`
		Scope    string `yaml:"scope"`
		Versions []struct {
			Name         string `yaml:"name"`
			Served       bool   `yaml:"served"`
			Storage      bool   `yaml:"storage"`
			Subresources struct {
				Status *struct{} `yaml:"status"`
			} `yaml:"subresources"`
			Columns []struct {
				Name        string `yaml:"name"`
				Type        string `yaml:"type"`
				Description string `yaml:"description"`
				Priority    int    `yaml:"priority"`
				JSONPath    string `yaml:"jsonPath"`
			} `yaml:"additionalPrinterColumns"`
			Schema struct {
				OpenAPIV3Schema *schema `yaml:"openAPIV3Schema"`
			} `yaml:"schema"`
		} `yaml:"versions"`
	} `yaml:"spec"`
}

// APIReference renders docs/api-reference.md from CRD manifests (the YAML
// documents of deploy/crd; documents of other kinds are skipped), in the
// order given.
func APIReference(manifests ...[]byte) (string, error) {
	var crds []*crd
	for _, m := range manifests {
		d := yaml.NewDecoder(bytes.NewReader(m))
		for {
			var n yaml.Node
			err := d.Decode(&n)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return "", err
			}
			var head struct {
				Kind string `yaml:"kind"`
			}
			if err := n.Decode(&head); err != nil {
				return "", err
			}
			if head.Kind != "CustomResourceDefinition" {
				continue
			}
			c := &crd{}
			if err := decodeDocument(&n, c); err != nil {
				return "", err
			}
			if len(c.Spec.Versions) != 1 || c.Spec.Versions[0].Schema.OpenAPIV3Schema == nil {
				return "", fmt.Errorf("%s: the reference renders exactly one version with a schema", c.Metadata.Name)
			}
			crds = append(crds, c)
		}
	}
	if len(crds) == 0 {
		return "", errors.New("no CustomResourceDefinition")
	}

	var b strings.Builder
	b.WriteString("# API reference\n\n")
	b.WriteString("<!-- Generated from deploy/crd by `go generate ./internal/docscheck`; do not edit. -->\n\n")
	fmt.Fprintf(&b, "pav's API group is `%s`, version `%s`. You write PavProvisioners (see\n", crds[0].Spec.Group, crds[0].Spec.Versions[0].Name)
	b.WriteString("[writing-a-provisioner.md](writing-a-provisioner.md) for what each field does at run time);\n")
	b.WriteString("PavVolumes, PavSnapshots and PavGroupSnapshots are pav's records of the volumes, snapshots and group\n")
	b.WriteString("snapshots it made, written by the controller plugin only (see [security.md](security.md)).\n\n")
	b.WriteString("The API server checks a PavProvisioner in three layers, no webhook: the schema below, the\n")
	b.WriteString("ValidatingAdmissionPolicy `deploy/crd/pavprovisioners-policy.yaml` for what a schema cannot say\n")
	b.WriteString("about fields that may be template strings, and then the pav manager, which reports the template\n")
	b.WriteString("syntax and literal values on condition `Valid`. A field marked *template* may be a Jinja\n")
	b.WriteString("template string (one that contains `{{` or `{%`) instead of its value.\n\n")
	for _, c := range crds {
		fmt.Fprintf(&b, "- [%s](#%s)\n", c.Spec.Names.Kind, Slug(c.Spec.Names.Kind))
	}
	for _, c := range crds {
		if err := writeCRD(&b, c); err != nil {
			return "", fmt.Errorf("%s: %w", c.Metadata.Name, err)
		}
	}
	return b.String(), nil
}

// decodeDocument is decodeStrict for a document node (what yaml.Decoder and
// yaml.Unmarshal give).
func decodeDocument(n *yaml.Node, v any) error {
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	return decodeStrict(n, v)
}

func writeCRD(b *strings.Builder, c *crd) error {
	v := c.Spec.Versions[0]
	root := v.Schema.OpenAPIV3Schema
	fmt.Fprintf(b, "\n## %s\n\n", c.Spec.Names.Kind)
	facts := []string{"`" + c.Metadata.Name + "`", strings.ToLower(c.Spec.Scope) + "-scoped"}
	if len(c.Spec.Names.ShortNames) > 0 {
		facts = append(facts, "short name `"+strings.Join(c.Spec.Names.ShortNames, "`, `")+"`")
	}
	if v.Subresources.Status != nil {
		facts = append(facts, "status subresource")
	}
	fmt.Fprintf(b, "%s.\n\n%s\n", strings.Join(facts, ", "), cell(root.Description))

	if len(v.Columns) > 0 {
		fmt.Fprintf(b, "\n`kubectl get %s` shows these columns (*wide*: with `-o wide`):\n\n", c.Spec.Names.Plural)
		b.WriteString("| column | value | description |\n|---|---|---|\n")
		for _, col := range v.Columns {
			name := col.Name
			if col.Priority > 0 {
				name += " (*wide*)"
			}
			fmt.Fprintf(b, "| %s | `%s` | %s |\n", name, cell(col.JSONPath), cell(col.Description))
		}
	}

	var rows [][3]string
	var rules [][2]string
	collectRules(root, "", &rules)
	for _, p := range root.Properties {
		switch p.name {
		case "apiVersion", "kind", "metadata":
			// Every object's; the rules on metadata are listed below.
			collectRules(p.s, p.name, &rules)
			continue
		}
		if err := walk(p.s, p.name, slices.Contains(root.Required, p.name), &rows, &rules); err != nil {
			return err
		}
	}
	b.WriteString("\n| field | type | description |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(b, "| `%s` | %s | %s |\n", r[0], r[1], r[2])
	}
	if len(rules) > 0 {
		b.WriteString("\nRules the API server checks beyond the types (CEL):\n\n")
		for _, r := range rules {
			fmt.Fprintf(b, "- `%s`: %s\n", r[0], cell(r[1]))
		}
	}
	return nil
}

// walk adds the rows of a field and of the fields below it.
func walk(s *schema, path string, required bool, rows *[][3]string, rules *[][2]string) error {
	t, err := typeOf(s)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if required {
		t += ", **required**"
	}
	desc := cell(s.Description)
	if s.Items != nil && s.Items.Description != "" && len(s.Items.Properties) == 0 {
		desc = strings.TrimSpace(desc + " Each item: " + cell(s.Items.Description))
	}
	if s.Default != nil {
		desc = strings.TrimSpace(desc + fmt.Sprintf(" Default: `%v`.", s.Default))
	}
	*rows = append(*rows, [3]string{path, t, desc})
	collectRules(s, path, rules)
	for _, p := range s.Properties {
		if err := walk(p.s, path+"."+p.name, slices.Contains(s.Required, p.name), rows, rules); err != nil {
			return err
		}
	}
	if it := s.Items; it != nil {
		collectRules(it, path+"[]", rules)
		for _, p := range it.Properties {
			if err := walk(p.s, path+"[]."+p.name, slices.Contains(it.Required, p.name), rows, rules); err != nil {
				return err
			}
		}
	}
	return nil
}

func collectRules(s *schema, path string, rules *[][2]string) {
	for _, r := range s.Validations {
		at := path
		if r.FieldPath != "" {
			at = strings.TrimPrefix(path+r.FieldPath, ".")
		}
		if at == "" {
			at = "."
		}
		msg := r.Message
		if msg == "" {
			msg = "`" + r.Rule + "`"
		}
		*rules = append(*rules, [2]string{at, msg})
	}
}

// typeOf says what values a field takes, with its bounds.
func typeOf(s *schema) (string, error) {
	t, bounds, err := typeParts(s)
	if err != nil {
		return "", err
	}
	if len(bounds) > 0 {
		t += " (" + strings.Join(bounds, ", ") + ")"
	}
	if s.Pattern == templatePattern {
		t += ", or *template*"
	}
	return t, nil
}

// typeParts is typeOf in parts: the type with its allowed values, and its
// bounds (a list's own, then "each …" with its items').
func typeParts(s *schema) (t string, bounds []string, err error) {
	var itemBounds []string
	list := func(kind string) error {
		if s.Items == nil {
			return errors.New("a list without items")
		}
		it, ib, err := typeParts(s.Items)
		if err != nil {
			return err
		}
		if s.Items.Pattern == templatePattern {
			it += " or *template*"
		}
		t, itemBounds = kind+" of "+it, ib
		return nil
	}
	switch {
	case s.IntOrString:
		t = "integer or string"
	case s.Type == "" && s.PreserveUnknown && len(s.Properties) > 0:
		t = "object"
	case s.Type == "" && s.PreserveUnknown && s.Items != nil:
		err = list("list")
	case s.Type == "" && s.PreserveUnknown:
		t = "any"
	case s.Type == "array" && s.ListType == "set":
		err = list("set")
	case s.Type == "array" && s.ListType == "map":
		err = list("list")
		t += " keyed by `" + strings.Join(s.ListMapKeys, "`, `") + "`"
	case s.Type == "array":
		err = list("list")
	case s.Type == "object" && s.Additional != nil:
		vt, vb, verr := typeParts(s.Additional)
		t, itemBounds, err = "map of string to "+vt, vb, verr
	case s.Type == "object" && s.PreserveUnknown && len(s.Properties) == 0:
		t = "object (any fields)"
	case s.Type != "":
		t = s.Type
	default:
		err = errors.New("no type")
	}
	if err != nil {
		return "", nil, err
	}

	var alts []string
	if len(s.Enum) > 0 {
		alts = append(alts, "`"+strings.Join(s.Enum, "`, `")+"`")
	}
	for _, a := range s.AnyOf {
		switch {
		case len(a.Enum) > 0:
			alts = append(alts, "`"+strings.Join(a.Enum, "`, `")+"`")
		case a.Pattern == templatePattern:
			alts = append(alts, "*template*")
		default:
			return "", nil, errors.New("an anyOf branch that is neither an enum nor the template pattern")
		}
	}
	if len(alts) > 0 {
		t += ": " + strings.Join(alts, " or ")
	}

	if s.Format != "" {
		bounds = append(bounds, s.Format)
	}
	bounds = appendRange(bounds, s.MinItems, s.MaxItems, "item")
	bounds = appendRange(bounds, s.MinLength, s.MaxLength, "character")
	bounds = appendRange(bounds, s.MinProperties, s.MaxProperties, "entry")
	if s.Minimum != nil {
		bounds = append(bounds, "≥ "+strconv.FormatFloat(*s.Minimum, 'f', -1, 64))
	}
	if s.Maximum != nil {
		bounds = append(bounds, "≤ "+strconv.FormatFloat(*s.Maximum, 'f', -1, 64))
	}
	if s.Pattern != "" && s.Pattern != templatePattern {
		bounds = append(bounds, "matching `"+s.Pattern+"`")
	}
	if len(itemBounds) > 0 {
		bounds = append(bounds, "each "+strings.Join(itemBounds, ", "))
	}
	return t, bounds, nil
}

// appendRange says "1–2 items", "at least 1 item", "at most 16 items".
func appendRange(bounds []string, lo, hi *int64, unit string) []string {
	plural := func(n int64) string {
		if n == 1 {
			return unit
		}
		if unit == "entry" {
			return "entries"
		}
		return unit + "s"
	}
	switch {
	case lo != nil && hi != nil:
		return append(bounds, fmt.Sprintf("%d–%d %s", *lo, *hi, plural(*hi)))
	case lo != nil:
		return append(bounds, fmt.Sprintf("at least %d %s", *lo, plural(*lo)))
	case hi != nil:
		return append(bounds, fmt.Sprintf("at most %d %s", *hi, plural(*hi)))
	}
	return bounds
}

// cell makes text safe in a Markdown table cell: one line, "|" escaped, and
// "<" outside code spans written as an entity, so that a placeholder such as
// pvc-<PVC uid> is not taken for an HTML tag and dropped.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	var b strings.Builder
	inCode := false
	for _, r := range s {
		switch {
		case r == '`':
			inCode = !inCode
			b.WriteRune(r)
		case r == '|':
			b.WriteString(`\|`)
		case r == '<' && !inCode:
			b.WriteString("&lt;")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}
