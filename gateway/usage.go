package gateway

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/exactness"
)

// DefaultShortfallHits is how many consecutive KV-exact hits with a predicted prefix of at least one
// block and no cached token reported by the engine suspend the endpoint (Options.ShortfallHits).
const DefaultShortfallHits = 3

// shortfallReason is the status text of a realized shortfall. The engine's usage is the last line
// of evidence: it shows that the gateway's picture of what the engine caches is wrong for the
// requests routed to it, not which leg made it wrong, so the text names every cause seen to give
// it (the exactness machine's other checks name a leg where they can).
const shortfallReason = "engine reports no hits where the gateway predicted them: the gateway's inventory or keys do not describe what the engine caches for these requests — lost or unreplayed events (stale blocks), a data-parallel rank other than the one holding the blocks, or tokenizer or template drift suspected"

// usageMetrics count predicted and realized cached tokens per rule and endpoint.
type usageMetrics struct {
	predicted, realized *prometheus.CounterVec
}

func newUsageMetrics(reg prometheus.Registerer) *usageMetrics {
	m := &usageMetrics{
		predicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_predicted_cached_tokens_total",
			Help: "Cached prompt tokens the routing decision predicted on the serving endpoint (its contiguous cached prefix), over responses whose engine reported usage.",
		}, []string{"rule", "endpoint"}),
		realized: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_realized_cached_tokens_total",
			Help: "Cached prompt tokens the engine reported (usage.prompt_tokens_details.cached_tokens) on the same responses.",
		}, []string{"rule", "endpoint"}),
	}
	reg.MustRegister(m.predicted, m.realized)
	return m
}

// RecordUsage takes one relayed response's account (the proxy's Usage hook): the decision's
// predicted cached tokens on the serving endpoint beside the engine's realized ones. kvExact says
// KV-exact chose that endpoint on blocks the engine's events confirmed (not predict-on-route's
// alone). A sustained shortfall on KV-exact hits suspends the endpoint.
func (g *Gateway) RecordUsage(rule, endpoint string, kvExact bool, predicted, realized, blockSize int) {
	rt, ok := g.runtime(rule)
	if !ok {
		return
	}
	x := rt.exactOf(endpoint)
	if x == nil {
		return
	}
	g.statusM.usage.predicted.WithLabelValues(rule, endpoint).Add(float64(predicted))
	g.statusM.usage.realized.WithLabelValues(rule, endpoint).Add(float64(realized))
	k := g.opts.ShortfallHits
	if k <= 0 {
		k = DefaultShortfallHits
	}
	x.mu.Lock()
	x.predicted += uint64(predicted)
	x.realized += uint64(realized)
	if kvExact && blockSize > 0 && predicted >= blockSize {
		if realized == 0 {
			x.shortRun++
		} else {
			x.shortRun = 0
		}
	}
	if x.shortRun >= k && !x.sm.Held(exactness.Shortfall) {
		x.applyLocked(exactness.Evidence{Type: exactness.ShortfallSeen,
			Detail: fmt.Sprintf("%s (%d consecutive KV-exact hits predicted at least one block, the engine reported 0 cached tokens; since %s)", shortfallReason, x.shortRun, x.now().UTC().Format(time.RFC3339))})
	}
	x.mu.Unlock()
}

// ErrHoldNotClearable is returned by ClearExactHold for a hold that lifts on evidence only.
var ErrHoldNotClearable = errors.New("hold cannot be cleared by hand")

// ErrNoRule is returned by ClearExactHold for a rule the gateway does not run.
var ErrNoRule = errors.New("no such rule")

// ErrNoEndpoint is returned by ClearExactHold for an endpoint the rule does not have.
var ErrNoEndpoint = errors.New("no such endpoint")

// ClearExactHold lifts a realized-shortfall (or the router binding's token_drift) suspension on one
// endpoint after the operator fixed the engine (POST
// /admin/rules/{rule}/endpoints/{endpoint}/exact/clear). Nothing else on the gateway's side lifts
// a shortfall: a fenced endpoint gets no KV-exact hits, so no usage can show that the drift is gone. Clearing restarts the count, so if the engine still drifts it is suspended
// again after ShortfallHits hits. The other holds lift on evidence only (a matching re-probe, N
// matching blocks after a restart) or on re-certification (a certificate reload rebuilds every
// endpoint's state, which also lifts a shortfall), and are refused here. hold "" means
// realized_shortfall. It returns the endpoint's exactness after the change.
func (g *Gateway) ClearExactHold(rule, endpoint, hold string) (EndpointExact, error) {
	if hold == "" {
		hold = string(exactness.Shortfall)
	}
	kind := exactness.Cause(hold)
	if !exactness.ClearedByHand(kind) {
		return EndpointExact{}, fmt.Errorf("%w: hold %q (only %q and %q are cleared by hand; the others lift on evidence or re-certification)", ErrHoldNotClearable, hold, exactness.Shortfall, exactness.TokenDrift)
	}
	rt, ok := g.runtime(rule)
	if !ok {
		return EndpointExact{}, fmt.Errorf("%w: %q", ErrNoRule, rule)
	}
	x := rt.exactOf(endpoint)
	if x == nil {
		return EndpointExact{}, fmt.Errorf("%w: endpoint %q in rule %q", ErrNoEndpoint, endpoint, rule)
	}
	x.mu.Lock()
	if kind == exactness.Shortfall {
		x.shortRun = 0
	} else {
		x.tokenRun = 0
	}
	if t := x.applyLocked(exactness.Evidence{Type: exactness.Cleared, Cause: kind}); len(t.Lifted) > 0 {
		g.log.Warn("KV-exact suspension cleared by the operator", "rule", rule, "endpoint", endpoint, "hold", hold)
	}
	x.mu.Unlock()
	return x.status(), nil
}
