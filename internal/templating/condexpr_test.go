package templating

import (
	"strings"
	"testing"

	"github.com/nikolalohinski/gonja/v2/tokens"
)

// TestConditionalKeywords checks which `if` and `else` the token pass
// re-types as a conditional's keyword (shown upper-case): those after a
// complete operand, except a test's argument and the top level of the if,
// elif and for tags, which Jinja parses without conditionals.
func TestConditionalKeywords(t *testing.T) {
	for _, tc := range []struct{ tmpl, want string }{
		{"{{ a if b else c }}", "a IF b ELSE c"},
		{"{{ (a ~ (b if c else d)) }}", "( a ~ ( b IF c ELSE d ) )"},
		{"{{ if if if else else }}", "if IF if ELSE else"},
		{"{{ x.if if f(if=1) else y.else }}", "x . if IF f ( if = 1 ) ELSE y . else"},
		{"{{ x is sameas if }}", "x is sameas ( if )"},
		{"{{ x is defined else y }}", "x is defined ELSE y"},
		{"{{ x is not none if c }}", "x is none ( if ) c"},
		{"{{ x is divisibleby 3 if c }}", "x is divisibleby ( 3 ) IF c"},
		{"{{ not if if c }}", "not if IF c"},
		{"{{ 'if' if 1 else [] }}", "if IF 1 ELSE [ ]"},
		{"{% if a if b else c %}{% elif (a if b) %}{% endif %}", "if a if b else c elif ( a IF b ) endif"},
		{"{% for x in l if c if d else e %}{% endfor %}", "for x in l if c IF d ELSE e endfor"},
		{"{% for x in (l if c else m) if d %}{% endfor %}", "for x in ( l IF c ELSE m ) if d endfor"},
		{"{% set if = a if b %}{% macro m(if=a if b) %}{% endmacro %}", "set if = a IF b macro m ( if = a IF b ) endmacro"},
		{"{# a if b #}{% raw %}{{ a if b }}{% endraw %}", "a if b raw {{ a if b }} endraw"},
	} {
		var got []string
		lx, err := lexTemplate(tc.tmpl)
		if err != nil {
			t.Errorf("%q: %v", tc.tmpl, err)
			continue
		}
		for _, tok := range lx.toks {
			switch {
			case isConditionalKeyword(tok):
				got = append(got, strings.ToUpper(tok.Val))
			case tok.Type == tokens.EOF, tok.Type == tokens.VariableBegin, tok.Type == tokens.VariableEnd,
				tok.Type == tokens.BlockBegin, tok.Type == tokens.BlockEnd, tok.Type == tokens.CommentBegin, tok.Type == tokens.CommentEnd:
			default:
				got = append(got, strings.TrimSpace(tok.Val))
			}
		}
		if g := strings.Join(got, " "); g != tc.want {
			t.Errorf("%q: got %q, want %q", tc.tmpl, g, tc.want)
		}
	}
}
