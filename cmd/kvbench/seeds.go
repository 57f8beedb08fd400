package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvexact/kvexact/bench/kvbench"
)

// runSeeds writes the seeds table of several results.json (kvbench.SeedTable).
func runSeeds(args []string) int {
	fs := flag.NewFlagSet("kvbench seeds", flag.ContinueOnError)
	results := fs.String("results", "", "comma-separated results.json files: one run per seed, or several per seed holding different cells")
	out := fs.String("out", "", "file for the Markdown table (default: standard output)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *results == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "kvbench seeds: --results a.json,b.json,... is required (and nothing else)")
		return 2
	}
	var paths []string
	for _, p := range strings.Split(*results, ",") {
		if p = strings.TrimSpace(p); p != "" {
			paths = append(paths, p)
		}
	}
	md, err := seedsTable(paths)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench seeds: %v\n", err)
		return 1
	}
	if *out == "" {
		fmt.Print(md)
		return 0
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err == nil {
		err = os.WriteFile(*out, []byte(md), 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench seeds: %v\n", err)
		return 1
	}
	return 0
}

func seedsTable(paths []string) (string, error) {
	files, err := kvbench.ReadSeedFiles(paths)
	if err != nil {
		return "", err
	}
	t, err := kvbench.BuildSeedTable(files)
	if err != nil {
		return "", err
	}
	return t.Markdown(), nil
}
