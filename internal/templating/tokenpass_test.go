package templating

import (
	"strconv"
	"strings"
	"testing"

	"github.com/nikolalohinski/gonja/v2/tokens"
)

// TestTokenPass shows the tokens gonja's parser reads for expressions whose
// grammar differs from Jinja's: a test's `is` as `|` (written "is|") and
// its name as a filter's (with "!" when negated), in and not in as
// comparisons ("=in", "=not in"), the first `not` or sign of a run with
// the run's length or the others, joined strings, added parentheses.
func TestTokenPass(t *testing.T) {
	for _, tc := range []struct{ tmpl, want string }{
		{"{{ 1 + 1 is odd }}", "1 + 1 is| odd"},
		{"{{ x is not divisibleby 3 + 1 }}", "x is| divisibleby! ( 3 ) + 1"},
		{"{{ x is sameas y.z[0](1) < 2 }}", "x is| sameas ( y . z [ 0 ] ( 1 ) ) < 2"},
		{"{{ x is in l }}", "x is| in ( l )"},
		{"{{ a < b in c not in d }}", "a < b =in c =not in d"},
		{"{% for x in l if x in m %}{% endfor %}", "for x in l if x =in m endfor"},
		{"{{ x in(1, 2) and(y) }}", "x =in ( 1 , 2 ) and ( y )"},
		{"{{ not not not x }}", "not×3 x"},
		{"{{ - + -x }}", "-[+-] x"},
		{"{{ 'a' \"b\" 'c' }}", "abc"},
		{"{{ f(a, b=1,) }}{{ {'k': 1,} }}", "f ( a , b = 1 ) { k : 1 }"},
		{"{{ 1.}}", "1 ."},
	} {
		lx, err := lexTemplate(tc.tmpl)
		if err != nil {
			t.Errorf("%q: %v", tc.tmpl, err)
			continue
		}
		var got []string
		for _, tok := range lx.toks {
			s := tok.Val
			switch {
			case tok.Type == tokens.EOF, tok.Type == tokens.VariableBegin, tok.Type == tokens.VariableEnd,
				tok.Type == tokens.BlockBegin, tok.Type == tokens.BlockEnd:
				continue
			case tok.Type == tokens.Pipe && tok.Val == "is":
				s = "is|"
			case tok.Type == tokens.Equals && tok.Val != "==":
				s = "=" + tok.Val
			}
			if negated, ok := lx.tests[tok]; ok && negated {
				s += "!"
			}
			if n := lx.nots[tok]; n > 0 {
				s += "×" + strconv.Itoa(n)
			}
			if signs := lx.signs[tok]; len(signs) > 0 {
				s += "["
				for _, minus := range signs {
					if minus {
						s += "-"
					} else {
						s += "+"
					}
				}
				s += "]"
			}
			got = append(got, s)
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("%q: got %q, want %q", tc.tmpl, g, tc.want)
		}
	}
}

// TestTokenPassRefuses checks forms Jinja refuses that gonja's parser took.
func TestTokenPassRefuses(t *testing.T) {
	for tmpl, want := range map[string]string{
		"{{ a is odd is even }}":          "You cannot chain multiple tests with is",
		"{{ a not b }}":                   "unexpected 'not'",
		"{{ f(a or b = 1) }}":             "expected token ',', got '='",
		"{{ f(a=1, 2) }}":                 "invalid syntax for function call expression",
		"{{ f(a=1, a=2) }}":               "keyword argument repeated: a",
		"{{ f(1 2) }}":                    "expected token ',', got 'integer'",
		"{% macro m(a,) %}{% endmacro %}": "expected token 'name', got ')'",
		"{{ 1 $ 2 }}":                     "unexpected char '$'",
		"x\n{{ a\n\n ? }}":                "unexpected char '?' (line 4)",
	} {
		_, err := lexTemplate(tmpl)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error containing %q", tmpl, err, want)
		}
	}
}
