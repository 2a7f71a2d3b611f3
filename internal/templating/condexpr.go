package templating

import (
	"errors"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// Conditional expressions (`x if c else y`, `x if c`) anywhere Jinja allows
// them.
//
// gonja v2.9.1's parser knows them in one place only: after the whole
// expression of a {{ … }} (parser.ParseCondition, called from
// ParseExpressionNode). Its ParseExpression, which every nested position
// calls (parentheses, list, tuple and dict literals, call and filter
// arguments, subscripts, macro defaults), stops at the `if`, and the caller
// then fails on it: `{{ (a ~ (b if c else d)) }}` is "Unbalanced
// parenthesis". Every such call is a direct method call on the concrete
// *parser.Parser, so nothing outside the package can hook in.
//
// What gonja does parse anywhere is an `or` chain, and Jinja's conditional
// sits exactly one level below `or` in its grammar (parse_condexpr:
// `or_expr ('if' or_expr ('else' condexpr)?)*`). So pav lexes the source
// with gonja's own lexer (exact for strings, comments, raw blocks and
// brackets), re-types each `if` and `else` that Jinja would read as a
// conditional's keyword as an `or` token (keeping its text), and gives the
// tokens to gonja's parser. gonja then delimits the operands as Jinja does —
// everything that binds tighter than `or` — and returns a left-associative
// `or` chain in which the keywords appear in source order. The rewrite pass
// (orExpr) reads each chain back as Jinja's parse_condexpr does and builds
// a lazily evaluated conditional (ternary). No other token changes, so
// everything else parses exactly as before.
//
// Which `if` and `else` are keywords: in Jinja's grammar they are names
// wherever an operand may start (`{{ if }}`, `x.else`, `f(if=1)`, a test's
// argument as in `x is sameas if`), and keywords right after a complete
// operand. `{% if %}`, `{% elif %}` and the sequence of `{% for %}` take
// no conditional at their top level (Jinja parses them with
// with_condexpr=False): there the keyword keeps its Name token, which makes
// `{% if a if b else c %}` the syntax error it is in Jinja, and lets the
// first top-level `if` of a for tag be its loop filter.
//
// Parentheses must not be read through: `(a if b) else c` is a syntax error,
// while gonja's tree for it looks like `a if b else c`. Every or-typed token
// therefore carries the bracket group it was written in (condLex.groups),
// and a chain is only the links of one group.

// condLex is the output of lexForConditionals.
type condLex struct {
	toks []*tokens.Token
	// groups maps every or-typed token (`or`, and the re-typed `if` and
	// `else`) to the bracket group it stands in: one number per {{ … }} or
	// {% … %} and per pair of brackets inside them.
	groups map[*tokens.Token]int
}

// Where the token before the current one left the expression.
type lexState int

const (
	operandStart  lexState = iota // an operand may start here: if/else are names
	operandEnd                    // after a complete operand: if/else are keywords
	afterIs                       // after `is` or `is not`: the test's name comes
	afterTestName                 // after a test's name: `if` is its argument, `else` a keyword
	tagName                       // after {%: the tag's name comes
)

// lexForConditionals lexes src as gonja's parser would read it (the lexer's
// tokens without whitespace), with the conditionals' keywords re-typed.
func lexForConditionals(src string) condLex {
	stream := tokens.LexAll(src, renderConfig)
	out := condLex{groups: map[*tokens.Token]int{}}
	var (
		inside    bool   // in a {{ … }} or {% … %}
		tag       string // the tag's name; "" in {{ … }}
		groups    []int  // the open bracket groups, innermost last
		nextGroup int
		state     lexState
		forFilter bool // the for tag's loop filter `if` was seen
	)
	for {
		t := stream.Current()
		out.toks = append(out.toks, t)
		if t.Type == tokens.EOF || t.Type == tokens.Error {
			return out
		}
		stream.Next()

		switch t.Type {
		case tokens.VariableBegin, tokens.BlockBegin:
			inside, tag, forFilter = true, "", false
			nextGroup++
			groups = append(groups[:0], nextGroup)
			state = operandStart
			if t.Type == tokens.BlockBegin {
				state = tagName
			}
			continue
		case tokens.VariableEnd, tokens.BlockEnd:
			inside = false
			continue
		}
		if !inside {
			continue
		}
		group := groups[len(groups)-1]

		switch t.Type {
		case tokens.Name:
			switch {
			case state == tagName:
				tag, state = t.Val, operandStart
			case (t.Val == "if" || t.Val == "else") && (state == operandEnd || state == afterTestName && t.Val == "else"):
				state = operandStart
				top := len(groups) == 1
				if top && (tag == "if" || tag == "elif") {
					break // Jinja refuses it, and so will gonja's if tag
				}
				if top && tag == "for" && t.Val == "if" && !forFilter {
					forFilter = true
					break // the loop filter
				}
				t.Type = tokens.Or
				out.groups[t] = group
			case state == afterIs:
				state = afterTestName
			default:
				// A name, or a test's argument (`x is sameas if` takes the
				// name `if` as its argument in Jinja, and in gonja).
				state = operandEnd
			}
		case tokens.String, tokens.Integer, tokens.Float:
			state = operandEnd
		case tokens.LeftParenthesis, tokens.LeftBracket, tokens.LeftBrace:
			nextGroup++
			groups = append(groups, nextGroup)
			state = operandStart
		case tokens.RightParenthesis, tokens.RightBracket, tokens.RightBrace:
			if len(groups) > 1 {
				groups = groups[:len(groups)-1]
			}
			state = operandEnd
		case tokens.Is:
			state = afterIs
		case tokens.Not:
			if state != afterIs {
				state = operandStart
			}
		case tokens.Or:
			out.groups[t] = group
			state = operandStart
		default:
			// Operators, separators, `.`, `|`, `in`, `and`.
			state = operandStart
		}
	}
}

// isConditionalKeyword reports whether an or-typed token is a re-typed `if`
// or `else` (the lexer's own `or` tokens read "or").
func isConditionalKeyword(tok *tokens.Token) bool {
	return tok.Type == tokens.Or && (tok.Val == "if" || tok.Val == "else")
}

// orExpr rewrites the `or` chain whose last link is n: the links of n's
// bracket group down its left side. A chain without conditional keywords
// is rewritten operand by operand, keeping gonja's lazy `or`. A chain with
// them is read as Jinja's parse_condexpr reads the tokens: the operands
// joined by `or` form the or-expressions, between which `if` and `else`
// stand.
func (rw *rewriter) orExpr(n *nodes.BinaryExpression) nodes.Expression {
	group, ok := rw.groups[n.Operator.Token]
	if !ok {
		rw.fail(n.Operator.Token, "internal error: an 'or' the lexer did not see")
		return n
	}
	// links[i] joins operands[i] (through the links before it) and
	// operands[i+1].
	var links []*nodes.BinaryExpression
	var operands []nodes.Expression
	conditional := false
	for cur := n; ; {
		links = append(links, cur)
		operands = append(operands, cur.Right)
		conditional = conditional || isConditionalKeyword(cur.Operator.Token)
		left, ok := cur.Left.(*nodes.BinaryExpression)
		if !ok || left.Operator.Token.Type != tokens.Or || rw.groups[left.Operator.Token] != group {
			operands = append(operands, cur.Left)
			break
		}
		cur = left
	}
	reverseSlice(links)
	reverseSlice(operands)

	if !conditional {
		left := rw.expr(operands[0])
		for i, l := range links {
			l.Left, l.Right = left, rw.expr(operands[i+1])
			left = l
		}
		return left
	}

	// The or-expressions (units) and the keywords between them:
	// units[i] kws[i] units[i+1] …
	units := []nodes.Expression{operands[0]}
	var kws []*tokens.Token
	for i, l := range links {
		if isConditionalKeyword(l.Operator.Token) {
			kws = append(kws, l.Operator.Token)
			units = append(units, operands[i+1])
			continue
		}
		l.Left, l.Right = units[len(units)-1], operands[i+1]
		units[len(units)-1] = l
	}
	expr, next := rw.condexpr(units, kws, 0)
	if next < len(kws) {
		// Only an `else` can be left over (parse_condexpr takes every `if`).
		rw.fail(kws[next], "unexpected '%s' (an else without its if)", kws[next].Val)
	}
	return expr
}

// condexpr is Jinja's parse_condexpr from units[i] on; it returns the
// rewritten expression and the index of the first keyword it did not take.
func (rw *rewriter) condexpr(units []nodes.Expression, kws []*tokens.Token, i int) (nodes.Expression, int) {
	expr := rw.expr(units[i])
	for i < len(kws) && kws[i].Val == "if" {
		kw, test := kws[i], rw.cond(units[i+1])
		i++
		var alt nodes.Expression
		if i < len(kws) && kws[i].Val == "else" {
			alt, i = rw.condexpr(units, kws, i+1)
		}
		expr = ternary(kw, test, expr, alt)
	}
	return expr, i
}

// ternary is `then if test else alt`, evaluating only the branch taken, as
// Jinja does (an undefined name or a failing call in the other branch does
// no harm). gonja's evaluator has no such node and no hook to add one, but
// its `and` and `or` are lazy and return an operand, and a one-item list is
// always true:
//
//	((test | pav:bool) and [then] or [alt]) | pav:branch
//
// alt nil is Jinja's missing else: Undefined.
func ternary(kw *tokens.Token, test, then, alt nodes.Expression) nodes.Expression {
	if alt == nil {
		alt = filtered(&nodes.None{Location: kw}, fUndef, strNode(kw, "the inline if-expression evaluated to false and has no else section"))
	}
	op := func(typ tokens.Type, val string) *nodes.BinOperator {
		return &nodes.BinOperator{Token: &tokens.Token{Type: typ, Val: val, Pos: kw.Pos, Line: kw.Line, Col: kw.Col}}
	}
	one := func(e nodes.Expression) *nodes.List {
		return &nodes.List{Location: kw, Val: []nodes.Expression{e}}
	}
	and := &nodes.BinaryExpression{Left: test, Right: one(then), Operator: op(tokens.And, "and")}
	or := &nodes.BinaryExpression{Left: and, Right: one(alt), Operator: op(tokens.Or, "or")}
	return filtered(or, fBranch)
}

// pav:branch takes the value out of the one-item list that ternary's
// and/or returned: the taken branch's value, which may be an error (gonja
// keeps errors as list items).
func filterBranch(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	if vl, ok := in.Interface().(exec.ValuesList); ok && len(vl) == 1 {
		return vl[0]
	}
	return exec.AsValue(errInternalBranch)
}

var errInternalBranch = errors.New("internal error: pav:branch applied to something other than a conditional's branch")

func reverseSlice[T any](s []T) {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
}
