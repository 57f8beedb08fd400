package sim

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sglang"
	"github.com/kvexact/kvexact/gateway/hashcore"
)

// workload sends n completions built from a few shared prefixes plus random suffixes (token-id
// prompts), from `workers` concurrent clients, so the small cache evicts and concurrent requests
// compute the same blocks.
func workload(t *testing.T, e *Engine, n, workers int, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	prefixes := make([][]int, 6)
	for i := range prefixes {
		p := make([]int, 8+rng.IntN(40))
		for j := range p {
			p[j] = 1000 + rng.IntN(500)
		}
		prefixes[i] = p
	}
	type job struct {
		prompt []int
		max    int
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	errs := make(chan string, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				resp, m := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": j.prompt, "max_tokens": j.max})
				if resp.StatusCode != 200 {
					select {
					case errs <- fmt.Sprintf("status %d: %v", resp.StatusCode, m):
					default:
					}
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		p := append([]int(nil), prefixes[rng.IntN(len(prefixes))]...)
		for k := rng.IntN(30); k > 0; k-- {
			p = append(p, 2000+rng.IntN(3000))
		}
		if rng.IntN(4) == 0 { // exact repeats: full-prompt hits and identical decode blocks
			p = prefixes[rng.IntN(len(prefixes))]
		}
		jobs <- job{p, 1 + rng.IntN(12)}
	}
	close(jobs)
	wg.Wait()
	select {
	case s := <-errs:
		t.Fatal(s)
	default:
	}
}

// TestZMQEventsRebuildCache: the events a subscriber decodes with our own decoders rebuild exactly
// the simulator's cache contents (copies counted) after a long randomized workload with evictions.
// Live messages are checked contiguous; the batches published before the subscription reached the
// publisher (slow joiner) come from replay.
func TestZMQEventsRebuildCache(t *testing.T) {
	for _, tc := range []struct{ family, release string }{
		{"vllm", "v0.25.1"}, {"vllm", "v0.23.0"}, {"sglang", "v0.5.18"}, {"sglang", "v0.5.21"},
	} {
		t.Run(tc.family+"-"+tc.release, func(t *testing.T) {
			seed := "0"
			e := startSim(t, tc.family, tc.release, func(c *Config) {
				c.BlockSize = 4
				c.CapacityBlocks = 48
				c.MaxConcurrency = 4
				c.PrefillChunk = 16
				c.MaxModelLen = 128
				c.Topic = "kv"
				if tc.family == "vllm" {
					c.Seed = &seed
					c.Algorithm = "sha256_cbor"
				}
			})
			sub := subscribe(t, e.PublishAddrs()[0], "kv")
			// Wait until the subscription has reached the publisher: send until a message arrives.
			// Each probe is a new prompt: a repeated one is cached and announces nothing new.
			probe := 0
			waitFor(t, 10*time.Second, "first live event", func() bool {
				probe++
				post(t, e.URL()+"/v1/completions", map[string]any{"prompt": []int{probe, 1000 + probe, 2, 3, 4, 5, 6, 7, 8}, "max_tokens": 1})
				return len(sub.snapshot()) > 0
			})
			workload(t, e, 250, 6, 1)
			if err := e.Quiesce(testCtx(t, 10*time.Second)); err != nil {
				t.Fatal(err)
			}
			next := e.NextSeq(0)
			waitFor(t, 10*time.Second, "all live events", func() bool {
				f := sub.snapshot()
				return len(f) > 0 && f[len(f)-1].seq == next-1
			})
			live := sub.snapshot()
			for i := 1; i < len(live); i++ {
				if live[i].seq != live[i-1].seq+1 {
					t.Fatalf("live sequence jumps from %d to %d", live[i-1].seq, live[i].seq)
				}
			}
			early, ok := replay(t, e.ReplayAddrs()[0], 0, 10*time.Second)
			if !ok {
				t.Fatal("replay did not answer")
			}
			bySeq := map[uint64][]byte{}
			for _, f := range early {
				bySeq[f.seq] = f.payload
			}
			for _, f := range live {
				if p, dup := bySeq[f.seq]; dup && string(p) != string(f.payload) {
					t.Fatalf("seq %d: live and replayed payloads differ", f.seq)
				}
				bySeq[f.seq] = f.payload
			}
			decode := decodeFor(tc.family)
			res := residency{}
			var stores, removes, dupStores int
			for s := uint64(0); s < next; s++ {
				p, ok := bySeq[s]
				if !ok {
					t.Fatalf("seq %d neither live nor replayed", s)
				}
				b, err := decode(p)
				if err != nil {
					t.Fatalf("seq %d: %v", s, err)
				}
				if tc.family == "sglang" {
					checkSGLangLayout(t, tc.release, p)
				}
				if !b.HasDPRank || b.DPRank != 0 {
					t.Fatalf("seq %d: rank %v/%d", s, b.HasDPRank, b.DPRank)
				}
				for _, ev := range b.Events {
					switch ev.Kind {
					case engines.BlockStored:
						stores++
						for _, h := range ev.BlockHashes {
							if res[h] > 0 {
								dupStores++
							}
						}
						checkStoredEvent(t, e, ev)
					case engines.BlockRemoved:
						removes++
					}
					res.apply(t, ev)
				}
			}
			if tc.family == "sglang" {
				first, _ := decode(bySeq[0])
				if len(first.Events) == 0 || first.Events[0].Kind != engines.AllBlocksCleared {
					t.Fatalf("SGLang's first batch is not AllBlocksCleared: %+v", first.Events)
				}
			}
			want := e.CacheKeys(0)
			if diff := cmp.Diff(map[uint64]int(want), map[uint64]int(res)); diff != "" {
				t.Fatalf("events do not rebuild the cache (-cache +events):\n%s", diff)
			}
			if removes == 0 {
				t.Fatal("the workload never evicted: the test proves nothing about removals")
			}
			if tc.family == "vllm" && dupStores == 0 {
				t.Fatal("vLLM never announced a duplicate copy")
			}
			if tc.family == "sglang" && dupStores != 0 {
				t.Fatalf("SGLang announced %d duplicate copies (its radix tree deduplicates)", dupStores)
			}
			t.Logf("%d batches, %d stored events (%d duplicate copies), %d removed events, %d resident keys", next, stores, dupStores, removes, len(res))
		})
	}
}

// checkSGLangLayout: every event of an SGLang payload is in its release's layout (v0.5.18 tagged
// arrays, v0.5.21 tagged maps); the decoder accepts both, so only the bytes tell them apart.
func checkSGLangLayout(t *testing.T, release string, p []byte) {
	t.Helper()
	l, err := sglang.LayoutForRelease(release)
	if err != nil {
		t.Fatal(err)
	}
	want := "array"
	if l == sglang.LayoutMap {
		want = "map"
	}
	var batch []any
	if err := msgpack.Unmarshal(p, &batch); err != nil || len(batch) != 3 {
		t.Fatalf("batch: %v %v", err, batch)
	}
	for i, ev := range batch[1].([]any) {
		got := "array"
		if _, ok := ev.(map[string]any); ok {
			got = "map"
		}
		if got != want {
			t.Fatalf("%s event %d is a %s, want a %s: %v", release, i, got, want, ev)
		}
	}
}

// checkStoredEvent recomputes the keys of a stored event from its tokens with the engine's binding
// (the chain is checked from the parent only when the event starts at block 0).
func checkStoredEvent(t *testing.T, e *Engine, ev engines.Event) {
	t.Helper()
	bs := e.cfg.BlockSize
	if ev.BlockSize != bs || len(ev.TokenIDs) != len(ev.BlockHashes)*bs {
		t.Fatalf("stored event geometry: block_size %d, %d tokens for %d hashes", ev.BlockSize, len(ev.TokenIDs), len(ev.BlockHashes))
	}
	if ev.Medium != engines.MediumGPU {
		t.Fatalf("medium %q", ev.Medium)
	}
	if e.cfg.Family == "vllm" && (!ev.HasGroupIdx || ev.SpecKind != "full_attention" || !ev.HasExtraKeys && e.cfg.Release == "v0.25.1") {
		t.Fatalf("vLLM stored event lacks group_idx / kv_cache_spec_kind / extra_keys: %+v", ev)
	}
	if ev.HasParent {
		return
	}
	keys, err := e.hasher.Keys(ev.TokenIDs, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ev.BlockHashes, keys); diff != "" {
		t.Fatalf("root event keys differ from the binding's (-event +binding):\n%s", diff)
	}
}

// TestTRTDrainRebuildsCache: the drained TensorRT-LLM events (decoded by our decoder) rebuild the
// cache, event_id counts without gaps, the startup `created` event comes first, stored hashes are
// the V1 keys of their tokens, and partial blocks appear.
func TestTRTDrainRebuildsCache(t *testing.T) {
	e := startSim(t, "trtllm", "1.2", func(c *Config) {
		c.BlockSize = 4
		c.CapacityBlocks = 48
		c.MaxConcurrency = 4
		c.PrefillChunk = 16
		c.MaxModelLen = 128
	})
	workload(t, e, 250, 6, 2)
	if err := e.Quiesce(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	evs := drainAll(t, e.URL())
	if len(evs) == 0 || evs[0].Kind != engines.CacheCreated || evs[0].NumBlocks[0] != 48 {
		t.Fatalf("first drained event is not created(48 blocks): %+v", evs[:min(1, len(evs))])
	}
	res := residency{}
	partial, removes := 0, 0
	for i, ev := range evs {
		if ev.EventID != uint64(i) {
			t.Fatalf("event %d has event_id %d", i, ev.EventID)
		}
		if !ev.HasWindowSize || ev.WindowSize != 128 {
			t.Fatalf("event %d window_size %v %d", i, ev.HasWindowSize, ev.WindowSize)
		}
		if ev.Kind == engines.BlockStored {
			parent := uint64(0)
			if ev.HasParent {
				parent = ev.Parent
			}
			for j, toks := range ev.BlockTokens {
				if len(toks) < 4 {
					partial++
				}
				if got := trtBlockKey(parent, toks); got != ev.BlockHashes[j] {
					t.Fatalf("event %d block %d: hash %d, V1 key of its tokens %d", i, j, ev.BlockHashes[j], got)
				}
				parent = ev.BlockHashes[j]
			}
		}
		if ev.Kind == engines.BlockRemoved {
			removes++
		}
		res.apply(t, ev)
	}
	if diff := cmp.Diff(map[uint64]int(e.CacheKeys(0)), map[uint64]int(res)); diff != "" {
		t.Fatalf("drained events do not rebuild the cache (-cache +events):\n%s", diff)
	}
	if removes == 0 || partial == 0 {
		t.Fatalf("workload too weak: %d removals, %d partial blocks", removes, partial)
	}
	if e.NextSeq(0) != uint64(len(evs)) {
		t.Fatalf("next event_id %d after %d events", e.NextSeq(0), len(evs))
	}
}

// TestDataParallelRanks: each rank publishes on port + rank with its own sequence space and
// stamps its rank; a request pinned to rank 1 lands only in rank 1's cache.
func TestDataParallelRanks(t *testing.T) {
	e := startSim(t, "vllm", "v0.25.1", func(c *Config) { c.DPRanks = 2; s := "1"; c.Seed = &s })
	pubs, reps := e.PublishAddrs(), e.ReplayAddrs()
	if len(pubs) != 2 || len(reps) != 2 {
		t.Fatalf("addresses %v %v", pubs, reps)
	}
	_, p0, _ := splitTCP(pubs[0])
	_, p1, _ := splitTCP(pubs[1])
	_, r0, _ := splitTCP(reps[0])
	_, r1, _ := splitTCP(reps[1])
	if p1 != p0+1 || r1 != r0+1 {
		t.Fatalf("ranks are not on port + rank: %v %v", pubs, reps)
	}
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = 500 + i
	}
	resp, m := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2, "data_parallel_rank": 1})
	if resp.StatusCode != 200 {
		t.Fatal(m)
	}
	if err := e.Quiesce(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if len(e.CacheKeys(0)) != 0 || len(e.CacheKeys(1)) == 0 {
		t.Fatalf("rank caches: %d / %d keys", len(e.CacheKeys(0)), len(e.CacheKeys(1)))
	}
	got, ok := replay(t, reps[1], 0, 5*time.Second)
	if !ok || len(got) == 0 || got[0].seq != 0 {
		t.Fatalf("rank 1 replay: %v %v", ok, got)
	}
	b, err := decodeFor("vllm")(got[0].payload)
	if err != nil || !b.HasDPRank || b.DPRank != 1 {
		t.Fatalf("rank 1 batch: %+v %v", b, err)
	}
	if empty, ok := replay(t, reps[0], 0, 5*time.Second); !ok || len(empty) != 0 {
		t.Fatalf("rank 0 replay: %v %v", ok, empty)
	}
}

// TestUnsetSeedIsRandomRoot: without PYTHONHASHSEED two vLLM simulators disagree on every key, with
// the same seed they agree with the hash core.
func TestUnsetSeedIsRandomRoot(t *testing.T) {
	prompt := make([]int, 32)
	for i := range prompt {
		prompt[i] = 7000 + i
	}
	keysOf := func(seed *string) []uint64 {
		e := startSim(t, "vllm", "v0.25.1", func(c *Config) { c.Seed = seed; c.PublishAddr = "tcp://*:0"; c.ReplayAddr = "" })
		post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1})
		if err := e.Quiesce(testCtx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		var ks []uint64
		for k := range e.CacheKeys(0) {
			ks = append(ks, k)
		}
		sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
		return ks
	}
	a, b := keysOf(nil), keysOf(nil)
	for _, k := range a {
		for _, k2 := range b {
			if k == k2 {
				t.Fatal("two unseeded simulators share a key: the root is not random")
			}
		}
	}
	s := "42"
	c := keysOf(&s)
	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.VLLMSHA256, BlockSize: 16, Seed: &s}, hashcore.ImplGo)
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, len(prompt))
	for i, p := range prompt {
		toks[i] = uint32(p)
	}
	want, _ := h.Keys(toks, nil, nil)
	sort.Slice(want, func(i, j int) bool { return want[i] < want[j] })
	if diff := cmp.Diff(want, c); diff != "" {
		t.Fatalf("seeded keys differ from the hash core (-core +sim):\n%s", diff)
	}
}
