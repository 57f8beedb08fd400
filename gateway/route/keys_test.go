package route

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

func llama3(tb testing.TB) (*tokenize.Pool, *tokenize.Tokenizer) {
	tb.Helper()
	p := tokenize.NewPool("")
	tok, err := p.Get("llama3")
	if err != nil {
		tb.Skipf("llama3 tokenizer not found (%v): run make tokenizers", err)
	}
	return p, tok
}

func TestPromptKeyerMatchesEngineBinding(t *testing.T) {
	pool, tok := llama3(t)
	seed := "0"
	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.VLLMSHA256, BlockSize: 16, Seed: &seed}, hashcore.Default())
	if err != nil {
		t.Fatal(err)
	}
	k := &PromptKeyer{Pool: pool, Hasher: h, BlockExtras: true}
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20)
	ids, _ := tok.Encode(prompt, true)
	want, _ := h.Keys(ids, nil, nil)
	got, _, miss, reason := k.Keys(context.Background(), &Request{Model: "llama3", Prompt: prompt})
	if miss != MissNone || len(got) != len(want) || len(got) == 0 {
		t.Fatalf("keys: %v %s (%d vs %d)", miss, reason, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("key %d differs", i)
		}
	}
	// add_special_tokens=false drops the BOS and so changes every key.
	off := false
	noBOS, _, _, _ := k.Keys(context.Background(), &Request{Model: "llama3", Prompt: prompt, AddSpecialTokens: &off})
	if len(noBOS) > 0 && noBOS[0] == got[0] {
		t.Fatal("add_special_tokens ignored")
	}
	// cache_salt enters block 0 only... and therefore every chained key.
	salted, _, _, _ := k.Keys(context.Background(), &Request{Model: "llama3", Prompt: prompt, CacheSalt: "tenant"})
	if salted[0] == got[0] {
		t.Fatal("cache_salt ignored")
	}
	// Chat: the template is rendered and encoded without special tokens, as vLLM does.
	body, _ := json.Marshal(map[string]any{"model": "llama3", "messages": []map[string]string{{"role": "user", "content": prompt}}})
	chat, _, miss, reason := k.Keys(context.Background(), &Request{Model: "llama3", Chat: true, Body: body})
	req, _ := tokenize.ParseChatRequest(body)
	cids, _, err := tok.EncodeChat(req)
	if err != nil || miss != MissNone {
		t.Fatalf("chat: %v %v %s", err, miss, reason)
	}
	wantChat, _ := h.Keys(cids, nil, nil)
	if len(chat) != len(wantChat) || chat[0] != wantChat[0] {
		t.Fatal("chat keys differ from template+hash")
	}
	// Misses carry reasons.
	if _, _, m, r := k.Keys(context.Background(), &Request{Model: "no-such-model", Prompt: "x"}); m != MissTokenizer || r == "" {
		t.Fatalf("unknown model: %v %q", m, r)
	}
	if _, _, m, _ := k.Keys(context.Background(), &Request{Model: "llama3", Chat: true, Body: []byte(`{"messages":7}`)}); m != MissTokenize {
		t.Fatalf("bad chat: %v", m)
	}
	// Token-id prompts skip the tokenizer.
	tk, _, m, _ := k.Keys(context.Background(), &Request{Model: "any", PromptTokens: ids})
	if m != MissNone || tk[0] != got[0] {
		t.Fatal("token prompt keys differ")
	}
}

func TestPromptKeyerRouterBinding(t *testing.T) {
	pool, tok := llama3(t)
	k := &PromptKeyer{Pool: pool, RouterBlockSize: 32}
	prompt := strings.Repeat("router keys are ours. ", 30)
	ids, _ := tok.Encode(prompt, true)
	want, _ := hashcore.RouterKeys(0, ids, 32, nil, nil)
	got, _, miss, _ := k.Keys(context.Background(), &Request{Model: "llama3", Prompt: prompt})
	if miss != MissNone || len(got) != len(want) || got[len(got)-1] != want[len(want)-1] {
		t.Fatal("router keys differ")
	}
}

// BenchmarkDecision measures what KV-exact adds to a request: tokenize + hash + score + the load
// law, for 1k- and 8k-token prompts, against 16 endpoints that each hold part of the prompt.
func BenchmarkDecision(b *testing.B) {
	pool, tok := llama3(b)
	seed := "0"
	h, _ := hashcore.New(hashcore.Binding{Algorithm: hashcore.VLLMSHA256, BlockSize: 16, Seed: &seed}, hashcore.Default())
	for _, n := range []int{1024, 8192} {
		var sb strings.Builder
		for i := 0; sb.Len() < n*10; i++ {
			sb.WriteString("Routing decisions must stay cheap even for long prompts with many shared blocks. ")
		}
		text := sb.String()
		ids, _ := tok.Encode(text, true)
		ids = ids[:n]
		text, _ = tok.Decode(ids[1:], false)
		r := &rules.Rule{Name: "b", Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, KVExactMode: 3, Seed: &seed}
		for i := 0; i < 16; i++ {
			r.Endpoints = append(r.Endpoints, rules.Endpoint{Name: string(rune('a' + i)), Address: "http://127.0.0.1:1"})
		}
		if err := r.Normalize(); err != nil {
			b.Fatal(err)
		}
		inv := inventory.New(inventory.Config{})
		keys, _ := h.Keys(ids, nil, nil)
		var eps []*Endpoint
		var cert inventory.Mask
		for i, e := range r.Endpoints {
			id, _ := inv.AddEndpoint(e.Name)
			cert.Set(id)
			inv.Store(id, keys[:len(keys)*(i+1)/16])
			eps = append(eps, &Endpoint{ID: id, Index: i, Name: e.Name, Role: RoleNormal, Weight: 1, Capacity: 1, Health: health.NewEndpoint(e.Name, e.Address, health.BreakerConfig{})})
		}
		keyer := &PromptKeyer{Pool: pool, Hasher: h}
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil)) // the zero-hit watchdog warns of the new prompts
		rt, err := New(Config{Rule: r, Endpoints: eps, Index: inv, Keyer: keyer, Certified: cert, Log: quiet, HitLimit: engines.LastTokenComputed})
		if err != nil {
			b.Fatal(err)
		}
		req := &Request{Model: "llama3", Prompt: text}
		name := map[int]string{1024: "1k", 8192: "8k"}[n]
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				d, err := rt.Route(context.Background(), req, inventory.Mask{})
				if err != nil || d.Tier != TierKVExact {
					b.Fatalf("%v %+v", err, d)
				}
				d.Release()
			}
		})
		// The same rule with predict-on-route off (the default before 2026-12-01): what the side
		// index costs a decision (docs/benchmarks/peers.md, predict-on-route's default).
		off := *r
		off.PredictOnRoute = ttl(0)
		rtOff, err := New(Config{Rule: &off, Endpoints: eps, Index: inv, Keyer: keyer, Certified: cert, Log: quiet})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name+"-predict-off", func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				d, err := rtOff.Route(context.Background(), req, inventory.Mask{})
				if err != nil || d.Tier != TierKVExact {
					b.Fatalf("%v %+v", err, d)
				}
				d.Release()
			}
		})
		// The same rule with lower-tier residencies, as the gateway builds every rule: empty (a
		// pool that offloads nothing), then a host tier holding the rest of every endpoint's prompt.
		lower := []LowerIndex{{Tier: engines.TierCPU, Index: inventory.New(inventory.Config{})},
			{Tier: engines.TierDisk, Index: inventory.New(inventory.Config{})}, {Tier: engines.TierShared, Index: inventory.New(inventory.Config{})}}
		for _, e := range r.Endpoints {
			for _, l := range lower {
				_, _ = l.Index.AddEndpoint(e.Name)
			}
		}
		rtLower, err := New(Config{Rule: r, Endpoints: eps, Index: inv, Lower: lower, Keyer: keyer, Certified: cert, Log: quiet, HitLimit: engines.LastTokenComputed})
		if err != nil {
			b.Fatal(err)
		}
		for _, held := range []bool{false, true} {
			if held {
				for i, e := range eps {
					_ = lower[0].Index.Store(e.ID, keys[len(keys)*(i+1)/16:])
				}
			}
			b.Run(name+map[bool]string{false: "-lower-empty", true: "-lower-held"}[held], func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					d, err := rtLower.Route(context.Background(), req, inventory.Mask{})
					if err != nil || d.Tier != TierKVExact {
						b.Fatalf("%v %+v", err, d)
					}
					d.Release()
				}
			})
		}
		// A new prompt per decision (its first word differs, so no block is shared, nor resident):
		// what the key cache costs when it never hits, against the same prompts without it.
		for _, cache := range []*KeyCache{nil, NewKeyCache(DefaultKeyCacheBytes)} {
			keyer.Cache = cache
			b.Run(name+"-new-prompts"+map[bool]string{true: "-key-cache"}[cache != nil], func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					d, err := rt.Route(context.Background(), &Request{Model: "llama3", Prompt: strconv.Itoa(i) + text}, inventory.Mask{})
					if err != nil || d.Blocks == 0 { // keyed, and held nowhere: the law falls back
						b.Fatalf("%v %+v", err, d)
					}
					d.Release()
				}
			})
		}
		keyer.Cache = nil
	}
}
