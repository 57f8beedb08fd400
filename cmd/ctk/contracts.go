package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/kvexact/kvexact/contracts"
)

func init() {
	register("contracts", "list the pinned engine contracts (family, release range, pin, vector set, seed rule); --check-index [--index URL]: the releases the package index serves beyond each family's newest pin, and the yanked ones",
		func(args []string) int { return listContracts(args, os.Stdout, os.Stderr) })
}

// contractRow is one line of `ctk contracts` (and one object of --json); scripts read these names.
type contractRow struct {
	ID             string   `json:"id"`
	Family         string   `json:"family"`
	Releases       string   `json:"releases"`
	Pin            string   `json:"pin"`
	Commit         string   `json:"commit"`
	CommitVerified bool     `json:"commitVerified"`
	Vectors        string   `json:"vectors"`
	Algorithms     []string `json:"algorithms"`
	SeedRule       string   `json:"seedRule"`
}

// seedRule says in one phrase what an unset PYTHONHASHSEED means for the contract.
func seedRule(c *contracts.Contract) string {
	switch {
	case c.Hash.Seed != "pythonhashseed":
		return "no seed"
	case c.Hash.DefaultSeed == nil:
		return "PYTHONHASHSEED; unset = random roots"
	}
	return fmt.Sprintf("PYTHONHASHSEED; unset = %q for %s, random for the others", c.Hash.DefaultSeed.Value, strings.Join(c.Hash.DefaultSeed.Algorithms, ", "))
}

func listContracts(args []string, stdout, stderr io.Writer) int {
	asJSON, check, index := false, false, DefaultPackageIndex
	for i := 0; i < len(args); i++ {
		switch a := args[i]; a {
		case "--json", "-json":
			asJSON = true
		case "--check-index", "-check-index":
			check = true
		case "--index", "-index":
			if i+1 == len(args) || !strings.HasPrefix(args[i+1], "http") {
				fmt.Fprintf(stderr, "usage: ctk contracts [--json] [--check-index [--index URL]]\nctk contracts: --index needs the index's JSON API URL (default %s)\n", DefaultPackageIndex)
				return 2
			}
			i++
			index = args[i]
		default:
			fmt.Fprintf(stderr, "usage: ctk contracts [--json] [--check-index [--index URL]]\nctk contracts: unknown argument %q\n", a)
			return 2
		}
	}
	if check {
		return checkIndex(index, asJSON, stdout, stderr)
	}
	var rows []contractRow
	for _, c := range contracts.All() {
		rows = append(rows, contractRow{ID: c.ID, Family: c.Family, Releases: c.Versions.String(), Pin: c.Pin.Release,
			Commit: c.Pin.Commit, CommitVerified: c.Pin.CommitVerified, Vectors: c.Vectors, Algorithms: c.Hash.Algorithms, SeedRule: seedRule(c)})
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			fmt.Fprintf(stderr, "ctk contracts: %v\n", err)
			return 1
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FAMILY\tRELEASES\tCONTRACT\tPIN\tCOMMIT\tVECTORS\tSEED")
	for _, r := range rows {
		commit := r.Commit
		if len(commit) > 12 {
			commit = commit[:12]
		}
		if !r.CommitVerified {
			commit += " (unverified)"
		}
		vec := r.Vectors
		if vec == "" {
			vec = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Family, r.Releases, r.ID, r.Pin, commit, vec, r.SeedRule)
	}
	if err := tw.Flush(); err != nil {
		fmt.Fprintf(stderr, "ctk contracts: %v\n", err)
		return 1
	}
	return 0
}
