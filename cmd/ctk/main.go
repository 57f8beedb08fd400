// Command ctk is kvexact's conformance test kit: vector checks, tokenizer checks, event tailing and
// pool certification. Each subcommand lives in its own file and registers itself in init.
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/kvexact/kvexact/internal/buildinfo"
)

// A command runs with the arguments after its name and returns the process exit status.
type command struct {
	summary string
	run     func(args []string) int
}

var commands = map[string]command{}

func register(name, summary string, run func(args []string) int) {
	commands[name] = command{summary: summary, run: run}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: ctk <command> [arguments]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-18s %s\n", n, commands[n].summary)
	}
}

func main() {
	if buildinfo.Flag("ctk", os.Args[1:], os.Stdout) {
		return
	}
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	// Commands may be one or two words ("tokenize", "vectors verify").
	if len(os.Args) >= 3 {
		if c, ok := commands[os.Args[1]+" "+os.Args[2]]; ok {
			os.Exit(c.run(os.Args[3:]))
		}
	}
	if c, ok := commands[os.Args[1]]; ok {
		os.Exit(c.run(os.Args[2:]))
	}
	fmt.Fprintf(os.Stderr, "ctk: unknown command %q\n", strings.Join(os.Args[1:min(3, len(os.Args))], " "))
	usage()
	os.Exit(2)
}
