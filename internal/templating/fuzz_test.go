package templating

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// FuzzToBash checks tobash's contract: the output never contains a newline,
// and bash reads it back as exactly the input.
//
//	go test -fuzz=FuzzToBash ./templating
func FuzzToBash(f *testing.F) {
	for _, s := range []string{"", "\n", " a\nb", "42", "it's", "a b", "$(id)", "`id`", "\\", "'\n'", "\t", "é", "\xff", "!x", "a\r\nb", "--", "~", "*", "$'\\n'"} {
		f.Add(s)
	}
	bash, bashErr := exec.LookPath("bash")
	f.Fuzz(func(t *testing.T, s string) {
		word := ToBash(s)
		if strings.Contains(word, "\n") {
			t.Fatalf("ToBash(%q) = %q contains a newline", s, word)
		}
		if got, ok := unquoteBashWord(word); !ok || got != s {
			t.Fatalf("ToBash(%q) = %q, which reads back as %q (ok=%v)", s, word, got, ok)
		}
		if strings.IndexByte(s, 0) >= 0 {
			return // bash strings cannot hold NUL
		}
		if bashErr != nil {
			t.Skip("bash not found")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bash, "-c", "printf %s "+word)
		cmd.Env = []string{"LC_ALL=C"}
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("bash -c 'printf %%s %s': %v", word, err)
		}
		if out.String() != s {
			t.Fatalf("ToBash(%q) = %q; bash printed %q", s, word, out.String())
		}
	})
}

// unquoteBashWord reads a word made of bare characters, '…' quoting and
// $'\n', the only forms ToBash produces, as bash would.
func unquoteBashWord(w string) (string, bool) {
	var b strings.Builder
	for len(w) > 0 {
		switch {
		case strings.HasPrefix(w, `$'\n'`):
			b.WriteByte('\n')
			w = w[5:]
		case w[0] == '\'':
			end := strings.IndexByte(w[1:], '\'')
			if end < 0 {
				return "", false
			}
			b.WriteString(w[1 : 1+end])
			w = w[2+end:]
		case w[0] == '"':
			end := strings.IndexByte(w[1:], '"')
			if end < 0 || strings.ContainsAny(w[1:1+end], "$`\\!") {
				return "", false
			}
			b.WriteString(w[1 : 1+end])
			w = w[2+end:]
		case isShellSafe(w[:1]):
			b.WriteByte(w[0])
			w = w[1:]
		default:
			return "", false
		}
	}
	return b.String(), true
}

// FuzzEvaluateString checks that no template makes the evaluator panic
// (panics are recovered into "internal error"), hang, or behave
// non-deterministically, and that Check agrees with evaluation about syntax.
//
//	go test -fuzz=FuzzEvaluateString ./templating
func FuzzEvaluateString(f *testing.F) {
	for _, s := range []string{
		"{{ a + b * c }}", "{% set yaml = true %}x: {{ l | tojson }}", "{% for i in l %}{{ loop.index }}{{ i }}{% endfor %}",
		"{{ m.k | default('x') | upper }}", "{{ s | tobash }}", "{% if a is defined and a > 1 %}y{% else %}n{% endif %}",
		"{% macro f(x) %}{{ x }}{% endmacro %}{{ f(1) }}", "{{ '%s' % a }}", "{{ m.items() | list }}", "{{ 'a' if x else 'b' }}",
		"{% set ns = namespace(v=1) %}{% set ns.v = 2 %}{{ ns.v }}", "{{ range(3) | join }}", "{% raw %}{{{% endraw %}",
		"{{ l[1:] }}", "{{ m['k'] ~ s }}", "{% with x = 1 %}{{ x }}{% endwith %}", "{% filter upper %}x{% endfilter %}",
		"{{ 2 ** 64 }}", "{{ -a // 0 }}", "{{ s.split(' ') }}", "{{ f.is_integer() }}", "{{ {'a': [1, 2.5, none]} | tojson }}",
		"{{ get_pvc('a', 'b') }}", "{% set x %}{{ a }}{% endset %}{{ x }}", "{{ l | map('string') | join(',') }}",
		"{{ s | center(5) }}", "{{ l | batch(2) | list }}", "{{ m | dictsort }}", "{{ l | groupby('x') }}", "{{ cycler(1,2).next() }}",
		"{% set yaml = true %}a: &x [1, on]\nb: *x\nc: {<<: {d: 012}}", "{{ ' a b '.split() }}{{ s.rsplit(' ', 1) }}", "{{ l | min }}",
		"{% macro f() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, k=2) }}", "{% for x in l if x %}{{ loop.previtem }}{% endfor %}",
		"{{ 2.5 | round }}{{ s | wordcount }}{{ m | urlencode }}{{ l | join(attribute='x') }}", "{{ 'a' ~ undefined_name ~ none }}",
		"{{ 'a' ~\n'b' }}{%\nif 0 < a < 3 in l %}x{% endif %}", "{{ 1 + a is odd }}{{ a is divisibleby 2 + 1 }}{{ a is not in l }}",
		"{{ not not - -a }}{{ 'a' 'b' }}{{ dict(a=1,) }}{{ 'a' in 'b' ~ 'a' }}", "{% autoescape 1 %}{{ '<' }}{% endautoescape %}",
	} {
		f.Add(s)
	}
	vars := Vars{
		"a": int64(2), "b": int64(3), "c": int64(4), "f": 1.5, "s": "it's a\nstring", "n": nil, "t": true,
		"l": []any{int64(1), "x", 2.5, nil, map[string]any{"x": int64(1)}},
		"m": map[string]any{"k": "v", "n": map[string]any{"deep": []any{true}}},
	}
	e := New(Options{PVCs: fakePVCs{"b/a": {"metadata": map[string]any{"name": "a"}}}})
	f.Fuzz(func(t *testing.T, tmpl string) {
		if len(tmpl) > 4096 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		got1, err1 := e.EvaluateString(ctx, tmpl, vars)
		if err1 != nil && strings.Contains(err1.Error(), "internal error") {
			t.Fatalf("%q: %v", tmpl, err1)
		}
		if errors.Is(err1, context.DeadlineExceeded) {
			return // a legitimately slow template; timing makes it non-deterministic
		}
		got2, err2 := e.EvaluateString(ctx, tmpl, vars)
		if errors.Is(err2, context.DeadlineExceeded) {
			return
		}
		if !reflect.DeepEqual(got1, got2) || (err1 == nil) != (err2 == nil) || (err1 != nil && err1.Error() != err2.Error()) {
			t.Fatalf("%q: not deterministic: %#v, %v vs %#v, %v", tmpl, got1, err1, got2, err2)
		}
		checkErr := Check(tmpl, "spec.x")
		syntaxFailed := err1 != nil && strings.Contains(err1.Error(), "syntax error")
		if (checkErr != nil) != syntaxFailed {
			t.Fatalf("%q: Check says %v, evaluation says %v", tmpl, checkErr, err1)
		}
	})
}

// FuzzExpressionGrammar compares pav with Jinja2 (testdata/pav_reference.py,
// as TestDifferentialPaV does) on expressions generated from a small grammar
// by the fuzzer's bytes: numbers, strings (adjacent ones too), names of a
// fixed context (and an undefined one), ~ + - * / // %, chained
// comparisons with `in` and `not in` among them, and/or/not (`not not`
// too), unary signs (`- -x` too), parentheses, filters, tests (after
// arithmetic, with and without arguments, negated), subscripts, list and
// dict literals, and conditional expressions with and without else, placed
// in {{ … }}, set, if, for filters, macro defaults and filter arguments,
// with line breaks and tabs between tokens. Both must succeed with equal values or both fail. One
// Python process per fuzzing process answers every input (a line of JSON
// each way); without a python3 that has jinja2 and yaml the target is
// skipped (except in CI, as TestDifferentialPaV).
//
//	go test -run '^$' -fuzz '^FuzzExpressionGrammar$' -fuzztime 3m ./internal/templating
func FuzzExpressionGrammar(f *testing.F) {
	for _, s := range []string{
		"", "\x00", "\x02\x05\x03\x01\x07", "\x00\x02\x02\x0b\x03\x04\x00\x02\x09\x06",
		"\x05\x02\x08\x02\x01\x03\x02\x05\x00\x04", "\x06\x0b\x02\x0a\x07\x02\x09\x00\x01\x03\x05",
		"\x04\x02\x03\x02\x0a\x01\x0b\x00\x02\x02\x05\x01", "\x07\x0a\x03\x02\x06\x02\x00\x09\x01",
		"\x08\x02\x02\x03\x02\x02\x0a\x04\x0b\x01\x08\x03\x05",
	} {
		f.Add([]byte(s))
	}
	vars := Vars{
		"a": int64(2), "b": int64(3), "z": int64(0), "f": 2.5, "s": "Ab c", "e": "", "t": true, "n": nil,
		"l": []any{int64(3), int64(1), int64(2)}, "m": map[string]any{"k": "v", "n": int64(1)},
	}
	e := New(Options{})
	f.Fuzz(func(t *testing.T, data []byte) {
		tmpl := (&exprGen{data: data}).template()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got, gotErr := e.EvaluateString(ctx, tmpl, vars)
		if gotErr != nil && limitError.MatchString(gotErr.Error()) {
			return // pav's own resource limits, which PaV did not have
		}
		ref, err := fuzzReference(t).eval(tmpl, vars)
		if err != nil {
			t.Fatalf("reference: %v", err)
		}
		diff := referenceDiff(ref, got, gotErr)
		if _, known := knownDeviations[tmpl]; diff != "" && !known {
			t.Fatalf("%q: %s", tmpl, diff)
		}
	})
}

// exprGen builds a template from fuzz bytes. Each choice takes a byte;
// when they run out every choice is 0, which ends the expression.
type exprGen struct {
	data []byte
	pos  int
}

func (g *exprGen) pick(n int) int {
	if g.pos >= len(g.data) {
		return 0
	}
	c := g.data[g.pos]
	g.pos++
	return int(c) % n
}

func (g *exprGen) one(choices ...string) string { return choices[g.pick(len(choices))] }

// Jinja's precedence levels, loosest first (parser.py: parse_condexpr,
// parse_or, parse_and, parse_not, parse_compare, parse_math1, parse_concat,
// parse_math2, parse_unary, parse_primary and its postfixes).
const (
	lvCond = iota
	lvOr
	lvAnd
	lvNot
	lvCompare
	lvAdd
	lvConcat
	lvMul
	lvUnary
	lvPrimary
)

const maxExprDepth = 4

func (g *exprGen) template() string {
	return g.spaces(g.statement())
}

// spaces replaces spaces outside the grammar's strings (which hold no
// quote of the other kind nor escapes) with line breaks and tabs, as the
// fuzzer's bytes say: Jinja skips any whitespace between tokens.
func (g *exprGen) spaces(tmpl string) string {
	if g.pick(3) == 0 {
		return tmpl
	}
	var b strings.Builder
	var quote byte
	for i := 0; i < len(tmpl); i++ {
		c := tmpl[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == ' ':
			b.WriteString(g.one(" ", " ", "\n", "\n  ", "\t", "\n\n", "\r\n"))
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func (g *exprGen) statement() string {
	switch g.pick(8) {
	case 1:
		return "{% set v = " + g.expr(lvCond, maxExprDepth) + " %}{{ v }}"
	case 2:
		return "{% if " + g.expr(lvCond, maxExprDepth) + " %}T{% else %}F{% endif %}"
	case 3:
		return "{{ [" + g.expr(lvCond, maxExprDepth) + ", " + g.expr(lvCond, 2) + "] | join('|') }}"
	case 4:
		return "{% for i in l if " + g.expr(lvCond, maxExprDepth) + " %}{{ i }}{% endfor %}"
	case 5:
		return "{% macro q(p=" + g.expr(lvCond, maxExprDepth) + ") %}{{ p }}{% endmacro %}{{ q() }}"
	case 6:
		return "{{ s | replace('b', " + g.expr(lvCond, maxExprDepth) + ") }}"
	}
	return "{{ " + g.expr(lvCond, maxExprDepth) + " }}"
}

// expr returns an expression that parses at level min or tighter: looser
// ones are parenthesized (and some others, at random).
func (g *exprGen) expr(min, depth int) string {
	var s string
	level := lvPrimary
	choice := 0
	if depth > 0 {
		choice = g.pick(14)
	}
	switch choice {
	case 0, 1:
		s = g.atom()
	case 2, 3: // conditional expressions
		s = g.expr(lvOr, depth-1) + " if " + g.expr(lvOr, depth-1)
		if g.pick(3) != 0 {
			s += " else " + g.expr(lvCond, depth-1)
		}
		level = lvCond
	case 4:
		if g.pick(2) == 0 {
			s, level = g.expr(lvOr, depth-1)+" or "+g.expr(lvAnd, depth-1), lvOr
		} else {
			s, level = g.expr(lvAnd, depth-1)+" and "+g.expr(lvNot, depth-1), lvAnd
		}
	case 5: // not, not not
		s, level = "not "+g.expr(lvNot, depth-1), lvNot
	case 6: // comparisons, chained
		s, level = g.expr(lvAdd, depth-1), lvCompare
		for n := 0; n == 0 || n < 3 && g.pick(3) == 0; n++ {
			s += " " + g.one("==", "!=", "<", "<=", ">", ">=", "in", "not in") + " " + g.expr(lvAdd, depth-1)
		}
	case 7:
		s, level = g.expr(lvAdd, depth-1)+" "+g.one("+", "-")+" "+g.expr(lvConcat, depth-1), lvAdd
	case 8:
		s, level = g.expr(lvConcat, depth-1)+" ~ "+g.expr(lvMul, depth-1), lvConcat
	case 9:
		op := g.one("*", "/", "//", "%")
		right := g.expr(lvUnary, depth-1)
		if op == "%" {
			// No list right of %: Python formats a str % list in mapping
			// mode and a str % tuple with the tuple's items, and pav's
			// values do not tell lists from tuples (a known deviation).
			right = g.one("a", "b", "z", "f", "t", "n", "u", "m", "s", "2", "0.5", "(a, b)", "-("+g.expr(lvCond, depth-1)+")")
		}
		s, level = g.expr(lvMul, depth-1)+" "+op+" "+right, lvMul
	case 10:
		s, level = g.one("-", "- -", "-+", "+")+g.expr(lvPrimary, depth-1), lvUnary
	case 11: // filters apply to a unary expression: -x | f is f(-x)
		base := g.expr(lvUnary, depth-1)
		switch g.pick(6) {
		case 0:
			s = base + " | default(" + g.expr(lvCond, depth-1) + ")"
		case 1:
			s = base + " | string"
		case 2:
			s = base + " | int"
		case 3: // length of what has one (gonja's length of a number is 0, a known deviation)
			s = g.one("s", "l", "m", "e", "u", "'xy'") + " | length"
		case 4:
			s = "(" + base + " ~ '') | " + g.one("upper", "lower", "trim")
		default:
			s = "[" + g.expr(lvCond, depth-1) + ", " + g.expr(lvCond, depth-1) + "] | " + g.one("first", "last", "length", "join(',')")
		}
		level = lvUnary
	case 12: // subscripts and literals
		switch g.pick(4) {
		case 0:
			s = g.one("l", "s", "e") + "[" + g.expr(lvCond, depth-1) + "]"
		case 1:
			s = "{'k': " + g.expr(lvCond, depth-1) + "}[" + g.expr(lvCond, depth-1) + "]"
		case 2:
			s = "m." + g.one("k", "n", "zz")
		default:
			s = "[" + g.expr(lvCond, depth-1) + "][" + g.expr(lvCond, depth-1) + "]"
		}
	default: // tests, which bind as filters do: `1 + x is odd` is 1 + (x is odd)
		s = g.expr(lvUnary, depth-1) + " is " + g.one("", "not ") + g.one("defined", "undefined", "none", "string", "number",
			"odd", "even", "divisibleby 2", "divisibleby(3)", "eq a", "ne 'a'", "lt 3", "in l", "in 'Ab c'", "sameas none",
			"eq "+g.expr(lvPrimary, depth-1))
		level = lvUnary
	}
	if level < min || depth > 0 && g.pick(10) == 0 {
		s = "(" + s + ")"
	}
	return s
}

func (g *exprGen) atom() string {
	return g.one("a", "b", "z", "f", "s", "e", "t", "n", "l", "m", "u", "0", "1", "2", "3", "0.5", "2.5",
		"''", "'a'", "'Ab c'", "true", "false", "none", "'A' \"b c\"", "'' 'a' ''")
}

// fuzzRef is a long-running testdata/pav_reference.py: one line of JSON in,
// one out, for each template.
type fuzzRef struct {
	mu  sync.Mutex
	in  io.WriteCloser
	out *bufio.Reader
}

var (
	fuzzRefOnce sync.Once
	fuzzRefProc *fuzzRef
	fuzzRefSkip string
)

func fuzzReference(t *testing.T) *fuzzRef {
	fuzzRefOnce.Do(func() {
		py, why := referencePython()
		if py == "" {
			fuzzRefSkip = "no python3 with jinja2 and yaml (apt-get install python3-jinja2 python3-yaml): " + strings.Join(why, "; ")
			return
		}
		cmd := exec.Command(py, "testdata/pav_reference.py")
		in, err := cmd.StdinPipe()
		if err != nil {
			fuzzRefSkip = err.Error()
			return
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			fuzzRefSkip = err.Error()
			return
		}
		if err := cmd.Start(); err != nil {
			fuzzRefSkip = err.Error()
			return
		}
		// It exits when its standard input closes, with the test process.
		fuzzRefProc = &fuzzRef{in: in, out: bufio.NewReaderSize(out, 1<<20)}
	})
	if fuzzRefProc == nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(fuzzRefSkip)
		}
		t.Skip(fuzzRefSkip)
	}
	return fuzzRefProc
}

func (r *fuzzRef) eval(tmpl string, vars Vars) (map[string]any, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	line, err := json.Marshal(map[string]any{"tmpl": tmpl, "vars": vars})
	if err != nil {
		return nil, err
	}
	if _, err := r.in.Write(append(line, '\n')); err != nil {
		return nil, err
	}
	answer, err := r.out.ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(answer))
	dec.UseNumber()
	var ref map[string]any
	return ref, dec.Decode(&ref)
}
