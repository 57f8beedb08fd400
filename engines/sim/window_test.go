package sim

import (
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
)

// TestSlidingWindowGroup: a hybrid vLLM simulator publishes every block twice (group 0 full
// attention, group 1 sliding_window with its window), lets go of the sliding group's blocks behind
// the window while prefilling and evicts them from its 8-block pool (BlockRemoved in group 1), and
// reports as cached what vLLM's rule allows: a prompt sharing 30 blocks hits 30 (the window's tail
// is held), one sharing 12 hits nothing although full attention holds all 12.
func TestSlidingWindowGroup(t *testing.T) {
	e := startSim(t, "vllm", "v0.30.0", func(c *Config) {
		s := "0"
		c.Seed, c.BlockSize, c.SlidingWindow, c.SlidingWindowBlocks = &s, 16, 48, 8
	})
	base := make([]int, 40*16+3)
	for i := range base {
		base[i] = 700 + i
	}
	sharing := func(blocks int) []int {
		out := append([]int(nil), base[:blocks*16]...)
		for i := 0; i < 3*16+5; i++ {
			out = append(out, 30000+blocks*100+i)
		}
		return out
	}
	for _, c := range []struct {
		prompt []int
		cached int
	}{{base, 0}, {sharing(36), 36 * 16}, {sharing(12), 0}} {
		resp, m := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": c.prompt, "max_tokens": 1})
		if resp.StatusCode != 200 {
			t.Fatal(m)
		}
		if got := usageCached(t, m); got != c.cached {
			t.Errorf("prompt of %d tokens: cached %d, want %d", len(c.prompt), got, c.cached)
		}
	}
	if err := e.Quiesce(testCtx(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	frames, ok := replay(t, e.ReplayAddrs()[0], 0, 5*time.Second)
	if !ok || len(frames) == 0 {
		t.Fatal("no replayed events")
	}
	stores, removals := map[int]int{}, map[int]int{}
	for _, f := range frames {
		b, err := decodeFor("vllm")(f.payload)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			switch ev.Kind {
			case engines.BlockStored:
				stores[ev.GroupIdx] += len(ev.BlockHashes)
				if ev.GroupIdx == 1 && (ev.SpecKind != "sliding_window" || ev.SlidingWin != 48 || !ev.HasGroupIdx) {
					t.Errorf("sliding store %+v", ev)
				}
				if ev.GroupIdx == 0 && ev.SpecKind != "full_attention" {
					t.Errorf("full store %+v", ev)
				}
			case engines.BlockRemoved:
				removals[ev.GroupIdx]++
			}
		}
	}
	// Group 0 stores 40 + the two suffixes' new blocks; group 1 the same blocks; only group 1 evicts.
	if stores[0] == 0 || stores[1] != stores[0] || removals[1] == 0 || removals[0] != 0 {
		t.Errorf("stores %v, removals %v: want equal stores per group, removals in group 1 only", stores, removals)
	}
}
