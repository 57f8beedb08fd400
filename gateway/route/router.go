package route

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/kvgroups"
	"github.com/kvexact/kvexact/gateway/rules"
)

// ErrNoEndpoint: nothing healthy can serve (503).
var ErrNoEndpoint = errors.New("no healthy endpoint can serve this request")

// Config builds a router for one rule.
type Config struct {
	Rule      *rules.Rule
	Endpoints []*Endpoint
	Index     *inventory.Index
	// Groups is the rule's KV-cache group residency (hybrid models); nil scores the index alone.
	Groups *kvgroups.Index
	// Keyer computes block keys; nil means KV-exact cannot run (miss unknown_tokenizer).
	Keyer Keyer
	// HitLimit is the engine family's hit cap (engines.Hits): the most leading full blocks of a
	// prompt of that many tokens its prefix cache serves. Scores and predicted cached tokens stop
	// there; nil scores every full block.
	HitLimit func(promptTokens, blockSize int) int
	// Certified marks the endpoints a valid certificate covers for this rule's profile. When
	// CertReason is non-empty, no endpoint is covered and it says why (miss no_certificate).
	Certified  inventory.Mask
	CertReason string
	// CertifiedAdapters are, per endpoint, the LoRA names (as the engine hashes them) whose
	// adapters its certificate proved: KV-exact scores an adapter request only on the endpoints
	// listing its LoRA name. An endpoint absent from the map has a certificate that records no
	// adapter list (written before adapters were recorded), which restricts none.
	CertifiedAdapters map[inventory.EndpointID][]string
	// Lower are the rule's lower tiers' residencies, nearest first (nil: the GPU's alone).
	Lower []LowerIndex
	// Ranks is the per-rank residency of the rule's data-parallel endpoints (nil: none).
	Ranks   *Ranks
	Metrics *Metrics
	Now     func() time.Time
	Log     *slog.Logger
}

// Router routes one rule's requests.
type Router struct {
	cfg       Config
	rule      *rules.Rule
	eps       []*Endpoint
	ladder    ladder
	law       Law
	minMatch  int
	sessions  *sessions
	trie      *prefixTrie
	admission *admission
	predict   *predictions // nil when the rule's predictOnRoute is 0
	last      *lastSeen    // where each prompt last went; nil unless missPlacement is "last"
	pd        bool

	tieDecode  atomic.Uint64
	tieMinLoad atomic.Uint64
	tiePlace   atomic.Uint64 // miss placement's round robin among genuine ties (placement.go)
	hits       atomic.Uint64 // KV-exact hits, for cold-start seeding (coldstart.go)
	zeroHits   atomic.Int64  // consecutive zero-overlap lookups against a non-empty inventory (watchdog.go)
	watchdog   atomic.Bool   // watchdog warning active

	// discovered are the adapters read from the endpoints' /v1/models (adapters.go).
	discovered atomic.Pointer[discoveredAdapters]
}

// New builds a router.
func New(cfg Config) (*Router, error) {
	r := cfg.Rule
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	sel, err := NewSelector(r.Selector, cfg.Endpoints, r.CHWBL.Replication, r.CHWBL.LoadFactor, r.CHWBL.PrefixChars)
	if err != nil {
		return nil, err
	}
	rt := &Router{cfg: cfg, rule: r, eps: cfg.Endpoints, minMatch: *r.MinMatchTokens}
	rt.law = LawOf(r.LoadLaw)
	rt.law.BlockSize = r.BlockSize
	rt.predict = newPredictions(r.PredictTTL(), cfg.Now)
	if rt.law.MissLast {
		rt.last = newLastSeen(lastSeenCap)
	}
	for _, e := range cfg.Endpoints {
		if e.Role == RolePrefill || e.Role == RoleDecode {
			rt.pd = true
		}
	}
	if rt.pd {
		rt.sessions = newSessions(time.Duration(r.Session.TTL), cfg.Now)
		if r.Trie.Enabled {
			rt.trie = newPrefixTrie(64, 1<<16)
		}
		if r.Admission.Enabled {
			rt.admission = newAdmission(r.Admission.MaxInflightPerEndpoint, r.Admission.Mode == "shed", r.Admission.QueueDepth, time.Duration(r.Admission.MaxPark))
		}
	}
	if ll, ok := sel.(*leastLoad); ok && r.KVExactMode == rules.KVExactPool && cfg.Index != nil && r.LoadLaw.MissPlacement == rules.MissFewestBlocks {
		// A KV-exact miss falls to the selector: equally loaded engines are told apart by the
		// blocks their GPU tier holds, so a new prefix does not overflow one engine while another
		// has room. Opt-in: on the simulator it did not beat the plain round robin
		// (docs/routing.md, Miss placement).
		ll.room = func(e *Endpoint) int { return cfg.Index.Resident(e.ID) }
	}
	rt.ladder = rt.newLadder(sel)
	return rt, nil
}

// Rule returns the rule the router serves.
func (rt *Router) Rule() *rules.Rule { return rt.rule }

// Endpoints returns the rule's endpoints in order.
func (rt *Router) Endpoints() []*Endpoint { return rt.eps }

// Route decides where a request goes. retry holds endpoints that already failed to connect for
// this request; they are excluded from every tier, so the second-best wins on a retry.
func (rt *Router) Route(ctx context.Context, req *Request, retry inventory.Mask) (*Decision, error) {
	return rt.decide(ctx, req, orMask(retry, rt.adapterAbsent(req.Model)), false)
}

// Explain decides like Route but changes nothing: no load taken, no session or trie entry, no
// admission wait, no metric. It answers /admin/explain.
func (rt *Router) Explain(ctx context.Context, req *Request) (*Decision, error) {
	return rt.decide(ctx, req, rt.adapterAbsent(req.Model), true)
}

// decide climbs the rule's ladder (ladder.go); a prefill winner gets its decode endpoint
// (decode.go). The decision then takes its load units, unless dry (Explain).
func (rt *Router) decide(ctx context.Context, req *Request, retry inventory.Mask, dry bool) (*Decision, error) {
	d := &Decision{dry: dry}
	c := &d.c
	c.req, c.retry, c.d = req, retry, d
	c.cands = rt.appendCandidates(d.candBuf[:0], retry, rt.ladder.role)
	if err := rt.climb(ctx, c); err != nil {
		return nil, err
	}
	if d.Target == nil {
		return nil, ErrNoEndpoint
	}
	if d.Target.Role == RolePrefill {
		if err := rt.pairDecode(c); err != nil {
			return nil, err
		}
	}
	if !rt.pd && !dry {
		// Predict-on-route learns from single-pool decisions.
		rt.predict.routed(d)
	}
	rt.remember(d)
	rt.take(d)
	return d, nil
}

// candidates returns the non-excluded endpoints with the given role.
func (rt *Router) candidates(retry inventory.Mask, role Role) []*Endpoint {
	return rt.appendCandidates(nil, retry, role)
}

// appendCandidates appends the non-excluded endpoints with the given role to out.
func (rt *Router) appendCandidates(out []*Endpoint, retry inventory.Mask, role Role) []*Endpoint {
	for _, e := range rt.eps {
		if e.Role != role || e.excluded(retry) != health.NotExcluded {
			continue
		}
		out = append(out, e)
	}
	return out
}

func byIndex(eps []*Endpoint, idx int) *Endpoint {
	for _, e := range eps {
		if e.Index == idx {
			return e
		}
	}
	return nil
}

func contains(eps []*Endpoint, e *Endpoint) bool { return byIndex(eps, e.Index) == e }

// take records the load units of a decision and arms its release.
func (rt *Router) take(d *Decision) {
	d.TargetN = d.Target.Name
	if d.Decode != nil {
		d.DecodeN = d.Decode.Name
	}
	if d.dry {
		return
	}
	if rt.law.Kind == LawTTFT {
		rt.queuePrefill(d)
	}
	d.Target.active.Add(1)
	d.Target.served.Add(1)
	if d.Decode != nil {
		d.Decode.active.Add(1)
		d.Decode.served.Add(1)
	}
	if rt.cfg.Metrics != nil {
		rt.cfg.Metrics.decided(rt.rule.Name, d)
	}
	d.rt = rt
}

func (rt *Router) miss(d *Decision, m Miss, reason string) {
	d.Miss, d.Reason = m, reason
	if rt.cfg.Metrics != nil && !d.dry {
		rt.cfg.Metrics.missed(rt.rule.Name, m)
	}
}

// queuePrefill adds the decision's uncached prompt tokens (the blocks past the target's cached
// prefix and the prompt's partial last block) to its target's queued prefill (the
// ttft law's "ahead", until the receipt or the release), its predicted GPU hit to the target's
// queued hits, and keeps what the prediction stood on. The queued work a receipt learns the
// queue share against is the prediction's: its evicted share of the hits queued ahead included.
func (rt *Router) queuePrefill(d *Decision) {
	cached, gpu, assumed := 0, 0, 0
	bs := max(rt.rule.BlockSize, 1)
	for _, ev := range d.Endpoints {
		if ev.Name == d.Target.Name {
			cached, gpu, assumed = ev.Prefix+ev.lower.Blocks(), ev.Prefix, ev.Predicted
			for i, n := range ev.lower {
				d.lowerAt[i] = n * bs
			}
			if ev.TTFT != nil {
				d.ttftPredicted, d.slotWaitAt = ev.TTFT.total, ev.TTFT.slot
				d.aheadAt = ev.TTFT.EngineWaitingTokens + ev.TTFT.AheadEvictedTokens
			}
		}
	}
	d.own = max(d.Blocks-cached, 0)*bs + max(d.tokens-d.Blocks*bs, 0)
	gpu = min(gpu, d.Blocks)
	assumed = min(assumed, gpu)
	d.hitAt = HitTokens{Confirmed: (gpu - assumed) * bs, Assumed: assumed * bs}
	d.aheadAt += d.Target.Ahead()
	d.loadAt = d.Target.Load()
	d.queued = true
	d.Target.ahead.Add(int64(d.own))
	d.Target.aheadHit.Add(int64(d.hitAt.Confirmed))
	d.Target.aheadAssumed.Add(int64(d.hitAt.Assumed))
	d.Target.pending.Add(1)
}
