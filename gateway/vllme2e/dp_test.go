package vllme2e_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
	"github.com/kvexact/kvexact/gateway/route"
)

// TestDataParallelRanksScoredPerRank: one engine started with --data-parallel-size 2 (two engine
// cores, each with its own KV cache, publishing on the events and replay ports + rank) is certified
// by ctk and routed by the gateway, which mirrors each rank apart. A prompt sent straight to one
// rank is scored on that rank: its follow-up through the gateway goes there with
// X-data-parallel-rank, and the engine's cached_tokens equal the prediction. The same follow-up sent
// straight to the other rank is no hit there, so a score over the union of the ranks (sent without
// the header, the engine picks the least loaded rank) would be a false hit. Both ranks are tried as
// the holder.
//
// A data-parallel engine is one more engine start (three to four minutes here under load), so
// this runs in make vllm-long (KVEXACT_VLLM=long), which .ci/run calls, not in make test.
func TestDataParallelRanksScoredPerRank(t *testing.T) {
	needEnv(t)
	if !longRun {
		t.Skip("starts a data-parallel engine of its own: runs in make vllm-long (KVEXACT_VLLM=long), which .ci/run calls")
	}
	e, err := env.Start(context.Background(), vllmpool.Spec{Name: "dp", Model: model, Seed: &seed0, KVBlocks: kvBlocks, DP: 2}, startTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Stop() })
	t.Logf("data-parallel engine up in %v (ranks publish on %v)", e.Started.Round(time.Second), e.Publish)
	es := []*vllmpool.Engine{e}
	cs, err := certifyPool(prof, es)
	if err != nil {
		t.Fatal(err)
	}
	g := startGatewayOn(t, prof, es, cs)
	toRank := func(r int) map[string]string { return map[string]string{"X-data-parallel-rank": strconv.Itoa(r)} }
	tag := time.Now().Format(time.RFC3339Nano)
	for _, held := range []int{1, 0} {
		t.Run(fmt.Sprintf("rank-%d", held), func(t *testing.T) {
			base := doc(fmt.Sprintf("held by rank %d %s", held, tag), 12)
			if r := sendWith(t, e.URL, "/v1/completions", map[string]any{"model": g.model, "prompt": base}, false, toRank(held)); r.cached != 0 {
				t.Fatalf("rank %d reports %d cached tokens of a new prompt", held, r.cached)
			}
			follow := map[string]any{"model": g.model, "prompt": base + " And a follow-up question about it?"}
			var ev route.EndpointEvidence
			eventually(t, 10*time.Second, "the rank's blocks in the gateway's inventory", func() bool {
				for _, x := range g.explain("/v1/completions", follow).Endpoints {
					if x.Name == e.Name {
						ev = x
					}
				}
				return ev.Overlap > 0
			})
			if ev.Rank == nil || *ev.Rank != held {
				t.Fatalf("the endpoint's evidence %+v: want it scored by rank %d, the one holding the prompt", ev, held)
			}
			r := send(t, g.base, "/v1/completions", clone(follow), false)
			d := r.decision
			if r.endpoint != e.Name || d.Tier != route.TierKVExact || d.Rank == nil || *d.Rank != held {
				t.Fatalf("follow-up: served by %s, decision %+v; want KV-exact pinned to rank %d", r.endpoint, d, held)
			}
			if predicted := d.Score * vllmpool.BlockSize; predicted == 0 || predicted != r.cached {
				t.Fatalf("predicted %d cached tokens on rank %d (score %d blocks), the engine cached %d of %d", predicted, held, d.Score, r.cached, r.prompt)
			}
			// The other rank's cache is its own.
			other := clone(follow)
			other["prompt"] = base + " Another follow-up, on the other rank?"
			if r := sendWith(t, e.URL, "/v1/completions", other, false, toRank(1-held)); r.cached != 0 {
				t.Fatalf("rank %d cached %d tokens of a prompt only rank %d holds", 1-held, r.cached, held)
			}
		})
	}
}
