package route

import (
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// A lower tier (engines.LowerTiers: host memory, local storage, a shared store) holds blocks an
// engine offloaded. The engine serves its GPU prefix first, then loads the blocks that follow it
// from the nearest tier holding them (vLLM's offloading connector, SGLang HiCache) and stops at
// the first block no tier holds. Such a block is neither a GPU hit (it costs a transfer) nor a
// miss (it costs no prefill): the ttft law prices it at the tier's transfer rate, the score laws
// credit it with the share of its prefill the transfer saves.

// LowerIndex is one lower tier's residency in a rule.
type LowerIndex struct {
	Tier  engines.Tier
	Index *inventory.Index
}

// nLower is the number of lower tiers (engines.LowerTiers).
const nLower = 3

// LowerHit is, per lower tier (position tier − 1), how many blocks past an endpoint's GPU prefix
// that tier serves.
type LowerHit [nLower]int

// Blocks is the hit's total over the tiers.
func (h LowerHit) Blocks() int { return h[0] + h[1] + h[2] }

// TierBlocks is one tier's part of an endpoint's hit, as /admin/explain and the decision header
// show it.
type TierBlocks struct {
	Tier   string `json:"tier"`
	Blocks int    `json:"blocks"`
}

func (h LowerHit) evidence() []TierBlocks {
	var out []TierBlocks
	for i, n := range h {
		if n > 0 {
			out = append(out, TierBlocks{Tier: engines.Tier(i + 1).String(), Blocks: n})
		}
	}
	return out
}

// TransferRates are the time to load one token's KV from each lower tier.
type TransferRates struct {
	CPU    time.Duration `json:"cpu"`
	Disk   time.Duration `json:"disk"`
	Shared time.Duration `json:"shared"`
}

func (t TransferRates) of(i int) time.Duration {
	switch i {
	case 0:
		return t.CPU
	case 1:
		return t.Disk
	}
	return t.Shared
}

func (t *TransferRates) set(i int, d time.Duration) {
	switch i {
	case 0:
		t.CPU = d
	case 1:
		t.Disk = d
	default:
		t.Shared = d
	}
}

// lowerHit walks e's blocks past its GPU prefix (keys[from:]) while some lower tier holds them,
// each counted on the nearest tier that does. A tier where e holds nothing is not probed, so a
// pool without offloading pays one atomic load per tier and endpoint.
func (rt *Router) lowerHit(e *Endpoint, keys []uint64, from int) LowerHit {
	var h LowerHit
	var tiers [nLower]*inventory.Index
	any := false
	for _, l := range rt.cfg.Lower {
		if l.Tier > engines.TierGPU && int(l.Tier) <= nLower && l.Index.Resident(e.ID) > 0 {
			tiers[l.Tier-1], any = l.Index, true
		}
	}
	if !any {
		return h
	}
	var m inventory.Mask
	for i := from; i < len(keys); i++ {
		held := false
		for t, ix := range tiers {
			if ix == nil {
				continue
			}
			ix.Holders(keys[i], &m)
			if m.Has(e.ID) {
				h[t]++
				held = true
				break
			}
		}
		if !held {
			break
		}
	}
	return h
}

// lowerCredit is the score the hard, soft and off laws give a lower-tier hit: each block counts
// the share of its prefill its transfer saves (1 − transfer/prefill, at least 0), rounded down,
// so a tier as slow as prefill counts nothing and a free one as much as a GPU block.
func lowerCredit(h LowerHit, r Rates) int {
	if r == (Rates{}) {
		r = DefaultRates
	}
	if r.Prefill <= 0 {
		return 0
	}
	credit := 0.0
	for i, n := range h {
		if n > 0 {
			credit += float64(n) * max(1-float64(r.Transfer.of(i))/float64(r.Prefill), 0)
		}
	}
	return int(credit)
}

// LowerBlocks is how many blocks past Prefix the endpoint's lower tiers serve.
func (ev EndpointEvidence) LowerBlocks() int {
	n := 0
	for _, t := range ev.Tiers {
		n += t.Blocks
	}
	return n
}
