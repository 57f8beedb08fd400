package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// checked are the documents whose paths must exist: the design's layout and walks, and the README's
// layout table. Paths are read from code spans (`gateway/route/ladder.go`) and Markdown links
// ((docs/routing.md)), relative to the repository root or to the document.
var checked = []string{"DESIGN.md", "../README.md"}

var (
	codeSpan = regexp.MustCompile("`([^`\\s]+)`")
	linkDest = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// A path names a folder and a file with an extension, or ends in a slash (a folder).
	pathLike = regexp.MustCompile(`^[\w.-]+(/[\w.-]+)*(\.[a-z]+|/)$`)
)

// candidates are the spans of doc that look like repository paths. Placeholders (<family>, *),
// URLs, paths outside the repository (../shared/…) and bare file names (`decode.go`, which the
// text places in a folder it names just before) are not checked.
func candidates(doc string) []string {
	var out []string
	for _, re := range []*regexp.Regexp{codeSpan, linkDest} {
		for _, m := range re.FindAllStringSubmatch(doc, -1) {
			p := strings.TrimPrefix(m[1], "./")
			if i := strings.IndexAny(p, "#:"); i >= 0 { // an anchor, a func after the file
				p = p[:i]
			}
			if !strings.Contains(strings.TrimSuffix(p, "/"), "/") || strings.HasPrefix(p, "../shared") ||
				strings.Contains(p, "://") || !pathLike.MatchString(p) {
				continue
			}
			out = append(out, p)
		}
	}
	return out
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func TestDocumentedPathsExist(t *testing.T) {
	for _, name := range checked {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Dir(name)
		n := 0
		for _, p := range candidates(string(b)) {
			n++
			if !exists(filepath.Join("..", p)) && !exists(filepath.Join(dir, p)) {
				t.Errorf("%s names %s, which does not exist (from the repository root or beside the document)", name, p)
			}
		}
		if n == 0 {
			t.Errorf("%s: no paths found; the scan is broken", name)
		}
	}
}

// TestCandidates proves the scan sees each kind of reference and skips what it must.
func TestCandidates(t *testing.T) {
	doc := "see `gateway/route/ladder.go`, [routing](docs/routing.md#ladder), `vectors/schema/`, " +
		"`engines/<family>/pd.go`, `../shared/vectors/x.json`, `decode.go`, `rr`, " +
		"`https://example.com/a/b.go`, `gateway/nosuch/file.go`"
	got := strings.Join(candidates(doc), " ")
	want := "gateway/route/ladder.go vectors/schema/ gateway/nosuch/file.go docs/routing.md"
	if got != want {
		t.Fatalf("candidates = %q, want %q", got, want)
	}
	if exists(filepath.Join("..", "gateway/nosuch/file.go")) {
		t.Fatal("the missing path exists")
	}
}

// mdLink is a Markdown link or image destination ([text](dest), ![alt](dest), optionally with a
// "title"); htmlSrc an HTML image or link inside Markdown.
var (
	mdLink  = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	htmlSrc = regexp.MustCompile(`<(?:img|a)\s[^>]*(?:src|href)="([^"]+)"`)
	heading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	fence   = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")
)

// slug is the anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens.
func slug(h string) string {
	h = regexp.MustCompile("`|\\*\\*|__").ReplaceAllString(h, "")
	h = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors lists the heading anchors of a Markdown document (a repeated heading gets -1, -2, …).
func anchors(doc string) map[string]bool {
	doc = fence.ReplaceAllString(doc, "")
	out, seen := map[string]bool{}, map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(doc, -1) {
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	for _, m := range regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`).FindAllStringSubmatch(doc, -1) {
		out[m[1]] = true
	}
	return out
}

// markdownFiles lists every *.md of the repository (not the caches, not node_modules).
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir("..", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRelativeLinksResolve: every relative link and image in every Markdown file of the repository
// names a file or folder that exists, and a #fragment names a heading of its target document.
func TestRelativeLinksResolve(t *testing.T) {
	files := markdownFiles(t)
	if len(files) < 20 {
		t.Fatalf("found only %d Markdown files: the walk is broken", len(files))
	}
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		doc := fence.ReplaceAllString(string(b), "")
		doc = regexp.MustCompile("`[^`\n]*`").ReplaceAllString(doc, "")
		var dests []string
		for _, re := range []*regexp.Regexp{mdLink, htmlSrc} {
			for _, m := range re.FindAllStringSubmatch(doc, -1) {
				dests = append(dests, m[1])
			}
		}
		for _, d := range dests {
			if strings.Contains(d, "://") || strings.HasPrefix(d, "mailto:") {
				continue
			}
			n++
			target, frag, _ := strings.Cut(d, "#")
			path := f
			if target != "" {
				path = filepath.Join(filepath.Dir(f), target)
				if !exists(path) {
					t.Errorf("%s links %s, which does not exist", strings.TrimPrefix(f, "../"), d)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(path, ".md") {
				tb, err := os.ReadFile(path)
				if err == nil && !anchors(string(tb))[frag] {
					t.Errorf("%s links %s: no heading of %s has the anchor #%s", strings.TrimPrefix(f, "../"), d, strings.TrimPrefix(path, "../"), frag)
				}
			}
		}
	}
	if n < 50 {
		t.Fatalf("checked only %d relative links: the scan is broken", n)
	}
}

// TestLinkScan proves the scan sees links, images and anchors and skips URLs.
func TestLinkScan(t *testing.T) {
	doc := "[a](docs/x.md#the-part) ![chart](bench/c.svg \"t\") <img src=\"i.png\"> [u](https://e.com/x)"
	var got []string
	for _, re := range []*regexp.Regexp{mdLink, htmlSrc} {
		for _, m := range re.FindAllStringSubmatch(doc, -1) {
			got = append(got, m[1])
		}
	}
	if strings.Join(got, " ") != "docs/x.md#the-part bench/c.svg https://e.com/x i.png" {
		t.Fatalf("scan: %q", got)
	}
	a := anchors("# The part\n## 1. Summary — `x` (16/64)\n## The part\n```\n# not a heading\n```\n")
	for _, want := range []string{"the-part", "1-summary--x-1664", "the-part-1"} {
		if !a[want] {
			t.Fatalf("anchors %v lack %s", a, want)
		}
	}
	if a["not-a-heading"] {
		t.Fatal("a fenced line counted as a heading")
	}
}
