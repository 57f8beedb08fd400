package ingest

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/kvgroups"
)

// benchPayloads makes pairs of vLLM v0.25 batches (map layout): one storing n blocks, one removing
// them, over `rounds` distinct key ranges, so the inventory stays bounded while every message
// changes it.
func benchPayloads(b *testing.B, n, rounds int) [][]byte {
	var out [][]byte
	for r := range rounds {
		keys := make([]uint64, n)
		for i := range keys {
			keys[i] = uint64(r*n+i)*0x9E3779B97F4A7C15 + 1
		}
		toks := make([]uint32, 16*n)
		for i := range toks {
			toks[i] = uint32(r*16*n + i)
		}
		st := engines.Event{Kind: engines.BlockStored, BlockHashes: keys, TokenIDs: toks, BlockSize: 16, Medium: "GPU",
			HasGroupIdx: true, SpecKind: "full_attention"}
		rm := engines.Event{Kind: engines.BlockRemoved, BlockHashes: keys, Medium: "GPU", HasGroupIdx: true}
		for _, ev := range []engines.Event{st, rm} {
			p, err := vllm.EncodeBatch(engines.Batch{Timestamp: float64(time.Now().Unix()), Events: []engines.Event{ev},
				HasDPRank: true}, vllm.LayoutMap)
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, p)
		}
	}
	return out
}

// benchIngest drives rankRun.live, the subscriber's own per-message path (digest, sequence window,
// decode, rank check, binding, inventory update, blocks gauge), minus the socket.
func benchIngest(b *testing.B, blocks int, binding Binding) {
	benchIngestGroups(b, blocks, binding, false)
}

// benchIngestGroups is benchIngest with group residency configured when groups is set (what the
// gateway runs for every endpoint since hybrid scoring; the stores are full attention's).
func benchIngestGroups(b *testing.B, blocks int, binding Binding, groups bool) {
	payloads := benchPayloads(b, blocks, 32)
	idx := inventory.New(inventory.Config{})
	ep, _ := idx.AddEndpoint("ep")
	cfg := Config{Family: "vllm", Rule: "bench", Endpoint: "ep", Binding: binding, BlockSize: 16,
		Publish: []string{"tcp://127.0.0.1:1"}}
	if groups {
		cfg.Groups = kvgroups.New(16).Endpoint(ep)
	}
	cfg.defaults()
	decode, err := vllm.Family.EventDecoder("v0.25.1")
	if err != nil {
		b.Fatal(err)
	}
	rr := &rankRun{p: newPipeline(cfg, vllm.Family, Into(idx, ep, nil, "bench", "ep", nil)), dec: decoder{decode: decode}}
	ctx := context.Background()
	b.SetBytes(int64(len(payloads[0])))
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), cpuTime()
	for i := 0; b.Loop(); i++ {
		rr.live(ctx, uint64(i), payloads[i%len(payloads)])
	}
	el, cpu := time.Since(start), cpuTime()-cpu0
	ops := float64(b.N) * float64(blocks)
	b.ReportMetric(ops/el.Seconds(), "blockops/s")
	// On a shared machine wall time includes waiting for a core; CPU time is what one core did.
	b.ReportMetric(ops/cpu.Seconds(), "blockops/cpu-s")
	if r := idx.Resident(ep); r > blocks {
		b.Fatalf("resident %d after balanced store/remove", r)
	}
}

func BenchmarkIngestVLLMEngine16(b *testing.B)  { benchIngest(b, 16, BindingEngine) }
func BenchmarkIngestVLLMEngine256(b *testing.B) { benchIngest(b, 256, BindingEngine) }
func BenchmarkIngestVLLMEngineGroups16(b *testing.B) {
	benchIngestGroups(b, 16, BindingEngine, true)
}
func BenchmarkIngestVLLMEngineGroups256(b *testing.B) {
	benchIngestGroups(b, 256, BindingEngine, true)
}
func BenchmarkIngestVLLMRouter16(b *testing.B)  { benchIngest(b, 16, BindingRouter) }
func BenchmarkIngestVLLMRouter256(b *testing.B) { benchIngest(b, 256, BindingRouter) }

// BenchmarkRouterMapBytesPerEntry measures the heap held by the engine-id → router-key map (the
// TensorRT-LLM translation map; the router binding's for vLLM and SGLang too) per entry, at 1M
// entries.
func BenchmarkRouterMapBytesPerEntry(b *testing.B) {
	const n = 1 << 20
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		km := engines.NewKeyMap()
		rk := km.Rank(0)
		for i := range uint64(n) {
			rk.Put(i*0x9E3779B97F4A7C15, i, true)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/entry")
		runtime.KeepAlive(km)
	}
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ExampleExpandRanks() {
	addrs, _ := ExpandRanks("tcp://10.0.0.5:5557", 3)
	fmt.Println(addrs)
	// Output: [tcp://10.0.0.5:5557 tcp://10.0.0.5:5558 tcp://10.0.0.5:5559]
}

// benchDecodeOnly is the baseline: the decoder alone over the same payloads, no window, binding or
// inventory.
func benchDecodeOnly(b *testing.B, blocks int) {
	payloads := benchPayloads(b, blocks, 32)
	var batch engines.Batch
	b.SetBytes(int64(len(payloads[0])))
	b.ReportAllocs()
	start, cpu0 := time.Now(), cpuTime()
	for i := 0; b.Loop(); i++ {
		if err := vllm.DecodeBatchInto(&batch, payloads[i%len(payloads)]); err != nil {
			b.Fatal(err)
		}
	}
	el, cpu := time.Since(start), cpuTime()-cpu0
	ops := float64(b.N) * float64(blocks)
	b.ReportMetric(ops/el.Seconds(), "blockops/s")
	b.ReportMetric(ops/cpu.Seconds(), "blockops/cpu-s")
}

func BenchmarkBaselineDecodeOnly16(b *testing.B)  { benchDecodeOnly(b, 16) }
func BenchmarkBaselineDecodeOnly256(b *testing.B) { benchDecodeOnly(b, 256) }
