package ingest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/registry"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/kvgroups"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/vectors"
)

// TestHybridSamplesEngineHit runs, under the engine and the router binding, vLLM's hybrid-model event streams (sliding-window and Mamba
// groups beside full attention; vectors/vllm/v0.29.0/hybrid-samples.json) through a v0.29
// endpoint's pipeline with group residency, then scores each sample's prompts through the router:
// the KV-exact prefix must be the hit vLLM's own rule gives, and the evidence must name the group
// that cut it. With group residency off the router scores full attention alone, and the file's
// fullAttentionTokens (longer in the over-predicting cases) must come out instead.
func TestHybridSamplesEngineHit(t *testing.T) {
	f, err := vectors.LoadSamples(sampleFile(t, "vllm/v0.29.0/hybrid-samples.json"))
	if err != nil {
		t.Fatal(err)
	}
	ct := contractFor(t, "vllm", f.Header.Tag)
	seed, err := ct.EngineSeed(f.Header.Algo, nil) // the engines ran with PYTHONHASHSEED unset
	if err != nil {
		t.Fatal(err)
	}
	over := 0
	for _, s := range f.Samples {
		t.Run(s.Name, func(t *testing.T) {
			b, err := vllm.DecodeBatch(s.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if out, err := vllm.EncodeBatch(b, vllm.LayoutMap); err != nil || !bytes.Equal(out, s.Payload) {
				t.Fatalf("re-encode: %v\n got %x\nwant %x", err, out, s.Payload)
			}
			for _, ph := range s.PrefixHits {
				for _, c := range []struct {
					binding  Binding
					groupsOn bool
				}{{BindingEngine, true}, {BindingEngine, false}, {BindingRouter, true}} {
					groupsOn := c.groupsOn
					t.Run(fmt.Sprintf("%s/%s/groups=%v", ph.Name, c.binding, groupsOn), func(t *testing.T) {
						d := hybridDecision(t, f.Header.Algo, seed, ph, &b, c.binding, groupsOn)
						ev := d.Endpoints[0]
						// The router binding leaves Mamba groups out (ingest.md): full attention decides.
						mambaRouter := c.binding == BindingRouter && slices.Contains(s.Flags, "MambaGroup")
						want := ph.HitTokens / ph.HashBlockSize
						if !groupsOn || mambaRouter {
							want = ph.FullTokens / ph.HashBlockSize
						}
						if ev.Prefix != want {
							t.Fatalf("prefix %d blocks, want %d (engine hit %d tokens, full attention alone %d): %+v", ev.Prefix, want, ph.HitTokens, ph.FullTokens, ev)
						}
						if !groupsOn || mambaRouter {
							return
						}
						switch lim := fmt.Sprintf("group %d (", ph.LimitingGroup); {
						case ph.LimitingGroup >= 0 && (len(ev.Limit) < len(lim) || ev.Limit[:len(lim)] != lim || ev.FullPrefix != ph.FullTokens/ph.HashBlockSize):
							t.Errorf("evidence %+v, want the limit named %q… cut from %d", ev, lim, ph.FullTokens/ph.HashBlockSize)
						case ph.LimitingGroup < 0 && len(ev.Limit) > 6 && ev.Limit[:6] == "group ":
							t.Errorf("evidence %+v names a group, the engine's rule was cut by none", ev)
						}
					})
				}
				if ph.HitTokens < ph.FullTokens {
					over++
				}
			}
		})
	}
	if over == 0 {
		t.Error("no prompt where full attention alone over-predicts: the file defends nothing")
	}
}

func contractFor(t *testing.T, family, release string) *contracts.Contract {
	t.Helper()
	c, err := contracts.Lookup(family, release)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// hybridDecision applies batch b to a fresh endpoint (group residency on or off) and routes
// ph's prompt through a mode-3 router over it.
func hybridDecision(t *testing.T, algo string, seed *string, ph vectors.PrefixHit, b *engines.Batch, binding Binding, groupsOn bool) *route.Decision {
	t.Helper()
	idx := inventory.New(inventory.Config{})
	ep, err := idx.AddEndpoint("ep")
	if err != nil {
		t.Fatal(err)
	}
	groups := kvgroups.New(ph.HashBlockSize)
	cfg := Config{Family: "vllm", Release: "v0.29.0", Endpoint: "ep", Binding: binding, BlockSize: ph.HashBlockSize}
	if groupsOn {
		cfg.Groups = groups.Endpoint(ep)
	}
	cfg.defaults()
	fam, _ := registry.Lookup("vllm")
	p := newPipeline(cfg, fam, Into(idx, ep, nil, "r", "ep", nil))
	p.batch(b.DPRank, 0, 0, b)

	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.Algorithm(algo), BlockSize: ph.HashBlockSize, Seed: seed}, hashcore.Default())
	if err != nil {
		t.Fatal(err)
	}
	r := &rules.Rule{Name: "r", Engine: rules.EngineRef{Family: "vllm", Release: "v0.29.0"}, KVExactMode: 3, BlockSize: ph.HashBlockSize, Scoring: "prefix",
		Endpoints: []rules.Endpoint{{Name: "ep", Address: "http://127.0.0.1:1"}}}
	zero, one := 0, 1
	r.LoadLaw.ColdStartSeedN = &zero
	r.MinMatchTokens = &one
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	e := &route.Endpoint{ID: ep, Name: "ep", Role: route.RoleNormal, Weight: 1, Capacity: 1, Health: health.NewEndpoint("ep", "http://127.0.0.1:1", health.BreakerConfig{})}
	keyer := &route.PromptKeyer{Hasher: h}
	if binding == BindingRouter {
		keyer = &route.PromptKeyer{RouterBlockSize: ph.HashBlockSize}
	}
	rc := route.Config{Rule: r, Endpoints: []*route.Endpoint{e}, Index: idx, Keyer: keyer, Certified: inventory.MaskOf(ep)}
	if groupsOn {
		rc.Groups = groups
	}
	rt, err := route.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	d, err := rt.Explain(context.Background(), &route.Request{Model: "m", PromptTokens: ph.Prompt})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Endpoints) != 1 {
		t.Fatalf("decision %+v: no evidence (miss %s: %s)", d, d.Miss, d.Reason)
	}
	return d
}
