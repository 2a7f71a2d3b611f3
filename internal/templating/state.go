package templating

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/parser"
)

// stateKey names the per-render state in the template context. It contains a
// space, so no template can read or shadow it.
const stateKey = "pav render state"

// renderState is what pav's filters and functions need during one render.
type renderState struct {
	ctx   context.Context
	pvcs  PVCGetter
	depth int // macro call depth

	// lastUndefined is the error message for the most recently produced
	// Undefined ("'x' is undefined"), so that printing it can say which
	// name was undefined (the Undefined value itself is a typed nil and
	// cannot carry it).
	lastUndefined string

	// errs are the errors pav's own code raised. gonja flattens errors
	// returned by filters and functions into strings ("invalid call to
	// filter ..."), losing their type and cause; keeping them here lets the
	// final error keep its cause (for errors.Is on a get_pvc failure).
	errs []*evalError

	// loopFilterErr is the first error raised by a for loop's filter
	// condition (see forControl).
	loopFilterErr error
}

func stateOf(e *exec.Evaluator) *renderState {
	if v, ok := e.Environment.Context.Get(stateKey); ok {
		if st, ok := v.(*renderState); ok {
			return st
		}
	}
	// Only reachable if gonja evaluates outside a pav render; fail closed.
	return &renderState{ctx: context.Background()}
}

// evalError is an error raised by pav's code during evaluation.
type evalError struct {
	msg   string
	cause error
}

func (e *evalError) Error() string { return e.msg }
func (e *evalError) Unwrap() error { return e.cause }

// fail records err as raised by pav and returns it as a gonja error value.
func (st *renderState) fail(err error) *exec.Value {
	var ee *evalError
	if !errors.As(err, &ee) {
		ee = &evalError{msg: err.Error(), cause: err}
	}
	if len(st.errs) < 64 {
		st.errs = append(st.errs, ee)
	}
	return exec.AsValue(ee)
}

func (st *renderState) failf(format string, args ...any) *exec.Value {
	return st.fail(fmt.Errorf(format, args...))
}

// undefined returns Undefined for the expression text.
func (st *renderState) undefined(text string) *exec.Value {
	st.lastUndefined = undefinedError(text).Error()
	return undefinedValue()
}

// undefinedMsg returns Undefined with a custom message.
func (st *renderState) undefinedMsg(msg string) *exec.Value {
	st.lastUndefined = msg
	return undefinedValue()
}

// undefinedErr is the error for using the last Undefined.
func (st *renderState) undefinedErr() error {
	if st.lastUndefined == "" {
		return undefinedError("")
	}
	return errors.New(st.lastUndefined)
}

func undefinedError(text string) error {
	if text == "" {
		return fmt.Errorf("a value is undefined")
	}
	return fmt.Errorf("'%s' is undefined", text)
}

var (
	lineRE        = regexp.MustCompile(`at line (\d+)`)
	controlPrefix = regexp.MustCompile(`Unable to parse controlStructure "[^"]*": `)
	errorToken    = regexp.MustCompile(`<Token\[Error\] Val='([^']*)'[^>]*>`)
)

// renderError turns the error gonja returned from a render into pav's
// message: the innermost cause, without gonja's layers of context, followed
// by the line of the innermost construct that failed.
func renderError(err error, st *renderState) error {
	full := err.Error()
	var msg string
	var cause error
	for i := len(st.errs) - 1; i >= 0; i-- {
		if strings.Contains(full, st.errs[i].msg) {
			msg, cause = st.errs[i].msg, st.errs[i].cause
			break
		}
	}
	if msg == "" {
		inner := err
		for u := errors.Unwrap(inner); u != nil; u = errors.Unwrap(inner) {
			inner = u
		}
		msg = inner.Error()
		var ee *evalError
		if errors.As(err, &ee) {
			msg, cause = ee.msg, ee.cause
		}
	}
	line := ""
	if m := lineRE.FindAllStringSubmatch(full, -1); len(m) > 0 {
		line = m[len(m)-1][1]
	}
	return newTemplateError("template error", msg, line, cause)
}

// syntaxError turns a gonja parse error into pav's message.
func syntaxError(err error) error {
	// exec.NewTemplate wraps the parser's error with the whole source.
	if u := errors.Unwrap(err); u != nil && strings.HasPrefix(err.Error(), "failed to parse template") {
		err = u
	}
	msg := err.Error()
	line := ""
	var se *parser.SyntaxError
	if errors.As(err, &se) {
		// Its own position suffix is replaced by pav's "(line N)".
		msg = strings.Replace(msg, se.Error(), se.Message, 1)
		if se.Line > 0 {
			line = strconv.Itoa(se.Line)
		}
	}
	msg = controlPrefix.ReplaceAllString(msg, "")
	msg = errorToken.ReplaceAllString(msg, "$1")
	return newTemplateError("template syntax error", msg, line, nil)
}

func newTemplateError(prefix, msg, line string, cause error) error {
	s := prefix + ": " + msg
	if line != "" {
		s += " (line " + line + ")"
	}
	if cause != nil {
		return &wrappedError{msg: s, cause: cause}
	}
	return errors.New(s)
}

// wrappedError carries a message and the underlying cause (e.g. the
// PVCGetter's error) so that callers can use errors.Is/As.
type wrappedError struct {
	msg   string
	cause error
}

func (e *wrappedError) Error() string { return e.msg }
func (e *wrappedError) Unwrap() error { return e.cause }
