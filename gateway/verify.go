package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/route"
)

// The verification probes are the evidence for the legs the live parity watch cannot see. That
// watch re-hashes the token ids the engine's own events carry, so a chat template or tokenizer
// that changed with a restart is invisible to it. A probe is a request whose keys the gateway
// computes itself — a completion, and a chat rendered with the certified template — sent straight
// to the engine (one output token); its deepest full block must then appear among the blocks the
// endpoint publishes (the engine binding: the engine hashed the same tokens with the same binding;
// the router binding: the engine's tokens reproduce ours). As with the token check (tokencheck.go):
//   - resident: reproduced;
//   - absent while the engine stored blocks in that window and removed, evicted or cleared none:
//     it stored something, not our prompt — not reproduced, which suspends the endpoint naming the
//     kind's leg (chat: the chat template; completion: tokenizer, block size or hash);
//   - anything else is inconclusive and retried.
// A round runs after every restart (the Restart hold lifts only once every configured kind is
// reproduced) and with every periodic re-probe (sampling drift without a restart).

// verifyAttempts bounds the probe rounds after a restart whose probes stay inconclusive; the next
// periodic re-probe starts a new round.
const verifyAttempts = 5

// verifyWaitMax bounds how long a restart's round waits, beyond its attempts, for an engine that
// does not answer its probes yet: a restarted engine's event stream (which raised the hold) is
// often up long before its HTTP server (vLLM binds its publisher while its API server still
// starts; loading a large model takes minutes), and a round spent on refused connections would
// leave KV-exact off until the next periodic re-probe.
const verifyWaitMax = 10 * time.Minute

// ProbeStatus is the verification probes' account on an endpoint in /admin/status.
type ProbeStatus struct {
	Sent          uint64    `json:"sent"`
	Reproduced    uint64    `json:"reproduced"`
	NotReproduced uint64    `json:"not_reproduced"`
	Inconclusive  uint64    `json:"inconclusive"`
	LastProbe     time.Time `json:"last_probe,omitzero"`
	// LastResult says what the last probe of each kind found.
	LastResult map[exactness.Kind]string `json:"last_result,omitempty"`
}

// verifyConfig is what an endpoint's restart verification needs: the live parity watch's blocks
// where it runs, and the probes the rule's keyer can compute.
func (g *Gateway) verifyConfig(rt *ruleRuntime, i int) exactness.Config {
	var cfg exactness.Config
	if !rt.exact.Enabled || rt.keyer == nil {
		return cfg
	}
	e := rt.rule.Endpoints[i]
	events := rt.contract.HasEvents() && rt.binding != "none" && (len(e.Events.ZMQ) > 0 || e.Events.Drain != "")
	if !events {
		return cfg // nothing published to find a probe in
	}
	if rt.binding == "engine" && rt.keyer.Hasher != nil {
		cfg.ParityBlocks = g.opts.ResumeAfterBlocks
		if cfg.ParityBlocks <= 0 {
			cfg.ParityBlocks = DefaultResumeAfterBlocks
		}
	}
	for _, k := range []exactness.Kind{exactness.Completion, exactness.Chat} {
		if _, _, ok := probeRequest(rt, k, "config"); ok {
			cfg.Probes = append(cfg.Probes, k)
		}
	}
	return cfg
}

// probeRequest builds a probe of kind with a nonce (so no cached block answers it) and returns its
// body, its keyed request and whether the gateway can key it.
func probeRequest(rt *ruleRuntime, kind exactness.Kind, nonce string) ([]byte, *route.Request, bool) {
	if len(rt.rule.Models) == 0 || rt.keyer == nil {
		return nil, nil, false
	}
	model := rt.rule.Models[0]
	var b strings.Builder
	fmt.Fprintf(&b, "kvexact verification probe %s.", nonce)
	words := []string{"river", "stone", "lantern", "orchard", "copper", "meadow", "signal", "harbor"}
	for i := range 6 * max(rt.rule.BlockSize, 16) {
		b.WriteString(" " + words[i%len(words)])
	}
	text := b.String()
	rr := &route.Request{Model: model, Chat: kind == exactness.Chat}
	var body []byte
	if kind == exactness.Chat {
		body, _ = json.Marshal(map[string]any{"model": model, "max_tokens": 1, "messages": []map[string]string{{"role": "user", "content": text}}})
	} else {
		body, _ = json.Marshal(map[string]any{"model": model, "max_tokens": 1, "prompt": text})
		rr.Prompt = text
	}
	rr.Body = body
	keys, _, miss, _ := rt.keyer.Keys(context.Background(), rr)
	return body, rr, miss == route.MissNone && len(keys) >= 2
}

// startVerifyProbes starts a probe round on the endpoint unless one runs.
func (g *Gateway) startVerifyProbes(x *endpointExact) {
	rt, ok := g.runtime(x.rule)
	if !ok || rt.exactOf(x.name) != x || g.ctx == nil {
		return
	}
	x.mu.Lock()
	kinds := x.sm.Config().Probes
	if x.probing || len(kinds) == 0 || !x.sm.Certified() {
		x.mu.Unlock()
		return
	}
	x.probing = true
	x.mu.Unlock()
	go func() {
		defer func() {
			x.mu.Lock()
			x.probing = false
			x.mu.Unlock()
		}()
		g.verifyRound(g.ctx, rt, x, kinds)
	}()
}

// verifyRound re-probes the endpoint's identity (a restart's evidence for the router binding),
// then probes each kind until every one is conclusive or verifyAttempts rounds passed.
func (g *Gateway) verifyRound(ctx context.Context, rt *ruleRuntime, x *endpointExact, kinds []exactness.Kind) {
	hc := &http.Client{Transport: g.transport()}
	if x.held(exactness.Restart) {
		if why, _ := g.probeOnce(ctx, hc, rt, x.endpoint()); why != "" {
			x.apply(exactness.Evidence{Type: exactness.ReprobeFailed, Detail: why})
		} else {
			x.apply(exactness.Evidence{Type: exactness.ReprobePassed})
		}
	}
	grace := g.opts.TokenCheckGrace
	if grace <= 0 {
		grace = DefaultTokenCheckGrace
	}
	pending := append([]exactness.Kind(nil), kinds...)
	// A probe whose block is missing while other blocks arrived is conclusive only when a second
	// probe of the same kind misses too: one store can be lost on its way (a subscription that
	// reconnects as the engine restarts misses what was published before it joined), and one lost
	// message must not read as a template or tokenizer that changed.
	missed := map[exactness.Kind]bool{}
	// A round the engine answered none of (it is not serving yet) uses up no attempt while the
	// restart holds the endpoint and verifyWaitMax has not passed; it still waits a grace before
	// the next, since a refused connection returns at once.
	waitUntil := time.Now().Add(verifyWaitMax)
	for round, used := 0, 0; used < verifyAttempts && len(pending) > 0; round++ {
		if round > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(grace):
			}
		}
		var left []exactness.Kind
		answered := false
		for _, k := range pending {
			ev, conclusive, ans := g.probeKind(ctx, hc, rt, x, k, grace)
			answered = answered || ans
			if conclusive && ev.Type == exactness.ProbeNotReproduced && !missed[k] {
				missed[k], conclusive = true, false
			}
			if conclusive {
				x.apply(ev)
			} else {
				left = append(left, k)
			}
		}
		pending = left
		waiting := !answered && len(pending) > 0 && x.held(exactness.Restart) && time.Now().Before(waitUntil)
		if !waiting {
			used++
		}
	}
	g.probeForParity(ctx, hc, rt, x, kinds, grace)
}

// probeForParity sends completion probes (each with its own nonce) while the restart
// verification lacks only the parity watch's blocks. The kinds' probes hold a few blocks each,
// fewer than the watch may need; the rest would have to come from client traffic, and KV-exact
// sends a fenced endpoint none — an endpoint that no miss happens to reach would stay fenced.
// At most enough probes for the count (each holds at least probeBlocks full blocks), plus one.
func (g *Gateway) probeForParity(ctx context.Context, hc *http.Client, rt *ruleRuntime, x *endpointExact, kinds []exactness.Kind, grace time.Duration) {
	kind := kinds[0]
	if slices.Contains(kinds, exactness.Completion) {
		kind = exactness.Completion
	}
	for i := 0; ; i++ {
		x.mu.Lock()
		v, verifying := x.sm.Verification()
		short := verifying && v.ParityBlocks < v.ParityNeeded && len(x.sm.Holds()) == 1
		x.mu.Unlock()
		if !short || i > v.ParityNeeded/probeBlocks || ctx.Err() != nil {
			return
		}
		ev, conclusive, _ := g.probeKind(ctx, hc, rt, x, kind, grace)
		if !conclusive || ev.Type != exactness.ProbeReproduced {
			return // a missing block is the kinds' round's to judge, not this count's
		}
		x.apply(ev)
	}
}

// probeBlocks is the fewest full blocks a verification probe holds: its text is 6 × block size
// words, each at least one token.
const probeBlocks = 6

// probeKind sends one probe of kind and waits up to grace for its deepest full block; it returns
// the evidence, whether it is conclusive, and whether the engine served the probe (false: no
// answer, or a 502, 503 or 504 — an engine still starting or not reachable).
func (g *Gateway) probeKind(ctx context.Context, hc *http.Client, rt *ruleRuntime, x *endpointExact, kind exactness.Kind, grace time.Duration) (ev exactness.Evidence, conclusive, answered bool) {
	var nb [6]byte
	_, _ = rand.Read(nb[:])
	body, rr, ok := probeRequest(rt, kind, hex.EncodeToString(nb[:]))
	if !ok {
		return exactness.Evidence{}, false, true
	}
	keys, n, _, _ := rt.keyer.Keys(ctx, rr)
	depth := len(keys)
	if bs := rt.rule.BlockSize; bs > 0 && n%bs == 0 {
		depth-- // a prompt of whole blocks: the engine may keep its last one uncached
	}
	last := keys[depth-1]
	id := x.endpoint().ID
	before, _ := endpointCounters(rt.index, id)
	sent := x.now()
	path := "/v1/completions"
	if kind == exactness.Chat {
		path = "/v1/chat/completions"
	}
	result := func(s string, counter *uint64) {
		x.mu.Lock()
		x.probes.Sent++
		*counter++
		x.probes.LastProbe = sent
		if x.probes.LastResult == nil {
			x.probes.LastResult = map[exactness.Kind]string{}
		}
		x.probes.LastResult[kind] = s
		x.mu.Unlock()
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, strings.TrimRight(x.addr, "/")+path, bytes.NewReader(body))
	if err != nil {
		return exactness.Evidence{}, false, true
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		result("inconclusive: the engine did not answer the probe: "+err.Error(), &x.probes.Inconclusive)
		return exactness.Evidence{}, false, false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		result(fmt.Sprintf("inconclusive: the engine answered the probe with HTTP %d", resp.StatusCode), &x.probes.Inconclusive)
		unavailable := resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusServiceUnavailable ||
			resp.StatusCode == http.StatusGatewayTimeout
		return exactness.Evidence{}, false, !unavailable
	}
	deadline := time.Now().Add(grace)
	for {
		if rt.holder(id, last) != "" {
			result("reproduced", &x.probes.Reproduced)
			return exactness.Evidence{Type: exactness.ProbeReproduced, Kind: kind}, true, true
		}
		if !time.Now().Before(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return exactness.Evidence{}, false, true
		case <-time.After(20 * time.Millisecond):
		}
	}
	after, ok := endpointCounters(rt.index, id)
	if !ok || after.Stored == before.Stored || after.Removed != before.Removed || after.UnknownRemoves != before.UnknownRemoves ||
		after.Retirements != before.Retirements || after.Clears != before.Clears {
		result(fmt.Sprintf("inconclusive: the endpoint published no block the gateway could key within %s, or removed some (block size, event stream, or eviction)", grace), &x.probes.Inconclusive)
		return exactness.Evidence{}, false, true
	}
	leg := "the tokenizer, block size or hash binding"
	if kind == exactness.Chat {
		leg = "the chat template (or the tokenizer)"
	}
	detail := fmt.Sprintf("a %d-token %s probe sent at %s: its block %d (key %016x) is not among the %d blocks the engine stored within %s — %s no longer matches the certified one",
		n, kind, sent.UTC().Format(time.RFC3339), depth, last, after.Stored-before.Stored, grace, leg)
	result("not reproduced: "+detail, &x.probes.NotReproduced)
	return exactness.Evidence{Type: exactness.ProbeNotReproduced, Kind: kind, Detail: detail}, true, true
}
