package health

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Endpoint is the health view of one endpoint: breaker, probe result and operator state.
type Endpoint struct {
	Name    string
	Address string // base URL
	Breaker *Breaker

	probeDown  atomic.Bool
	adminDown  atomic.Bool
	draining   atomic.Bool
	probeFails atomic.Int32
	probeOKs   atomic.Int32
}

// NewEndpoint builds the health view of an endpoint.
func NewEndpoint(name, address string, cfg BreakerConfig) *Endpoint {
	return &Endpoint{Name: name, Address: address, Breaker: NewBreaker(cfg, nil)}
}

// Reason says why an endpoint is excluded ("" when it is not).
type Reason string

const (
	NotExcluded Reason = ""
	AdminDown   Reason = "admin_down"
	Draining    Reason = "draining"
	ProbeDown   Reason = "unhealthy"
	BreakerOpen Reason = "breaker_open"
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

// SetAdminDown takes the endpoint out of (or back into) every tier.
func (e *Endpoint) SetAdminDown(down bool) { e.adminDown.Store(down) }

// SetDraining stops new requests to the endpoint (or resumes them).
func (e *Endpoint) SetDraining(d bool) { e.draining.Store(d) }

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
