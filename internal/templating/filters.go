package templating

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	controlStructures "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/exec"
)

// Internal filters. The rewrite pass (rewrite.go) turns every variable
// reference, attribute or item access, method call and operator into one of
// these, because gonja's evaluator hard-codes semantics that differ from
// Jinja's and offers no hook to change them. Their names contain ':' so that
// templates cannot name them.
const (
	fVar      = "pav:var"
	fUndef    = "pav:undef"
	fGetattr  = "pav:getattr"
	fGetitem  = "pav:getitem"
	fMethod   = "pav:method"
	fCallable = "pav:callable"
	fBinop    = "pav:binop"
	fNot      = "pav:not"
	fNeg      = "pav:neg"
	fPos      = "pav:pos"
	fBool     = "pav:bool"
	fIterable = "pav:iterable"
	fFinalize = "pav:finalize"
	fForCond  = "pav:forcond"
	fPlain    = "pav:plain"
	fBranch   = "pav:branch"
	fTest     = "pav:test"
	fCompare  = "pav:compare"
)

func strArg(va *exec.VarArgs, i int) string {
	if i < len(va.Args) {
		return resolvedString(va.Args[i])
	}
	return ""
}

func resolvedString(v *exec.Value) string {
	if kindOf(v) == kStr {
		return resolved(v).String()
	}
	return ""
}

// pav:var(name) looks a variable up; a missing one is Undefined, not an
// error (Jinja's default Undefined), so that `x is defined`, `x or 42` and
// `x | default(…)` work while printing or computing with it fails.
func filterVar(e *exec.Evaluator, _ *exec.Value, va *exec.VarArgs) *exec.Value {
	st := stateOf(e)
	// Every name lookup checks for cancellation: cheap, and bounds how long a
	// runaway template can keep running after its caller gave up.
	if err := st.ctx.Err(); err != nil {
		return st.fail(fmt.Errorf("evaluation aborted: %w", err))
	}
	name := strArg(va, 0)
	v, ok := e.Environment.Context.Get(name)
	if !ok {
		if v, ok = globals.Get(name); !ok {
			return st.undefined(name)
		}
	}
	return exec.ToValue(v)
}

// pav:undef(description) is an Undefined value (the missing else branch of an
// inline if, a macro parameter that was not passed).
func filterUndef(e *exec.Evaluator, _ *exec.Value, va *exec.VarArgs) *exec.Value {
	return stateOf(e).undefinedMsg(strArg(va, 0))
}

// pav:getattr(name, targetText) is Jinja's `target.name`: an attribute, else
// an item; missing is Undefined; an attribute of Undefined is an error.
func filterGetattr(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	text := strArg(va, 1)
	if isUndefined(in) {
		return st.fail(undefinedError(text))
	}
	key := va.Args[0]
	if kindOf(key) == kInt { // x.0 is x[0] in Jinja
		if v, ok := getItem(in, key); ok {
			return v
		}
		return st.undefined(text + "." + pyStr(key))
	}
	name := resolvedString(key)
	if v, ok := getAttr(in, name); ok {
		return v
	}
	if v, ok := getItem(in, key); ok {
		return v
	}
	return st.undefined(text + "." + name)
}

// pav:getitem(key, targetText) is Jinja's `target[key]`: an item, else (for
// a string key) an attribute.
func filterGetitem(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	text := strArg(va, 1)
	if isUndefined(in) {
		return st.fail(undefinedError(text))
	}
	key := va.Args[0]
	if key.IsError() {
		return key
	}
	// An Undefined key finds nothing (Python's lookup fails, and Jinja
	// answers Undefined), which only fails where the result is used.
	if v, ok := getItem(in, key); ok {
		return v
	}
	if kindOf(key) == kStr {
		if v, ok := getAttr(in, resolved(key).String()); ok {
			return v
		}
	}
	return st.undefined(text + "[" + pyRepr(key, 0) + "]")
}

// Dict and list methods a template may call. Mutating ones are refused, as
// by Jinja's ImmutableSandboxedEnvironment: templates must not change the
// objects in their context (which are shared with the caller).
var (
	safeDictMethods   = map[string]bool{"keys": true, "values": true, "items": true, "get": true, "copy": true}
	unsafeDictMethods = map[string]bool{"pop": true, "popitem": true, "setdefault": true, "update": true, "clear": true, "__setitem__": true, "__delitem__": true}
	safeListMethods   = map[string]bool{"copy": true, "count": true, "index": true}
	unsafeListMethods = map[string]bool{"append": true, "extend": true, "insert": true, "pop": true, "remove": true, "reverse": true, "sort": true, "clear": true, "__setitem__": true, "__delitem__": true}
)

// getAttr is attribute access (getItem is tried after it). Only data is
// reachable: the namespace's attributes, loop's fields, and bound methods of str/int/float/
// bool/dict/list. Go struct fields and Go methods are never exposed (gonja's
// own GetAttribute would call reflect's MethodByName on any value).
func getAttr(obj *exec.Value, name string) (*exec.Value, bool) {
	if li, ok := obj.Interface().(*controlStructures.LoopInfos); ok {
		switch name {
		case "depth", "depth0":
			// gonja counts nesting; Jinja's depth is the recursion level
			// of a recursive loop, and gonja's LoopInfos is never one.
			return exec.AsValue(int64(map[string]int{"depth": 1, "depth0": 0}[name])), true
		case "previtem", "nextitem":
			// Jinja leaves them undefined at the ends; gonja sets None.
			if end, _ := li.GetAttribute(map[string]string{"previtem": "first", "nextitem": "last"}[name]); truthy(end) {
				return nil, false
			}
		}
	}
	if g, ok := obj.Interface().(exec.AttributeGetter); ok {
		// loop, cycler() and groupby's groups expose their fields this way
		// (groups are lists too, hence before the switch).
		return g.GetAttribute(name)
	}
	switch kindOf(obj) {
	case kNone, kUndefined:
		return nil, false
	case kNamespace:
		ns := obj.Interface().(*namespace)
		v, ok := ns.attrs[name]
		return v, ok
	case kDict:
		if safeDictMethods[name] {
			return boundMethod(obj, name), true
		}
		return nil, false
	case kList:
		if safeListMethods[name] {
			return boundMethod(obj, name), true
		}
		return nil, false
	case kStr, kInt, kFloat, kBool:
		if scalarMethod(obj, name) != nil {
			return boundMethod(obj, name), true
		}
		return nil, false
	}
	return nil, false
}

// getItem is item access: a dict key, a list or string index (negative
// counts from the end; out of range is Undefined, as in Jinja).
func getItem(obj, key *exec.Value) (*exec.Value, bool) {
	switch kindOf(obj) {
	case kDict:
		return dictLookup(obj, key)
	case kNamespace:
		return nil, false
	case kList, kStr:
		i, ok := toInt(key) // a bool too: l[True] is l[1] in Python
		if !ok {
			return nil, false
		}
		if kindOf(obj) == kStr {
			runes := []rune(resolved(obj).String())
			if i < 0 {
				i += int64(len(runes))
			}
			if i < 0 || i >= int64(len(runes)) {
				return nil, false
			}
			return exec.AsValue(string(runes[i])), true
		}
		rv := resolved(obj)
		n := int64(rv.Len())
		if i < 0 {
			i += n
		}
		if i < 0 || i >= n {
			return nil, false
		}
		return exec.ToValue(rv.Index(int(i))), true
	}
	return nil, false
}

type methodFunc func(self *exec.Value, va *exec.VarArgs) (any, error)

func scalarMethod(obj *exec.Value, name string) methodFunc {
	switch kindOf(obj) {
	case kStr:
		if m, ok := pyStrMethods[name]; ok {
			return func(self *exec.Value, va *exec.VarArgs) (any, error) {
				return m(resolved(self).String(), va)
			}
		}
		if m, ok := methodsStr.Get(name); ok {
			return func(self *exec.Value, va *exec.VarArgs) (any, error) {
				if sizeMethods[name] {
					if err := checkSizes(name, maxStringBytes, va); err != nil {
						return nil, err
					}
				}
				if name == "format" || name == "format_map" {
					// pystring's format inspects its arguments with
					// reflection (struct fields too); give it plain data.
					plain, err := plainVarArgs(va)
					if err != nil {
						return nil, err
					}
					va = plain
				}
				return m(resolved(self).String(), self, va)
			}
		}
	case kInt:
		if m, ok := methodsInt.Get(name); ok {
			return func(self *exec.Value, va *exec.VarArgs) (any, error) {
				return m(self.Integer(), self, va)
			}
		}
	case kFloat:
		if m, ok := methodsFloat.Get(name); ok {
			return func(self *exec.Value, va *exec.VarArgs) (any, error) {
				return m(self.Float(), self, va)
			}
		}
	case kBool:
		if m, ok := methodsBool.Get(name); ok {
			return func(self *exec.Value, va *exec.VarArgs) (any, error) {
				return m(resolved(self).Bool(), self, va)
			}
		}
	}
	return nil
}

func plainVarArgs(va *exec.VarArgs) (*exec.VarArgs, error) {
	out := exec.NewVarArgs()
	for _, a := range va.Args {
		p, err := toPlain(a, 0)
		if err != nil {
			return nil, err
		}
		out.Args = append(out.Args, exec.AsValue(p))
	}
	for k, a := range va.KwArgs {
		p, err := toPlain(a, 0)
		if err != nil {
			return nil, err
		}
		out.KwArgs[k] = exec.AsValue(p)
	}
	return out, nil
}

// boundMethod returns obj.name as a callable value (what `x.items` without a
// call evaluates to in Jinja).
func boundMethod(obj *exec.Value, name string) *exec.Value {
	fn := func(va *exec.VarArgs) *exec.Value {
		v, err := callMethod(obj, name, va)
		if err != nil {
			return exec.AsValue(err)
		}
		return v
	}
	return exec.AsValue(fn)
}

// callMethod calls obj.name(args).
func callMethod(obj *exec.Value, name string, va *exec.VarArgs) (*exec.Value, error) {
	switch kindOf(obj) {
	case kDict:
		if unsafeDictMethods[name] {
			return nil, fmt.Errorf("access to attribute '%s' of 'dict' object is unsafe (templates cannot modify objects)", name)
		}
		if safeDictMethods[name] {
			return dictMethod(obj, name, va)
		}
		// A dict of functions: cycler(), self (blocks).
		if v, ok := dictLookup(obj, exec.AsValue(name)); ok {
			return callFunc(v, va, name)
		}
	case kList:
		if unsafeListMethods[name] {
			return nil, fmt.Errorf("access to attribute '%s' of 'list' object is unsafe (templates cannot modify objects)", name)
		}
		if safeListMethods[name] {
			return listMethod(obj, name, va)
		}
	case kStr, kInt, kFloat, kBool:
		if m := scalarMethod(obj, name); m != nil {
			r, err := callScalarMethod(m, obj, va, name)
			if err != nil {
				return nil, err
			}
			return exec.ToValue(r), nil
		}
	case kNone, kUndefined:
	default:
		if v, ok := getAttr(obj, name); ok {
			return callFunc(v, va, name)
		}
	}
	return nil, fmt.Errorf("'%s' object has no attribute '%s'", typeName(obj), name)
}

func dictMethod(obj *exec.Value, name string, va *exec.VarArgs) (*exec.Value, error) {
	items := dictItems(obj)
	switch name {
	case "keys", "values", "items", "copy":
		if len(va.Args) != 0 || len(va.KwArgs) != 0 {
			return nil, fmt.Errorf("%s() takes no arguments", name)
		}
		if name == "copy" {
			out := make(map[string]any, len(items))
			d := exec.NewDict()
			for _, it := range items {
				if kindOf(it.key) == kStr {
					out[resolved(it.key).String()] = it.value.Interface()
				}
				d.Pairs = append(d.Pairs, &exec.Pair{Key: it.key, Value: it.value})
			}
			if len(out) == len(items) {
				return exec.AsValue(out), nil
			}
			return exec.AsValue(d), nil
		}
		out := make([]any, 0, len(items))
		for _, it := range items {
			switch name {
			case "keys":
				out = append(out, it.key.Interface())
			case "values":
				out = append(out, it.value.Interface())
			default:
				out = append(out, []any{it.key.Interface(), it.value.Interface()})
			}
		}
		return exec.AsValue(out), nil
	case "get":
		if len(va.Args) < 1 || len(va.Args) > 2 || len(va.KwArgs) != 0 {
			return nil, fmt.Errorf("get() takes 1 or 2 positional arguments")
		}
		if v, ok := dictLookup(obj, va.Args[0]); ok {
			return v, nil
		}
		if len(va.Args) == 2 {
			return va.Args[1], nil
		}
		return exec.AsValue(nil), nil
	}
	return nil, fmt.Errorf("'dict' object has no attribute '%s'", name)
}

func listMethod(obj *exec.Value, name string, va *exec.VarArgs) (*exec.Value, error) {
	items := listItems(obj)
	switch name {
	case "copy":
		out := make([]any, len(items))
		for i, x := range items {
			out[i] = x.Interface()
		}
		return exec.AsValue(out), nil
	case "count", "index":
		if len(va.Args) != 1 {
			return nil, fmt.Errorf("%s() takes exactly one argument", name)
		}
		n := 0
		for i, x := range items {
			if equal(x, va.Args[0]) {
				if name == "index" {
					return exec.AsValue(int64(i)), nil
				}
				n++
			}
		}
		if name == "index" {
			return nil, fmt.Errorf("%s is not in list", pyRepr(va.Args[0], 0))
		}
		return exec.AsValue(int64(n)), nil
	}
	return nil, fmt.Errorf("'list' object has no attribute '%s'", name)
}

var (
	typeVarArgs   = reflect.TypeOf((*exec.VarArgs)(nil))
	typeEvaluator = reflect.TypeOf((*exec.Evaluator)(nil))
	typeValuePtr  = reflect.TypeOf((*exec.Value)(nil))
	typeError     = reflect.TypeOf((*error)(nil)).Elem()
)

// callFunc calls a function value found in the context or in an object:
// macros, caller(), loop.cycle(), cycler().next(), self.block(), bound
// methods. Only these shapes are callable; no argument conversion happens
// via reflection on arbitrary Go types.
func callFunc(fn *exec.Value, va *exec.VarArgs, name string) (*exec.Value, error) {
	if kindOf(fn) != kCallable {
		return nil, fmt.Errorf("'%s' is not callable", name)
	}
	f := resolved(fn)
	t := f.Type()
	var in []reflect.Value
	switch {
	case t.NumIn() == 1 && t.In(0) == typeVarArgs:
		in = []reflect.Value{reflect.ValueOf(va)}
	case t.NumIn() == 0:
		if len(va.Args) != 0 || len(va.KwArgs) != 0 {
			return nil, fmt.Errorf("%s() takes no arguments", name)
		}
	default:
		return nil, fmt.Errorf("'%s' cannot be called from a template", name)
	}
	if t.NumOut() > 2 || (t.NumOut() == 2 && t.Out(1) != typeError) {
		return nil, fmt.Errorf("'%s' cannot be called from a template", name)
	}
	out := f.Call(in)
	if len(out) == 0 {
		return exec.AsValue(nil), nil
	}
	if len(out) == 2 && !out[1].IsNil() {
		return nil, out[1].Interface().(error)
	}
	v := exec.ToValue(out[0])
	if v.IsError() {
		return nil, v.Interface().(error)
	}
	return v, nil
}

// pav:method(name, targetText, args…, kwargs…) is `target.name(args…)`.
func filterMethod(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	name, text := strArg(va, 0), strArg(va, 1)
	if isUndefined(in) {
		return st.fail(undefinedError(text))
	}
	args := &exec.VarArgs{Args: va.Args[2:], KwArgs: va.KwArgs}
	for _, a := range args.Args {
		if a.IsError() {
			return a
		}
	}
	v, err := callMethod(in, name, args)
	if err != nil {
		return st.fail(err)
	}
	return v
}

// pav:callable(text) checks that the function of a call is defined and
// callable, for a clearer error than gonja's "filtered_expression(…) is not
// callable".
func filterCallable(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	st := stateOf(e)
	var err error
	switch kindOf(in) {
	case kCallable:
		return in
	case kOther:
		if in.IsError() {
			// Already failed (and recorded, if pav's): pass it on as is.
			failed := in
			return exec.AsValue(func(*exec.VarArgs) *exec.Value { return failed })
		}
		err = fmt.Errorf("'%s' object is not callable", typeName(in))
	case kUndefined:
		err = undefinedError(strArg(va, 0))
	default:
		err = fmt.Errorf("'%s' object is not callable", typeName(in))
	}
	// gonja checks that the function is callable before checking for an
	// error value, and would replace this error with its own message; a
	// function that fails when called keeps it.
	failing := func(*exec.VarArgs) *exec.Value { return st.fail(err) }
	return exec.AsValue(failing)
}

// pav:binop(op, right, leftText, rightText) is `in op right`.
func filterBinop(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	right := va.Args[1]
	if right.IsError() {
		return right
	}
	v, err := binaryOp(strArg(va, 0), in, right, strArg(va, 2), strArg(va, 3))
	if err != nil {
		return stateOf(e).fail(err)
	}
	return v
}

func filterNot(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	return exec.AsValue(!truthy(in))
}

func filterBool(_ *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	return exec.AsValue(truthy(in))
}

func filterUnary(negative bool) exec.FilterFunction {
	return func(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
		if in.IsError() {
			return in
		}
		v, err := unaryOp(negative, in, strArg(va, 0))
		if err != nil {
			return stateOf(e).fail(err)
		}
		return v
	}
}

// pav:iterable(text) checks a for loop's sequence: Undefined iterates as
// empty (as in Jinja), other non-iterables are errors (gonja would iterate
// them as empty).
func filterIterable(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	// Every loop start checks for cancellation, so nested loops whose
	// bodies look nothing up still stop when the caller gives up.
	if st := stateOf(e); st.ctx.Err() != nil {
		return st.fail(fmt.Errorf("evaluation aborted: %w", st.ctx.Err()))
	}
	switch kindOf(in) {
	case kUndefined:
		return exec.AsValue([]any{})
	case kList, kDict:
		return in
	case kStr:
		// gonja iterates strings by byte; Python by code point.
		var out []any
		for _, r := range resolved(in).String() {
			out = append(out, string(r))
		}
		return exec.AsValue(out)
	}
	return stateOf(e).failf("'%s' object is not iterable", typeName(in))
}

// pav:finalize(text) is applied to every {{ … }}: PaV's rule that an
// expression must evaluate to a string or a number (bool counts as a number,
// as it does in Python, and prints True/False). None, lists, dicts and
// Undefined are errors.
func filterFinalize(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	var s string
	switch k := kindOf(in); k {
	case kStr:
		return in
	case kInt, kFloat, kBool:
		s = pyStr(in)
	case kUndefined:
		return st.fail(st.undefinedErr())
	default:
		what := "None"
		if k != kNone {
			what = "a " + typeName(in)
		}
		return st.failf("expression '%s' evaluated to %s, but expressions must evaluate to a string or a number", strArg(va, 0), what)
	}
	return &exec.Value{Val: reflect.ValueOf(s), Safe: in.Safe}
}

// ---- public filters that replace or add to gonja's ----

// ToBash renders s as one bash word that bash reads back as exactly s, with
// no newline in it (PaV's tobash filter): empty is ”; otherwise each line
// is quoted as by Python's shlex.quote and lines are joined with $'\n'.
func ToBash(s string) string {
	if s == "" {
		return "''"
	}
	var b strings.Builder
	for i, piece := range strings.Split(s, "\n") {
		if i > 0 {
			b.WriteString(`$'\n'`)
		}
		if piece == "" {
			continue
		}
		if isShellSafe(piece) {
			b.WriteString(piece)
			continue
		}
		b.WriteByte('\'')
		b.WriteString(strings.ReplaceAll(piece, "'", `'"'"'`))
		b.WriteByte('\'')
	}
	return b.String()
}

func isShellSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("_@%+=:,./-", c) >= 0) {
			return false
		}
	}
	return true
}

func filterToBash(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	if len(va.Args) != 0 || len(va.KwArgs) != 0 {
		return st.failf("tobash takes no arguments")
	}
	switch kindOf(in) {
	case kStr, kInt, kFloat, kBool:
		return exec.AsValue(ToBash(pyStr(in)))
	case kUndefined:
		return st.fail(fmt.Errorf("filter 'tobash' may not be applied to undefined (%w)", st.undefinedErr()))
	}
	return st.failf("filter 'tobash' expects a string or a number, not %s", typeName(in))
}

func filterToJSON(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	indent := -1
	if len(va.Args) > 1 {
		return st.failf("tojson takes at most one argument (indent)")
	}
	iv := va.GetKeywordArgument("indent", nil)
	if len(va.Args) == 1 {
		iv = va.Args[0]
	}
	for k := range va.KwArgs {
		if k != "indent" {
			return st.failf("tojson got an unexpected keyword argument '%s'", k)
		}
	}
	if !iv.IsNil() {
		n, ok := toInt(iv)
		if !ok || n < 0 || n > 16 {
			return st.failf("tojson: indent must be a small non-negative integer")
		}
		indent = int(n)
	}
	var b strings.Builder
	if err := writeJSON(&b, in, indent, 0); err != nil {
		return st.fail(err)
	}
	return exec.AsSafeValue(b.String())
}

// writeJSON renders v as Jinja's tojson filter does (htmlsafe_json_dumps with
// sort_keys): one line unless indent >= 0, keys sorted, ", " and ": "
// separators, non-ASCII as \uXXXX, and <, >, & and ' escaped so the output is
// safe in HTML and in single-quoted YAML/shell contexts.
func writeJSON(b *strings.Builder, v *exec.Value, indent, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("tojson: value is nested too deeply")
	}
	if b.Len() > maxStringBytes {
		return errTooLarge
	}
	newline := func(d int) {
		if indent >= 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", indent*d))
		}
	}
	itemSep := ", "
	if indent >= 0 {
		itemSep = ","
	}
	switch kindOf(v) {
	case kNone:
		b.WriteString("null")
	case kBool:
		if resolved(v).Bool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case kInt:
		b.WriteString(pyStr(v))
	case kFloat:
		f, _ := toFloat(v)
		s := pyFloat(f)
		switch s {
		case "inf":
			s = "Infinity"
		case "-inf":
			s = "-Infinity"
		case "nan":
			s = "NaN"
		}
		b.WriteString(s)
	case kStr:
		writeJSONString(b, resolved(v).String())
	case kList:
		items := listItems(v)
		b.WriteByte('[')
		for i, x := range items {
			if i > 0 {
				b.WriteString(itemSep)
			}
			newline(depth + 1)
			if err := writeJSON(b, x, indent, depth+1); err != nil {
				return err
			}
		}
		if len(items) > 0 {
			newline(depth)
		}
		b.WriteByte(']')
	case kDict:
		items := dictItems(v)
		b.WriteByte('{')
		for i, it := range items {
			if i > 0 {
				b.WriteString(itemSep)
			}
			newline(depth + 1)
			var key string
			switch kindOf(it.key) {
			case kStr:
				key = resolved(it.key).String()
			case kInt, kFloat:
				key = pyStr(it.key)
			case kBool:
				key = strings.ToLower(pyStr(it.key))
			case kNone:
				key = "null"
			default:
				return fmt.Errorf("tojson: keys must be str, int, float, bool or None, not %s", typeName(it.key))
			}
			writeJSONString(b, key)
			b.WriteString(": ")
			if err := writeJSON(b, it.value, indent, depth+1); err != nil {
				return err
			}
		}
		if len(items) > 0 {
			newline(depth)
		}
		b.WriteByte('}')
	case kUndefined:
		return fmt.Errorf("tojson: object of type Undefined is not JSON serializable")
	default:
		return fmt.Errorf("tojson: object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

// writeJSONString writes s as Python's json.dumps(ensure_ascii=True) does,
// plus Jinja's HTML-safe escapes. Invalid UTF-8 is written as U+FFFD.
func writeJSONString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '<', '>', '&', '\'':
			fmt.Fprintf(b, `\u%04x`, r)
		default:
			switch {
			case r < 0x20 || (r > 0x7e && r < 0x10000):
				fmt.Fprintf(b, `\u%04x`, r)
			case r >= 0x10000:
				r -= 0x10000
				fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// default(value, boolean=false): Jinja replaces only Undefined (and, with
// boolean=true, falsy values); gonja also replaced None and errors.
func filterDefault(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	def := exec.AsValue("")
	if len(va.Args) > 0 {
		def = va.Args[0]
	}
	boolean := false
	if len(va.Args) > 1 {
		boolean = truthy(va.Args[1])
	}
	if b, ok := va.KwArgs["boolean"]; ok {
		boolean = truthy(b)
	}
	if isUndefined(in) || (boolean && !truthy(in)) {
		return def
	}
	return in
}

func filterString(e *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	return exec.AsValue(pyStr(in))
}

// reverse: gonja's sorts while reversing.
func filterReverse(e *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	switch kindOf(in) {
	case kStr:
		r := []rune(resolved(in).String())
		for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
		return exec.AsValue(string(r))
	case kList:
		items := listItems(in)
		out := make([]any, len(items))
		for i, x := range items {
			out[len(items)-1-i] = x.Interface()
		}
		return exec.AsValue(out)
	case kDict:
		items := dictItems(in)
		out := make([]any, len(items))
		for i, x := range items {
			out[len(items)-1-i] = x.key.Interface()
		}
		return exec.AsValue(out)
	case kUndefined:
		return exec.AsValue([]any{})
	}
	return stateOf(e).failf("'%s' object is not reversible", typeName(in))
}

// attr(name): gonja's reaches Go methods and struct fields.
func filterAttr(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	if len(va.Args) != 1 || kindOf(va.Args[0]) != kStr {
		return st.failf("attr takes one string argument")
	}
	if isUndefined(in) {
		return st.fail(st.undefinedErr())
	}
	name := resolved(va.Args[0]).String()
	if v, ok := getAttr(in, name); ok {
		return v
	}
	if kindOf(in) == kDict {
		if v, ok := dictLookup(in, va.Args[0]); ok {
			return v
		}
	}
	return st.undefined(name)
}

// format: Python's printf-style formatting (gonja uses Go's Sprintf verbs).
func filterFormat(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	if kindOf(in) != kStr {
		return st.failf("format expects a string, not %s", typeName(in))
	}
	s, err := pyPercentFormat(resolved(in).String(), va.Args, false)
	if err != nil {
		return st.fail(err)
	}
	return exec.AsValue(s)
}

// ---- tests ----

func testDefined(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	return !isUndefined(in) && !in.IsError(), nil
}

func testUndefined(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	return isUndefined(in), nil
}

func testNone(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	return kindOf(in) == kNone, nil
}

// modTest is Jinja's odd (x % 2 == 1), even (x % 2 == 0) and divisibleby
// (x % n == 0) with Python's %: gonja truncates floats to integers (2.5 is
// divisible by 2) and takes Go's remainder (-3 is not odd).
func modTest(divisor int64, want int64) exec.TestFunction {
	return func(_ *exec.Context, in *exec.Value, va *exec.VarArgs) (bool, error) {
		d := exec.AsValue(divisor)
		if divisor == 0 { // divisibleby(n)
			if len(va.Args) != 1 {
				return false, fmt.Errorf("divisibleby takes one argument")
			}
			d = va.Args[0]
		}
		r, err := binaryOp("%", in, d, "", "")
		if err != nil {
			return false, err
		}
		return equal(r, exec.AsValue(want)), nil
	}
}

// compareTest is Jinja's eq, ne, lt, le, gt and ge (operator.eq …), with
// pav's comparisons: gonja's answer False where Python fails ('a' < 3).
func compareTest(op string) exec.TestFunction {
	return func(_ *exec.Context, in *exec.Value, va *exec.VarArgs) (bool, error) {
		if len(va.Args) != 1 || len(va.KwArgs) != 0 {
			return false, fmt.Errorf("the test takes one argument")
		}
		r, err := binaryOp(op, in, va.Args[0], "", "")
		if err != nil {
			return false, err
		}
		return truthy(r), nil
	}
}

// testEscaped is Jinja's: a safe string (Markup) is escaped. gonja's
// escaped, filter and test tests always failed (they take ExpectNothing's
// result, never nil, for an error).
func testEscaped(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	return kindOf(in) == kStr && in.Safe, nil
}

// nameTest is Jinja's filter and test tests: whether the value names a
// filter (or test) of the environment, a dict lookup in Python.
func nameTest(set func(string) bool) exec.TestFunction {
	return func(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
		switch kindOf(in) {
		case kList, kDict:
			return false, fmt.Errorf("unhashable type: '%s'", typeName(in))
		case kStr:
			name := in.String()
			return !strings.HasPrefix(name, "pav:") && set(name), nil
		}
		return false, nil
	}
}

// sameasTest is Jinja's sameas, Python's `is`, where pav's values can tell:
// every Undefined is a new object (`abc is sameas abc` is False), None,
// True and False are singletons, and CPython caches the integers from -5 to
// 256. Other values are gonja's identity (lists and dicts: the same
// object).
func sameasTest(gonjaSameas exec.TestFunction) exec.TestFunction {
	return func(ctx *exec.Context, in *exec.Value, va *exec.VarArgs) (bool, error) {
		other := va.Args[0]
		ka, kb := kindOf(in), kindOf(other)
		switch {
		case ka == kUndefined || kb == kUndefined:
			return false, nil
		case ka == kNone || kb == kNone:
			return ka == kb, nil
		case ka == kBool || kb == kBool:
			return ka == kb && truthy(in) == truthy(other), nil
		case ka == kInt && kb == kInt:
			a, _ := toInt(in)
			b, _ := toInt(other)
			return a == b && -5 <= a && a <= 256, nil
		}
		return gonjaSameas.(func(*exec.Context, *exec.Value, *exec.VarArgs) (bool, error))(ctx, in, va)
	}
}

// testNumber: Python's bool is a number.
func testNumber(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	k := kindOf(in)
	return k == kInt || k == kFloat || k == kBool, nil
}

// testSequence is Jinja's: what has a length and items, so strings, dicts
// and Undefined too.
func testSequence(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
	switch kindOf(in) {
	case kStr, kList, kDict, kUndefined:
		return true, nil
	}
	return false, nil
}

// `x in y` is parsed by gonja as the test "in".
func testIn(_ *exec.Context, in *exec.Value, va *exec.VarArgs) (bool, error) {
	if len(va.Args) != 1 {
		return false, fmt.Errorf("'in' needs a right-hand side")
	}
	// An Undefined left operand is a value like any other (equal to
	// nothing, not a string), as in Jinja.
	return contains(va.Args[0], in, "")
}

// ---- global functions ----

// range is bounded as in Jinja's sandbox; gonja's returns a channel fed by a
// goroutine that leaks unless the template drains it.
func globalRange(e *exec.Evaluator, va *exec.VarArgs) *exec.Value {
	st := stateOf(e)
	if err := st.ctx.Err(); err != nil {
		return st.fail(fmt.Errorf("evaluation aborted: %w", err))
	}
	var n []int64
	for _, a := range va.Args {
		i, ok := toInt(a)
		if !ok {
			return st.failf("range() arguments must be integers, not %s", typeName(a))
		}
		n = append(n, i)
	}
	if len(va.KwArgs) != 0 || len(n) < 1 || len(n) > 3 {
		return st.failf("range() takes 1 to 3 integer arguments")
	}
	start, stop, step := int64(0), n[0], int64(1)
	if len(n) >= 2 {
		start, stop = n[0], n[1]
	}
	if len(n) == 3 {
		step = n[2]
	}
	if step == 0 {
		return st.failf("range() arg 3 must not be zero")
	}
	var count int64
	if step > 0 && stop > start {
		count = (stop-start-1)/step + 1
	} else if step < 0 && stop < start {
		count = (start-stop-1)/(-step) + 1
	}
	if count < 0 || count > maxRange {
		return st.failf("range too big: the sandbox blocks ranges larger than %d", maxRange)
	}
	out := make([]any, count)
	for i := range count {
		out[i] = start + i*step
	}
	return exec.AsValue(out)
}

func globalDict(_ *exec.Evaluator, va *exec.VarArgs) *exec.Value {
	out := make(map[string]any, len(va.KwArgs))
	for k, v := range va.KwArgs {
		out[k] = v.Interface()
	}
	if len(va.Args) > 0 {
		return exec.AsValue(fmt.Errorf("dict() only takes keyword arguments in pav templates"))
	}
	return exec.AsValue(out)
}

func globalNamespace(_ *exec.Evaluator, va *exec.VarArgs) *exec.Value {
	ns := &namespace{attrs: map[string]*exec.Value{}}
	for _, a := range va.Args {
		if kindOf(a) != kDict {
			return exec.AsValue(fmt.Errorf("namespace() positional arguments must be dicts"))
		}
		for _, it := range dictItems(a) {
			ns.attrs[pyStr(it.key)] = it.value
		}
	}
	for k, v := range va.KwArgs {
		ns.attrs[k] = v
	}
	return exec.AsValue(ns)
}

// get_pvc(name, namespace) asks Options.PVCs, with the caller's context.
func globalGetPVC(e *exec.Evaluator, va *exec.VarArgs) *exec.Value {
	st := stateOf(e)
	if st.pvcs == nil {
		return st.failf("get_pvc is not available here")
	}
	if len(va.Args)+len(va.KwArgs) != 2 {
		return st.failf("get_pvc() takes 2 arguments (name, namespace)")
	}
	args := map[string]*exec.Value{}
	for i, a := range va.Args {
		args[[]string{"name", "namespace"}[i]] = a
	}
	for k, a := range va.KwArgs {
		if k != "name" && k != "namespace" {
			return st.failf("get_pvc() got an unexpected keyword argument '%s'", k)
		}
		args[k] = a
	}
	name, ns := args["name"], args["namespace"]
	if kindOf(name) != kStr || kindOf(ns) != kStr {
		return st.failf("arguments to function get_pvc() must be strings")
	}
	obj, err := st.pvcs.GetPVC(st.ctx, resolved(ns).String(), resolved(name).String())
	if err != nil {
		return st.fail(fmt.Errorf("get_pvc(%s, %s): %w", strconv.Quote(resolved(name).String()), strconv.Quote(resolved(ns).String()), err))
	}
	if obj == nil {
		return st.failf("get_pvc(%q, %q): no such PersistentVolumeClaim", resolved(name).String(), resolved(ns).String())
	}
	return exec.AsValue(obj)
}

// guardSizes wraps a gonja filter or function whose integer arguments are
// sizes (center(width), indent(width), batch(n), lipsum(n), …), refusing
// sizes that would make it allocate without bound.
func guardSizes(name string, limit int64, f exec.FilterFunction) exec.FilterFunction {
	return func(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
		if err := checkSizes(name, limit, va); err != nil {
			return stateOf(e).fail(err)
		}
		return f(e, in, va)
	}
}

func checkSizes(name string, limit int64, va *exec.VarArgs) error {
	check := func(v *exec.Value) error {
		if kindOf(v) == kInt {
			if i, ok := toInt(v); !ok || i > limit || i < -limit {
				return fmt.Errorf("%s: argument %s is too large", name, pyStr(v))
			}
		}
		return nil
	}
	for _, a := range va.Args {
		if err := check(a); err != nil {
			return err
		}
	}
	for _, a := range va.KwArgs {
		if err := check(a); err != nil {
			return err
		}
	}
	return nil
}

// sizeMethods are gonja's str methods whose integer argument is a size (pav's
// own center, ljust, rjust and expandtabs bound theirs).
var sizeMethods = map[string]bool{"zfill": true}

// cycler is Jinja's cycler(items…): gonja's panics when called without
// items.
type cycler struct {
	items []*exec.Value
	pos   int
}

func globalCycler(_ *exec.Evaluator, va *exec.VarArgs) *exec.Value {
	if len(va.Args) == 0 || len(va.KwArgs) != 0 {
		return exec.AsValue(fmt.Errorf("cycler() needs at least one item"))
	}
	return exec.AsValue(&cycler{items: va.Args})
}

func (c *cycler) GetAttribute(name string) (*exec.Value, bool) {
	switch name {
	case "current":
		return c.items[c.pos], true
	case "next":
		return exec.AsValue(func() *exec.Value {
			v := c.items[c.pos]
			c.pos = (c.pos + 1) % len(c.items)
			return v
		}), true
	case "reset":
		return exec.AsValue(func() { c.pos = 0 }), true
	}
	return nil, false
}

// callScalarMethod calls one of gonja's str/int/float/bool methods, turning
// a panic (gonja's Python string emulation has some) into an error.
func callScalarMethod(m methodFunc, obj *exec.Value, va *exec.VarArgs, name string) (r any, err error) {
	defer func() {
		if p := recover(); p != nil {
			r, err = nil, fmt.Errorf("%s.%s() cannot handle these arguments (%v)", typeName(obj), name, p)
		}
	}()
	return m(obj, va)
}

// pav:test(name, args…) is `in is name(args…)`, failing when in failed.
// It calls the test itself, so that a test's error is the message (gonja
// wraps it in two layers of its own).
func filterTest(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	name := strArg(va, 0)
	args, err := testArgs(name, va.Args[1:], va.KwArgs)
	if err != nil {
		return stateOf(e).fail(err)
	}
	var ok bool
	switch fn, _ := e.Environment.Tests.Get(name); fn := fn.(type) {
	case func(*exec.Context, *exec.Value, *exec.VarArgs) (bool, error):
		ok, err = fn(e.Environment.Context, in, args)
	case func(*exec.Evaluator, *exec.Value, *exec.VarArgs) (bool, error):
		ok, err = fn(e, in, args)
	default:
		return e.ExecuteTestByName(name, in, args)
	}
	if err != nil {
		return stateOf(e).fail(err)
	}
	return exec.AsValue(ok)
}

// testParams names the parameter of Jinja's tests that take an argument
// besides the value (the comparison tests, Python's operator functions,
// take one positionally only); the others take none.
var testParams = map[string]string{
	"divisibleby": "num", "sameas": "other", "in": "seq",
	"eq": "", "equalto": "", "==": "", "ne": "", "!=": "", "lt": "", "lessthan": "", "<": "",
	"le": "", "<=": "", "gt": "", "greaterthan": "", ">": "", "ge": "", ">=": "",
}

// testArgs checks a test's arguments as Python would call Jinja's (gonja's
// tests ignore what they do not take: `x is defined(1)` answered), and
// passes a keyword argument positionally.
func testArgs(name string, args []*exec.Value, kwargs map[string]*exec.Value) (*exec.VarArgs, error) {
	param, takesOne := testParams[name]
	for k, v := range kwargs {
		if !takesOne || k != param || param == "" || len(args) > 0 {
			return nil, fmt.Errorf("test '%s' got an unexpected keyword argument '%s'", name, k)
		}
		args = []*exec.Value{v}
	}
	want := 0
	if takesOne {
		want = 1
	}
	if len(args) != want {
		return nil, fmt.Errorf("test '%s' takes %d argument(s) besides the value (%d given)", name, want, len(args))
	}
	return &exec.VarArgs{Args: args, KwArgs: map[string]*exec.Value{}}, nil
}

// strFilter wraps a gonja string filter: Jinja's take str() of their input
// (and replace of its first two arguments), where gonja's take its own
// rendering of them (None is "").
func strFilter(nArgs int, f exec.FilterFunction) exec.FilterFunction {
	return func(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
		if in.IsError() {
			return in
		}
		if kindOf(in) != kStr {
			in = exec.AsValue(pyStr(in))
		}
		if nArgs > 0 {
			args := slices.Clone(va.Args)
			for i := 0; i < nArgs && i < len(args); i++ {
				if kindOf(args[i]) != kStr && !args[i].IsError() {
					args[i] = exec.AsValue(pyStr(args[i]))
				}
			}
			va = &exec.VarArgs{Args: args, KwArgs: va.KwArgs}
		}
		return f(e, in, va)
	}
}

// numericFilter wraps gonja's int, float and abs, which turn Undefined, True
// (and abs anything) into 0: Jinja's int and float of Undefined fail (its
// __int__ and __float__ raise), and so does Python's abs() of anything but a
// number.
func numericFilter(name string, f exec.FilterFunction) exec.FilterFunction {
	return func(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
		if in.IsError() {
			return in
		}
		st := stateOf(e)
		switch k := kindOf(in); {
		case k == kUndefined && name != "abs":
			return st.fail(st.undefinedErr())
		case k == kBool: // int(True), abs(True) are 1, float(True) 1.0; gonja's are 0
			i, _ := toInt(in)
			if name == "float" {
				return exec.AsValue(float64(i))
			}
			return exec.AsValue(i)
		case name == "abs" && k != kInt && k != kFloat:
			return st.failf("bad operand type for abs(): '%s'", typeName(in))
		}
		return f(e, in, va)
	}
}

// pav:forcond records an error raised by a for loop's filter condition (see
// forControl) and stops the loop from using the item.
func filterForCond(e *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		if st := stateOf(e); st.loopFilterErr == nil {
			st.loopFilterErr = in.Interface().(error)
		}
		return exec.AsValue(false)
	}
	return in
}

var typeValuesList = reflect.TypeOf(exec.ValuesList{})

// pav:plain turns list, tuple and dict literals into []any and maps, the
// same shapes as context data. gonja's ValuesList and Dict have Go methods
// (Swap, Keys, …) that gonja's own attribute lookup in filters such as
// map(attribute=…) would expose. It also fails with the first item that
// failed: gonja keeps a failed item in the list (its dicts do fail), and
// `[x.y, 1] | join` printed the error as "<object>".
func filterPlain(e *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	rv := resolved(in)
	switch {
	case !rv.IsValid():
	case rv.Type() == typeValuesList:
		vl := rv.Interface().(exec.ValuesList)
		out := make([]any, len(vl))
		for i, v := range vl {
			if v.IsError() {
				return v
			}
			out[i] = v.Interface()
		}
		return exec.AsValue(out)
	case rv.Type() == exec.TypeDict:
		pairs := rv.Interface().(exec.Dict).Pairs
		strKeys := true
		for _, p := range pairs {
			switch kindOf(p.Key) {
			case kStr:
			case kNone, kBool, kInt, kFloat:
				strKeys = false
			default:
				return stateOf(e).failf("unhashable dict key of type '%s'", typeName(p.Key))
			}
		}
		if strKeys {
			out := make(map[string]any, len(pairs))
			for _, p := range pairs {
				out[resolved(p.Key).String()] = p.Value.Interface()
			}
			return exec.AsValue(out)
		}
		out := make(map[any]any, len(pairs))
		for _, p := range pairs {
			out[p.Key.Interface()] = p.Value.Interface()
		}
		return exec.AsValue(out)
	}
	return in
}
