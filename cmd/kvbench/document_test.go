package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/bench/kvbench"
)

// TestBenchmarksDocument: docs/BENCHMARKS.md is exactly what the assembler makes of the committed raw
// results (docs/bench/raw) and sections (docs/benchmarks), so text written into it by hand — which
// the next `make bench` would drop — fails here, and every link to a heading in it resolves.
func TestBenchmarksDocument(t *testing.T) {
	const docs = "../../docs"
	got, err := os.ReadFile(filepath.Join(docs, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	want, err := kvbench.Document(filepath.Join(docs, "bench", "raw"), filepath.Join(docs, "benchmarks"), filepath.Join(docs, "bench"), docs)
	if err != nil {
		t.Fatalf("assembling the document: %v", err)
	}
	if err := os.WriteFile(out, []byte(want), 0o644); err != nil {
		t.Fatal(err)
	}
	if diff := firstDifference(string(got), want); diff != "" {
		t.Fatalf("docs/BENCHMARKS.md differs from the document assembled from docs/bench/raw and docs/benchmarks (written to %s): %s\n"+
			"Edit docs/benchmarks/NAME.md (summary rows: docs/benchmarks/%s), not docs/BENCHMARKS.md, then run: %s",
			out, diff, kvbench.TargetsFile, kvbench.DocumentOnlyCommand)
	}
	for _, a := range brokenAnchors(want) {
		t.Errorf("link to #%s: no heading of docs/BENCHMARKS.md has that anchor", a)
	}
}

// firstDifference names the first line where two texts differ, "" when they are equal.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(g), len(w)); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if i >= len(g) || i >= len(w) || gl != wl {
			return fmt.Sprintf("line %d is\n\t%q\nthe assembler writes\n\t%q", i+1, clip(gl), clip(wl))
		}
	}
	return ""
}

func clip(s string) string {
	if r := []rune(s); len(r) > 200 {
		return string(r[:200]) + "…"
	}
	return s
}

var (
	headingLine = regexp.MustCompile(`(?m)^#+ (.*)$`)
	anchorLink  = regexp.MustCompile(`\]\(#([^)\s]+)\)`)
)

// brokenAnchors lists the in-document links whose fragment no heading has (a repeated heading's
// anchor takes -1, -2, … as on GitHub).
func brokenAnchors(doc string) []string {
	have := map[string]bool{}
	seen := map[string]int{}
	for _, m := range headingLine.FindAllStringSubmatch(doc, -1) {
		a := kvbench.Anchor(m[1])
		if n, ok := seen[a]; ok {
			seen[a] = n + 1
			have[fmt.Sprintf("%s-%d", a, n+1)] = true
			continue
		}
		seen[a] = 0
		have[a] = true
	}
	var bad []string
	for _, m := range anchorLink.FindAllStringSubmatch(doc, -1) {
		if !have[m[1]] {
			bad = append(bad, m[1])
		}
	}
	return bad
}
