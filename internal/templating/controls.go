package templating

import (
	"fmt"
	"io"
	"strings"

	controlStructures "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// pav's own control structures. set and with are reimplemented because
// gonja's keep their expressions in unexported fields, which the rewrite pass
// could not reach, and because gonja's set assigns into any map or struct
// (mutating context objects); filter for the same reason; macro to bound
// recursion (a recursive macro would otherwise overflow the Go stack, which
// kills the process instead of failing the template).

const maxMacroDepth = 100

func stateOfContext(c *exec.Context) *renderState {
	if v, ok := c.Get(stateKey); ok {
		if st, ok := v.(*renderState); ok {
			return st
		}
	}
	return nil
}

// controlError records err as a pav error (so the final message keeps it)
// and returns it.
func controlError(r *exec.Renderer, err error) error {
	if st := stateOfContext(r.Environment.Context); st != nil {
		return st.fail(err).Interface().(error)
	}
	return err
}

// ---- {% set %} ----

type setControl struct {
	location *tokens.Token
	names    []string // {% set a = … %}, {% set a, b = … %}
	nsAttr   string   // {% set ns.attr = … %}: names[0] is the namespace
	expr     nodes.Expression
	body     *nodes.Wrapper // {% set a %}…{% endset %}
	nsTarget nodes.Expression
}

func (s *setControl) Position() *tokens.Token { return s.location }
func (s *setControl) String() string          { return "set" }

var reservedNames = map[string]bool{"true": true, "false": true, "none": true, "True": true, "False": true, "None": true}

func parseSet(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	s := &setControl{location: args.Current()}
	first := args.Match(tokens.Name)
	if first == nil || reservedNames[first.Val] || !isIdentifier(first.Val) {
		return nil, args.Error("expected a variable name to assign to", args.Current())
	}
	s.names = []string{first.Val}
	if args.Match(tokens.Dot) != nil {
		attr := args.Match(tokens.Name)
		if attr == nil || !isIdentifier(attr.Val) {
			return nil, args.Error("expected an attribute name", args.Current())
		}
		s.nsAttr = attr.Val
		s.nsTarget = &nodes.Name{Name: first}
	} else {
		for args.Match(tokens.Comma) != nil {
			n := args.Match(tokens.Name)
			if n == nil || reservedNames[n.Val] || !isIdentifier(n.Val) {
				return nil, args.Error("expected a variable name to assign to", args.Current())
			}
			s.names = append(s.names, n.Val)
		}
	}
	if args.Match(tokens.Assign) == nil {
		if !args.End() {
			return nil, args.Error("expected '='", args.Current())
		}
		if len(s.names) != 1 {
			return nil, args.Error("a block set assigns a single target", s.location)
		}
		wrapper, endargs, err := p.WrapUntil("endset")
		if err != nil {
			return nil, err
		}
		if !endargs.End() {
			return nil, endargs.Error("endset takes no arguments", endargs.Current())
		}
		s.body = wrapper
		return s, nil
	}
	expr, err := args.ParseExpression()
	if err != nil {
		return nil, err
	}
	if args.Current(tokens.Comma) != nil { // {% set a, b = 1, 2 %}
		tuple := &nodes.Tuple{Location: expr.Position(), Val: []nodes.Expression{expr}}
		for args.Match(tokens.Comma) != nil {
			e, err := args.ParseExpression()
			if err != nil {
				return nil, err
			}
			tuple.Val = append(tuple.Val, e)
		}
		expr = tuple
	}
	s.expr = expr
	if !args.End() {
		return nil, args.Error("malformed set tag", args.Current())
	}
	return s, nil
}

func (s *setControl) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	var value *exec.Value
	switch {
	case s.body != nil:
		var out strings.Builder
		sub := r.Inherit()
		sub.Output = &limitedWriter{w: &out}
		if err := sub.ExecuteWrapper(s.body); err != nil {
			return err
		}
		value = exec.AsSafeValue(out.String())
	default:
		value = r.Eval(s.expr)
	}
	if value.IsError() {
		return value
	}
	if s.nsTarget != nil {
		target := r.Eval(s.nsTarget)
		if target.IsError() {
			return target
		}
		ns, ok := target.Interface().(*namespace)
		if !ok {
			return controlError(r, fmt.Errorf("cannot assign attribute on non-namespace object '%s'", s.names[0]))
		}
		ns.attrs[s.nsAttr] = value
		return nil
	}
	if len(s.names) == 1 {
		r.Environment.Context.Set(s.names[0], value.Interface())
		return nil
	}
	if kindOf(value) != kList {
		return controlError(r, fmt.Errorf("cannot unpack %s into %d names", typeName(value), len(s.names)))
	}
	items := listItems(value)
	if len(items) != len(s.names) {
		return controlError(r, fmt.Errorf("cannot unpack %d values into %d names", len(items), len(s.names)))
	}
	for i, name := range s.names {
		r.Environment.Context.Set(name, items[i].Interface())
	}
	return nil
}

// ---- {% for %} ----

// forControl runs gonja's for loop and then fails with the error, if any,
// that a loop filter (`for x in xs if cond`) raised: gonja counts it as
// false and carries on.
type forControl struct {
	*controlStructures.ForControlStructure
}

func (f *forControl) Execute(r *exec.Renderer, tag *nodes.ControlStructureBlock) error {
	st := stateOfContext(r.Environment.Context)
	if err := f.ForControlStructure.Execute(r, tag); err != nil {
		return err
	}
	if st != nil && st.loopFilterErr != nil {
		err := st.loopFilterErr
		st.loopFilterErr = nil
		return err
	}
	return nil
}

// ---- {% with %} ----

type withControl struct {
	location *tokens.Token
	names    []string
	values   []nodes.Expression
	body     *nodes.Wrapper
}

func (w *withControl) Position() *tokens.Token { return w.location }
func (w *withControl) String() string          { return "with" }

func parseWith(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	w := &withControl{location: args.Current()}
	for !args.End() {
		name := args.Match(tokens.Name)
		if name == nil || reservedNames[name.Val] || !isIdentifier(name.Val) {
			return nil, args.Error("expected a variable name", args.Current())
		}
		if args.Match(tokens.Assign) == nil {
			return nil, args.Error("expected '='", args.Current())
		}
		value, err := args.ParseExpression()
		if err != nil {
			return nil, err
		}
		w.names = append(w.names, name.Val)
		w.values = append(w.values, value)
		if args.Match(tokens.Comma) == nil {
			break
		}
	}
	if !args.End() {
		return nil, args.Error("malformed with tag", args.Current())
	}
	wrapper, endargs, err := p.WrapUntil("endwith")
	if err != nil {
		return nil, err
	}
	if !endargs.End() {
		return nil, endargs.Error("endwith takes no arguments", endargs.Current())
	}
	w.body = wrapper
	return w, nil
}

func (w *withControl) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	sub := r.Inherit()
	for i, name := range w.names {
		v := r.Eval(w.values[i]) // evaluated in the outer scope, as in Jinja
		if v.IsError() {
			return v
		}
		sub.Environment.Context.Set(name, v.Interface())
	}
	return sub.ExecuteWrapper(w.body)
}

// ---- {% autoescape %} ----

// autoescapeControl is Jinja's autoescape tag: any expression, whose truth
// turns escaping on or off in its body. gonja's takes only the names true
// and false.
//
// Jinja decides at compile time for constant output (`{{ '<' }}`) and at
// run time for the rest when the tag's value is not a compile-time
// constant: `{% autoescape t %}{{ '<' }}` does not escape, though t is
// true. The rewrite pass therefore takes only expressions that Jinja
// folds (literals and operators on them, see constantOnly), whose value is
// then the same at compile and run time, and refuses the others.
type autoescapeControl struct {
	location *tokens.Token
	expr     nodes.Expression
	body     *nodes.Wrapper
}

func (a *autoescapeControl) Position() *tokens.Token { return a.location }
func (a *autoescapeControl) String() string          { return "autoescape" }

func parseAutoescape(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	a := &autoescapeControl{location: args.Current()}
	if args.End() {
		return nil, args.Error("expected an expression after autoescape", args.Current())
	}
	expr, err := args.ParseExpression()
	if err != nil {
		return nil, err
	}
	if !args.End() {
		return nil, args.Error("expected token 'end of statement block'", args.Current())
	}
	a.expr = expr
	wrapper, endargs, err := p.WrapUntil("endautoescape")
	if err != nil {
		return nil, err
	}
	if !endargs.End() {
		return nil, endargs.Error("endautoescape takes no arguments", endargs.Current())
	}
	a.body = wrapper
	return a, nil
}

func (a *autoescapeControl) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	v := r.Eval(a.expr)
	if v.IsError() {
		return v
	}
	sub := r.Inherit()
	sub.Config.AutoEscape = truthy(v)
	return sub.ExecuteWrapper(a.body)
}

// ---- {% filter %} ----

type filterControl struct {
	location *tokens.Token
	filters  []*nodes.FilterCall
	body     *nodes.Wrapper
}

func (f *filterControl) Position() *tokens.Token { return f.location }
func (f *filterControl) String() string          { return "filter" }

func parseFilterBlock(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	f := &filterControl{location: args.Current()}
	for !args.End() {
		fc, err := args.ParseFilter()
		if err != nil {
			return nil, err
		}
		f.filters = append(f.filters, fc)
		if args.Match(tokens.Pipe) == nil {
			break
		}
	}
	if !args.End() || len(f.filters) == 0 {
		return nil, args.Error("malformed filter tag", args.Current())
	}
	wrapper, endargs, err := p.WrapUntil("endfilter")
	if err != nil {
		return nil, err
	}
	if !endargs.End() {
		return nil, endargs.Error("endfilter takes no arguments", endargs.Current())
	}
	f.body = wrapper
	return f, nil
}

func (f *filterControl) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	var out strings.Builder
	sub := r.Inherit()
	sub.Output = &limitedWriter{w: &out}
	if err := sub.ExecuteWrapper(f.body); err != nil {
		return err
	}
	ev := r.Evaluator()
	v := exec.AsValue(out.String())
	for _, fc := range f.filters {
		if v = ev.ExecuteFilter(fc, v); v.IsError() {
			return v
		}
	}
	v = filterFinalize(ev, v, &exec.VarArgs{Args: []*exec.Value{exec.AsValue("filter block")}})
	if v.IsError() {
		return v
	}
	_, err := io.WriteString(r.Output, v.String())
	return err
}

// ---- {% macro %} ----

type macroControl struct {
	macro *nodes.Macro
}

func (m *macroControl) Position() *tokens.Token { return m.macro.Position() }
func (m *macroControl) String() string          { return "macro " + m.macro.Name }

func parseMacro(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	gonjaParser, _ := controlStructures.All.Get("macro")
	cs, err := gonjaParser(p, args)
	if err != nil {
		return nil, err
	}
	mcs, ok := cs.(*controlStructures.MacroControlStructure)
	if !ok {
		return nil, fmt.Errorf("unexpected macro node %T", cs)
	}
	return &macroControl{macro: mcs.Macro}, nil
}

func (m *macroControl) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	fn, err := exec.MacroNodeToFunc(m.macro, r)
	if err != nil {
		return err
	}
	name := m.macro.Name
	// A macro's output is safe (Markup) in Jinja only when it was defined
	// with escaping on; gonja's always is, so that `{% autoescape true %}`
	// did not escape a macro defined outside it.
	escaping := r.Config.AutoEscape
	guarded := exec.Macro(func(va *exec.VarArgs) *exec.Value {
		st := stateOfContext(r.Environment.Context)
		if st == nil {
			return exec.AsValue(fmt.Errorf("macro called outside a render"))
		}
		if st.depth >= maxMacroDepth {
			return st.failf("macro '%s': maximum recursion depth (%d) exceeded", name, maxMacroDepth)
		}
		st.depth++
		defer func() { st.depth-- }()
		v := fn(va)
		if v.IsError() {
			return v
		}
		return &exec.Value{Val: v.Val, Safe: escaping}
	})
	r.Environment.Context.Set(name, guarded)
	return nil
}

// ---- refused tags ----

// refuse rejects the tags that load other templates. pav templates have no
// loader at all: there is nothing they could legitimately load, and loading
// files from the driver's filesystem would be a hole in the sandbox.
func refuse(tag string) parser.ControlStructureParser {
	return func(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
		tok := args.Current()
		if tok == nil {
			tok = p.Current()
		}
		return nil, p.Error(fmt.Sprintf("{%% %s %%} is not allowed in pav templates (they cannot load other templates)", tag), tok)
	}
}

// ---- output limit ----

// maxOutputBytes bounds what one template may render (a Kubernetes object is
// at most ~1.5 MiB, so real templates stay far below), so that nested loops
// cannot exhaust memory.
const maxOutputBytes = 4 << 20

type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	l.n += len(p)
	if l.n > maxOutputBytes {
		return 0, fmt.Errorf("template output exceeds %d bytes", maxOutputBytes)
	}
	return l.w.Write(p)
}

func (l *limitedWriter) WriteString(s string) (int, error) {
	l.n += len(s)
	if l.n > maxOutputBytes {
		return 0, fmt.Errorf("template output exceeds %d bytes", maxOutputBytes)
	}
	return io.WriteString(l.w, s)
}
