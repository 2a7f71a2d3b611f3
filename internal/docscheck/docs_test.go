package docscheck

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the repository, seen from this package's directory.
const root = "../.."

// documents are the Markdown files whose references must exist. CHANGELOG.md
// is history: it may name a file that a later change removed, so only its
// links are checked.
var documents = []struct {
	glob  string
	paths bool // check the repository paths it names, not only its links
}{
	{"README.md", true},
	{"docs/*.md", true},
	{"examples/*/README.md", true},
	{"CHANGELOG.md", false},
}

// topDirs are the repository's top-level directories: a word that starts
// with one of them and a slash names a repository path. Build outputs
// (_output) and .git are not the repository's.
func topDirs(t *testing.T) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]bool{}
	for _, e := range entries {
		if e.IsDir() && e.Name() != ".git" && !strings.HasPrefix(e.Name(), "_") {
			dirs[e.Name()] = true
		}
	}
	return dirs
}

// TestDocumentsNameWhatExists: every relative link (and the heading it
// points at) and every repository path that the documentation names exists,
// so that moving a file or renaming a heading fails here, not in a reader's
// browser.
func TestDocumentsNameWhatExists(t *testing.T) {
	top := topDirs(t)
	anchors := map[string]map[string]bool{} // by file, read once
	anchorsOf := func(path string) (map[string]bool, error) {
		if a, ok := anchors[path]; ok {
			return a, nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		anchors[path] = Anchors(string(b))
		return anchors[path], nil
	}
	for _, d := range documents {
		files, err := filepath.Glob(filepath.Join(root, d.glob))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no document (%v)", d.glob, err)
		}
		for _, file := range files {
			rel, _ := filepath.Rel(root, file)
			t.Run(rel, func(t *testing.T) {
				b, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range Refs(string(b), top) {
					var err error
					switch {
					case r.Kind == Link:
						err = checkLink(file, r.Target, anchorsOf)
					case d.paths:
						err = checkPath(r.Target)
					}
					if err != nil {
						t.Errorf("%s:%d: %s %q: %v", rel, r.Line, r.Kind, r.Target, err)
					}
				}
			})
		}
	}
}

// external matches a link with a scheme (https:, mailto:) or a
// protocol-relative one: not the repository's to check.
var external = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9+.-]*:|//)`)

// checkLink checks a link target of file: the file or directory it names
// exists inside the repository and, for "#anchor" into a Markdown file, the
// heading does.
func checkLink(file, target string, anchorsOf func(string) (map[string]bool, error)) error {
	if external.MatchString(target) {
		return nil
	}
	p, anchor, _ := strings.Cut(target, "#")
	p, err := url.PathUnescape(p)
	if err != nil {
		return err
	}
	dest := file
	if p != "" {
		dest = filepath.Join(filepath.Dir(file), p)
	}
	if rel, err := filepath.Rel(root, dest); err != nil || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("points outside the repository")
	}
	st, err := os.Stat(dest)
	if err != nil {
		return fmt.Errorf("no such file or directory")
	}
	if anchor == "" {
		return nil
	}
	if st.IsDir() || filepath.Ext(dest) != ".md" {
		return fmt.Errorf("an anchor into something that is not a Markdown file")
	}
	a, err := anchorsOf(dest)
	if err != nil {
		return err
	}
	if !a[anchor] {
		return fmt.Errorf("no heading with anchor #%s in %s", anchor, filepath.Base(dest))
	}
	return nil
}

// checkPath checks a repository path: it exists, or, with glob characters,
// matches something.
func checkPath(p string) error {
	full := filepath.Join(root, p)
	if strings.ContainsAny(p, "*?[") {
		m, err := filepath.Glob(full)
		if err != nil || len(m) == 0 {
			return fmt.Errorf("matches nothing")
		}
		return nil
	}
	if _, err := os.Stat(full); err != nil {
		return fmt.Errorf("no such file or directory")
	}
	return nil
}

// TestQuotedFilesAreTheFiles: a code block marked <!-- pav:file path=FILE -->
// shows FILE as it is (comment-only lines aside, which either may leave out),
// so that the manual never shows a provisioner the repository does not have.
func TestQuotedFilesAreTheFiles(t *testing.T) {
	for _, d := range documents {
		files, _ := filepath.Glob(filepath.Join(root, d.glob))
		for _, file := range files {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			rel, _ := filepath.Rel(root, file)
			for _, blk := range Blocks(string(b)) {
				if blk.Kind != "file" {
					continue
				}
				quoted, err := os.ReadFile(filepath.Join(root, blk.Attrs["path"]))
				switch {
				case blk.Code == "" || blk.Attrs["path"] == "":
					t.Errorf("%s: a pav:file marker needs path=FILE and a code block after it", rel)
				case err != nil:
					t.Errorf("%s:%d: %v", rel, blk.Line, err)
				case withoutComments(blk.Code) != withoutComments(string(quoted)):
					t.Errorf("%s:%d: the block is not %s as it is (comment-only lines aside): copy it again", rel, blk.Line, blk.Attrs["path"])
				}
			}
		}
	}
}

// withoutComments drops the comment-only lines of a YAML or shell file and
// the blank lines at its ends.
func withoutComments(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return strings.TrimSpace(strings.Join(out, "\n"))
}

// TestREADMEIsALandingPage keeps README.md short enough to read to the end;
// the manual is docs/.
func TestREADMEIsALandingPage(t *testing.T) {
	const maxLines = 250
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > maxLines {
		t.Errorf("README.md has %d lines, over %d: move what is not needed on the first page to docs/", n, maxLines)
	}
}

// TestDocsIndexListsEveryPage: a page of docs/ that its index does not link
// to is a page no reader finds.
func TestDocsIndexListsEveryPage(t *testing.T) {
	index, err := os.ReadFile(filepath.Join(root, "docs", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	linked := map[string]bool{}
	for _, r := range Refs(string(index), nil) {
		p, _, _ := strings.Cut(r.Target, "#")
		linked[p] = true
	}
	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, p := range pages {
		if name := filepath.Base(p); name != "README.md" && !linked[name] {
			t.Errorf("docs/README.md does not link to %s", name)
		}
	}
}

func TestRefs(t *testing.T) {
	top := map[string]bool{"deploy": true, "examples": true, "docs": true}
	for _, c := range []struct {
		name, src string
		want      []Ref
	}{
		{"a link and an image", "See [the manual](docs/README.md) and ![x](docs/a.png \"title\").",
			[]Ref{{Link, 1, "docs/README.md"}, {Link, 1, "docs/a.png"}}},
		{"anchors and external links", "[a](#here) [b](ops.md#metrics) [c](https://example.com/x) [d](<with space.md>)",
			[]Ref{{Link, 1, "#here"}, {Link, 1, "ops.md#metrics"}, {Link, 1, "https://example.com/x"}, {Link, 1, "with space.md"}}},
		{"parentheses in a target", "[a](dir/f(1).md)", []Ref{{Link, 1, "dir/f(1).md"}}},
		{"a reference definition", "[id]: docs/x.md \"t\"", []Ref{{Link, 1, "docs/x.md"}}},
		{"inline code names paths", "apply `deploy/pav.yaml`, `kubectl apply -k deploy/base`; not `deploy` alone, nor `pav.local/x:dev`",
			[]Ref{{Path, 1, "deploy/pav.yaml"}, {Path, 1, "deploy/base"}}},
		{"a link inside code is not a link", "`[a](b.md)` and ``x ` [c](d.md)``", nil},
		{"an unclosed backtick is text", "a ` [x](docs/y.md)", []Ref{{Link, 1, "docs/y.md"}}},
		{"punctuation, flags and ./ around a path", "`(deploy/a.yaml),` `--file=./examples/b/c.yaml` `\"docs/d.md\"`",
			[]Ref{{Path, 1, "deploy/a.yaml"}, {Path, 1, "examples/b/c.yaml"}, {Path, 1, "docs/d.md"}}},
		{"placeholders are not paths", "`examples/<name>/provisioner.yaml` `deploy/{{ x }}` `docs/$PAGE` `examples/…/x`", nil},
		{"shell blocks are read, YAML blocks not",
			"```console\nkubectl apply -f examples/a/usage.yaml   # see docs/b.md\n```\n```yaml\nimage: deploy/not-a-path\n```\n",
			[]Ref{{Path, 2, "examples/a/usage.yaml"}, {Path, 2, "docs/b.md"}}},
		{"no links inside code blocks", "~~~~\n[a](b.md)\n~~~\nstill code\n~~~~\n[c](d.md)", []Ref{{Link, 6, "d.md"}}},
		{"globs are kept", "`examples/*/provisioner.yaml`", []Ref{{Path, 1, "examples/*/provisioner.yaml"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Refs(c.src, top); !slices.Equal(got, c.want) {
				t.Errorf("Refs(%q)\n got %v\nwant %v", c.src, got, c.want)
			}
		})
	}
}

func TestSlug(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"Install, use, uninstall", "install-use-uninstall"},
		{"Beyond PaV: expansion, snapshots, clones and topology", "beyond-pav-expansion-snapshots-clones-and-topology"},
		{"The `/pav` contract", "the-pav-contract"},
		{"`tobash` — one shell word", "tobash--one-shell-word"},
		{"**Bold** and [a link](x.md)", "bold-and-a-link"},
		{"snake_case stays", "snake_case-stays"},
		{"Élan 2", "élan-2"},
	} {
		if got := Slug(c.in); got != c.want {
			t.Errorf("Slug(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestAnchors(t *testing.T) {
	src := "# Title\n\n## Setup ##\n\n```\n# not a heading\n```\n\n## Setup\n\n<a id=\"custom\"></a>\n    ## indented four: code, not a heading\n"
	got := Anchors(src)
	for _, want := range []string{"title", "setup", "setup-1", "custom"} {
		if !got[want] {
			t.Errorf("anchor %q missing from %v", want, got)
		}
	}
	if got["not-a-heading"] || len(got) != 4 {
		t.Errorf("anchors %v, want exactly title, setup, setup-1, custom", got)
	}
}

func TestBlocks(t *testing.T) {
	src := strings.Join([]string{
		"# Use it",
		"<!-- pav:run -->",
		"```console",
		"kubectl apply -f x.yaml",
		"```",
		"",
		"```console",
		"unmarked",
		"```",
		"<!-- pav:run needs=device-mapper -->",
		"",
		"```sh",
		"a",
		"b",
		"```",
		"<!-- pav:cleanup -->",
		"Prose where a block should be.",
		"<!-- pav:run -->",
		"```console",
		"never closed",
	}, "\n")
	want := []Block{
		{Kind: "run", Attrs: map[string]string{}, Line: 3, Info: "console", Code: "kubectl apply -f x.yaml\n"},
		{Kind: "run", Attrs: map[string]string{"needs": "device-mapper"}, Line: 12, Info: "sh", Code: "a\nb\n"},
		{Kind: "cleanup", Attrs: map[string]string{}},
		{Kind: "run", Attrs: map[string]string{}, Line: 19, Info: "console"},
	}
	got := Blocks(src)
	if len(got) != len(want) {
		t.Fatalf("got %d blocks %+v, want %d", len(got), got, len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Kind != w.Kind || g.Line != w.Line || g.Info != w.Info || g.Code != w.Code || fmt.Sprint(g.Attrs) != fmt.Sprint(w.Attrs) {
			t.Errorf("block %d: got %+v, want %+v", i, g, w)
		}
	}
}
