package vllme2e_test

import (
	"context"
	"encoding/binary"
	"io"
	"log"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/internal/promtest"
)

// relay forwards an engine's published messages (topic, sequence number, batch) to a publisher of
// its own and drops the next one when armed: a message lost on the way to the gateway, the engine
// and its replay socket untouched.
type relay struct {
	addr    string
	armed   atomic.Bool
	dropped chan uint64 // the sequence number of the dropped message
}

func startRelay(t *testing.T, upstream string) *relay {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	quiet := zmq4.WithLogger(log.New(io.Discard, "", 0))
	sub, pub := zmq4.NewSub(ctx, quiet), zmq4.NewPub(ctx, quiet)
	t.Cleanup(func() { cancel(); sub.Close(); pub.Close() })
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(upstream); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: "tcp://" + pub.Addr().String(), dropped: make(chan uint64, 1)}
	go func() {
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) == 3 && len(msg.Frames[1]) == 8 && r.armed.CompareAndSwap(true, false) {
				r.dropped <- binary.BigEndian.Uint64(msg.Frames[1])
				continue
			}
			if pub.Send(msg) != nil {
				return
			}
		}
	}()
	return r
}

// TestSequenceGapReplayed: the gateway subscribes to e0's publisher through a relay, which drops
// the message carrying a prompt's stored blocks. The engine's next message shows the gateway the
// gap; it asks e0's replay socket for the missing sequence number and applies the batch, so the
// prompt's blocks are in its mirror (no clear, nothing kept unreplayed) and a follow-up routed
// KV-exact is predicted the engine's own cached_tokens.
func TestSequenceGapReplayed(t *testing.T) {
	needEngines(t)
	ep := engines[0]
	rl := startRelay(t, ep.Publish[0])
	relayed := &vllmpool.Engine{Spec: ep.Spec, URL: ep.URL, Publish: []string{rl.addr}, Replay: ep.Replay}
	cs, err := certifyPool(prof, []*vllmpool.Engine{relayed})
	if err != nil {
		t.Fatal(err)
	}
	g := startGatewayOn(t, prof, []*vllmpool.Engine{relayed}, cs)
	eventually(t, 60*time.Second, "e0 eligible behind the relay", func() bool {
		return endpointStatus(t, g, ep.Name).Exact.State == "eligible"
	})
	metric := func(name, k, v string) float64 {
		return promtest.Value(t, g.reg, name, map[string]string{"rule": "pool", "endpoint": ep.Name, k: v})
	}
	replayed0 := metric("kvexact_ingest_gaps_total", "decision", "replayed")

	lost := doc("lost on the way "+time.Now().Format(time.RFC3339Nano), 12)
	follow := map[string]any{"model": g.model, "prompt": lost + " And a follow-up question about it?"}
	rl.armed.Store(true)
	send(t, ep.URL, "/v1/completions", map[string]any{"model": g.model, "prompt": lost}, false)
	var seq uint64
	select {
	case seq = <-rl.dropped:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine published nothing for the prompt within 10 s")
	}
	// The next message (another prompt's blocks) shows the gap.
	send(t, ep.URL, "/v1/completions", map[string]any{"model": g.model, "prompt": doc("after the gap", 4)}, false)
	eventually(t, 15*time.Second, "the dropped batch replayed into the mirror", func() bool {
		return g.overlap("/v1/completions", follow, ep.Name) > 0
	})
	if d := metric("kvexact_ingest_gaps_total", "decision", "replayed") - replayed0; d != 1 {
		t.Fatalf("gaps replayed: %v, want 1 (seq %d)", d, seq)
	}
	for _, dec := range []string{"kept", "cleared"} {
		if n := metric("kvexact_ingest_gaps_total", "decision", dec); n != 0 {
			t.Fatalf("gaps %s: %v, want 0", dec, n)
		}
	}
	r := send(t, g.base, "/v1/completions", clone(follow), false)
	if predicted := r.decision.Score * vllmpool.BlockSize; r.decision.Tier != route.TierKVExact || predicted == 0 || predicted != r.cached {
		t.Fatalf("follow-up after the replayed gap: decision %+v, predicted %d cached tokens, the engine cached %d", r.decision, predicted, r.cached)
	}
}
