package ingest

import (
	"errors"
	"hash/maphash"
	"sync"
	"time"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/kvgroups"
)

// pipeline is what the ranks of one endpoint share after their sources: the binder and the
// inventory apply behind one mutex (ranks run concurrently, the inventory sees one update at a
// time), metrics and tracing. Each rank keeps its own sequence window and decoder (window.go,
// decode.go) and hands decoded batches to batch or event.
type pipeline struct {
	cfg  Config
	lab  labels
	seed maphash.Seed // payload digests for the window
	mu   sync.Mutex
	b    *binder
	// applied is, per rank, the last message whose batch reached the binder (under mu, so it
	// names exactly what the inventory holds): what a snapshot says it continues from.
	applied []appliedSeq
}

// appliedSeq is a rank's last applied message.
type appliedSeq struct {
	RankSeq
	ok bool
}

// newPipeline builds the pipeline of cfg, whose family is fam, writing into apply.
func newPipeline(cfg Config, fam engines.Family, apply func(Update)) *pipeline {
	p := &pipeline{
		cfg:  cfg,
		lab:  labels{m: cfg.Metrics, rule: cfg.Rule, endpoint: cfg.Endpoint},
		seed: maphash.MakeSeed(),
	}
	p.applied = make([]appliedSeq, max(len(cfg.Publish), 1))
	p.b = &binder{p: p, apply: apply, maxMapped: cfg.MaxMapped, groups: map[int]bool{}, km: engines.NewKeyMap(),
		side: cfg.Groups, specs: map[int]kvgroups.Spec{}, sideKMs: map[int]*engines.KeyMap{},
		tiers: cfg.Tiers, tierKMs: map[engines.Tier]*engines.KeyMap{}}
	if cfg.Binding == BindingRouter {
		p.b.router = fam.RouterBinder(cfg.BlockSize)
		p.b.tierExtras = fam.KeyRules().BlockExtras
	}
	if fam.EventResidency(cfg.Release) == contracts.ResidencyPresence {
		p.b.pres = &presence{ranks: map[int]map[uint64]uint64{}}
	}
	return p
}

func (p *pipeline) trace(t Trace) {
	if p.cfg.Trace != nil {
		if t.Wall.IsZero() {
			t.Wall = time.Now()
		}
		p.cfg.Trace(t)
	}
}

// clear empties the endpoint (all ranks) for cause.
func (p *pipeline) clear(rank int, cause string) {
	p.mu.Lock()
	p.b.clear(rank, cause)
	p.mu.Unlock()
	p.trace(Trace{Type: "clear", Rank: rank, Reason: cause})
}

// cleared counts and logs a clear the binder made.
func (p *pipeline) cleared(cause string) {
	p.lab.clear(cause)
	p.cfg.Logger.Info("ingest: endpoint inventory cleared", "endpoint", p.cfg.Endpoint, "cause", cause)
}

// skip counts and traces n events or blocks not indexed.
func (p *pipeline) skip(rank int, reason string, n int) {
	if n <= 0 {
		return
	}
	p.lab.skip(rank, reason, n)
	p.trace(Trace{Type: "skip", Rank: rank, Reason: reason, Count: n})
}

// reject counts and traces a payload refused whole.
func (p *pipeline) reject(rank int, seq uint64, hasSeq bool, err error) {
	reason := string(engines.ReasonDecodeError)
	var de *engines.DecodeError
	if errors.As(err, &de) {
		reason = string(de.Reason)
	}
	p.lab.reject(rank, reason)
	p.trace(Trace{Type: "reject", Rank: rank, Seq: seq, HasSeq: hasSeq, Reason: reason, Detail: err.Error()})
	p.cfg.Logger.Warn("ingest: payload rejected", "endpoint", p.cfg.Endpoint, "rank", rank, "seq", seq,
		"reason", reason, "err", err)
}

// batch binds one decoded batch of rank; digest is the xxh3 of its payload.
func (p *pipeline) batch(rank int, seq, digest uint64, b *engines.Batch) {
	now := time.Now()
	if b.Timestamp > 0 {
		p.lab.lag(rank, float64(now.UnixNano())/1e9-b.Timestamp)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if rank < len(p.applied) {
		p.applied[rank] = appliedSeq{RankSeq{Seq: seq, Digest: digest}, true}
	}
	for i := range b.Events {
		ev := &b.Events[i]
		p.trace(Trace{Type: "event", Rank: rank, Seq: seq, HasSeq: true, Event: ev, Wall: now,
			BatchTS: b.Timestamp, HasBatch: true})
		p.b.event(rank, ev)
	}
}

// event binds one event that came without a batch (a drain's), sequenced by its event id.
func (p *pipeline) event(rank int, ev *engines.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trace(Trace{Type: "event", Rank: rank, Seq: ev.EventID, HasSeq: true, Event: ev})
	p.b.event(rank, ev)
}
