package templating

import (
	"errors"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// Comparisons, chained as in Jinja.
//
// Jinja's `a < b < c` is Python's: `a < b and b < c`, with b evaluated
// once and c only when a < b holds (parse_compare builds one Compare node,
// which compiles to Python's own chain). gonja parses a chain left to
// right into `(a < b) < c`; its tree cannot tell that from the
// parenthesized form, but the comparison tokens' bracket groups can
// (tokenpass.go): the comparisons down the left side of a comparison that
// stand in its group are its chain. The re-typed `in` and `not in` (`==`
// tokens reading "in" and "not in") are links like the others.
//
// A chain of one comparison is pav:binop (pav:test 'in' for in, followed
// by pav:not for not in). A longer one must evaluate its operands lazily,
// which no filter can (gonja evaluates a filter's arguments before calling
// it); so the chain's operands travel, unevaluated, to pav:compare, which
// evaluates them with the evaluator it is given. They travel as the filter's
// input: gonja evaluates an Error node to its error value, without looking
// at it, and hands that to the first filter of the chain, so that an Error
// node whose error is the *compareChain carries it.

var compareOps = map[tokens.Type]bool{
	tokens.Equals: true, tokens.Ne: true, tokens.LowerThan: true, tokens.LowerThanOrEqual: true,
	tokens.GreaterThan: true, tokens.GreaterThanOrEqual: true,
}

// compareChain is a chain of comparisons: operands[i] ops[i] operands[i+1].
type compareChain struct {
	operands []nodes.Expression // rewritten
	ops      []string           // "<", "==", "in", "not in", …
	texts    []string           // the operands' text, for messages
}

func (*compareChain) Error() string {
	return "internal error: a comparison chain evaluated outside pav:compare"
}

// compareOp is the operator a comparison token stands for.
func compareOp(tok *tokens.Token) string {
	if tok.Val == "in" || tok.Val == "not in" {
		return tok.Val
	}
	return binaryOps[tok.Type]
}

// compare rewrites the comparison n, the last link of its chain.
func (rw *rewriter) compare(n *nodes.BinaryExpression) nodes.Expression {
	tok := n.Operator.Token
	group, ok := rw.groups[tok]
	if !ok {
		rw.fail(tok, "internal error: a comparison the lexer did not see")
		return n
	}
	links := []*nodes.BinaryExpression{n}
	operands := []nodes.Expression{n.Right}
	for cur := n; ; {
		left, ok := cur.Left.(*nodes.BinaryExpression)
		if !ok || !compareOps[left.Operator.Token.Type] || rw.groups[left.Operator.Token] != group {
			operands = append(operands, cur.Left)
			break
		}
		links = append(links, left)
		operands = append(operands, left.Right)
		cur = left
	}
	reverseSlice(links)
	reverseSlice(operands)

	if len(links) == 1 {
		op := compareOp(tok)
		if op == "in" || op == "not in" {
			e := filteredCall(rw.expr(n.Left), &nodes.FilterCall{Token: tok, Name: fTest,
				Args: []nodes.Expression{strNode(tok, "in"), rw.expr(n.Right)}, Kwargs: map[string]nodes.Expression{}})
			if op == "not in" {
				e = filtered(e, fNot)
			}
			return e
		}
		leftText, rightText := strNode(tok, exprText(n.Left)), strNode(tok, exprText(n.Right))
		return filtered(rw.expr(n.Left), fBinop, strNode(tok, op), rw.expr(n.Right), leftText, rightText)
	}

	ch := &compareChain{}
	for _, o := range operands {
		ch.texts = append(ch.texts, exprText(o))
		ch.operands = append(ch.operands, rw.expr(o))
	}
	for _, l := range links {
		ch.ops = append(ch.ops, compareOp(l.Operator.Token))
	}
	first := links[0].Operator.Token
	return filtered(&nodes.Error{Location: first, Error: ch}, fCompare)
}

// pav:compare evaluates the chain its input carries (see above), as Python
// does: each operand once, left to right, stopping at the first comparison
// that is false, whose result is the chain's.
func filterCompare(e *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	ch, ok := in.Interface().(*compareChain)
	if !ok {
		if in.IsError() {
			return in
		}
		return exec.AsValue(errInternalCompare)
	}
	left := e.Eval(ch.operands[0])
	if left.IsError() {
		return left
	}
	var result *exec.Value
	for i, op := range ch.ops {
		right := e.Eval(ch.operands[i+1])
		if right.IsError() {
			return right
		}
		result = compareValues(e, op, left, right, ch.texts[i], ch.texts[i+1])
		if result.IsError() || !truthy(result) {
			return result
		}
		left = right
	}
	return result
}

var errInternalCompare = errors.New("internal error: pav:compare applied to something other than a comparison chain")

// compareValues is `left op right`.
func compareValues(e *exec.Evaluator, op string, left, right *exec.Value, leftText, rightText string) *exec.Value {
	switch op {
	case "in", "not in":
		v := filterTest(e, left, &exec.VarArgs{Args: []*exec.Value{exec.AsValue("in"), right}, KwArgs: map[string]*exec.Value{}})
		if op == "not in" && !v.IsError() {
			v = exec.AsValue(!truthy(v))
		}
		return v
	}
	v, err := binaryOp(op, left, right, leftText, rightText)
	if err != nil {
		return stateOf(e).fail(err)
	}
	return v
}
