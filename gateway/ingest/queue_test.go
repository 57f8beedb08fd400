package ingest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/internal/promtest"
)

// TestZMQQueueFullDropsAndCounts fills a rank's queue over real ZeroMQ sockets: with the pipeline
// stalled in its first store, the reader queues QueueLimit messages and drops the rest, counting
// each one; once the pipeline runs again the window sees the dropped messages as a gap (kept: fewer
// than Window) and the inventory holds exactly the blocks of the messages that were queued. The
// trace (ctk events tail) shows the run of drops: where it starts, and its total once it ends.
func TestZMQQueueFullDropsAndCounts(t *testing.T) {
	checkNoLeak(t)
	p := newGoPub(t, false)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	idx := inventory.New(inventory.Config{})
	ep, err := idx.AddEndpoint("ep0")
	if err != nil {
		t.Fatal(err)
	}
	into := Into(idx, ep, m, "r1", "ep0", nil)
	gate, stalled := make(chan struct{}), make(chan struct{})
	var stall, release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	apply := func(u Update) {
		if u.Op == OpStore {
			stall.Do(func() { close(stalled); <-gate })
		}
		into(u)
	}
	cfg := vllmCfg(p)
	cfg.Rule, cfg.Endpoint, cfg.Metrics, cfg.QueueLimit = "r1", "ep0", m, 4
	var traceMu sync.Mutex
	var drops []Trace
	cfg.Trace = func(tr Trace) {
		if tr.Type == "drop" {
			traceMu.Lock()
			drops = append(drops, tr)
			traceMu.Unlock()
		}
	}
	dropCounts := func() (out []int) {
		traceMu.Lock()
		defer traceMu.Unlock()
		for _, d := range drops {
			if d.Reason != "queue_full" || d.Rank != 0 || d.Detail == "" {
				t.Errorf("drop trace %+v", d)
			}
			out = append(out, d.Count)
		}
		return out
	}
	src, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, apply) }()
	t.Cleanup(func() {
		open()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of cancel")
		}
	})
	val := func(name string) float64 { return promtest.Value(t, reg, name, lbl("rank", "0")) }

	p.waitSub()
	p.publish(0, stored(t, 0, 1))
	select {
	case <-stalled:
	case <-time.After(5 * time.Second):
		t.Fatal("the first store never reached the inventory")
	}
	for s := uint64(1); s <= 10; s++ {
		p.publish(s, stored(t, 0, 100+s))
	}
	eventually(t, 5*time.Second, "6 messages dropped at the full queue", func() bool {
		return val("kvexact_ingest_queue_full_total") == 6
	})
	if d := val("kvexact_ingest_queue_depth"); d != 4 {
		t.Errorf("queue depth while stalled: %v, want 4 (the limit)", d)
	}
	if got := dropCounts(); !slices.Equal(got, []int{1}) {
		t.Errorf("drop traces while stalled: counts %v, want [1] (the run's start)", got)
	}
	open()
	// Publish the next message only once the pipeline has drained the queue: sent while the queue
	// is still full it would be dropped too (the rule under test), and the test would wait for it.
	eventually(t, 5*time.Second, "the stalled queue to drain", func() bool { return val("kvexact_ingest_queue_depth") == 0 })
	p.publish(11, stored(t, 0, 2))
	want := map[uint64]int{1: 1, 101: 1, 102: 1, 103: 1, 104: 1, 2: 1}
	var got map[uint64]int
	defer func() {
		if t.Failed() {
			t.Logf("inventory %v, want %v; gaps kept %v, cleared %v", got, want,
				promtest.Value(t, reg, "kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "kept")),
				promtest.Value(t, reg, "kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "cleared")))
		}
	}()
	eventually(t, 5*time.Second, "inventory holds the queued messages' blocks", func() bool {
		got = map[uint64]int{}
		for _, kc := range idx.Snapshot(ep) {
			got[kc.Key] = kc.Count
		}
		return equalCounts(got, want)
	})
	if g := promtest.Value(t, reg, "kvexact_ingest_gaps_total", lbl("rank", "0", "decision", "kept")); g != 1 {
		t.Errorf("gaps kept: %v, want 1 (the 6 dropped messages)", g)
	}
	if c := val("kvexact_ingest_queue_full_total"); c != 6 {
		t.Errorf("queue full: %v, want 6", c)
	}
	eventually(t, 5*time.Second, "queue drained", func() bool { return val("kvexact_ingest_queue_depth") == 0 })
	if got := dropCounts(); !slices.Equal(got, []int{1, 6}) {
		t.Errorf("drop traces: counts %v, want [1 6] (the run's start, then its total)", got)
	}
}
