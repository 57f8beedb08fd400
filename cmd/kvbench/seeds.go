package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

func parseSeeds(list string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(list, ",") {
		s, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a seed", f)
		}
		if slices.Contains(out, s) {
			return nil, fmt.Errorf("seed %d given twice", s)
		}
		out = append(out, s)
	}
	return out, nil
}

// runSeedSweep is the sweep with --seeds: kvbench.RunSeeds, each seed's report saved after every
// cell (results-seedN.json), then the seeds table of them (seeds.md).
func runSeedSweep(ctx context.Context, env *kvbench.Env, plan kvbench.Plan, seeds []uint64, command, out string) int {
	path := func(s uint64) string { return filepath.Join(out, fmt.Sprintf("results-seed%d.json", s)) }
	var saveErr error
	save := func(rep *kvbench.Report) {
		rep.Command = command
		if err := kvbench.SaveReport(path(rep.Plan.Seed), rep); err != nil && saveErr == nil {
			saveErr = err
			fmt.Fprintf(os.Stderr, "kvbench: %v\n", err)
		}
	}
	reps, err := kvbench.RunSeeds(ctx, env, plan, seeds, func(rep *kvbench.Report, c *kvbench.Cell) {
		printCell(fmt.Sprintf("seed %d ", rep.Plan.Seed), c)
		save(rep)
	})
	if reps == nil {
		fmt.Fprintf(os.Stderr, "kvbench: %v\n", err)
		return 1
	}
	var files []kvbench.SeedFile
	failed := 0
	for _, rep := range reps {
		save(rep)
		files = append(files, kvbench.SeedFile{Path: path(rep.Plan.Seed), Report: rep})
		failed += len(rep.Failed())
	}
	if err != nil || saveErr != nil {
		fmt.Fprintf(os.Stderr, "kvbench: %v (the results-seedN.json files hold the cells measured)\n", cmp.Or(err, saveErr))
		return 1
	}
	t, err := kvbench.BuildSeedTable(files)
	if err == nil {
		err = os.WriteFile(filepath.Join(out, "seeds.md"), []byte(t.Markdown()), 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvbench: seeds table: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "kvbench: seeds table in %s\n", filepath.Join(out, "seeds.md"))
	if failed > 0 {
		fmt.Fprintf(os.Stderr, "kvbench: %d cells failed (results-seedN.json name them)\n", failed)
		return exitFailedCells
	}
	return 0
}
