package main

import (
	"os"
	"strings"
	"testing"
)

// TestSeedsTablesInDocs: the multi-seed tables of the docs are kvbench seeds' output on the
// committed raw results, verbatim (a table edited by hand, or a change to the tool, fails here).
func TestSeedsTablesInDocs(t *testing.T) {
	t.Chdir("../..") // the paths are the ones the docs' commands name
	raw := "docs/bench/raw/kvbench/"
	for _, c := range []struct {
		doc   string
		files []string
	}{
		{"docs/benchmarks/offload.md", []string{raw + "offload-seed1.json", raw + "offload-seed2.json", raw + "offload-seed3.json"}},
		{"docs/benchmarks/offload.md", []string{raw + "offload-quiet/results-seed1.json", raw + "offload-quiet/results-seed2.json", raw + "offload-quiet/results-seed3.json"}},
		{"docs/benchmarks/lora-tenants.md", []string{raw + "lora-tenants/results-seed1.json", raw + "lora-tenants/results-seed2.json", raw + "lora-tenants/results-seed3.json"}},
	} {
		md, err := seedsTable(c.files)
		if err != nil {
			t.Fatalf("%s: %v", c.doc, err)
		}
		doc, err := os.ReadFile(c.doc)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(doc), md) {
			t.Errorf("%s does not hold kvbench seeds --results %s verbatim; it should read:\n%s", c.doc, strings.Join(c.files, ","), md)
		}
	}
}

func TestRunSeedsUsage(t *testing.T) {
	if got := runSeeds(nil); got != 2 {
		t.Fatalf("no --results: exit %d, want 2", got)
	}
	if got := runSeeds([]string{"--results", "does-not-exist.json"}); got != 1 {
		t.Fatalf("a missing file: exit %d, want 1", got)
	}
}

func TestParseSeeds(t *testing.T) {
	if got, err := parseSeeds("3, 1,2"); err != nil || len(got) != 3 || got[0] != 3 || got[1] != 1 || got[2] != 2 {
		t.Fatalf("parseSeeds = %v, %v", got, err)
	}
	for _, bad := range []string{"1,x", "1,1", "", "-1"} {
		if _, err := parseSeeds(bad); err == nil {
			t.Errorf("parseSeeds(%q) accepted", bad)
		}
	}
	if got := runSweep(t.Context(), []string{"--seed", "2", "--seeds", "1,2"}); got != 2 {
		t.Fatalf("--seed with --seeds: exit %d, want 2", got)
	}
}
