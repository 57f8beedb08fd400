package ctk

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/ingest"
)

// seen is one decoded engine event, copied out of the source's buffers.
type seen struct {
	Rank      int
	Seq       uint64
	Kind      engines.Kind
	Hashes    []uint64
	Parent    uint64
	HasParent bool
	Tokens    []uint32
	Blocks    [][]uint32 // TensorRT-LLM per-block tokens
	BlockSize int
	Medium    string
	Extra     bool // extra keys or LoRA present
	LoRAName  string
	Replayed  bool // delivered by a replay exchange, not live
	At        time.Time
}

// blockSize is the event's block size: its own field, or (TensorRT-LLM) the longest block.
func (s *seen) blockSize() int {
	if s.BlockSize > 0 {
		return s.BlockSize
	}
	n := 0
	for _, b := range s.Blocks {
		n = max(n, len(b))
	}
	return n
}

// notice is a gap, reject, replay or connection notice of the stream.
type notice struct {
	Type, Reason, Detail, Addr string
	Rank                       int
	Seq                        uint64
	Missing                    uint64
}

// watcher subscribes to one endpoint's event stream through the gateway's own event source
// (gateway/ingest), so certification reads events exactly as the gateway will, and keeps what it
// saw for the specs.
type watcher struct {
	ranks     int
	hasReplay bool
	cancel    context.CancelFunc
	done      chan struct{}
	runErr    error

	mu        sync.Mutex
	events    []seen
	notices   []notice
	connected map[int]bool
	connectAt time.Time      // the latest connect of any rank
	replayed  map[int]string // completed / failed
	replaying map[int]bool   // a replay exchange is running: its events are not live
	live      map[int]bool   // an event arrived after the rank's replay
	lastErr   string
	changed   chan struct{}
}

// startWatcher starts the event source for an endpoint; it runs until stop.
func startWatcher(ctx context.Context, family, release string, st Staged, ev Events) (*watcher, error) {
	w := &watcher{done: make(chan struct{}), connected: map[int]bool{}, replayed: map[int]string{}, replaying: map[int]bool{}, live: map[int]bool{}, changed: make(chan struct{}, 1)}
	cfg := ingest.Config{Endpoint: "ctk", Family: family, Release: release, BlockSize: st.BlockSize,
		DialBackoffMin: 50 * time.Millisecond, DialBackoffMax: 500 * time.Millisecond, ReplayTimeout: 5 * time.Second, Trace: w.trace}
	if st.Contract.Drained() {
		cfg.Binding, cfg.DrainURL, w.ranks = ingest.BindingRouter, ev.Drain, 1
	} else {
		cfg.Binding, cfg.Publish, cfg.Replay, w.ranks = ingest.BindingEngine, ev.ZMQ, ev.Replay, len(ev.ZMQ)
		w.hasReplay = len(ev.Replay) > 0
	}
	src, err := ingest.New(cfg)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	go func() {
		defer close(w.done)
		w.runErr = src.Run(rctx, func(ingest.Update) {})
	}()
	return w, nil
}

func (w *watcher) stop() {
	w.cancel()
	<-w.done
}

func (w *watcher) trace(t ingest.Trace) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch t.Type {
	case "event":
		ev := t.Event
		s := seen{Rank: t.Rank, Seq: t.Seq, Kind: ev.Kind, Parent: ev.Parent, HasParent: ev.HasParent,
			Hashes: slices.Clone(ev.BlockHashes), Tokens: slices.Clone(ev.TokenIDs), BlockSize: ev.BlockSize,
			Medium: ev.Medium, At: t.Wall, Extra: ev.LoRAName != "" || ev.HasLoRAID || ev.CacheSalt != "", LoRAName: ev.LoRAName, Replayed: w.replaying[t.Rank]}
		for _, x := range ev.ExtraKeys {
			if x != nil {
				s.Extra = true
			}
		}
		if ev.BlockSize == 0 && len(ev.BlockTokens) > 0 {
			for _, b := range ev.BlockTokens {
				s.Blocks = append(s.Blocks, slices.Clone(b))
			}
		}
		w.events = append(w.events, s)
		if !s.Replayed {
			w.live[t.Rank] = true
		}
	case "connect":
		w.connected[t.Rank] = true
		w.connectAt = time.Now()
	case "disconnect":
		w.connected[t.Rank] = false
	case "error":
		w.lastErr = fmt.Sprintf("%s %s: %s", t.Reason, t.Addr, t.Detail)
	case "replay":
		w.replaying[t.Rank] = t.Reason == "requested"
		if t.Reason == "completed" || t.Reason == "failed" {
			w.replayed[t.Rank] = t.Reason
			w.live[t.Rank] = false
		}
		w.notices = append(w.notices, notice{Type: t.Type, Reason: t.Reason, Detail: t.Detail, Addr: t.Addr, Rank: t.Rank, Seq: t.Seq})
	case "gap", "reject", "duplicate", "clear":
		n := notice{Type: t.Type, Reason: t.Reason, Detail: t.Detail, Rank: t.Rank, Seq: t.Seq, Missing: t.Missing}
		if t.Type == "gap" && w.hasReplay && w.replayed[t.Rank] != "" && !w.live[t.Rank] {
			// The first live message after a replay: messages published while the subscription
			// was still reaching the publisher are missing here (the slow-joiner rule), not lost
			// by the engine.
			n.Type = "join-gap"
		}
		w.notices = append(w.notices, n)
	}
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// waitFor polls cond (under the lock) until it holds or the timeout passes.
func (w *watcher) waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		w.mu.Lock()
		ok := cond()
		w.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return false
		case <-w.changed:
		case <-tick.C:
		}
	}
}

// ready waits until every rank is subscribed (and replayed, where a replay address is given).
func (w *watcher) ready(ctx context.Context, timeout time.Duration) error {
	ok := w.waitFor(ctx, timeout, func() bool {
		for r := 0; r < w.ranks; r++ {
			if !w.connected[r] {
				return false
			}
			if w.hasReplay && w.replayed[r] == "" {
				return false
			}
		}
		return true
	})
	if ok {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lastErr != "" {
		return fmt.Errorf("not subscribed after %s: %s", timeout, w.lastErr)
	}
	return fmt.Errorf("not subscribed after %s", timeout)
}

// snapshot copies what was seen so far.
func (w *watcher) snapshot() ([]seen, []notice) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.events), slices.Clone(w.notices)
}

// lastConnect is when the latest rank connected.
func (w *watcher) lastConnect() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.connectAt
}

// noticeCount is the number of notices so far.
func (w *watcher) noticeCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.notices)
}

// count is the number of events seen so far.
func (w *watcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.events)
}
