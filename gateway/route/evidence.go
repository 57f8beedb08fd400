package route

import (
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// EndpointEvidence is one endpoint's part of a decision.
type EndpointEvidence struct {
	Name     string `json:"name"`
	Overlap  int    `json:"overlap"`
	Prefix   int    `json:"prefix"`
	Load     int    `json:"load"`
	Cap      int    `json:"cap,omitempty"`
	Excluded string `json:"excluded,omitempty"`
	Eligible bool   `json:"eligible"` // certified for KV-exact and a candidate of this tier

	// Predicted is how many blocks of Prefix come from predict-on-route, not from engine events.
	Predicted int `json:"predicted,omitempty"`
	// Rank, on a data-parallel endpoint whose requests the gateway can pin to a rank, is the rank
	// scored (the one holding most of the prompt); absent elsewhere (a data-parallel endpoint that
	// cannot be pinned is scored by what every rank holds).
	Rank *int `json:"rank,omitempty"`

	// For an endpoint of a hybrid model (gateway/kvgroups), Limit names what held the engine's
	// hit below the prompt (a KV-cache group, "full_attention" or "alignment") and FullPrefix is
	// the full-attention groups' prefix alone: what scoring them alone would have predicted.
	Limit      string `json:"limit,omitempty"`
	FullPrefix int    `json:"fullPrefix,omitempty"`

	// Tiers are the blocks past Prefix that lower tiers (host memory, storage, a shared store)
	// serve, per tier: the engine loads them instead of computing them.
	Tiers []TierBlocks `json:"tiers,omitempty"`
	lower LowerHit

	// Fill and Capacity, when KV-exact placed a miss by KV headroom (placement.go), are the
	// blocks the endpoint holds or was predicted to receive, and its KV capacity share: the
	// least Fill/Capacity among the least loaded won.
	Fill     int `json:"fill,omitempty"`
	Capacity int `json:"capacity,omitempty"`

	// TTFT, under the ttft law, is the candidate's predicted time to first token with its parts.
	TTFT *TTFTParts `json:"ttft,omitempty"`
}

// evidence is e's part of a KV-exact decision: its score, its load, and why it may not compete
// when it may not (health or retry exclusion, an adapter it does not list, a fence). Eligible is
// not excluded and certified.
func (rt *Router) evidence(e *Endpoint, s inventory.Score, predicted int, retry, absent inventory.Mask) EndpointEvidence {
	ev := EndpointEvidence{Name: e.Name, Overlap: s.Overlap, Prefix: s.Prefix, Load: e.Load(), Predicted: predicted}
	if ex := e.excluded(retry); ex != health.NotExcluded {
		ev.Excluded = string(ex)
	}
	if absent.Has(e.ID) {
		ev.Excluded = ExcludedAdapterNotListed
	}
	if f := e.Fenced(); f != "" && ev.Excluded == "" {
		ev.Excluded = "fenced: " + f
	}
	ev.Eligible = ev.Excluded == "" && rt.cfg.Certified.Has(e.ID)
	return ev
}

// noteWinner records on the evidence what the load law decided: whether the winner w needed
// predicted blocks, and the per-candidate caps the hard laws used (caps[i] is cands[i]'s).
func (d *Decision) noteWinner(w *Endpoint, cands []*Endpoint, caps []int, ttft []TTFTParts) {
	for _, ev := range d.Endpoints {
		if ev.Name == w.Name && ev.Predicted > 0 {
			d.Predicted = true
		}
	}
	if caps == nil && ttft == nil {
		return
	}
	// cands is a subsequence of the evidence, both in endpoint order.
	i := 0
	for j, c := range cands {
		for d.Endpoints[i].Name != c.Name {
			i++
		}
		if caps != nil {
			d.Endpoints[i].Cap = caps[j]
		}
		if ttft != nil {
			d.Endpoints[i].TTFT = &ttft[j]
		}
	}
}
