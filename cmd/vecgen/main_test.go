package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/vectors"
)

// The committed files under vectors/generated are exactly what -seed 1 produces, and every file
// loads as a labelled generated vector file whose cases the Go reference reproduces.
func TestGeneratedFilesAreReproducible(t *testing.T) {
	files, err := Generate(1)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Generate(1)
	other, _ := Generate(2)
	root, err := vectors.Dir()
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(hashcore.Algorithms) {
		t.Fatalf("%d files for %d bindings", len(files), len(hashcore.Algorithms))
	}
	for name, data := range files {
		if !bytes.Equal(data, again[name]) {
			t.Errorf("%s: two runs with the same seed differ", name)
		}
		if bytes.Equal(data, other[name]) {
			t.Errorf("%s: seeds 1 and 2 give the same file", name)
		}
		path := filepath.Join(root, vectors.GeneratedDir, name)
		committed, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("%s: %v (run `go run ./cmd/vecgen`)", name, err)
			continue
		}
		if !bytes.Equal(committed, data) {
			t.Errorf("%s differs from `go run ./cmd/vecgen -seed 1` output", path)
		}
		f, err := vectors.Parse(path, data)
		if err != nil {
			t.Fatal(err)
		}
		if f.Header.Origin != vectors.GeneratedOrigin || len(f.Cases) < 6 {
			t.Errorf("%s: origin %q, %d cases", name, f.Header.Origin, len(f.Cases))
		}
		rep := vectors.VerifyFile(f, []hashcore.Impl{hashcore.ImplGo})
		if p, fl, s := rep.Counts(); fl != 0 || s != 0 || p != len(f.Cases) {
			t.Errorf("%s: %d passed, %d failed, %d skipped", name, p, fl, s)
		}
	}
}
