package sim

import (
	"context"
	"sync"
	"time"

	"github.com/kvexact/kvexact/engines"
)

// drain is TensorRT-LLM's KV event manager as trtllm-serve exposes it: a bounded buffer that
// POST /kv_cache_events empties destructively, event_id counting per attention-DP rank, the oldest
// events discarded past the bound (a gap in event_id), and one `created` event per attention window
// at startup.
type drain struct {
	mu      sync.Mutex
	events  []engines.Event
	ids     []uint64 // next event_id per rank
	max     int
	window  int
	blocks  int // GPU blocks per rank, for `created`
	dp      int
	wake    chan struct{}
	faults  *faultBox
	closed  bool
	dropped uint64
}

func newDrain(max, dp, window int, faults *faultBox) *drain {
	return &drain{max: max, dp: dp, window: window, ids: make([]uint64, dp), wake: make(chan struct{}), faults: faults}
}

// startup is what a (re)started engine enqueues: event_id from 0 and a `created` event per rank.
func (d *drain) startup() {
	d.mu.Lock()
	d.events = d.events[:0]
	for r := range d.ids {
		d.ids[r] = 0
	}
	d.mu.Unlock()
	for r := 0; r < d.dp; r++ {
		d.add(r, []engines.Event{{Kind: engines.CacheCreated, NumBlocks: []int{d.blocks, 0}}})
	}
}

// add stamps and buffers one step's events.
func (d *drain) add(rank int, evs []engines.Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ev := range evs {
		if d.faults.takeSkip() {
			d.ids[rank]++
		}
		ev.EventID = d.ids[rank]
		d.ids[rank]++
		ev.WindowSize, ev.HasWindowSize = d.window, true
		if d.dp > 1 {
			ev.DPRank, ev.HasDPRank = rank, true
		}
		if d.faults.takeDrop() {
			d.dropped++
			continue
		}
		if len(d.events) >= d.max {
			// "The event queue has reached the max size … Events have been discarded."
			n := len(d.events) - d.max + 1
			d.events = append(d.events[:0], d.events[n:]...)
			d.dropped += uint64(n)
		}
		d.events = append(d.events, ev)
	}
	if len(evs) > 0 {
		close(d.wake)
		d.wake = make(chan struct{})
	}
}

// take drains the buffer, waiting up to wait for a first event when it is empty.
func (d *drain) take(ctx context.Context, wait time.Duration) []engines.Event {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		d.mu.Lock()
		if len(d.events) > 0 || d.closed {
			out := d.events
			d.events = nil
			d.mu.Unlock()
			return out
		}
		wake := d.wake
		d.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

func (d *drain) nextID(rank int) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if rank < 0 || rank >= len(d.ids) {
		return 0
	}
	return d.ids[rank]
}

func (d *drain) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.closed {
		d.closed = true
		close(d.wake)
		d.wake = make(chan struct{})
	}
}
