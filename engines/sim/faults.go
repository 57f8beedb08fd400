package sim

import (
	"errors"
	"sync"
	"time"
)

// Faults are the simulator's fault switches. Each produces a wire effect a gateway must survive.
type Faults struct {
	// DropEvents: the next N event messages are not delivered live — ZeroMQ batches consume their
	// sequence number (a gap; replay still has them, as after a PUB high-water-mark drop);
	// TensorRT-LLM events consume their event_id and are discarded (a gap in the drain).
	DropEvents int `json:"drop_events"`
	// SkipSeqEvery: after every N event messages one sequence number (TensorRT-LLM: event_id) is
	// skipped without a message being lost, again and again: a stream that keeps skipping numbers.
	SkipSeqEvery int `json:"skip_seq_every,omitempty"`
	// Refuse closes the API listener (connection refused) until cleared, or for RefuseMS.
	Refuse   bool `json:"refuse"`
	RefuseMS int  `json:"refuse_ms,omitempty"`
	// Status5xx: the next N inference requests are answered with StatusCode (default 503) in the
	// engine's error shape.
	Status5xx  int `json:"status_5xx"`
	StatusCode int `json:"status_code,omitempty"`
	// DelayMS is added before every inference request is queued.
	DelayMS int `json:"delay_ms"`
	// ReplayOff: the replay socket stays bound but answers nothing.
	ReplayOff bool `json:"replay_off"`
	// Unhealthy: /health answers 503.
	Unhealthy bool `json:"unhealthy"`
}

func (f *Faults) validate() error {
	if f.DropEvents < 0 || f.SkipSeqEvery < 0 || f.Status5xx < 0 || f.DelayMS < 0 || f.RefuseMS < 0 {
		return errors.New("sim: faults: counts and delays must not be negative")
	}
	if f.StatusCode != 0 && (f.StatusCode < 500 || f.StatusCode > 599) {
		return errors.New("sim: faults: status_code must be 5xx")
	}
	return nil
}

// FaultPatch changes some switches; nil fields keep their value.
type FaultPatch struct {
	DropEvents *int  `json:"drop_events"`
	SkipSeq    *int  `json:"skip_seq_every"`
	Refuse     *bool `json:"refuse"`
	RefuseMS   *int  `json:"refuse_ms"`
	Status5xx  *int  `json:"status_5xx"`
	StatusCode *int  `json:"status_code"`
	DelayMS    *int  `json:"delay_ms"`
	ReplayOff  *bool `json:"replay_off"`
	Unhealthy  *bool `json:"unhealthy"`
}

// faultBox holds the live switches.
type faultBox struct {
	mu sync.Mutex
	f  Faults
	// onRefuse is called when Refuse changes (the engine closes or reopens its listener).
	onRefuse func(refuse bool)
	timer    *time.Timer
	sent     uint64 // event messages counted for SkipSeqEvery
}

func (b *faultBox) get() Faults {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.f
}

// apply merges p into the switches.
func (b *faultBox) apply(p FaultPatch) (Faults, error) {
	b.mu.Lock()
	n := b.f
	set := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	set(&n.DropEvents, p.DropEvents)
	set(&n.SkipSeqEvery, p.SkipSeq)
	set(&n.RefuseMS, p.RefuseMS)
	set(&n.Status5xx, p.Status5xx)
	set(&n.StatusCode, p.StatusCode)
	set(&n.DelayMS, p.DelayMS)
	if p.Refuse != nil {
		n.Refuse = *p.Refuse
	}
	if p.ReplayOff != nil {
		n.ReplayOff = *p.ReplayOff
	}
	if p.Unhealthy != nil {
		n.Unhealthy = *p.Unhealthy
	}
	if err := n.validate(); err != nil {
		b.mu.Unlock()
		return b.f, err
	}
	changed := n.Refuse != b.f.Refuse
	b.f = n
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if n.Refuse && n.RefuseMS > 0 {
		b.timer = time.AfterFunc(time.Duration(n.RefuseMS)*time.Millisecond, func() {
			off := false
			_, _ = b.apply(FaultPatch{Refuse: &off})
		})
	}
	cb := b.onRefuse
	b.mu.Unlock()
	if changed && cb != nil {
		cb(n.Refuse)
	}
	return n, nil
}

// takeDrop consumes one dropped event message; true when this one must be dropped.
func (b *faultBox) takeDrop() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.f.DropEvents > 0 {
		b.f.DropEvents--
		return true
	}
	return false
}

// takeSkip counts one event message against SkipSeqEvery; true when a sequence number must be
// skipped before it.
func (b *faultBox) takeSkip() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.f.SkipSeqEvery <= 0 {
		return false
	}
	b.sent++
	return b.sent%uint64(b.f.SkipSeqEvery) == 0
}

// take5xx consumes one forced error; the status, or 0 when the request proceeds.
func (b *faultBox) take5xx() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.f.Status5xx > 0 {
		b.f.Status5xx--
		if b.f.StatusCode != 0 {
			return b.f.StatusCode
		}
		return 503
	}
	return 0
}

func (b *faultBox) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
}
