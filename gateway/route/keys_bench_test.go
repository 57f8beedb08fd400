package route

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// benchWords is n pseudo-random words of a small vocabulary (distinct text per seed, so that no
// two turns share a segment).
func benchWords(seed uint64, n int) string {
	vocab := strings.Fields("the gateway routes each request to the engine that already caches most of its prompt blocks while load health and exactness bound every choice it makes for long conversations")
	r := rand.New(rand.NewPCG(seed, 7))
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[r.IntN(len(vocab))])
	}
	return b.String()
}

// multiTurnBody is a chat body of turns alternating user and assistant turns of about 2000 tokens,
// then (next ≥ 0) a new user turn of about 200 tokens with the generation prompt.
func multiTurnBody(turns, next int) []byte {
	var msgs []map[string]string
	for k := 0; k < turns; k++ {
		msgs = append(msgs, map[string]string{"role": []string{"user", "assistant"}[k%2], "content": benchWords(uint64(k), 1800)})
	}
	body := map[string]any{"messages": msgs, "add_generation_prompt": false}
	if next >= 0 {
		msgs = append(msgs, map[string]string{"role": "user", "content": benchWords(1<<20+uint64(next), 180)})
		body = map[string]any{"messages": msgs}
	}
	b, _ := json.Marshal(body)
	return b
}

// processCPU is the process's user + system time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDecisionMultiTurn is the whole KV-exact decision (Router.Route) for a conversation of
// about 32k or 100k tokens whose earlier turns the previous request sent (their keys resident on one
// of 16 endpoints; the segment cache warm), plus one new user turn per iteration, built untimed (the
// proxy parses the body before deciding). Variant "segment-cache" keys the prompt afresh;
// "key-cache" reuses the block keys of the previous request's ids (PromptKeyer.Cache).
func BenchmarkDecisionMultiTurn(b *testing.B) {
	_, tok := llama3(b)
	seed := "0"
	h, _ := hashcore.New(hashcore.Binding{Algorithm: hashcore.VLLMSHA256, BlockSize: 16, Seed: &seed}, hashcore.Default())
	for _, size := range []struct {
		name  string
		turns int
	}{{"32k", 16}, {"100k", 50}} {
		for _, variant := range []string{"segment-cache", "key-cache"} {
			b.Run(size.name+"/"+variant, func(b *testing.B) {
				pool := tokenize.NewPool("", tokenize.WithFolder("llama3", tok.Dir()), tokenize.WithSegmentCacheBytes(tokenize.DefaultSegmentCacheBytes))
				k := &PromptKeyer{Pool: pool, Hasher: h}
				if variant == "key-cache" {
					k.Cache = NewKeyCache(DefaultKeyCacheBytes)
				}
				base, err := tokenize.ParseChatRequest(multiTurnBody(size.turns, -1))
				if err != nil {
					b.Fatal(err)
				}
				ptok, _ := pool.Get("llama3")
				prefix, _, err := ptok.EncodeChat(base)
				if err != nil {
					b.Fatal(err)
				}
				keys, _ := h.Keys(prefix, nil, nil)
				r := &rules.Rule{Name: "b", Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, KVExactMode: 3, Seed: &seed}
				for i := 0; i < 16; i++ {
					r.Endpoints = append(r.Endpoints, rules.Endpoint{Name: fmt.Sprintf("e%d", i), Address: "http://127.0.0.1:1"})
				}
				zero := 0
				r.LoadLaw.ColdStartSeedN = &zero // every decision measures the same path
				if err := r.Normalize(); err != nil {
					b.Fatal(err)
				}
				inv := inventory.New(inventory.Config{})
				var eps []*Endpoint
				var cert inventory.Mask
				for i, e := range r.Endpoints {
					id, _ := inv.AddEndpoint(e.Name)
					cert.Set(id)
					if i == 3 {
						inv.Store(id, keys)
					} else {
						inv.Store(id, keys[:len(keys)*i/32])
					}
					eps = append(eps, &Endpoint{ID: id, Index: i, Name: e.Name, Role: RoleNormal, Weight: 1, Capacity: 1, Health: health.NewEndpoint(e.Name, e.Address, health.BreakerConfig{})})
				}
				rt, err := New(Config{Rule: r, Endpoints: eps, Index: inv, Keyer: k, Certified: cert})
				if err != nil {
					b.Fatal(err)
				}
				request := func(i int) *Request {
					cr, err := tokenize.ParseChatRequest(multiTurnBody(size.turns, i))
					if err != nil {
						b.Fatal(err)
					}
					return &Request{Model: "llama3", Chat: true, ChatRequest: cr}
				}
				route := func(req *Request) {
					d, err := rt.Route(context.Background(), req, inventory.Mask{})
					if err != nil || d.Tier != TierKVExact || d.Target != eps[3] || d.Score < len(keys) {
						b.Fatalf("decision %v: %s → %s score %d of %d (%s %s)", err, d.Tier, d.TargetN, d.Score, len(keys), d.Miss, d.Reason)
					}
					d.Release()
				}
				route(request(0)) // the previous request of the conversation
				b.ReportAllocs()
				b.ResetTimer()
				var cpu time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					req := request(i + 1)
					runtime.GC() // the garbage of building req is not the decision's
					b.StartTimer()
					c0 := processCPU()
					route(req)
					cpu += processCPU() - c0
				}
				// The process's CPU per decision (GC included): what contention inflates least.
				b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
				b.ReportMetric(float64(len(keys)), "blocks")
				if st := k.Cache.Stats(); k.Cache != nil {
					b.ReportMetric(float64(st.ReusedBlocks)/float64(st.Hits+st.Misses), "reused-blocks/op")
				}
			})
		}
	}
}
