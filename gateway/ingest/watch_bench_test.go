package ingest

import (
	"context"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/watch"
)

// watchPayloads are like benchPayloads but with the keys a seed-0 sha256 vLLM engine publishes, so
// the live parity watch's checks match (the production case) rather than take the mismatch path.
func watchPayloads(b *testing.B, h *hashcore.Hasher, n, rounds int) [][]byte {
	var out [][]byte
	for r := range rounds {
		toks := make([]uint32, 16*n)
		for i := range toks {
			toks[i] = uint32(r*16*n+i) % 120000
		}
		keys, err := h.Keys(toks, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		st := engines.Event{Kind: engines.BlockStored, BlockHashes: keys, TokenIDs: toks, BlockSize: 16, Medium: "GPU",
			HasGroupIdx: true, SpecKind: "full_attention", HasExtraKeys: true, ExtraKeys: make([][]any, n)}
		rm := engines.Event{Kind: engines.BlockRemoved, BlockHashes: keys, Medium: "GPU", HasGroupIdx: true}
		for _, ev := range []engines.Event{st, rm} {
			p, err := vllm.EncodeBatch(engines.Batch{Timestamp: float64(time.Now().Unix()), Events: []engines.Event{ev}, HasDPRank: true}, vllm.LayoutMap)
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, p)
		}
	}
	return out
}

// benchIngestWatch is benchIngest with the gateway's live parity watch on the Trace hook, checking
// every event (sample 1), the default sampling (the first 64, then 1 in 16), or off (nil hook).
func benchIngestWatch(b *testing.B, blocks, sample int) {
	seed := "0"
	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.VLLMSHA256, BlockSize: 16, Seed: &seed}, hashcore.Default())
	if err != nil {
		b.Fatal(err)
	}
	payloads := watchPayloads(b, h, blocks, 32)
	idx := inventory.New(inventory.Config{})
	ep, _ := idx.AddEndpoint("ep")
	cfg := Config{Family: "vllm", Rule: "bench", Endpoint: "ep", Binding: BindingEngine, BlockSize: 16, Publish: []string{"tcp://127.0.0.1:1"}}
	checked := 0
	if sample > 0 {
		w, err := watch.New(watch.Config{Hasher: h, Family: "vllm", SampleEvery: sample})
		if err != nil {
			b.Fatal(err)
		}
		cfg.Trace = func(t Trace) {
			if t.Type == "event" && t.Event.Kind == engines.BlockStored {
				o := w.Event(t.Event)
				if o.Mismatch != nil {
					b.Fatalf("mismatch on generated keys: %v", o.Mismatch)
				}
				checked += o.Checked
			}
		}
	}
	cfg.defaults()
	decode, err := vllm.Family.EventDecoder("v0.25.1")
	if err != nil {
		b.Fatal(err)
	}
	rr := &rankRun{p: newPipeline(cfg, vllm.Family, Into(idx, ep, nil, "bench", "ep", nil)), dec: decoder{decode: decode}}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for i := 0; b.Loop(); i++ {
		rr.live(ctx, uint64(i), payloads[i%len(payloads)])
	}
	el, cpu := time.Since(start), cpuTime()-cpu0
	ops := float64(b.N) * float64(blocks)
	b.ReportMetric(ops/el.Seconds(), "blockops/s")
	b.ReportMetric(ops/cpu.Seconds(), "blockops/cpu-s")
	b.ReportMetric(float64(checked)/ops, "checked/blockop")
}

func BenchmarkIngestWatchOff16(b *testing.B)     { benchIngestWatch(b, 16, 0) }
func BenchmarkIngestWatchDefault16(b *testing.B) { benchIngestWatch(b, 16, watch.DefaultSampleEvery) }
func BenchmarkIngestWatchAll16(b *testing.B)     { benchIngestWatch(b, 16, 1) }
