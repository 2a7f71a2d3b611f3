package templating

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// parseYAML parses a template's output when it set yaml = true, as PaV did
// with PyYAML's safe_load: YAML 1.1 scalars (yes/no/on/off are booleans,
// 0o12 and 1e3 are strings, 012 is octal, 1_000 is 1000), merge keys,
// a single document. Empty output is nil. go-yaml parses the syntax; the
// scalars are resolved here, because neither go-yaml v2 (y and n are
// booleans, 1e3 a float) nor v3 (YAML 1.2) resolves them as PyYAML does.
// Timestamps stay strings (what PaV's Kubernetes client turned them into);
// non-string mapping keys become their JSON spelling ("1", "true").
// ParseYAML parses YAML the way a template's `yaml` output is parsed (PyYAML's
// safe_load, as PaV did: `y`/`n` stay strings), normalized. `pav template`
// reads --vars files with it, so variables mean what they would in a template.
func ParseYAML(s string) (any, error) { return parseYAML(s) }

func parseYAML(s string) (v any, err error) {
	defer func() {
		// The output is arbitrary text; a parser panic must not escape.
		if p := recover(); p != nil {
			v, err = nil, fmt.Errorf("the output is not valid YAML (parser failure: %v)", p)
		}
	}()
	trimmed := strings.TrimSpace(s)
	if trimmed == "" {
		return nil, nil
	}
	// Fast path for the common `{{ x | tojson }}`: JSON is YAML, and
	// encoding/json is an order of magnitude faster than the YAML parser.
	if (trimmed[0] == '{' || trimmed[0] == '[') && json.Valid([]byte(trimmed)) {
		dec := json.NewDecoder(strings.NewReader(trimmed))
		dec.UseNumber()
		var j any
		if err := dec.Decode(&j); err == nil {
			return Normalize(fromJSON(j)), nil
		}
	}

	dec := yaml.NewDecoder(strings.NewReader(s))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil // only comments or directives
		}
		return nil, fmt.Errorf("the output is not valid YAML: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("the output is not valid YAML: expected a single document")
	}
	c := &yamlConstructor{budget: maxListItems}
	if v, err = c.construct(&doc, 0); err != nil {
		return nil, err
	}
	return Normalize(v), nil
}

// fromJSON converts the fast path's result: a JSON number is resolved from
// its text as a YAML plain scalar (1e+16 is a string to PyYAML).
func fromJSON(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = fromJSON(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = fromJSON(e)
		}
		return x
	case json.Number:
		v, _ := resolvePlain(x.String())
		return v
	}
	return v
}

type yamlConstructor struct {
	budget int // nodes left to construct: aliases can multiply a document
}

func (c *yamlConstructor) construct(n *yaml.Node, depth int) (any, error) {
	c.budget--
	if c.budget < 0 || depth > maxDepth {
		return nil, fmt.Errorf("the YAML output is too large or too deep (after expanding aliases)")
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return c.construct(n.Content[0], depth+1)
	case yaml.AliasNode:
		return c.construct(n.Alias, depth+1)
	case yaml.ScalarNode:
		return constructScalar(n)
	case yaml.SequenceNode:
		out := make([]any, 0, len(n.Content))
		for _, e := range n.Content {
			v, err := c.construct(e, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case yaml.MappingNode:
		out := map[string]any{}
		if err := c.constructMapping(n, out, depth); err != nil {
			return nil, err
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported YAML node")
}

// constructMapping fills out with n's pairs; merge keys (<<) are applied
// first, so that the mapping's own keys override them, as in PyYAML.
func (c *yamlConstructor) constructMapping(n *yaml.Node, out map[string]any, depth int) error {
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if k.Kind == yaml.ScalarNode && k.Value == "<<" && k.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0 {
			merges = append(merges, n.Content[i+1])
		}
	}
	for _, m := range merges {
		for m.Kind == yaml.AliasNode {
			m = m.Alias
		}
		var sources []*yaml.Node
		switch m.Kind {
		case yaml.MappingNode:
			sources = []*yaml.Node{m}
		case yaml.SequenceNode:
			sources = m.Content
		default:
			return fmt.Errorf("the YAML output has a merge key whose value is not a mapping")
		}
		for _, src := range sources {
			for src.Kind == yaml.AliasNode {
				src = src.Alias
			}
			if src.Kind != yaml.MappingNode {
				return fmt.Errorf("the YAML output has a merge key whose value is not a mapping")
			}
			if err := c.constructMapping(src, out, depth+1); err != nil {
				return err
			}
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, vn := n.Content[i], n.Content[i+1]
		if kn.Kind == yaml.ScalarNode && kn.Value == "<<" && kn.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) == 0 {
			continue
		}
		for kn.Kind == yaml.AliasNode {
			kn = kn.Alias
		}
		if kn.Kind != yaml.ScalarNode {
			return fmt.Errorf("the YAML output has a mapping key that is not a scalar")
		}
		kv, err := constructScalar(kn)
		if err != nil {
			return err
		}
		v, err := c.construct(vn, depth+1)
		if err != nil {
			return err
		}
		out[jsonKey(kv)] = v
	}
	return nil
}

// jsonKey spells a scalar mapping key as JSON does.
func jsonKey(k any) string {
	switch x := k.(type) {
	case string:
		return x
	case nil:
		return "null"
	case bool:
		return strconv.FormatBool(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return pyFloat(x)
	}
	return fmt.Sprint(k)
}

func constructScalar(n *yaml.Node) (any, error) {
	if n.Style&yaml.TaggedStyle != 0 {
		switch n.Tag {
		case "!!str":
			return n.Value, nil
		case "!!null":
			return nil, nil
		case "!!bool", "!!int", "!!float":
			v, tag := resolvePlain(n.Value)
			if tag != n.Tag {
				return nil, fmt.Errorf("the YAML output has %s %q, which is not valid", n.Tag, n.Value)
			}
			return v, nil
		}
		return nil, fmt.Errorf("the YAML output has the tag %s, which is not supported", n.Tag)
	}
	if n.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle) != 0 {
		return n.Value, nil
	}
	v, _ := resolvePlain(n.Value)
	return v, nil
}

// PyYAML's implicit resolvers (yaml/resolver.py), in its order.
var (
	yamlBool  = regexp.MustCompile(`^(?:yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$`)
	yamlFloat = regexp.MustCompile(`^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?|[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$`)
	yamlInt   = regexp.MustCompile(`^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$`)
	yamlNull  = regexp.MustCompile(`^(?:~|null|Null|NULL|)$`)
)

// resolvePlain resolves a plain scalar as PyYAML's SafeLoader does and
// returns its value and tag. Integers beyond 64 bits become float64.
func resolvePlain(s string) (any, string) {
	switch {
	case yamlBool.MatchString(s):
		switch strings.ToLower(s) {
		case "yes", "true", "on":
			return true, "!!bool"
		}
		return false, "!!bool"
	case yamlFloat.MatchString(s):
		return yamlFloatValue(s), "!!float"
	case yamlInt.MatchString(s):
		return yamlIntValue(s), "!!int"
	case yamlNull.MatchString(s):
		return nil, "!!null"
	}
	return s, "!!str"
}

func yamlIntValue(s string) any {
	s = strings.ReplaceAll(s, "_", "")
	sign := int64(1)
	if s[0] == '-' || s[0] == '+' {
		if s[0] == '-' {
			sign = -1
		}
		s = s[1:]
	}
	var base int
	switch {
	case s == "0":
		return int64(0)
	case strings.HasPrefix(s, "0b"):
		s, base = s[2:], 2
	case strings.HasPrefix(s, "0x"):
		s, base = s[2:], 16
	case s[0] == '0':
		s, base = s[1:], 8
	case strings.Contains(s, ":"):
		var v float64
		for _, part := range strings.Split(s, ":") {
			d, _ := strconv.ParseFloat(part, 64)
			v = v*60 + d
		}
		return normalizeFloat(float64(sign) * v)
	default:
		base = 10
	}
	if u, err := strconv.ParseUint(s, base, 64); err == nil && u <= math.MaxInt64 {
		return sign * int64(u)
	}
	// Beyond 64 bits (PyYAML has big integers): the nearest float64.
	n, _ := new(big.Int).SetString(s, base)
	f, _ := new(big.Float).SetInt(n).Float64()
	return float64(sign) * f
}

func yamlFloatValue(s string) any {
	s = strings.ToLower(strings.ReplaceAll(s, "_", ""))
	sign := 1.0
	if s[0] == '-' || s[0] == '+' {
		if s[0] == '-' {
			sign = -1
		}
		s = s[1:]
	}
	switch {
	case s == ".inf":
		return sign * math.Inf(1)
	case s == ".nan":
		return math.NaN()
	case strings.Contains(s, ":"):
		parts := strings.Split(s, ":")
		var v float64
		for _, part := range parts {
			d, _ := strconv.ParseFloat(part, 64)
			v = v*60 + d
		}
		return sign * v
	}
	if strings.HasSuffix(s, ".") {
		s += "0"
	}
	f, _ := strconv.ParseFloat(s, 64)
	return sign * f
}

// Normalize converts a JSON-decoded tree (encoding/json or sigs.k8s.io/yaml
// output) to the shapes pav works with: integral float64 become int64,
// json.Number becomes int64 (or float64 when not an integer), int becomes
// int64; maps and lists are copied, so the result shares no container with
// the input.
func Normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = Normalize(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = Normalize(e)
		}
		return out
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, err := x.Float64()
		if err != nil {
			return x.String()
		}
		return normalizeFloat(f)
	case float64:
		return normalizeFloat(x)
	case float32:
		return normalizeFloat(float64(x))
	case int:
		return int64(x)
	case int32:
		return int64(x)
	}
	return v
}

func normalizeFloat(f float64) any {
	if f == math.Trunc(f) && f >= -(1<<63) && f < 1<<63 {
		return int64(f)
	}
	return f
}
