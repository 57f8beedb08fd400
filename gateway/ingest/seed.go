package ingest

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"

	"github.com/go-zeromq/zmq4"
	"github.com/zeebo/xxh3"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/kvgroups"
)

// A replica starting may seed an endpoint from a peer replica's snapshot instead of rebuilding it
// from replay (a speed-up where the engine's replay buffer holds far more than a snapshot's
// transfer costs, or no longer holds the start of the inventory). The snapshot is accepted only
// where the engine itself shows that its stream continues from it: for every rank, the engine's
// replay from the snapshot's sequence L must return the message L with the snapshot's payload
// digest (the same publisher, the same epoch), then L+1 or nothing (no gap). Then the inventory
// is loaded, each rank's window starts at L, and the rank's ordinary connect-and-replay applies
// what follows L. Anything else discards the snapshot whole and the endpoint is rebuilt from
// replay as without one. A rank is synchronized only by its own completed replay after that, so a
// snapshot alone never makes a replica ready.

// Snapshot outcomes (kvexact_ingest_snapshots_total{outcome}, Trace.Reason of "snapshot").
const (
	SnapshotAccepted    = "accepted"
	SnapshotUnavailable = "unavailable" // not fetched (peer down, refused, over a limit, corrupt)
	SnapshotMismatch    = "mismatch"    // another rule, endpoint, engine release, binding or rank count
	SnapshotUnverified  = "unverified"  // the engine's replay did not answer
	SnapshotGap         = "gap"         // the engine's buffer no longer holds L, or skips after it
	SnapshotStale       = "stale"       // the engine has published nothing at or past L: a former epoch
	SnapshotPublisher   = "publisher"   // the engine's message L differs: another publisher or epoch
)

// ErrNoSnapshot is why an endpoint offers no snapshot: the source is not running, a rank has
// applied nothing yet, or the endpoint's state has parts the snapshot does not carry.
var ErrNoSnapshot = errors.New("ingest: no snapshot")

// Snapshotter is a source that can snapshot its endpoint (the ZeroMQ source).
type Snapshotter interface {
	// Snapshot returns the endpoint's state at one instant. read returns the endpoint's keys in a
	// tier's inventory (the GPU's, and each lower tier's where Config.Tiers), oldest first
	// (inventory.Index.Aged); it runs while no update is applied, so keys and sequences agree.
	Snapshot(read func(engines.Tier) []inventory.KeyCount) (*Snapshot, error)
}

// Snapshot implements Snapshotter.
func (z *zmqSource) Snapshot(read func(engines.Tier) []inventory.KeyCount) (*Snapshot, error) {
	p := z.p.Load()
	if p == nil {
		return nil, fmt.Errorf("%w: the endpoint's event source is not running", ErrNoSnapshot)
	}
	return p.snapshot(read)
}

func (p *pipeline) snapshot(read func(engines.Tier) []inventory.KeyCount) (*Snapshot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.cfg.Publish); n != 1 {
		// The gateway's per-rank index of a data-parallel endpoint is fed by the same updates;
		// the inventory's keys alone cannot say which rank holds them.
		return nil, fmt.Errorf("%w: data-parallel endpoint (%d ranks): its per-rank state is not in a snapshot", ErrNoSnapshot, n)
	}
	for g, s := range p.b.specs {
		if s.Kind != kvgroups.KindFull && s.Kind != kvgroups.KindNone {
			return nil, fmt.Errorf("%w: KV-cache group %d (%s) is scored by the group residency, which a snapshot does not carry", ErrNoSnapshot, g, s.Kind)
		}
	}
	s := &Snapshot{Rule: p.cfg.Rule, Endpoint: p.cfg.Endpoint, Family: p.cfg.Family, Release: p.cfg.Release,
		Binding: p.cfg.Binding, BlockSize: p.cfg.BlockSize}
	for r, a := range p.applied {
		if !a.ok {
			return nil, fmt.Errorf("%w: rank %d has applied no message yet", ErrNoSnapshot, r)
		}
		s.Ranks = append(s.Ranks, a.RankSeq)
	}
	for g, ix := range p.b.groups {
		s.Groups = append(s.Groups, GroupIndexed{Group: g, Indexed: ix})
	}
	s.Keys = snapshotKeys(read(engines.TierGPU))
	if p.b.pres != nil {
		for k, g := range p.b.pres.ranks[0] {
			s.Presence = append(s.Presence, PresenceKey{Key: k, Groups: g})
		}
	}
	if p.b.router != nil {
		p.b.km.Rank(0).Each(func(id uint64, e engines.MappedKey) {
			s.Mapped = append(s.Mapped, MappedEntry{EngineID: id, Key: e.Key, Refs: e.Refs, GPU: e.GPU})
		}, func(id uint64) { s.Suppressed = append(s.Suppressed, id) })
	}
	for _, t := range engines.LowerTiers {
		if !p.b.tiers {
			break
		}
		ts := TierSnapshot{Tier: t, Keys: snapshotKeys(read(t))}
		if km := p.b.tierKMs[t]; km != nil {
			km.Rank(0).Each(func(id uint64, e engines.MappedKey) {
				ts.Mapped = append(ts.Mapped, MappedEntry{EngineID: id, Key: e.Key, Refs: e.Refs, GPU: e.GPU})
			}, func(id uint64) { ts.Suppressed = append(ts.Suppressed, id) })
		}
		s.Tiers = append(s.Tiers, ts)
	}
	return s, nil
}

// snapshotKeys are an inventory's keys, oldest first, as snapshot keys with their ages.
func snapshotKeys(aged []inventory.KeyCount) []SnapshotKey {
	keys := make([]SnapshotKey, len(aged))
	for i, kc := range aged {
		keys[i] = SnapshotKey{Key: kc.Key, Count: uint32(kc.Count), Age: uint32(i)}
	}
	return keys
}

// seed asks fetch for a snapshot and loads it into p when every rank's engine continues from it.
func seed(ctx context.Context, p *pipeline, rrs []*rankRun, fetch func(context.Context) (*Snapshot, error)) {
	s, err := fetch(ctx)
	if err != nil {
		p.snapshotOutcome(SnapshotUnavailable, err.Error())
		return
	}
	if why := p.mismatch(s, rrs); why != "" {
		p.snapshotOutcome(SnapshotMismatch, why)
		return
	}
	payloads := make([][]byte, len(rrs))
	for i, rr := range rrs {
		pl, outcome, why := rr.verify(ctx, s.Ranks[i])
		if outcome != "" {
			p.snapshotOutcome(outcome, fmt.Sprintf("rank %d: %s", i, why))
			return
		}
		payloads[i] = pl
	}
	p.load(s)
	for i, rr := range rrs {
		rr.w.Accept(s.Ranks[i].Seq, maphash.Bytes(p.seed, payloads[i]), false)
		rr.seeded = true
	}
	p.snapshotOutcome(SnapshotAccepted, fmt.Sprintf("%d keys, rank 0 from sequence %d", len(s.Keys), s.Ranks[0].Seq))
}

func (p *pipeline) snapshotOutcome(outcome, detail string) {
	p.lab.snapshot(outcome)
	p.trace(Trace{Type: "snapshot", Reason: outcome, Detail: detail})
	if outcome == SnapshotAccepted {
		p.cfg.Logger.Info("ingest: peer snapshot accepted", "endpoint", p.cfg.Endpoint, "detail", detail)
		return
	}
	p.cfg.Logger.Warn("ingest: peer snapshot not used, rebuilding from replay", "endpoint", p.cfg.Endpoint,
		"outcome", outcome, "detail", detail)
}

// mismatch says why s does not describe this endpoint's stream ("" when it does).
func (p *pipeline) mismatch(s *Snapshot, rrs []*rankRun) string {
	c := &p.cfg
	switch {
	case s.Rule != c.Rule || s.Endpoint != c.Endpoint:
		return fmt.Sprintf("snapshot of %s/%s, want %s/%s", s.Rule, s.Endpoint, c.Rule, c.Endpoint)
	case s.Family != c.Family || s.Release != c.Release:
		return fmt.Sprintf("snapshot of %s %s, want %s %s", s.Family, s.Release, c.Family, c.Release)
	case s.Binding != c.Binding || s.BlockSize != c.BlockSize:
		return fmt.Sprintf("snapshot under binding %q block size %d, want %q %d", s.Binding, s.BlockSize, c.Binding, c.BlockSize)
	case len(s.Ranks) != len(rrs) || len(rrs) != 1:
		return fmt.Sprintf("snapshot of %d ranks for %d (only single-rank endpoints are seeded)", len(s.Ranks), len(rrs))
	case (p.b.pres == nil) != (len(s.Presence) == 0) && len(s.Keys) > 0:
		return "the snapshot's presence state does not match the release's residency rule"
	case p.b.router == nil && (len(s.Mapped) > 0 || len(s.Suppressed) > 0):
		return "router-binding state in a snapshot for the engine binding"
	case p.b.tiers != (len(s.Tiers) > 0):
		return fmt.Sprintf("the snapshot carries %d lower tiers, the rule indexes lower tiers: %v", len(s.Tiers), p.b.tiers)
	}
	for _, t := range s.Tiers {
		if p.b.router == nil && (len(t.Mapped) > 0 || len(t.Suppressed) > 0) {
			return fmt.Sprintf("router-binding state of the %s tier in a snapshot for the engine binding", t.Tier)
		}
	}
	for i, rr := range rrs {
		if rr.replay == "" {
			return fmt.Sprintf("rank %d has no replay address to verify the snapshot against", i)
		}
	}
	return ""
}

// verify asks the rank's replay socket for the messages from want.Seq and reads the first two: the
// first must be want.Seq with want.Digest, the second (if any) want.Seq+1. It returns the payload of
// want.Seq, or the outcome that discards the snapshot and why.
func (rr *rankRun) verify(ctx context.Context, want RankSeq) (payload []byte, outcome, why string) {
	cfg := &rr.p.cfg
	rctx, cancel := context.WithTimeout(ctx, cfg.ReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(cfg.ReplayTimeout),
		zmq4.WithLogger(quietLogger), zmq4.WithMaxMessageSize(cfg.MaxMessageBytes))
	defer drainClosed(d)
	if err := d.Dial(rr.replay); err != nil {
		return nil, SnapshotUnverified, fmt.Sprintf("replay dial %s: %v", rr.replay, err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(engines.ReplayRequest(want.Seq)...)); err != nil {
		return nil, SnapshotUnverified, fmt.Sprintf("replay request to %s: %v", rr.replay, err)
	}
	for n := 0; ; {
		msg, err := d.Recv()
		if err != nil {
			return nil, SnapshotUnverified, fmt.Sprintf("replay from %s: %v", rr.replay, err)
		}
		seq, pl, end, err := engines.ParseReplayReply(msg.Frames)
		if err != nil {
			return nil, SnapshotUnverified, fmt.Sprintf("replay from %s: %v", rr.replay, err)
		}
		switch {
		case n == 0 && end:
			return nil, SnapshotStale, fmt.Sprintf("the engine has published nothing at or past sequence %d (it restarted since)", want.Seq)
		case n == 0 && seq > want.Seq:
			return nil, SnapshotGap, fmt.Sprintf("the engine's replay starts at %d, past the snapshot's %d: what came between is unknown", seq, want.Seq)
		case n == 0 && seq < want.Seq:
			continue // not what was asked for; the next reply decides
		case n == 0 && xxh3.Hash(pl) != want.Digest:
			return nil, SnapshotPublisher, fmt.Sprintf("the engine's message %d is not the one the snapshot applied (another publisher or epoch)", seq)
		case n == 0:
			payload = append([]byte(nil), pl...)
			n++
		case end || seq == want.Seq+1:
			return payload, "", ""
		default:
			return nil, SnapshotGap, fmt.Sprintf("the engine's replay goes from %d to %d", want.Seq, seq)
		}
	}
}

// load puts s into the pipeline's state (the endpoint was just cleared): the binder's groups, the
// presence rule's and the router binding's state, and each tier's keys, which pass to apply
// directly (they are the result of the rules already), oldest first, so the capacity cap retires
// them in the peer's order.
func (p *pipeline) load(s *Snapshot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range s.Groups {
		p.b.groups[g.Group] = g.Indexed
	}
	if p.b.pres != nil && len(s.Presence) > 0 {
		held := make(map[uint64]uint64, len(s.Presence))
		for _, k := range s.Presence {
			held[k.Key] = k.Groups
		}
		p.b.pres.ranks[0] = held
		p.b.pres.n = len(held)
	}
	if p.b.router != nil {
		rk := p.b.km.Rank(0)
		for _, m := range s.Mapped {
			rk.Load(m.EngineID, engines.MappedKey{Key: m.Key, Refs: m.Refs, GPU: m.GPU})
		}
		for _, id := range s.Suppressed {
			rk.Suppress(id)
		}
	}
	p.loadKeys(engines.TierGPU, s.Keys)
	for _, t := range s.Tiers {
		if p.b.router != nil {
			km := engines.NewKeyMap()
			p.b.tierKMs[t.Tier] = km
			rk := km.Rank(0)
			for _, m := range t.Mapped {
				rk.Load(m.EngineID, engines.MappedKey{Key: m.Key, Refs: m.Refs, GPU: m.GPU})
			}
			for _, id := range t.Suppressed {
				rk.Suppress(id)
			}
		}
		p.loadKeys(t.Tier, t.Keys)
	}
	for r := range s.Ranks {
		p.applied[r] = appliedSeq{s.Ranks[r], true}
	}
}

// loadKeys stores a tier's snapshot keys, oldest first, each as often as its count.
func (p *pipeline) loadKeys(tier engines.Tier, snap []SnapshotKey) {
	byAge := make([]uint32, len(snap)) // age → index in snap (the decoder checked the ages)
	for i, k := range snap {
		byAge[k.Age] = uint32(i)
	}
	const chunk = 4096
	keys := make([]uint64, 0, chunk)
	flush := func() {
		if len(keys) > 0 {
			p.b.apply(Update{Rank: 0, Op: OpStore, Keys: keys, Tier: tier})
			keys = keys[:0]
		}
	}
	for _, i := range byAge {
		k := snap[i]
		for range k.Count {
			if keys = append(keys, k.Key); len(keys) == chunk {
				flush()
			}
		}
	}
	flush()
}
