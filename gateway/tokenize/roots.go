package tokenize

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DefaultRoots lists the folders that hold <model>/tokenizer.json, in lookup order:
// $KVEXACT_TOKENIZERS (a path list), then ../shared/tokenizers next to the repository (the shared,
// read-only cache), then the repository's .cache/tokenizers (where scripts/fetch-tokenizers.sh puts
// what the shared cache lacks, e.g. gemma3). The repository is found by walking up from the working
// directory to the go.mod of github.com/kvexact/kvexact; without one only the variable counts.
func DefaultRoots() []string {
	var roots []string
	add := func(p string) {
		if p == "" {
			return
		}
		if a, err := filepath.Abs(p); err == nil {
			p = a
		}
		for _, r := range roots {
			if r == p {
				return
			}
		}
		roots = append(roots, p)
	}
	for _, p := range filepath.SplitList(os.Getenv("KVEXACT_TOKENIZERS")) {
		add(p)
	}
	if repo := RepoRoot(); repo != "" {
		add(filepath.Join(repo, "..", "shared", "tokenizers"))
		add(filepath.Join(repo, ".cache", "tokenizers"))
	}
	return roots
}

// RepoRoot returns the kvexact module root above the working directory, or "".
func RepoRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/kvexact/kvexact\n")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// FindModelDir returns the first <root>/<folder> holding tokenizer.json, or an error listing where
// it looked (and how to fetch the files).
func FindModelDir(roots []string, folder string) (string, error) {
	for _, r := range roots {
		d := filepath.Join(r, folder)
		if _, err := os.Stat(filepath.Join(d, "tokenizer.json")); err == nil {
			return d, nil
		}
	}
	if len(roots) == 0 {
		return "", fmt.Errorf("no %s/tokenizer.json: no tokenizer folder is configured (%s)", folder, missingHint())
	}
	return "", fmt.Errorf("no %s/tokenizer.json under %s (%s)", folder, strings.Join(roots, ", "), missingHint())
}

// missingHint says how to provide tokenizer files: in a checkout the make target fetches the
// pinned ones; anywhere else (a container, an installed binary) the files come from the model.
func missingHint() string {
	if RepoRoot() != "" {
		return "run `make tokenizers` or set KVEXACT_TOKENIZERS"
	}
	return "put the model's tokenizer.json and tokenizer_config.json there, point tokenizers.folders at the engines' model directory, or fetch them with tokenizers.hub; the gateway retries on its own"
}

// FolderFor is the default tokenizer folder name of a model slug: "/" becomes "__".
func FolderFor(model string) string { return strings.ReplaceAll(model, "/", "__") }
