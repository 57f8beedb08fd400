// Package health owns what the gateway knows about each endpoint's fitness to serve: a circuit
// breaker fed by the proxy's outcomes, active health probes, and operator states (admin down, drain).
// Selection never decides health; it only reads the exclusion mask this package produces.
package health

import (
	"sync"
	"sync/atomic"
	"time"
)

// State is a circuit breaker state.
type State int

const (
	// Closed: requests flow; failures are counted.
	Closed State = iota
	// Open: the endpoint is excluded until OpenFor has passed.
	Open
	// HalfOpen: a few trial requests decide between Closed and Open.
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return "unknown"
}

// BreakerConfig holds the thresholds (rules.Breaker after defaults).
type BreakerConfig struct {
	// FailureThreshold consecutive transport failures open the breaker.
	FailureThreshold int
	// OpenFor is how long it stays open before trials.
	OpenFor time.Duration
	// HalfOpenRequests trial requests are admitted while half-open.
	HalfOpenRequests int
	// OriginErrorThreshold consecutive origin 5xx open it (0 disables).
	OriginErrorThreshold int
}

// Breaker is one endpoint's circuit breaker. Transport failures (connect refused, reset before a
// response) and origin 5xx streaks open it; a 4xx is the client's fault and neither advances nor
// resets anything; any status below 400 resets the origin streak.
type Breaker struct {
	cfg BreakerConfig
	now func() time.Time

	// calm mirrors "closed, with no failure or 5xx streak being counted": the state every
	// request of a healthy endpoint finds, answered without taking mu.
	calm atomic.Bool

	mu           sync.Mutex
	state        State
	failures     int
	originStreak int
	openedAt     time.Time
	trials       int // half-open trials in flight
	opens        uint64

	// onChange, when set, runs after Report moved the state (the endpoint's log line).
	onChange func()
}

// NewBreaker builds a closed breaker. now may be nil (time.Now).
func NewBreaker(cfg BreakerConfig, now func() time.Time) *Breaker {
	if now == nil {
		now = time.Now
	}
	if cfg.FailureThreshold < 1 {
		cfg.FailureThreshold = 5
	}
	if cfg.HalfOpenRequests < 1 {
		cfg.HalfOpenRequests = 3
	}
	if cfg.OpenFor <= 0 {
		cfg.OpenFor = 30 * time.Second
	}
	b := &Breaker{cfg: cfg, now: now}
	b.calm.Store(true)
	return b
}

// advance moves Open to HalfOpen once OpenFor has passed. Callers hold mu.
func (b *Breaker) advance() {
	if b.state == Open && b.now().Sub(b.openedAt) >= b.cfg.OpenFor {
		b.state, b.trials = HalfOpen, 0
	}
}

// publish updates calm after a change under mu.
func (b *Breaker) publish() {
	b.calm.Store(b.state == Closed && b.failures == 0 && b.originStreak == 0)
}

// State returns the current state (moving Open to HalfOpen when due).
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	return b.state
}

// Available reports whether a request could be sent now, without taking a trial slot.
func (b *Breaker) Available() bool {
	if b.calm.Load() {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	switch b.state {
	case Closed:
		return true
	case HalfOpen:
		return b.trials < b.cfg.HalfOpenRequests
	}
	return false
}

// Acquire admits one request: always when closed, as a trial when half-open (up to the limit),
// never when open. Every admitted request must end with exactly one Report.
func (b *Breaker) Acquire() bool {
	if b.calm.Load() {
		return true // closed admits without counting
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	switch b.state {
	case Closed:
		return true
	case HalfOpen:
		if b.trials < b.cfg.HalfOpenRequests {
			b.trials++
			return true
		}
	}
	return false
}

// Outcome is how a request to the endpoint ended.
type Outcome int

const (
	// Success: a response below 500 arrived (4xx included for transport purposes).
	Success Outcome = iota
	// TransportFailure: no response (connect refused, reset, timeout before headers).
	TransportFailure
	// Canceled: the client went away; says nothing about the endpoint.
	Canceled
)

// Report records the outcome of an admitted request; status is the origin status (0 without one).
func (b *Breaker) Report(o Outcome, status int) {
	if b.calm.Load() && (o == Canceled || o == Success && status < 400) {
		return // changes nothing: closed stays closed with nothing counted
	}
	b.mu.Lock()
	before, wasFailing := b.state, b.failures > 0
	b.report(o, status)
	b.publish()
	after, failing := b.state, b.failures > 0
	b.mu.Unlock()
	if (after != before || failing != wasFailing) && b.onChange != nil {
		b.onChange()
	}
}

// Failing reports whether the last requests failed in transport while the breaker is still
// closed (fewer than FailureThreshold in a row): the endpoint is unreachable but not yet excluded.
func (b *Breaker) Failing() bool {
	if b.calm.Load() {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == Closed && b.failures > 0
}

// report is Report's state change. Callers hold mu.
func (b *Breaker) report(o Outcome, status int) {
	b.advance()
	wasTrial := b.state == HalfOpen && b.trials > 0
	if wasTrial {
		b.trials--
	}
	switch {
	case o == Canceled:
		return
	case o == TransportFailure:
		b.failures++
		if b.state == HalfOpen || b.failures >= b.cfg.FailureThreshold {
			b.trip()
		}
	case status >= 500:
		// The origin answered, so the transport is fine, but a run of 5xx means it is sick.
		b.failures = 0
		b.originStreak++
		if b.cfg.OriginErrorThreshold > 0 && b.originStreak >= b.cfg.OriginErrorThreshold {
			b.trip()
		} else if b.state == HalfOpen {
			b.trip()
		}
	case status >= 400:
		// Client error: neutral. A half-open trial that got a 4xx still proves the endpoint answers.
		b.failures = 0
		if b.state == HalfOpen {
			b.close()
		}
	default:
		b.failures, b.originStreak = 0, 0
		if b.state == HalfOpen {
			b.close()
		}
	}
}

func (b *Breaker) trip() {
	if b.state != Open {
		b.opens++
	}
	b.state, b.openedAt, b.trials = Open, b.now(), 0
	b.failures, b.originStreak = 0, 0
}

func (b *Breaker) close() { b.state, b.failures, b.originStreak, b.trials = Closed, 0, 0, 0 }

// Opens counts transitions into Open (for metrics).
func (b *Breaker) Opens() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opens
}
