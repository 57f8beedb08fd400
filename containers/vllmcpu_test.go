package containers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvexact/kvexact/containers"
	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/rules"
)

// EnvContainersLong set to "long" adds the real-engine container scenarios that start the engine
// again (each start costs minutes on a small machine): make containers-long sets it.
const envContainersLong = "KVEXACT_CONTAINERS"

// vllmCPUKVBlocks is the engine's KV cache in blocks of 32 tokens: more than one 2048-token
// request needs, few enough that the scenarios' prompts stay far from eviction.
const vllmCPUKVBlocks = 256

// runVLLMCPU runs the container fault scenarios against ONE real vLLM engine (the CPU build of the
// pinned environment in the local image VLLMCPUImage, a tiny llama3 with dummy weights) on a
// bridge network of its own, and a simulated second endpoint of the same release and geometry,
// behind the gateway's container. Both are certified by ctk first, so the gateway's rule is
// KV-exact with engine binding. The scenarios run in order; those that start the engine again run
// only with KVEXACT_CONTAINERS=long (make containers-long).
func runVLLMCPU(t *testing.T, h *containers.Harness) {
	env, err := vllmpool.Find()
	switch {
	case errors.Is(err, vllmpool.ErrNoEnv):
		missingPeer(t, vllmpool.MissingEnvHint)
	case err != nil:
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	if !h.HasImage(ctx, containers.VLLMCPUImage) {
		missingPeer(t, containers.VLLMCPUImageHint)
	}
	unlock, err := env.Lock()
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const m = "llama3"
	model := filepath.Join(dir, m)
	if err := env.TinyModel(model, m, ""); err != nil {
		t.Fatal(err)
	}
	s := seed
	// The engine has a network of its own (ports published on the host's 127.0.0.1), so that its
	// link can be cut; removed after the containers (cleanups run last in, first out).
	nw, err := h.CreateNetwork(ctx, "vllm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nw.Remove(context.Background()); err != nil {
			t.Error(err)
		}
	})
	start := time.Now()
	e, desc, err := h.StartVLLMCPU(ctx, env, nw, vllmpool.Spec{Name: "E0", Model: model, Seed: &s, KVBlocks: vllmCPUKVBlocks}, 8*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vLLM container %s serving in %s", e.Name, time.Since(start).Round(time.Second))
	p := &pool{t: t, h: h, model: m, root: dir, engines: map[string]*containers.Engine{"E0": e}, names: []string{"E0"}, http: &http.Client{Timeout: 5 * time.Minute}}
	t.Cleanup(p.terminate)
	// Runs before terminate: the engine core's traceback is far above the tail terminate shows.
	t.Cleanup(func() { keepEngineLog(t, e) })
	// The second endpoint, where requests go while E0 is cut off or dead: the simulator of the same
	// release and geometry on the host's network, certified with E0 by the same ctk run.
	sim, err := h.StartEngineSim(ctx, containers.EngineSimSpec{Endpoint: "S1", Family: "vllm", Release: vllmpool.Release, Model: m,
		TokenizerRoot: dir, Seed: &s, Replay: true, Args: []string{"--block-size", fmt.Sprint(vllmpool.BlockSize), "--algo", "sha256",
			"--topic", "kv", "--capacity", fmt.Sprint(vllmCPUKVBlocks), "--decode-per-token", "1ms"}})
	if err != nil {
		t.Fatal(err)
	}
	p.engines["S1"], p.names = sim, append(p.names, "S1")
	simDesc := vllmpool.Describe(vllmpool.Spec{Name: "S1", Model: model, Port: sim.HTTPPort, EventsPort: sim.ZMQPort, ReplayPort: sim.ReplayPort}.Filled())

	prof := vllmpool.Profile{Model: m, Tokenizer: model, Seed: &s}
	descs := []*vllmpool.Engine{desc, simDesc}
	cp, err := vllmpool.Pool(prof, descs)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ctk.Certify(ctx, cp, ctk.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		var b strings.Builder
		res.WriteText(&b)
		t.Fatalf("ctk certify refused the containerized engine:\n%s", b.String())
	}
	certs := map[string][]byte{}
	for i, c := range res.Certificates {
		f := filepath.Join(t.TempDir(), "cert.json")
		if err := c.Write(f); err != nil {
			t.Fatal(err)
		}
		if certs[fmt.Sprintf("cert%d.json", i)], err = os.ReadFile(f); err != nil {
			t.Fatal(err)
		}
	}
	ports, err := containers.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	// No cold-start seeding: every KV-exact hit goes to its holder, so receipts are exact.
	rule, noSeeding := vllmpool.Rule(ruleName, prof, descs), 0
	rule.LoadLaw.ColdStartSeedN = &noSeeding
	cfg := rules.Config{Listen: fmt.Sprintf("127.0.0.1:%d", ports[0]), Admin: rules.Admin{Listen: fmt.Sprintf("127.0.0.1:%d", ports[1]), Token: adminToken},
		DebugHeader: true, Tokenizers: rules.Tokenizers{Root: containers.TokenizersMount}, Rules: []rules.Rule{rule}}
	cb, err := yaml.Marshal(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.gw, err = h.StartGateway(ctx, containers.GatewaySpec{Config: cb, AdminToken: adminToken, TokenizerRoot: dir, Models: []string{m}, Certificates: certs}); err != nil {
		t.Fatal(err)
	}
	p.waitConnected("E0", 0)
	p.waitConnected("S1", 0)

	scenarios := []struct {
		name string
		long bool
		run  func(*pool)
	}{
		{"learn_and_route", false, scVLLMLearnAndRoute},
		{"gateway_paused_briefly", false, scVLLMGatewayPaused},
		{"gateway_restart_replays", false, scVLLMGatewayRestart},
		{"all_blocks_cleared", false, scVLLMCacheReset},
		{"network_cut", false, scVLLMNetworkCut},
		{"engine_killed_mid_stream", false, scVLLMKilledMidStream},
		{"engine_started_after_kill", true, scVLLMStartedAfterKill},
		{"engine_restart", true, scVLLMRestart},
	}
	for _, sc := range scenarios {
		if sc.long && os.Getenv(envContainersLong) != "long" {
			t.Logf("%s not run: it starts the engine again (minutes here); %s=long (make containers-long) runs it", sc.name, envContainersLong)
			continue
		}
		ok := t.Run(sc.name, func(t *testing.T) {
			sp := *p
			sp.t = t
			sc.run(&sp)
		})
		if !ok {
			return
		}
	}
}

// keepEngineLog writes the whole log of a failed run's engine container to a file that outlives
// the test and names it.
func keepEngineLog(t *testing.T, e *containers.Engine) {
	if !t.Failed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	logs, err := e.Logs(ctx)
	if err != nil {
		t.Logf("engine log: %v", err)
		return
	}
	f := filepath.Join(os.TempDir(), e.Name+".log")
	if err := os.WriteFile(f, []byte(logs), 0o644); err == nil {
		t.Logf("the engine's whole log: %s", f)
	}
}

// missingPeer skips naming what is missing and its command, or fails under CI (which installs it).
func missingPeer(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("CI: %s", why)
	}
	t.Skip(why)
}

// vllmSend posts a completion through the gateway and requires a 200 with the gateway's receipt.
func vllmSend(p *pool, text string, maxTokens int) *containers.Completion {
	p.t.Helper()
	c, err := containers.Complete(p.ctx(), p.http, p.gw.URL(), containers.CompletionRequest{Model: p.model, Prompt: text, MaxTokens: maxTokens})
	if err != nil {
		p.t.Fatalf("gateway completion: %v", err)
	}
	if c.Status != http.StatusOK || c.Endpoint == "" {
		p.t.Fatalf("gateway completion: status %d, receipt %q: %s", c.Status, c.Endpoint, c.Body)
	}
	return c
}

// fullyKnown waits until the gateway credits ep with exactly what the engine itself reports
// cached for a repeat of text (explain's overlap × block size = the repeat's cached_tokens, > 0):
// the engine's events for that prompt reached the inventory. The engine, not our block count, is
// the reference: it does not count a prompt's last block as a hit when the prompt ends on it.
func fullyKnown(p *pool, ep, text string) *containers.Decision {
	p.t.Helper()
	var d *containers.Decision
	p.eventually(30*time.Second, "the engine's cached blocks of the prompt in "+ep+"'s inventory", func() (bool, string) {
		d = p.explain(text)
		c := realDirect(p.t, p, ep, text)
		return c.CachedTokens > 0 && d.Overlap(ep)*vllmpool.BlockSize == c.CachedTokens,
			fmt.Sprintf("overlap %d of %d blocks, the engine reports %d cached tokens", d.Overlap(ep), d.Blocks, c.CachedTokens)
	})
	return d
}

// scVLLMLearnAndRoute: a prompt the engine served directly is learned from its own events, routed
// KV-exact to it, and the engine reports the predicted blocks as cached tokens.
func scVLLMLearnAndRoute(p *pool) {
	text := prompt("vllm-learn", 200)
	first := realDirect(p.t, p, "E0", text)
	d := fullyKnown(p, "E0", text)
	if d.Tier != "kv-exact" || d.Target != "E0" {
		p.t.Fatalf("explain after learning: %+v, want kv-exact to E0", d)
	}
	again := vllmSend(p, text, 4)
	if again.Endpoint != "E0" || d.Score == 0 || again.CachedTokens != d.Score*vllmpool.BlockSize {
		p.t.Fatalf("repeat: served by %s with %d cached tokens of %d, want E0 with the predicted %d (%d blocks of %d)",
			again.Endpoint, again.CachedTokens, first.PromptTokens, d.Score*vllmpool.BlockSize, d.Score, vllmpool.BlockSize)
	}
}

// scVLLMGatewayPaused: the gateway's container is frozen while the engine serves and publishes; the
// messages wait in the socket buffers and arrive after the thaw — no gap, every block known.
func scVLLMGatewayPaused(p *pool) {
	g0 := p.metric("kvexact_ingest_gaps_total", lab("E0"))
	r0 := p.metric("kvexact_ingest_reconnects_total", lab("E0"))
	if err := p.gw.Pause(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			p.gw.Unpause(context.Background())
		}
	}()
	var texts []string
	for i := range 3 {
		texts = append(texts, prompt(fmt.Sprintf("vllm-paused-%d", i), 150))
		realDirect(p.t, p, "E0", texts[i])
	}
	if err := p.gw.Unpause(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	paused = false
	for _, text := range texts {
		fullyKnown(p, "E0", text)
	}
	if g, r := p.metric("kvexact_ingest_gaps_total", lab("E0")), p.metric("kvexact_ingest_reconnects_total", lab("E0")); g != g0 || r != r0 {
		p.t.Fatalf("a short pause produced gaps %v→%v, reconnects %v→%v", g0, g, r0, r)
	}
}

// scVLLMGatewayRestart: a restarted gateway starts empty and rebuilds the same inventory from the
// engine's replay socket (sequence 0 on).
func scVLLMGatewayRestart(p *pool) {
	before := p.inventory("E0")
	if len(before) == 0 {
		p.t.Fatal("nothing learned before the gateway restart")
	}
	if err := p.gw.Restart(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	p.waitConnected("E0", 0)
	// Every block the old gateway knew comes back (the new gateway's own verification probes may
	// store more on the engine meanwhile: those are new keys, never missing ones).
	p.eventually(60*time.Second, "inventory rebuilt from the engine's replay", func() (bool, string) {
		inv := p.inventory("E0")
		missing := 0
		for k, n := range before {
			if inv[k] != n {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d keys missing or with another count; %s", missing, len(before), diff(inv, before))
	})
	if n := p.metric("kvexact_ingest_replays_total", lab("E0", "outcome", "completed")); n < 1 {
		p.t.Fatalf("%v completed replays after the restart, want at least one", n)
	}
	if d := p.explain(prompt("vllm-learn", 200)); d.Tier != "kv-exact" || d.Target != "E0" {
		p.t.Fatalf("after replay: %+v, want kv-exact to E0", d)
	}
}

// scVLLMCacheReset: the engine's /reset_prefix_cache publishes AllBlocksCleared; the inventory
// empties and nothing is credited any more.
func scVLLMCacheReset(p *pool) {
	c0 := p.metric("kvexact_ingest_clears_total", lab("E0", "cause", "engine"))
	// PostClear wants a 200 that does not refuse: vLLM answers a refused reset 200 success false.
	if err := engines.NewClient(p.engines["E0"].URL(), p.http).PostClear(p.ctx(), "/reset_prefix_cache"); err != nil {
		p.t.Fatal(err)
	}
	// vLLM publishes the events of a step with the step's output: the AllBlocksCleared of a reset
	// leaves with the next request's step, so one request follows the reset.
	after := prompt("vllm-after-reset", 60)
	realDirect(p.t, p, "E0", after)
	p.eventually(30*time.Second, "the old blocks gone after the engine's cache reset", func() (bool, string) {
		c := p.metric("kvexact_ingest_clears_total", lab("E0", "cause", "engine"))
		old := p.explain(prompt("vllm-learn", 200)).Overlap("E0")
		return c == c0+1 && old == 0, fmt.Sprintf("engine clears %v→%v, the learned prompt still credited with %d blocks", c0, c, old)
	})
	fullyKnown(p, "E0", after)
}

// scVLLMKilledMidStream: SIGKILL of the engine while it streams. The client's stream ends at once
// with an SSE error event, never a hang; the gateway loses its event subscription and serves the
// dead engine's prompt on the other endpoint.
func scVLLMKilledMidStream(p *pool) {
	text := prompt("vllm-stream", 60)
	realDirect(p.t, p, "E0", text)
	fullyKnown(p, "E0", text)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := containers.OpenStream(ctx, p.http, p.gw.URL(), containers.CompletionRequest{Model: p.model, Prompt: text, MaxTokens: 1500})
	if err != nil {
		p.t.Fatal(err)
	}
	defer s.Close()
	if s.Status != http.StatusOK || s.Endpoint != "E0" {
		p.t.Fatalf("stream: status %d, receipt %q", s.Status, s.Endpoint)
	}
	if _, err := s.Next(); err != nil {
		p.t.Fatalf("first chunk: %v", err)
	}
	if err := p.engines["E0"].Kill(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	killed := time.Now()
	var last string
	for {
		d, err := s.Next()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				p.t.Fatal("stream ended only by the client deadline: a hang")
			}
			if errors.Is(err, containers.ErrStreamDone) {
				p.t.Fatalf("stream completed normally after the kill (the engine finished first?); last %.120q", last)
			}
			break
		}
		last = d
	}
	if !strings.Contains(last, `"error"`) {
		p.t.Fatalf("stream ended without an error event saying why; last %.120q", last)
	}
	p.t.Logf("stream ended %s after the kill: %.100q", time.Since(killed).Round(time.Millisecond), last)
	p.eventually(30*time.Second, "subscription to the killed engine down", func() (bool, string) {
		c := p.metric("kvexact_ingest_connected", lab("E0"))
		return c == 0, fmt.Sprintf("connected=%v", c)
	})
	if c := vllmSend(p, text, 1); c.Endpoint != "S1" {
		p.t.Fatalf("the dead engine's prompt after the kill: served by %s, want S1 (E0 is dead)", c.Endpoint)
	}
}

// scVLLMStartedAfterKill: the killed engine's container starts again (a new process: empty cache,
// event sequence from 0). The gateway reconnects, drops every block of the old process once new
// events arrive, and routes the new prompt KV-exact to it.
func scVLLMStartedAfterKill(p *pool) {
	vllmRestarted(p, func(ctx context.Context, e *containers.Engine) error { return e.StartAgain(ctx) })
}

// scVLLMRestart: the engine's container is stopped (SIGTERM, graceful) and started again; as after
// the kill, the old process's blocks are dropped and the new ones learned.
func scVLLMRestart(p *pool) {
	realDirect(p.t, p, "E0", prompt("vllm-pre-restart", 150))
	fullyKnown(p, "E0", prompt("vllm-pre-restart", 150))
	vllmRestarted(p, func(ctx context.Context, e *containers.Engine) error { return e.Restart(ctx) })
}

func vllmRestarted(p *pool, restart func(context.Context, *containers.Engine) error) {
	old := p.inventory("E0")
	r0 := p.metric("kvexact_ingest_reconnects_total", lab("E0"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	if err := restart(ctx, p.engines["E0"]); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("engine serving again after %s", time.Since(start).Round(time.Second))
	p.waitConnected("E0", r0+1)
	fresh := prompt(fmt.Sprintf("vllm-after-restart-%v", r0), 150)
	realDirect(p.t, p, "E0", fresh)
	p.eventuallyDiag(60*time.Second, "the old process's blocks gone, the new prompt's learned", func() (bool, string) {
		inv := p.inventory("E0")
		stale := 0
		for k := range old {
			if inv[k] > 0 {
				stale++
			}
		}
		d := p.explain(fresh)
		return stale == 0 && d.Blocks > 0 && d.Overlap("E0") == d.Blocks,
			fmt.Sprintf("%d stale of %d, new prompt overlap %d of %d", stale, len(old), d.Overlap("E0"), d.Blocks)
	}, func() string { return ingestDiag(p, "E0") })
	p.waitHealthy("E0")
	p.eventuallyDiag(60*time.Second, "the new prompt routed kv-exact to the restarted engine", func() (bool, string) {
		d := p.explain(fresh)
		return d.Tier == "kv-exact" && d.Target == "E0", fmt.Sprintf("%+v", d)
	}, func() string { return ingestDiag(p, "E0") })
	if c := vllmSend(p, fresh, 2); c.Endpoint != "E0" || c.CachedTokens == 0 {
		p.t.Fatalf("re-learned prompt served by %s with %d cached tokens, want E0 with a hit", c.Endpoint, c.CachedTokens)
	}
}

// ingestDiag is what the gateway knows of ep's event stream and exactness, for a failure's log:
// the inventory's size, the ingest counters by label (clears by cause, gaps, replays, reconnects),
// the exactness state with its holds, verification and probes, and every line of the gateway's log
// about ep's ingest, inventory or exactness (the failure's log tail is cut to the last lines).
func ingestDiag(p *pool, ep string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "--- gateway's view of %s ---\n", ep)
	if inv, err := p.gw.Inventory(p.ctx(), ruleName, ep); err != nil {
		fmt.Fprintf(&b, "inventory: %v\n", err)
	} else {
		fmt.Fprintf(&b, "inventory: %d blocks\n", len(inv))
	}
	if m, err := p.gw.Metrics(p.ctx()); err != nil {
		fmt.Fprintf(&b, "metrics: %v\n", err)
	} else {
		for _, s := range m {
			if strings.HasPrefix(s.Name, "kvexact_ingest_") && s.Labels["endpoint"] == ep && s.Value != 0 &&
				!strings.HasSuffix(s.Name, "_bucket") {
				fmt.Fprintf(&b, "%s%v %v\n", s.Name, s.Labels, s.Value)
			}
		}
	}
	if e, err := endpointStatus(p, ep); err != nil {
		fmt.Fprintf(&b, "status: %v\n", err)
	} else if e.Exact != nil {
		x := e.Exact
		fmt.Fprintf(&b, "exact: state %s, holds %v, restarts detected %d, reasons %q\n", x.State, x.Holds, x.Restarts, x.Reasons)
		if x.Verification != nil {
			fmt.Fprintf(&b, "verification: %+v\n", *x.Verification)
		}
		fmt.Fprintf(&b, "probes: sent %d, reproduced %d, inconclusive %d, last %v\n", x.Probes.Sent, x.Probes.Reproduced, x.Probes.Inconclusive, x.Probes.LastResult)
		fmt.Fprintf(&b, "resident %d, excluded %q, breaker %s, event error %q\n", e.Resident, e.Excluded, e.Breaker, e.EventErr)
	}
	if logs, err := p.gw.Container.Logs(p.ctx()); err != nil {
		fmt.Fprintf(&b, "gateway log: %v\n", err)
	} else {
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, "endpoint="+ep+" ") && (strings.Contains(l, "ingest:") || strings.Contains(l, "KV-exact") ||
				strings.Contains(l, "inventory") || strings.Contains(l, "process")) {
				b.WriteString(l + "\n")
			}
		}
	}
	return b.String()
}

// endpointStatus is ep's entry in the gateway's status.
func endpointStatus(p *pool, ep string) (gateway.EndpointStatus, error) {
	st, err := p.gw.Status(p.ctx())
	if err != nil {
		return gateway.EndpointStatus{}, err
	}
	for _, r := range st.Rules {
		for _, e := range r.Endpoints {
			if e.Name == ep {
				return e, nil
			}
		}
	}
	return gateway.EndpointStatus{}, fmt.Errorf("%s not in the gateway's status", ep)
}

// holds is the exactness holds of an endpoint's status, with their reasons.
func holds(e gateway.EndpointStatus) (codes []string, reasons string) {
	if e.Exact == nil {
		return nil, "no exactness status"
	}
	return e.Exact.Holds, fmt.Sprintf("state %s, holds %v: %s", e.Exact.State, e.Exact.Holds, strings.Join(e.Exact.Reasons, "; "))
}

// scVLLMNetworkCut cuts E0's link for real (docker network disconnect: Docker stops forwarding its
// published ports, so the gateway's connections to it close and new ones are refused, while vLLM
// runs on with its sockets open) and heals it. Pinned: what a client sees for the requests in
// flight at the cut (a stream ends with an SSE error event; a request still waiting for its
// response headers is sent again to S1 and answered there); that the gateway loses the event
// stream, holds E0 from KV-exact (events_unsynced, with the reason), excludes it once its requests
// and probes fail, and routes E0's prompts to S1; that after the heal it reconnects, replays what
// vLLM published meanwhile (a prompt vLLM served inside its own namespace during the cut), lifts
// the hold without a clear (the replay holds the last message applied: ingest.Config's
// ClearUnreplayed does not fire), and that predicted = realized cached tokens for the old prompt
// and the one served during the cut.
func scVLLMNetworkCut(p *pool) {
	e0 := p.engines["E0"]
	text := prompt("vllm-cut-before", 120)
	realDirect(p.t, p, "E0", text)
	fullyKnown(p, "E0", text)
	r0 := p.metric("kvexact_ingest_reconnects_total", lab("E0"))
	rp0 := p.metric("kvexact_ingest_replays_total", lab("E0", "outcome", "completed"))
	cl0 := p.metric("kvexact_ingest_clears_total", lab("E0"))
	g0 := p.metric("kvexact_ingest_gaps_total", lab("E0"))

	// In flight at the cut: a stream that has sent its first chunk, and a request whose response
	// (vLLM answers a non-streamed completion in one piece at the end) has not begun.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := containers.OpenStream(ctx, p.http, p.gw.URL(), containers.CompletionRequest{Model: p.model, Prompt: text, MaxTokens: 1500})
	if err != nil {
		p.t.Fatal(err)
	}
	defer st.Close()
	if st.Status != http.StatusOK || st.Endpoint != "E0" {
		p.t.Fatalf("stream: status %d, receipt %q, want 200 from E0", st.Status, st.Endpoint)
	}
	if _, err := st.Next(); err != nil {
		p.t.Fatalf("first chunk: %v", err)
	}
	waiting := make(chan *containers.Completion, 1)
	go func() {
		c, err := containers.Complete(ctx, p.http, p.gw.URL(), containers.CompletionRequest{Model: p.model, Prompt: text, MaxTokens: 1500})
		if err != nil {
			c = &containers.Completion{Body: "transport error: " + err.Error()}
		}
		waiting <- c
	}()
	p.eventually(30*time.Second, "both requests in flight on E0", func() (bool, string) {
		e, err := endpointStatus(p, "E0")
		return err == nil && e.Active == 2, fmt.Sprintf("active %d (%v)", e.Active, err)
	})

	if err := e0.Disconnect(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	cut := time.Now()
	healed := false
	defer func() {
		if !healed {
			e0.Connect(context.Background())
		}
	}()
	var last string
	for {
		d, err := st.Next()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				p.t.Fatal("the stream in flight at the cut ended only by the client deadline: a hang")
			}
			if errors.Is(err, containers.ErrStreamDone) {
				p.t.Fatalf("the stream in flight at the cut completed normally; last %.120q", last)
			}
			break
		}
		last = d
	}
	if !strings.Contains(last, `"error"`) || !strings.Contains(last, "E0") {
		p.t.Fatalf("the stream in flight at the cut ended without an error event naming E0; last %.160q", last)
	}
	p.t.Logf("stream in flight: ended %s after the cut: %.120q", time.Since(cut).Round(time.Millisecond), last)

	// The gateway notices: the event stream is down, KV-exact holds E0 with the reason.
	p.eventually(30*time.Second, "E0's event stream down and E0 held from KV-exact", func() (bool, string) {
		c := p.metric("kvexact_ingest_connected", lab("E0"))
		e, err := endpointStatus(p, "E0")
		if err != nil {
			return false, err.Error()
		}
		h, why := holds(e)
		return c == 0 && slices.Contains(h, "events_unsynced"), fmt.Sprintf("connected=%v; %s", c, why)
	})
	p.t.Logf("event stream down and E0 held %s after the cut", time.Since(cut).Round(time.Millisecond))
	// Nothing is predicted on E0 though its inventory still holds the prompt; the prompt goes to S1.
	if d := p.explain(text); d.Target == "E0" || d.Tier == "kv-exact" && d.Target != "S1" {
		p.t.Fatalf("explain during the cut: %+v, want no KV-exact pick of E0", d)
	}
	for i := range 3 {
		if c := vllmSend(p, text, 1); c.Endpoint != "S1" {
			p.t.Fatalf("request %d during the cut served by %s, want S1", i, c.Endpoint)
		}
	}
	// The HTTP failures (requests refused, probes failing) exclude E0 with the reason.
	var excluded string
	p.eventually(60*time.Second, "E0 excluded from routing", func() (bool, string) {
		e, err := endpointStatus(p, "E0")
		excluded = e.Excluded
		return err == nil && e.Excluded != "", fmt.Sprintf("excluded=%q breaker=%q (%v)", e.Excluded, e.Breaker, err)
	})
	p.t.Logf("E0 excluded (%s) %s after the cut", excluded, time.Since(cut).Round(time.Millisecond))
	w := <-waiting
	if w.Status != http.StatusOK || w.Endpoint != "S1" {
		p.t.Fatalf("the request waiting for its response at the cut: status %d, receipt %q, want 200 from S1: %.200s", w.Status, w.Endpoint, w.Body)
	}
	p.t.Logf("request in flight: answered by S1 %s after the cut", time.Since(cut).Round(time.Millisecond))

	// The engine serves on: a client inside its own namespace (the cut does not separate them)
	// sends a prompt whose blocks vLLM publishes while no subscriber can receive them.
	during := prompt("vllm-cut-during", 120)
	body, err := json.Marshal(map[string]any{"model": p.model, "prompt": during, "max_tokens": 4})
	if err != nil {
		p.t.Fatal(err)
	}
	post := fmt.Sprintf(`import sys, urllib.request
r = urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:%d/v1/completions", data=sys.argv[1].encode(), headers={"Content-Type": "application/json"}), timeout=120)
print(r.status)`, e0.HTTPPort)
	if code, out, err := e0.Exec(p.ctx(), "/usr/bin/python3", "-c", post, string(body)); err != nil || code != 0 || !strings.Contains(out, "200") {
		p.t.Fatalf("completion inside E0's namespace during the cut: exit %d, %v: %s", code, err, out)
	}

	if err := e0.Connect(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	healed = true
	heal := time.Now()
	p.waitConnected("E0", r0+1)
	p.eventually(60*time.Second, "E0's replay completed and the KV-exact hold lifted", func() (bool, string) {
		rp := p.metric("kvexact_ingest_replays_total", lab("E0", "outcome", "completed"))
		e, err := endpointStatus(p, "E0")
		if err != nil {
			return false, err.Error()
		}
		h, why := holds(e)
		return rp > rp0 && len(h) == 0 && e.Exact.State == "eligible", fmt.Sprintf("completed replays %v→%v; %s", rp0, rp, why)
	})
	p.t.Logf("reconnected, replayed and eligible %s after the heal", time.Since(heal).Round(time.Millisecond))
	p.waitHealthy("E0")
	// The reconnect itself replayed what vLLM published during the cut: no live message showed a
	// gap (the stream's decode goes on inside the cut namespace and publishes after the heal, so
	// without that replay the next live message would, and its gap's replay recover it later).
	if cl, g := p.metric("kvexact_ingest_clears_total", lab("E0")), p.metric("kvexact_ingest_gaps_total", lab("E0")); cl != cl0 || g != g0 {
		p.t.Fatalf("clears %v→%v, gaps %v→%v across the cut: the reconnect's replay should have recovered what was published meanwhile before any live message", cl0, cl, g0, g)
	}
	// Exact again: both prompts credited with what the engine reports cached, routed KV-exact to
	// E0, and the engine's cached_tokens equal the prediction.
	for _, tx := range []string{during, text} {
		d := fullyKnown(p, "E0", tx)
		if d.Tier != "kv-exact" || d.Target != "E0" {
			p.t.Fatalf("explain after the heal: %+v, want kv-exact to E0", d)
		}
		c := vllmSend(p, tx, 1)
		if c.Endpoint != "E0" || c.CachedTokens != d.Score*vllmpool.BlockSize {
			p.t.Fatalf("after the heal: served by %s with %d cached tokens, want E0 with the predicted %d", c.Endpoint, c.CachedTokens, d.Score*vllmpool.BlockSize)
		}
	}
}
