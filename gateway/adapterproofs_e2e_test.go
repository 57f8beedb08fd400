package gateway_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/promtest"
)

// probeGate stands in front of a simulator, counts the gateway's probe requests (tagged with
// gateway.AdmissionUserAgent) and, while refuse is set, answers them 503; every other request is
// the simulator's.
func probeGate(t *testing.T, target string, refuse *atomic.Bool, probes *atomic.Int64) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("User-Agent") == gateway.AdmissionUserAgent {
			probes.Add(1)
			if refuse.Load() {
				http.Error(w, "probe refused by the test", http.StatusServiceUnavailable)
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// adapterExclusion is how the router scores endpoint ep for a request: its exclusion ("" when
// eligible), or the decision's miss and reason when KV-exact scored no endpoint.
func adapterExclusion(t *testing.T, p *pool, ep string, body map[string]any) (excluded string, eligible bool) {
	t.Helper()
	rt, _ := p.g.Router("pool")
	d, err := rt.Explain(t.Context(), explainReq(t, body))
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range d.Endpoints {
		if ev.Name == ep {
			return ev.Excluded, ev.Eligible
		}
	}
	return string(d.Miss) + ": " + d.Reason, false
}

// TestE2EDiscoveredAdapterProbedBeforeCounted: the certificate records the adapters e0 proved
// (none); the rule discovers sql-lora from e0's /v1/models. The gateway probes it with ctk's
// adapter spec before KV-exact counts it: while the probe is refused, /admin/status says refused
// with the reason and the adapter's requests are not KV-exact on e0 (adapter_uncertified); once a
// probe passes, status says proved, the LoRA name joins e0's proven adapters and the adapter's
// follow-up is a KV-exact hit on e0. After the engine restarts the proof is the old process's: the
// adapter stops counting until a probe of the new process proves it again. Under a certificate entry without an adapter list nothing is
// probed and the adapter counts at once, as such certificates always meant.
func TestE2EDiscoveredAdapterProbedBeforeCounted(t *testing.T) {
	lora := func(i int, c *sim.Config) { c.LoRAModules = []string{"sql-lora=/adapters/sql"} }
	timings := func(o *gateway.Options) {
		o.AdmissionBackoff, o.AdmissionEventTimeout = 200*time.Millisecond, 2*time.Second
	}
	doc := docs(1)[0]
	follow := map[string]any{"model": "sql-lora", "prompt": doc + " And a follow-up question?", "max_tokens": 2}

	var refuse atomic.Bool
	var probes atomic.Int64
	refuse.Store(true)
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3, certify: true, reprobe: 100 * time.Millisecond, replay: true,
		certAdapters: func(int) *[]string { return &[]string{} }, simMod: lora, gwMod: timings,
		ruleMod: func(r *rules.Rule) {
			r.DiscoverAdapters = true
			r.Endpoints[0].Address = probeGate(t, r.Endpoints[0].Address, &refuse, &probes)
		}})
	eventually(t, 15*time.Second, "the gateway to list the discovered adapter", func() bool { return p.listsAdapter("sql-lora") })
	st := waitStatus(t, p, "e0", "a refused adapter probe", 15*time.Second, func(e gateway.EndpointStatus) bool {
		return len(e.AdapterProbes) == 1 && e.AdapterProbes[0].LoRAName == "sql-lora" && e.AdapterProbes[0].State == "refused" && e.AdapterProbes[0].Reason != ""
	})
	if st.ProvenAdapters == nil || slices.Contains(*st.ProvenAdapters, "sql-lora") {
		t.Fatalf("refused adapter among e0's proven adapters: %v", st.ProvenAdapters)
	}
	if ex, ok := adapterExclusion(t, p, "e0", follow); ok || !strings.HasPrefix(ex, route.ExcludedAdapterUncertified+":") || !strings.Contains(ex, `"sql-lora"`) || !strings.Contains(ex, "adapter_probes") {
		t.Fatalf("unproven discovered adapter: e0 eligible %v, excluded %q; want %s", ok, ex, route.ExcludedAdapterUncertified)
	}
	c := p.send("/v1/completions", follow)
	var dec struct{ Miss, Tier string }
	if err := json.Unmarshal([]byte(c.decision), &dec); err != nil || c.status != 200 || dec.Miss != string(route.MissAdapterUncertified) {
		t.Fatalf("unproven discovered adapter: %d, decision %s; want miss %s", c.status, c.decision, route.MissAdapterUncertified)
	}

	refuse.Store(false)
	st = waitStatus(t, p, "e0", "the adapter proved by probe", 20*time.Second, func(e gateway.EndpointStatus) bool {
		return len(e.AdapterProbes) == 1 && e.AdapterProbes[0].State == "proved" && e.ProvenAdapters != nil && slices.Contains(*e.ProvenAdapters, "sql-lora")
	})
	probeCount := func(result string) float64 {
		return promtest.Value(t, p.reg, "kvexact_adapter_probes_total", map[string]string{"rule": "pool", "result": result})
	}
	if probeCount("proved") != 1 || probeCount("refused") < 1 {
		t.Fatalf("kvexact_adapter_probes_total: proved %v, refused %v; want 1 and at least 1", probeCount("proved"), probeCount("refused"))
	}
	eventually(t, 10*time.Second, "e0 eligible for the proven adapter", func() bool { _, ok := adapterExclusion(t, p, "e0", follow); return ok })
	p.direct(0, map[string]any{"model": "sql-lora", "prompt": doc, "max_tokens": 1})
	eventually(t, 15*time.Second, "the adapter's blocks in the inventory", func() bool { return p.explainOverlap("/v1/completions", follow)["e0"] > 0 })
	if c := p.send("/v1/completions", follow); c.status != 200 || c.endpoint != "e0" || c.cached <= 0 || !strings.Contains(c.decision, `"tier":"kv-exact"`) {
		t.Fatalf("proven adapter: %d on %s, cached %d, decision %s; want a KV-exact hit on e0", c.status, c.endpoint, c.cached, c.decision)
	}

	// The engine restarts: what the gateway proved was the old process's. The adapter stops
	// counting and is probed again (refused while the gate refuses), then proved anew.
	refuse.Store(true)
	if err := p.sims[0].RestartPublisher(true); err != nil {
		t.Fatal(err)
	}
	st = waitStatus(t, p, "e0", "the adapter probed again after the restart", 20*time.Second, func(e gateway.EndpointStatus) bool {
		return len(e.AdapterProbes) == 1 && e.AdapterProbes[0].State == "refused"
	})
	if st.Exact == nil || st.Exact.Restarts < 1 || st.ProvenAdapters == nil || slices.Contains(*st.ProvenAdapters, "sql-lora") {
		t.Fatalf("after the engine restart: exactness %+v, proven adapters %v; want the restart seen and sql-lora no longer proven", st.Exact, st.ProvenAdapters)
	}
	refuse.Store(false)
	waitStatus(t, p, "e0", "the adapter proved again", 20*time.Second, func(e gateway.EndpointStatus) bool {
		return len(e.AdapterProbes) == 1 && e.AdapterProbes[0].State == "proved" && e.ProvenAdapters != nil && slices.Contains(*e.ProvenAdapters, "sql-lora")
	})
	if probeCount("proved") != 2 {
		t.Fatalf("kvexact_adapter_probes_total{result=proved} %v after the restart, want 2", probeCount("proved"))
	}
	eventually(t, 10*time.Second, "e0 eligible again for the re-proven adapter", func() bool { _, ok := adapterExclusion(t, p, "e0", follow); return ok })

	// No adapter list in the certificate entry: no probe, the adapter counts as it always did.
	var never atomic.Bool
	var unlisted atomic.Int64
	q := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3, certify: true, reprobe: 100 * time.Millisecond,
		simMod: lora, gwMod: timings,
		ruleMod: func(r *rules.Rule) {
			r.DiscoverAdapters = true
			r.Endpoints[0].Address = probeGate(t, r.Endpoints[0].Address, &never, &unlisted)
		}})
	eventually(t, 15*time.Second, "the gateway to list the discovered adapter", func() bool { return q.listsAdapter("sql-lora") })
	if _, ok := adapterExclusion(t, q, "e0", follow); !ok {
		t.Fatal("a certificate entry without an adapter list restricts the discovered adapter")
	}
	time.Sleep(300 * time.Millisecond) // a few discovery rounds
	if st, _ := statusOf(q, "e0"); unlisted.Load() != 0 || st.AdapterProbes != nil || st.ProvenAdapters != nil {
		t.Fatalf("certificate without adapter lists: %d probe requests, status %+v", unlisted.Load(), st)
	}
}

// TestE2EAdmittedEndpointRecordsAdapters: an endpoint admitted by probe under a rule declaring
// sql-lora records the adapters its probe proved, as a listed endpoint's certificate entry does.
func TestE2EAdmittedEndpointRecordsAdapters(t *testing.T) {
	lora := func(c *sim.Config) { c.LoRAModules = []string{"sql-lora=/adapters/sql"} }
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3, certify: true, certFile: true,
		certAdapters: func(int) *[]string { return &[]string{"sql-lora"} },
		certMod:      admitPolicy,
		simMod:       func(i int, c *sim.Config) { lora(c) },
		gwMod: func(o *gateway.Options) {
			o.AdmissionBackoff, o.AdmissionEventTimeout = 200*time.Millisecond, 2*time.Second
		},
		ruleMod: func(r *rules.Rule) { r.Adapters = []rules.Adapter{{Name: "sql-lora"}} }})
	r, _ := p.g.Store().Get("pool")
	e1 := extraSim(t, "e1", lora)
	putEndpoints(t, p, r.Endpoints[0], ruleEndpoint("e1", e1))
	st := waitStatus(t, p, "e1", "admitted", 30*time.Second, admitted)
	if st.ProvenAdapters == nil || !slices.Equal(*st.ProvenAdapters, []string{"sql-lora"}) {
		t.Fatalf("admitted e1's proven adapters: %v, want [sql-lora]", st.ProvenAdapters)
	}
	if s0, _ := statusOf(p, "e0"); s0.ProvenAdapters == nil || !slices.Equal(*s0.ProvenAdapters, []string{"sql-lora"}) {
		t.Fatalf("listed e0's proven adapters: %v", s0.ProvenAdapters)
	}
}
