package gateway_test

import (
	"testing"
	"time"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines/sim"
)

// newestVLLMPin is the pin of the newest vLLM contract, from the data: a new release's contract
// becomes the newest end of the release tests by itself.
func newestVLLMPin(t *testing.T) string {
	t.Helper()
	var newest contracts.Version
	pin := ""
	for _, c := range contracts.All() {
		if c.Family != "vllm" {
			continue
		}
		v, err := contracts.ParseVersion(c.Pin.Release)
		if err != nil {
			t.Fatalf("pin %q of %s: %v", c.Pin.Release, c.ID, err)
		}
		if pin == "" || v.Compare(newest) > 0 {
			newest, pin = v, c.Pin.Release
		}
	}
	if pin == "" {
		t.Fatal("no vllm contract")
	}
	return pin
}

// TestE2EPinnedVLLMReleases routes the oldest covered vLLM release (v0.19.0, array layout without
// group_idx), the oldest pin (v0.23.0) and the newest pin (from the contracts) end to end with the
// engine binding; the newest runs with PYTHONHASHSEED unset on the engines and no seed in the rule,
// so the keys the gateway computes are rooted in the release's default seed, as the engines' are.
func TestE2EPinnedVLLMReleases(t *testing.T) {
	for _, tc := range []struct {
		release string
		seed    *string
	}{{"v0.19.0", strp("0")}, {"v0.23.0", strp("0")}, {newestVLLMPin(t), nil}} {
		t.Run(tc.release, func(t *testing.T) {
			p := startPool(t, poolSpec{family: "vllm", release: tc.release, n: 2, seed: tc.seed, mode: 3, certify: true})
			st := p.g.Status().Rules[0]
			if !st.Exact.Enabled || st.Exact.Binding != "engine" {
				t.Fatalf("exact not enabled on the engine binding: %+v", st.Exact)
			}
			warmThenHit(t, p, false)
		})
	}
}

// TestE2EFullReportModeTracksEvictions: an engine of the newest pinned release in
// kv_cache_report_mode="full" re-emits BlockStored for every prefix-cache hit; after its small cache
// evicts those blocks, the gateway's inventory holds exactly what the engine holds (the presence rule), not a stale copy of every
// re-emitted block (which counting copies would leave: a false hit that lasts until a clear).
func TestE2EFullReportModeTracksEvictions(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: newestVLLMPin(t), n: 1, mode: 3, certify: true, simMod: func(i int, c *sim.Config) {
		c.ReportMode, c.CapacityBlocks = sim.ReportFull, 64
	}})
	d := docs(3)
	for _, prompt := range []string{d[0], d[0]} { // the second one re-emits d[0]'s blocks
		if c := p.complete(prompt, false); c.status != 200 {
			t.Fatalf("status %d: %s", c.status, c.body)
		}
	}
	var warm int
	eventually(t, 10*time.Second, "the inventory to learn d[0]", func() bool { warm = p.overlap(d[0], "e0"); return warm > 0 })
	for _, prompt := range []string{d[1], d[2]} { // 64 blocks cannot hold all three documents
		if c := p.complete(prompt, false); c.status != 200 {
			t.Fatalf("status %d: %s", c.status, c.body)
		}
	}
	engine := p.sims[0]
	same := func() bool {
		inv, _ := p.g.Inventory("pool", "e0")
		held := engine.CacheKeys(0)
		if len(inv) != len(held) {
			return false
		}
		for _, kc := range inv {
			if held[kc.Key] == 0 {
				return false
			}
		}
		return true
	}
	eventually(t, 10*time.Second, "the inventory to equal the engine's cache after evictions", same)
	if n := p.overlap(d[0], "e0"); n >= warm {
		t.Fatalf("no eviction exercised: d[0] overlap %d, was %d", n, warm)
	}
}
