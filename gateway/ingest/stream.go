package ingest

import (
	"errors"
	"hash/maphash"
	"sync"
	"time"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
)

// stream is what every source of one endpoint shares: the binder and the apply function behind one
// mutex (ranks run concurrently, the inventory sees one update at a time), metrics and tracing.
type stream struct {
	cfg   Config
	lab   labels
	seed  maphash.Seed
	mu    sync.Mutex
	b     *binder
	apply func(Update)
}

func newStream(cfg Config, apply func(Update)) *stream {
	s := &stream{
		cfg:   cfg,
		lab:   labels{m: cfg.Metrics, rule: cfg.Rule, endpoint: cfg.Endpoint},
		seed:  maphash.MakeSeed(),
		apply: apply,
	}
	s.b = newBinder(cfg.Family, cfg.Binding, cfg.BlockSize, cfg.MaxMapped)
	s.b.emit = apply
	if cfg.Family != "trtllm" && residencyFor(cfg.Family, cfg.Release) == contracts.ResidencyPresence {
		s.b.presenceRule(apply)
	}
	s.b.applied = s.lab.applied
	s.b.skipped = func(rank int, reason string, n int) {
		if n <= 0 {
			return
		}
		s.lab.skip(rank, reason, n)
		s.trace(Trace{Type: "skip", Rank: rank, Reason: reason, Count: n})
	}
	s.b.cleared = func(cause string) {
		s.lab.clear(cause)
		s.cfg.Logger.Info("ingest: endpoint inventory cleared", "endpoint", cfg.Endpoint, "cause", cause)
	}
	return s
}

func (s *stream) trace(t Trace) {
	if s.cfg.Trace != nil {
		if t.Wall.IsZero() {
			t.Wall = time.Now()
		}
		s.cfg.Trace(t)
	}
}

// clear empties the endpoint (all ranks) for cause.
func (s *stream) clear(rank int, cause string) {
	s.mu.Lock()
	s.b.clear(rank, cause)
	s.mu.Unlock()
	s.trace(Trace{Type: "clear", Rank: rank, Reason: cause})
}

// sequence applies the window's verdict for one message: gap and clear bookkeeping. It returns
// false when the message must be dropped (duplicate or stale).
func (s *stream) sequence(rank int, w *seqWindow, seq, digest uint64, replay bool) (Verdict, bool) {
	v, missing := w.Check(seq, digest, replay)
	switch v {
	case Duplicate, Stale:
		s.trace(Trace{Type: "duplicate", Rank: rank, Seq: seq, HasSeq: true, Reason: v.String()})
		return v, false
	case GapKept:
		s.lab.gap(rank, "kept")
		s.trace(Trace{Type: "gap", Rank: rank, Seq: seq, HasSeq: true, Missing: missing, Reason: "kept"})
	case GapCleared, Regression, Restart:
		s.lab.gap(rank, "cleared")
		s.trace(Trace{Type: "gap", Rank: rank, Seq: seq, HasSeq: true, Missing: missing, Reason: "cleared",
			Detail: v.String()})
		cause := "gap"
		if v != GapCleared {
			cause = v.String()
		}
		s.clear(rank, cause)
		w.Reset()
	}
	w.Accept(seq, digest, replay)
	return v, true
}

// reject counts and traces a payload refused whole.
func (s *stream) reject(rank int, seq uint64, hasSeq bool, err error) {
	reason := string(engines.ReasonDecodeError)
	var de *engines.DecodeError
	if errors.As(err, &de) {
		reason = string(de.Reason)
	}
	s.lab.reject(rank, reason)
	s.trace(Trace{Type: "reject", Rank: rank, Seq: seq, HasSeq: hasSeq, Reason: reason, Detail: err.Error()})
	s.cfg.Logger.Warn("ingest: payload rejected", "endpoint", s.cfg.Endpoint, "rank", rank, "seq", seq,
		"reason", reason, "err", err)
}

// batch applies one decoded batch of rank.
func (s *stream) batch(rank int, seq uint64, b *engines.Batch) {
	if err := engines.CheckRank(b, rank); err != nil {
		s.reject(rank, seq, true, err)
		return
	}
	now := time.Now()
	if b.Timestamp > 0 {
		s.lab.lag(rank, float64(now.UnixNano())/1e9-b.Timestamp)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range b.Events {
		ev := &b.Events[i]
		s.trace(Trace{Type: "event", Rank: rank, Seq: seq, HasSeq: true, Event: ev, Wall: now,
			BatchTS: b.Timestamp, HasBatch: true})
		s.b.event(rank, ev)
	}
}

// event applies one TensorRT-LLM event (no batch) of rank.
func (s *stream) event(rank int, ev *engines.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trace(Trace{Type: "event", Rank: rank, Seq: ev.EventID, HasSeq: true, Event: ev})
	s.b.event(rank, ev)
}
