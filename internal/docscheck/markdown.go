// Package docscheck keeps pav's documentation true to the repository. Its
// tests, run by `make test` without a cluster, check that every relative link
// and every repository path that README.md, CHANGELOG.md, docs/ and the
// examples' READMEs name exists (links to a heading: that the heading does),
// that a code block marked <!-- pav:file path=FILE --> shows FILE as it is,
// and that docs/api-reference.md is what the CRDs in deploy/crd say
// (APIReference; `go generate ./internal/docscheck` rewrites it). The e2e
// suite runs the shell blocks the examples' READMEs mark as runnable (Blocks).
//
// It reads the Markdown pav writes, not every Markdown: ATX headings, fenced
// code blocks, inline code spans, inline links and reference definitions.
// That is enough to find what a reader would follow or type, and small
// enough to be tested line by line.
package docscheck

//go:generate go test -run ^TestAPIReference$ -update .

import (
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// RefKind says where a reference was found.
type RefKind int

const (
	// Link is the target of a Markdown link or reference definition.
	Link RefKind = iota
	// Path is a word of an inline code span, or of a shell code block, that
	// starts with a top-level directory of the repository.
	Path
)

func (k RefKind) String() string {
	if k == Link {
		return "link"
	}
	return "path"
}

// Ref is one reference a document makes to something that must exist.
type Ref struct {
	Kind   RefKind
	Line   int    // 1-based
	Target string // as written (a link's target without its title)
}

// shellInfo are the info strings of fenced blocks whose words are commands a
// reader types: their paths are checked. YAML and the like are not (image
// names and field values are not paths).
var shellInfo = map[string]bool{"": true, "console": true, "sh": true, "bash": true, "shell": true}

// fence is an open fenced code block.
type fence struct {
	char  byte
	n     int
	info  string
	start int // line of the opening fence
}

// openFence reports the fence a line opens (up to 3 spaces of indent, then 3
// or more backticks or tildes), if it does.
func openFence(line string) (fence, bool) {
	t := strings.TrimLeft(line, " ")
	if len(line)-len(t) > 3 || len(t) < 3 || (t[0] != '`' && t[0] != '~') {
		return fence{}, false
	}
	n := 0
	for n < len(t) && t[n] == t[0] {
		n++
	}
	info := strings.TrimSpace(t[n:])
	if n < 3 || (t[0] == '`' && strings.Contains(info, "`")) {
		return fence{}, false
	}
	return fence{char: t[0], n: n, info: info}, true
}

// closes reports whether line closes f: the same character, at least as many,
// nothing after.
func (f fence) closes(line string) bool {
	t := strings.TrimLeft(line, " ")
	if len(line)-len(t) > 3 {
		return false
	}
	n := 0
	for n < len(t) && t[n] == f.char {
		n++
	}
	return n >= f.n && strings.TrimSpace(t[n:]) == ""
}

// lang is the first word of an info string.
func (f fence) lang() string {
	l, _, _ := strings.Cut(f.info, " ")
	return strings.ToLower(l)
}

// line is one line of a document with what the scanner made of it.
type line struct {
	n      int    // 1-based
	text   string // the line
	code   bool   // inside a fenced block (fence lines excluded)
	fence  *fence // the block it is in (code lines) or opens/closes (fence lines)
	isOpen bool   // an opening fence line
}

// scan splits a document into lines and marks fenced code. An unclosed fence
// runs to the end of the document, as CommonMark says.
func scan(src string) []line {
	var out []line
	var open *fence
	for i, text := range strings.Split(src, "\n") {
		l := line{n: i + 1, text: text}
		switch {
		case open != nil && open.closes(text):
			l.fence, open = open, nil
		case open != nil:
			l.code, l.fence = true, open
		default:
			if f, ok := openFence(text); ok {
				f.start = l.n
				open = &f
				l.fence, l.isOpen = open, true
			}
		}
		out = append(out, l)
	}
	return out
}

// Refs returns the references of a Markdown document: the target of every
// link and reference definition outside code, and every word of an inline
// code span or of a shell code block that names a repository path, i.e. whose
// first path element is one of topDirs (the repository's top-level
// directories) and that is followed by a slash. Words holding placeholders
// (<name>, {{ }}, $VAR, …) are left out: they stand for paths, they are not
// paths.
func Refs(src string, topDirs map[string]bool) []Ref {
	var refs []Ref
	for _, l := range scan(src) {
		switch {
		case l.fence != nil && !l.code:
			// A fence line.
		case l.code:
			if shellInfo[l.fence.lang()] {
				for _, w := range strings.Fields(l.text) {
					if p, ok := repoPath(w, topDirs); ok {
						refs = append(refs, Ref{Kind: Path, Line: l.n, Target: p})
					}
				}
			}
		default:
			prose, spans := splitCode(l.text)
			for _, s := range spans {
				for _, w := range strings.Fields(s) {
					if p, ok := repoPath(w, topDirs); ok {
						refs = append(refs, Ref{Kind: Path, Line: l.n, Target: p})
					}
				}
			}
			for _, t := range links(prose) {
				refs = append(refs, Ref{Kind: Link, Line: l.n, Target: t})
			}
		}
	}
	return refs
}

// splitCode separates a line's inline code spans from the rest: prose is the
// line with each span blanked out (so that a link inside one is not taken for
// a link), spans their contents. A backtick run without its closing run of
// the same length is literal text.
func splitCode(text string) (prose string, spans []string) {
	var b strings.Builder
	for i := 0; i < len(text); {
		if text[i] != '`' {
			b.WriteByte(text[i])
			i++
			continue
		}
		n := 0
		for i+n < len(text) && text[i+n] == '`' {
			n++
		}
		end := closingRun(text, i+n, n)
		if end < 0 {
			b.WriteString(text[i : i+n])
			i += n
			continue
		}
		spans = append(spans, text[i+n:end])
		b.WriteString(strings.Repeat(" ", end+n-i))
		i = end + n
	}
	return b.String(), spans
}

// closingRun finds the next run of exactly n backticks at or after from.
func closingRun(text string, from, n int) int {
	for j := from; j < len(text); {
		if text[j] != '`' {
			j++
			continue
		}
		m := 0
		for j+m < len(text) && text[j+m] == '`' {
			m++
		}
		if m == n {
			return j
		}
		j += m
	}
	return -1
}

var (
	// inlineLink matches the start of [text]( or ![alt]( ; the target is read
	// by linkTarget, which balances parentheses.
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(`)
	// refDef is a reference definition: [label]: target.
	refDef = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(\S+)`)
)

// links returns the link targets of a line of prose (code spans blanked).
func links(prose string) []string {
	var out []string
	if m := refDef.FindStringSubmatch(prose); m != nil {
		return []string{strings.Trim(m[1], "<>")}
	}
	for _, loc := range inlineLink.FindAllStringIndex(prose, -1) {
		if t, ok := linkTarget(prose[loc[1]:]); ok {
			out = append(out, t)
		}
	}
	return out
}

// linkTarget reads a link's destination from just after its "(": <...>, or
// up to the first space (a title follows) or the ")" that balances.
func linkTarget(s string) (string, bool) {
	s = strings.TrimLeft(s, " ")
	if strings.HasPrefix(s, "<") {
		end := strings.IndexByte(s, '>')
		if end < 0 {
			return "", false
		}
		return s[1:end], true
	}
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			if depth == 0 {
				return s[:i], i > 0
			}
			depth--
		case ' ', '\t':
			return s[:i], i > 0
		}
	}
	return "", false
}

// repoPath reports the repository path a word names, if it names one: quotes,
// brackets and trailing punctuation around it are not part of it, nor a
// flag's name before "=" (--kubeconfig=_output/...) or a leading "./".
func repoPath(w string, topDirs map[string]bool) (string, bool) {
	w = strings.Trim(w, `"'()[],;`)
	w = strings.TrimRight(w, ".:")
	if i := strings.LastIndexByte(w, '='); i >= 0 {
		w = w[i+1:]
	}
	w = strings.TrimPrefix(w, "./")
	if strings.ContainsAny(w, "<>{}$|…") || strings.Contains(w, "...") {
		return "", false
	}
	first, _, ok := strings.Cut(w, "/")
	if !ok || !topDirs[first] {
		return "", false
	}
	return w, true
}

// Anchors returns the anchors a document defines: GitHub's slug of every
// heading outside code (the second heading with the same slug gets "-1", the
// third "-2", …), and the id or name of every <a id="..."> or <a name="...">.
func Anchors(src string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range scan(src) {
		if l.fence != nil {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l.text, -1) {
			out[m[1]] = true
		}
		m := heading.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		s := Slug(m[1])
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

var (
	heading    = regexp.MustCompile(`^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	// mdLink is [text](target) in a heading: its text is what the slug is made of.
	mdLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	// htmlTag is any tag in a heading: it is not text.
	htmlTag = regexp.MustCompile(`<[^>]+>`)
)

// Slug is GitHub's anchor for a heading's Markdown text: the rendered text
// (links by their text, code spans by their content, no emphasis markers,
// no tags), lowercased, without characters other than letters, digits, marks,
// "_", "-" and spaces, with each space turned into "-".
func Slug(text string) string {
	text = mdLink.ReplaceAllString(text, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	text = strings.NewReplacer("`", "", "*", "").Replace(text)
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Block is a fenced code block marked by the HTML comment on the line before
// it (blank lines between are allowed): <!-- pav:KIND key=value ... -->.
// The comment does not show where the Markdown is rendered.
type Block struct {
	Kind  string            // "run", "cleanup", …
	Attrs map[string]string // key=value words after the kind
	Line  int               // the line of the opening fence
	Info  string            // the fence's info string
	Code  string            // the block's lines, each ending in "\n"
}

var blockMarker = regexp.MustCompile(`^\s*<!--\s*pav:([a-z-]+)((?:\s+[a-z-]+=\S+)*)\s*-->\s*$`)

// Blocks returns the marked code blocks of a document, in order. A marker
// that is not followed by a fenced block (or by one that never closes) is an
// error in the document: Blocks returns it with an empty Code, so that the
// caller fails on it rather than silently running less.
func Blocks(src string) []Block {
	var out []Block
	var pending *Block
	var code strings.Builder
	for _, l := range scan(src) {
		switch {
		case l.fence != nil && l.isOpen:
			if pending != nil {
				pending.Line, pending.Info = l.n, l.fence.info
				code.Reset()
			}
		case l.code:
			if pending != nil && pending.Line != 0 {
				code.WriteString(l.text + "\n")
			}
		case l.fence != nil:
			if pending != nil && pending.Line != 0 {
				pending.Code = code.String()
				out = append(out, *pending)
				pending = nil
			}
		default:
			if m := blockMarker.FindStringSubmatch(l.text); m != nil {
				if pending != nil {
					out = append(out, *pending) // marker without a block
				}
				pending = &Block{Kind: m[1], Attrs: map[string]string{}}
				for _, kv := range strings.Fields(m[2]) {
					k, v, _ := strings.Cut(kv, "=")
					pending.Attrs[k] = v
				}
				continue
			}
			if pending != nil && pending.Line == 0 && strings.TrimSpace(l.text) != "" {
				out = append(out, *pending) // marker followed by prose
				pending = nil
			}
		}
	}
	if pending != nil {
		out = append(out, *pending) // unclosed, or a marker at the end
	}
	return out
}
