// Package templating evaluates the Jinja templates of a PavProvisioner (spec
// §2): every string under spec is its own template, rendered with Jinja 3
// semantics as PaV configured them (trim_blocks, lstrip_blocks, no
// autoescape, an immutable sandbox, expressions that must evaluate to a
// string or a number, the tobash filter, get_pvc, and `{% set yaml = true %}`
// to parse the output as YAML).
//
// It is built on gonja v2 (lexer, parser, control structures and most
// filters), with a rewrite pass over gonja's AST that routes names,
// attribute and item access, method calls and operators through pav's own
// code (rewrite.go), because gonja's semantics differ from Jinja's in ways
// that would silently produce wrong values, and because gonja exposes Go
// methods and lets templates mutate their context.
package templating

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/nikolalohinski/gonja/v2/builtins"
	controlStructures "github.com/nikolalohinski/gonja/v2/builtins/control_structures"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
	"k8s.io/utils/lru"
)

// Vars is an evaluation context. Values are JSON-shaped: map[string]any,
// []any, string, int64, float64, bool, nil (k8s objects converted with
// runtime.DefaultUnstructuredConverter give exactly these; int is also
// accepted). Templates never modify it.
type Vars = map[string]any

// PVCGetter serves the get_pvc(name, namespace) template function: the
// claim as the API returns it (camelCase JSON map). A missing claim is an
// error.
type PVCGetter interface {
	GetPVC(ctx context.Context, namespace, name string) (map[string]any, error)
}

// Options configure an Engine.
type Options struct {
	PVCs PVCGetter // nil: get_pvc fails with "get_pvc is not available here"
}

// Engine evaluates templates. It is safe for concurrent use. Parsed
// templates are cached process-wide (keyed by source), so Engines are cheap.
type Engine struct {
	opts Options
}

// New returns an Engine.
func New(opts Options) *Engine {
	return &Engine{opts: opts}
}

// Error is every error Evaluate and Check return (and EvaluateString, with
// an empty Path): Path is the field path of the offending string, Err the
// cause. Err wraps the PVCGetter's error, or the context's, when one of
// those caused the failure, so errors.Is works through an *Error.
type Error struct {
	Path string
	Err  error
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Err.Error()
	}
	return e.Path + ": " + e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Evaluate returns a new tree in which every string (at any depth under maps
// and lists; map keys are never evaluated) is replaced by its evaluation as
// its own template with vars. The input is never mutated. path is the field
// path of value, used in errors, e.g. "spec.volumeCreation"; nested paths
// look like "spec.volumeCreation.podTemplate.spec.containers[0].command[2]".
// A string that evaluates (through yaml) to null yields nil in the tree
// (callers treat it as absent). Values other than JSON-shaped ones are an
// error.
func (e *Engine) Evaluate(ctx context.Context, value any, path string, vars Vars) (any, error) {
	out, err := e.evaluate(ctx, value, vars, 0)
	if err != nil {
		return nil, &Error{Path: err.pathFrom(path), Err: err.err}
	}
	return out, nil
}

// treeError is an error from evaluate with the path segments collected
// while unwinding: the path is only built when there is an error, since
// formatting paths for every field was a fifth of the cost of evaluating a
// pod template.
type treeError struct {
	segs []pathSeg // innermost first
	err  error
}

func (e *Engine) evaluate(ctx context.Context, value any, vars Vars, depth int) (any, *treeError) {
	if depth > maxDepth {
		return nil, &treeError{err: fmt.Errorf("value is nested too deeply")}
	}
	switch v := value.(type) {
	case string:
		if !IsTemplate(v) {
			if l := literal(v); l != v {
				return l, nil
			}
			return value, nil // no new allocation for the common case
		}
		out, err := e.evaluateString(ctx, v, vars)
		if err != nil {
			return nil, &treeError{err: err}
		}
		return out, nil
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			r, err := e.evaluate(ctx, x, vars, depth+1)
			if err != nil {
				err.segs = append(err.segs, pathSeg{key: k, index: -1})
				return nil, err
			}
			out[k] = r
		}
		return out, nil
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			r, err := e.evaluate(ctx, x, vars, depth+1)
			if err != nil {
				err.segs = append(err.segs, pathSeg{index: i})
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	case nil, bool, int, int32, int64, float32, float64, json.Number:
		return v, nil
	}
	return nil, &treeError{err: fmt.Errorf("unsupported value of type %T (expected JSON-shaped data)", value)}
}

type pathSeg struct {
	key   string
	index int // a list index, or -1 for a map key
}

// pathFrom builds the error's path below root.
func (e *treeError) pathFrom(root string) string {
	p := root
	for i := len(e.segs) - 1; i >= 0; i-- {
		if s := e.segs[i]; s.index >= 0 {
			p += "[" + strconv.Itoa(s.index) + "]"
		} else {
			p = joinKey(p, s.key)
		}
	}
	return p
}

// EvaluateString evaluates one template: a string, or, when the template
// sets yaml = true, the YAML-parsed value (nil for empty output), normalized
// as by Normalize. Errors are *Error with an empty Path.
func (e *Engine) EvaluateString(ctx context.Context, tmpl string, vars Vars) (any, error) {
	out, err := e.evaluateString(ctx, tmpl, vars)
	if err != nil {
		return nil, &Error{Err: err}
	}
	return out, nil
}

// Check parses (does not execute) every string under value, so that a
// PavProvisioner's templates can be checked when it is loaded; the error
// names the path of the first bad string. Besides syntax it reports unknown
// filters and tests, refused tags (include, import, from, extends) and
// values that are not JSON-shaped.
func Check(value any, path string) error {
	return check(value, path, 0)
}

func check(value any, path string, depth int) error {
	if depth > maxDepth {
		return &Error{Path: path, Err: fmt.Errorf("value is nested too deeply")}
	}
	switch v := value.(type) {
	case string:
		if !IsTemplate(v) {
			return nil
		}
		if _, err := compile(v); err != nil {
			return &Error{Path: path, Err: err}
		}
	case map[string]any:
		// Sorted, so that "the first bad string" is deterministic.
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if err := check(v[k], joinKey(path, k), depth+1); err != nil {
				return err
			}
		}
	case []any:
		for i, x := range v {
			if err := check(x, path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
				return err
			}
		}
	case nil, bool, int, int32, int64, float32, float64, json.Number:
	default:
		return &Error{Path: path, Err: fmt.Errorf("unsupported value of type %T (expected JSON-shaped data)", value)}
	}
	return nil
}

// joinKey appends a map key to a path: .key, or ["key"] when the key would
// be ambiguous (annotation keys contain dots and slashes).
func joinKey(path, key string) string {
	if !isPlainKey(key) {
		return path + "[" + strconv.Quote(key) + "]"
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// isPlainKey reports whether key matches [A-Za-z_][A-Za-z0-9_-]*.
func isPlainKey(key string) bool {
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || i > 0 && ('0' <= c && c <= '9' || c == '-')) {
			return false
		}
	}
	return key != ""
}

// IsTemplate reports whether s has any Jinja syntax (a {{, {% or {# opener),
// i.e. whether its value is only known once evaluated. Strings without it
// render as themselves (after newline normalization), which skips parsing
// and caching for the majority of pod-template strings.
func IsTemplate(s string) bool {
	return strings.Contains(s, "{{") || strings.Contains(s, "{%") || strings.Contains(s, "{#")
}

// literal is what Jinja renders for a string without template syntax: CRLF
// and CR become LF, and one trailing newline is dropped
// (keep_trailing_newline=False).
func literal(s string) string {
	if strings.ContainsRune(s, '\r') {
		s = strings.ReplaceAll(s, "\r\n", "\n")
		s = strings.ReplaceAll(s, "\r", "\n")
	}
	return strings.TrimSuffix(s, "\n")
}

func (e *Engine) evaluateString(ctx context.Context, src string, vars Vars) (any, error) {
	if !IsTemplate(src) {
		return literal(src), nil
	}
	tpl, err := compile(src)
	if err != nil {
		return nil, err
	}
	out, isYAML, err := e.render(ctx, tpl, vars)
	if err != nil {
		return nil, err
	}
	if !isYAML {
		return out, nil
	}
	v, err := parseYAML(out)
	if err != nil {
		return nil, fmt.Errorf("yaml = true, but %w", err)
	}
	return v, nil
}

// render executes a parsed template. It reports whether the template set
// yaml = true at top level.
func (e *Engine) render(ctx context.Context, t *template, vars Vars) (out string, isYAML bool, err error) {
	if ctx == nil {
		ctx = context.Background()
	}
	st := &renderState{ctx: ctx, pvcs: e.opts.PVCs}
	// Lookups go root → vars → globals: the template's own top-level
	// variables (and get_pvc, which PaV let win over context variables),
	// then vars, then the built-in functions (pav:var falls back to them;
	// chaining them under vars would mean copying vars on every render).
	// vars is wrapped, never written: set writes into the renderer's own
	// context.
	root := exec.NewContext(vars).Inherit()
	root.Set(stateKey, st)
	root.Set("get_pvc", globalGetPVC)
	env := &exec.Environment{
		Filters:           filters,
		Tests:             tests,
		ControlStructures: controls,
		Methods:           noMethods,
		Context:           root,
	}

	var b strings.Builder
	defer func() {
		// gonja panics on some inputs (and pav's code might); a template
		// must never take the driver down.
		if p := recover(); p != nil {
			out, isYAML = "", false
			err = newTemplateError("template error", fmt.Sprintf("internal error: %v", p), "", nil)
		}
	}()
	r := exec.NewRenderer(env, &limitedWriter{w: &b}, renderConfig, noLoader{}, t.tpl)
	if err := r.Execute(); err != nil {
		return "", false, renderError(err, st)
	}

	// Only the template's own top-level variables count (as in PaV, which
	// read them from the template module): copy the root context's own data.
	if !t.mentionsYAML {
		return b.String(), false, nil
	}
	own := exec.EmptyContext().Update(root)
	if y, ok := own.Get("yaml"); ok {
		yv := exec.ToValue(y)
		if kindOf(yv) != kBool {
			return "", false, newTemplateError("template error",
				fmt.Sprintf("yaml must be set to true or false, not to a value of type %s", typeName(yv)), "", nil)
		}
		isYAML = resolved(yv).Bool()
	}
	return b.String(), isYAML, nil
}

// ---- environment (shared, read-only after init) ----

var (
	renderConfig = func() *config.Config {
		c := config.New()
		c.TrimBlocks = true
		c.LeftStripBlocks = true
		c.AutoEscape = false
		c.KeepTrailingNewline = false
		// Strict mode only matters where pav did not rewrite a name; there
		// it makes an unknown variable an error rather than a silent None.
		c.StrictUndefined = true
		return c
	}()

	filters  = exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	tests    = exec.NewTestSet(map[string]exec.TestFunction{}).Update(builtins.Tests)
	controls = exec.NewControlStructureSet(map[string]parser.ControlStructureParser{})
	// globals are the built-in functions, looked up by pav:var when a name
	// is not in the render's context.
	globals = exec.NewContext(map[string]any{})

	// Method calls never reach gonja (pav:method dispatches them), but its
	// environment needs method sets; empty ones fail closed.
	noMethods = exec.Methods{
		Bool:  exec.NewMethodSet(map[string]exec.Method[bool]{}),
		Int:   exec.NewMethodSet(map[string]exec.Method[int]{}),
		Float: exec.NewMethodSet(map[string]exec.Method[float64]{}),
		Str:   exec.NewMethodSet(map[string]exec.Method[string]{}),
		Dict:  exec.NewMethodSet(map[string]exec.Method[map[string]any]{}),
		List:  exec.NewMethodSet(map[string]exec.Method[[]any]{}),
	}

	// gonja's methods of immutable types, called by pav:method.
	methodsStr   = builtins.Methods.Str
	methodsInt   = builtins.Methods.Int
	methodsFloat = builtins.Methods.Float
	methodsBool  = builtins.Methods.Bool
)

func init() {
	// gonja's filters panic on some inputs, and map('nosuchfilter') returns a
	// list of errors; safeFilter turns both into an error naming the filter.
	for _, name := range gonjaFilters {
		if f, ok := filters.Get(name); ok {
			_ = filters.Replace(name, safeFilter(name, f))
		}
	}

	set := func(name string, f exec.FilterFunction) {
		if filters.Exists(name) {
			_ = filters.Replace(name, f)
		} else {
			_ = filters.Register(name, f)
		}
	}
	for name, f := range map[string]exec.FilterFunction{
		fVar: filterVar, fUndef: filterUndef, fGetattr: filterGetattr, fGetitem: filterGetitem,
		fMethod: filterMethod, fCallable: filterCallable, fBinop: filterBinop, fNot: filterNot,
		fNeg: filterUnary(true), fPos: filterUnary(false), fBool: filterBool,
		fIterable: filterIterable, fFinalize: filterFinalize, fForCond: filterForCond, fPlain: filterPlain, fBranch: filterBranch, fTest: filterTest, fCompare: filterCompare,
		"tobash": filterToBash, "tojson": filterToJSON, "default": filterDefault, "d": filterDefault,
		"string": filterString, "reverse": filterReverse, "attr": filterAttr, "format": filterFormat,
		"wordcount": filterWordcount, "center": filterCenter, "urlencode": filterURLEncode, "round": filterRound,
		"min": filterMinMax(false), "max": filterMinMax(true), "join": filterJoin, "pprint": filterPprint,
	} {
		set(name, f)
	}

	for name, t := range map[string]exec.TestFunction{
		"defined": testDefined, "undefined": testUndefined, "none": testNone, "in": testIn,
		"odd": modTest(2, 1), "even": modTest(2, 0), "divisibleby": modTest(0, 0),
		"number": testNumber, "sequence": testSequence,
		"eq": compareTest("=="), "equalto": compareTest("=="), "==": compareTest("=="),
		"ne": compareTest("!="), "!=": compareTest("!="),
		"lt": compareTest("<"), "lessthan": compareTest("<"), "<": compareTest("<"),
		"le": compareTest("<="), "<=": compareTest("<="),
		"gt": compareTest(">"), "greaterthan": compareTest(">"), ">": compareTest(">"),
		"ge": compareTest(">="), ">=": compareTest(">="),
		"escaped": testEscaped, "filter": nameTest(filters.Exists), "test": nameTest(tests.Exists),
		"sameas": sameasTest(gonjaTest("sameas")),
	} {
		_ = tests.Replace(name, t)
	}

	// Jinja 3's built-in tags, minus those that load templates. do, break,
	// continue and trans are extensions Jinja does not enable by default.
	for _, name := range []string{"if", "for", "raw", "block", "call"} {
		p, ok := controlStructures.All.Get(name)
		if !ok {
			panic("gonja has no " + name + " tag")
		}
		_ = controls.Register(name, p)
	}
	_ = controls.Register("set", parseSet)
	_ = controls.Register("with", parseWith)
	_ = controls.Register("filter", parseFilterBlock)
	_ = controls.Register("macro", parseMacro)
	_ = controls.Register("autoescape", parseAutoescape)
	for _, name := range []string{"include", "import", "from", "extends"} {
		_ = controls.Register(name, refuse(name))
	}

	for name, limit := range map[string]int64{"indent": 1000, "wordwrap": maxStringBytes,
		"truncate": maxStringBytes, "batch": maxRange, "slice": maxRange} {
		f, _ := filters.Get(name)
		set(name, guardSizes(name, limit, f))
	}
	for name, nArgs := range map[string]int{"upper": 0, "lower": 0, "capitalize": 0, "title": 0, "trim": 0,
		"striptags": 0, "replace": 2} {
		f, _ := filters.Get(name)
		set(name, strFilter(nArgs, f))
	}
	for _, name := range []string{"int", "float", "abs"} {
		f, _ := filters.Get(name)
		set(name, numericFilter(name, f))
	}

	globals.Set("cycler", globalCycler)
	for _, name := range []string{"joiner"} {
		f, ok := builtins.GlobalFunctions.Get(name)
		if !ok {
			panic("gonja has no " + name + " function")
		}
		globals.Set(name, f)
	}
	lipsum, _ := builtins.GlobalFunctions.Get("lipsum")
	lipsumFn := lipsum.(func(*exec.Evaluator, *exec.VarArgs) *exec.Value)
	globals.Set("lipsum", func(e *exec.Evaluator, va *exec.VarArgs) *exec.Value {
		if err := checkSizes("lipsum", 1000, va); err != nil {
			return stateOf(e).fail(err)
		}
		return lipsumFn(e, va)
	})
	globals.Set("range", globalRange)
	globals.Set("dict", globalDict)
	globals.Set("namespace", globalNamespace)
	globals.Set("get_pvc", globalGetPVC)
}

// gonjaTest is gonja's test of that name.
func gonjaTest(name string) exec.TestFunction {
	t, ok := builtins.Tests.Get(name)
	if !ok {
		panic("gonja has no test " + name)
	}
	return t
}

// gonjaFilters lists gonja v2.9.1's filters (FilterSet cannot be listed).
var gonjaFilters = []string{
	"abs", "attr", "batch", "capitalize", "center", "default", "d", "dictsort", "e", "escape",
	"filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent", "int", "join",
	"items", "last", "length", "count", "list", "lower", "map", "max", "min", "pprint", "random",
	"rejectattr", "reject", "replace", "reverse", "round", "safe", "selectattr", "select", "slice",
	"sort", "string", "striptags", "sum", "title", "tojson", "trim", "truncate", "unique", "upper",
	"urlencode", "urlize", "wordcount", "wordwrap", "xmlattr",
}

// safeFilter wraps a gonja filter: a panic becomes an error naming the
// filter, and so does an error value that the filter collected into a list
// (map('nosuchfilter') returns a list of errors).
func safeFilter(name string, f exec.FilterFunction) exec.FilterFunction {
	return func(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) (out *exec.Value) {
		defer func() {
			if p := recover(); p != nil {
				out = stateOf(e).failf("filter '%s' cannot handle this input (%v)", name, p)
			}
		}()
		out = f(e, in, va)
		if !out.IsError() && kindOf(out) == kList {
			for _, x := range listItems(out) {
				if x.IsError() {
					return x
				}
			}
		}
		return out
	}
}

// ---- parsing and the template cache ----

const rootID = "pav-template"

// sourceLoader serves exactly one template, the one being parsed. It is
// never asked for anything else (the tags that load templates are refused),
// and would refuse if it were.
type sourceLoader struct{ src string }

func (l sourceLoader) Read(id string) (io.Reader, error) {
	if id != rootID {
		return nil, fmt.Errorf("pav templates cannot load other templates")
	}
	return strings.NewReader(l.src), nil
}

func (l sourceLoader) Resolve(id string) (string, error) { return id, nil }

func (l sourceLoader) Inherit(string) (loaders.Loader, error) {
	return nil, fmt.Errorf("pav templates cannot load other templates")
}

// noLoader is the renderer's loader: it loads nothing.
type noLoader struct{}

func (noLoader) Read(string) (io.Reader, error) {
	return nil, fmt.Errorf("pav templates cannot load other templates")
}
func (noLoader) Resolve(id string) (string, error) { return id, nil }
func (noLoader) Inherit(string) (loaders.Loader, error) {
	return nil, fmt.Errorf("pav templates cannot load other templates")
}

// template is a parsed and rewritten template.
type template struct {
	tpl *exec.Template
	// mentionsYAML is false when the source cannot set yaml, which saves
	// looking for it after rendering.
	mentionsYAML bool
}

type compiled struct {
	t   *template
	err error
}

// cacheSize bounds the parsed-template cache. Only strings with template
// syntax are cached; a provisioner has a few dozen.
const cacheSize = 2048

// cache holds parse results (failures too: a broken template is checked on
// every update of its provisioner) by source; lru.Cache is safe for concurrent use.
var cache = lru.New(cacheSize)

func compile(src string) (*template, error) {
	if v, ok := cache.Get(src); ok {
		c := v.(compiled)
		return c.t, c.err
	}
	var t *template
	tpl, err := parse(src)
	if err == nil {
		t = &template{tpl: tpl, mentionsYAML: strings.Contains(src, "yaml")}
	}
	cache.Add(src, compiled{t, err})
	return t, err
}

func parse(src string) (tpl *exec.Template, err error) {
	defer func() {
		if p := recover(); p != nil {
			// gonja's parser dereferences nil on some malformed input
			// ("{% if 0 is %}"). Such a template is rejected like any other
			// unparsable one.
			tpl, err = nil, newTemplateError("template syntax error", fmt.Sprintf("cannot parse this template (parser failure: %v)", p), "", nil)
		}
	}()
	if err := checkNesting(src); err != nil {
		return nil, err
	}
	// gonja's parser reads pav's tokens (see tokenpass.go), and the template
	// gonja builds around an empty source gets the parsed tree: exec.Template
	// has no constructor that takes tokens or a tree, and nothing but its
	// root refers to what it parsed.
	lexed, err := lexTemplate(src)
	if err != nil {
		return nil, err
	}
	root, err := parser.NewParser(rootID, tokens.NewStream(lexed.toks), renderConfig, sourceLoader{src}, controls).Parse()
	if err != nil {
		return nil, syntaxError(err)
	}
	env := &exec.Environment{Filters: filters, Tests: tests, ControlStructures: controls, Methods: noMethods, Context: globals}
	tpl, err = exec.NewTemplate(rootID, renderConfig, sourceLoader{""}, env)
	if err != nil {
		return nil, syntaxError(err)
	}
	*tpl.Root() = *root
	rw := &rewriter{filters: filters, tests: tests, wrappers: map[*nodes.Wrapper]bool{}, groups: lexed.groups, testNames: lexed.tests, nots: lexed.nots, signs: lexed.signs}
	if err := rw.template(tpl.Root()); err != nil {
		return nil, err
	}
	return tpl, nil
}

// checkNesting refuses sources whose brackets nest deeper than maxNesting
// before gonja's recursive-descent parser sees them (see maxNesting).
func checkNesting(src string) error {
	depth, line := 0, 1
	for i := 0; i < len(src); i++ {
		switch src[i] {
		case '(', '[', '{':
			depth++
			if depth > maxNesting {
				return newTemplateError("template syntax error", "brackets are nested too deeply", strconv.Itoa(line), nil)
			}
		case ')', ']', '}':
			if depth > 0 {
				depth--
			}
		case '\n':
			line++
		}
	}
	return nil
}
