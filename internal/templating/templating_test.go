package templating

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// evalOne evaluates obj with Evaluate and returns the result or the error.
func evalOne(t *testing.T, e *Engine, obj any, vars Vars) (any, error) {
	t.Helper()
	return e.Evaluate(context.Background(), obj, "spec.x", vars)
}

// TestAcceptanceVectors is spec §2's acceptance list, every variant of every
// vector (they are PaV's own unit tests).
func TestAcceptanceVectors(t *testing.T) {
	type vector struct {
		objects []any
		vars    Vars
		want    any
		wantErr string // non-empty: every object must fail with an error containing it
	}
	vectors := []vector{
		1: {objects: []any{nil, "{% set yaml = true %}{{ '' }}", "{% set yaml = true %}{{ ' \n ' }}"}, want: nil},
		2: {objects: []any{"", "{{ '' }}"}, want: ""},
		3: {objects: []any{" \n ", "{{ ' \n ' }}"}, want: " \n "},
		4: {objects: []any{"hello", "{% set yaml = false %}hello", "{% set yaml = true %}hello"}, want: "hello"},
		5: {
			objects: []any{map[string]any{"a": int64(42), "b": "{{ 1 + 2 }}", "c": "{% set yaml = true %}{{ 1 + 2 }}"}},
			want:    map[string]any{"a": int64(42), "b": "3", "c": int64(3)},
		},
		6: {
			objects: []any{map[string]any{
				"a": map[string]any{"1": "ab{% if b==3 %}c{% endif %}{% if x is defined %}d{% endif %}"},
				"b": []any{"hello", "{{ a+b*c }}"},
			}},
			vars: Vars{"a": int64(2), "b": int64(3), "c": int64(4)},
			want: map[string]any{"a": map[string]any{"1": "abc"}, "b": []any{"hello", "14"}},
		},
		7:  {objects: []any{"a{{ '42' }}b"}, want: "a42b"},
		8:  {objects: []any{`{% set yaml = true %}x: {{ '[1, "2", 3]' }}`}, want: map[string]any{"x": []any{int64(1), "2", int64(3)}}},
		9:  {objects: []any{"{{", "{{ }}"}, wantErr: "syntax error"},
		10: {objects: []any{"42", "{{ 42 }}", "{{ '42' }}"}, want: "42"},
		11: {objects: []any{int64(42), "{% set yaml = true %}{{ 42 }}"}, want: int64(42)},
		12: {objects: []any{`x: {{ [1, "2", 3] }}`}, wantErr: "must evaluate to a string or a number"},
		13: {objects: []any{"{% set yaml = true %}{{ abc or 42 }}"}, want: int64(42)},
		14: {objects: []any{"{{ abc }}", "{{ (abc + 3) or 42 }}"}, wantErr: "'abc' is undefined"},
		15: {objects: []any{"{{ '' | tobash }}"}, want: "''"},
		16: {objects: []any{`{{ '\n' | tobash }}`}, want: `$'\n'`},
		17: {objects: []any{`{{ ' a\nb' | tobash }}`}, want: `' a'$'\n'b`},
		18: {objects: []any{"{{ 42 | tobash }}", "{{ '42' | tobash }}"}, want: "42"},
		19: {objects: []any{"{{ [42] | tobash }}"}, wantErr: "tobash"},
		20: {objects: []any{`{{ ' a\nb ' | tojson }}`, "{{ ' a\nb ' | tojson }}"}, want: `" a\nb "`},
		21: {objects: []any{`{{ { "a": "1", "b": 2 } | tojson }}`}, want: `{"a": "1", "b": 2}`},
	}
	e := New(Options{})
	for i, v := range vectors {
		if v.objects == nil {
			continue
		}
		for j, obj := range v.objects {
			t.Run(fmt.Sprintf("%d/%d", i, j), func(t *testing.T) {
				got, err := evalOne(t, e, obj, v.vars)
				if v.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), v.wantErr) {
						t.Fatalf("%q: got %#v, %v; want an error containing %q", obj, got, err, v.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatalf("%q: %v", obj, err)
				}
				if !reflect.DeepEqual(got, v.want) {
					t.Fatalf("%q: got %#v, want %#v", obj, got, v.want)
				}
			})
		}
	}
}

// evalVars is the context of evalCases.
var evalVars = Vars{
	"a": int64(2), "b": int64(3), "f": 1.5, "t": true, "n": nil, "s": "x y",
	"pvc": map[string]any{
		"metadata": map[string]any{
			"name": "claim", "namespace": "ns",
			"labels": map[string]any{"example.com/tier": "gold"},
		},
		"spec": map[string]any{"accessModes": []any{"ReadWriteOnce", "ReadOnlyMany"}, "size": int64(1 << 30)},
	},
	"params": map[string]any{"mode": "fast"},
}

// evalCases are EvaluateString cases beyond the acceptance vectors.
var evalCases = []struct {
	name, tmpl string
	want       any
	wantErr    string
}{
	// undefined semantics: Jinja's default Undefined plus PaV's finalize
	{"default on undefined", "{{ abc | default('x') }}", "x", ""},
	{"default keeps None", "{{ n | default('x') is none }}", "True", ""},
	{"default boolean", "{{ '' | default('x', true) }}", "x", ""},
	{"is defined", "{{ abc is defined }}/{{ a is defined }}/{{ n is defined }}", "False/True/True", ""},
	{"is undefined", "{{ abc is undefined }}", "True", ""},
	{"missing attribute is undefined", "{{ pvc.spec.missing is defined }}", "False", ""},
	{"missing attribute or", "{{ pvc.spec.missing or 'fallback' }}", "fallback", ""},
	{"missing attribute printed", "{{ pvc.spec.missing }}", nil, "'pvc.spec.missing' is undefined"},
	{"attribute of undefined", "{{ abc.x or 1 }}", nil, "'abc' is undefined"},
	{"attribute of undefined attribute", "{{ pvc.nope.x }}", nil, "'pvc.nope' is undefined"},
	{"undefined in if", "{% if abc %}yes{% else %}no{% endif %}", "no", ""},
	{"not undefined", "{{ not abc }}", "True", ""},
	{"undefined compares unequal", "{{ abc == 1 }}/{{ abc != 1 }}/{{ abc == none }}", "False/True/False", ""},
	{"undefined loops as empty", "{% for x in abc %}x{% else %}empty{% endfor %}", "empty", ""},
	{"undefined concatenates as empty", "{{ 'a' ~ abc ~ 'b' }}", "ab", ""},
	{"undefined in arithmetic", "{{ 1 + abc }}", nil, "'abc' is undefined"},
	{"missing key comparison", "{% if params.other == 'x' %}x{% else %}y{% endif %}", "y", ""},
	{"none printed", "{{ n }}", nil, "evaluated to None"},
	{"none lowercase", "{{ none is none }}", "True", ""},
	{"dict printed", "{{ pvc.metadata.labels }}", nil, "evaluated to a dict"},
	{"inline if without else", "{{ 'a' if false }}", nil, "no else section"},

	// expressions
	{"inline if", "{{ 'a' if t else 'b' }}{{ 'a' if abc else 'b' }}", "ab", ""},
	{"inline if in parentheses", "{{ (a ~ (b if t else c)) }}", "23", ""},
	{"inline if in arguments", "{{ [a if t else b, a if n else b] | join(',' if t) }}{{ range(b if t) | join }}", "2,3012", ""},
	{"inline if in a literal and a subscript", "{{ {'k': 'v' if t}['k' if t else 'x'] }}", "v", ""},
	{"inline if nested", "{{ 1 if n else 2 if n else 3 }}{{ 1 if 2 if n else 3 }}", "33", ""},
	{"inline if is lazy", "{{ 1 if t else nosuch() }}{{ 1 / 0 if n else 2 }}", "12", ""},
	{"inline if without else is undefined", "{{ (1 if n) is defined }}{{ (1 if n) | default('d') }}", "Falsed", ""},
	{"inline if taken branch undefined", "{{ nosuch if t else 1 }}", nil, "'nosuch' is undefined"},
	{"inline if in a macro default", "{% macro q(x=1 if n else 2) %}{{ x }}{% endmacro %}{{ q() }}", "2", ""},
	{"inline if in set and for", "{% set v = 'x' if t %}{% for i in [1, 2] if i > 1 if t else true %}{{ v }}{{ i }}{% endfor %}", "x2", ""},
	{"inline if else without if", "{{ (1 if t) else 2 }}", nil, "syntax error: unexpected 'else'"},
	{"inline if in an if tag", "{% if 1 if t else 0 %}{% endif %}", nil, "syntax error"},
	{"dict literal", "{{ {'k': a, 'l': [1, 'x']}['l'][1] }}{{ {'k': a}.k }}", "x2", ""},
	{"dict literal tojson", "{{ {'b': 1, 'a': {'c': [true, none, 1.5]}} | tojson }}", `{"a": {"c": [true, null, 1.5]}, "b": 1}`, ""},
	{"integer arithmetic", "{{ a + b * 4 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}", "14 3 -4 2 1024 0.5", ""},
	{"float rendering", "{{ f }} {{ 1.0 }} {{ 10 / 4 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-05 }}", "1.5 1.0 2.5 0.30000000000000004 1e+16 1e-05", ""},
	{"bool renders like Python", "{{ t }} {{ not t }} {{ 1 == 1.0 }}", "True False True", ""},
	{"bool is an int", "{{ t + 1 }}", "2", ""},
	{"integer overflow", "{{ 9223372036854775807 + 1 }}", nil, "out of range"},
	{"division by zero", "{{ 1 / 0 }}", nil, "division by zero"},
	{"modulo by zero", "{{ 1 % 0 }}", nil, "division by zero"},
	{"string repeat", "{{ 'ab' * 2 }}{{ 'x' * -1 }}", "abab", ""},
	{"string repeat too large", "{{ 'ab' * 100000000 }}", nil, "too large"},
	{"incomparable", "{{ 1 < 'a' }}", nil, "'<' not supported"},
	{"string formatting", "{{ '%s-%03d' % ('a', 7) }} {{ '%.2f' | format(f) }}", "a-007 1.50", ""},
	{"concatenation", "{{ 'n=' ~ a ~ ',' ~ f ~ ',' ~ n }}", "n=2,1.5,None", ""},
	{"in", "{{ 'ReadWriteOnce' in pvc.spec.accessModes }} {{ 'x' not in s }} {{ 'mode' in params }}", "True False True", ""},
	{"string index by code point", "{{ 'αβγ'[1] }}{{ 'αβγ' | length }}", "β3", ""},
	{"negative index", "{{ pvc.spec.accessModes[-1] }}", "ReadOnlyMany", ""},
	{"index out of range is undefined", "{{ pvc.spec.accessModes[5] is defined }}", "False", ""},
	{"item with dots", "{{ pvc.metadata.labels['example.com/tier'] }}", "gold", ""},
	{"string methods", "{{ pvc.metadata.name.upper() }} {{ s.split(' ') | tojson }} {{ '{}-{}'.format('a', 1) }}", `CLAIM ["x", "y"] a-1`, ""},
	{"python string methods", "{{ ' a  b '.split() | join('|') }} {{ 'a,b,c'.rsplit(',', 1) | join('|') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'abc'.center(6, '*') }} {{ 'αβγ'.index('γ') }}", "a|b a,b|c bba *abc** 2", ""},
	{"dict methods", "{{ params.items() | list | tojson }} {{ params.get('x', 'd') }} {{ params.keys() | join }}", `[["mode", "fast"]] d mode`, ""},
	{"dict method names win over keys", "{{ {'items': 1}.items is defined }} {{ {'items': 1}['items'] }}", "True 1", ""},
	{"filters", "{{ pvc.spec.accessModes | join(',') | lower }} {{ [3, 1, 2] | sort | join }} {{ [3, 1, 2] | reverse | join }}", "readwriteonce,readonlymany 123 213", ""},
	{"range", "{{ range(3) | join(',') }} {{ range(1, 10, 4) | list | tojson }}", "0,1,2 [1, 5, 9]", ""},
	{"range too big", "{{ range(100001) | length }}", nil, "range too big"},
	{"namespace", "{% set ns = namespace(v=1) %}{% for i in range(3) %}{% set ns.v = ns.v + i %}{% endfor %}{{ ns.v }}", "4", ""},
	{"loop", "{% for m in pvc.spec.accessModes %}{{ loop.index }}{{ loop.cycle('a', 'b') }}{% if not loop.last %},{% endif %}{% endfor %}", "1a,2b", ""},
	{"for items", "{% for k, v in pvc.metadata.labels.items() %}{{ k }}={{ v }}{% endfor %}", "example.com/tier=gold", ""},
	{"for over non-iterable", "{% for x in a %}{% endfor %}", nil, "not iterable"},
	{"loop filter", "{% for x in [1, 2, 3] if x > 1 %}{{ x }}{% endfor %}", "23", ""},
	{"loop filter error", "{% for x in [1, 'a'] if x > 1 %}{{ x }}{% endfor %}", nil, "'>' not supported"},
	{"dict literal with int keys", "{{ {1: 'a'}[1] }}{{ {1: 'a', 2: none} | tojson }}", `a{"1": "a", "2": null}`, ""},
	{"macro", "{% macro q(x, y='d') %}[{{ x }}{{ y }}]{% endmacro %}{{ q(1) }}{{ q(2, y='e') }}", "[1d][2e]", ""},
	{"macro missing parameter", "{% macro q(x) %}{{ x }}{% endmacro %}{{ q() }}", nil, "'x' is undefined"},
	{"macro varargs and kwargs", "{% macro q(x) %}{{ x }}{{ varargs | join }}{{ kwargs | tojson }}{% endmacro %}{{ q(1, 2, 3, k='v') }}", `123{"k": "v"}`, ""},
	{"macro extra argument", "{% macro q(x) %}{{ x }}{% endmacro %}{{ q(1, 2) }}", nil, "expected only 1"},
	{"caller", "{% macro q() %}<{{ caller() }}>{% endmacro %}{% call q() %}body{% endcall %}", "<body>", ""},
	{"loop ends", "{% for x in [1, 2] %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }}{{ loop.depth }}{% endfor %}", "FalseTrue1TrueFalse1", ""},
	{"macro missing parameter tested", "{% macro q(x) %}{{ x is defined }}{% endmacro %}{{ q() }}", "False", ""},
	{"recursive macro is bounded", "{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", nil, "maximum recursion depth"},
	{"with", "{% with q = a + 1 %}{{ q }}{% endwith %}{{ q is defined }}", "3False", ""},
	{"filter block", "{% filter upper %}ab{{ s }}{% endfilter %}", "ABX Y", ""},
	{"block set", "{% set v %}<{{ a }}>{% endset %}{{ v }}", "<2>", ""},
	{"tuple set", "{% set x, y = 1, 2 %}{{ x }}{{ y }}", "12", ""},
	{"set in if is visible", "{% set v = 1 %}{% if true %}{% set v = 2 %}{% endif %}{{ v }}", "2", ""},
	{"set in for is loop-scoped", "{% set v = 1 %}{% for i in [1] %}{% set v = 2 %}{% endfor %}{{ v }}", "1", ""},
	{"cycler", "{% set c = cycler('x', 'y') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}", "xyx", ""},
	{"unknown function", "{{ foo(1) }}", nil, "'foo' is undefined"},
	{"not callable", "{{ a(1) }}", nil, "not callable"},

	// tojson and tobash
	{"tojson escapes", `{{ "<a href='x'>&é😀" | tojson }}`, `"\u003ca href=\u0027x\u0027\u003e\u0026\u00e9\ud83d\ude00"`, ""},
	{"tojson context object", "{{ pvc.metadata | tojson }}", `{"labels": {"example.com/tier": "gold"}, "name": "claim", "namespace": "ns"}`, ""},
	{"tojson undefined", "{{ abc | tojson }}", nil, "Undefined is not JSON serializable"},
	{"tojson indent", "{{ {'a': [1]} | tojson(2) }}", "{\n  \"a\": [\n    1\n  ]\n}", ""},
	{"tobash quoting", `{{ "it's" | tobash }} {{ 'a b' | tobash }} {{ 'x=1,y' | tobash }} {{ 1.5 | tobash }}`, `'it'"'"'s' 'a b' x=1,y 1.5`, ""},
	{"tobash undefined", "{{ abc | tobash }}", nil, "may not be applied to undefined"},
	{"tobash none", "{{ none | tobash }}", nil, "expects a string or a number"},

	// whitespace: trim_blocks, lstrip_blocks, one trailing newline dropped
	{"trim and lstrip blocks", "a:\n  {% if true %}\n  b\n  {% endif %}\nc\n", "a:\n  b\nc", ""},
	{"whitespace control", "a  {%- if true -%}  b  {%- endif -%}  c {{- ' d' }}", "abc d", ""},
	{"lstrip disabled with +", "  {%+ if true %}x{% endif %}", "  x", ""},
	{"only one trailing newline dropped", "{{ a }}\n\n", "2\n", ""},
	{"output newline kept", "{{ 'x\n' }}", "x\n", ""},
	{"comments", "a{# c #}b\n{# line #}\nc", "ab\nc", ""},
	{"CRLF", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n", "a\nb\nc", ""},
	{"CRLF literal", "a\r\nb\r\n", "a\nb", ""},
	{"CR literal", "a\rb", "a\nb", ""},

	// literal braces
	{"literal braces", "{{ '{{' }} x {{ '}}' }}", "{{ x }}", ""},
	{"raw", "{% raw %}{{ x }}{% if %}{% endraw %}", "{{ x }}{% if %}", ""},
	{"lone brace", "a { b } c", "a { b } c", ""},

	// yaml
	{"yaml", "{% set yaml = true %}\nname: {{ pvc.metadata.name | tojson }}\nsize: {{ pvc.spec.size }}\nmodes: {{ pvc.spec.accessModes | tojson }}\n",
		map[string]any{"name": "claim", "size": int64(1 << 30), "modes": []any{"ReadWriteOnce", "ReadOnlyMany"}}, ""},
	{"yaml inside if", "{% if a == 2 %}{% set yaml = true %}{% endif %}[1]", []any{int64(1)}, ""},
	{"yaml inside false if", "{% if a == 3 %}{% set yaml = true %}{% endif %}[1]", "[1]", ""},
	{"yaml in for is not honoured", "{% for i in [1] %}{% set yaml = true %}{% endfor %}[1]", "[1]", ""},
	{"yaml in with is not honoured", "{% with %}{% set yaml = true %}{% endwith %}[1]", "[1]", ""},
	{"yaml in macro is not honoured", "{% macro m() %}{% set yaml = true %}{% endmacro %}{{ m() }}[1]", "[1]", ""},
	{"yaml set last wins", "{% set yaml = true %}{% set yaml = false %}[1]", "[1]", ""},
	{"yaml non-bool", "{% set yaml = 1 %}x", nil, "yaml must be set to true or false"},
	{"yaml string", "{% set yaml = 'true' %}x", nil, "yaml must be set to true or false"},
	{"yaml undefined", "{% set yaml = abc %}x", nil, "yaml must be set to true or false"},
	{"yaml from vars is not the template's", "x", "x", ""},
	{"yaml null", "{% set yaml = true %}null", nil, ""},
	{"yaml bad", "{% set yaml = true %}a: [", nil, "not valid YAML"},
	{"yaml float", "{% set yaml = true %}1.5", 1.5, ""},
	{"yaml big integer", "{% set yaml = true %}9007199254740993", int64(9007199254740993), ""},
	// PyYAML's YAML 1.1 scalars, as PaV parsed them
	{"yaml 1.1 scalars", "{% set yaml = true %}[y, n, yes, No, on, OFF, 012, 0o12, 0x1F, 1_000, 1e3, 1.5e+3, 1.0, ~, '1', 2020-01-02, 08]",
		[]any{"y", "n", true, false, true, false, int64(10), "0o12", int64(31), int64(1000), "1e3", int64(1500), int64(1), nil, "1", "2020-01-02", "08"}, ""},
	{"yaml tojson exponent", "{% set yaml = true %}{{ 1e16 | tojson }}", "1e+16", ""},
	{"yaml merge keys", "{% set yaml = true %}base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  y: 3", map[string]any{"base": map[string]any{"x": int64(1), "y": int64(2)}, "c": map[string]any{"x": int64(1), "y": int64(3)}}, ""},
	{"yaml scalar keys", "{% set yaml = true %}{1: a, false: b, null: c}", map[string]any{"1": "a", "false": "b", "null": "c"}, ""},
	{"yaml duplicate keys", "{% set yaml = true %}{a: 1, a: 2}", map[string]any{"a": int64(2)}, ""},
	{"yaml two documents", "{% set yaml = true %}a: 1\n---\nb: 2", nil, "expected a single document"},
	{"yaml alias bomb", "{% set yaml = true %}a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]", nil, "too large"},
	{"yaml unknown tag", "{% set yaml = true %}!!python/object:os.system x", nil, "not supported"},

	// errors
	{"unknown filter at parse time", "{% if false %}{{ 1 | nosuch }}{% endif %}", nil, "syntax error: no filter named 'nosuch'"},
	{"unknown test at parse time", "{% if false %}{{ 1 is nosuch }}{% endif %}", nil, "syntax error: no test named 'nosuch'"},
	{"unknown tag", "{% do x %}", nil, "syntax error"},
	{"line break in an expression", "{{ 'a' ~\n'b' }}|{{ 1 +\n2 }}", "ab|3", ""},
	{"a character Jinja refuses, on its line", "x\n{{ a\n\n $ }}", nil, "syntax error: unexpected char '$' (line 4)"},
	{"lines counted across line breaks in expressions", "x\n{{ a\n\n}}{{ 1 + 'a' }}", nil, "(line 4)"},
	{"error line", "a\nb\n{% if true %}\n{{ abc }}\n{% endif %}", nil, "'abc' is undefined (line 4)"},
	{"deep nesting", "{{ " + strings.Repeat("(", 2000) + "1" + strings.Repeat(")", 2000) + " }}", nil, "nested too deeply"},
	{"deep blocks", strings.Repeat("{% if true %}", 2000) + strings.Repeat("{% endif %}", 2000), nil, "nested too deeply"},
	{"output limit", "{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}", nil, "exceeds"},
	{"lipsum bounded", "{{ lipsum(100000) }}", nil, "too large"},
	{"center bounded", "{{ 'x' | center(1000000000) }}", nil, "too large"},
	{"ljust bounded", "{{ 'x'.ljust(1000000000) }}", nil, "too large"},
	{"zfill bounded", "{{ 'x'.zfill(1000000000) }}", nil, "too large"},
	{"format width bounded", "{{ '%1000000000d' | format(1) }}", nil, "too large"},
}

// TestEvaluateString covers behaviour beyond the acceptance vectors.
func TestEvaluateString(t *testing.T) {
	e := New(Options{})
	for _, tc := range evalCases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := e.EvaluateString(context.Background(), tc.tmpl, evalVars)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("%q: got %#v, %v; want an error containing %q", tc.tmpl, got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%q: %v", tc.tmpl, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("%q: got %#v, want %#v", tc.tmpl, got, tc.want)
			}
		})
	}
}

// TestLiteralFastPath checks that strings without template syntax, which
// skip the parser, render exactly as if they had been parsed.
func TestLiteralFastPath(t *testing.T) {
	e := New(Options{})
	for _, s := range []string{"", "a", "a\n", "a\n\n", "\n", "a\r\nb\r\n", "a\rb\r", " x \n ", "{ }", "}}", "%}", "é\n"} {
		fast, err := e.EvaluateString(context.Background(), s, nil)
		if err != nil {
			t.Fatal(err)
		}
		parsed, err := e.EvaluateString(context.Background(), "{# #}"+s, nil)
		if err != nil {
			t.Fatal(err)
		}
		if fast != parsed {
			t.Errorf("%q: fast path %q, parsed %q", s, fast, parsed)
		}
	}
}

func TestRefusedTags(t *testing.T) {
	e := New(Options{})
	for _, tmpl := range []string{
		"{% include 'x.txt' %}",
		"{% include '/etc/passwd' %}",
		"{% import 'x' as y %}",
		"{% from 'x' import y %}",
		"{% extends 'base' %}",
		"{% if true %}{% include 'x' %}{% endif %}",
	} {
		_, err := e.EvaluateString(context.Background(), tmpl, nil)
		if err == nil || !strings.Contains(err.Error(), "is not allowed in pav templates") {
			t.Errorf("%q: got %v, want a refusal", tmpl, err)
		}
		if err := Check(tmpl, "spec.x"); err == nil || !strings.Contains(err.Error(), "is not allowed in pav templates") {
			t.Errorf("Check(%q): got %v, want a refusal", tmpl, err)
		}
	}
}

// TestSandbox checks that templates can neither modify their context nor
// reach Go methods or fields of the values they see.
func TestSandbox(t *testing.T) {
	e := New(Options{})
	newVars := func() Vars {
		return Vars{
			"m": map[string]any{"x": int64(1), "l": []any{int64(1), int64(2), int64(3)}},
			"l": append(make([]any, 0, 8), "a", "b"), // spare capacity: append must not write into it
		}
	}
	vars := newVars()
	for _, tc := range []struct{ tmpl, wantErr string }{
		{"{% set m.x = 2 %}", "cannot assign attribute on non-namespace object"},
		{"{% set m.l = [] %}", "cannot assign attribute"},
		{"{{ m.update({'x': 2}) }}", "unsafe"},
		{"{{ m.pop('x') }}", "unsafe"},
		{"{{ m.setdefault('y', 1) }}", "unsafe"},
		{"{{ m.clear() }}", "unsafe"},
		{"{{ m.l.reverse() }}", "unsafe"},
		{"{{ m.l.append(4) }}", "unsafe"},
		{"{{ l.append('c') }}", "unsafe"},
		{"{{ m.l.sort() }}", "unsafe"},
		{"{{ m.l.pop() }}", "unsafe"},
		{"{{ {'a': 1}.Keys() }}", "has no attribute 'Keys'"},
		{"{{ {'a': 1}.Pairs }}", "is undefined"},
		{"{{ {'a': 1} | attr('Pairs') }}", "is undefined"},
		{"{{ [1].Swap(0, 0) }}", "has no attribute 'Swap'"},
		{"{{ [[1, 2]] | map(attribute='Swap') | first }}", "evaluated to None"},
		{"{{ [{'a': 1}] | map(attribute='Keys') | first }}", "evaluated to None"},
		{"{{ namespace(a=1).attrs }}", "is undefined"},
		{"{{ loop }}", "is undefined"},
		{"{{ m.__class__ }}", "is undefined"},
		{"{{ gonja.version }}", "is undefined"},
		{"{{ range(3).__len__() }}", "has no attribute"},
	} {
		if _, err := e.EvaluateString(context.Background(), tc.tmpl, vars); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%q: got %v, want an error containing %q", tc.tmpl, err, tc.wantErr)
		}
	}
	// Rebinding a name only shadows it in the template.
	if got, err := e.EvaluateString(context.Background(), "{% set m = 5 %}{% set l = 1 %}{{ m }}", vars); err != nil || got != "5" {
		t.Fatalf("got %v, %v", got, err)
	}
	if !reflect.DeepEqual(vars, newVars()) {
		t.Fatalf("vars were modified: %#v", vars)
	}
	if got := vars["l"].([]any)[:3][2]; got != nil {
		t.Fatalf("spare capacity of a context list was written: %#v", got)
	}
}

// TestInputNotMutated evaluates a tree and checks that neither the tree nor
// the vars changed, and that the result shares no container with either.
func TestInputNotMutated(t *testing.T) {
	mk := func() (map[string]any, Vars) {
		tree := map[string]any{
			"a": []any{"{{ x.k }}", map[string]any{"b": "{% set yaml = true %}{{ x | tojson }}"}, int64(1), nil, true, 1.5},
			"c": "{% set yaml = true %}{{ x.l | tojson }}",
			"d": map[string]any{"e": "plain"},
		}
		vars := Vars{"x": map[string]any{"k": "v", "l": []any{int64(1), "2"}}}
		return tree, vars
	}
	tree, vars := mk()
	out, err := New(Options{}).Evaluate(context.Background(), tree, "spec", vars)
	if err != nil {
		t.Fatal(err)
	}
	tree0, vars0 := mk()
	if !reflect.DeepEqual(tree, tree0) || !reflect.DeepEqual(vars, vars0) {
		t.Fatal("input was modified")
	}
	want := map[string]any{
		"a": []any{"v", map[string]any{"b": map[string]any{"k": "v", "l": []any{int64(1), "2"}}}, int64(1), nil, true, 1.5},
		"c": []any{int64(1), "2"},
		"d": map[string]any{"e": "plain"},
	}
	if !reflect.DeepEqual(out, want) {
		t.Fatalf("got %#v", out)
	}
	// Modifying the output must not show through to the input.
	out.(map[string]any)["d"].(map[string]any)["e"] = "changed"
	out.(map[string]any)["a"].([]any)[0] = "changed"
	if !reflect.DeepEqual(tree, tree0) {
		t.Fatal("output shares containers with the input")
	}
}

func TestErrorPaths(t *testing.T) {
	e := New(Options{})
	tree := map[string]any{
		"podTemplate": map[string]any{"spec": map[string]any{"containers": []any{
			map[string]any{"command": []any{"sh", "-c", "{{ abc }}"}},
		}}},
	}
	_, err := e.Evaluate(context.Background(), tree, "spec.volumeCreation", nil)
	var te *Error
	if !errors.As(err, &te) {
		t.Fatalf("got %T %v, want *Error", err, err)
	}
	wantPath := "spec.volumeCreation.podTemplate.spec.containers[0].command[2]"
	if te.Path != wantPath {
		t.Fatalf("path %q, want %q", te.Path, wantPath)
	}
	if want := wantPath + ": template error: 'abc' is undefined (line 1)"; err.Error() != want {
		t.Fatalf("got %q, want %q", err.Error(), want)
	}

	_, err = e.Evaluate(context.Background(), map[string]any{"capacity": "{{ abc }}"}, "spec.volumeCreation", nil)
	if want := "spec.volumeCreation.capacity: template error: 'abc' is undefined (line 1)"; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}

	// Keys that are not identifiers are quoted.
	_, err = e.Evaluate(context.Background(), map[string]any{"example.com/x": "{{"}, "metadata.annotations", nil)
	if !errors.As(err, &te) || te.Path != `metadata.annotations["example.com/x"]` {
		t.Fatalf("got %v", err)
	}

	// EvaluateString: an *Error without a path.
	_, err = e.EvaluateString(context.Background(), "{{ abc }}", nil)
	if !errors.As(err, &te) || te.Path != "" || err.Error() != "template error: 'abc' is undefined (line 1)" {
		t.Fatalf("got %v", err)
	}

	// Unsupported values.
	if _, err := e.Evaluate(context.Background(), map[string]any{"x": struct{}{}}, "spec", nil); err == nil || !strings.Contains(err.Error(), "spec.x: unsupported value") {
		t.Fatalf("got %v", err)
	}
}

func TestCheck(t *testing.T) {
	good := map[string]any{
		"provisioningModes": []any{"Dynamic"},
		"volumeStaging": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{"containers": []any{
			map[string]any{"image": "busybox", "command": []any{"sh", "-c", "echo {{ handle | tobash }}; {% if abc %}{{ x.y }}{% endif %}"}},
		}}}},
		"n": int64(1), "f": 1.5, "b": true, "z": nil,
	}
	if err := Check(good, "spec"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		value      any
		path, want string
	}{
		{map[string]any{"a": "ok", "b": []any{"ok", "{% if %}"}}, "spec.b[1]", "template syntax error"},
		{map[string]any{"z": "{{ 1 | nosuchfilter }}", "a": "{{"}, "spec.a", "template syntax error"}, // first in key order
		{map[string]any{"a": "{% for %}"}, "spec.a", "template syntax error"},
		{map[string]any{"a": "{% endif %}"}, "spec.a", "template syntax error"},
		{map[string]any{"a": "{% if true %}"}, "spec.a", "template syntax error"},
		{map[string]any{"a": "{{ x | nosuch }}"}, "spec.a", "no filter named 'nosuch'"},
		{map[string]any{"a": []any{map[string]int{}}}, "spec.a[0]", "unsupported value"},
	} {
		err := Check(tc.value, "spec")
		var te *Error
		if !errors.As(err, &te) || te.Path != tc.path || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%v) = %v; want path %q and %q", tc.value, err, tc.path, tc.want)
		}
	}
}

type fakePVCs map[string]map[string]any

var errNotFound = errors.New("not found")

func (f fakePVCs) GetPVC(ctx context.Context, namespace, name string) (map[string]any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if pvc, ok := f[namespace+"/"+name]; ok {
		return pvc, nil
	}
	return nil, fmt.Errorf("persistentvolumeclaims %q: %w", name, errNotFound)
}

func TestGetPVC(t *testing.T) {
	pvcs := fakePVCs{"ns1/data": {
		"metadata": map[string]any{"name": "data", "annotations": map[string]any{"example.com/bucket": "b1"}},
		"spec":     map[string]any{"resources": map[string]any{"requests": map[string]any{"storage": "1Gi"}}},
	}}
	e := New(Options{PVCs: pvcs})
	vars := Vars{"ns": "ns1"}

	got, err := e.EvaluateString(context.Background(), "{{ get_pvc('data', ns).metadata.annotations['example.com/bucket'] }}", vars)
	if err != nil || got != "b1" {
		t.Fatalf("found: got %v, %v", got, err)
	}
	got, err = e.EvaluateString(context.Background(), "{% set p = get_pvc(name='data', namespace='ns1') %}{{ p.spec.resources.requests.storage }}", vars)
	if err != nil || got != "1Gi" {
		t.Fatalf("keywords: got %v, %v", got, err)
	}

	_, err = e.Evaluate(context.Background(), map[string]any{"x": "{{ get_pvc('nope', ns).metadata.name }}"}, "spec", vars)
	if err == nil || !strings.Contains(err.Error(), `spec.x: template error: get_pvc("nope", "ns1"): persistentvolumeclaims "nope": not found (line 1)`) {
		t.Fatalf("missing: got %v", err)
	}
	if !errors.Is(err, errNotFound) {
		t.Fatalf("missing: the getter's error is not wrapped: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = e.EvaluateString(ctx, "{{ get_pvc('data', 'ns1').metadata.name }}", nil)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: got %v", err)
	}

	for _, tmpl := range []string{"{{ get_pvc('data') }}", "{{ get_pvc(1, 2) }}", "{{ get_pvc('data', abc) }}"} {
		if _, err := e.EvaluateString(context.Background(), tmpl, nil); err == nil {
			t.Errorf("%q: no error", tmpl)
		}
	}

	_, err = New(Options{}).EvaluateString(context.Background(), "{{ get_pvc('data', 'ns1') }}", nil)
	if err == nil || !strings.Contains(err.Error(), "get_pvc is not available here") {
		t.Fatalf("no getter: got %v", err)
	}

	// get_pvc wins over a context variable of the same name, as in PaV.
	got, err = e.EvaluateString(context.Background(), "{{ get_pvc('data', 'ns1').metadata.name }}", Vars{"get_pvc": "shadow"})
	if err != nil || got != "data" {
		t.Fatalf("shadowing: got %v, %v", got, err)
	}
}

func TestCancellation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	// 10^10 iterations unless cancelled.
	_, err := New(Options{}).EvaluateString(ctx,
		"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestConcurrentUse(t *testing.T) {
	e := New(Options{PVCs: fakePVCs{"ns/c": {"metadata": map[string]any{"name": "c"}}}})
	tree := map[string]any{
		"a": "{% set yaml = true %}{{ x | tojson }}",
		"b": []any{"{{ x.n + i }}", "{{ get_pvc('c', 'ns').metadata.name }}", "{% for k in x.l %}{{ k }}{% endfor %}"},
		"c": "{% set ns = namespace(v=0) %}{% for k in x.l %}{% set ns.v = ns.v + k %}{% endfor %}{{ ns.v }}",
		"d": "{% macro m(v) %}[{{ v }}]{% endmacro %}{% with y = x.n %}{{ m(y) }}{% endwith %}{% filter upper %}a{% endfilter %}{{ x.l | map('string') | join }}",
	}
	shared := map[string]any{"n": int64(10), "l": []any{int64(1), int64(2)}}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				out, err := e.Evaluate(context.Background(), tree, "spec", Vars{"x": shared, "i": int64(i)})
				if err != nil {
					t.Error(err)
					return
				}
				want := map[string]any{
					"a": map[string]any{"n": int64(10), "l": []any{int64(1), int64(2)}},
					"b": []any{fmt.Sprint(10 + i), "c", "12"},
					"c": "3",
					"d": "[10]A12",
				}
				if !reflect.DeepEqual(out, want) {
					t.Errorf("goroutine %d: got %#v", g, out)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestToBash(t *testing.T) {
	for in, want := range map[string]string{
		"":              "''",
		"\n":            `$'\n'`,
		" a\nb":         `' a'$'\n'b`,
		"abc":           "abc",
		"a b":           "'a b'",
		"it's":          `'it'"'"'s'`,
		"a\n\nb":        `a$'\n'$'\n'b`,
		"x\n":           `x$'\n'`,
		"$HOME":         "'$HOME'",
		"A_z@%+=:,./-0": "A_z@%+=:,./-0",
		"é":             "'é'",
	} {
		if got := ToBash(in); got != want {
			t.Errorf("ToBash(%q) = %q, want %q", in, got, want)
		}
	}
}

// tojson of context data: keys sorted, Jinja's separators, HTML-unsafe
// characters escaped; what JSON cannot hold is an error.
func TestToJSONOfContextData(t *testing.T) {
	e := New(Options{})
	vars := Vars{"v": map[string]any{"b": []any{int64(1), 2.5, "<x>", nil, true}, "a": map[string]any{}}, "f": func() {}}
	got, err := e.EvaluateString(context.Background(), "{{ v | tojson }}", vars)
	if err != nil || got != `{"a": {}, "b": [1, 2.5, "\u003cx\u003e", null, true]}` {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := e.EvaluateString(context.Background(), "{{ f | tojson }}", vars); err == nil || !strings.Contains(err.Error(), "not JSON serializable") {
		t.Fatalf("a function: %v", err)
	}
}

// TestPyFloat holds pyFloat (gonja's Value.String for finite values) to
// Python's repr(); the expectations are Python 3's output.
func TestPyFloat(t *testing.T) {
	for f, want := range map[float64]string{
		0: "0.0", math.Copysign(0, -1): "-0.0", 1: "1.0", 1.5: "1.5", 0.30000000000000004: "0.30000000000000004",
		1e15: "1000000000000000.0", 1e16: "1e+16", 1e-4: "0.0001", 1e-5: "1e-05", 1.5e-7: "1.5e-07",
		123456789012345678.0: "1.2345678901234568e+17", 5e-324: "5e-324", math.MaxFloat64: "1.7976931348623157e+308",
		100: "100.0", -2.5e-10: "-2.5e-10", math.Inf(1): "inf", math.Inf(-1): "-inf",
	} {
		if got := pyFloat(f); got != want {
			t.Errorf("pyFloat(%v) = %q, want %q", f, got, want)
		}
	}
	if got := pyFloat(math.NaN()); got != "nan" {
		t.Errorf("pyFloat(NaN) = %q", got)
	}
}

func TestNormalize(t *testing.T) {
	in := map[string]any{"a": 1.0, "b": 1.5, "c": []any{float64(1 << 40), "x", nil, true}, "d": 3, "e": map[string]any{"f": 2.0}}
	want := map[string]any{"a": int64(1), "b": 1.5, "c": []any{int64(1 << 40), "x", nil, true}, "d": int64(3), "e": map[string]any{"f": int64(2)}}
	got := Normalize(in)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v", got)
	}
	if in["a"] != 1.0 {
		t.Fatal("input modified")
	}
}

// Parsing is cached by source, failures included, and the cache is bounded.
func TestCompileCache(t *testing.T) {
	cache.Clear()
	t.Cleanup(cache.Clear)
	a, err := compile("{{ cached }}")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := compile("{{ cached }}"); b != a {
		t.Error("a second compile of the same source parsed it again")
	}
	_, err1 := compile("{{ broken")
	_, err2 := compile("{{ broken")
	if err1 == nil || err1 != err2 {
		t.Errorf("a parse failure is not cached: %v, %v", err1, err2)
	}
	for i := range cacheSize + 10 {
		_, _ = compile(fmt.Sprintf("{{ x%d }}", i))
	}
	if n := cache.Len(); n != cacheSize {
		t.Errorf("cache holds %d templates, want at most %d", n, cacheSize)
	}
}
