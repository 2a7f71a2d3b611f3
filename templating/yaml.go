package templating

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"

	"sigs.k8s.io/yaml"
)

// parseYAML parses a template's output when it set yaml = true. Empty output
// is nil (PyYAML's safe_load of "" is None).
func parseYAML(s string) (any, error) {
	trimmed := strings.TrimSpace(s)
	if trimmed == "" {
		return nil, nil
	}
	// Fast path for the common `{{ x | tojson }}`: JSON is YAML, and
	// encoding/json is an order of magnitude faster than the YAML parser.
	if (trimmed[0] == '{' || trimmed[0] == '[') && json.Valid([]byte(trimmed)) {
		return decodeJSON([]byte(trimmed))
	}
	// YAML → JSON, then decode with UseNumber so that integers beyond 2^53
	// keep their exact value.
	j, err := yaml.YAMLToJSON([]byte(s))
	if err != nil {
		return nil, fmt.Errorf("the output is not valid YAML: %w", err)
	}
	return decodeJSON(j)
}

func decodeJSON(j []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("the output is not valid YAML: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("the output is not valid YAML: trailing data")
	}
	return Normalize(v), nil
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
