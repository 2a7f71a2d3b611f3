package templating

import (
	"strconv"

	"github.com/nikolalohinski/gonja/v2/tokens"
)

// The token pass: gonja's parser reads pav's tokens, not its lexer's.
//
// gonja v2.9.1's expression grammar differs from Jinja's in places that its
// parser, whose every nested call is a direct method call on the concrete
// *parser.Parser, gives no way to hook. What it does parse as Jinja does is
// enough to express Jinja's grammar, given the right tokens. So pav lexes
// the source with gonja's own lexer (exact for strings, comments, raw blocks
// and brackets; with the whitespace Jinja's lexer skips, lex.go), follows each expression's structure token by
// token as Jinja's parser would (where an operand starts and ends, bracket
// groups, calls' argument lists), re-types, drops or adds tokens where
// gonja's grammar would read them otherwise, and records what the rewrite
// pass needs to finish the job. What each change is for:
//
//   - Conditional expressions: `if` and `else` after a complete operand
//     become `or` tokens (condexpr.go).
//   - Tests: Jinja's `is` binds as tightly as a filter (parse_filter_expr:
//     `1 + 1 is odd` is `1 + (1 is odd)`, `x is odd < y` compares the test's
//     result); gonja applies one test, after the comparisons, to the whole
//     comparison chain or arithmetic expression before it. So `is` becomes a
//     `|` and the test's name a filter's name, which gonja parses exactly
//     where Jinja parses tests, interleaved with filters; the rewrite pass
//     makes the filter call a test (lexed.tests). A `not` after `is` is
//     dropped and recorded with the test; an argument without parentheses
//     (`is divisibleby 3`: one primary with its postfixes, in Jinja's
//     parse_test) gets parentheses.
//
// Where Jinja refuses a form that gonja's parser would accept, the pass
// reports the syntax error.

// lexed is the output of lexTemplate.
type lexed struct {
	toks []*tokens.Token
	// groups maps every or-typed token (`or`, and the re-typed `if` and
	// `else`) and every comparison token (and the re-typed `in` and `not in`)
	// to the bracket group it stands in: one number per {{ … }} or {% … %}
	// and per pair of brackets inside them.
	groups map[*tokens.Token]int
	// tests maps the name token of every test (a filter's name to gonja) to
	// whether it was negated (`is not`).
	tests map[*tokens.Token]bool
	// nots maps a `not` that stands for a run of n > 1 to n.
	nots map[*tokens.Token]int
	// signs maps a unary sign that stands for a run of them to the others,
	// in order (whether each is a minus).
	signs map[*tokens.Token][]bool
}

// Where the token before the current one left the expression.
type lexState int

const (
	operandStart lexState = iota // an operand may start here: if/else are names
	operandEnd                   // after a complete operand: if/else are keywords
	afterIs                      // after `is` or `is not`: the test's name comes
	nameOnly                     // after `.` or `|`: a name comes, whatever it reads
	bareArg                      // the first token of a test's argument without parentheses
	tagName                      // after {%: the tag's name comes
)

// group is an open bracket group (or the top of a {{ … }} or {% … %}).
type group struct {
	id int
	// call: the group is an argument list (a parenthesis after an operand,
	// a filter's or a test's name).
	call     bool
	argStart bool            // at the start of an argument (after `(` or `,`)
	first    *tokens.Token   // the current argument's first token
	keywords map[string]bool // the keyword arguments so far
	// signature: a macro's parameters, which take no trailing comma
	signature bool
}

// lexTemplate lexes src for gonja's parser (see above).
func lexTemplate(src string) (*lexed, error) {
	in, err := lexSource(src)
	if err != nil {
		return nil, err
	}
	in = joinStrings(in)
	match := matchBrackets(in)
	out := &lexed{groups: map[*tokens.Token]int{}, tests: map[*tokens.Token]bool{}, nots: map[*tokens.Token]int{}, signs: map[*tokens.Token][]bool{}}
	var (
		inside    bool    // in a {{ … }} or {% … %}
		tag       string  // the tag's name; "" in {{ … }}
		groups    []group // the open bracket groups, innermost last
		nextGroup int
		state     lexState
		forFilter bool        // the for tag's loop filter `if` was seen
		forIn     bool        // the for tag's `in` was seen
		negated   bool        // after `is not`
		closeAt   map[int]int // closing parentheses to add before a token
	)
	emit := func(t *tokens.Token) { out.toks = append(out.toks, t) }
	for i := 0; i < len(in); i++ {
		t := in[i]
		for ; closeAt[i] > 0; closeAt[i]-- {
			emit(synthetic(tokens.RightParenthesis, ")", t))
			if len(groups) > 1 {
				groups = groups[:len(groups)-1]
			}
			state = operandEnd
		}
		if t.Type == tokens.EOF || t.Type == tokens.Error {
			emit(t)
			break
		}

		switch t.Type {
		case tokens.VariableBegin, tokens.BlockBegin:
			inside, tag, forFilter, forIn, negated = true, "", false, false, false
			nextGroup++
			groups = append(groups[:0], group{id: nextGroup})
			state = operandStart
			if t.Type == tokens.BlockBegin {
				state = tagName
			}
			emit(t)
			continue
		case tokens.VariableEnd, tokens.BlockEnd:
			inside = false
			emit(t)
			continue
		}
		if !inside {
			emit(t)
			continue
		}
		g := &groups[len(groups)-1]
		top := len(groups) == 1

		// Tokens that read as names where a name is expected: a test's name
		// and a bare argument's first token (`x is sameas in`), an
		// attribute (`x.not`), a filter's name.
		if state == afterIs || state == nameOnly || state == bareArg {
			if state == afterIs && !negated && isKeyword(t, tokens.Not, "not") {
				negated = true
				continue // recorded with the test
			}
			if isNameLike(t) {
				t.Type = tokens.Name
			} else {
				negated = false
			}
		}

		// An argument list: each argument starts after `(` or `,`; a keyword
		// argument is a name and `=` (any name: `f(if=1, not=2)`), and none
		// may follow a keyword argument but another.
		keyword := false // t names a keyword argument
		if g.call && g.argStart && !isClosing(t) {
			g.argStart, g.first = false, t
			if isNameLike(t) && i+1 < len(in) && in[i+1].Type == tokens.Assign {
				t.Type, keyword = tokens.Name, true
				if g.keywords[t.Val] {
					return nil, syntaxErrorAt(t, "keyword argument repeated: "+t.Val)
				}
				if g.keywords == nil {
					g.keywords = map[string]bool{}
				}
				g.keywords[t.Val] = true
			} else if len(g.keywords) > 0 {
				return nil, syntaxErrorAt(t, "invalid syntax for function call expression")
			}
		}
		if g.call && state == operandEnd {
			// Two operands in a row: gonja's argument lists take them as
			// two arguments.
			switch {
			case t.Type == tokens.String, t.Type == tokens.Integer, t.Type == tokens.Float, t.Type == tokens.LeftBrace,
				t.Type == tokens.Name && t.Val != "if" && t.Val != "else" && keywordType(t.Val) == tokens.Name:
				return nil, syntaxErrorAt(t, "expected token ',', got "+describeToken(t))
			}
		}
		if t.Type == tokens.Assign && !top && !(g.call && i > 0 && in[i-1] == g.first && g.first.Type == tokens.Name) {
			return nil, syntaxErrorAt(t, "expected token ',', got '='")
		}

		// and, or, not, in and is: keywords after an operand (a `not` only
		// before `in`), names where an operand starts (a `not` the keyword).
		switch {
		case keyword:
		case state == operandEnd && t.Type == tokens.Name:
			switch t.Val {
			case "and":
				t.Type = tokens.And
			case "or":
				t.Type = tokens.Or
			case "not":
				t.Type = tokens.Not
			case "in":
				t.Type = tokens.In
			case "is":
				t.Type = tokens.Is
			}
		case state == operandStart:
			switch {
			case t.Type == tokens.In || t.Type == tokens.Is || t.Type == tokens.And || t.Type == tokens.Or:
				t.Type = tokens.Name
			case t.Type == tokens.Name && t.Val == "not":
				t.Type = tokens.Not
			}
		}

		switch t.Type {
		case tokens.In, tokens.Not:
			if state != operandEnd {
				if t.Type == tokens.Not {
					n := 1
					for i+n < len(in) && isKeyword(in[i+n], tokens.Not, "not") {
						n++
					}
					if n > 1 {
						out.nots[t] = n
						i += n - 1
					}
				}
				state = operandStart
				break
			}
			if t.Type == tokens.In && tag == "for" && top && !forIn {
				// The for tag's own, which gonja's for tag parses.
				forIn = true
				state = operandStart
				break
			}
			if t.Type == tokens.Not {
				if i+1 >= len(in) || !isKeyword(in[i+1], tokens.In, "in") {
					return nil, syntaxErrorAt(t, "unexpected 'not'")
				}
				i++ // `not in`: one token
				t.Val = "not in"
			}
			// A comparison operator to gonja.
			t.Type = tokens.Equals
			out.groups[t] = g.id
			state = operandStart
		case tokens.Equals, tokens.Ne, tokens.LowerThan, tokens.LowerThanOrEqual, tokens.GreaterThan, tokens.GreaterThanOrEqual:
			out.groups[t] = g.id
			state = operandStart
		case tokens.Name:
			switch {
			case state == tagName:
				tag, state = t.Val, operandStart
			case state == afterIs:
				// A test's name: a filter's to gonja.
				out.tests[t] = negated
				negated = false
				emit(t)
				state = operandEnd
				next := in[i+1]
				if isKeyword(next, tokens.Is, "is") {
					return nil, syntaxErrorAt(next, "You cannot chain multiple tests with is")
				}
				if startsBareArg(next) {
					// Jinja's parse_test: one primary and its postfixes.
					if closeAt == nil {
						closeAt = map[int]int{}
					}
					closeAt[bareArgEnd(in, match, i+1)]++
					emit(synthetic(tokens.LeftParenthesis, "(", next))
					nextGroup++
					groups = append(groups, group{id: nextGroup, call: true})
					state = bareArg
				}
				continue
			case (t.Val == "if" || t.Val == "else") && state == operandEnd:
				state = operandStart
				if top && (tag == "if" || tag == "elif") {
					break // Jinja refuses it, and so will gonja's if tag
				}
				if top && tag == "for" && t.Val == "if" && !forFilter {
					forFilter = true
					break // the loop filter
				}
				t.Type = tokens.Or
				out.groups[t] = g.id
			default:
				// A name, or a test's argument (`x is sameas if` takes the
				// name `if` as its argument in Jinja).
				state = operandEnd
			}
		case tokens.String, tokens.Integer, tokens.Float:
			state = operandEnd
		case tokens.LeftParenthesis, tokens.LeftBracket, tokens.LeftBrace:
			nextGroup++
			call := t.Type == tokens.LeftParenthesis && state == operandEnd
			groups = append(groups, group{id: nextGroup, call: call, argStart: call, signature: call && top && tag == "macro"})
			state = operandStart
		case tokens.RightParenthesis, tokens.RightBracket, tokens.RightBrace:
			if len(groups) > 1 {
				groups = groups[:len(groups)-1]
			}
			state = operandEnd
		case tokens.Is:
			if state == operandEnd {
				// A test: `x is t` is `x | t` to gonja.
				t.Type = tokens.Pipe
				state = afterIs
			} else {
				state = operandStart
			}
		case tokens.Or:
			out.groups[t] = g.id
			state = operandStart
		case tokens.Addition, tokens.Subtraction:
			if state != operandEnd {
				// Unary: gonja's parser takes one sign before an operand.
				n := 1
				for i+n < len(in) && (in[i+n].Type == tokens.Addition || in[i+n].Type == tokens.Subtraction) {
					out.signs[t] = append(out.signs[t], in[i+n].Val == "-")
					n++
				}
				i += n - 1
			}
			state = operandStart
		case tokens.Dot, tokens.Pipe:
			state = nameOnly
		case tokens.Comma:
			g.argStart = g.call
			if g.signature && i+1 < len(in) && in[i+1].Type == tokens.RightParenthesis {
				return nil, syntaxErrorAt(in[i+1], "expected token 'name', got ')'")
			}
			if state == operandEnd && i+1 < len(in) && (g.call && !g.signature && in[i+1].Type == tokens.RightParenthesis || in[i+1].Type == tokens.RightBrace) {
				// A trailing comma, which Jinja allows in argument lists
				// (not a macro's parameters) and dicts, and gonja does not.
				state = operandStart
				continue
			}
			state = operandStart
		default:
			// Operators, separators, `and`.
			state = operandStart
		}
		emit(t)
	}
	return out, nil
}

// joinStrings joins adjacent string tokens inside expressions, as Jinja's
// parse_primary joins adjacent strings. gonja's parser takes a string
// token's value through Go's unquoting (\n is a line break); the joined
// value reads as the two did, since no string token's value ends with a
// backslash (gonja's lexer reads a backslash before the closing quote as
// escaping it).
func joinStrings(toks []*tokens.Token) []*tokens.Token {
	out := toks[:0]
	inside := false
	for _, t := range toks {
		switch t.Type {
		case tokens.VariableBegin, tokens.BlockBegin:
			inside = true
		case tokens.VariableEnd, tokens.BlockEnd:
			inside = false
		case tokens.String:
			if n := len(out); inside && n > 0 && out[n-1].Type == tokens.String {
				prev := out[n-1]
				joined := *prev
				joined.Val += t.Val
				out[len(out)-1] = &joined
				continue
			}
		}
		out = append(out, t)
	}
	return out
}

// isClosing reports whether t closes a bracket group.
func isClosing(t *tokens.Token) bool {
	return t.Type == tokens.RightParenthesis || t.Type == tokens.RightBracket || t.Type == tokens.RightBrace
}

// keywordType is the type gonja's lexer gives the keyword name when a space
// follows it (Name for other names).
func keywordType(name string) tokens.Type {
	switch name {
	case "in":
		return tokens.In
	case "is":
		return tokens.Is
	case "not":
		return tokens.Not
	case "and":
		return tokens.And
	case "or":
		return tokens.Or
	}
	return tokens.Name
}

// describeToken names t as Jinja's error messages do.
func describeToken(t *tokens.Token) string {
	switch t.Type {
	case tokens.String:
		return "'string'"
	case tokens.Integer:
		return "'integer'"
	case tokens.Float:
		return "'float'"
	}
	return "'" + t.Val + "'"
}

// synthetic is a token pav adds, placed at at.
func synthetic(typ tokens.Type, val string, at *tokens.Token) *tokens.Token {
	return &tokens.Token{Type: typ, Val: val, Pos: at.Pos, Line: at.Line, Col: at.Col}
}

// isKeyword reports whether t is the keyword kw, which gonja's lexer types
// typ when a space follows it and as a name otherwise.
func isKeyword(t *tokens.Token, typ tokens.Type, kw string) bool {
	return t.Type == typ || t.Type == tokens.Name && t.Val == kw
}

// isNameLike reports whether t is a name to Jinja's lexer, which has no
// keywords: gonja's lexer types in, is, not, and, or as keywords.
func isNameLike(t *tokens.Token) bool {
	switch t.Type {
	case tokens.Name, tokens.In, tokens.Is, tokens.Not, tokens.And, tokens.Or:
		return true
	}
	return false
}

// startsBareArg reports whether Jinja's parse_test reads an argument without
// parentheses starting at t: a name (other than else, or, and), a string, a
// number, or an opening bracket or brace.
func startsBareArg(t *tokens.Token) bool {
	switch t.Type {
	case tokens.String, tokens.Integer, tokens.Float, tokens.LeftBracket, tokens.LeftBrace, tokens.In, tokens.Not:
		return true
	case tokens.Name:
		return t.Val != "else" && t.Val != "or" && t.Val != "and"
	}
	return false
}

// bareArgEnd is the index of the token after the bare argument starting at
// in[i]: a primary (a name, string or number, or brackets) and its postfixes
// (`.name`, `.0`, `[…]`, `(…)`).
func bareArgEnd(in []*tokens.Token, match map[int]int, i int) int {
	if j, ok := match[i]; ok {
		i = j + 1
	} else {
		i++
	}
	for i < len(in) {
		switch in[i].Type {
		case tokens.Dot:
			if i+1 < len(in) && (isNameLike(in[i+1]) || in[i+1].Type == tokens.Integer) {
				i += 2
				continue
			}
		case tokens.LeftBracket, tokens.LeftParenthesis:
			if j, ok := match[i]; ok {
				i = j + 1
				continue
			}
		}
		break
	}
	return i
}

// matchBrackets maps the index of every opening bracket in toks to the index
// of its closing one (gonja's lexer checks their balance).
func matchBrackets(toks []*tokens.Token) map[int]int {
	m := map[int]int{}
	var open []int
	for i, t := range toks {
		switch t.Type {
		case tokens.LeftParenthesis, tokens.LeftBracket, tokens.LeftBrace:
			open = append(open, i)
		case tokens.RightParenthesis, tokens.RightBracket, tokens.RightBrace:
			if len(open) > 0 {
				m[open[len(open)-1]] = i
				open = open[:len(open)-1]
			}
		case tokens.VariableEnd, tokens.BlockEnd:
			open = open[:0]
		}
	}
	return m
}

// syntaxErrorAt is a template syntax error at t.
func syntaxErrorAt(t *tokens.Token, msg string) error {
	line := ""
	if t.Line > 0 {
		line = strconv.Itoa(t.Line)
	}
	return newTemplateError("template syntax error", msg, line, nil)
}
