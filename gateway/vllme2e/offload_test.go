package vllme2e_test

import (
	"context"
	"io"
	"log"
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	kvengines "github.com/kvexact/kvexact/engines"
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
