package route

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Admission errors.
var (
	// ErrShed: every candidate is at its in-flight cap and the rule sheds (429, retriable).
	ErrShed = errors.New("every endpoint is at its in-flight limit")
	// ErrParkTimeout: the request waited its park deadline without a free slot (504).
	ErrParkTimeout = errors.New("no endpoint freed a slot within the park deadline")
)

// admission is the mode-1 gate: per-endpoint in-flight caps. When every candidate is capped the
// request is parked (held, not dropped: FIFO up to depth, with a deadline) or shed.
type admission struct {
	maxInflight int
	shed        bool
	depth       int
	maxPark     time.Duration

	mu      sync.Mutex
	waiting int
	wake    chan struct{} // closed and replaced whenever a slot may have freed
}

func newAdmission(maxInflight int, shed bool, depth int, maxPark time.Duration) *admission {
	return &admission{maxInflight: maxInflight, shed: shed, depth: depth, maxPark: maxPark, wake: make(chan struct{})}
}

func (a *admission) open(cands []*Endpoint) bool {
	for _, c := range cands {
		if c.Active() < a.maxInflight {
			return true
		}
	}
	return false
}

// wait returns once some candidate has a free slot, or with ErrShed / ErrParkTimeout / ctx's error.
// queued counts the parked request into every candidate's load while it waits.
func (a *admission) wait(ctx context.Context, cands func() []*Endpoint) error {
	if a == nil {
		return nil
	}
	if a.open(cands()) {
		return nil
	}
	if a.shed {
		return ErrShed
	}
	a.mu.Lock()
	if a.waiting >= a.depth {
		a.mu.Unlock()
		return ErrShed
	}
	a.waiting++
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.waiting--
		a.mu.Unlock()
	}()
	deadline := time.NewTimer(a.maxPark)
	defer deadline.Stop()
	for {
		a.mu.Lock()
		wake := a.wake
		a.mu.Unlock()
		if a.open(cands()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return ErrParkTimeout
		case <-wake:
		}
	}
}

// released wakes parked requests after a request finished.
func (a *admission) released() {
	if a == nil {
		return
	}
	a.mu.Lock()
	close(a.wake)
	a.wake = make(chan struct{})
	a.mu.Unlock()
}

// admissionTier is the P/D ladder's gate: it waits (Route only, never Explain) until some prefill
// candidate is under its in-flight cap, then narrows the candidates to those that are. It never
// picks; shed and park timeout end the decision.
type admissionTier struct{ rt *Router }

func (t admissionTier) pick(ctx context.Context, c *choice) (pick, error) {
	a := t.rt.admission
	if !c.d.dry {
		// Each check re-reads the candidates: health and retry exclusions hold while parked.
		refresh := func() []*Endpoint {
			c.cands = t.rt.appendCandidates(c.cands[:0], c.retry, RolePrefill)
			return c.cands
		}
		if err := a.wait(ctx, refresh); err != nil {
			return pick{}, err
		}
	}
	open := c.cands[:0]
	for _, p := range c.cands {
		if p.Active() < a.maxInflight {
			open = append(open, p)
		}
	}
	c.cands = open
	return pick{}, nil
}
