package ingest

import (
	"bytes"
	"context"
	"flag"
	"runtime"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/inventory"
)

const debugSeedBench = false

var seedBenchKeys = flag.Int("seed-bench-keys", 1_000_000, "resident keys of BenchmarkStartToSynchronized's endpoint (10000000 for the documented figure)")

// runUntilSynchronized starts a source over cfg into a fresh inventory and returns how long it
// took until its rank's replay completed with want keys resident, then stops it.
func runUntilSynchronized(b *testing.B, cfg Config, want int, seeded bool) time.Duration {
	b.Helper()
	idx := inventory.New(inventory.Config{})
	ep, err := idx.AddEndpoint("ep0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{}, 1)
	accepted := false
	t0 := time.Now()
	cfg.Trace = func(t Trace) {
		if debugSeedBench {
			println(time.Since(t0).String(), t.Type, t.Reason)
		}
		if t.Type == "snapshot" {
			accepted = t.Reason == SnapshotAccepted
		}
		if t.Type == "replay" && t.Reason == "completed" {
			select {
			case done <- struct{}{}:
			default:
			}
		}
	}
	start := time.Now()
	src, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { src.Run(ctx, Into(idx, ep, nil, cfg.Rule, cfg.Endpoint, nil)); close(ran) }()
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatal("no replay completed within 10 minutes")
	}
	took := time.Since(start)
	if n := idx.Resident(ep); n != want {
		b.Fatalf("seeded %v: %d keys resident when synchronized, want %d", seeded, n, want)
	}
	cancel()
	<-ran
	if accepted != seeded {
		b.Fatalf("snapshot accepted: %v, want %v", accepted, seeded)
	}
	return took
}

// BenchmarkStartToSynchronized times a replica's start until its endpoint is synchronized, with
// the engine's replay buffer holding the whole inventory (batches of 1,000 stored blocks; 10,000
// batches, vLLM's default buffer_steps, hold 10M keys): rebuilt from replay from 0, against seeded
// from a peer's snapshot (taken, encoded, decoded, verified, loaded, then the replay from L-63),
// alternated in each round. The snapshot's transfer between hosts is not in the figure.
func BenchmarkStartToSynchronized(b *testing.B) {
	const perBatch = 1000
	total := *seedBenchKeys
	p := newGoPub(b, true)
	c := seedCases[0]
	batch := make([]uint64, perBatch)
	n := 0
	for s := uint64(0); n < total; s++ {
		k := min(perBatch, total-n)
		for i := range k {
			batch[i] = uint64(n + i + 1)
		}
		p.drop(s, c.batch(b, batch[:k], nil))
		n += k
	}
	cfg := Config{Rule: "r1", Endpoint: "ep0", Family: "vllm", Release: c.release, Publish: []string{p.pubAddr},
		Replay: []string{p.replayAdr}, ReplayGaps: true, ReplayFirst: true, ClearUnreplayed: true,
		ReplayTimeout: 10 * time.Minute, QueueLimit: 20_000}
	// The peer: a replica that rebuilt from replay, kept running to serve its snapshot.
	peerIdx := inventory.New(inventory.Config{})
	peerEP, _ := peerIdx.AddEndpoint("ep0")
	synced := make(chan struct{}, 1)
	pcfg := cfg
	pcfg.Trace = func(t Trace) {
		if t.Type == "replay" && t.Reason == "completed" {
			select {
			case synced <- struct{}{}:
			default:
			}
		}
	}
	psrc, err := New(pcfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go psrc.Run(ctx, Into(peerIdx, peerEP, nil, "r1", "ep0", nil))
	<-synced
	var hold time.Duration // the peer's pipeline lock held: its events wait meanwhile
	snap := func() ([]byte, error) {
		t0 := time.Now()
		s, err := psrc.(Snapshotter).Snapshot(func(engines.Tier) []inventory.KeyCount { return peerIdx.Aged(peerEP) })
		hold += time.Since(t0)
		if err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		err = s.Encode(&buf)
		return buf.Bytes(), err
	}
	var replayT, seedT time.Duration
	var size int
	b.ResetTimer()
	for i := range b.N {
		for v := range 2 {
			variant := (i + v) % 2 // alternate which goes first
			runtime.GC()
			if variant == 0 {
				replayT += runUntilSynchronized(b, cfg, total, false)
				continue
			}
			scfg := cfg
			scfg.Snapshot = func(context.Context) (*Snapshot, error) {
				data, err := snap()
				if err != nil {
					return nil, err
				}
				size = len(data)
				return DecodeSnapshot(data)
			}
			seedT += runUntilSynchronized(b, scfg, total, true)
		}
	}
	b.StopTimer()
	b.ReportMetric(replayT.Seconds()/float64(b.N), "replay-s/op")
	b.ReportMetric(seedT.Seconds()/float64(b.N), "snapshot-s/op")
	b.ReportMetric(float64(size), "snapshot-bytes")
	b.ReportMetric(hold.Seconds()/float64(b.N), "peer-hold-s/op")
	b.ReportMetric(0, "ns/op")
}
