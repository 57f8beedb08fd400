package sim

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm"
)

// TestOffloadTier pins the offload tier's rules (offload.go): write-through stores announced with
// medium CPU after the GPU's, one per block, a GPU eviction leaving the host copy, a lookup continuing the GPU
// prefix on the host (loaded, then cached on the GPU again without a second host store), and the
// host's least recently used eviction (a prompt's last blocks first) announced as one removal
// before the store that needed the room.
func TestOffloadTier(t *testing.T) {
	c := newCache(5, 4, policyFor("vllm"), func(s *seq, first, last int) engines.Event {
		return engines.Event{Kind: engines.BlockStored, BlockHashes: append([]uint64(nil), s.keys[first:last]...), Medium: engines.MediumGPU}
	})
	c.off = newOffloadTier(6)
	run := func(keys []uint64, tokens int) (string, *seq) {
		t.Helper()
		s := &seq{keys: keys}
		if !c.admit(s, tokens, tokens) {
			t.Fatalf("%d tokens not admitted", tokens)
		}
		if !c.grow(s, tokens) {
			t.Fatalf("%d tokens: pool exhausted", tokens)
		}
		c.store(s, tokens/c.bs)
		c.release(s)
		var b strings.Builder
		for _, ev := range c.take() {
			fmt.Fprintf(&b, "%s %s %x; ", ev.Kind, ev.Medium, ev.BlockHashes)
		}
		return b.String(), s
	}
	for i, step := range []struct {
		keys      []uint64
		tokens    int
		want      string
		gpu, host int // the request's hits at admission
	}{
		{[]uint64{0xa1, 0xa2}, 9, "BlockStored GPU [a1 a2]; BlockStored CPU [a1]; BlockStored CPU [a2]; ", 0, 0},
		{[]uint64{0xb1, 0xb2, 0xb3, 0xb4}, 16,
			"BlockRemoved GPU [a2]; BlockRemoved GPU [a1]; BlockStored GPU [b1 b2 b3 b4]; BlockStored CPU [b1]; BlockStored CPU [b2]; BlockStored CPU [b3]; BlockStored CPU [b4]; ", 0, 0},
		// a1, a2 are on the host only: loaded, cached on the GPU, touched on the host.
		{[]uint64{0xa1, 0xa2}, 9, "BlockRemoved GPU [b4]; BlockRemoved GPU [b3]; BlockRemoved GPU [b2]; BlockStored GPU [a1 a2]; ", 0, 2},
		// The host is full; a request's blocks are ranked from its last to its first, so of b1..b4
		// (now behind a1 a2, which the last request touched) b4 is the least recently used: b4
		// goes before c1 comes.
		{[]uint64{0xc1}, 5, "BlockRemoved GPU [b1]; BlockStored GPU [c1]; BlockRemoved CPU [b4]; BlockStored CPU [c1]; ", 0, 0},
		// b1 b2 left the GPU, the host kept them: both loaded, nothing stored on the host.
		{[]uint64{0xb1, 0xb2}, 9, "BlockRemoved GPU [a2]; BlockRemoved GPU [a1]; BlockStored GPU [b1 b2]; ", 0, 2},
		// Three blocks need three: b3 a2 a1 (least recently used first; a1 a2 ranked a2 first)
		// leave the host as ONE removal, before the store, as vLLM's prepare_store announces a
		// host eviction.
		{[]uint64{0xd1, 0xd2, 0xd3}, 13, "GPU-ANY; BlockRemoved CPU [b3 a2 a1]; BlockStored CPU [d1]; BlockStored CPU [d2]; BlockStored CPU [d3]; ", 0, 0},
	} {
		got, s := run(step.keys, step.tokens)
		if rest, ok := strings.CutPrefix(step.want, "GPU-ANY; "); ok {
			// Only the host's events are pinned: drop the GPU's.
			var host []string
			for _, ev := range strings.SplitAfter(got, "; ") {
				if strings.Contains(ev, " CPU ") {
					host = append(host, ev)
				}
			}
			got, step.want = strings.Join(host, ""), rest
		}
		if got != step.want || s.hitN != step.gpu || s.offN != step.host {
			t.Errorf("step %d: events %q hits %d+%d, want %q %d+%d", i, got, s.hitN, s.offN, step.want, step.gpu, step.host)
		}
	}
	if c.clearGPU(); len(c.off.snapshot()) != 6 {
		t.Fatalf("vLLM's plain reset (clearGPU) left %d host blocks, want the 6 it held", len(c.off.snapshot()))
	}
	if c.clear(); len(c.off.snapshot()) != 0 {
		t.Fatal("a cache reset left the host tier's blocks")
	}
}

// TestOffloadStoreWithoutRoom: a store the host cannot make room for (more new blocks than the
// blocks outside the store) stores nothing and evicts nothing, as prepare_store returns None then.
func TestOffloadStoreWithoutRoom(t *testing.T) {
	c := newCache(8, 4, policyFor("vllm"), func(s *seq, first, last int) engines.Event {
		return engines.Event{Kind: engines.BlockStored, BlockHashes: append([]uint64(nil), s.keys[first:last]...)}
	})
	c.off = newOffloadTier(3)
	c.off.store(c, &seq{keys: []uint64{1, 2}}, 0, 2)
	c.take()
	// The host ranks 2 (the prompt's last block) below 1; 2 is part of the next store, so only 1
	// can go, and 3, 4, 5 need two.
	c.off.store(c, &seq{keys: []uint64{2, 3, 4, 5}}, 0, 4)
	if evs := c.take(); len(evs) != 0 || len(c.off.snapshot()) != 2 {
		t.Fatalf("a store without room: events %+v, host %v; want none and the host unchanged", evs, c.off.snapshot())
	}
	c.off.store(c, &seq{keys: []uint64{2, 3, 4}}, 0, 3)
	evs := c.take()
	if len(evs) != 3 || evs[0].Kind != engines.BlockRemoved || fmt.Sprint(evs[0].BlockHashes) != "[1]" || fmt.Sprint(evs[1].BlockHashes, evs[2].BlockHashes) != "[3] [4]" {
		t.Fatalf("a store with room: events %+v; want 1 removed (2, less recently used, is in the store), then 3 and 4 stored one by one", evs)
	}
}

// TestOffloadResets: on a vLLM simulator with an offload tier, as real v0.31.0 does, a plain
// /reset_prefix_cache empties the GPU only (the prompt comes back from the host, every full block
// cached), ?reset_external=true empties the host too (nothing cached), and each publishes one
// AllBlocksCleared and no host removal.
func TestOffloadResets(t *testing.T) {
	e := startSim(t, "vllm", "v0.25.1", func(c *Config) { c.CapacityBlocks, c.OffloadBlocks, c.DevMode = 12, 64, true })
	prompt := strings.Repeat("alpha routing keeps the prompt's blocks where they are. ", 14)
	bs := e.Config().BlockSize
	ask := func() (cached, full int) {
		t.Helper()
		resp, m := post(t, e.URL()+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1})
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %v", resp.StatusCode, m)
		}
		n, _ := m["usage"].(map[string]any)["prompt_tokens"].(json.Number).Int64()
		return usageCached(t, m), (int(n) - 1) / bs * bs
	}
	reset := func(path string) {
		t.Helper()
		if resp, m := post(t, e.URL()+path, ""); resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %v", path, resp.StatusCode, m)
		}
	}
	ask()
	reset("/reset_prefix_cache")
	if got, want := ask(); got != want || want == 0 {
		t.Fatalf("after a plain reset: cached %d, want %d (every full block, loaded from the host)", got, want)
	}
	reset("/reset_prefix_cache?reset_external=true")
	if got, _ := ask(); got != 0 || len(e.OffloadKeys(0)) == 0 {
		t.Fatalf("after reset_external: cached %d, host keys %d; want 0 cached and the prompt offloaded again", got, len(e.OffloadKeys(0)))
	}
	if resp, _ := post(t, e.URL()+"/reset_prefix_cache?reset_external=maybe", ""); resp.StatusCode != 422 {
		t.Errorf("reset_external=maybe: status %d, want 422 (not a boolean)", resp.StatusCode)
	}
	frames, ok := replay(t, e.ReplayAddrs()[0], 0, 5*time.Second)
	if !ok {
		t.Fatal("no replay")
	}
	clears := 0
	for _, f := range frames {
		bt, err := vllm.DecodeBatch(f.payload)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range bt.Events {
			switch {
			case ev.Kind == engines.AllBlocksCleared:
				clears++
			case ev.Kind == engines.BlockRemoved && ev.Medium == "CPU":
				t.Errorf("a host removal on the stream: %+v", ev)
			}
		}
	}
	if clears != 2 {
		t.Errorf("%d AllBlocksCleared, want one per reset", clears)
	}
}

// TestOffloadThroughTheEngine: on a running vLLM simulator whose GPU holds one prompt at a time, a
// prompt evicted from the GPU comes back from the host tier: its answer counts those blocks in
// cached_tokens, and the replayed stream carries the host's stores with medium CPU.
func TestOffloadThroughTheEngine(t *testing.T) {
	e := startSim(t, "vllm", "v0.25.1", func(c *Config) { c.CapacityBlocks, c.OffloadBlocks = 12, 64 })
	long := func(tag string) string {
		return strings.Repeat(tag+" routing keeps the prompt's blocks where they are. ", 14)
	}
	ask := func(prompt string) (cached, prompted int) {
		t.Helper()
		resp, m := post(t, e.URL()+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1})
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %v", resp.StatusCode, m)
		}
		n, _ := m["usage"].(map[string]any)["prompt_tokens"].(json.Number).Int64()
		return usageCached(t, m), int(n)
	}
	a, b := long("alpha"), long("beta")
	ask(a)
	ask(b) // evicts most of a's blocks from the GPU's 11 usable blocks; the host keeps them all
	bs := e.Config().BlockSize
	if got, n := ask(a); got != (n-1)/bs*bs || len(e.OffloadKeys(0)) == 0 {
		t.Fatalf("a again: cached %d of %d, host keys %d: want every full block but the last token's, the GPU's and the host's", got, n, len(e.OffloadKeys(0)))
	}
	frames, ok := replay(t, e.ReplayAddrs()[0], 0, 5*time.Second)
	if !ok {
		t.Fatal("no replay")
	}
	cpu := 0
	for _, f := range frames {
		bt, err := vllm.DecodeBatch(f.payload)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range bt.Events {
			if ev.Kind == engines.BlockStored && ev.Medium == "CPU" {
				cpu++
				if len(ev.TokenIDs) != len(ev.BlockHashes)*e.Config().BlockSize {
					t.Errorf("host store without its tokens: %+v", ev)
				}
				if len(ev.BlockHashes) != 1 {
					t.Errorf("a host store of %d blocks, want one per block (as the engine's tracker): %+v", len(ev.BlockHashes), ev)
				}
			}
		}
	}
	if cpu == 0 {
		t.Fatal("no BlockStored with medium CPU on the stream")
	}
}
