package templating

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// Python str methods and Jinja filters that gonja gets wrong. Each was
// found by TestDifferentialPaV (pav vs. PaV's Python implementation):
// gonja's split() and ljust() fail without their optional argument,
// split/rsplit ignore maxsplit, replace requires count, count() and center()
// compute differently, index() is missing, wordcount, urlencode, round,
// min/max(attribute=…), pprint and join(attribute=…) differ from Jinja.

// pyStrMethods replace gonja's methods of the same name.
var pyStrMethods = map[string]func(s string, va *exec.VarArgs) (any, error){
	"split":      func(s string, va *exec.VarArgs) (any, error) { return pySplit(s, va, false) },
	"rsplit":     func(s string, va *exec.VarArgs) (any, error) { return pySplit(s, va, true) },
	"replace":    pyReplace,
	"count":      pyCount,
	"find":       func(s string, va *exec.VarArgs) (any, error) { return pyFind(s, va, false, false) },
	"rfind":      func(s string, va *exec.VarArgs) (any, error) { return pyFind(s, va, true, false) },
	"index":      func(s string, va *exec.VarArgs) (any, error) { return pyFind(s, va, false, true) },
	"rindex":     func(s string, va *exec.VarArgs) (any, error) { return pyFind(s, va, true, true) },
	"ljust":      func(s string, va *exec.VarArgs) (any, error) { return pyJustify(s, va, "ljust") },
	"rjust":      func(s string, va *exec.VarArgs) (any, error) { return pyJustify(s, va, "rjust") },
	"center":     func(s string, va *exec.VarArgs) (any, error) { return pyJustify(s, va, "center") },
	"expandtabs": pyExpandTabs,
}

// pyArgs binds positional and keyword arguments to parameter names; missing
// optional ones are nil.
func pyArgs(method string, va *exec.VarArgs, required int, names ...string) ([]*exec.Value, error) {
	if len(va.Args) > len(names) {
		return nil, fmt.Errorf("%s() takes at most %d arguments (%d given)", method, len(names), len(va.Args))
	}
	out := make([]*exec.Value, len(names))
	copy(out, va.Args)
	for k, v := range va.KwArgs {
		i := -1
		for j, n := range names {
			if n == k {
				i = j
			}
		}
		if i < 0 || out[i] != nil {
			return nil, fmt.Errorf("%s() got an unexpected keyword argument '%s'", method, k)
		}
		out[i] = v
	}
	for i := range required {
		if out[i] == nil {
			return nil, fmt.Errorf("%s() missing required argument '%s'", method, names[i])
		}
	}
	return out, nil
}

func argString(method string, v *exec.Value) (string, error) {
	if kindOf(v) != kStr {
		return "", fmt.Errorf("%s() argument must be str, not %s", method, typeName(v))
	}
	return resolved(v).String(), nil
}

func argInt(method string, v *exec.Value, def int64) (int64, error) {
	if v == nil || kindOf(v) == kNone {
		return def, nil
	}
	i, ok := toInt(v)
	if !ok {
		return 0, fmt.Errorf("%s() argument must be an integer, not %s", method, typeName(v))
	}
	return i, nil
}

func pySplit(s string, va *exec.VarArgs, fromRight bool) (any, error) {
	method := "split"
	if fromRight {
		method = "rsplit"
	}
	args, err := pyArgs(method, va, 0, "sep", "maxsplit")
	if err != nil {
		return nil, err
	}
	maxsplit, err := argInt(method, args[1], -1)
	if err != nil {
		return nil, err
	}
	var parts []string
	if args[0] == nil || kindOf(args[0]) == kNone {
		parts = splitWhitespace(s, maxsplit, fromRight)
	} else {
		sep, err := argString(method, args[0])
		if err != nil {
			return nil, err
		}
		if sep == "" {
			return nil, fmt.Errorf("empty separator")
		}
		switch {
		case maxsplit < 0:
			parts = strings.Split(s, sep)
		case !fromRight:
			parts = strings.SplitN(s, sep, int(min(maxsplit, int64(len(s))))+1)
		default:
			for range maxsplit {
				i := strings.LastIndex(s, sep)
				if i < 0 {
					break
				}
				parts = append(parts, s[i+len(sep):])
				s = s[:i]
			}
			parts = append(parts, s)
			for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
				parts[i], parts[j] = parts[j], parts[i]
			}
		}
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

// splitWhitespace is Python's split() without a separator: runs of
// whitespace separate, leading and trailing whitespace is ignored, and the
// last part keeps its whitespace when maxsplit stops the splitting.
func splitWhitespace(s string, maxsplit int64, fromRight bool) []string {
	if !fromRight {
		var parts []string
		for {
			s = strings.TrimLeftFunc(s, unicode.IsSpace)
			if s == "" {
				return parts
			}
			if maxsplit >= 0 && int64(len(parts)) == maxsplit {
				return append(parts, s)
			}
			i := strings.IndexFunc(s, unicode.IsSpace)
			if i < 0 {
				return append(parts, s)
			}
			parts = append(parts, s[:i])
			s = s[i:]
		}
	}
	var rev []string
	for {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
		if s == "" {
			break
		}
		if maxsplit >= 0 && int64(len(rev)) == maxsplit {
			rev = append(rev, s)
			break
		}
		i := strings.LastIndexFunc(s, unicode.IsSpace)
		if i < 0 {
			rev = append(rev, s)
			break
		}
		_, size := decodeRuneAt(s, i)
		rev = append(rev, s[i+size:])
		s = s[:i]
	}
	for i, j := 0, len(rev)-1; i < j; i, j = i+1, j-1 {
		rev[i], rev[j] = rev[j], rev[i]
	}
	return rev
}

func decodeRuneAt(s string, i int) (rune, int) {
	for j, r := range s[i:] {
		if j == 0 {
			return r, len(string(r))
		}
	}
	return 0, 1
}

func pyReplace(s string, va *exec.VarArgs) (any, error) {
	args, err := pyArgs("replace", va, 2, "old", "new", "count")
	if err != nil {
		return nil, err
	}
	old, err := argString("replace", args[0])
	if err != nil {
		return nil, err
	}
	repl, err := argString("replace", args[1])
	if err != nil {
		return nil, err
	}
	count, err := argInt("replace", args[2], -1)
	if err != nil {
		return nil, err
	}
	if count > int64(len(s))+1 {
		count = -1
	}
	n := strings.Count(s, old)
	if count >= 0 && int64(n) > count {
		n = int(count)
	}
	if len(s)+n*(len(repl)-len(old)) > maxStringBytes {
		return nil, errTooLarge
	}
	return strings.Replace(s, old, repl, int(count)), nil
}

// runeRange applies Python's start/end slice arguments to s, returning the
// slice and the code point offset of its start.
func runeRange(method string, s string, startV, endV *exec.Value) ([]rune, int, error) {
	r := []rune(s)
	n := int64(len(r))
	start, err := argInt(method, startV, 0)
	if err != nil {
		return nil, 0, err
	}
	end, err := argInt(method, endV, n)
	if err != nil {
		return nil, 0, err
	}
	clamp := func(i int64) int64 {
		if i < 0 {
			i += n
		}
		return max(0, min(i, n))
	}
	start, end = clamp(start), clamp(end)
	if end < start {
		return nil, -1, nil
	}
	return r[start:end], int(start), nil
}

func pyCount(s string, va *exec.VarArgs) (any, error) {
	args, err := pyArgs("count", va, 1, "sub", "start", "end")
	if err != nil {
		return nil, err
	}
	sub, err := argString("count", args[0])
	if err != nil {
		return nil, err
	}
	r, off, err := runeRange("count", s, args[1], args[2])
	if err != nil {
		return nil, err
	}
	if off < 0 {
		return int64(0), nil
	}
	return int64(strings.Count(string(r), sub)), nil
}

func pyFind(s string, va *exec.VarArgs, fromRight, mustFind bool) (any, error) {
	method := map[[2]bool]string{{false, false}: "find", {true, false}: "rfind", {false, true}: "index", {true, true}: "rindex"}[[2]bool{fromRight, mustFind}]
	args, err := pyArgs(method, va, 1, "sub", "start", "end")
	if err != nil {
		return nil, err
	}
	sub, err := argString(method, args[0])
	if err != nil {
		return nil, err
	}
	r, off, err := runeRange(method, s, args[1], args[2])
	if err != nil {
		return nil, err
	}
	i := -1
	if off >= 0 {
		hay := string(r)
		bi := strings.Index(hay, sub)
		if fromRight {
			bi = strings.LastIndex(hay, sub)
		}
		if bi >= 0 {
			i = off + len([]rune(hay[:bi])) // code points, as Python counts
		}
	}
	if i < 0 && mustFind {
		return nil, fmt.Errorf("substring not found")
	}
	return int64(i), nil
}

func pyJustify(s string, va *exec.VarArgs, how string) (any, error) {
	args, err := pyArgs(how, va, 1, "width", "fillchar")
	if err != nil {
		return nil, err
	}
	width, err := argInt(how, args[0], 0)
	if err != nil {
		return nil, err
	}
	fill := " "
	if args[1] != nil {
		if fill, err = argString(how, args[1]); err != nil {
			return nil, err
		}
		if len([]rune(fill)) != 1 {
			return nil, fmt.Errorf("the fill character must be exactly one character long")
		}
	}
	return justify(s, width, fill, how)
}

func justify(s string, width int64, fill, how string) (string, error) {
	n := int64(len([]rune(s)))
	if width <= n {
		return s, nil
	}
	if width > maxStringBytes {
		return "", errTooLarge
	}
	marg := width - n
	var left int64
	switch how {
	case "rjust":
		left = marg
	case "center":
		left = marg/2 + (marg & width & 1) // CPython's formula
	}
	return strings.Repeat(fill, int(left)) + s + strings.Repeat(fill, int(marg-left)), nil
}

func pyExpandTabs(s string, va *exec.VarArgs) (any, error) {
	args, err := pyArgs("expandtabs", va, 0, "tabsize")
	if err != nil {
		return nil, err
	}
	size, err := argInt("expandtabs", args[0], 8)
	if err != nil {
		return nil, err
	}
	if size > 1000 {
		return nil, errTooLarge
	}
	var b strings.Builder
	col := int64(0)
	for _, r := range s {
		switch r {
		case '\t':
			if size > 0 {
				pad := size - col%size
				b.WriteString(strings.Repeat(" ", int(pad)))
				col += pad
			}
		case '\n', '\r':
			b.WriteRune(r)
			col = 0
		default:
			b.WriteRune(r)
			col++
		}
		if b.Len() > maxStringBytes {
			return nil, errTooLarge
		}
	}
	return b.String(), nil
}

// ---- filters ----

var wordRE = regexp.MustCompile(`[\p{L}\p{N}_]+`)

// wordcount counts \w+ runs, as Jinja does with Python's Unicode \w.
func filterWordcount(e *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	return exec.AsValue(int64(len(wordRE.FindAllStringIndex(pyStr(in), -1))))
}

// center(width=80).
func filterCenter(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	args, err := pyArgs("center", va, 0, "width")
	if err != nil {
		return st.fail(err)
	}
	width, err := argInt("center", args[0], 80)
	if err != nil {
		return st.fail(err)
	}
	s, err := justify(pyStr(in), width, " ", "center")
	if err != nil {
		return st.fail(err)
	}
	return exec.AsValue(s)
}

// pyQuote is Python's urllib.parse.quote: everything but unreserved
// characters and safe is percent-encoded (UTF-8, upper-case hex).
func pyQuote(s, safe string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("_.-~", c) >= 0 || strings.IndexByte(safe, c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// urlencode: a string is quoted (keeping /); a dict or a list of pairs
// becomes a query string.
func filterURLEncode(e *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	forQS := func(v *exec.Value) string {
		return strings.ReplaceAll(pyQuote(pyStr(v), ""), "%20", "+")
	}
	var pairs [][2]*exec.Value
	switch kindOf(in) {
	case kStr, kInt, kFloat, kBool, kNone:
		return exec.AsValue(pyQuote(pyStr(in), "/"))
	case kDict:
		for _, it := range dictItems(in) {
			pairs = append(pairs, [2]*exec.Value{it.key, it.value})
		}
	case kList:
		for _, it := range listItems(in) {
			if kindOf(it) != kList || len(listItems(it)) != 2 {
				return st.failf("urlencode expects a string, a dict or a list of pairs")
			}
			kv := listItems(it)
			pairs = append(pairs, [2]*exec.Value{kv[0], kv[1]})
		}
	default:
		return st.failf("urlencode expects a string, a dict or a list of pairs, not %s", typeName(in))
	}
	parts := make([]string, len(pairs))
	for i, p := range pairs {
		parts[i] = forQS(p[0]) + "=" + forQS(p[1])
	}
	return exec.AsValue(strings.Join(parts, "&"))
}

// round(precision=0, method='common'): 'common' is Python's round (half to
// even on the exact binary value, which strconv's correctly rounded
// formatting gives); int input stays int.
func filterRound(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	args, err := pyArgs("round", va, 0, "precision", "method")
	if err != nil {
		return st.fail(err)
	}
	prec, err := argInt("round", args[0], 0)
	if err != nil || prec < -300 || prec > 300 {
		return st.failf("round: bad precision")
	}
	method := "common"
	if args[1] != nil {
		method = pyStr(args[1])
	}
	if method != "common" && method != "ceil" && method != "floor" {
		return st.failf("method must be common, ceil or floor")
	}
	if kindOf(in) == kInt && method == "common" && prec >= 0 {
		return in
	}
	f, ok := toFloat(in)
	if !ok {
		return st.failf("round expects a number, not %s", typeName(in))
	}
	switch method {
	case "common":
		if prec >= 0 {
			r, _ := strconv.ParseFloat(strconv.FormatFloat(f, 'f', int(prec), 64), 64)
			return exec.AsValue(r)
		}
		p := math.Pow(10, float64(-prec))
		return exec.AsValue(math.RoundToEven(f/p) * p)
	case "ceil":
		p := math.Pow(10, float64(prec))
		return exec.AsValue(math.Ceil(f*p) / p)
	}
	p := math.Pow(10, float64(prec))
	return exec.AsValue(math.Floor(f*p) / p)
}

// aggregateKey returns the key Jinja's min/max/join compare or print an
// item by: its attribute (dotted path, Undefined when missing) and, unless
// case-sensitive, strings lower-cased.
func aggregateKey(item *exec.Value, attribute *exec.Value, caseSensitive bool) *exec.Value {
	k := item
	if attribute != nil && kindOf(attribute) != kNone {
		k = attrPath(item, attribute)
	}
	if !caseSensitive && kindOf(k) == kStr {
		return exec.AsValue(strings.ToLower(resolved(k).String()))
	}
	return k
}

// attrPath is Jinja's make_attrgetter: a dotted path of items or
// attributes (integer parts index lists).
func attrPath(item, attribute *exec.Value) *exec.Value {
	if kindOf(attribute) == kInt {
		if v, ok := getItem(item, attribute); ok {
			return v
		}
		return undefinedValue()
	}
	v := item
	for _, part := range strings.Split(pyStr(attribute), ".") {
		var key *exec.Value = exec.AsValue(part)
		if n, err := strconv.ParseInt(part, 10, 64); err == nil {
			key = exec.AsValue(n)
		}
		next, ok := getItem(v, key)
		if !ok {
			if next, ok = getAttr(v, part); !ok {
				return undefinedValue()
			}
		}
		v = next
	}
	return v
}

func filterMinMax(isMax bool) exec.FilterFunction {
	name := "min"
	if isMax {
		name = "max"
	}
	return func(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
		if in.IsError() {
			return in
		}
		st := stateOf(e)
		args, err := pyArgs(name, va, 0, "case_sensitive", "attribute")
		if err != nil {
			return st.fail(err)
		}
		caseSensitive := args[0] != nil && truthy(args[0])
		items, ok := pyIter(in)
		if !ok {
			return st.failf("'%s' object is not iterable", typeName(in))
		}
		if len(items) == 0 {
			return st.undefinedMsg("No aggregated item, sequence was empty.")
		}
		best, bestKey := items[0], aggregateKey(items[0], args[1], caseSensitive)
		for _, it := range items[1:] {
			k := aggregateKey(it, args[1], caseSensitive)
			c, err := compare(k, bestKey)
			if err != nil {
				return st.fail(err)
			}
			if (isMax && c > 0) || (!isMax && c < 0) {
				best, bestKey = it, k
			}
		}
		return best
	}
}

// join(d=”, attribute=None): Undefined items join as "" and None as
// "None", as str() does.
func filterJoin(e *exec.Evaluator, in *exec.Value, va *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	st := stateOf(e)
	args, err := pyArgs("join", va, 0, "d", "attribute")
	if err != nil {
		return st.fail(err)
	}
	sep := ""
	if args[0] != nil {
		sep = pyStr(args[0])
	}
	items, ok := pyIter(in)
	if !ok {
		return st.failf("can only join an iterable, not %s", typeName(in))
	}
	var b strings.Builder
	for i, it := range items {
		if i > 0 {
			b.WriteString(sep)
		}
		if args[1] != nil {
			it = attrPath(it, args[1])
		}
		b.WriteString(pyStr(it))
		if b.Len() > maxStringBytes {
			return st.fail(errTooLarge)
		}
	}
	return exec.AsValue(b.String())
}

// pprint is Python's repr for the short values templates print.
func filterPprint(e *exec.Evaluator, in *exec.Value, _ *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	return exec.AsValue(pyRepr(in, 0))
}

// pyIter is Python's iteration of a value: a list's items, a dict's keys, a
// string's characters, nothing for Undefined. ok is false for what Python
// cannot iterate (numbers, booleans, None).
func pyIter(in *exec.Value) (items []*exec.Value, ok bool) {
	switch kindOf(in) {
	case kList:
		return listItems(in), true
	case kDict:
		for _, it := range dictItems(in) {
			items = append(items, it.key)
		}
		return items, true
	case kStr:
		for _, r := range resolved(in).String() {
			items = append(items, exec.AsValue(string(r)))
		}
		return items, true
	case kUndefined:
		return nil, true
	}
	return nil, false
}
