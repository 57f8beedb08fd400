package vllme2e_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/route"
)

func endpointStatus(t *testing.T, g *gw, name string) gateway.EndpointStatus {
	t.Helper()
	for _, e := range g.a.Runtime.Status().Rules[0].Endpoints {
		if e.Name == name && e.Exact != nil {
			return e
		}
	}
	t.Fatalf("no exact status for %s", name)
	return gateway.EndpointStatus{}
}

// restart stops engine i and starts it again on the same ports with seed (nil: unset).
func restart(t *testing.T, i int, seed *string) {
	t.Helper()
	restartWith(t, i, func(s *vllmpool.Spec) { s.Seed = seed })
}

// restartWith stops engine i and starts it again on the same ports, its spec changed by mod.
func restartWith(t *testing.T, i int, mod func(*vllmpool.Spec)) {
	t.Helper()
	old := engines[i]
	old.Stop()
	s := old.Spec
	mod(&s)
	e, err := env.Start(context.Background(), s, startTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s restarted in %v", e.Name, e.Started.Round(time.Second))
	engines[i] = e
}

// TestEngineRestart: e1 restarts on the same ports with its certified configuration: the gateway
// learns of the restart from the event stream and predicts nothing of the wiped cache, and the
// engine agrees. Restarted again with another PYTHONHASHSEED, it is fenced (the live parity watch
// names the seed) while e0 stays eligible. e1 is restarted with its certified configuration by the
// next test that needs the engines.
func TestEngineRestart(t *testing.T) {
	g := startGateway(t)
	e1 := engines[1].Name
	held := doc("cached on e1 before its restarts", 12)
	req := map[string]any{"model": g.model, "prompt": held}
	send(t, engines[1].URL, "/v1/completions", map[string]any{"model": g.model, "prompt": held}, false)
	eventually(t, 10*time.Second, "e1's blocks in the inventory", func() bool { return g.overlap("/v1/completions", req, e1) > 0 })
	if st := endpointStatus(t, g, e1); st.Exact.State != "eligible" {
		t.Fatalf("e1 before the restart: %+v", st.Exact)
	}

	restart(t, 1, &seed0)
	// The restarted engine's first events (an unrelated prompt's) show the gateway the restart.
	eventually(t, 30*time.Second, "the gateway to drop e1's blocks after its restart", func() bool {
		send(t, engines[1].URL, "/v1/completions", map[string]any{"model": g.model, "prompt": doc("after the first restart", 4)}, false)
		return g.overlap("/v1/completions", req, e1) == 0
	})
	if r := send(t, engines[1].URL, "/v1/completions", map[string]any{"model": g.model, "prompt": held}, false); r.cached != 0 {
		t.Fatalf("the restarted engine reports %d cached tokens of the prompt it held before", r.cached)
	}

	restart(t, 1, strp("1"))
	drifted[1] = true
	var st gateway.EndpointStatus
	for i := 0; ; i++ {
		if i == 100 {
			t.Fatalf("e1 not fenced after 100 prompts with another seed: %+v", st.Exact)
		}
		send(t, engines[1].URL, "/v1/completions", map[string]any{"model": g.model, "prompt": doc(fmt.Sprintf("after the seed change %d", i), 6)}, false)
		time.Sleep(50 * time.Millisecond)
		if st = endpointStatus(t, g, e1); slices.Contains(st.Exact.Holds, "parity_mismatch") {
			break
		}
	}
	if st.Exact.State != "suspended" || !strings.Contains(st.Exact.Parity.LastMismatch, "seed") || !strings.Contains(st.Fenced, "seed") {
		t.Fatalf("e1 after a restart with another seed: fenced %q, %+v", st.Fenced, st.Exact)
	}
	if st0 := endpointStatus(t, g, engines[0].Name); st0.Exact.State != "eligible" {
		t.Fatalf("e0 lost its eligibility with e1's restart: %+v", st0.Exact)
	}
	// KV-exact never picks the fenced engine, even for the prompt it now holds.
	r := send(t, g.base, "/v1/completions", map[string]any{"model": g.model, "prompt": doc("after the seed change 0", 6) + " More."}, false)
	if r.endpoint == e1 && r.decision.Tier == route.TierKVExact {
		t.Fatalf("KV-exact picked the fenced e1: %+v", r.decision)
	}
}

func strp(s string) *string { return &s }
