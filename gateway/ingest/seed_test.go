package ingest

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/inventory"
)

// seedCase is one event configuration a snapshot must carry exactly.
type seedCase struct {
	name    string
	release string
	binding Binding
}

var seedCases = []seedCase{
	{"engine_copies", "v0.25.1", BindingEngine},
	{"router_copies", "v0.25.1", BindingRouter},
	{"engine_presence", "v0.26.0", BindingEngine},
}

func (c seedCase) cfg(p *goPub) Config {
	cfg := Config{Family: "vllm", Release: c.release, Binding: c.binding, Publish: []string{p.pubAddr},
		Replay: []string{p.replayAdr}, ReplayGaps: true, ReplayFirst: true, ClearUnreplayed: true,
		DialBackoffMin: 20 * time.Millisecond}
	if c.binding == BindingRouter {
		cfg.BlockSize = 4
	}
	return cfg
}

// batch encodes one batch of events for the case's release. Stored blocks chain from the one
// before in the same event and carry tokens derived from their id, so the router binding gives
// each block its own key.
func (c seedCase) batch(t testing.TB, store []uint64, remove []uint64) []byte {
	t.Helper()
	layout, err := vllm.LayoutForRelease(c.release)
	if err != nil {
		t.Fatal(err)
	}
	var evs []engines.Event
	if len(store) > 0 {
		toks := make([]uint32, 0, 4*len(store))
		for _, k := range store {
			toks = append(toks, uint32(k), uint32(k), uint32(k), uint32(k))
		}
		evs = append(evs, engines.Event{Kind: engines.BlockStored, BlockHashes: store, BlockSize: 4, Medium: "GPU",
			TokenIDs: toks, HasGroupIdx: true, SpecKind: "full_attention"})
	}
	if len(remove) > 0 {
		evs = append(evs, engines.Event{Kind: engines.BlockRemoved, BlockHashes: remove, Medium: "GPU", HasGroupIdx: true})
	}
	b, err := vllm.EncodeBatch(engines.Batch{Timestamp: float64(time.Now().UnixNano()) / 1e9, Events: evs,
		DPRank: 0, HasDPRank: true}, layout)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// peer runs the replica that serves the snapshot: seven messages (the last removes a block, and
// one re-stores a held one), then its snapshot at sequence 6 through the codec.
func (c seedCase) peer(t *testing.T) (*goPub, *harness, *Snapshot) {
	t.Helper()
	p := newGoPub(t, true)
	a := startSource(t, c.cfg(p))
	waitSynced(t, a)
	p.waitSub()
	for s := uint64(0); s < 6; s++ {
		p.publish(s, c.batch(t, []uint64{100 + s}, nil))
	}
	p.publish(6, c.batch(t, []uint64{102}, []uint64{100}))
	eventually(t, 5*time.Second, "peer applied sequence 6", func() bool {
		s, err := takeSnapshot(a)
		return err == nil && s.Ranks[0].Seq == 6
	})
	s, err := takeSnapshot(a)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := s.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSnapshot(buf.Bytes())
	if err != nil {
		t.Fatalf("decode own snapshot: %v", err)
	}
	if len(got.Keys) != 5 || got.Ranks[0].Seq != 6 {
		t.Fatalf("snapshot: %d keys at seq %d, want 5 at 6", len(got.Keys), got.Ranks[0].Seq)
	}
	return p, a, got
}

func takeSnapshot(h *harness) (*Snapshot, error) {
	return h.src.(Snapshotter).Snapshot(func(engines.Tier) []inventory.KeyCount { return h.idx.Aged(h.ep) })
}

func waitSynced(t *testing.T, h *harness) {
	t.Helper()
	eventually(t, 5*time.Second, "first replay completed", func() bool {
		return h.metric("kvexact_ingest_replays_total", lbl("rank", "0", "outcome", "completed")) >= 1
	})
}

func withSnapshot(cfg Config, s *Snapshot, err error) Config {
	cfg.Snapshot = func(context.Context) (*Snapshot, error) { return s, err }
	return cfg
}

// TestSnapshotAcceptedWhereTheStreamContinues: the engine's buffer no longer holds the first
// messages, so replay alone would miss their blocks; the snapshot, verified against the engine's
// message at its sequence, carries them, and later events (a re-store, removals) land on the
// snapshot's state exactly as on the peer's.
func TestSnapshotAcceptedWhereTheStreamContinues(t *testing.T) {
	for _, c := range seedCases {
		t.Run(c.name, func(t *testing.T) {
			checkNoLeak(t)
			p, a, snap := c.peer(t)
			p.keep(func(seq uint64) bool { return seq >= 4 })
			b := startSource(t, withSnapshot(c.cfg(p), snap, nil))
			waitSynced(t, b)
			if n := b.metric("kvexact_ingest_snapshots_total", lbl("outcome", SnapshotAccepted)); n != 1 {
				t.Fatalf("accepted snapshots: %v, want 1\n%s", n, b.traceLog())
			}
			p.publish(7, c.batch(t, []uint64{200}, []uint64{101}))
			p.publish(8, c.batch(t, nil, []uint64{104}))
			want := map[uint64]int{}
			eventually(t, 5*time.Second, "peer applied 8", func() bool {
				s, err := takeSnapshot(a)
				return err == nil && s.Ranks[0].Seq == 8
			})
			want = a.keys()
			b.waitKeys(want)
			if len(want) < 4 {
				t.Fatalf("peer holds %v: the scenario lost its blocks", fmtCounts(want))
			}
			if n := b.metric("kvexact_ingest_replays_total", lbl("rank", "0", "outcome", "truncated")); n != 0 {
				t.Errorf("truncated replays: %v, want 0 (the snapshot's rank starts at its sequence)", n)
			}

			// Without the snapshot the same engine gives a replica less: the snapshot mattered.
			plain := startSource(t, c.cfg(p))
			waitSynced(t, plain)
			if got := plain.keys(); equalCounts(got, want) {
				t.Errorf("a replica without the snapshot rebuilt %v too: the test cannot tell the snapshot was used", fmtCounts(got))
			}
		})
	}
}

// TestSnapshotRejected: every way the engine's stream fails to continue from the snapshot discards
// it whole; the replica then holds what a replica without a snapshot rebuilds from replay.
func TestSnapshotRejected(t *testing.T) {
	c := seedCases[0]
	for _, tc := range []struct {
		name    string
		outcome string
		engine  func(t *testing.T, p *goPub)         // what the engine does after the snapshot
		change  func(s *Snapshot) (*Snapshot, error) // what the fetch returns
	}{
		{name: "buffer_past_the_snapshot", outcome: SnapshotGap,
			engine: func(t *testing.T, p *goPub) {
				p.drop(7, c.batch(t, []uint64{300}, nil))
				p.drop(8, c.batch(t, []uint64{301}, nil))
				p.keep(func(seq uint64) bool { return seq > 6 })
			}},
		{name: "message_after_the_snapshot_missing", outcome: SnapshotGap,
			engine: func(t *testing.T, p *goPub) { p.drop(8, c.batch(t, []uint64{300}, nil)) }},
		{name: "engine_restarted_behind", outcome: SnapshotStale,
			engine: func(t *testing.T, p *goPub) {
				p.restart()
				for s := uint64(0); s < 3; s++ {
					p.drop(s, c.batch(t, []uint64{400 + s}, nil))
				}
			}},
		{name: "other_publisher_same_sequence", outcome: SnapshotPublisher,
			engine: func(t *testing.T, p *goPub) {
				p.restart()
				for s := uint64(0); s < 9; s++ {
					p.drop(s, c.batch(t, []uint64{500 + s}, nil))
				}
			}},
		{name: "other_endpoint", outcome: SnapshotMismatch,
			change: func(s *Snapshot) (*Snapshot, error) { s.Endpoint = "ep9"; return s, nil }},
		{name: "other_release", outcome: SnapshotMismatch,
			change: func(s *Snapshot) (*Snapshot, error) { s.Release = "v0.26.0"; return s, nil }},
		{name: "fetch_failed", outcome: SnapshotUnavailable,
			change: func(s *Snapshot) (*Snapshot, error) {
				var buf bytes.Buffer
				_ = s.Encode(&buf)
				return DecodeSnapshot(buf.Bytes()[:buf.Len()-3])
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkNoLeak(t)
			p, _, snap := c.peer(t)
			if tc.engine != nil {
				tc.engine(t, p)
			}
			var err error
			if tc.change != nil {
				snap, err = tc.change(snap)
			}
			b := startSource(t, withSnapshot(c.cfg(p), snap, err))
			waitSynced(t, b)
			if n := b.metric("kvexact_ingest_snapshots_total", lbl("outcome", tc.outcome)); n != 1 {
				t.Fatalf("snapshots with outcome %s: %v, want 1\n%s", tc.outcome, n, b.traceLog())
			}
			plain := startSource(t, c.cfg(p))
			waitSynced(t, plain)
			b.waitKeys(plain.keys())
		})
	}
}

// TestSnapshotNeverSynchronizesAlone: a verified snapshot is loaded, but the rank reports its
// replay completed (what makes the gateway's endpoint synchronized) only once its own replay after
// connecting has answered.
func TestSnapshotNeverSynchronizesAlone(t *testing.T) {
	checkNoLeak(t)
	c := seedCases[0]
	p, a, snap := c.peer(t)
	gate := make(chan struct{})
	p.mu.Lock()
	p.gate, p.gateFrom = gate, p.served+1 // the verification is answered, the rank's replay waits
	p.mu.Unlock()
	b := startSource(t, withSnapshot(c.cfg(p), snap, nil))
	b.waitKeys(a.keys())
	time.Sleep(200 * time.Millisecond)
	if n := b.countTraces("replay", "completed"); n != 0 {
		t.Fatalf("replay completed %d times while the engine's replay was held\n%s", n, b.traceLog())
	}
	close(gate)
	waitSynced(t, b)
	b.waitKeys(a.keys())
}

// TestSnapshotRefusedWhereStateIsNotCarried: a data-parallel endpoint offers none.
func TestSnapshotRefusedWhereStateIsNotCarried(t *testing.T) {
	checkNoLeak(t)
	p0, p1 := newGoPub(t, true), newGoPub(t, true)
	h := startSource(t, Config{Family: "vllm", Release: "v0.25.1", Publish: []string{p0.pubAddr, p1.pubAddr},
		Replay: []string{p0.replayAdr, p1.replayAdr}})
	var err error
	eventually(t, 5*time.Second, "the source runs and refuses", func() bool {
		_, err = takeSnapshot(h)
		return errors.Is(err, ErrNoSnapshot) && strings.Contains(err.Error(), "data-parallel")
	})
}
