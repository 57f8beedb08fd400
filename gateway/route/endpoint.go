package route

import (
	"net/url"
	"sync/atomic"
	"time"

	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// Role of an endpoint in a rule.
type Role string

const (
	RoleNormal  Role = "normal"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// Endpoint is one engine server as the router sees it. Load is the gateway's own count of requests
// in flight to it (active) plus those parked for it (queued), plus — where the engine's own report
// is fresh — the requests the engine counts beyond this gateway's share (other replicas'): the
// signal every load-aware tier uses.
type Endpoint struct {
	ID       inventory.EndpointID // position in the rule's inventory
	Index    int                  // position in the rule's endpoint list (ties resolve to the lowest)
	Name     string
	Address  string
	Role     Role
	Weight   int
	Capacity int // KV capacity share for the load law (≥ 1)
	Health   *health.Endpoint
	// RankHeader, on a data-parallel endpoint whose engine can be told the rank, is the request
	// header naming it (engines.Hits.DPRankHeader); KV-exact then sends the request to the rank
	// holding its blocks (Decision.Rank).
	RankHeader string
	// DPRanks is the number of data-parallel ranks (0 or 1: one).
	DPRanks int

	active atomic.Int64
	queued atomic.Int64
	served atomic.Uint64
	engine atomic.Pointer[EngineReport] // the engine's last load report (nil: none read)
	// ahead is the uncached prompt tokens of the requests in flight here that have shown no first
	// token yet (the ttft law's queued prefill), rates the endpoint's learned rates (nil before
	// its first receipt).
	// pending counts those requests, aheadHit and aheadAssumed their prompt tokens predicted
	// cached here (confirmed by the engine's events, and assumed past them).
	ahead        atomic.Int64
	pending      atomic.Int64
	aheadHit     atomic.Int64
	aheadAssumed atomic.Int64
	rates        atomic.Pointer[estimator]
	fenced       atomic.Pointer[string]  // why KV-exact may not use this endpoint now (nil: it may)
	url          atomic.Pointer[url.URL] // Address parsed once, on first use

	// MaxRunning is the configured number of requests the engine runs at once (0: unknown, then
	// learned from its load reports; Slots). It and slotsSeen come last so the fields every
	// decision reads keep their places.
	MaxRunning int
	// slotsSeen is the most requests the engine reported running while it held some waiting:
	// its running-request limit as its own reports show it (Slots).
	slotsSeen atomic.Int64
}

// URL is Address parsed (once: the proxy builds every upstream request from it). The caller must
// not modify it.
func (e *Endpoint) URL() (*url.URL, error) {
	if u := e.url.Load(); u != nil {
		return u, nil
	}
	u, err := url.Parse(e.Address)
	if err != nil {
		return nil, err
	}
	e.url.Store(u)
	return u, nil
}

// Fence stops KV-exact from choosing the endpoint (a failed re-probe: its identity or tokenizer no
// longer matches what was certified). The endpoint still serves through the other tiers.
func (e *Endpoint) Fence(reason string) { e.fenced.Store(&reason) }

// Unfence lifts a fence.
func (e *Endpoint) Unfence() { e.fenced.Store(nil) }

// Fenced returns the fence reason ("" when not fenced).
func (e *Endpoint) Fenced() string {
	if r := e.fenced.Load(); r != nil {
		return *r
	}
	return ""
}

// EngineReport is the engine's own count of requests as last scraped (gateway/engineload):
// Running and Waiting as the engine reported them (every replica's), Own this gateway's in-flight
// count when the scrape was sent, Others what the engine counted beyond it, WaitingOthers the
// waiting requests beyond the gateway's own that had shown no first token then (Pending: only
// those can be in the engine's waiting queue, and the ttft law already counts their prompt
// tokens in Ahead, so subtracting them keeps each request counted once); At is when the
// scrape was sent, Until when the report stops being used. Err is the last scrape's failure (the
// counts are then the last good report's).
type EngineReport struct {
	Running, Waiting, Own, Others int
	WaitingOthers                 int
	At, Until                     time.Time
	Err                           string
}

// SetEngineReport records the engine's latest report (nil: forget it). A good report with
// requests waiting shows the engine's running-request limit reached (or blocks short, when it
// runs fewer): the most running seen so is the limit Slots falls back to.
func (e *Endpoint) SetEngineReport(r *EngineReport) {
	e.engine.Store(r)
	if r != nil && r.Err == "" && r.Waiting > 0 {
		for n := int64(r.Running); ; {
			old := e.slotsSeen.Load()
			if n <= old || e.slotsSeen.CompareAndSwap(old, n) {
				break
			}
		}
	}
}

// Slots is how many requests the engine runs at once: MaxRunning when configured, else the most
// its load reports showed running while some waited, 0 while unknown.
func (e *Endpoint) Slots() int {
	if e.MaxRunning > 0 {
		return e.MaxRunning
	}
	return int(e.slotsSeen.Load())
}

// LastEngineReport is the engine's latest report, nil when none was read.
func (e *Endpoint) LastEngineReport() *EngineReport { return e.engine.Load() }

// Load is active + queued, plus the engine's report of other replicas' requests while it is fresh.
func (e *Endpoint) Load() int {
	own := int(e.active.Load() + e.queued.Load())
	if r := e.engine.Load(); r != nil && r.Others > 0 && !time.Now().After(r.Until) {
		return own + r.Others
	}
	return own
}

// Active is the number of requests in flight.
func (e *Endpoint) Active() int { return int(e.active.Load()) }

// Ahead is the uncached prompt tokens queued ahead of a new request here (ttft.go).
func (e *Endpoint) Ahead() int { return int(e.ahead.Load()) }

// AheadHit is the prompt tokens predicted cached here of the requests Ahead counts (ttft.go:
// the share of them the engine computes anyway is queued prefill too).
func (e *Endpoint) AheadHit() HitTokens {
	return HitTokens{Confirmed: int(e.aheadHit.Load()), Assumed: int(e.aheadAssumed.Load())}
}

// Pending is the gateway's requests in flight here, routed by the ttft law, that have shown no
// first token yet (the requests Ahead counts the tokens of).
func (e *Endpoint) Pending() int { return int(e.pending.Load()) }

// EngineWaiting is the waiting requests the engine reported beyond the gateway's own pending ones
// (EngineReport.WaitingOthers), while the report is fresh; 0 without one.
func (e *Endpoint) EngineWaiting() int {
	if r := e.engine.Load(); r != nil && r.WaitingOthers > 0 && !time.Now().After(r.Until) {
		return r.WaitingOthers
	}
	return 0
}

// Served counts requests routed to the endpoint.
func (e *Endpoint) Served() uint64 { return e.served.Load() }

// excluded reports the health exclusion reason, or a retry exclusion.
func (e *Endpoint) excluded(retry inventory.Mask) health.Reason {
	if retry.Has(e.ID) {
		return "connect_failed"
	}
	if e.Health == nil {
		return health.NotExcluded
	}
	return e.Health.Excluded()
}
