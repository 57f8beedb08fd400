package gateway

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines/registry"
	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/route"
)

// reprobeText is the light parity check: tokenized by the engine and by the gateway, it must give the
// same ids. It mixes the things that most often differ (BOS, digits, whitespace runs, non-ASCII).
const reprobeText = "kvexact re-probe: 12345 tokens,  two  spaces\tand tab — déjà vu 東京 🙂"

// reprobe checks, for every endpoint KV-exact may use, that the engine still is what was certified:
// its /version maps to the same contract, it serves the model, and (where the family can tokenize
// over HTTP) it tokenizes a probe text to the gateway's ids. A failure fences the endpoint from
// KV-exact (the other tiers still use it) until a later re-probe passes.
func (g *Gateway) reprobe(ctx context.Context, hc *http.Client) {
	g.mu.RLock()
	rts := make([]*ruleRuntime, 0, len(g.runtimes))
	for _, rt := range g.runtimes {
		rts = append(rts, rt)
	}
	g.mu.RUnlock()
	for _, rt := range rts {
		if !rt.exact.Enabled {
			continue
		}
		for i, e := range rt.eps {
			if rt.exact.Endpoints[e.Name] == "" || !isCertified(rt.exact.Endpoints[e.Name]) {
				continue
			}
			x := rt.epExact[i]
			if ew := rt.watches[e.Name]; ew != nil {
				g.probeProcess(ctx, ew)
			}
			why, version := g.probeOnce(ctx, hc, rt, e)
			if ew := rt.watches[e.Name]; ew != nil {
				if changed := ew.proc.checkVersion(version); changed != "" {
					ew.newProcess(changed)
				}
			}
			if why != "" {
				x.apply(exactness.Evidence{Type: exactness.ReprobeFailed, Detail: why})
			} else {
				x.apply(exactness.Evidence{Type: exactness.ReprobePassed})
			}
			// Each re-probe also samples the verification probes: a template or tokenizer that
			// drifted without a restart is seen within one interval.
			g.startVerifyProbes(x)
		}
	}
}

func isCertified(s string) bool { return len(s) >= 9 && s[:9] == "certified" }

// probeOnce returns why the endpoint no longer matches ("" when it does), and the /version it
// reported ("" when unknown). A transport error is not a parity failure (health handles it), so it
// does not fence.
func (g *Gateway) probeOnce(ctx context.Context, hc *http.Client, rt *ruleRuntime, e *route.Endpoint) (string, string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	p, err := registry.NewProber(rt.contract.Family, e.Address, hc)
	if err != nil {
		return err.Error(), ""
	}
	v, err := p.Version(ctx)
	if err != nil {
		return "", ""
	}
	ct, err := contracts.Lookup(rt.contract.Family, v)
	if err != nil {
		return fmt.Sprintf("engine now reports version %q: %v", v, err), v
	}
	if ct.ID != rt.contract.ID {
		return fmt.Sprintf("engine now reports version %q (contract %s), certified under %s", v, ct.ID, rt.contract.ID), v
	}
	model := rt.rule.Models[0]
	if models, err := p.Models(ctx); err == nil && !slices.Contains(models, model) {
		return fmt.Sprintf("engine no longer serves model %q (serves %v)", model, models), v
	}
	tok, err := g.pool.Get(model)
	if err != nil {
		return "gateway tokenizer: " + err.Error(), v
	}
	want, err := tok.Encode(reprobeText, true)
	if err != nil {
		return "gateway tokenizer: " + err.Error(), v
	}
	got, err := p.Tokenize(ctx, model, reprobeText, true)
	if err != nil {
		return "", v // no tokenize endpoint (TensorRT-LLM) or not reachable: nothing to compare
	}
	if !slices.Equal(got, want) {
		return fmt.Sprintf("engine tokenizes the probe text to %d ids, the gateway to %d (first differing index %d): the tokenizer changed", len(got), len(want), firstDiff(got, want)), v
	}
	return "", v
}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// runReprobe re-probes every interval until ctx ends.
func (g *Gateway) runReprobe(ctx context.Context, interval time.Duration) {
	hc := &http.Client{Transport: g.transport()}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.reprobe(ctx, hc)
		}
	}
}
