package parity

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/vectors"
)

// TestContractSeedRules ties every vLLM contract's seed rule to the engine-produced vectors that
// defend it: with PYTHONHASHSEED unset, the contract must resolve exactly the seed the engine's own
// code rooted its chain in (reproducible cases), and refuse where the engine's root was random.
// Those cases are then hashed through both cores with the contract's seed, not the file's.
func TestContractSeedRules(t *testing.T) {
	dir, err := vectors.Dir()
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range contracts.All() {
		if ct.Hash.Seed != "pythonhashseed" {
			continue
		}
		files, err := filepath.Glob(filepath.Join(dir, ct.Vectors, "*.json"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no vector files in %s (%v)", ct.ID, ct.Vectors, err)
		}
		unset := 0
		for _, path := range files {
			if strings.HasSuffix(filepath.Base(path), "samples.json") { // event samples, hybrid samples
				continue
			}
			f, err := vectors.Load(path)
			if err != nil {
				t.Fatal(err)
			}
			for i := range f.Cases {
				c := &f.Cases[i]
				if c.Seed != nil {
					continue
				}
				unset++
				seed, err := ct.EngineSeed(c.Algo, nil)
				switch {
				case !c.Reproducible:
					if !errors.Is(err, contracts.ErrRandomRoot) {
						t.Errorf("%s %s/%s: the engine's root was random, the contract resolves seed %v (err %v)", ct.ID, filepath.Base(path), c.Name, deref(seed), err)
					}
					continue
				case err != nil:
					t.Errorf("%s %s/%s: the engine rooted in %q, the contract refuses: %v", ct.ID, filepath.Base(path), c.Name, deref(c.RootSeed), err)
					continue
				case c.RootSeed == nil || *seed != *c.RootSeed:
					t.Errorf("%s %s/%s: contract seed %q, engine seed %v", ct.ID, filepath.Base(path), c.Name, *seed, deref(c.RootSeed))
					continue
				}
				cc := *c
				cc.Seed, cc.RootSeed = seed, nil
				for _, impl := range []hashcore.Impl{hashcore.ImplGo, hashcore.ImplC} {
					if !impl.Available() {
						continue
					}
					for _, fl := range vectors.VerifyCase(f, &cc, impl) {
						t.Errorf("%s %s/%s with the contract's seed: %s", ct.ID, filepath.Base(path), c.Name, fl)
					}
				}
			}
		}
		if unset == 0 {
			t.Errorf("%s: its vectors (%s) have no PYTHONHASHSEED-unset case, so its seed rule is undefended", ct.ID, ct.Vectors)
		}
	}
}

func deref(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// TestContractsDefendedByVectors: every algorithm a contract lets the engine binding use has an
// engine-produced vector file in the contract's vector folder, so a contract cannot be added (or an
// algorithm listed) without the engine's own output defending it.
func TestContractsDefendedByVectors(t *testing.T) {
	dir, err := vectors.Dir()
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range contracts.All() {
		if !ct.SupportsBinding("engine") {
			continue
		}
		files, err := filepath.Glob(filepath.Join(dir, ct.Vectors, "*.json"))
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]bool{}
		for _, path := range files {
			f, err := vectors.Load(path)
			if err != nil {
				continue // event samples and other files in the folder
			}
			if f.Header.Generated() {
				t.Errorf("%s: %s is generated, not engine-produced", ct.ID, path)
				continue
			}
			for _, c := range f.Cases {
				if c.Reproducible {
					have[c.Algo] = true
				}
			}
		}
		for _, a := range ct.Hash.Algorithms {
			if !have[a] {
				t.Errorf("%s: algorithm %s has no reproducible engine-produced vectors in %s", ct.ID, a, ct.Vectors)
			}
		}
	}
}
