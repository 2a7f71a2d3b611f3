package templating

import (
	"fmt"
	"math"
	"math/bits"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// This file gives gonja values Python (Jinja) semantics: what kind of Python
// object a value stands for, str(), repr(), truthiness, equality, ordering and
// the arithmetic operators. gonja's own versions coerce silently (None + 1 is
// 1, 2 ** 10 is 1024.0, not 1 is 0, 'a' * -1 panics), which would turn template
// bugs into wrong pod specs instead of errors.

// undefinedT marks Jinja's Undefined. The value used is a typed nil pointer:
// gonja sees it as nil (falsy, empty when iterated, "" when printed by its own
// filters), yet pav can tell it apart from None, which Jinja also does
// (`x is defined` is true for a variable holding None).
type undefinedT struct{ _ byte }

var undefinedType = reflect.TypeOf((*undefinedT)(nil))

func undefinedValue() *exec.Value {
	return &exec.Value{Val: reflect.ValueOf((*undefinedT)(nil))}
}

func isUndefined(v *exec.Value) bool {
	return v != nil && v.Val.IsValid() && v.Val.Type() == undefinedType
}

// namespace is what namespace() returns: the only object whose attributes a
// template may assign ({% set ns.x = 1 %}), as in Jinja.
type namespace struct {
	attrs map[string]*exec.Value
}

// kind is the Python type a value stands for.
type kind int

const (
	kUndefined kind = iota
	kNone
	kBool
	kInt
	kFloat
	kStr
	kList
	kDict
	kNamespace
	kCallable
	kOther
)

// resolved returns the reflect value behind v, through one pointer, as gonja
// does internally.
func resolved(v *exec.Value) reflect.Value {
	rv := v.Val
	if rv.IsValid() && rv.Kind() == reflect.Pointer {
		return rv.Elem()
	}
	return rv
}

func kindOf(v *exec.Value) kind {
	if v == nil {
		return kNone
	}
	if isUndefined(v) {
		return kUndefined
	}
	if v.Val.IsValid() && v.Val.Type() == reflect.TypeOf((*namespace)(nil)) {
		return kNamespace
	}
	rv := resolved(v)
	if !rv.IsValid() {
		return kNone
	}
	switch rv.Kind() {
	case reflect.Bool:
		return kBool
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return kInt
	case reflect.Float32, reflect.Float64:
		return kFloat
	case reflect.String:
		return kStr
	case reflect.Slice, reflect.Array:
		return kList
	case reflect.Map:
		return kDict
	case reflect.Struct:
		if rv.Type() == exec.TypeDict {
			return kDict
		}
	case reflect.Func:
		return kCallable
	}
	return kOther
}

func typeName(v *exec.Value) string {
	switch kindOf(v) {
	case kUndefined:
		return "Undefined"
	case kNone:
		return "NoneType"
	case kBool:
		return "bool"
	case kInt:
		return "int"
	case kFloat:
		return "float"
	case kStr:
		return "str"
	case kList:
		return "list"
	case kDict:
		return "dict"
	case kNamespace:
		return "Namespace"
	case kCallable:
		return "function"
	}
	return "object"
}

// toInt returns an int or bool value as int64 (Python's bool is an int).
func toInt(v *exec.Value) (int64, bool) {
	rv := resolved(v)
	if !rv.IsValid() || isUndefined(v) {
		return 0, false
	}
	switch rv.Kind() {
	case reflect.Bool:
		if rv.Bool() {
			return 1, true
		}
		return 0, true
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return 0, false
		}
		return int64(u), true
	}
	return 0, false
}

func toFloat(v *exec.Value) (float64, bool) {
	if i, ok := toInt(v); ok {
		return float64(i), true
	}
	rv := resolved(v)
	if rv.IsValid() && (rv.Kind() == reflect.Float32 || rv.Kind() == reflect.Float64) {
		return rv.Float(), true
	}
	return 0, false
}

func isNumber(v *exec.Value) bool {
	k := kindOf(v)
	return k == kInt || k == kFloat || k == kBool
}

// listItems returns the elements of a list value (any slice or array).
func listItems(v *exec.Value) []*exec.Value {
	rv := resolved(v)
	n := rv.Len()
	out := make([]*exec.Value, n)
	for i := range n {
		out[i] = exec.ToValue(rv.Index(i))
	}
	return out
}

type dictItem struct {
	key   *exec.Value
	value *exec.Value
}

// dictItems returns the items of a dict value sorted by key: Go maps have no
// order, and a stable one keeps rendering deterministic.
func dictItems(v *exec.Value) []dictItem {
	var items []dictItem
	rv := resolved(v)
	if rv.Kind() == reflect.Struct {
		d := rv.Interface().(exec.Dict)
		for _, p := range d.Pairs {
			items = append(items, dictItem{p.Key, p.Value})
		}
	} else {
		iter := rv.MapRange()
		for iter.Next() {
			items = append(items, dictItem{exec.ToValue(iter.Key()), exec.ToValue(iter.Value())})
		}
	}
	slices.SortStableFunc(items, func(a, b dictItem) int {
		if c, err := compare(a.key, b.key); err == nil {
			return c
		}
		return strings.Compare(typeName(a.key), typeName(b.key))
	})
	return items
}

// dictLookup looks a key up in a dict value; keys are compared as Python
// would (1 == 1.0 == True).
func dictLookup(v *exec.Value, key *exec.Value) (*exec.Value, bool) {
	rv := resolved(v)
	if rv.Kind() == reflect.Struct {
		for _, p := range rv.Interface().(exec.Dict).Pairs {
			if equal(p.Key, key) {
				return p.Value, true
			}
		}
		return nil, false
	}
	if rv.Type().Key().Kind() == reflect.String {
		if kindOf(key) != kStr {
			return nil, false
		}
		k := reflect.ValueOf(resolved(key).String()).Convert(rv.Type().Key())
		if e := rv.MapIndex(k); e.IsValid() {
			return exec.ToValue(e), true
		}
		return nil, false
	}
	for _, it := range dictItems(v) {
		if equal(it.key, key) {
			return it.value, true
		}
	}
	return nil, false
}

// truthy is Python's bool().
func truthy(v *exec.Value) bool {
	switch kindOf(v) {
	case kUndefined, kNone:
		return false
	case kBool, kInt:
		i, _ := toInt(v)
		return i != 0
	case kFloat:
		f, _ := toFloat(v)
		return f != 0
	case kStr:
		return resolved(v).Len() > 0
	case kList:
		return resolved(v).Len() > 0
	case kDict:
		rv := resolved(v)
		if rv.Kind() == reflect.Struct {
			return len(rv.Interface().(exec.Dict).Pairs) > 0
		}
		return rv.Len() > 0
	}
	return true
}

// pyFloat formats a float as Python's repr() does. gonja's Value.String does
// that for finite values (shortest round-trip digits, exponent notation outside
// [1e-4, 1e16), -0.0): TestDifferentialPaV and TestPyFloat hold it to Python.
// It spells the others NaN, +Inf and -Inf.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	return exec.AsValue(f).String()
}

// pyStr is Python's str() as Jinja applies it (Undefined is "").
func pyStr(v *exec.Value) string {
	switch kindOf(v) {
	case kUndefined:
		return ""
	case kNone:
		return "None"
	case kBool:
		if resolved(v).Bool() {
			return "True"
		}
		return "False"
	case kInt:
		i, ok := toInt(v)
		if !ok {
			return strconv.FormatUint(resolved(v).Uint(), 10)
		}
		return strconv.FormatInt(i, 10)
	case kFloat:
		f, _ := toFloat(v)
		return pyFloat(f)
	case kStr:
		return resolved(v).String()
	}
	return pyRepr(v, 0)
}

// pyRepr is Python's repr(), used for str() of containers.
func pyRepr(v *exec.Value, depth int) string {
	if depth > maxDepth {
		return "..."
	}
	switch kindOf(v) {
	case kStr:
		return pyReprString(resolved(v).String())
	case kList:
		var b strings.Builder
		b.WriteByte('[')
		for i, it := range listItems(v) {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyRepr(it, depth+1))
		}
		b.WriteByte(']')
		return b.String()
	case kDict:
		var b strings.Builder
		b.WriteByte('{')
		for i, it := range dictItems(v) {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(pyRepr(it.key, depth+1))
			b.WriteString(": ")
			b.WriteString(pyRepr(it.value, depth+1))
		}
		b.WriteByte('}')
		return b.String()
	case kNamespace:
		return "<Namespace>"
	case kCallable:
		return "<function>"
	case kOther:
		return "<object>"
	}
	return pyStr(v)
}

func pyReprString(s string) string {
	quote := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		quote = '"'
	}
	var b strings.Builder
	b.WriteByte(quote)
	for _, r := range s {
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == utf8.RuneError || r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r&0xff)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(quote)
	return b.String()
}

// equal is Python's ==. Undefined equals only Undefined (as in Jinja).
func equal(a, b *exec.Value) bool {
	ka, kb := kindOf(a), kindOf(b)
	if isNumber(a) && isNumber(b) {
		ia, aInt := toInt(a)
		ib, bInt := toInt(b)
		if aInt && bInt {
			return ia == ib
		}
		fa, _ := toFloat(a)
		fb, _ := toFloat(b)
		return fa == fb
	}
	if ka != kb {
		return false
	}
	switch ka {
	case kUndefined, kNone:
		return true
	case kStr:
		return resolved(a).String() == resolved(b).String()
	case kList:
		la, lb := listItems(a), listItems(b)
		if len(la) != len(lb) {
			return false
		}
		for i := range la {
			if !equal(la[i], lb[i]) {
				return false
			}
		}
		return true
	case kDict:
		da, db := dictItems(a), dictItems(b)
		if len(da) != len(db) {
			return false
		}
		for _, it := range da {
			other, ok := dictLookup(b, it.key)
			if !ok || !equal(it.value, other) {
				return false
			}
		}
		return true
	case kNamespace:
		return a.Val.Pointer() == b.Val.Pointer()
	}
	return false
}

// compare orders two values as Python's < does, or fails with Python's
// TypeError message.
func compare(a, b *exec.Value) (int, error) {
	if isNumber(a) && isNumber(b) {
		ia, aInt := toInt(a)
		ib, bInt := toInt(b)
		if aInt && bInt {
			switch {
			case ia < ib:
				return -1, nil
			case ia > ib:
				return 1, nil
			}
			return 0, nil
		}
		fa, _ := toFloat(a)
		fb, _ := toFloat(b)
		switch {
		case fa < fb:
			return -1, nil
		case fa > fb:
			return 1, nil
		}
		return 0, nil
	}
	ka, kb := kindOf(a), kindOf(b)
	if ka == kStr && kb == kStr {
		// Byte order of UTF-8 is code point order, as Python compares.
		return strings.Compare(resolved(a).String(), resolved(b).String()), nil
	}
	if ka == kList && kb == kList {
		la, lb := listItems(a), listItems(b)
		for i := 0; i < len(la) && i < len(lb); i++ {
			if equal(la[i], lb[i]) {
				continue
			}
			return compare(la[i], lb[i])
		}
		return len(la) - len(lb), nil
	}
	return 0, fmt.Errorf("comparison not supported between instances of '%s' and '%s'", typeName(a), typeName(b))
}

// Limits that keep a template from exhausting memory: Jinja's sandbox caps
// range() at 100000 items; the same bound applies to repeated sequences.
const (
	maxRange       = 100000
	maxListItems   = 1 << 20
	maxStringBytes = 1 << 20
	maxDepth       = 1000
)

// binaryOp applies a Python arithmetic or comparison operator. Operand texts
// name an undefined operand in the error.
func binaryOp(op string, a, b *exec.Value, aText, bText string) (*exec.Value, error) {
	switch op {
	case "==":
		return exec.AsValue(equal(a, b)), nil
	case "!=":
		return exec.AsValue(!equal(a, b)), nil
	}
	if op == "%" && kindOf(a) == kStr && isUndefined(b) {
		// Undefined has __getitem__, so Python formats in mapping mode:
		// 'x' % u is 'x', '%s' % u is '' (a number of it fails).
		s, err := pyPercentFormat(resolved(a).String(), []*exec.Value{b}, true)
		if err != nil {
			return nil, err
		}
		return exec.AsValue(s), nil
	}
	if op != "~" { // Undefined concatenates as "", as in Jinja
		if isUndefined(a) {
			return nil, undefinedError(aText)
		}
		if isUndefined(b) {
			return nil, undefinedError(bText)
		}
	}
	switch op {
	case "~":
		s := pyStr(a) + pyStr(b)
		if len(s) > maxStringBytes {
			return nil, errTooLarge
		}
		return exec.AsValue(s), nil
	case "<", ">", "<=", ">=":
		c, err := compare(a, b)
		if err != nil {
			return nil, fmt.Errorf("'%s' not supported between instances of '%s' and '%s'", op, typeName(a), typeName(b))
		}
		switch op {
		case "<":
			return exec.AsValue(c < 0), nil
		case ">":
			return exec.AsValue(c > 0), nil
		case "<=":
			return exec.AsValue(c <= 0), nil
		}
		return exec.AsValue(c >= 0), nil
	}

	ia, aInt := toInt(a)
	ib, bInt := toInt(b)
	fa, aNum := toFloat(a)
	fb, bNum := toFloat(b)
	bothInt := aInt && bInt
	bothNum := aNum && bNum
	ka, kb := kindOf(a), kindOf(b)
	unsupported := func() error {
		return fmt.Errorf("unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(a), typeName(b))
	}

	switch op {
	case "+":
		switch {
		case bothInt:
			s, overflow := addInt(ia, ib)
			if overflow {
				return nil, errIntOverflow
			}
			return exec.AsValue(s), nil
		case bothNum:
			return exec.AsValue(fa + fb), nil
		case ka == kStr && kb == kStr:
			s := resolved(a).String() + resolved(b).String()
			if len(s) > maxStringBytes {
				return nil, errTooLarge
			}
			return exec.AsValue(s), nil
		case ka == kList && kb == kList:
			la, lb := listItems(a), listItems(b)
			if len(la)+len(lb) > maxListItems {
				return nil, errTooLarge
			}
			out := make([]any, 0, len(la)+len(lb))
			for _, x := range append(la, lb...) {
				out = append(out, x.Interface())
			}
			return exec.AsValue(out), nil
		}
	case "-":
		switch {
		case bothInt:
			s, overflow := addInt(ia, -ib)
			if overflow || ib == math.MinInt64 {
				return nil, errIntOverflow
			}
			return exec.AsValue(s), nil
		case bothNum:
			return exec.AsValue(fa - fb), nil
		}
	case "*":
		switch {
		case bothInt:
			hi, lo := bits.Mul64(uint64(absInt(ia)), uint64(absInt(ib)))
			if hi != 0 || lo > math.MaxInt64 || ia == math.MinInt64 || ib == math.MinInt64 {
				return nil, errIntOverflow
			}
			p := int64(lo)
			if (ia < 0) != (ib < 0) {
				p = -p
			}
			return exec.AsValue(p), nil
		case bothNum:
			return exec.AsValue(fa * fb), nil
		case (ka == kStr || ka == kList) && bInt:
			return repeat(a, ib)
		case (kb == kStr || kb == kList) && aInt:
			return repeat(b, ia)
		}
	case "/":
		if bothNum {
			if fb == 0 {
				return nil, errDivisionByZero
			}
			return exec.AsValue(fa / fb), nil
		}
	case "//":
		switch {
		case bothInt:
			if ib == 0 {
				return nil, errDivisionByZero
			}
			if ia == math.MinInt64 && ib == -1 {
				return nil, errIntOverflow
			}
			q := ia / ib
			if (ia%ib != 0) && ((ia < 0) != (ib < 0)) {
				q--
			}
			return exec.AsValue(q), nil
		case bothNum:
			if fb == 0 {
				return nil, errDivisionByZero
			}
			return exec.AsValue(math.Floor(fa / fb)), nil
		}
	case "%":
		switch {
		case ka == kStr:
			var args []*exec.Value
			if kb == kList {
				args = listItems(b)
			} else {
				args = []*exec.Value{b}
			}
			// A dict right operand is Python's mapping mode: it need not
			// be used (`'x' % {}` is 'x').
			s, err := pyPercentFormat(resolved(a).String(), args, kb == kDict)
			if err != nil {
				return nil, err
			}
			return exec.AsValue(s), nil
		case bothInt:
			if ib == 0 {
				return nil, errDivisionByZero
			}
			if ib == -1 {
				return exec.AsValue(int64(0)), nil
			}
			m := ia % ib
			if m != 0 && ((m < 0) != (ib < 0)) {
				m += ib
			}
			return exec.AsValue(m), nil
		case bothNum:
			if fb == 0 {
				return nil, errDivisionByZero
			}
			m := math.Mod(fa, fb)
			if m != 0 && ((m < 0) != (fb < 0)) {
				m += fb
			} else if m == 0 {
				m = math.Copysign(0, fb) // Python: 0.0 % -1 is -0.0
			}
			return exec.AsValue(m), nil
		}
	case "**":
		switch {
		case bothInt && ib >= 0:
			p, ok := powInt(ia, ib)
			if !ok {
				return nil, errIntOverflow
			}
			return exec.AsValue(p), nil
		case bothNum:
			if fa == 0 && fb < 0 {
				return nil, errDivisionByZero
			}
			r := math.Pow(fa, fb)
			if math.IsNaN(r) && !math.IsNaN(fa) && !math.IsNaN(fb) {
				// Python returns a complex number here.
				return nil, fmt.Errorf("the result of %s ** %s is not a real number", pyStr(a), pyStr(b))
			}
			return exec.AsValue(r), nil
		}
	default:
		return nil, fmt.Errorf("unknown operator %q", op)
	}
	return nil, unsupported()
}

var (
	errIntOverflow    = fmt.Errorf("integer result out of range (pav integers are 64-bit)")
	errDivisionByZero = fmt.Errorf("division by zero")
	errTooLarge       = fmt.Errorf("result too large")
)

func addInt(a, b int64) (int64, bool) {
	s := a + b
	return s, (a > 0 && b > 0 && s < 0) || (a < 0 && b < 0 && s >= 0)
}

func absInt(a int64) int64 {
	if a < 0 {
		return -a
	}
	return a
}

func powInt(base, exp int64) (int64, bool) {
	result := int64(1)
	for exp > 0 {
		if exp&1 == 1 {
			r, ok := mulInt(result, base)
			if !ok {
				return 0, false
			}
			result = r
		}
		exp >>= 1
		if exp > 0 {
			b, ok := mulInt(base, base)
			if !ok {
				return 0, false
			}
			base = b
		}
	}
	return result, true
}

func mulInt(a, b int64) (int64, bool) {
	if a == math.MinInt64 || b == math.MinInt64 {
		if a == 0 || b == 0 {
			return 0, true
		}
		if a == 1 {
			return b, true
		}
		if b == 1 {
			return a, true
		}
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(absInt(a)), uint64(absInt(b)))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	p := int64(lo)
	if (a < 0) != (b < 0) {
		p = -p
	}
	return p, true
}

// repeat is sequence * int, bounded so a template cannot exhaust memory.
func repeat(seq *exec.Value, n int64) (*exec.Value, error) {
	if n < 0 {
		n = 0
	}
	if kindOf(seq) == kStr {
		s := resolved(seq).String()
		if n > 0 && int64(len(s)) > maxStringBytes/n {
			return nil, errTooLarge
		}
		return exec.AsValue(strings.Repeat(s, int(n))), nil
	}
	items := listItems(seq)
	if n > 0 && int64(len(items)) > maxListItems/n {
		return nil, errTooLarge
	}
	out := make([]any, 0, len(items)*int(n))
	for range n {
		for _, x := range items {
			out = append(out, x.Interface())
		}
	}
	return exec.AsValue(out), nil
}

// unaryOp is -x and +x.
func unaryOp(negative bool, v *exec.Value, text string) (*exec.Value, error) {
	if isUndefined(v) {
		return nil, undefinedError(text)
	}
	if i, ok := toInt(v); ok {
		if !negative {
			return exec.AsValue(i), nil
		}
		if i == math.MinInt64 {
			return nil, errIntOverflow
		}
		return exec.AsValue(-i), nil
	}
	if f, ok := toFloat(v); ok {
		if negative {
			f = -f
		}
		return exec.AsValue(f), nil
	}
	op := "+"
	if negative {
		op = "-"
	}
	return nil, fmt.Errorf("bad operand type for unary %s: '%s'", op, typeName(v))
}

// contains is Python's `in`.
func contains(container, item *exec.Value, containerText string) (bool, error) {
	switch kindOf(container) {
	case kUndefined:
		return false, nil // Jinja's Undefined iterates as empty
	case kStr:
		if kindOf(item) != kStr {
			return false, fmt.Errorf("'in <string>' requires string as left operand, not %s", typeName(item))
		}
		return strings.Contains(resolved(container).String(), resolved(item).String()), nil
	case kList:
		for _, x := range listItems(container) {
			if equal(x, item) {
				return true, nil
			}
		}
		return false, nil
	case kDict:
		if k := kindOf(item); k == kList || k == kDict {
			return false, fmt.Errorf("unhashable type: '%s'", typeName(item))
		}
		_, ok := dictLookup(container, item)
		return ok, nil
	}
	return false, fmt.Errorf("argument of type '%s' is not iterable", typeName(container))
}

// pyPercentFormat implements Python's printf-style `str % args` (and the
// format filter): %s %r %d %i %u %f %F %e %E %g %G %x %X %o %c %% with flags,
// width and precision. gonja passes the string to Go's Sprintf, whose verbs
// differ from Python's. mapping is Python's mapping mode (a dict right of %),
// in which the argument need not be used; %(key)s is not implemented.
func pyPercentFormat(format string, args []*exec.Value, mapping bool) (string, error) {
	var b strings.Builder
	next := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(format) && strings.IndexByte("-+ #0", format[j]) >= 0 {
			j++
		}
		for j < len(format) && format[j] >= '0' && format[j] <= '9' {
			j++
		}
		hasPrecision := false
		if j < len(format) && format[j] == '.' {
			hasPrecision = true
			j++
			for j < len(format) && format[j] >= '0' && format[j] <= '9' {
				j++
			}
		}
		if j >= len(format) {
			return "", fmt.Errorf("incomplete format")
		}
		spec, verb := format[i+1:j], format[j]
		i = j
		if digits := strings.TrimLeft(spec, "-+ #0"); len(digits) > 0 {
			for _, part := range strings.Split(digits, ".") {
				if n, err := strconv.Atoi(part); part != "" && (err != nil || n > 1000) {
					return "", fmt.Errorf("format: width or precision %q is too large", part)
				}
			}
		}
		if verb == '%' {
			b.WriteByte('%')
			continue
		}
		if next >= len(args) {
			return "", fmt.Errorf("not enough arguments for format string")
		}
		arg := args[next]
		next++
		if isUndefined(arg) && verb != 's' && verb != 'r' {
			return "", fmt.Errorf("an undefined value cannot be formatted")
		}
		switch verb {
		case 's', 'r':
			s := pyStr(arg) // str(Undefined) is ''
			if verb == 'r' {
				s = pyRepr(arg, 0)
				if isUndefined(arg) {
					s = "Undefined"
				}
			}
			b.WriteString(fmt.Sprintf("%"+spec+"s", s))
		case 'd', 'i', 'u', 'x', 'X', 'o':
			n, ok := toInt(arg)
			if !ok {
				f, isFloat := toFloat(arg)
				if !isFloat || math.IsInf(f, 0) || math.IsNaN(f) || math.Abs(f) >= 1<<63 {
					return "", fmt.Errorf("%%%c format: a number is required, not %s", verb, typeName(arg))
				}
				n = int64(f)
			}
			gv := verb
			if gv == 'i' || gv == 'u' {
				gv = 'd'
			}
			b.WriteString(fmt.Sprintf("%"+spec+string(gv), n))
		case 'f', 'F', 'e', 'E', 'g', 'G':
			f, ok := toFloat(arg)
			if !ok {
				return "", fmt.Errorf("must be real number, not %s", typeName(arg))
			}
			if !hasPrecision {
				spec += ".6" // Python's default precision, also for %g
			}
			gv := verb
			if gv == 'F' {
				gv = 'f'
			}
			b.WriteString(fmt.Sprintf("%"+spec+string(gv), f))
		case 'c':
			if n, ok := toInt(arg); ok && n >= 0 && n <= utf8.MaxRune {
				b.WriteString(fmt.Sprintf("%"+spec+"c", rune(n)))
			} else if kindOf(arg) == kStr && utf8.RuneCountInString(resolved(arg).String()) == 1 {
				b.WriteString(fmt.Sprintf("%"+spec+"s", resolved(arg).String()))
			} else {
				return "", fmt.Errorf("%%c requires int or char")
			}
		default:
			return "", fmt.Errorf("unsupported format character '%c'", verb)
		}
		if b.Len() > maxStringBytes {
			return "", errTooLarge
		}
	}
	if next < len(args) && !mapping {
		return "", fmt.Errorf("not all arguments converted during string formatting")
	}
	return b.String(), nil
}

// toPlain converts a template value to plain JSON-shaped Go data
// (map[string]any, []any, string, int64, float64, bool, nil), for handing
// values to code that inspects them with reflection.
func toPlain(v *exec.Value, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("value is nested too deeply")
	}
	switch kindOf(v) {
	case kUndefined:
		return nil, fmt.Errorf("an undefined value cannot be used here")
	case kNone:
		return nil, nil
	case kBool:
		return resolved(v).Bool(), nil
	case kInt:
		i, ok := toInt(v)
		if !ok {
			return nil, errIntOverflow
		}
		return i, nil
	case kFloat:
		f, _ := toFloat(v)
		return f, nil
	case kStr:
		return resolved(v).String(), nil
	case kList:
		items := listItems(v)
		out := make([]any, len(items))
		for i, x := range items {
			p, err := toPlain(x, depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = p
		}
		return out, nil
	case kDict:
		items := dictItems(v)
		out := make(map[string]any, len(items))
		for _, it := range items {
			p, err := toPlain(it.value, depth+1)
			if err != nil {
				return nil, err
			}
			out[pyStr(it.key)] = p
		}
		return out, nil
	}
	return nil, fmt.Errorf("a value of type '%s' cannot be used here", typeName(v))
}
