package gateway_test

import (
	"sort"
	"testing"

	"github.com/kvexact/kvexact/contracts"
)

// TestE2EPinnedSGLangReleases routes the oldest pinned SGLang release (v0.5.18, tagged arrays) and
// the newest (v0.5.21, tagged maps with cache_salt a BlockStored field) end to end with the engine
// binding, unsalted and salted: the gateway's keys must equal the page hashes each release's events
// carry, and a salt's blocks stay its own. The pins come from the contracts, oldest and newest.
func TestE2EPinnedSGLangReleases(t *testing.T) {
	var pins []string
	for _, c := range contracts.All() {
		if c.Family == "sglang" {
			pins = append(pins, c.Pin.Release)
		}
	}
	sort.Slice(pins, func(i, j int) bool {
		a, _ := contracts.ParseVersion(pins[i])
		b, _ := contracts.ParseVersion(pins[j])
		return a.Compare(b) < 0
	})
	if len(pins) < 2 {
		t.Fatalf("sglang pins %v: want the array and the map releases", pins)
	}
	for _, release := range []string{pins[0], pins[len(pins)-1]} {
		t.Run(release, func(t *testing.T) {
			p := startPool(t, poolSpec{family: "sglang", release: release, n: 2, mode: 3, certify: true, blockSize: 16})
			st := p.g.Status().Rules[0]
			if !st.Exact.Enabled || st.Exact.Binding != "engine" {
				t.Fatalf("exact not enabled on the engine binding: %+v", st.Exact)
			}
			warmThenHit(t, p, false)
			doc := docs(5)[4]
			req := func(prompt, salt string) map[string]any {
				return map[string]any{"model": "llama3", "prompt": prompt, "max_tokens": 2, "cache_salt": salt}
			}
			ep := warmHit(t, p, "/v1/completions", req(doc, "tenant-a"), req(doc+" And a follow-up question?", "tenant-a"))
			if ov := p.explainOverlap("/v1/completions", req(doc+" And a follow-up question?", "tenant-b")); sum(ov) != 0 {
				t.Fatalf("tenant-b sees tenant-a's blocks on %s: %v", ep, ov)
			}
		})
	}
}
