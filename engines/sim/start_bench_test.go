package sim

import (
	"context"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// BenchmarkStart measures what one more simulator costs in a process that already holds the
// tokenizer (tests and kvbench share one): construction plus binding HTTP, PUB and ROUTER sockets.
func BenchmarkStart(b *testing.B) {
	tok := testTokenizer(b)
	for i := 0; i < b.N; i++ {
		// A quiet logger: log lines between a benchmark's name and its figures break parsers.
		e, err := New(Config{Family: "vllm", Release: "v0.25.1", Tokenizer: tok, Model: "llama3",
			PublishAddr: "tcp://*:0", ReplayAddr: "tcp://*:0", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		if err := e.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		e.Close()
	}
}

// TestStartCost logs the cost of loading the tokenizer and of starting 8 simulators sharing it
// (figures for docs/benchmarks/simulator.md; nothing is asserted about speed).
func TestStartCost(t *testing.T) {
	if testing.Short() {
		t.Skip("measurement")
	}
	dir, err := tokenize.FindModelDir(tokenize.DefaultRoots(), "llama3")
	if err != nil {
		t.Skip(err)
	}
	var m0, m1, m2 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	start := time.Now()
	tok, err := tokenize.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	loadTime := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&m1)
	start = time.Now()
	fams := [][2]string{{"vllm", "v0.25.1"}, {"vllm", "v0.23.0"}, {"sglang", "v0.5.18"}, {"trtllm", "1.2"},
		{"llamacpp", "b10573"}, {"vllm", "v0.25.1"}, {"sglang", "v0.5.18"}, {"trtllm", "1.2"}}
	var es []*Engine
	for _, f := range fams {
		e, err := New(Config{Family: f[0], Release: f[1], Tokenizer: tok, Model: "llama3", PublishAddr: "tcp://*:0", ReplayAddr: "tcp://*:0"})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		es = append(es, e)
	}
	startTime := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&m2)
	for _, e := range es {
		e.Close()
	}
	t.Logf("tokenizer load %s, heap +%.1f MB; 8 simulators started in %s, heap +%.1f MB (%.2f MB each)",
		loadTime, float64(m1.HeapAlloc-m0.HeapAlloc)/1e6, startTime, float64(m2.HeapAlloc-m1.HeapAlloc)/1e6,
		float64(m2.HeapAlloc-m1.HeapAlloc)/8e6)
}
