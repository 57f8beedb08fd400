package trtllm

import "github.com/kvexact/kvexact/engines"

// WindowFilter keeps only the events of the global-attention block pool. A VSWA model has one pool
// per attention window, each publishing the same hashes, and the sliding-window pools evict early;
// routing on them would report blocks the global pool no longer holds. The rule (Dynamo's): learn
// the largest window_size from the `created` events, keep events of that window, and pass events
// that carry no window_size (older builds). Use one filter per (endpoint, attention-DP rank).
type WindowFilter struct {
	max        int
	learned    bool // max comes from created events
	inCreation bool // the previous event was a created event
}

// Max returns the window kept and whether it was learned from created events.
func (f *WindowFilter) Max() (int, bool) { return f.max, f.learned }

// Keep reports whether e should reach the inventory, updating what the filter has learned. Created
// events always pass (they announce a fresh pool); a run of created events after other events starts
// a new epoch (an engine restart) and the maximum is learned again. Until a created event has been
// seen, an event passes when its window is at least the largest seen so far.
func (f *WindowFilter) Keep(e *engines.Event) bool {
	if e.Kind == engines.CacheCreated {
		if !f.inCreation {
			f.max, f.learned = 0, false
		}
		f.inCreation = true
		if e.HasWindowSize {
			f.max, f.learned = max(f.max, e.WindowSize), true
		}
		return true
	}
	f.inCreation = false
	if !e.HasWindowSize {
		return true
	}
	if f.learned {
		return e.WindowSize == f.max
	}
	if e.WindowSize >= f.max {
		f.max = e.WindowSize
		return true
	}
	return false
}

// Continuity is what an event_id says about the stream.
type Continuity uint8

const (
	// IDFirst: the first event seen for this rank.
	IDFirst Continuity = iota + 1
	// IDNext: exactly the previous id + 1.
	IDNext
	// IDGap: ids were skipped (buffer overflow dropped the oldest events, or another consumer drained
	// them); Missed says how many.
	IDGap
	// IDRestart: the id went backwards (the engine restarted; ids restart at 0 with created events).
	IDRestart
)

func (c Continuity) String() string {
	switch c {
	case IDFirst:
		return "first"
	case IDNext:
		return "next"
	case IDGap:
		return "gap"
	case IDRestart:
		return "restart"
	}
	return "invalid"
}

// IDTracker checks event_id continuity per attention-DP rank (each rank has its own counter).
type IDTracker struct {
	last map[int]uint64
}

// Observe records e's event_id and classifies it; missed is the number of skipped ids on IDGap.
func (t *IDTracker) Observe(e *engines.Event) (c Continuity, missed uint64) {
	if t.last == nil {
		t.last = make(map[int]uint64)
	}
	rank := 0
	if e.HasDPRank {
		rank = e.DPRank
	}
	prev, ok := t.last[rank]
	t.last[rank] = e.EventID
	switch {
	case !ok:
		return IDFirst, 0
	case e.EventID == prev+1:
		return IDNext, 0
	case e.EventID > prev+1:
		return IDGap, e.EventID - prev - 1
	}
	return IDRestart, 0
}

// Reset forgets every rank (after the endpoint was reconnected or re-admitted).
func (t *IDTracker) Reset() { t.last = nil }
