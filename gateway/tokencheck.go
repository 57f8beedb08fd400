package gateway

import (
	"fmt"
	"time"

	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// The router binding's token-side check. On that binding the gateway computes every key itself,
// from the token ids the engine's events carry, so the engine's hashes cannot disagree with ours:
// what can is the engine's tokens. If its tokenizer or chat template drifted from the certified
// one, the blocks it stores for a prompt the gateway routed to it are not the blocks of the
// gateway's own tokenization of that prompt. So after each routed response (one that reported
// usage) the gateway looks, a grace period later, for the prompt's deepest full block — its key
// chains the whole keyed prompt — among the blocks the endpoint published:
//   - resident: the engine reproduced the gateway's tokens for the whole prompt;
//   - absent while the engine stored blocks in that window and removed, evicted or cleared none:
//     it stored something, not our prompt — not reproduced;
//   - anything else (nothing stored: events lag or stopped; any removal: the block may have been
//     evicted) is inconclusive and counts neither way.
// Only prompts the gateway routed are looked for, and only their presence, so no other traffic on
// the engine can make a check fail; eviction is the one look-alike, hence the removal rule.
// TokenDriftChecks consecutive not-reproduced prompts suspend KV-exact on the endpoint (hold
// token_drift); like a realized shortfall it lifts on re-certification or the operator's clear.

// DefaultTokenCheckGrace is how long after a routed response the prompt's deepest block must be
// resident (Options.TokenCheckGrace): far above the event paths' latency (ZeroMQ, a 20 ms drain).
const DefaultTokenCheckGrace = 2 * time.Second

// DefaultTokenDriftChecks is how many consecutive not-reproduced prompts suspend the endpoint.
const DefaultTokenDriftChecks = 3

// maxPendingTokenChecks bounds the checks waiting out their grace per endpoint; past it responses
// are not checked (a sample is enough, and the timers stay bounded).
const maxPendingTokenChecks = 16

// tokenDriftReason is the status text of a token_drift hold.
const tokenDriftReason = "the engine's events do not reproduce the gateway's tokenization of prompts routed to it: tokenizer or template drift"

// TokenCheckStatus is the router binding's token-side check on an endpoint in /admin/status.
type TokenCheckStatus struct {
	Checked       uint64    `json:"checked"`
	Reproduced    uint64    `json:"reproduced"`
	NotReproduced uint64    `json:"not_reproduced"`
	Inconclusive  uint64    `json:"inconclusive"`
	LastCheck     time.Time `json:"last_check,omitzero"`
	LastMiss      string    `json:"last_miss,omitempty"`
}

// CheckRoutedPrompt schedules the token-side check of one response endpoint served: lastKey is
// the gateway's key of the prompt's deepest full block, blocks the prompt's full blocks (0: no
// keys, nothing to check). Rules on the engine binding are checked by the live parity watch.
func (g *Gateway) CheckRoutedPrompt(rule, endpoint string, lastKey uint64, blocks int) {
	if blocks == 0 {
		return
	}
	rt, ok := g.runtime(rule)
	if !ok || !rt.exact.Enabled || rt.exact.Binding != "router" {
		return
	}
	x := rt.exactOf(endpoint)
	if x == nil || !x.certified() {
		return
	}
	id := x.endpoint().ID
	before, ok := endpointCounters(rt.index, id)
	if !ok {
		return
	}
	x.mu.Lock()
	if x.tokenPending >= maxPendingTokenChecks {
		x.mu.Unlock()
		return
	}
	x.tokenPending++
	x.mu.Unlock()
	grace := g.opts.TokenCheckGrace
	if grace <= 0 {
		grace = DefaultTokenCheckGrace
	}
	routed := x.now()
	time.AfterFunc(grace, func() { g.finishTokenCheck(rt, x, lastKey, blocks, before, routed, grace) })
}

func (g *Gateway) finishTokenCheck(rt *ruleRuntime, x *endpointExact, lastKey uint64, blocks int, before inventory.EndpointStats, routed time.Time, grace time.Duration) {
	id := x.endpoint().ID
	after, ok := endpointCounters(rt.index, id)
	held := ok && rt.holder(id, lastKey) != ""
	k := g.opts.TokenDriftChecks
	if k <= 0 {
		k = DefaultTokenDriftChecks
	}
	x.mu.Lock()
	x.tokenPending--
	x.tokens.Checked++
	x.tokens.LastCheck = x.now()
	switch {
	case held:
		x.tokens.Reproduced++
		x.tokenRun = 0
	case !ok || after.Stored == before.Stored || after.Removed != before.Removed || after.UnknownRemoves != before.UnknownRemoves ||
		after.Retirements != before.Retirements || after.Clears != before.Clears:
		x.tokens.Inconclusive++
	default:
		x.tokens.NotReproduced++
		x.tokenRun++
		x.tokens.LastMiss = fmt.Sprintf("a prompt of %d blocks routed at %s: its last block (key %016x) is not among the %d blocks the engine stored within %s",
			blocks, routed.UTC().Format(time.RFC3339), lastKey, after.Stored-before.Stored, grace)
	}
	if x.tokenRun >= k && !x.sm.Held(exactness.TokenDrift) {
		x.applyLocked(exactness.Evidence{Type: exactness.TokenDriftSeen,
			Detail: fmt.Sprintf("%s (%d consecutive routed prompts not reproduced; last: %s)", tokenDriftReason, x.tokenRun, x.tokens.LastMiss)})
	}
	x.mu.Unlock()
}

// endpointCounters returns the inventory's counters of endpoint id.
func endpointCounters(ix *inventory.Index, id inventory.EndpointID) (inventory.EndpointStats, bool) {
	for _, s := range ix.Endpoints() {
		if s.ID == id {
			return s, true
		}
	}
	return inventory.EndpointStats{}, false
}
