package parity

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/vectors"
)

// TestBlockHashVectors runs every case of every block-hash vector file (vLLM's four algorithms,
// SGLang's page hash, and the project's generated files) against the Go reference and the C core.
// Engine-produced files are engine truth; generated files (origin kvexact-vecgen) only pin Go/C
// agreement with the Go reference's own earlier output.
func TestBlockHashVectors(t *testing.T) {
	engines := map[string]bool{}
	for _, lf := range blockHashFiles(t) {
		rel, f := lf.rel, lf.f
		if !f.Header.Generated() {
			engines[f.Header.Engine+"/"+f.Header.Algo] = true
		}
		t.Run(rel, func(t *testing.T) {
			for _, impl := range []hashcore.Impl{hashcore.ImplGo, hashcore.ImplC} {
				t.Run(impl.String(), func(t *testing.T) {
					if !impl.Available() {
						t.Skip("C core not built (this build has no cgo); only the Go reference was checked")
					}
					for i := range f.Cases {
						c := &f.Cases[i]
						t.Run(c.Name, func(t *testing.T) {
							if reason := vectors.SkipReason(c); reason != "" {
								t.Skip(reason)
							}
							for _, fl := range vectors.VerifyCase(f, c, impl) {
								msg := fl.String()
								if fl.Detail != "" {
									msg += "\n" + fl.Detail
								}
								t.Error(msg)
							}
						})
					}
				})
			}
		})
	}
	// The suite must cover every engine-produced binding, not silently shrink.
	for _, want := range []string{"vllm/sha256", "vllm/sha256_cbor", "vllm/xxhash", "vllm/xxhash_cbor", "vllm/sha256_msgpack", "vllm/xxhash_msgpack", "sglang/"} {
		if !engines[want] {
			t.Errorf("no engine-produced vector file for %s", want)
		}
	}
}

// TestBlockHashVectorsCount pins how many engine cases run, so a loader that drops cases fails.
func TestBlockHashVectorsCount(t *testing.T) {
	counts := map[string]int{}
	for _, lf := range blockHashFiles(t) {
		rel, f := lf.rel, lf.f
		if f.Header.Generated() {
			continue
		}
		counts[strings.TrimSuffix(filepath.ToSlash(rel), ".json")] += len(f.Cases)
	}
	want := map[string]int{}
	for _, a := range []string{"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"} {
		want["vllm/v0.25.1/"+a] = 72
		want["vllm/v0.28.0/"+a] = 74
	}
	want["vllm/main-msgpack/sha256_msgpack"] = 74
	want["vllm/main-msgpack/xxhash_msgpack"] = 74
	want["sglang/v0.5.18/page_hash"] = 61
	for k, n := range want {
		if counts[k] != n {
			t.Errorf("%s: %d cases, want %d", k, counts[k], n)
		}
	}
}

// blockHashFiles loads every block-hash vector file, each with its path relative to the vectors
// folder, in the order vectors.BlockHashFiles gives.
func blockHashFiles(t *testing.T) []loadedFile {
	t.Helper()
	dir, err := vectors.Dir()
	if err != nil {
		t.Fatal(err)
	}
	paths, err := vectors.BlockHashFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]loadedFile, 0, len(paths))
	for _, path := range paths {
		f, err := vectors.Load(path)
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		rel, _ := filepath.Rel(dir, path)
		out = append(out, loadedFile{rel: rel, f: f})
	}
	return out
}

type loadedFile struct {
	rel string
	f   *vectors.File
}
