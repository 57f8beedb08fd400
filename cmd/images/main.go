// Command images builds the container images of the project's own commands — each statically
// linked (the cgo hash core stays in) into a FROM scratch image with the host's CA bundle, tagged
// kvexact/<command>:dev — the same way the container tests build them (containers.BuildImages):
//
//	images [-out DIR] [command ...]   # default: enginesim gateway ctk
//
// The binaries are kept in DIR (default: a temporary folder, removed afterwards). make images runs
// it, then scripts/vllm-image.sh for the real vLLM engine's image.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kvexact/kvexact/containers"
	"github.com/kvexact/kvexact/internal/buildinfo"
)

func main() {
	if buildinfo.Flag("images", os.Args[1:], os.Stdout) {
		return
	}
	out := flag.String("out", "", "folder for the static binaries (default: a temporary one, removed afterwards)")
	flag.Parse()
	if err := run(*out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(out string, cmds []string) error {
	if len(cmds) == 0 {
		cmds = []string{"enginesim", "gateway", "ctk"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	root, err := containers.ModuleRoot()
	if err != nil {
		return err
	}
	if out == "" {
		if out, err = os.MkdirTemp("", "kvexact-images-"); err != nil {
			return err
		}
		defer os.RemoveAll(out)
	}
	h, err := containers.Connect(ctx, containers.Options{})
	if err != nil {
		return err
	}
	defer h.Close()
	start := time.Now()
	if _, err := h.BuildImages(ctx, root, out, cmds...); err != nil {
		return err
	}
	for _, c := range cmds {
		fmt.Println(containers.ImageOf(c))
	}
	fmt.Fprintf(os.Stderr, "images: built in %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}
