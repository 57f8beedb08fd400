package vllme2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	kvevents "github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
)

// TestSimulatorHeldToEngine sends one request trace — shared prefixes on completions and chat, a
// token-id prompt of whole blocks sent twice, a block completed by decode, a cache_salt, long
// prompts that evict under the small cache, and a restart — to a real engine and to the simulator
// started with the same geometry (release, tokenizer, block size, algorithm, seed, KV blocks), and
// compares, request by request, the events each publishes (read back through its replay socket
// and decoded by the gateway's decoder: stored and removed keys, parents, tokens, medium, group,
// extra keys) and the cached_tokens each reports. docs/simulator.md lists the verdicts.
func TestSimulatorHeldToEngine(t *testing.T) {
	needEngines(t)
	const idx = 0 // engines[0] is reset at the start and restarted mid-trace with its own configuration
	eng := engines[idx]
	s, err := sim.New(sim.Config{Family: "vllm", Release: vllmpool.Release, Model: model, ServedModelName: "llama3",
		Endpoint: "sim", BlockSize: vllmpool.BlockSize, Algorithm: "sha256", Seed: &seed0, CapacityBlocks: kvBlocks,
		MaxModelLen: 2048, MaxConcurrency: 16, PrefillPerToken: time.Microsecond, DecodePerToken: time.Millisecond,
		PublishAddr: "tcp://*:0", ReplayAddr: "tcp://*:0", DevMode: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	engineStream, simStream := &replayStream{addr: eng.Replay[0]}, &replayStream{addr: s.ReplayAddrs()[0]}
	// The shared engine served other tests before: skip what it published, clear its cache and
	// step it once (vLLM publishes the clear at the end of its next step).
	engineStream.poll(t)
	for _, base := range []string{eng.URL, s.URL()} {
		resp, err := http.Post(base+"/reset_prefix_cache", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s/reset_prefix_cache: status %d", base, resp.StatusCode)
		}
		generate(t, base, "/v1/completions", map[string]any{"model": "llama3", "prompt": "Hi"}, 1)
	}

	ids := tokenizeOnEngine(t, eng, doc("token ids", 10))
	alpha, beta := doc("alpha", 20), doc("beta", 10)
	completion := func(p any) map[string]any { return map[string]any{"model": "llama3", "prompt": p} }
	chat := func(turns ...string) map[string]any {
		msgs := []map[string]any{{"role": "system", "content": "You answer briefly."}}
		for i, c := range turns {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			msgs = append(msgs, map[string]any{"role": role, "content": c})
		}
		return map[string]any{"model": "llama3", "messages": msgs}
	}
	salted := completion(alpha)
	salted["cache_salt"] = "tenant-a"
	type step struct {
		name, path string
		req        map[string]any
		maxTokens  int
		// decode: the output completes a block, whose key and last token are the engine's own
		// sampled token (dummy weights) and differ from the simulator's; the rest must agree.
		decode  bool
		restart bool
	}
	trace := []step{
		{name: "clear"},
		{name: "completion", path: "/v1/completions", req: completion(alpha)},
		{name: "completion-shared-prefix", path: "/v1/completions", req: completion(alpha + " And one more question about it?")},
		{name: "chat", path: "/v1/chat/completions", req: chat(beta)},
		{name: "chat-follow-up", path: "/v1/chat/completions", req: chat(beta, "Yes.", "Tell me more.")},
		{name: "token-ids-whole-blocks", path: "/v1/completions", req: completion(ids[:64])},
		{name: "token-ids-again", path: "/v1/completions", req: completion(ids[:64])},
		{name: "decode-completes-a-block", path: "/v1/completions", req: completion(ids[64 : 64+63]), maxTokens: 2, decode: true},
		{name: "cache-salt", path: "/v1/completions", req: salted},
		{name: "evict-1", path: "/v1/completions", req: completion(doc("fill one", 100))},
		{name: "evict-2", path: "/v1/completions", req: completion(doc("fill two", 100))},
		{name: "evict-3", path: "/v1/completions", req: completion(doc("fill three", 100))},
		{name: "after-eviction-completion", path: "/v1/completions", req: completion(alpha + " And one more question about it?")},
		{name: "after-eviction-chat", path: "/v1/chat/completions", req: chat(beta, "Yes.", "Tell me more.")},
		{name: "evict-1-again", path: "/v1/completions", req: completion(doc("fill one", 100))},
		{name: "restart", restart: true},
		{name: "after-restart", path: "/v1/completions", req: completion(alpha)},
		{name: "after-restart-shared-prefix", path: "/v1/completions", req: completion(alpha + " And one more question about it?")},
		{name: "after-restart-chat", path: "/v1/chat/completions", req: chat(beta, "Yes.", "Tell me more.")},
	}
	alias := map[uint64]uint64{} // simulator key → engine key of blocks completed by decode
	var diffs []string
	for _, st := range trace {
		if st.restart {
			restart(t, idx, &seed0)
			eng = engines[idx]
			if s, err = sim.Restart(context.Background(), s, nil); err != nil {
				t.Fatal(err)
			}
			engineStream.next, simStream.next = 0, 0
			continue
		}
		var er, sr result
		if st.req != nil {
			mt := max(st.maxTokens, 1)
			er = generate(t, eng.URL, st.path, clone(st.req), mt)
			sr = generate(t, s.URL(), st.path, clone(st.req), mt)
			if er.prompt != sr.prompt {
				diffs = append(diffs, fmt.Sprintf("%s: prompt_tokens engine %d, simulator %d", st.name, er.prompt, sr.prompt))
			}
			if er.cached != sr.cached {
				diffs = append(diffs, fmt.Sprintf("%s: cached_tokens engine %d, simulator %d (prompt %d)", st.name, er.cached, sr.cached, er.prompt))
			}
		}
		se := simStream.settle(t)
		ee := engineStream.settleTo(t, len(se))
		if st.decode {
			learnDecodeAliases(ee, se, alias)
		}
		if d := compareEvents(ee, se, alias); d != "" {
			diffs = append(diffs, fmt.Sprintf("%s (prompt %d, cached %d): %s", st.name, er.prompt, er.cached, d))
		}
		t.Logf("%-28s prompt %4d cached engine %4d sim %4d, events engine %d sim %d", st.name, er.prompt, er.cached, sr.cached, len(ee), len(se))
	}
	if len(diffs) > 0 {
		t.Errorf("the simulator differs from vLLM %s on %d point(s):\n%s", vllmpool.Release, len(diffs), strings.Join(diffs, "\n"))
	}
}

// result is what one response reports.
type result struct{ prompt, cached int }

// generate posts a completion or chat with maxTokens output tokens (greedy) and reads its usage.
func generate(t *testing.T, base, path string, req map[string]any, maxTokens int) result {
	t.Helper()
	req["max_tokens"], req["temperature"] = maxTokens, 0
	body, _ := json.Marshal(req)
	resp, err := http.Post(base+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s%s: status %d: %s", base, path, resp.StatusCode, raw)
	}
	var u usageBody
	if err := json.Unmarshal(raw, &u); err != nil || u.Usage == nil || u.Usage.PromptTokensDetails == nil {
		t.Fatalf("%s%s: no usage.prompt_tokens_details in %s (%v)", base, path, raw, err)
	}
	return result{u.Usage.PromptTokens, u.Usage.PromptTokensDetails.CachedTokens}
}

// replayStream reads an engine's published batches back through its replay socket, in sequence
// order, from next on: no subscription race, and a gap is an error rather than a lost event.
type replayStream struct {
	addr string
	next uint64
}

func (r *replayStream) poll(t *testing.T) []kvevents.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithLogger(log.New(io.Discard, "", 0)))
	defer d.Close()
	if err := d.Dial(r.addr); err != nil {
		t.Fatalf("replay %s: %v", r.addr, err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(kvevents.ReplayRequest(r.next)...)); err != nil {
		t.Fatalf("replay %s: %v", r.addr, err)
	}
	var out []kvevents.Event
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatalf("replay %s from %d: %v", r.addr, r.next, err)
		}
		seq, payload, end, err := kvevents.ParseReplayReply(msg.Frames)
		if err != nil {
			t.Fatalf("replay %s: %v", r.addr, err)
		}
		if end {
			return out
		}
		if seq != r.next && r.next != 0 {
			t.Fatalf("replay %s: batch %d after %d (a gap)", r.addr, seq, r.next-1)
		}
		b, err := vllm.DecodeBatch(payload)
		if err != nil {
			t.Fatalf("replay %s: batch %d: %v", r.addr, seq, err)
		}
		out = append(out, b.Events...)
		r.next = seq + 1
	}
}

// settle returns the events published since the last call once the stream has been quiet for a
// moment (the engine publishes a step's events as the step ends, about when its response leaves).
func (r *replayStream) settle(t *testing.T) []kvevents.Event {
	t.Helper()
	var out []kvevents.Event
	for quiet := 0; quiet < 2; {
		time.Sleep(60 * time.Millisecond)
		evs := r.poll(t)
		if len(evs) == 0 {
			quiet++
			continue
		}
		quiet = 0
		out = append(out, evs...)
	}
	return out
}

// settleTo is settle for a stream that may lag: it waits up to 5 s for at least want events (what
// the other side published for the same request) before it waits for quiet, so a slow publisher
// under load does not push one request's events onto the next.
func (r *replayStream) settleTo(t *testing.T, want int) []kvevents.Event {
	t.Helper()
	var out []kvevents.Event
	for deadline := time.Now().Add(5 * time.Second); len(out) < want && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		out = append(out, r.poll(t)...)
	}
	return append(out, r.settle(t)...)
}

// eventView is the part of an event routing depends on, as the gateway's decoder reads it.
type eventView struct {
	Kind      string
	Hashes    []string
	Parent    string
	Tokens    []uint32
	BlockSize int
	Medium    string
	Group     string
	SpecKind  string
	LoRA      string
	ExtraKeys string
}

func view(e kvevents.Event, alias map[uint64]uint64) eventView {
	key := func(k uint64) string {
		if a, ok := alias[k]; ok {
			k = a
		}
		return fmt.Sprintf("%016x", k)
	}
	v := eventView{Kind: e.Kind.String(), BlockSize: e.BlockSize, Medium: e.Medium, SpecKind: e.SpecKind, Tokens: e.TokenIDs,
		Parent: "root", Group: "none"}
	for _, h := range e.BlockHashes {
		v.Hashes = append(v.Hashes, key(h))
	}
	if e.HasParent {
		v.Parent = key(e.Parent)
	}
	if e.HasGroupIdx {
		v.Group = fmt.Sprint(e.GroupIdx)
	}
	if e.HasLoRAID || e.LoRAName != "" {
		v.LoRA = fmt.Sprintf("%d/%s", e.LoRAID, e.LoRAName)
	}
	if e.HasExtraKeys {
		v.ExtraKeys = fmt.Sprint(e.ExtraKeys)
	}
	return v
}

// learnDecodeAliases pairs the keys of blocks a decode step completed: the same stored event on
// both sides whose tokens differ only in the sampled output (the last token of the block).
func learnDecodeAliases(eng, sim []kvevents.Event, alias map[uint64]uint64) {
	for i := range min(len(eng), len(sim)) {
		a, b := eng[i], sim[i]
		if a.Kind != kvevents.BlockStored || b.Kind != kvevents.BlockStored || len(a.BlockHashes) != len(b.BlockHashes) ||
			len(a.TokenIDs) != len(b.TokenIDs) || len(a.TokenIDs) == 0 {
			continue
		}
		n := len(a.TokenIDs)
		if reflect.DeepEqual(a.TokenIDs[:n-1], b.TokenIDs[:n-1]) && a.TokenIDs[n-1] != b.TokenIDs[n-1] {
			last := len(a.BlockHashes) - 1
			alias[b.BlockHashes[last]] = a.BlockHashes[last]
			b.TokenIDs[n-1] = a.TokenIDs[n-1]
		}
	}
}

// compareEvents describes how the simulator's events of one step differ from the engine's ("" when
// they agree).
func compareEvents(eng, sim []kvevents.Event, alias map[uint64]uint64) string {
	var b strings.Builder
	for i := range max(len(eng), len(sim)) {
		var ev, sv *eventView
		if i < len(eng) {
			v := view(eng[i], nil)
			ev = &v
		}
		if i < len(sim) {
			v := view(sim[i], alias)
			sv = &v
		}
		if ev != nil && sv != nil && reflect.DeepEqual(*ev, *sv) {
			continue
		}
		fmt.Fprintf(&b, "\n  event %d: engine %s\n           sim    %s", i, describe(ev), describe(sv))
		if ev != nil && sv != nil && !reflect.DeepEqual(ev.Tokens, sv.Tokens) {
			fmt.Fprintf(&b, "\n           tokens differ from position %d", firstDiff(ev.Tokens, sv.Tokens))
		}
	}
	return b.String()
}

func describe(v *eventView) string {
	if v == nil {
		return "(none)"
	}
	s := fmt.Sprintf("%s %v parent=%s", v.Kind, v.Hashes, v.Parent)
	if v.Kind == "BlockStored" {
		s += fmt.Sprintf(" tokens=%d bs=%d", len(v.Tokens), v.BlockSize)
	}
	return s + fmt.Sprintf(" medium=%q group=%s kind=%q lora=%q extra=%s", v.Medium, v.Group, v.SpecKind, v.LoRA, v.ExtraKeys)
}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
