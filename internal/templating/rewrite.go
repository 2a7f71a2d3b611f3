package templating

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"

	controlStructures "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// The rewrite pass runs once per parsed template. gonja's evaluator has
// fixed semantics for names, attribute access, method calls and operators
// that differ from Jinja's (strict undefined breaks `x or 42`; lax undefined
// makes `x + 3` print 3; attribute access reaches Go methods; list.reverse()
// mutates the caller's data; 2 ** 10 is 1024.0), and it has no hooks. Its
// AST, however, is public, and filters receive their input even when it is
// an error. So every such construct is replaced by a filter call that pav
// implements (filters.go):
//
//	name         → None | pav:var('name')
//	x.a          → x | pav:getattr('a', 'x')
//	x[k]         → x | pav:getitem(k, 'x')
//	x.m(args)    → x | pav:method('m', 'x', args…)
//	f(args)      → (f | pav:callable('f'))(args)
//	a op b       → a | pav:binop('op', b, 'a', 'b')     (and/or are kept)
//	not x, -x    → x | pav:not, x | pav:neg('x')
//	{{ e }}      → {{ e | pav:finalize('e') }}
//	x is t(args) → x | pav:test('t', args…)
//	if/elif/for-if conditions → c | pav:bool
//	for x in s   → for x in s | pav:iterable('s')
//
// Unknown filters and tests are reported here, at load time, as Jinja does
// at compile time.
type rewriter struct {
	filters   *exec.FilterSet
	tests     *exec.TestSet
	err       error
	wrappers  map[*nodes.Wrapper]bool
	depth     int
	names     map[string]bool          // names referenced (for macros' varargs/kwargs)
	groups    map[*tokens.Token]int    // bracket group of every or-typed token (condexpr.go)
	testNames map[*tokens.Token]bool   // the filter names that are tests, and whether negated (tokenpass.go)
	nots      map[*tokens.Token]int    // a `not` standing for a run of them (tokenpass.go)
	signs     map[*tokens.Token][]bool // a unary sign standing for a run of them (tokenpass.go)
}

// maxNesting bounds expression and block nesting. The parser and this pass
// recurse; a pathological template ("((((…" a million times) would otherwise
// overflow the goroutine stack, which is fatal to the whole process.
const maxNesting = 1000

func (rw *rewriter) fail(tok *tokens.Token, format string, args ...any) {
	if rw.err != nil {
		return
	}
	line := ""
	if tok != nil && tok.Line > 0 {
		line = strconv.Itoa(tok.Line)
	}
	rw.err = newTemplateError("template syntax error", fmt.Sprintf(format, args...), line, nil)
}

func (rw *rewriter) template(t *nodes.Template) error {
	rw.nodes(t.Nodes)
	for _, b := range t.Blocks {
		rw.wrapper(b)
	}
	return rw.err
}

func (rw *rewriter) wrapper(w *nodes.Wrapper) {
	if w == nil || rw.wrappers[w] {
		return
	}
	rw.wrappers[w] = true
	rw.depth++
	defer func() { rw.depth-- }()
	if rw.depth > maxNesting {
		rw.fail(w.Location, "blocks are nested too deeply")
		return
	}
	rw.nodes(w.Nodes)
}

func (rw *rewriter) nodes(ns []nodes.Node) {
	for _, n := range ns {
		if rw.err != nil {
			return
		}
		switch n := n.(type) {
		case *nodes.Data, *nodes.Comment:
		case *nodes.Output:
			if n.Condition != nil || n.Alternative != nil {
				// Conditionals reach gonja's parser as `or` chains
				// (condexpr.go); its own top-level if would mean a keyword
				// that the token pass missed.
				rw.fail(n.Start, "internal error: a conditional expression that pav did not rewrite")
				return
			}
			n.Expression = rw.finalize(n.Expression)
		case *nodes.ControlStructureBlock:
			rw.control(n)
		default:
			rw.fail(n.Position(), "unsupported template node %T", n)
		}
	}
}

func (rw *rewriter) control(block *nodes.ControlStructureBlock) {
	switch c := block.ControlStructure.(type) {
	case *controlStructures.IfControlStructure:
		for i := range c.Conditions {
			c.Conditions[i] = rw.cond(c.Conditions[i])
		}
		for _, w := range c.Wrappers {
			rw.wrapper(w)
		}
	case *controlStructures.ForControlStructure:
		if !rw.ident(block.Location, c.Key) || (c.Value != "" && !rw.ident(block.Location, c.Value)) {
			return
		}
		text := strNode(c.ObjectEvaluator.Position(), exprText(c.ObjectEvaluator))
		c.ObjectEvaluator = filtered(rw.expr(c.ObjectEvaluator), fIterable, text)
		if c.IfCondition != nil {
			// gonja treats an error in a loop filter as false; pav:forcond
			// (in its own chain, so that it sees the error) keeps it for
			// forControl to return.
			cond := rw.cond(c.IfCondition)
			c.IfCondition = &nodes.FilteredExpression{Expression: cond, Filters: []*nodes.FilterCall{
				{Token: cond.Position(), Name: fForCond, Kwargs: map[string]nodes.Expression{}},
			}}
		}
		rw.wrapper(c.BodyWrapper)
		rw.wrapper(c.EmptyWrapper)
		block.ControlStructure = &forControl{c}
	case *controlStructures.CallControlStructure:
		if _, ok := c.Call.Func.(*nodes.Name); !ok {
			rw.fail(c.Location, "{%% call %%} needs a macro name")
			return
		}
		rw.callParts(c.Call)
		rw.wrapper(c.Body)
	case *autoescapeControl:
		if !constantOnly(c.expr) {
			rw.fail(c.location, "pav takes only a constant autoescape value (literals and operators): Jinja escapes constant output by the value it has at compile time, which it knows only for those")
			return
		}
		c.expr = rw.expr(c.expr)
		rw.wrapper(c.body)
	case *controlStructures.BlockControlStructure, *controlStructures.RawControlStructure:
		// A block's body is in Template.Blocks; raw has no expressions.
	case *setControl:
		if c.nsTarget != nil {
			c.nsTarget = rw.expr(c.nsTarget)
		}
		if c.expr != nil {
			c.expr = rw.expr(c.expr)
		}
		rw.wrapper(c.body)
	case *withControl:
		for i := range c.values {
			c.values[i] = rw.expr(c.values[i])
		}
		rw.wrapper(c.body)
	case *filterControl:
		rw.filterCalls(c.filters)
		rw.wrapper(c.body)
	case *macroControl:
		if !rw.ident(c.macro.Location, c.macro.Name) {
			return
		}
		params := map[string]bool{}
		for _, kw := range c.macro.Kwargs {
			if !rw.ident(kw.Key.Position(), kw.Key.Position().Val) {
				return
			}
			if params[kw.Key.Position().Val] {
				rw.fail(kw.Key.Position(), "duplicate argument '%s' in macro '%s'", kw.Key.Position().Val, c.macro.Name)
				return
			}
			params[kw.Key.Position().Val] = true
			if _, missing := kw.Value.(*nodes.Error); missing {
				// A parameter the caller did not pass is Undefined in Jinja
				// (gonja's strict mode makes the whole call fail).
				kw.Value = filtered(&nodes.None{Location: c.macro.Location}, fUndef, strNode(c.macro.Location,
					fmt.Sprintf("'%s' is undefined (a parameter of macro '%s' that was not passed)", kw.Key.Position().Val, c.macro.Name)))
			} else {
				kw.Value = rw.expr(kw.Value)
			}
		}
		// A Jinja macro takes extra positional and keyword arguments when
		// its body uses varargs or kwargs; gonja needs *args/**kwargs.
		outer := rw.names
		rw.names = map[string]bool{}
		rw.wrapper(c.macro.Wrapper)
		if rw.names["varargs"] && c.macro.VarArgsName == "" {
			c.macro.VarArgsName = "varargs"
		}
		if rw.names["kwargs"] && c.macro.KwArgsName == "" {
			c.macro.KwArgsName = "kwargs"
		}
		if outer != nil {
			for n := range rw.names {
				outer[n] = true
			}
		}
		rw.names = outer
	default:
		rw.fail(block.Location, "unsupported tag '%s'", block.Name)
	}
}

// constantOnly reports whether e is made of literals and operators only,
// which Jinja folds into a constant at compile time (as_const).
func constantOnly(e nodes.Expression) bool {
	switch n := e.(type) {
	case *nodes.None, *nodes.String, *nodes.Integer, *nodes.Float, *nodes.Bool:
		return true
	case *nodes.Name:
		return n.Name.Val == "none"
	case *nodes.List:
		return allConstant(n.Val)
	case *nodes.Tuple:
		return allConstant(n.Val)
	case *nodes.Dict:
		for _, p := range n.Pairs {
			if !constantOnly(p.Key) || !constantOnly(p.Value) {
				return false
			}
		}
		return true
	case *nodes.Negation:
		return constantOnly(n.Term)
	case *nodes.UnaryExpression:
		return constantOnly(n.Term)
	case *nodes.BinaryExpression:
		return constantOnly(n.Left) && constantOnly(n.Right)
	}
	return false
}

func allConstant(es []nodes.Expression) bool {
	for _, e := range es {
		if !constantOnly(e) {
			return false
		}
	}
	return true
}

// Note: texts for messages are always taken before rw.expr, which rewrites
// nodes in place.
func (rw *rewriter) finalize(e nodes.Expression) nodes.Expression {
	text := strNode(e.Position(), exprText(e))
	return filtered(rw.expr(e), fFinalize, text)
}

func (rw *rewriter) cond(e nodes.Expression) nodes.Expression {
	return filtered(rw.expr(e), fBool)
}

func (rw *rewriter) exprs(es []nodes.Expression) {
	for i := range es {
		es[i] = rw.expr(es[i])
	}
}

func (rw *rewriter) kwargs(kw map[string]nodes.Expression) {
	for k, v := range kw {
		if !rw.ident(v.Position(), k) {
			return
		}
		kw[k] = rw.expr(v)
	}
}

// ident checks a name as Jinja's lexer does (a Python identifier); gonja's
// lexer also accepts names such as "0A" or "#x".
func (rw *rewriter) ident(tok *tokens.Token, name string) bool {
	if !isIdentifier(name) {
		rw.fail(tok, "invalid name '%s'", name)
		return false
	}
	return true
}

func isIdentifier(s string) bool {
	for i, r := range s {
		if !(r == '_' || unicode.IsLetter(r) || i > 0 && (unicode.IsDigit(r) || unicode.Is(unicode.Mn, r) || unicode.Is(unicode.Mc, r))) {
			return false
		}
	}
	return s != ""
}

// filtersAndTests rewrites a chain of filters and tests: each test (a
// filter call to gonja, see tokenpass.go) becomes pav:test, followed by
// pav:not when negated. Through pav:test, because gonja applies a test to
// an error value and answers: `(x + 'a') is defined` was True.
func (rw *rewriter) filtersAndTests(fcs []*nodes.FilterCall) []*nodes.FilterCall {
	out := make([]*nodes.FilterCall, 0, len(fcs))
	for _, fc := range fcs {
		negated, isTest := rw.testNames[fc.Token]
		if !isTest {
			rw.filterCalls([]*nodes.FilterCall{fc})
			out = append(out, fc)
			continue
		}
		if !rw.tests.Exists(fc.Name) {
			rw.fail(fc.Token, "no test named '%s'", fc.Name)
			return fcs
		}
		rw.exprs(fc.Args)
		rw.kwargs(fc.Kwargs)
		args := append([]nodes.Expression{strNode(fc.Token, fc.Name)}, fc.Args...)
		out = append(out, &nodes.FilterCall{Token: fc.Token, Name: fTest, Args: args, Kwargs: fc.Kwargs})
		if negated {
			out = append(out, &nodes.FilterCall{Token: fc.Token, Name: fNot, Kwargs: map[string]nodes.Expression{}})
		}
	}
	return out
}

// filterCalls checks and rewrites the arguments of a chain of filters (a
// filter tag's, where Jinja takes no test).
func (rw *rewriter) filterCalls(fcs []*nodes.FilterCall) {
	for _, fc := range fcs {
		if _, isTest := rw.testNames[fc.Token]; isTest {
			rw.fail(fc.Token, "expected token 'end of statement block', got 'is'")
			return
		}
		if !rw.filters.Exists(fc.Name) || strings.HasPrefix(fc.Name, "pav:") {
			rw.fail(fc.Token, "no filter named '%s'", fc.Name)
			return
		}
		rw.exprs(fc.Args)
		rw.kwargs(fc.Kwargs)
	}
}

func (rw *rewriter) callParts(c *nodes.Call) {
	text := strNode(c.Location, exprText(c.Func))
	// Not flattened into the function's own filter chain: a chain stops at
	// the first error, and pav:callable must see errors (see filterCallable).
	c.Func = &nodes.FilteredExpression{Expression: rw.expr(c.Func), Filters: []*nodes.FilterCall{
		{Token: c.Location, Name: fCallable, Args: []nodes.Expression{text}, Kwargs: map[string]nodes.Expression{}},
	}}
	c.Parent = nil // only used by gonja for method calls, which pav rewrites
	rw.exprs(c.Args)
	rw.kwargs(c.Kwargs)
}

func (rw *rewriter) expr(e nodes.Expression) nodes.Expression {
	if e == nil || rw.err != nil {
		return e
	}
	rw.depth++
	defer func() { rw.depth-- }()
	if rw.depth > maxNesting {
		rw.fail(e.Position(), "expression is nested too deeply")
		return e
	}
	switch n := e.(type) {
	case *nodes.None:
		if n.Location != nil && n.Location.Val == "nil" {
			// gonja reads nil as None; in Jinja it is an ordinary name.
			return filtered(&nodes.None{Location: n.Location}, fVar, strNode(n.Location, "nil"))
		}
		return n
	case *nodes.String, *nodes.Integer, *nodes.Float, *nodes.Bool, *nodes.Error:
		return n
	case *nodes.List:
		rw.exprs(n.Val)
		return filtered(n, fPlain)
	case *nodes.Tuple:
		rw.exprs(n.Val)
		return filtered(n, fPlain)
	case *nodes.Dict:
		for _, p := range n.Pairs {
			p.Key = rw.expr(p.Key)
			p.Value = rw.expr(p.Value)
		}
		return filtered(n, fPlain)
	case *nodes.Name:
		if !rw.ident(n.Name, n.Name.Val) {
			return n
		}
		if n.Name.Val == "none" {
			// Jinja's lowercase none, which gonja does not know.
			return &nodes.None{Location: n.Name}
		}
		if rw.names != nil {
			rw.names[n.Name.Val] = true
		}
		return filtered(&nodes.None{Location: n.Name}, fVar, strNode(n.Name, n.Name.Val))
	case *nodes.GetAttribute:
		var key nodes.Expression
		if n.Attribute != "" && !rw.ident(n.Location, n.Attribute) {
			return n
		}
		if n.Attribute != "" {
			key = strNode(n.Location, n.Attribute)
		} else {
			key = &nodes.Integer{Location: n.Location, Val: n.Index}
		}
		text := strNode(n.Location, exprText(n.Node))
		return filtered(rw.expr(n.Node), fGetattr, key, text)
	case *nodes.GetItem:
		if n.Arg == nil {
			rw.fail(n.Location, "expected an expression between [ and ]")
			return n
		}
		text := strNode(n.Location, exprText(n.Node))
		return filtered(rw.expr(n.Node), fGetitem, rw.expr(n.Arg), text)
	case *nodes.GetSlice:
		n.Node = rw.expr(n.Node)
		n.Start = rw.expr(n.Start)
		n.End = rw.expr(n.End)
		n.Step = rw.expr(n.Step)
		return n
	case *nodes.Call:
		if ga, ok := n.Func.(*nodes.GetAttribute); ok && ga.Attribute != "" {
			args := append([]nodes.Expression{strNode(n.Location, ga.Attribute), strNode(n.Location, exprText(ga.Node))}, n.Args...)
			// (exprText above runs before ga.Node is rewritten below.)
			for i := 2; i < len(args); i++ {
				args[i] = rw.expr(args[i])
			}
			rw.kwargs(n.Kwargs)
			return filteredCall(rw.expr(ga.Node), &nodes.FilterCall{Token: n.Location, Name: fMethod, Args: args, Kwargs: n.Kwargs})
		}
		rw.callParts(n)
		return n
	case *nodes.Negation:
		e := filtered(rw.expr(n.Term), fNot)
		for range rw.nots[n.Operator] - 1 {
			// `not not x` (tokenpass.go)
			e = filtered(e, fNot)
		}
		return e
	case *nodes.UnaryExpression:
		sign := func(negative bool) string {
			if negative {
				return fNeg
			}
			return fPos
		}
		text := strNode(n.Operator, exprText(n.Term))
		e := rw.expr(n.Term)
		inner := rw.signs[n.Operator] // `- -x` (tokenpass.go), innermost last
		for i := len(inner) - 1; i >= 0; i-- {
			e = filtered(e, sign(inner[i]), text)
		}
		return filtered(e, sign(n.Negative), text)
	case *nodes.BinaryExpression:
		tok := n.Operator.Token
		switch tok.Type {
		case tokens.Or:
			// Also the conditionals' keywords (condexpr.go).
			return rw.orExpr(n)
		case tokens.Equals, tokens.Ne, tokens.LowerThan, tokens.LowerThanOrEqual, tokens.GreaterThan, tokens.GreaterThanOrEqual:
			return rw.compare(n)
		case tokens.And:
			// Kept: gonja's and/or are lazy and return an operand, as in
			// Python; Undefined operands are falsy values, not errors.
			n.Left = rw.expr(n.Left)
			n.Right = rw.expr(n.Right)
			return n
		}
		op, ok := binaryOps[tok.Type]
		if !ok {
			rw.fail(tok, "unsupported operator '%s'", tok.Val)
			return n
		}
		leftText, rightText := strNode(tok, exprText(n.Left)), strNode(tok, exprText(n.Right))
		return filtered(rw.expr(n.Left), fBinop, strNode(tok, op), rw.expr(n.Right), leftText, rightText)
	case *nodes.FilteredExpression:
		n.Expression = rw.expr(n.Expression)
		n.Filters = rw.filtersAndTests(n.Filters)
		return n
	case *nodes.TestExpression:
		// Tests reach gonja's parser as filters, and in and not in as
		// comparisons (tokenpass.go); its own test would mean an `is`, `in`
		// or `not` the token pass missed.
		rw.fail(n.Test.Token, "internal error: a test that pav did not rewrite")
		return n
	}
	rw.fail(e.Position(), "unsupported expression %s", e)
	return e
}

var binaryOps = map[tokens.Type]string{
	tokens.Addition:           "+",
	tokens.Subtraction:        "-",
	tokens.Multiply:           "*",
	tokens.Division:           "/",
	tokens.FloorDivision:      "//",
	tokens.Modulo:             "%",
	tokens.Power:              "**",
	tokens.Tilde:              "~",
	tokens.Equals:             "==",
	tokens.Ne:                 "!=",
	tokens.LowerThan:          "<",
	tokens.LowerThanOrEqual:   "<=",
	tokens.GreaterThan:        ">",
	tokens.GreaterThanOrEqual: ">=",
}

func strNode(tok *tokens.Token, s string) *nodes.String {
	return &nodes.String{Location: tok, Val: s}
}

// filtered appends a filter call to e. Flattening evaluates the same, except
// that a chain stops at the first error value: later filters do not see it.
func filtered(e nodes.Expression, name string, args ...nodes.Expression) nodes.Expression {
	return filteredCall(e, &nodes.FilterCall{Token: e.Position(), Name: name, Args: args, Kwargs: map[string]nodes.Expression{}})
}

func filteredCall(e nodes.Expression, fc *nodes.FilterCall) nodes.Expression {
	if fe, ok := e.(*nodes.FilteredExpression); ok {
		fe.Filters = append(fe.Filters, fc)
		return fe
	}
	return &nodes.FilteredExpression{Expression: e, Filters: []*nodes.FilterCall{fc}}
}

// exprText renders an (unrewritten) expression back to template syntax, for
// error messages.
func exprText(e nodes.Node) string {
	var b strings.Builder
	writeExprText(&b, e, 0)
	s := b.String()
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

func writeExprText(b *strings.Builder, e nodes.Node, depth int) {
	if depth > 20 || b.Len() > 100 {
		b.WriteString("…")
		return
	}
	list := func(open, close string, es []nodes.Expression) {
		b.WriteString(open)
		for i, x := range es {
			if i > 0 {
				b.WriteString(", ")
			}
			writeExprText(b, x, depth+1)
		}
		b.WriteString(close)
	}
	switch n := e.(type) {
	case nil:
	case *nodes.None:
		b.WriteString("none")
	case *nodes.String:
		b.WriteString(pyReprString(n.Val))
	case *nodes.Integer:
		b.WriteString(strconv.Itoa(n.Val))
	case *nodes.Float:
		b.WriteString(pyFloat(n.Val))
	case *nodes.Bool:
		b.WriteString(strconv.FormatBool(n.Val))
	case *nodes.Name:
		b.WriteString(n.Name.Val)
	case *nodes.List:
		list("[", "]", n.Val)
	case *nodes.Tuple:
		list("(", ")", n.Val)
	case *nodes.Dict:
		b.WriteByte('{')
		for i, p := range n.Pairs {
			if i > 0 {
				b.WriteString(", ")
			}
			writeExprText(b, p.Key, depth+1)
			b.WriteString(": ")
			writeExprText(b, p.Value, depth+1)
		}
		b.WriteByte('}')
	case *nodes.GetAttribute:
		writeExprText(b, n.Node, depth+1)
		b.WriteByte('.')
		if n.Attribute != "" {
			b.WriteString(n.Attribute)
		} else {
			b.WriteString(strconv.Itoa(n.Index))
		}
	case *nodes.GetItem:
		writeExprText(b, n.Node, depth+1)
		b.WriteByte('[')
		writeExprText(b, n.Arg, depth+1)
		b.WriteByte(']')
	case *nodes.GetSlice:
		writeExprText(b, n.Node, depth+1)
		b.WriteByte('[')
		writeExprText(b, n.Start, depth+1)
		b.WriteByte(':')
		writeExprText(b, n.End, depth+1)
		if n.Step != nil {
			b.WriteByte(':')
			writeExprText(b, n.Step, depth+1)
		}
		b.WriteByte(']')
	case *nodes.Call:
		writeExprText(b, n.Func, depth+1)
		list("(", ")", n.Args)
	case *nodes.Negation:
		b.WriteString("not ")
		writeExprText(b, n.Term, depth+1)
	case *nodes.UnaryExpression:
		if n.Negative {
			b.WriteByte('-')
		} else {
			b.WriteByte('+')
		}
		writeExprText(b, n.Term, depth+1)
	case *nodes.BinaryExpression:
		writeExprText(b, n.Left, depth+1)
		b.WriteString(" " + n.Operator.Token.Val + " ")
		writeExprText(b, n.Right, depth+1)
	case *nodes.FilteredExpression:
		writeExprText(b, n.Expression, depth+1)
		for _, f := range n.Filters {
			b.WriteString(" | " + f.Name)
			if len(f.Args) > 0 {
				list("(", ")", f.Args)
			}
		}
	case *nodes.TestExpression:
		writeExprText(b, n.Expression, depth+1)
		b.WriteString(" is " + n.Test.Name)
	default:
		b.WriteString("…")
	}
}
