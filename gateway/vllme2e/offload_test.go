package vllme2e_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	kvengines "github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
	"github.com/kvexact/kvexact/gateway/route"
)

// offloadBlocks is the offload engine's host tier: 256 blocks (4 MiB), room for every prompt the
// test sends, so nothing is evicted from it while its GPU cache (kvBlocks) evicts.
const offloadBlocks = 256

var (
	offEngine *vllmpool.Engine // started by TestMain beside the pool: vLLM's offloading connector
	offErr    error
)

// TestOffloadedBlocksScoredAsLowerTier: a real engine with vLLM's offloading connector (CPU tier,
// self-describing events; docs/vllm-engine.md), certified by ctk, caches a prompt, then fillers
// push it out of its GPU cache while the host keeps it. The gateway's CPU residency of the
// endpoint holds exactly the keys the engine published with medium CPU (its whole stream, read
// back from its replay socket, a clear emptying it as the gateway's clear does), its GPU residency
// no longer holds the prompt, and a follow-up is scored on the CPU tier — no GPU prefix, the
// prompt's blocks counted as a cpu hit — routed KV-exact, not as a miss, while the engine reports
// those blocks loaded (cached_tokens).
func TestOffloadedBlocksScoredAsLowerTier(t *testing.T) {
	needEngines(t)
	if offErr != nil {
		t.Fatal(offErr)
	}
	cs, err := certifyPool(prof, []*vllmpool.Engine{offEngine})
	if err != nil {
		t.Fatal(err)
	}
	g := startGatewayOn(t, prof, []*vllmpool.Engine{offEngine}, cs)
	ep := offEngine.Name
	first := doc("offloaded first", 40)
	follow := map[string]any{"model": g.model, "prompt": first + " And a follow-up question about it?"}
	send(t, offEngine.URL, "/v1/completions", map[string]any{"model": g.model, "prompt": first}, false)
	eventually(t, 10*time.Second, "the first prompt in the GPU inventory", func() bool { return g.overlap("/v1/completions", follow, ep) > 0 })
	for i := range 6 {
		send(t, offEngine.URL, "/v1/completions", map[string]any{"model": g.model, "prompt": doc("offload filler "+string(rune('a'+i)), 40)}, false)
	}

	var published map[uint64]bool // the keys the engine stored with medium CPU and did not remove
	eventually(t, 15*time.Second, "the gateway's CPU residency to equal the engine's CPU stores", func() bool {
		published = cpuKeys(t, offEngine.Replay[0])
		held, ok := g.a.Runtime.TierInventory("pool", ep, kvengines.TierCPU)
		if !ok || len(held) != len(published) || len(held) == 0 {
			return false
		}
		for _, kc := range held {
			if !published[kc.Key] {
				return false
			}
		}
		return true
	})
	d := g.explain("/v1/completions", follow)
	i := slices.IndexFunc(d.Endpoints, func(e route.EndpointEvidence) bool { return e.Name == ep })
	if i < 0 {
		t.Fatalf("no evidence for %s: %+v", ep, d)
	}
	ev := d.Endpoints[i]
	if ev.Prefix != 0 || ev.Overlap != 0 || len(ev.Tiers) != 1 || ev.Tiers[0].Tier != kvengines.TierCPU.String() || ev.Tiers[0].Blocks == 0 {
		t.Fatalf("the offloaded prompt's evidence: GPU prefix %d overlap %d, tiers %+v (want no GPU block, the prompt on cpu)", ev.Prefix, ev.Overlap, ev.Tiers)
	}
	cpuBlocks := ev.Tiers[0].Blocks

	r := send(t, g.base, "/v1/completions", follow, false)
	if r.endpoint != ep || r.decision.Tier != route.TierKVExact || r.decision.Miss != "" || r.decision.Score == 0 {
		t.Fatalf("the follow-up: served by %s, tier %q, miss %q, score %d (want KV-exact on the cpu hit)", r.endpoint, r.decision.Tier, r.decision.Miss, r.decision.Score)
	}
	if r.cached != cpuBlocks*vllmpool.BlockSize {
		t.Fatalf("the gateway saw %d blocks of the prompt on the CPU tier, the engine loaded %d of %d tokens", cpuBlocks, r.cached, r.prompt)
	}
}

// replay reads the batches of an engine's replay socket from sequence number from on.
func replay(t *testing.T, addr string, from uint64) []kvengines.Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithLogger(log.New(io.Discard, "", 0)))
	defer d.Close()
	if err := d.Dial(addr); err != nil {
		t.Fatal(err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(kvengines.ReplayRequest(from)...)); err != nil {
		t.Fatal(err)
	}
	var out []kvengines.Batch
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		_, payload, end, err := kvengines.ParseReplayReply(msg.Frames)
		if err != nil {
			t.Fatal(err)
		}
		if end {
			return out
		}
		b, err := vllm.DecodeBatch(payload)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
}

// cpuKeys are the keys the engine's batches (all of them, from its replay socket) stored with
// medium CPU and did not remove again (with medium CPU) or clear since.
func cpuKeys(t *testing.T, addr string) map[uint64]bool {
	keys := map[uint64]bool{}
	for _, b := range replay(t, addr, 0) {
		for _, e := range b.Events {
			switch {
			case e.Kind == kvengines.AllBlocksCleared:
				clear(keys)
			case e.Medium != "CPU":
			case e.Kind == kvengines.BlockStored:
				for _, k := range e.BlockHashes {
					keys[k] = true
				}
			case e.Kind == kvengines.BlockRemoved:
				for _, k := range e.BlockHashes {
					delete(keys, k)
				}
			}
		}
	}
	return keys
}

// TestSimulatorOffloadResetsHeldToEngine holds the simulator's offload tier (engines/sim
// offload.go) to the real engine with the offloading connector on cache resets: one prompt, sent
// to both, is stored on the GPU and offloaded to the host; a plain POST /reset_prefix_cache
// publishes one AllBlocksCleared and nothing for the host, and the prompt again is served from
// the host (its full blocks in cached_tokens, stored on the GPU again, nothing stored on the
// host); ?reset_external=true publishes the same one AllBlocksCleared and empties the host too,
// so the prompt again is a full miss, computed and offloaded again. Each step compares the reset's
// answer, the usage and the events each side published (replay sockets, the gateway's decoder);
// the host's per-block stores are compared as a set, since the engine publishes them in its
// tracker's set order (vectors/vllm/v0.31.0/offload-samples.json) and the simulator in block order.
// docs/vllm-engine.md finding 13 has the engine's source.
func TestSimulatorOffloadResetsHeldToEngine(t *testing.T) {
	needEngines(t)
	if offErr != nil {
		t.Fatal(offErr)
	}
	s, err := sim.New(sim.Config{Family: "vllm", Release: vllmpool.Release, Model: model, ServedModelName: "llama3",
		Endpoint: "sim-off", BlockSize: vllmpool.BlockSize, Algorithm: "sha256", Seed: &seed0, CapacityBlocks: kvBlocks,
		OffloadBlocks: offloadBlocks, MaxModelLen: 2048, MaxConcurrency: 16, PrefillPerToken: time.Microsecond,
		DecodePerToken: time.Millisecond, PublishAddr: "tcp://*:0", ReplayAddr: "tcp://*:0", DevMode: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	sides := []struct {
		name, base string
		stream     *replayStream
	}{{"engine", offEngine.URL, &replayStream{addr: offEngine.Replay[0]}}, {"simulator", s.URL(), &replayStream{addr: s.ReplayAddrs()[0]}}}

	// The offload engine served TestOffloadedBlocksScoredAsLowerTier: let its last host stores
	// arrive, skip them, and start both sides from an empty GPU and host.
	sides[0].stream.settle(t)
	for _, sd := range sides {
		resetCache(t, sd.base, "/reset_prefix_cache?reset_external=true")
		generate(t, sd.base, "/v1/completions", map[string]any{"model": "llama3", "prompt": "Hi"}, 1)
		sd.stream.settle(t)
	}

	prompt := map[string]any{"model": "llama3", "prompt": doc("offload reset", 40)}
	type step struct {
		name, reset string
		// check is what the step must show on each side (events normalized by hostLast), beyond
		// the two sides agreeing; full is the prompt's full blocks.
		check func(r result, evs []kvengines.Event, full int) string
	}
	full := 0
	stored := func(evs []kvengines.Event, medium string) int {
		n := 0
		for _, e := range evs {
			if e.Kind == kvengines.BlockStored && e.Medium == medium {
				n += len(e.BlockHashes)
			}
		}
		return n
	}
	onlyClear := func(_ result, evs []kvengines.Event, _ int) string {
		if len(evs) != 1 || evs[0].Kind != kvengines.AllBlocksCleared {
			return fmt.Sprintf("published %d event(s) %s, want exactly one AllBlocksCleared (no host removal)", len(evs), kinds(evs))
		}
		return ""
	}
	computed := func(r result, evs []kvengines.Event, full int) string {
		if r.cached != 0 || stored(evs, "GPU") != full || stored(evs, "CPU") != full {
			return fmt.Sprintf("cached %d, GPU stored %d, host stored %d blocks; want 0 cached, the %d full blocks stored on the GPU and offloaded", r.cached, stored(evs, "GPU"), stored(evs, "CPU"), full)
		}
		return ""
	}
	trace := []step{
		{name: "store", check: computed},
		{name: "reset", reset: "/reset_prefix_cache", check: onlyClear},
		{name: "load-after-reset", check: func(r result, evs []kvengines.Event, full int) string {
			if r.cached != full*vllmpool.BlockSize || stored(evs, "GPU") != full || stored(evs, "CPU") != 0 || len(evs) != 1 {
				return fmt.Sprintf("cached %d, events %s (GPU stored %d, host stored %d); want %d cached (every full block loaded from the host), the loaded blocks stored on the GPU, nothing on the host",
					r.cached, kinds(evs), stored(evs, "GPU"), stored(evs, "CPU"), full*vllmpool.BlockSize)
			}
			return ""
		}},
		{name: "reset-external", reset: "/reset_prefix_cache?reset_external=true", check: onlyClear},
		{name: "after-reset-external", check: computed},
	}
	var diffs []string
	for _, st := range trace {
		var res [2]result
		var answers [2]string
		for i, sd := range sides {
			req := clone(prompt)
			if st.reset != "" {
				answers[i] = resetCache(t, sd.base, st.reset)
				req["prompt"] = "Hi" // the engine publishes the clear when its next step ends
			}
			res[i] = generate(t, sd.base, "/v1/completions", req, 1)
		}
		if st.name == "store" {
			full = res[0].prompt / vllmpool.BlockSize
		}
		if answers[0] != answers[1] {
			diffs = append(diffs, fmt.Sprintf("%s: %s answered %s, the simulator %s", st.name, st.reset, answers[0], answers[1]))
		}
		if res[0] != res[1] {
			diffs = append(diffs, fmt.Sprintf("%s: usage engine %+v, simulator %+v", st.name, res[0], res[1]))
		}
		se := hostLast(sides[1].stream.settle(t))
		ee := hostLast(sides[0].stream.settleTo(t, len(se)))
		for i, evs := range [][]kvengines.Event{ee, se} {
			if d := st.check(res[i], evs, full); d != "" {
				diffs = append(diffs, fmt.Sprintf("%s: the %s %s", st.name, sides[i].name, d))
			}
		}
		if d := compareEvents(ee, se, nil); d != "" {
			diffs = append(diffs, fmt.Sprintf("%s (prompt %d, cached %d): %s", st.name, res[0].prompt, res[0].cached, d))
		}
		t.Logf("%-22s prompt %4d cached engine %4d sim %4d, events engine %s sim %s", st.name, res[0].prompt, res[0].cached, res[1].cached, kinds(ee), kinds(se))
	}
	if len(diffs) > 0 {
		t.Errorf("the simulator's offload tier differs from vLLM %s on %d point(s):\n%s", vllmpool.Release, len(diffs), strings.Join(diffs, "\n"))
	}
}

// resetCache POSTs a reset (path and query) and returns the answer's status and body. The engine
// answers {"success": false} while blocks are held (a transfer in flight): it is retried then.
func resetCache(t *testing.T, base, path string) string {
	t.Helper()
	for try := 0; ; try++ {
		resp, err := http.Post(base+path, "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s%s: status %d: %s", base, path, resp.StatusCode, raw)
		}
		var ok struct{ Success bool }
		if json.Unmarshal(raw, &ok) == nil && !ok.Success && try < 50 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		return fmt.Sprintf("%d %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
}

// hostLast orders one step's events for comparison: the GPU's events and clears as published,
// then the host's (medium CPU) sorted by kind and key.
func hostLast(evs []kvengines.Event) []kvengines.Event {
	var out, host []kvengines.Event
	for _, e := range evs {
		if e.Medium == "CPU" {
			host = append(host, e)
		} else {
			out = append(out, e)
		}
	}
	slices.SortStableFunc(host, func(a, b kvengines.Event) int {
		if a.Kind != b.Kind {
			return cmp.Compare(a.Kind, b.Kind)
		}
		return slices.Compare(a.BlockHashes, b.BlockHashes)
	})
	return append(out, host...)
}

// kinds names events by kind and medium with their block counts, a run of like events once with
// its length ("BlockStored/CPU[1] ×21").
func kinds(evs []kvengines.Event) string {
	var parts []string
	last, run := "", 0
	flush := func() {
		if run > 1 {
			last += fmt.Sprintf(" ×%d", run)
		}
		if run > 0 {
			parts = append(parts, last)
		}
	}
	for _, e := range evs {
		p := e.Kind.String()
		if e.Medium != "" {
			p += "/" + e.Medium
		}
		if len(e.BlockHashes) > 0 {
			p += fmt.Sprintf("[%d]", len(e.BlockHashes))
		}
		if p == last && run > 0 {
			run++
			continue
		}
		flush()
		last, run = p, 1
	}
	flush()
	return "[" + strings.Join(parts, ", ") + "]"
}
