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
// `or_expr ('if' or_expr ('else' condexpr)?)*`). So the token pass
// (tokenpass.go) re-types each `if` and `else` that Jinja would read as a
// conditional's keyword as an `or` token (keeping its text). gonja then delimits the operands as Jinja does —
// everything that binds tighter than `or` — and returns a left-associative
// `or` chain in which the keywords appear in source order. The rewrite pass
// (orExpr) reads each chain back as Jinja's parse_condexpr does and builds
// a lazily evaluated conditional (ternary).
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
// therefore carries the bracket group it was written in (lexed.groups),
// and a chain is only the links of one group.

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
