package templating

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"reflect"
	"strings"
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
