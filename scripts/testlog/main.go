// Command testlog reads `go test -json` on stdin and prints what a reader of `make test` needs: one
// line per package as `go test` prints it, every skipped test with its reason, and the full output of
// every failed test. It exits 1 when a test or a build failed, or when the stream held no package
// result (go test could not run), so `make test` fails without needing the shell's pipefail.
//
//	go test -json ./... | go run ./scripts/testlog
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type key struct{ pkg, test string }

func main() { os.Exit(run(os.Stdin, os.Stdout)) }

func run(in io.Reader, out io.Writer) int {
	outputs := map[key][]string{}
	var skips []string
	failed, results := false, 0
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(out, string(line)) // not an event: go test's own message, pass it on
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output", "build-output":
			outputs[k] = append(outputs[k], e.Output)
		case "skip":
			if e.Test == "" {
				continue // a package without tests: its "?" line is in its output
			}
			skips = append(skips, fmt.Sprintf("SKIP %s %s: %s", e.Package, e.Test, reason(outputs[k])))
			delete(outputs, k)
		case "pass":
			if e.Test == "" {
				results++
				fmt.Fprint(out, strings.Join(packageLines(outputs[k]), ""))
			}
			delete(outputs, k)
		case "fail", "build-fail":
			failed = true
			if e.Test != "" {
				fmt.Fprintf(out, "--- FAIL: %s %s\n%s", e.Package, e.Test, strings.Join(outputs[k], ""))
			} else {
				results++
				fmt.Fprint(out, strings.Join(outputs[k], ""))
			}
			delete(outputs, k)
		}
	}
	sort.Strings(skips)
	if len(skips) > 0 {
		fmt.Fprintf(out, "\n%d skipped tests:\n%s\n", len(skips), strings.Join(skips, "\n"))
	}
	if failed || results == 0 {
		return 1
	}
	return 0
}

// packageLines keeps a passing package's summary lines (ok …, ? … [no test files]).
func packageLines(lines []string) []string {
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "?   ") || strings.HasPrefix(l, "ok\t") {
			out = append(out, l)
		}
	}
	return out
}

// reason is what a skipped test printed, without the runner's own lines, on one line.
func reason(lines []string) string {
	var r []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		r = append(r, t)
	}
	if len(r) == 0 {
		return "(no reason given)"
	}
	return strings.Join(r, " ")
}
