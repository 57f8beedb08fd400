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
// medium CPU after the GPU's, a GPU eviction leaving the host copy, a lookup continuing the GPU
// prefix on the host (loaded, then cached on the GPU again without a second host store), and the
// host's least recently used eviction announced before the store that needed the room.
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
		{[]uint64{0xa1, 0xa2}, 9, "BlockStored GPU [a1 a2]; BlockStored CPU [a1 a2]; ", 0, 0},
		{[]uint64{0xb1, 0xb2, 0xb3, 0xb4}, 16,
			"BlockRemoved GPU [a2]; BlockRemoved GPU [a1]; BlockStored GPU [b1 b2 b3 b4]; BlockStored CPU [b1 b2 b3 b4]; ", 0, 0},
		// a1, a2 are on the host only: loaded, cached on the GPU, touched on the host.
		{[]uint64{0xa1, 0xa2}, 9, "BlockRemoved GPU [b4]; BlockRemoved GPU [b3]; BlockRemoved GPU [b2]; BlockStored GPU [a1 a2]; ", 0, 2},
		// The host is full (a1 a2 b1..b4, b1 least recently used): b1 goes before c1 comes.
		{[]uint64{0xc1}, 5, "BlockRemoved GPU [b1]; BlockStored GPU [c1]; BlockRemoved CPU [b1]; BlockStored CPU [c1]; ", 0, 0},
		// b1 left the host and the GPU: nothing to load; b2 is on the host but behind the gap, and
		// storing b1 evicts b3, not b2, which the same store touches.
		{[]uint64{0xb1, 0xb2}, 9, "BlockRemoved GPU [a2]; BlockRemoved GPU [a1]; BlockStored GPU [b1 b2]; BlockRemoved CPU [b3]; BlockStored CPU [b1]; ", 0, 0},
	} {
		got, s := run(step.keys, step.tokens)
		if got != step.want || s.hitN != step.gpu || s.offN != step.host {
			t.Errorf("step %d: events %q hits %d+%d, want %q %d+%d", i, got, s.hitN, s.offN, step.want, step.gpu, step.host)
		}
	}
	if c.clear(); len(c.off.snapshot()) != 0 {
		t.Fatal("a cache reset left the host tier's blocks")
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
			}
		}
	}
	if cpu == 0 {
		t.Fatal("no BlockStored with medium CPU on the stream")
	}
}
