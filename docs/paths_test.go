package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
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
