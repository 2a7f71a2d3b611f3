package templating

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/tokens"
)

// Whitespace inside expressions, as Jinja's lexer reads it.
//
// gonja v2.9.1's lexer knows two whitespace characters inside {{ … }} and
// {% … %}, space and tab. Any other character it has no rule for (a line
// break among them) it skips without emitting anything, so that the
// character becomes the first one of the next token's text: `{{ 'a' ~`
// line break `'b' }}` lexes the string as "\n'b'", whose value (the text
// between its first and last character) is `'b`, and renders "a'b"; `1 +`
// line break `2` is an integer "\n2" that does not parse; `a` line break
// `-}}` loses its whitespace control, which gonja reads from the first
// character; `{%` line break `if …` has an empty tag name. Jinja's lexer skips
// every whitespace character (Python's \s: line breaks, \v, \f, \x1c-\x1f and
// Unicode's spaces) between tokens, and refuses any other character it has
// no rule for ("unexpected char").
//
// lexSource finds those characters exactly: from the tokens gonja's lexer
// emits, each token's text (which starts with the characters skipped before
// it) and what lies between it and the next token (whitespace tokens, which
// may start with skipped characters too). When a skipped character is one
// Jinja refuses, the template is a syntax error; when all are whitespace to
// Jinja, the source is lexed again with each of them replaced by as many
// spaces as it has bytes, which keeps every token's offset, and each token's
// line and column are taken from the original source. Strings, comments and
// raw blocks are never touched: only characters inside {{ … }} and {% … %}
// that gonja's lexer skipped are.

// lexSource lexes src as gonja's lexer does, with the whitespace inside
// expressions that Jinja's lexer skips made whitespace to gonja's too. The
// tokens are those gonja's parser reads (no whitespace tokens), ending with
// EOF or an Error token.
func lexSource(src string) ([]*tokens.Token, error) {
	toks := collectTokens(tokens.LexAll(src, renderConfig))
	norm := normalizeSource(src)
	var blank []int // offsets of the skipped characters to replace
	inside := false
scan:
	for i, t := range toks {
		switch t.Type {
		case tokens.EOF, tokens.Error:
			break scan
		case tokens.VariableBegin, tokens.BlockBegin:
			inside = true
		default:
			if !inside {
				continue
			}
			// The characters skipped before this token start its text.
			for p := t.Pos; p < len(norm); {
				r, n := utf8.DecodeRuneInString(norm[p:])
				if !skippedByGonja(r) {
					break
				}
				blank = append(blank, p)
				p += n
			}
			if t.Type == tokens.VariableEnd || t.Type == tokens.BlockEnd {
				inside = false
				continue
			}
		}
		// Whitespace tokens between this token and the next start with the
		// characters skipped before them. (Before a lexing error, the text
		// up to it may hold what the lexer failed on.)
		next := toks[i+1]
		if next.Type == tokens.Error {
			break
		}
		for p := tokenEnd(t, norm, next.Pos); p < next.Pos; {
			r, n := utf8.DecodeRuneInString(norm[p:])
			if r != ' ' && r != '\t' {
				blank = append(blank, p)
			}
			p += n
		}
	}
	if len(blank) == 0 {
		return splitFloats(toks), nil
	}

	offsets := tokens.PrecomputeLineOffsets(norm)
	b := []byte(norm)
	for _, p := range blank {
		r, n := utf8.DecodeRuneInString(norm[p:])
		if !isPythonSpace(r) {
			line, _ := tokens.ReadablePositionFromOffsets(p, offsets)
			return nil, newTemplateError("template syntax error", fmt.Sprintf("unexpected char %s", pyReprString(string(r))), strconv.Itoa(line), nil)
		}
		for j := range n {
			b[p+j] = ' '
		}
	}
	// gonja normalizes its input again, dropping one trailing line break
	// (keep_trailing_newline is false): the one added here.
	toks = collectTokens(tokens.LexAll(string(b)+"\n", renderConfig))
	for _, t := range toks {
		if t.Pos >= 0 && t.Pos <= len(norm) {
			t.Line, t.Col = tokens.ReadablePositionFromOffsets(t.Pos, offsets)
		}
	}
	return splitFloats(toks), nil
}

// splitFloats splits each float token that ends with its dot (gonja's
// lexer reads `1.` as a float when whitespace or an operator follows) into
// the integer and the dot that Jinja's lexer reads: `{{ 1. }}` is a syntax
// error in Jinja, and `1. real` the integer's attribute.
func splitFloats(toks []*tokens.Token) []*tokens.Token {
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		if t.Type != tokens.Float || !strings.HasSuffix(t.Val, ".") {
			continue
		}
		n := len(t.Val) - 1
		dot := &tokens.Token{Type: tokens.Dot, Val: ".", Pos: t.Pos + n, Line: t.Line, Col: t.Col + n}
		t.Type, t.Val = tokens.Integer, t.Val[:n]
		toks = append(toks[:i+1], append([]*tokens.Token{dot}, toks[i+1:]...)...)
	}
	return toks
}

// collectTokens returns the tokens gonja's parser would read from stream.
func collectTokens(stream *tokens.Stream) []*tokens.Token {
	var toks []*tokens.Token
	for {
		t := stream.Current()
		toks = append(toks, t)
		if t.Type == tokens.EOF || t.Type == tokens.Error {
			return toks
		}
		stream.Next()
	}
}

// normalizeSource is the text gonja's lexer reads (and its tokens' offsets
// count in): line breaks made \n, and one trailing line break dropped.
func normalizeSource(src string) string {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	return strings.TrimSuffix(src, "\n")
}

// tokenEnd is the offset just after t's text, given the offset of the token
// after it. A string's value is not its text; its closing quote is the last
// of its kind before next (what follows it up to next is whitespace and
// skipped characters, which are never quotes).
func tokenEnd(t *tokens.Token, norm string, next int) int {
	if t.Type != tokens.String {
		return min(t.Pos+len(t.Val), next)
	}
	text := norm[t.Pos:next]
	open := strings.IndexAny(text, `'"`)
	if open < 0 {
		return next
	}
	return t.Pos + strings.LastIndexByte(text, text[open]) + 1
}

// skippedByGonja reports whether gonja's lexer skips r inside an expression
// (tokens.Lexer.lexExpression has no rule for it).
func skippedByGonja(r rune) bool {
	return !(r == ' ' || r == '\t' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) ||
		strings.ContainsRune(`"',|+-~:.%/<>*!=({[)}]`, r))
}

// isPythonSpace reports whether Python's \s matches r (str.isspace), which
// is what Jinja's lexer skips between tokens.
func isPythonSpace(r rune) bool {
	return unicode.IsSpace(r) || 0x1c <= r && r <= 0x1f
}
