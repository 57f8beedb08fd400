package health

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Endpoint is the health view of one endpoint: breaker, probe result, operator state and whether
// its event stream is connected. It is the one state selection (Excluded), readiness (Ready), the
// per-endpoint health metrics and the state-change log lines are all read from.
type Endpoint struct {
	Name    string
	Address string // base URL
	Breaker *Breaker

	probeDown  atomic.Bool
	adminDown  atomic.Bool
	draining   atomic.Bool
	probeFails atomic.Int32
	probeOKs   atomic.Int32

	// events is the state of each rank's event stream (nil: the endpoint publishes no events the
	// gateway reads); synced says every rank has been synchronized at least once since the ranks
	// were declared (the inventory was rebuilt from the engine, not just started empty).
	evMu   sync.Mutex
	events []EventState
	synced bool

	// log receives one line per change of Excluded; last is the value last logged.
	log    atomic.Pointer[slog.Logger]
	noteMu sync.Mutex
	last   Reason
}

// NewEndpoint builds the health view of an endpoint.
func NewEndpoint(name, address string, cfg BreakerConfig) *Endpoint {
	e := &Endpoint{Name: name, Address: address, Breaker: NewBreaker(cfg, nil)}
	e.Breaker.onChange = e.note
	return e
}

// SetLog makes every later change of Excluded write one line to l: WARN when the endpoint is
// excluded (with the reason), INFO when it is back.
func (e *Endpoint) SetLog(l *slog.Logger) { e.log.Store(l) }

// Unreachable is what the state-change log calls a routable endpoint whose last requests failed
// in transport (Breaker.Failing): not an exclusion, the step before the breaker opens.
const Unreachable Reason = "unreachable"

// condition is what the log follows: Excluded, else Unreachable while the breaker counts failures.
func (e *Endpoint) condition() Reason {
	if r := e.Excluded(); r != NotExcluded {
		return r
	}
	if e.Breaker.Failing() {
		return Unreachable
	}
	return NotExcluded
}

// note logs a change of condition since the last call that saw one. Every mutation of the state
// calls it, and so does each probe round (an open breaker's OpenFor runs out without one).
func (e *Endpoint) note() {
	now := e.condition()
	e.noteMu.Lock()
	prev := e.last
	e.last = now
	e.noteMu.Unlock()
	l := e.log.Load()
	if now == prev || l == nil {
		return
	}
	switch now {
	case NotExcluded:
		l.Info("endpoint back in rotation", "was", string(prev), "breaker", e.Breaker.State().String())
	case Unreachable:
		l.Warn("endpoint unreachable: requests to it fail; its breaker opens if they go on failing", "was", string(prev))
	default:
		l.Warn("endpoint excluded from routing", "reason", string(now), "was", string(prev))
	}
}

// Reason says why an endpoint is excluded ("" when it is not).
type Reason string

const (
	NotExcluded Reason = ""
	AdminDown   Reason = "admin_down"
	Draining    Reason = "draining"
	ProbeDown   Reason = "unhealthy"
	BreakerOpen Reason = "breaker_open"
	// EventsUnsynced: the endpoint is routable, but a rank's event stream is not connected, so its
	// inventory may miss what the engine caches (Ready only; selection still uses the endpoint).
	EventsUnsynced Reason = "events_unsynced"
	// EventsSyncing: every rank's stream is connected, but a rank is still rebuilding the
	// inventory from the engine's replay (Ready only).
	EventsSyncing Reason = "events_syncing"
)

// Reasons is every non-empty Reason, the closed set of the health metrics' reason label.
var Reasons = []Reason{AdminDown, Draining, ProbeDown, BreakerOpen, EventsUnsynced, EventsSyncing}

// EventState is one rank's event stream as readiness sees it.
type EventState uint8

const (
	// EventsDown: not connected (not yet, or the connection was lost).
	EventsDown EventState = iota
	// EventsReplaying: connected; the replay that rebuilds the rank's inventory has not completed.
	EventsReplaying
	// EventsSynced: connected and the inventory follows the engine (replay completed, or the rank
	// has no replay and follows the live stream from its connection).
	EventsSynced
)

// Excluded reports whether selection must skip the endpoint, and why. Draining endpoints finish
// what they have but get no new requests.
func (e *Endpoint) Excluded() Reason {
	switch {
	case e.adminDown.Load():
		return AdminDown
	case e.draining.Load():
		return Draining
	case e.probeDown.Load():
		return ProbeDown
	case !e.Breaker.Available():
		return BreakerOpen
	}
	return NotExcluded
}

// Ready reports whether the endpoint counts toward its rule's readiness, and why not: routable
// (Excluded) and every event rank synchronized.
func (e *Endpoint) Ready() Reason {
	if r := e.Excluded(); r != NotExcluded {
		return r
	}
	e.evMu.Lock()
	defer e.evMu.Unlock()
	why := NotExcluded
	for _, s := range e.events {
		switch s {
		case EventsDown:
			return EventsUnsynced
		case EventsReplaying:
			why = EventsSyncing
		}
	}
	return why
}

// EverSynced reports whether every rank has been synchronized at least once since the ranks were
// declared (true for an endpoint without events): a replica that never was holds an inventory
// built from nothing, one that lost a stream later holds one that was exact until then.
func (e *Endpoint) EverSynced() bool {
	e.evMu.Lock()
	defer e.evMu.Unlock()
	return e.synced || len(e.events) == 0
}

// SetEventRanks declares that the endpoint publishes events on n ranks, none connected yet (0:
// none the gateway reads). Ranks already declared keep their state.
func (e *Endpoint) SetEventRanks(n int) {
	e.evMu.Lock()
	defer e.evMu.Unlock()
	if n == len(e.events) {
		return
	}
	if n > len(e.events) {
		e.synced = false // a new rank has an inventory to rebuild
	}
	ev := make([]EventState, n)
	copy(ev, e.events)
	e.events = ev
	e.updateSynced()
}

// SetEventState records one rank's event stream state.
func (e *Endpoint) SetEventState(rank int, s EventState) {
	e.evMu.Lock()
	defer e.evMu.Unlock()
	if rank >= 0 && rank < len(e.events) {
		e.events[rank] = s
		e.updateSynced()
	}
}

// EventsSynchronized reports whether every rank is synchronized now.
func (e *Endpoint) EventsSynchronized() bool {
	e.evMu.Lock()
	defer e.evMu.Unlock()
	for _, s := range e.events {
		if s != EventsSynced {
			return false
		}
	}
	return true
}

func (e *Endpoint) updateSynced() {
	if e.synced || len(e.events) == 0 {
		return
	}
	for _, s := range e.events {
		if s != EventsSynced {
			return
		}
	}
	e.synced = true
}

// SetAdminDown takes the endpoint out of (or back into) every tier.
func (e *Endpoint) SetAdminDown(down bool) { e.adminDown.Store(down); e.note() }

// SetDraining stops new requests to the endpoint (or resumes them).
func (e *Endpoint) SetDraining(d bool) { e.draining.Store(d); e.note() }

// ProbeDown reports the last probe verdict.
func (e *Endpoint) ProbeDown() bool { return e.probeDown.Load() }

// Prober actively checks endpoints with GET requests. An endpoint is marked down after Fall
// consecutive failures (any transport error or status ≥ 500) and up after Rise consecutive successes.
type Prober struct {
	Client   *http.Client
	Path     string        // default /health
	Interval time.Duration // default 5s
	Timeout  time.Duration // default 2s
	Fall     int           // default 2
	Rise     int           // default 1
}

// Run probes every endpoint that targets returns, each Interval, until ctx ends.
func (p *Prober) Run(ctx context.Context, targets func() []*Endpoint) {
	interval := p.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		p.Once(ctx, targets())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Once probes the endpoints concurrently and updates their state.
func (p *Prober) Once(ctx context.Context, eps []*Endpoint) {
	var wg sync.WaitGroup
	for _, e := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.probe(ctx, e)
		}()
	}
	wg.Wait()
}

func (p *Prober) probe(ctx context.Context, e *Endpoint) {
	client := p.Client
	if client == nil {
		client = http.DefaultClient
	}
	path := p.Path
	if path == "" {
		path = "/health"
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	fall, rise := int32(max(p.Fall, 1)), int32(max(p.Rise, 1))
	if p.Fall == 0 {
		fall = 2
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ok := false
	if req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.Address+path, nil); err == nil {
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			ok = resp.StatusCode < 500
		}
	}
	if ctx.Err() != nil && !ok && ctx.Err() != context.DeadlineExceeded {
		return // shutting down: no verdict
	}
	defer e.note()
	if ok {
		e.probeFails.Store(0)
		if e.probeOKs.Add(1) >= rise {
			e.probeDown.Store(false)
		}
		return
	}
	e.probeOKs.Store(0)
	if e.probeFails.Add(1) >= fall {
		e.probeDown.Store(true)
	}
}
