package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/vectors"
)

func init() {
	register("vectors verify", "check block-hash vector files against the Go reference and the C hash core",
		func(args []string) int {
			return vectorsVerify(args, os.Stdout, os.Stderr, []hashcore.Impl{hashcore.ImplGo, hashcore.ImplC})
		})
}

// vectorsVerify checks every case of every file against every implementation in impls. A file is
// either in the project's schema (validated against vectors/schema/kvexact_vectors_v1.schema.json on
// load) or an engine-produced original in its engine's own layout; vectors.Load reads both. An
// event-payload sample file (either schema) is read by vectors.LoadSamples and reported by its
// sample count. It prints one line per failing case and per skipped (not reproducible) case, then
// "N passed, M failed" over all files. Exit status: 2 when a file is unreadable or not a vector
// file, or an implementation is missing from this build; else 1 when a case failed; else 0.
func vectorsVerify(files []string, stdout, stderr io.Writer, impls []hashcore.Impl) int {
	if len(files) == 0 {
		fmt.Fprintln(stderr, "usage: ctk vectors verify FILE...")
		return 2
	}
	for _, impl := range impls {
		if !impl.Available() {
			fmt.Fprintf(stderr, "ctk vectors verify: this build has no %s hash core (built without cgo); refusing to check only some implementations\n", impl)
			return 2
		}
	}
	status := 0
	passed, failed := 0, 0
	for _, path := range files {
		f, err := vectors.Load(path)
		if errors.Is(err, vectors.ErrNotVectorFile) {
			// An event-payload sample file: the one sample loader checks it (the project's against
			// the JSON Schema); its payloads are decoded by go test ./parity.
			if sf, serr := vectors.LoadSamples(path); serr == nil {
				fmt.Fprintf(stdout, "%s: %d event-payload samples read (%s)\n", path, len(sf.Samples), sf.Header.Schema)
				continue
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s: not checked: %v\n", path, err)
			status = 2
			continue
		}
		rep := vectors.VerifyFile(f, impls)
		for _, c := range rep.Cases {
			switch {
			case c.SkipReason != "":
				fmt.Fprintf(stdout, "%s: %s: skipped: %s\n", path, c.Case.Name, c.SkipReason)
			case len(c.Failures) > 0:
				line := c.Failures[0].String()
				if n := len(c.Failures) - 1; n > 0 {
					line += fmt.Sprintf(" (+%d more)", n)
				}
				fmt.Fprintln(stdout, line)
			}
		}
		p, fl, _ := rep.Counts()
		passed += p
		failed += fl
	}
	fmt.Fprintf(stdout, "%d passed, %d failed\n", passed, failed)
	if status == 0 && failed > 0 {
		status = 1
	}
	return status
}
