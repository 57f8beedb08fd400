package ingest

import (
	"testing"
	"time"
)

func lbl(kv ...string) map[string]string {
	m := map[string]string{"rule": "r1", "endpoint": "ep0"}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func vllmCfg(p *goPub) Config {
	cfg := Config{Family: "vllm", Release: "v0.25.1", Publish: []string{p.pubAddr}}
	if p.replayAdr != "" {
		cfg.Replay = []string{p.replayAdr}
	}
	return cfg
}

func TestZMQContiguous(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, false)
	h := startSource(t, vllmCfg(p))
	p.waitSub()
	want := map[uint64]int{}
	for s := uint64(0); s < 10; s++ {
		p.publish(s, stored(t, 0, 1000+2*s, 1001+2*s))
		want[1000+2*s], want[1001+2*s] = 1, 1
	}
	p.publish(10, removed(t, 0, 1000))
	delete(want, 1000)
	h.waitKeys(want)
	if g := h.metric("kvexact_ingest_gaps_total", lbl()); g != 0 {
		t.Errorf("gaps: %v, want 0", g)
	}
	if n := h.metric("kvexact_ingest_events_applied_total", lbl("rank", "0", "kind", "BlockStored")); n != 10 {
		t.Errorf("applied BlockStored: %v, want 10", n)
	}
	if n := h.metric("kvexact_ingest_blocks", lbl()); n != 19 {
		t.Errorf("blocks gauge: %v, want 19", n)
	}
	if n := h.metric("kvexact_ingest_event_lag_seconds", lbl("rank", "0")); n != 11 {
		t.Errorf("lag samples: %v, want 11", n)
	}
}

func TestZMQSmallGapKept(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, false)
	h := startSource(t, vllmCfg(p))
	p.waitSub()
	p.publish(0, stored(t, 0, 1, 2))
	for s := uint64(1); s <= Window; s++ { // exactly Window missing: still kept
		p.drop(s, stored(t, 0, 100+s))
	}
	p.publish(Window+1, stored(t, 0, 3))
	h.waitKeys(map[uint64]int{1: 1, 2: 1, 3: 1})
	if g := h.metric("kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "kept")); g != 1 {
		t.Errorf("gaps kept: %v, want 1\n%s", g, h.traceLog())
	}
	if c := h.metric("kvexact_ingest_clears_total", lbl("cause", "gap")); c != 0 {
		t.Errorf("gap clears: %v, want 0", c)
	}
}

// TestZMQGapReplayed: with a replay socket, a gap is filled from the publisher's buffer before the
// message after it is applied: the lost messages' stores arrive and the eviction among them removes
// its key (kept without replay, it would stay as a stale block), and no gap is counted as kept.
func TestZMQGapReplayed(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, true)
	cfg := vllmCfg(p)
	cfg.ReplayGaps = true
	h := startSource(t, cfg)
	p.waitSub()
	eventually(t, 5*time.Second, "the first replay", func() bool {
		return h.metric("kvexact_ingest_replays_total", lbl("rank", "0", "outcome", "completed")) == 1
	})
	p.publish(0, stored(t, 0, 1, 2))
	h.waitKeys(map[uint64]int{1: 1, 2: 1})
	p.drop(1, stored(t, 0, 7))
	p.drop(2, removed(t, 0, 2))
	p.publish(3, stored(t, 0, 3))
	h.waitKeys(map[uint64]int{1: 1, 3: 1, 7: 1})
	if g := h.metric("kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "kept")); g != 0 {
		t.Errorf("gaps kept: %v, want 0 (the gap was replayed)\n%s", g, h.traceLog())
	}
	if g := h.metric("kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "replayed")); g != 1 {
		t.Errorf("gaps replayed: %v, want 1\n%s", g, h.traceLog())
	}
	if c := h.metric("kvexact_ingest_replays_total", lbl("rank", "0", "outcome", "completed")); c != 2 {
		t.Errorf("replays completed: %v, want 2\n%s", c, h.traceLog())
	}
}

// TestZMQUnreplayedGapClears: with ClearUnreplayed (the gateway's setting) and no replay socket,
// even one lost message clears the endpoint: the lost message's eviction (key 2) would otherwise
// stay in the mirror as a stale key. The mirror restarts from the message after the gap.
func TestZMQUnreplayedGapClears(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, false)
	cfg := vllmCfg(p)
	cfg.ClearUnreplayed = true
	h := startSource(t, cfg)
	p.waitSub()
	p.publish(0, stored(t, 0, 1, 2))
	h.waitKeys(map[uint64]int{1: 1, 2: 1})
	p.drop(1, removed(t, 0, 2))
	p.publish(2, stored(t, 0, 3))
	h.waitKeys(map[uint64]int{3: 1})
	if g := h.metric("kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "cleared")); g != 1 {
		t.Errorf("gaps cleared: %v, want 1\n%s", g, h.traceLog())
	}
	if g := h.metric("kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "kept")); g != 0 {
		t.Errorf("gaps kept: %v, want 0\n%s", g, h.traceLog())
	}
	if c := h.metric("kvexact_ingest_clears_total", lbl("cause", "gap")); c != 1 {
		t.Errorf("gap clears: %v, want 1", c)
	}
	// The next message in sequence applies on the rebuilt mirror.
	p.publish(3, stored(t, 0, 4))
	h.waitKeys(map[uint64]int{3: 1, 4: 1})
}

// TestZMQReconnectWithoutReplayClears: with ClearUnreplayed and no replay socket, a reconnect
// clears at once: the publisher restarted and wiped its cache (or lost messages) while the
// subscription was down, and the gateway cannot tell until the next message, which may be far off.
func TestZMQReconnectWithoutReplayClears(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, false)
	cfg := vllmCfg(p)
	cfg.ClearUnreplayed = true
	h := startSource(t, cfg)
	p.waitSub()
	p.publish(0, stored(t, 0, 1, 2))
	h.waitKeys(map[uint64]int{1: 1, 2: 1})
	p.restart() // nothing is published after it
	h.waitKeys(map[uint64]int{})
	if c := h.metric("kvexact_ingest_clears_total", lbl("cause", "reconnect")); c != 1 {
		t.Errorf("reconnect clears: %v, want 1\n%s", c, h.traceLog())
	}
	p.waitSub()
	p.publish(0, stored(t, 0, 5))
	h.waitKeys(map[uint64]int{5: 1})
}

func TestZMQLargeGapCleared(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, false)
	h := startSource(t, vllmCfg(p))
	p.waitSub()
	p.publish(0, stored(t, 0, 1, 2))
	h.waitKeys(map[uint64]int{1: 1, 2: 1})
	p.publish(Window+2, stored(t, 0, 3)) // Window+1 missing
	h.waitKeys(map[uint64]int{3: 1})
	if g := h.metric("kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "cleared")); g != 1 {
		t.Errorf("gaps cleared: %v, want 1", g)
	}
	if c := h.metric("kvexact_ingest_clears_total", lbl("cause", "gap")); c != 1 {
		t.Errorf("gap clears: %v, want 1", c)
	}
}

func TestZMQRegressionCleared(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, false)
	h := startSource(t, vllmCfg(p))
	p.waitSub()
	for s := uint64(0); s < 100; s++ {
		p.publish(s, stored(t, 0, 1000+s))
	}
	eventually(t, 5*time.Second, "100 batches applied", func() bool { return len(h.keys()) == 100 })
	// Seq 3 is far behind the window's memory: an engine restart behind a transparent reconnect.
	p.publish(3, stored(t, 0, 7))
	h.waitKeys(map[uint64]int{7: 1})
	// Seq 4 follows; then a reused sequence (4 again) with a different payload is a restart too.
	p.publish(4, stored(t, 0, 8))
	h.waitKeys(map[uint64]int{7: 1, 8: 1})
	p.publish(4, stored(t, 0, 9))
	h.waitKeys(map[uint64]int{9: 1})
	if c := h.metric("kvexact_ingest_clears_total", lbl("cause", "regression")); c != 1 {
		t.Errorf("regression clears: %v, want 1\n%s", c, h.traceLog())
	}
	if c := h.metric("kvexact_ingest_clears_total", lbl("cause", "restart")); c != 1 {
		t.Errorf("restart clears: %v, want 1", c)
	}
}

func TestZMQReplayOnConnectDeduplicated(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, true)
	// Published before anyone subscribed: only replay can deliver them.
	for s := uint64(0); s < 3; s++ {
		p.drop(s, stored(t, 0, 10+s))
	}
	gate := make(chan struct{})
	p.mu.Lock()
	p.gate = gate
	p.mu.Unlock()
	h := startSource(t, vllmCfg(p))
	p.waitSub()
	// The replay request is held while seq 3..5 go out live: the subscriber buffers them, then gets
	// 0..5 from replay; the live copies of 3..5 must be dropped as duplicates.
	for s := uint64(3); s < 6; s++ {
		p.publish(s, stored(t, 0, 10+s))
	}
	eventually(t, 5*time.Second, "replay requested", func() bool {
		return h.metric("kvexact_ingest_replays_total", lbl("rank", "0", "outcome", "requested")) == 1
	})
	close(gate)
	eventually(t, 5*time.Second, "replay completed", func() bool {
		return h.metric("kvexact_ingest_replays_total", lbl("rank", "0", "outcome", "completed")) == 1
	})
	p.publish(6, stored(t, 0, 16))
	h.waitKeys(map[uint64]int{10: 1, 11: 1, 12: 1, 13: 1, 14: 1, 15: 1, 16: 1})
	if n := h.countTraces("duplicate", "duplicate"); n != 3 {
		t.Errorf("duplicates dropped: %d, want 3\n%s", n, h.traceLog())
	}
	if c := h.metric("kvexact_ingest_replays_total", lbl("rank", "0", "outcome", "completed")); c != 1 {
		t.Errorf("replays completed: %v, want 1", c)
	}
	if g := h.metric("kvexact_ingest_gaps_total", lbl()); g != 0 {
		t.Errorf("gaps: %v, want 0", g)
	}
}

func TestZMQReconnectAfterPublisherRestart(t *testing.T) {
	for _, withReplay := range []bool{false, true} {
		name := "no_replay"
		if withReplay {
			name = "replay"
		}
		t.Run(name, func(t *testing.T) {
			checkNoLeak(t)
			p := newGoPub(t, withReplay)
			h := startSource(t, Config{Family: "vllm", Release: "v0.25.1", Publish: []string{p.pubAddr},
				Replay: replayList(p), DialBackoffMin: 20 * time.Millisecond})
			p.waitSub()
			for s := uint64(0); s < 4; s++ {
				p.publish(s, stored(t, 0, 100+s))
			}
			h.waitKeys(map[uint64]int{100: 1, 101: 1, 102: 1, 103: 1})

			p.restart() // sequence starts again at 0
			p.waitSub()
			eventually(t, 5*time.Second, "reconnected", func() bool {
				return h.metric("kvexact_ingest_reconnects_total", lbl("rank", "0")) == 1 &&
					h.metric("kvexact_ingest_connected", lbl("rank", "0")) == 1
			})
			p.publish(0, stored(t, 0, 200))
			p.publish(1, stored(t, 0, 201))
			h.waitKeys(map[uint64]int{200: 1, 201: 1})
			if c := h.metric("kvexact_ingest_clears_total", lbl("cause", "restart")); c != 1 {
				t.Errorf("restart clears: %v, want 1\n%s", c, h.traceLog())
			}
		})
	}
}

func replayList(p *goPub) []string {
	if p.replayAdr == "" {
		return nil
	}
	return []string{p.replayAdr}
}

func TestZMQRejectsAndRanks(t *testing.T) {
	checkNoLeak(t)
	p0 := newGoPub(t, false)
	p1 := newGoPub(t, false)
	h := startSource(t, Config{Family: "vllm", Release: "v0.25.1", Publish: []string{p0.pubAddr, p1.pubAddr}})
	p0.waitSub()
	p1.waitSub()
	p0.publish(0, stored(t, 0, 1, 2))
	p1.publish(0, stored(t, 1, 2, 3)) // ranks union: key 2 held twice
	h.waitKeys(map[uint64]int{1: 1, 2: 2, 3: 1})
	p0.publish(1, stored(t, 1, 9))          // rank 1's batch on rank 0's socket
	p0.publish(2, []byte{0x93, 0xcb, 0x41}) // truncated msgpack
	p0.publish(3, stored(t, 0, 4))          // the stream goes on
	h.waitKeys(map[uint64]int{1: 1, 2: 2, 3: 1, 4: 1})
	if n := h.metric("kvexact_ingest_rejects_total", lbl("rank", "0", "reason", "rank_mismatch")); n != 1 {
		t.Errorf("rank_mismatch rejects: %v, want 1", n)
	}
	if n := h.metric("kvexact_ingest_rejects_total", lbl("rank", "0", "reason", "decode_error")); n != 1 {
		t.Errorf("decode_error rejects: %v, want 1\n%s", n, h.traceLog())
	}
	// AllBlocksCleared from any rank clears the endpoint (both ranks together).
	p1.publish(1, cleared(t, 1))
	h.waitKeys(map[uint64]int{})
	p0.publish(4, stored(t, 0, 5))
	h.waitKeys(map[uint64]int{5: 1})
}

func TestZMQDialRetryBeforeEngineIsUp(t *testing.T) {
	checkNoLeak(t)
	addr := "tcp://127.0.0.1:" + itoa(freePort(t))
	h := startSource(t, Config{Family: "vllm", Publish: []string{addr}, DialBackoffMin: 20 * time.Millisecond})
	eventually(t, 5*time.Second, "dial failures traced", func() bool { return h.countTraces("error", "dial") >= 2 })
	p := &goPub{t: t, pubAddr: addr}
	p.start()
	t.Cleanup(p.stop)
	p.waitSub()
	p.publish(0, stored(t, 0, 42))
	h.waitKeys(map[uint64]int{42: 1})
}

// TestZMQReconnectToRestartedPublisherClears: with ClearUnreplayed and a replay socket, the
// publisher restarts (empty buffer, sequence from 0) while nothing is published after it: the
// reconnect's replay no longer holds the last message applied, so the endpoint is cleared at once
// (cause publisher_restart) rather than kept until the new publisher's first message.
func TestZMQReconnectToRestartedPublisherClears(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, true)
	cfg := vllmCfg(p)
	cfg.ReplayGaps, cfg.ClearUnreplayed = true, true
	h := startSource(t, cfg)
	p.waitSub()
	eventually(t, 5*time.Second, "the first replay", func() bool {
		return h.metric("kvexact_ingest_replays_total", lbl("rank", "0", "outcome", "completed")) == 1
	})
	p.publish(0, stored(t, 0, 1, 2))
	p.publish(1, stored(t, 0, 3))
	h.waitKeys(map[uint64]int{1: 1, 2: 1, 3: 1})
	p.restart()
	h.waitKeys(map[uint64]int{})
	if c := h.metric("kvexact_ingest_clears_total", lbl("cause", "publisher_restart")); c != 1 {
		t.Errorf("publisher_restart clears: %v, want 1\n%s", c, h.traceLog())
	}
	p.waitSub()
	p.publish(0, stored(t, 0, 5))
	h.waitKeys(map[uint64]int{5: 1})
}

// TestZMQReconnectToSamePublisherKeeps: the same reconnect to a publisher that did not restart
// replays the messages already applied (duplicates) and clears nothing.
func TestZMQReconnectToSamePublisherKeeps(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, true)
	cfg := vllmCfg(p)
	cfg.ReplayGaps, cfg.ClearUnreplayed = true, true
	h := startSource(t, cfg)
	p.waitSub()
	eventually(t, 5*time.Second, "the first replay", func() bool {
		return h.metric("kvexact_ingest_replays_total", lbl("rank", "0", "outcome", "completed")) == 1
	})
	p.publish(0, stored(t, 0, 1, 2))
	p.publish(1, stored(t, 0, 3))
	h.waitKeys(map[uint64]int{1: 1, 2: 1, 3: 1})
	p.bounce()
	eventually(t, 5*time.Second, "the reconnect's replay", func() bool {
		return h.metric("kvexact_ingest_replays_total", lbl("rank", "0", "outcome", "completed")) == 2
	})
	h.waitKeys(map[uint64]int{1: 1, 2: 1, 3: 1})
	if c := h.metric("kvexact_ingest_clears_total", lbl("cause", "publisher_restart")); c != 0 {
		t.Errorf("publisher_restart clears: %v, want 0\n%s", c, h.traceLog())
	}
}
