package route

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/vectors"
)

// keyCacheBindings are bindings of every shape the cache must keep apart: seeded vLLM (pickle and
// CBOR), SGLang with and without bigram pages, the router key; block sizes 1 to 64.
func keyCacheBindings(tb testing.TB) []*hashcore.Hasher {
	tb.Helper()
	s0, s1 := "0", "1"
	var hs []*hashcore.Hasher
	for _, b := range []hashcore.Binding{
		{Algorithm: hashcore.VLLMSHA256, BlockSize: 16, Seed: &s0},
		{Algorithm: hashcore.VLLMSHA256, BlockSize: 16, Seed: &s1},
		{Algorithm: hashcore.VLLMSHA256CBOR, BlockSize: 4, Seed: &s0},
		{Algorithm: hashcore.VLLMXXHash, BlockSize: 1, Seed: &s0},
		{Algorithm: hashcore.SGLangSHA256, BlockSize: 8},
		{Algorithm: hashcore.SGLangSHA256, BlockSize: 8, Bigram: true},
		{Algorithm: hashcore.RouterXXH3V1, BlockSize: 64},
		{Algorithm: hashcore.RouterXXH3V1, BlockSize: 16},
	} {
		h, err := hashcore.New(b, hashcore.Default())
		if err != nil {
			tb.Fatal(err)
		}
		hs = append(hs, h)
	}
	return hs
}

// keyCacheExtras are the extras a prompt may carry (SGLang ignores the LoRA name: the keyer refuses
// it there, so only the salt varies for it).
func keyCacheExtras(h *hashcore.Hasher) []*hashcore.Extras {
	ex := []*hashcore.Extras{nil, {CacheSalt: "tenant-a"}, {CacheSalt: "tenant-b"}}
	if h.Binding().Algorithm != hashcore.SGLangSHA256 {
		ex = append(ex, &hashcore.Extras{LoRAName: "sql"}, &hashcore.Extras{LoRAName: "sql", CacheSalt: "tenant-a"})
	}
	return ex
}

// checkCached requires the cache's keys of ids to be the uncached keys.
func checkCached(t *testing.T, c *KeyCache, h *hashcore.Hasher, ids []uint32, ex *hashcore.Extras, what string) {
	t.Helper()
	want, werr := h.Keys(ids, ex, nil)
	got, err := c.Keys(h, ids, ex)
	if (err != nil) != (werr != nil) || !slices.Equal(got, want) {
		t.Fatalf("%s %s/%d (bigram %v), extras %+v, %d ids: cached keys %x (%v), uncached %x (%v)", what, h.Binding().Algorithm, h.Binding().BlockSize, h.Binding().Bigram, ex, len(ids), got, err, want, werr)
	}
}

// TestKeyCacheMatchesUncached is the differential test: random prompt pairs — the second extending
// the first, diverging from it at a random id, a prefix of it, equal to it, or the same ids under
// other extras or another binding — keyed through one shared cache give exactly the uncached keys.
// The extension reuses the first prompt's blocks; the same ids in another key space (other extras,
// another binding) reuse nothing — also when fingerprints collide.
func TestKeyCacheMatchesUncached(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	hs := keyCacheBindings(t)
	for _, v := range []struct {
		step int
		mask uint64
	}{{1, ^uint64(0)}, {7, ^uint64(0)}, {checkpointTokens, ^uint64(0)}, {1, 3}, {7, 1}} {
		step := v.step
		c := NewKeyCache(64 << 20)
		c.stepTokens, c.fpMask = step, v.mask // a narrow mask makes fingerprints collide all the time
		for round := 0; round < 60; round++ {
			h := hs[rnd.IntN(len(hs))]
			exs := keyCacheExtras(h)
			ex := exs[rnd.IntN(len(exs))]
			a := make([]uint32, 1+rnd.IntN(2000))
			for i := range a {
				a[i] = uint32(rnd.IntN(300)) // a small alphabet: chance agreements past a divergence
			}
			checkCached(t, c, h, a, ex, "first")
			cut := rnd.IntN(len(a) + 1)
			b := append(slices.Clone(a[:cut]), uint32(rnd.IntN(300)))
			for range rnd.IntN(600) {
				b = append(b, uint32(rnd.IntN(300)))
			}
			before := c.Stats()
			grown := append(slices.Clone(a), b...)
			checkCached(t, c, h, grown, ex, "extension")
			if st := c.Stats(); h.NumBlocks(len(a)) >= 2*max(1, step/h.Binding().BlockSize) && st.ReusedBlocks == before.ReusedBlocks {
				t.Fatalf("step %d round %d: an extension of a %d-id prompt reused no block (%+v)", step, round, len(a), st)
			}
			checkCached(t, c, h, b, ex, "divergent")
			checkCached(t, c, h, a[:cut], ex, "prefix")
			checkCached(t, c, h, a, ex, "equal")
			// Another key space: a fresh cache holding only a, so any reuse would be a's.
			fresh := NewKeyCache(64 << 20)
			fresh.stepTokens, fresh.fpMask = step, v.mask
			checkCached(t, fresh, h, a, ex, "first")
			for _, other := range exs {
				if other != ex {
					checkCached(t, fresh, h, a, other, "other extras")
				}
			}
			if o := hs[rnd.IntN(len(hs))]; !sameSpace(o, h) {
				checkCached(t, fresh, o, a, nil, "other binding")
			}
			if st := fresh.Stats(); st.ReusedBlocks != 0 || st.Hits != 0 {
				t.Fatalf("another key space reused the blocks of %+v with extras %+v: %+v", h.Binding(), ex, st)
			}
		}
	}
}

func sameSpace(a, b *hashcore.Hasher) bool {
	sa, _ := spaceOf(a, nil)
	sb, _ := spaceOf(b, nil)
	return sa == sb
}

// TestKeyCacheBound: the cache stays within its bytes, evicts the least recently used prompt, and
// still answers exactly; a nil cache hashes everything; multimodal extras bypass it.
func TestKeyCacheBound(t *testing.T) {
	seed := "0"
	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.VLLMSHA256, BlockSize: 16, Seed: &seed}, hashcore.Default())
	if err != nil {
		t.Fatal(err)
	}
	prompt := func(i, n int) []uint32 {
		ids := make([]uint32, n)
		for j := range ids {
			ids[j] = uint32(i*100003 + j)
		}
		return ids
	}
	c := NewKeyCache(40 << 10) // about six 1024-id prompts
	for i := 0; i < 20; i++ {
		checkCached(t, c, h, prompt(i, 1024), nil, "fill")
		if st := c.Stats(); st.Bytes > st.MaxBytes {
			t.Fatalf("after %d prompts %d bytes held, bound %d", i+1, st.Bytes, st.MaxBytes)
		}
	}
	st := c.Stats()
	if st.Evictions == 0 || st.Entries == 0 || st.Entries >= 20 || st.Misses != 20 {
		t.Fatalf("stats after 20 distinct prompts: %+v", st)
	}
	checkCached(t, c, h, prompt(19, 1100), nil, "recent")
	if c.Stats().Hits != 1 {
		t.Fatalf("the most recent prompt was evicted: %+v", c.Stats())
	}
	checkCached(t, c, h, prompt(0, 1100), nil, "evicted")
	if c.Stats().Hits != 1 {
		t.Fatalf("the oldest prompt was kept: %+v", c.Stats())
	}
	// An extension replaces the prompt it extends: one entry per conversation.
	n := c.Stats().Entries
	checkCached(t, c, h, prompt(19, 1300), nil, "extension")
	if c.Stats().Entries != n {
		t.Fatalf("entries %d → %d: the extended prompt was kept beside its extension", n, c.Stats().Entries)
	}
	var none *KeyCache
	checkCached(t, none, h, prompt(1, 1024), nil, "nil cache")
	if none.Stats() != (KeyCacheStats{}) || NewKeyCache(0) != nil {
		t.Fatal("a nil or zero-byte cache has stats")
	}
	mm := &hashcore.Extras{MM: []hashcore.MMFeature{{Identifier: "img", Offset: 3, Length: 40}}}
	before := c.Stats()
	checkCached(t, c, h, prompt(19, 1300), mm, "multimodal")
	if st := c.Stats(); st.Hits != before.Hits || st.Misses != before.Misses {
		t.Fatalf("multimodal extras went through the cache: %+v → %+v", before, st)
	}
}

// TestKeyCacheConcurrent: goroutines extending their own conversations (sharing a first turn) through
// one small cache always get the uncached keys (run it with -race).
func TestKeyCacheConcurrent(t *testing.T) {
	seed := "0"
	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.VLLMSHA256CBOR, BlockSize: 16, Seed: &seed}, hashcore.Default())
	if err != nil {
		t.Fatal(err)
	}
	c := NewKeyCache(200 << 10)
	shared := make([]uint32, 700)
	for i := range shared {
		shared[i] = uint32(i)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := slices.Clone(shared)
			for turn := 0; turn < 12; turn++ {
				for i := 0; i < 150; i++ {
					ids = append(ids, uint32(g*1000000+turn*1000+i))
				}
				want, _ := h.Keys(ids, nil, nil)
				got, err := c.Keys(h, ids, nil)
				if err != nil || !slices.Equal(got, want) {
					errs <- fmt.Sprintf("goroutine %d turn %d: cached keys differ (%v)", g, turn, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	if st := c.Stats(); st.Hits == 0 || st.Bytes > st.MaxBytes {
		t.Fatalf("stats %+v", st)
	}
}

// TestKeyCacheVectors: the engine-produced block-hash vectors (every case the request path can key:
// no multimodal items, prompt embeddings, decode-time or group hashing), keyed through the cache —
// half the prompt first, then all of it, then again — give the engine's keys each time, the later
// passes from reused blocks.
func TestKeyCacheVectors(t *testing.T) {
	dir, err := vectors.Dir()
	if err != nil {
		t.Skipf("no vectors: %v", err)
	}
	paths, err := vectors.BlockHashFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	checked, reused := 0, uint64(0)
	for _, path := range paths {
		f, err := vectors.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if f.Header.Generated() {
			continue
		}
		for i := range f.Cases {
			cs := &f.Cases[i]
			r := cs.Request
			if len(r.MM) > 0 || r.PromptEmbedsRows != nil || cs.PromptLen > 0 || cs.GroupBlockSize > 0 || vectors.SkipReason(cs) != "" || len(cs.Expected.Keys) < 2 {
				continue
			}
			b := cs.Binding()
			if b.Algorithm.IsVLLM() && b.Seed == nil {
				continue
			}
			h, err := hashcore.New(b, hashcore.Default())
			if err != nil {
				t.Fatalf("%s %s: %v", path, cs.Name, err)
			}
			var ex *hashcore.Extras
			if r.LoRAName != "" || r.CacheSalt != "" {
				ex = &hashcore.Extras{LoRAName: r.LoRAName, CacheSalt: r.CacheSalt, Tagged: cs.TaggedExtras, LoRAPath: r.LoRAPath}
			}
			c := NewKeyCache(1 << 20)
			c.stepTokens = 1
			half := cs.Tokens[:len(cs.Tokens)/2]
			for pass, ids := range [][]uint32{half, cs.Tokens, cs.Tokens} {
				got, err := c.Keys(h, ids, ex)
				want := cs.Expected.Keys[:h.NumBlocks(len(ids))]
				if err != nil || !slices.Equal(got, want) {
					t.Fatalf("%s %s pass %d: cached keys %v (%v), engine %v", path, cs.Name, pass, got, err, want)
				}
			}
			if c.Stats().Hits == 0 {
				t.Fatalf("%s %s: no pass reused a block (%+v)", path, cs.Name, c.Stats())
			}
			checked++
			reused += c.Stats().ReusedBlocks
		}
	}
	if checked == 0 {
		t.Fatal("no vector case keyed through the cache")
	}
	t.Logf("%d engine vector cases keyed through the key cache, %d blocks reused", checked, reused)
}

// FuzzKeyCache: two prompts from the fuzzer's bytes, the second sharing a chosen prefix with the
// first, under a chosen binding, extras and checkpoint spacing, give the uncached keys through one
// cache, in either order and repeated.
func FuzzKeyCache(f *testing.F) {
	f.Add([]byte("\x00\x01\x10some ids of a first prompt"), []byte("a second one"), uint16(7))
	f.Add([]byte("\x05\x02\x01"), []byte{}, uint16(0))
	f.Add([]byte("\x06\x03\x03 bigram pages, page size eight"), []byte("and a tail"), uint16(300))
	hs := keyCacheBindings(f)
	f.Fuzz(func(t *testing.T, a, b []byte, shared uint16) {
		if len(a) < 3 {
			return
		}
		h := hs[int(a[0])%len(hs)]
		exs := keyCacheExtras(h)
		ex := exs[int(a[1])%len(exs)]
		c := NewKeyCache(1 << 20)
		c.stepTokens = 1 + int(a[2])
		ids := func(p []byte) []uint32 {
			out := make([]uint32, len(p))
			for i, v := range p {
				out[i] = uint32(v) * 65599
			}
			return out
		}
		first := ids(a[3:])
		cut := min(int(shared), len(first))
		second := append(slices.Clone(first[:cut]), ids(b)...)
		for _, p := range [][]uint32{first, second, first, second[:len(second)/2], second} {
			checkCached(t, c, h, p, ex, "fuzz")
		}
	})
}
