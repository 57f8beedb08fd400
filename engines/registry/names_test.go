package registry

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// An engine family is one package under engines/: code outside engines/ asks this registry for a
// Family and never names one. TestNoFamilyNamesOutsideEngines scans the module's non-test Go files
// outside engines/ for an import of a family package, and for an identifier or a string literal
// containing a registered family's name or display name (case-insensitive; also the display name
// without punctuation, as an identifier would spell it: TensorRT-LLM → tensorrtllm). Comments may
// name engines: they explain engine behaviour.
//
// Exemptions, each with why it is honest:
var familyNameExempt = []struct {
	dir     string // module-relative directory, its subdirectories included; or one file
	strings bool   // only string literals are exempt (identifiers and imports still fail)
	why     string
}{
	{dir: "gateway/hashcore", why: "the hash core implements each engine's block-hash algorithm and imports nothing of the project; its identifiers are the algorithms' own names (vLLM's sha256, SGLang's page hash)"},
	{dir: "cmd/enginesim", strings: true, why: "the command line of engines/sim, the engine simulator: its flag texts mirror each simulated engine's own flags and say which engine each applies to"},
	{dir: "bench/kvbench", strings: true, why: "a benchmark names what it measures, as a test does: its fixture is a vLLM pool, its peers are other projects' routers (SGLang's model gateway), and the document it writes describes that setup"},
	{dir: "bench/kvbench/peers.go", why: "the peer routers kvbench re-implements to compare against are named after their projects (PeerSGLangTree: SGLang's model gateway's cache-aware tree), not after the engine family"},
	{dir: "containers/vllmcpu.go", why: "the real vLLM CPU engine's container (its image and the vllmpool command line it runs): one engine's container is its whole job, as cmd/vllmpool's processes are"},
	{dir: "cmd/vllmpool", why: "the command that starts real vLLM engines (engines/vllm/vllmpool) for the tests and the real-engine demo: one engine's processes are its whole job"},
	{dir: "ctk/eppcheck/envoy.go", strings: true, why: "ctk epp's self-started pool is one simulated engine of a fixed release: the picker under test needs an OpenAI surface behind each address, not a family's behaviour"},
	{dir: "cmd/ctk/epp.go", strings: true, why: "the usage text says what ctk epp starts (a simulated vLLM endpoint per pool address)"},
	{dir: "cmd/kvbench/drive.go", strings: true, why: "a flag text says which engine's behaviour the flag works around (vLLM announces a cache reset only at its next step)"},
	{dir: "gateway/tokenize", strings: true, why: "error texts cite the reference engine's answer to a request the gateway refuses the same way (\"vLLM answers 400\"); the texts users see stay as they are"},
}

func TestNoFamilyNamesOutsideEngines(t *testing.T) {
	root := moduleRoot(t)
	var hits []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(strings.TrimPrefix(path, root), string(filepath.Separator)))
		if d.IsDir() {
			if rel == "engines" || rel == "third_party" || d.Name() == "testdata" || (rel != "" && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		stringsExempt := false
		for _, e := range familyNameExempt {
			if covered(rel, []string{e.dir}) {
				if !e.strings {
					return nil
				}
				stringsExempt = true
			}
		}
		found, err := familyNamesIn(path, rel, stringsExempt)
		hits = append(hits, found...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(hits) > 0 {
		t.Errorf("code outside engines/ names an engine family (ask engines/registry for the Family and give the difference a facet; see docs/families.md):\n%s", strings.Join(hits, "\n"))
	}
}

// TestFamilyNameScanFails proves the scan sees each kind of reference.
func TestFamilyNameScanFails(t *testing.T) {
	dir := t.TempDir()
	src := `package report

import _ "github.com/kvexact/kvexact/engines/sglang"

// vLLM is fine in a comment.
var TRTLLMOptions = 1

func kind() string { return "vllm" }

const msg = "served by llama.cpp"
`
	path := filepath.Join(dir, "report.go")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	hits, err := familyNamesIn(path, "ctk/report.go", false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`ctk/report.go:3: imports "github.com/kvexact/kvexact/engines/sglang"`,
		`ctk/report.go:6: identifier TRTLLMOptions names trtllm`,
		`ctk/report.go:8: string "vllm" names vllm`,
		`ctk/report.go:10: string "served by llama.cpp" names llamacpp`,
	}
	if !slices.Equal(hits, want) {
		t.Fatalf("hits:\n%s\nwant:\n%s", strings.Join(hits, "\n"), strings.Join(want, "\n"))
	}
	if hits, _ := familyNamesIn(path, "ctk/report.go", true); !slices.Equal(hits, want[:2]) {
		t.Fatalf("string-literal exemption: hits %v, want the import and the identifier", hits)
	}
}

// familyNamesIn reports each reference to a family in one file (rel names it in messages);
// stringsExempt passes string literals other than import paths.
func familyNamesIn(path, rel string, stringsExempt bool) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var hits []string
	at := func(p token.Pos) string { return fmt.Sprintf("%s:%d", rel, fset.Position(p).Line) }
	imports := map[*ast.BasicLit]bool{}
	for _, im := range f.Imports {
		imports[im.Path] = true
		p, _ := strconv.Unquote(im.Path.Value)
		for _, fam := range All() {
			if p == "github.com/kvexact/kvexact/engines/"+fam.Name() || strings.HasPrefix(p, "github.com/kvexact/kvexact/engines/"+fam.Name()+"/") {
				hits = append(hits, fmt.Sprintf("%s: imports %q", at(im.Pos()), p))
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Ident:
			if fam := familyIn(n.Name); fam != "" {
				hits = append(hits, fmt.Sprintf("%s: identifier %s names %s", at(n.Pos()), n.Name, fam))
			}
		case *ast.BasicLit:
			if n.Kind != token.STRING && n.Kind != token.CHAR || imports[n] {
				return true
			}
			s, err := strconv.Unquote(n.Value)
			if err != nil {
				s = n.Value
			}
			if fam := familyIn(s); fam != "" && !stringsExempt {
				hits = append(hits, fmt.Sprintf("%s: string %q names %s", at(n.Pos()), s, fam))
			}
		}
		return true
	})
	return hits, nil
}

// familyIn returns the name of a family s refers to ("" when none).
func familyIn(s string) string {
	l := strings.ToLower(s)
	for _, f := range All() {
		for _, n := range []string{f.Name(), f.Display(), alnum(f.Display())} {
			if strings.Contains(l, strings.ToLower(n)) {
				return f.Name()
			}
		}
	}
	return ""
}

func alnum(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsLetter(r) || unicode.IsDigit(r) {
			return r
		}
		return -1
	}, s)
}

// covered reports whether rel is one of paths or under one of them.
func covered(rel string, paths []string) bool {
	for _, p := range paths {
		if rel == p || strings.HasPrefix(rel, p+"/") {
			return true
		}
	}
	return false
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = up
	}
}
