package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

// LoRA adapter discovery (rules.Rule.DiscoverAdapters): every endpoint's /v1/models is read at start
// and on every re-probe; the adapters listed with a parent (vLLM's form: id = the served adapter
// name, which is also what it hashes, parent = the base model, root = the path it was given, which
// v0.31.0+ hashes too) become the router's discovered adapters. An endpoint that does not answer keeps its last list, so a restart or a network blip does
// not turn served adapters into 404s; one that answers without an adapter drops it, and requests for
// a discovered adapter go only to the endpoints that list it.

const (
	// maxModelsBody bounds an endpoint's /v1/models answer.
	maxModelsBody = 4 << 20
	// maxDiscoveredAdapters bounds the adapters one rule discovers (the rest are logged and ignored).
	maxDiscoveredAdapters = 4096
	// modelsTimeout bounds one endpoint's /v1/models read.
	modelsTimeout = 5 * time.Second
)

// adapterLists is what each endpoint last listed, by endpoint name.
type adapterLists struct {
	mu    sync.Mutex
	byEnd map[string][]rules.Adapter
}

// discoverAdapters reads every discovering rule's endpoints and updates its router.
func (g *Gateway) discoverAdapters(ctx context.Context, hc *http.Client) {
	g.mu.RLock()
	rts := make([]*ruleRuntime, 0, len(g.runtimes))
	for _, rt := range g.runtimes {
		if rt.rule.DiscoverAdapters {
			rts = append(rts, rt)
		}
	}
	g.mu.RUnlock()
	for _, rt := range rts {
		for _, e := range rt.eps {
			as, err := g.endpointAdapters(ctx, hc, rt.rule, e)
			if err != nil {
				g.log.Debug("adapter discovery: endpoint not read", "rule", rt.rule.Name, "endpoint", e.Name, "err", err)
				continue
			}
			rt.lora.mu.Lock()
			if rt.lora.byEnd == nil {
				rt.lora.byEnd = map[string][]rules.Adapter{}
			}
			rt.lora.byEnd[e.Name] = as
			rt.lora.mu.Unlock()
		}
		g.publishAdapters(rt)
		g.proveAdapters(ctx, rt)
	}
}

// publishAdapters gives the router the union of the endpoints' lists, sorted by name (the first
// endpoint listing a name decides its base model and path), and which endpoints list each. An
// endpoint listing the name with another path still serves it, but its blocks carry other keys
// than the ones the gateway computes (never a false hit, only no hit there): that is logged.
func (g *Gateway) publishAdapters(rt *ruleRuntime) {
	rt.lora.mu.Lock()
	seen := map[string]rules.Adapter{}
	listedBy := map[string][]string{}
	var out []rules.Adapter
	for _, e := range rt.eps {
		for _, a := range rt.lora.byEnd[e.Name] {
			if first, ok := seen[a.Name]; ok {
				if first != a {
					g.log.Warn("adapter discovery: endpoints list an adapter differently; KV-exact hashes the first listing, so the other endpoint gets no hit for it",
						"rule", rt.rule.Name, "adapter", a.Name, "endpoint", e.Name, "base", a.Base, "path", a.LoRAPath, "firstBase", first.Base, "firstPath", first.LoRAPath)
				}
				listedBy[a.Name] = append(listedBy[a.Name], e.Name)
				continue
			}
			if len(out) == maxDiscoveredAdapters {
				g.log.Warn("adapter discovery: too many adapters, the rest ignored", "rule", rt.rule.Name, "limit", maxDiscoveredAdapters)
				break
			}
			seen[a.Name] = a
			listedBy[a.Name] = append(listedBy[a.Name], e.Name)
			out = append(out, a)
		}
	}
	rt.lora.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	before := rt.router.DiscoveredAdapters()
	rt.router.SetDiscoveredAdapters(out, listedBy)
	if !sameAdapters(before, out) {
		names := make([]string, len(out))
		for i, a := range out {
			names[i] = a.Name
		}
		g.log.Info("adapter discovery: served adapters changed", "rule", rt.rule.Name, "adapters", names)
	}
}

func sameAdapters(a, b []rules.Adapter) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// endpointAdapters reads one endpoint's /v1/models and returns its valid adapters.
func (g *Gateway) endpointAdapters(ctx context.Context, hc *http.Client, r *rules.Rule, e *route.Endpoint) ([]rules.Adapter, error) {
	ctx, cancel := context.WithTimeout(ctx, modelsTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.Address+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/models: status %d", resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxModelsBody+1))
	if err != nil {
		return nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	if len(b) > maxModelsBody {
		return nil, fmt.Errorf("GET /v1/models: body over %d bytes", maxModelsBody)
	}
	var v struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
			Root   string  `json:"root"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	var out []rules.Adapter
	for i, m := range v.Data {
		if m.Parent == nil || *m.Parent == "" { // a base model (vLLM: parent null)
			continue
		}
		a, err := r.DiscoveredAdapter(m.ID, *m.Parent, m.Root)
		if err != nil {
			g.log.Warn("adapter discovery: listed adapter ignored", "rule", r.Name, "endpoint", e.Name, "field", fmt.Sprintf("data[%d]", i), "err", err)
			continue
		}
		out = append(out, a)
	}
	return out, nil
}

// carryAdapters hands a rebuilt runtime what the previous one discovered for the endpoints both
// have (same name and address), re-checked against the new rule, so a rule change does not leave
// the adapters unserved until the next re-probe.
func (g *Gateway) carryAdapters(old, rt *ruleRuntime) {
	if old == nil || !rt.rule.DiscoverAdapters {
		return
	}
	addr := map[string]string{}
	for _, e := range old.eps {
		addr[e.Name] = e.Address
	}
	old.lora.mu.Lock()
	prev := old.lora.byEnd
	old.lora.mu.Unlock()
	rt.lora.mu.Lock()
	rt.lora.byEnd = map[string][]rules.Adapter{}
	for _, e := range rt.eps {
		if addr[e.Name] != e.Address {
			continue
		}
		for _, a := range prev[e.Name] {
			if b, err := rt.rule.DiscoveredAdapter(a.Name, a.Base, a.LoRAPath); err == nil {
				rt.lora.byEnd[e.Name] = append(rt.lora.byEnd[e.Name], b)
			}
		}
	}
	rt.lora.mu.Unlock()
	g.publishAdapters(rt)
}

// runAdapterDiscovery discovers at once, then every interval (0: never again) until ctx ends.
func (g *Gateway) runAdapterDiscovery(ctx context.Context, interval time.Duration) {
	hc := &http.Client{Transport: g.transport()}
	g.discoverAdapters(ctx, hc)
	if interval <= 0 {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.discoverAdapters(ctx, hc)
		}
	}
}
