package parity

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/vectors"
)

// TestRegeneratedEqualsCommitted runs the generator (scripts/vecgen.sh check: every release folder
// rewritten from its wheel into a scratch directory, and every pinned vLLM and SGLang release hashed
// by its own wheel against its contract's folder) and requires the rewritten files to equal the
// committed ones byte for byte. A drift between code, contracts and releases fails here.
func TestRegeneratedEqualsCommitted(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the generator runs every pinned release's wheel")
	}
	dir, err := vectors.Dir()
	if err != nil {
		t.Fatal(err)
	}
	repo := filepath.Dir(dir)
	if _, err := os.Stat(filepath.Join(repo, ".cache", "py", "vecgen", "bin", "python")); err != nil {
		t.Skip("the vecgen environment is missing (.cache/py/vecgen): run scripts/pyenv.sh vecgen")
	}
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(repo, "scripts", "vecgen.sh"), "check")
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "VECGEN_OUT="+out)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/vecgen.sh check: %v\n%s", err, log.String())
	}
	got, err := filepath.Glob(filepath.Join(out, "*", "*", "*.json"))
	if err != nil || len(got) == 0 {
		t.Fatalf("the generator wrote no files (%v)\n%s", err, log.String())
	}
	for _, g := range got {
		rel, _ := filepath.Rel(out, g)
		want, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil {
			t.Errorf("%s: regenerated but not committed: %v (run make vectors)", rel, err)
			continue
		}
		have, _ := os.ReadFile(g)
		if !bytes.Equal(have, want) {
			t.Errorf("vectors/%s: the regenerated file differs from the committed one (run make vectors and read the diff: a finding for docs/reference)", rel)
		}
	}
	if !strings.Contains(log.String(), "vecgen check:") {
		t.Errorf("no release was checked:\n%s", log.String())
	}
}
