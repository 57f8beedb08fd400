package ctk

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/hashcore"
)

// LoRA adapter certification: one probe completion through one adapter per endpoint, whose stored
// blocks must carry the keys the gateway computes for an adapter request (the base model's tokens,
// the adapter's LoRA name in every block's extra keys, as vLLM hashes them).

// LegLoRA names an adapter whose blocks the engine keys with another LoRA name than the pool's (or
// with none, or an adapter the endpoint does not serve).
const LegLoRA = "lora"

const idLoRA = "lora"

// Adapter is a LoRA adapter the pool serves, as the rule declares it (rules.Adapter).
type Adapter struct {
	// Name is the model name clients request for the adapter (its id in the engine's /v1/models).
	Name string `yaml:"name" json:"name"`
	// LoRAName is the name the gateway hashes for it (the rule's loraName). Default: Name.
	LoRAName string `yaml:"loraName" json:"loraName,omitempty"`
	// LoRAPath is the adapter's path on the engine (the rule's loraPath), which vLLM v0.31.0+ hashes
	// beside the name. Discovered adapters take the root their endpoint lists.
	LoRAPath string `yaml:"loraPath" json:"loraPath,omitempty"`
}

// maxModelsAnswer bounds the /v1/models answer read to discover adapters.
const maxModelsAnswer = 4 << 20

// normalizeAdapters fills the adapters' defaults and checks their names.
func (p *Pool) normalizeAdapters() error {
	for i := range p.Adapters {
		a := &p.Adapters[i]
		if strings.TrimSpace(a.Name) == "" || strings.ContainsAny(a.Name, " \t\r\n") {
			return fieldErr(fmt.Sprintf("adapters[%d].name", i), "required, without spaces")
		}
		if a.Name == p.Model {
			return fieldErr(fmt.Sprintf("adapters[%d].name", i), "%q is the pool's model", a.Name)
		}
		if a.LoRAName == "" {
			a.LoRAName = a.Name
		}
	}
	return nil
}

// maxProbedAdapters bounds the adapters probed per endpoint when they are discovered (each is one
// completion and an event wait); declared adapters are all probed.
const maxProbedAdapters = 8

// loraAdapters picks the adapters to probe: every one the pool declares (which the endpoint must
// list, where its /v1/models answers), else with discoverAdapters the ones the endpoint lists with
// the pool's model as parent (at most maxProbedAdapters). skip says why there is none to probe;
// fail why the endpoint does not serve a declared one.
func (r *endpointRun) loraAdapters(ctx context.Context) (as []Adapter, skip, fail string) {
	listed, roots, err := r.listedAdapters(ctx)
	if len(r.pool.Adapters) > 0 {
		for _, a := range r.pool.Adapters {
			if _, ok := roots[a.Name]; err == nil && !ok {
				return nil, "", fmt.Sprintf("the endpoint does not serve adapter %q of %s: its /v1/models lists adapters %v", a.Name, r.pool.Model, listed)
			}
		}
		return r.pool.Adapters, "", ""
	}
	if !r.pool.DiscoverAdapters {
		return nil, "the pool declares no adapter (adapters) and does not discover them (discoverAdapters)", ""
	}
	if err != nil {
		return nil, "", fmt.Sprintf("adapters cannot be discovered: %v", err)
	}
	if len(listed) == 0 {
		return nil, fmt.Sprintf("the endpoint lists no adapter of %s in /v1/models", r.pool.Model), ""
	}
	for _, n := range listed[:min(len(listed), maxProbedAdapters)] {
		as = append(as, Adapter{Name: n, LoRAName: n, LoRAPath: roots[n]})
	}
	return as, "", ""
}

// listedAdapters reads the endpoint's /v1/models: the ids listed with the pool's model as parent,
// and each one's root (the adapter's path on the engine).
func (r *endpointRun) listedAdapters(ctx context.Context) ([]string, map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(r.ep.Address, "/")+"/v1/models", nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxModelsAnswer+1))
	if err != nil || resp.StatusCode != http.StatusOK || len(b) > maxModelsAnswer {
		return nil, nil, fmt.Errorf("GET /v1/models: status %d, %d bytes (%v)", resp.StatusCode, len(b), err)
	}
	var v struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
			Root   string  `json:"root"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	var ids []string
	roots := map[string]string{}
	for _, m := range v.Data {
		if _, dup := roots[m.ID]; m.Parent != nil && *m.Parent == r.pool.Model && m.ID != "" && !dup {
			ids = append(ids, m.ID)
			roots[m.ID] = m.Root
		}
	}
	return ids, roots, nil
}

// specLoRA probes every adapter loraAdapters picks; the LoRA names proven go into the endpoint's
// certificate entry (r.provedLoRA), so the gateway routes KV-exact only the adapters proven.
func (r *endpointRun) specLoRA(t *T) {
	ctx := t.Context()
	fam := r.family()
	if !fam.KeyRules().BlockExtras {
		t.Skipf("%s does not key blocks by LoRA adapter for the gateway: adapter requests are routed with miss lora", r.ep.Family)
		return
	}
	as, skip, fail := r.loraAdapters(ctx)
	switch {
	case fail != "":
		t.Failf(LegLoRA, fmt.Sprintf("load the adapter on the engine (%s %s) or remove it from the pool's and the rule's adapters", fam.Display(), fam.Hint(engines.HintLoRALoad)), "%s", fail)
		return
	case skip != "":
		t.Skipf("%s", skip)
		return
	}
	if !r.needProbe(t) {
		return
	}
	if p := r.probe; !p.covered || p.bs != r.st.BlockSize {
		t.Skipf("not comparable: the base model's probe differs already (see the token and block-size specs)")
		return
	}
	var proved, msgs []string
	for _, a := range as {
		if !r.probeAdapter(t, a) {
			return
		}
		proved = append(proved, a.LoRAName)
		msgs = append(msgs, t.res.Message)
	}
	r.provedLoRA = proved
	t.Passf("%s", strings.Join(msgs, "; "))
}

// probeAdapter sends one probe completion through adapter a and checks its stored blocks' keys;
// true when they carry a's LoRA name as the gateway hashes it.
func (r *endpointRun) probeAdapter(t *T, a Adapter) bool {
	ctx := t.Context()
	prompt, want, err := r.newProbePrompt(r.st.BlockSize)
	if err != nil {
		t.Failf(LegTokenizer, tokenizerHint, "adapter probe prompt: %v", err)
		return false
	}
	w := r.w
	lp := &probeOutcome{prompt: prompt, want: want, sentAt: w.count(), nonce: probeNonce(prompt)}
	if _, err := r.pr.Complete(ctx, engines.CompletionRequest{Model: a.Name, Prompt: prompt, MaxTokens: 1}); err != nil {
		t.Failf(LegLoRA, "the engine must serve a one-token completion through the adapter", "probe completion through adapter %q: %v", a.Name, err)
		return false
	}
	w.waitFor(ctx, r.opts.EventTimeout, func() bool {
		lp.analyze(w.events[lp.sentAt:], r.tok)
		return lp.covered
	})
	evs, _ := w.snapshot()
	lp.analyze(evs[lp.sentAt:], r.tok)
	if len(lp.blocks) == 0 {
		t.Skipf("not comparable: no stored block of the adapter probe arrived within %s (see the events and sequence specs)", r.opts.EventTimeout)
		return false
	}
	names := map[string]bool{}
	for _, al := range lp.aligned {
		names[al.ev.LoRAName] = true
	}
	delete(names, a.LoRAName)
	var other string
	for n := range names {
		other = n
	}
	ct := r.st.Contract
	hint := func(n string) string {
		h := fmt.Sprintf("set loraName: %q for adapter %q in the pool and the rule (%s hashes the served adapter name)", n, a.Name, r.family().Display())
		if ct.TaggedExtraKeys() {
			h += fmt.Sprintf(", and loraPath (now %q) to the path the engine lists as the adapter's root in /v1/models (this release hashes it too)", a.LoRAPath)
		}
		return h
	}
	seed, seedErr := ct.EngineSeed(r.st.Algorithm, r.st.Seed)
	if ct.SupportsBinding("engine") && r.st.Binding != "router" && seedErr == nil {
		keysWith := func(lora string) []uint64 {
			h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.Algorithm(r.st.Algorithm), BlockSize: r.st.BlockSize, Seed: seed}, hashcore.Default())
			if err != nil {
				return nil
			}
			var ex *hashcore.Extras
			if lora != "" {
				ex = &hashcore.Extras{LoRAName: lora, LoRAPath: a.LoRAPath, Tagged: ct.TaggedExtraKeys()}
			}
			k, _ := h.Keys(lp.want, ex, nil)
			return k
		}
		ok, why := lp.keysMatch(keysWith(a.LoRAName))
		if ok {
			t.Passf("adapter %q: %d block keys equal with LoRA name %q", a.Name, len(lp.blocks), a.LoRAName)
			return true
		}
		if other != "" {
			if ok, _ := lp.keysMatch(keysWith(other)); ok {
				t.Failf(LegLoRA, hint(other), "adapter %q: the engine hashes LoRA name %q, the pool %q (%s)", a.Name, other, a.LoRAName, why)
				return false
			}
		}
		if ok, _ := lp.keysMatch(keysWith("")); ok {
			t.Failf(LegLoRA, fmt.Sprintf("check that the engine serves the adapter (%s %s): its blocks equal the base model's", r.family().Display(), r.family().Hint(engines.HintLoRAServe)), "adapter %q: the engine's keys carry no LoRA name (%s)", a.Name, why)
			return false
		}
		t.Failf(LegLoRA, hint(a.LoRAName), "adapter %q: no LoRA name reproduces the engine's keys: %s", a.Name, why)
		return false
	}
	// Router binding: the gateway rehashes event tokens under the events' lora_name, so that name
	// must be the one adapter requests are hashed with.
	if other != "" {
		t.Failf(LegLoRA, hint(other), "adapter %q: the engine's events carry lora_name %q, the pool hashes %q", a.Name, other, a.LoRAName)
		return false
	}
	t.Passf("adapter %q: %d stored blocks carry lora_name %q", a.Name, len(lp.blocks), a.LoRAName)
	return true
}
