package gateway_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/promtest"
)

func writeFile(path, content string) error { return os.WriteFile(path, []byte(content), 0o644) }

func eligibleMetric(t *testing.T, p *pool, ep string) float64 {
	return promtest.Value(t, p.reg, "kvexact_endpoint_exact_eligible", map[string]string{"rule": "pool", "endpoint": ep})
}

func reasonMetric(t *testing.T, p *pool, ep, reason string) float64 {
	return promtest.Value(t, p.reg, "kvexact_endpoint_exact_ineligible_reason", map[string]string{"rule": "pool", "endpoint": ep, "reason": reason})
}

// ruleReasonLabel is the reason label of the pool rule's kvexact_rule_exact_enabled sample.
func ruleReasonLabel(t *testing.T, p *pool) string {
	t.Helper()
	got := promtest.Series(t, p.reg, "kvexact_rule_exact_enabled", map[string]string{"rule": "pool"})
	if len(got) == 0 {
		t.Fatal("no kvexact_rule_exact_enabled sample")
	}
	return got[0]["reason"]
}

func endpointStatus(t *testing.T, p *pool, name string) gateway.EndpointStatus {
	t.Helper()
	for _, e := range p.g.Status().Rules[0].Endpoints {
		if e.Name == name {
			if e.Exact == nil {
				t.Fatalf("endpoint %s has no exact status", name)
			}
			return e
		}
	}
	t.Fatalf("no endpoint %s in status", name)
	return gateway.EndpointStatus{}
}

// TestE2ECertificateBoundToAddress: swapping two endpoints' addresses in the rule (the names stay)
// leaves neither covered: the status names the address each was certified for, the per-endpoint
// metric says uncertified, and KV-exact never decides.
func TestE2ECertificateBoundToAddress(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true})
	for _, ep := range []string{"e0", "e1"} {
		if st := endpointStatus(t, p, ep); st.Exact.State != "eligible" || eligibleMetric(t, p, ep) != 1 {
			t.Fatalf("%s before the swap: %+v, metric %v", ep, st.Exact, eligibleMetric(t, p, ep))
		}
	}
	r, _ := p.g.Store().Get("pool")
	a, b := r.Endpoints[0], r.Endpoints[1]
	r.Endpoints[0].Address, r.Endpoints[0].Events = b.Address, b.Events
	r.Endpoints[1].Address, r.Endpoints[1].Events = a.Address, a.Events
	if _, err := p.g.Store().Put(r); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the swapped rule to apply", func() bool { return endpointStatus(t, p, "e0").Address == b.Address })
	st := p.g.Status().Rules[0]
	if st.Exact.Enabled {
		t.Fatalf("KV-exact still enabled after the address swap: %+v", st.Exact)
	}
	e0 := endpointStatus(t, p, "e0")
	if want := "certified for " + a.Address + ", rule has " + b.Address; e0.Exact.State != "uncertified" || !strings.Contains(e0.Certified, want) || !strings.Contains(strings.Join(e0.Exact.Reasons, ";"), want) {
		t.Fatalf("e0 after the swap: certified %q, exact %+v; want %q", e0.Certified, e0.Exact, want)
	}
	if eligibleMetric(t, p, "e0") != 0 || reasonMetric(t, p, "e0", "uncertified") != 1 {
		t.Fatalf("metrics after the swap: eligible %v, uncertified %v", eligibleMetric(t, p, "e0"), reasonMetric(t, p, "e0", "uncertified"))
	}
	c := p.complete(docs(1)[0], false)
	if strings.Contains(c.decision, `"tier":"kv-exact"`) {
		t.Fatalf("KV-exact decided for a swapped endpoint: %s", c.decision)
	}
}

// TestE2ECertificateExpiresWhileRunningAndReloads: at the certificate's expiry KV-exact stops while
// the rule keeps serving; a fresh certificate loaded through the admin API turns it back on.
func TestE2ECertificateExpiresWhileRunningAndReloads(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, certFile: true,
		certValid: 3 * time.Second, gwMod: func(o *gateway.Options) { o.ExpiryCheck = 50 * time.Millisecond }})
	if st := p.g.Status().Rules[0].Exact; !st.Enabled {
		t.Fatalf("not enabled before expiry: %+v", st)
	}
	eventually(t, 10*time.Second, "the certificate to expire", func() bool { return !p.g.Status().Rules[0].Exact.Enabled })
	st := p.g.Status()
	if !strings.Contains(st.Rules[0].Exact.Reason, "certificate expired at") {
		t.Fatalf("reason after expiry: %q", st.Rules[0].Exact.Reason)
	}
	if cs := st.CertificateStatus; len(cs) != 1 || cs[0].Valid || !strings.Contains(cs[0].Reason, "expired") {
		t.Fatalf("certificate status after expiry: %+v", cs)
	}
	if e0 := endpointStatus(t, p, "e0"); e0.Exact.State != "uncertified" || eligibleMetric(t, p, "e0") != 0 {
		t.Fatalf("e0 after expiry: %+v, metric %v", e0.Exact, eligibleMetric(t, p, "e0"))
	}
	// The runtime is swapped (status) before the old one's sources have stopped; the rule's gauge is
	// published after that stop, so it follows status by the time the stop takes.
	eventually(t, 5*time.Second, "the rule metric to follow the expiry", func() bool {
		return promtest.Value(t, p.reg, "kvexact_rule_exact_enabled", map[string]string{"rule": "pool"}) == 0
	})
	if got := ruleReasonLabel(t, p); got != "no_endpoint_certified" || st.Rules[0].Exact.Code != got {
		t.Fatalf("the rule's reason label is %q, not the closed code (%+v)", got, st.Rules[0].Exact)
	}
	c := p.complete(docs(1)[0], false)
	if c.status != 200 || strings.Contains(c.decision, `"tier":"kv-exact"`) {
		t.Fatalf("after expiry: status %d, decision %s", c.status, c.decision)
	}

	// A bad file is refused and changes nothing.
	old, _ := certificate.Load(p.certPath, nil)
	if err := writeFile(p.certPath, "{not json"); err != nil {
		t.Fatal(err)
	}
	if code, body := p.adminDo("POST", "/admin/certificates/reload", p.token, ""); code != 422 || !strings.Contains(body, "certificate") {
		t.Fatalf("bad reload: %d %s", code, body)
	}
	// A renewed certificate (same endpoints, new validity) is loaded without a restart.
	old.IssuedAt, old.ExpiresAt = time.Now(), time.Now().Add(time.Hour)
	if err := old.Write(p.certPath); err != nil {
		t.Fatal(err)
	}
	code, body := p.adminDo("POST", "/admin/certificates/reload", p.token, "")
	if code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	var out struct {
		Certificates []gateway.CertificateStatus `json:"certificates"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil || len(out.Certificates) != 1 || !out.Certificates[0].Valid || out.Certificates[0].Verification != "unsigned" {
		t.Fatalf("reload answer: %v %s", err, body)
	}
	if st := p.g.Status().Rules[0].Exact; !st.Enabled {
		t.Fatalf("not enabled after reload: %+v", st)
	}
	if eligibleMetric(t, p, "e0") != 1 {
		t.Fatal("e0 not eligible after reload")
	}
}

// TestE2EUnsignedCertificateVisible: an edited, unsigned certificate is accepted without a key but
// the status says it is unverified; with --require-signed (and a key) it is refused.
func TestE2EUnsignedCertificateVisible(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3, certify: true, certFile: true})
	// Edit it as anyone with write access could: extend its validity by a year. The profile digest
	// still matches (the profile is untouched); only a signature would catch it.
	c, err := certificate.Load(p.certPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.ExpiresAt = c.ExpiresAt.AddDate(1, 0, 0)
	c.Write(p.certPath)
	if _, err := p.g.ReloadCertificates(); err != nil {
		t.Fatal(err)
	}
	cs := p.g.Status().CertificateStatus
	if len(cs) != 1 || cs[0].Verification != string(certificate.Unsigned) {
		t.Fatalf("certificate status: %+v", cs)
	}
	pub, priv, _ := ed25519.GenerateKey(nil)
	if _, err := gateway.LoadCertificates([]string{p.certPath}, pub, false); err == nil {
		t.Fatal("unsigned certificate accepted with a key configured")
	}
	if _, err := gateway.LoadCertificates([]string{p.certPath}, nil, true); !errors.Is(err, gateway.ErrNotVerified) {
		t.Fatalf("--require-signed without verification: %v", err)
	}
	c.Sign(priv)
	c.Write(p.certPath)
	if _, err := gateway.LoadCertificates([]string{p.certPath}, nil, true); !errors.Is(err, gateway.ErrNotVerified) || !strings.Contains(err.Error(), "signed, not verified") {
		t.Fatalf("signed but unverified under --require-signed: %v", err)
	}
	got, err := gateway.LoadCertificates([]string{p.certPath}, pub, true)
	if err != nil || got[0].Verification() != certificate.Verified {
		t.Fatalf("signed and verified: %v", err)
	}
}

// direct sends a completion straight to a simulator (the gateway only sees its events).
func direct(t *testing.T, s *sim.Engine, prompt string) {
	body, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": prompt, "max_tokens": 1})
	resp, err := http.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// TestE2ERestartWithAnotherSeedIsFenced: e1's engine restarts on the same ports with another
// PYTHONHASHSEED. The event stream's sequence regression marks it unverified, and the first stored
// block the live parity watch checks names the seed leg; e0 stays eligible and KV-exact never
// picks e1.
func TestE2ERestartWithAnotherSeedIsFenced(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true})
	if endpointStatus(t, p, "e1").Exact.State != "eligible" {
		t.Fatal("e1 not eligible before the restart")
	}
	s, err := sim.Restart(context.Background(), p.sims[1], func(c *sim.Config) { c.Seed = strp("1") })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p.sims[1] = s
	var e1 gateway.EndpointStatus
	for i := 0; ; i++ {
		if i == 100 {
			t.Fatalf("e1 not fenced after 100 prompts: %+v", e1.Exact)
		}
		direct(t, s, fmt.Sprintf("after the restart, prompt %d. %s", i, docs(1)[0]))
		time.Sleep(50 * time.Millisecond)
		// The restart (process identity, checked on the reconnect) and the mismatch (the first
		// checked root block) may be seen in either order; both end up in the status.
		if e1 = endpointStatus(t, p, "e1"); e1.Exact.Parity.Mismatches > 0 && e1.Exact.Restarts > 0 && slices.Contains(e1.Exact.Holds, "parity_mismatch") {
			break
		}
	}
	if e1.Exact.State != "suspended" || !slices.Contains(e1.Exact.Holds, "parity_mismatch") || !strings.Contains(e1.Exact.Parity.LastMismatch, "seed") {
		t.Fatalf("e1 after the restart: %+v", e1.Exact)
	}
	if e1.Exact.Restarts == 0 {
		t.Fatalf("restart not detected: %+v", e1.Exact)
	}
	if reasonMetric(t, p, "e1", "parity_mismatch") != 1 || eligibleMetric(t, p, "e1") != 0 || eligibleMetric(t, p, "e0") != 1 {
		t.Fatal("metrics do not show e1 suspended and e0 eligible")
	}
	if !strings.Contains(e1.Fenced, "seed") {
		t.Fatalf("fence reason: %q", e1.Fenced)
	}
	doc := docs(2)[1]
	direct(t, s, doc)
	time.Sleep(100 * time.Millisecond)
	for range 3 {
		if c := p.complete(doc, false); strings.Contains(c.decision, `"tier":"kv-exact"`) && c.endpoint == "e1" {
			t.Fatalf("KV-exact chose the suspended endpoint: %s", c.decision)
		}
	}
}

// TestE2ERestartSameSettingsResumes: an engine restarted with the settings it was certified with is
// unverified until the watch has seen enough matching blocks, then eligible again by itself.
func TestE2ERestartSameSettingsResumes(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true,
		gwMod: func(o *gateway.Options) { o.ResumeAfterBlocks = 80 }})
	s, err := sim.Restart(context.Background(), p.sims[1], nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p.sims[1] = s
	sawUnverified := false
	var e1 gateway.EndpointStatus
	for i := 0; ; i++ {
		if i == 100 {
			t.Fatalf("e1 did not resume after 100 prompts (saw unverified: %v): %+v", sawUnverified, e1.Exact)
		}
		direct(t, s, fmt.Sprintf("after the restart, prompt %d. %s", i, docs(1)[0]))
		time.Sleep(50 * time.Millisecond)
		e1 = endpointStatus(t, p, "e1")
		if slices.Contains(e1.Exact.Holds, "unverified_since_restart") {
			sawUnverified = true
			if e1.Exact.State != "verifying" || e1.Exact.Verification == nil || reasonMetric(t, p, "e1", "unverified_since_restart") != 1 {
				t.Fatalf("unverified but %+v", e1.Exact)
			}
		}
		if sawUnverified && e1.Exact.State == "eligible" {
			break
		}
	}
	if e1.Exact.Parity.Mismatches != 0 || e1.Exact.Parity.MatchedBlocks < 80 || e1.Exact.Restarts == 0 || e1.Exact.Probes.Reproduced < 2 {
		t.Fatalf("e1 resumed with %+v", e1.Exact)
	}
	if eligibleMetric(t, p, "e1") != 1 {
		t.Fatal("metric: e1 not eligible after resuming")
	}
}

// TestE2EChatTemplateDriftAfterRestart: e1's engine restarts with another chat template (and the
// same seed, block size and tokenizer). Its completions hash exactly as before, so the live parity
// watch sees only matching blocks; the chat probe the gateway sends after the restart is rendered
// with the certified template and its blocks never appear: e1 stays suspended naming the chat
// template, however many matching completion blocks follow, and KV-exact never picks it for a chat.
func TestE2EChatTemplateDriftAfterRestart(t *testing.T) {
	const drifted = "{{ messages[-1]['content'] }}\n{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true})
	s, err := sim.Restart(context.Background(), p.sims[1], func(c *sim.Config) { c.ServeChatTemplate = drifted })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p.sims[1] = s
	var e1 gateway.EndpointStatus
	eventually(t, 10*time.Second, "e1 suspended by the chat probe", func() bool {
		direct(t, s, docs(1)[0])
		e1 = endpointStatus(t, p, "e1")
		return slices.Contains(e1.Exact.Holds, "probe_not_reproduced")
	})
	for i := range 40 {
		direct(t, s, fmt.Sprintf("after the restart, prompt %d. %s", i, docs(1)[0]))
	}
	time.Sleep(200 * time.Millisecond)
	e1 = endpointStatus(t, p, "e1")
	if e1.Exact.State != "suspended" || e1.Exact.Parity.Mismatches != 0 || e1.Exact.Parity.MatchedBlocks < uint64(gateway.DefaultResumeAfterBlocks) {
		t.Fatalf("e1 after matching completions: %+v", e1.Exact)
	}
	if !slices.Equal(e1.Exact.Holds, []string{"unverified_since_restart", "probe_not_reproduced"}) || !strings.Contains(e1.Fenced, "chat template") ||
		!strings.Contains(e1.Fenced, "the chat probe was not reproduced") || reasonMetric(t, p, "e1", "probe_not_reproduced") != 1 || eligibleMetric(t, p, "e1") != 0 {
		t.Fatalf("e1 holds %v, fence %q", e1.Exact.Holds, e1.Fenced)
	}
	if e1.Exact.Probes.LastResult["completion"] != "reproduced" {
		t.Fatalf("the completion probe should have been reproduced: %+v", e1.Exact.Probes)
	}
	chat, _ := json.Marshal(map[string]any{"model": "llama3", "max_tokens": 1, "messages": []map[string]string{{"role": "user", "content": docs(1)[0]}}})
	for range 3 {
		resp, err := http.Post(p.base+"/v1/chat/completions", "application/json", bytes.NewReader(chat))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if d := resp.Header.Get(proxy.HeaderDecision); strings.Contains(d, `"tier":"kv-exact"`) && resp.Header.Get(proxy.HeaderEndpoint) == "e1" {
			t.Fatalf("KV-exact chose the drifted endpoint: %s", d)
		}
	}
}

// TestE2ETRTLLMBlockSizeDriftAfterRestart: e1's TensorRT-LLM engine restarts with twice the
// certified tokens_per_block. The router binding would drop every block as partial and see none;
// the events' own block lengths show the change, and e1 is suspended naming both sizes, never
// resuming on a re-probe that compares nothing.
func TestE2ETRTLLMBlockSizeDriftAfterRestart(t *testing.T) {
	p := startPool(t, poolSpec{family: "trtllm", release: "1.2", n: 2, mode: 3, certify: true, blockSize: 16,
		gwMod: func(o *gateway.Options) { o.ReprobeInterval = 200 * time.Millisecond }})
	if st := endpointStatus(t, p, "e1"); st.Exact.State != "eligible" {
		t.Fatalf("e1 before the restart: %+v", st.Exact)
	}
	s, err := sim.Restart(context.Background(), p.sims[1], func(c *sim.Config) { c.BlockSize = 32 })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p.sims[1] = s
	var e1 gateway.EndpointStatus
	eventually(t, 10*time.Second, "e1 suspended for its block geometry", func() bool {
		direct(t, s, docs(1)[0])
		e1 = endpointStatus(t, p, "e1")
		return slices.Contains(e1.Exact.Holds, "geometry_mismatch")
	})
	// Several re-probes later it still is.
	time.Sleep(time.Second)
	e1 = endpointStatus(t, p, "e1")
	if e1.Exact.State != "suspended" || !slices.Contains(e1.Exact.Holds, "geometry_mismatch") ||
		!strings.Contains(e1.Fenced, "blocks of 32 tokens, the rule's block_size is 16") || reasonMetric(t, p, "e1", "geometry_mismatch") != 1 {
		t.Fatalf("e1 after the restart: %+v (fence %q)", e1.Exact, e1.Fenced)
	}
	if st := endpointStatus(t, p, "e0"); st.Exact.State != "eligible" {
		t.Fatalf("e0: %+v", st.Exact)
	}
}

// TestE2ERestartDropsInventoryAtOnce: e1's engine restarts and none of its new process's events
// arrive. The new process (seen on the reconnect's identity check) has an empty cache, so the
// gateway's mirror of the old one goes at once: no prediction rests on blocks that no longer exist.
func TestE2ERestartDropsInventoryAtOnce(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true})
	doc := docs(1)[0]
	direct(t, p.sims[1], doc)
	eventually(t, 5*time.Second, "e1's inventory to hold the prompt", func() bool { return p.overlap(doc, "e1") > 0 })
	// The new process publishes nothing that arrives (its messages are lost on the wire), so no
	// sequence regression can clear the mirror: only the identity check can.
	s, err := sim.Restart(context.Background(), p.sims[1], func(c *sim.Config) { c.Faults.DropEvents = 1 << 20 })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p.sims[1] = s
	eventually(t, 5*time.Second, "e1's inventory dropped with the old process", func() bool {
		return p.overlap(doc, "e1") == 0 && endpointStatus(t, p, "e1").Exact.Restarts > 0
	})
	if st := endpointStatus(t, p, "e1"); st.Exact.State == "eligible" && st.Exact.Probes.Reproduced < 2 {
		t.Fatalf("e1 eligible before its new process was verified: %+v", st.Exact)
	}
}

// TestE2ERestartSeenOnStreamBeforeHTTP: e1's engine restarts as vLLM does, its event sockets
// up while its HTTP server still refuses connections. The reconnect's replay shows the new
// publisher (cleared, unverified) and the verification probes find no server: the round waits for
// it rather than spend its attempts, so once the engine serves, its new process is verified
// without waiting for a periodic re-probe. The new process's blocks are learned; the re-probe that
// then reads the new process_start_time_seconds must keep them (the stream saw that process first)
// and not count the restart twice.
func TestE2ERestartSeenOnStreamBeforeHTTP(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, replay: true,
		gwMod: func(o *gateway.Options) { o.TokenCheckGrace = 200 * time.Millisecond }})
	old, fresh := docs(2)[0], docs(2)[1]
	direct(t, p.sims[1], old)
	eventually(t, 5*time.Second, "e1's inventory to hold the prompt", func() bool { return p.overlap(old, "e1") > 0 })
	s, err := sim.Restart(context.Background(), p.sims[1], func(c *sim.Config) { c.Faults.Refuse = true })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	p.sims[1] = s
	eventually(t, 5*time.Second, "the restart seen on e1's event stream", func() bool {
		st := endpointStatus(t, p, "e1")
		return p.overlap(old, "e1") == 0 && st.Exact.Restarts == 1 && st.Exact.State == "verifying"
	})
	// Longer than a round's attempts (5, one grace apart) while the engine refuses. The rounds the
	// engine does not answer are still one grace apart: a refused connection returns at once, and
	// the round must not turn into a loop hammering a starting engine.
	sentBefore := endpointStatus(t, p, "e1").Exact.Probes.Sent
	const refusing = 2 * time.Second
	time.Sleep(refusing)
	probes := endpointStatus(t, p, "e1").Exact.Probes
	kinds := uint64(len(probes.LastResult)) // a round probes each kind once
	if sent := probes.Sent - sentBefore; kinds == 0 || sent > kinds*(uint64(refusing/(200*time.Millisecond))+2) {
		t.Errorf("%d probes of %d kinds sent in %s while the engine refused connections, want at most a round a grace (200ms)", sent, kinds, refusing)
	}
	off := false
	if _, err := s.SetFaults(sim.FaultPatch{Refuse: &off}); err != nil {
		t.Fatal(err)
	}
	direct(t, s, fresh)
	var learned int
	eventually(t, 5*time.Second, "the new process's blocks learned", func() bool {
		learned = p.overlap(fresh, "e1")
		return learned > 0
	})
	eventually(t, 10*time.Second, "e1 verified once its engine serves, with no re-probe", func() bool {
		return endpointStatus(t, p, "e1").Exact.State == "eligible"
	})
	p.g.Reprobe(context.Background())
	st := endpointStatus(t, p, "e1")
	if n := p.overlap(fresh, "e1"); n != learned || st.Exact.Restarts != 1 || st.Exact.State != "eligible" {
		t.Fatalf("after the re-probe read the new process's identity: overlap %d of %d, %d restarts, %s %v",
			n, learned, st.Exact.Restarts, st.Exact.State, st.Exact.Holds)
	}
}

// TestE2ETemplateDriftSeenOnlyByRealizedHits: e1's engine renders chats with another template than
// the certified one (here one that puts the last question first). Its events are self-consistent, so
// the live parity watch sees nothing; but the gateway, holding the certified template's blocks on
// e1 (a client sent that rendering as token ids), predicts hits the engine never reports. After
// ShortfallHits such KV-exact hits e1 is suspended with the drift reason, and the predicted and
// realized counters show why.
func TestE2ETemplateDriftSeenOnlyByRealizedHits(t *testing.T) {
	const drifted = "{{ messages[-1]['content'] }}\n{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, certFile: true,
		simMod: func(i int, c *sim.Config) {
			if i == 1 {
				c.ServeChatTemplate = drifted
			}
		}})
	system := docs(1)[0]
	chat := func(k int) []byte {
		b, _ := json.Marshal(map[string]any{"model": "llama3", "max_tokens": 1, "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": fmt.Sprintf("Question number %d: what is topic %d about?", k, k)}}})
		return b
	}
	// The certified rendering of question 0, sent to e1 as token ids: the shared system prompt's
	// blocks are now on e1 under the keys the gateway computes for every question.
	tok, _ := tokenizerPool(t).Get("llama3")
	cr, err := tokenize.ParseChatRequest(chat(0))
	if err != nil {
		t.Fatal(err)
	}
	ids, _, err := tok.EncodeChat(cr)
	if err != nil {
		t.Fatal(err)
	}
	warm, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": ids, "max_tokens": 1})
	resp, err := http.Post(p.sims[1].URL()+"/v1/completions", "application/json", bytes.NewReader(warm))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	eventually(t, 5*time.Second, "e1's inventory to hold the system prompt", func() bool { return p.resident("e1") > 10 })
	// untilSuspended sends drifted chats (questions from, from+1, …) until e1 is suspended; it
	// returns e1's status and how many chats that took.
	untilSuspended := func(from int) (gateway.EndpointStatus, int) {
		var e1 gateway.EndpointStatus
		for k := from; ; k++ {
			if k == from+20 {
				t.Fatalf("e1 not suspended after 20 chats: %+v", e1.Exact)
			}
			resp, err := http.Post(p.base+"/v1/chat/completions", "application/json", bytes.NewReader(chat(k)))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if e1 = endpointStatus(t, p, "e1"); e1.Exact.State == "suspended" {
				return e1, k - from + 1
			}
		}
	}
	e1, _ := untilSuspended(1)
	if !slices.Equal(e1.Exact.Holds, []string{"realized_shortfall"}) || !strings.Contains(e1.Fenced, "tokenizer or template drift suspected") {
		t.Fatalf("e1 suspended with %+v (fence %q)", e1.Exact, e1.Fenced)
	}
	if e1.Exact.Parity.Mismatches != 0 || e1.Exact.Parity.MatchedBlocks == 0 {
		t.Fatalf("the event watch should have seen only matching blocks: %+v", e1.Exact.Parity)
	}
	if e1.Exact.RealizedRatio == nil || *e1.Exact.RealizedRatio != 0 || e1.Exact.PredictedCachedTokens < 3*16 {
		t.Fatalf("predicted %d, realized %d, ratio %v", e1.Exact.PredictedCachedTokens, e1.Exact.RealizedCachedTokens, e1.Exact.RealizedRatio)
	}
	pred := promtest.Value(t, p.reg, "kvexact_predicted_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": "e1"})
	real := promtest.Value(t, p.reg, "kvexact_realized_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": "e1"})
	if pred != float64(e1.Exact.PredictedCachedTokens) || real != 0 || reasonMetric(t, p, "e1", "realized_shortfall") != 1 {
		t.Fatalf("metrics: predicted %v, realized %v", pred, real)
	}
	// e0 renders as certified: its hits are realized.
	if st := endpointStatus(t, p, "e0"); st.Exact.State != "eligible" {
		t.Fatalf("e0: %+v", st.Exact)
	}

	// Lifting it by hand: only realized_shortfall is cleared there (the other holds lift on
	// evidence), an unknown endpoint is a 404, and the clear answers with the endpoint's state.
	if code, body := p.adminDo("POST", "/admin/rules/pool/endpoints/e1/exact/clear?hold=parity_mismatch", p.token, ""); code != http.StatusBadRequest || !strings.Contains(body, "parity_mismatch") {
		t.Fatalf("clearing parity_mismatch: %d %s", code, body)
	}
	if code, body := p.adminDo("POST", "/admin/rules/pool/endpoints/e9/exact/clear", p.token, ""); code != http.StatusNotFound || !strings.Contains(body, `endpoint \"e9\"`) {
		t.Fatalf("clearing an unknown endpoint: %d %s", code, body)
	}
	if code, body := p.adminDo("POST", "/admin/rules/nope/endpoints/e1/exact/clear", p.token, ""); code != http.StatusNotFound || !strings.Contains(body, `no such endpoint: rule \"nope\"`) {
		t.Fatalf("clearing in an unknown rule: %d %s", code, body)
	}
	if code, _ := p.adminDo("POST", "/admin/rules/pool/endpoints/e1/exact/clear", "wrong", ""); code != http.StatusUnauthorized {
		t.Fatalf("clear without the token: %d", code)
	}
	code, body := p.adminDo("POST", "/admin/rules/pool/endpoints/e1/exact/clear", p.token, "")
	var cleared gateway.EndpointExact
	if err := json.Unmarshal([]byte(body), &cleared); code != http.StatusOK || err != nil || cleared.State != "eligible" {
		t.Fatalf("clear: %d %s (%v)", code, body, err)
	}
	if e1 = endpointStatus(t, p, "e1"); e1.Exact.State != "eligible" || e1.Fenced != "" || eligibleMetric(t, p, "e1") != 1 || reasonMetric(t, p, "e1", "realized_shortfall") != 0 {
		t.Fatalf("after the clear: %+v (fence %q)", e1.Exact, e1.Fenced)
	}
	// The engine was not fixed: the count starts again from zero and suspends it anew after
	// exactly ShortfallHits KV-exact hits, not on the first.
	e1, n := untilSuspended(100)
	if n < gateway.DefaultShortfallHits || !slices.Equal(e1.Exact.Holds, []string{"realized_shortfall"}) {
		t.Fatalf("re-suspended after %d chats with %+v", n, e1.Exact)
	}
	// Re-certification (a certificate reload) rebuilds the endpoint's state: the suspension lifts.
	if _, err := p.g.ReloadCertificates(); err != nil {
		t.Fatal(err)
	}
	if e1 = endpointStatus(t, p, "e1"); e1.Exact.State != "eligible" || e1.Fenced != "" {
		t.Fatalf("after re-certification: %+v (fence %q)", e1.Exact, e1.Fenced)
	}
}

// TestE2EPredictedMatchesRealized: on a healthy pool every KV-exact hit's prediction is realized
// (the simulator's own receipts), streaming with include_usage and not.
func TestE2EPredictedMatchesRealized(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true})
	warmThenHit(t, p, false)
	warmThenHit(t, p, true)
	var pred, real float64
	for _, ep := range []string{"e0", "e1"} {
		pred += promtest.Value(t, p.reg, "kvexact_predicted_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": ep})
		real += promtest.Value(t, p.reg, "kvexact_realized_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": ep})
	}
	if pred == 0 || real < pred {
		t.Fatalf("predicted %v, realized %v: a healthy pool realizes at least what was predicted", pred, real)
	}
	// Every KV-exact hit is counted once by the evidence it stood on.
	var hits, confirmed, predicted float64
	for _, ep := range []string{"e0", "e1"} {
		hits += promtest.Value(t, p.reg, "kvexact_kv_exact_hits_total", map[string]string{"rule": "pool", "endpoint": ep})
		confirmed += promtest.Value(t, p.reg, "kvexact_kv_exact_hits_by_evidence_total", map[string]string{"rule": "pool", "endpoint": ep, "evidence": "engine_confirmed"})
		predicted += promtest.Value(t, p.reg, "kvexact_kv_exact_hits_by_evidence_total", map[string]string{"rule": "pool", "endpoint": ep, "evidence": "predicted"})
	}
	if confirmed == 0 || confirmed+predicted != hits {
		t.Fatalf("hits %v: engine-confirmed %v, predicted %v", hits, confirmed, predicted)
	}
	for _, ep := range []string{"e0", "e1"} {
		if st := endpointStatus(t, p, ep); st.Exact.State != "eligible" {
			t.Fatalf("%s: %+v", ep, st.Exact)
		}
	}
}

// TestE2ELostClearWithoutReplayDropsInventory: e0 has no replay socket. Its engine clears its
// cache and the AllBlocksCleared message is lost on the wire; the next message shows a gap of one.
// The gateway cannot know what the lost message removed, so it drops e0's inventory there and
// rebuilds it from the message on: the cleared prompt is no longer predicted on e0 (kept through
// the gap, it would be a false hit until the next clear), the new one is.
func TestE2ELostClearWithoutReplayDropsInventory(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3, certify: true})
	d := docs(2)
	direct(t, p.sims[0], d[0])
	eventually(t, 5*time.Second, "e0's inventory to hold the first prompt", func() bool { return p.overlap(d[0], "e0") > 0 })
	one := 1
	if _, err := p.sims[0].SetFaults(sim.FaultPatch{DropEvents: &one}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the engine's cache clear", func() bool { return p.sims[0].ClearCache() == nil })
	direct(t, p.sims[0], d[1])
	eventually(t, 5*time.Second, "e0's inventory to hold the second prompt", func() bool { return p.overlap(d[1], "e0") > 0 })
	if n := p.overlap(d[0], "e0"); n != 0 {
		t.Fatalf("e0 still predicts %d blocks of the prompt its engine cleared (the lost clear's gap was kept)", n)
	}
	if c := promtest.Value(t, p.reg, "kvexact_ingest_clears_total", map[string]string{"rule": "pool", "endpoint": "e0", "cause": "gap"}); c != 1 {
		t.Fatalf("gap clears on e0: %v, want 1", c)
	}
}

// TestE2EPublisherRestartSeenOnReconnect: e0's publisher restarts and its cache is wiped without an
// event (same process, so the identity check sees nothing), and nothing is published after. The
// reconnect's replay no longer holds what the gateway applied: e0's inventory is dropped at once
// and e0 is unverified until its new process is verified, with no event needed from it.
func TestE2EPublisherRestartSeenOnReconnect(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 3, certify: true, replay: true})
	doc := docs(1)[0]
	direct(t, p.sims[0], doc)
	eventually(t, 5*time.Second, "e0's inventory to hold the prompt", func() bool { return p.overlap(doc, "e0") > 0 })
	if err := p.sims[0].RestartPublisher(true); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "e0's inventory dropped on the reconnect", func() bool { return p.overlap(doc, "e0") == 0 })
	if c := promtest.Value(t, p.reg, "kvexact_ingest_clears_total", map[string]string{"rule": "pool", "endpoint": "e0", "cause": "publisher_restart"}); c != 1 {
		t.Fatalf("publisher_restart clears on e0: %v, want 1", c)
	}
	if st := endpointStatus(t, p, "e0"); st.Exact.Restarts == 0 {
		t.Fatalf("e0's restart not seen: %+v", st.Exact)
	}
}

// TestE2ECacheClearVerifiedWithoutTraffic: after an engine clears its cache, the endpoint is
// fenced until its verification completes; KV-exact sends a fenced endpoint no hit, so the gateway
// must complete the verification itself — here the parity watch needs more blocks (40) than the
// completion and chat probes hold, and no client request reaches e1: its own probes must bring the
// count there, and e1 is eligible again without traffic.
func TestE2ECacheClearVerifiedWithoutTraffic(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true,
		gwMod: func(o *gateway.Options) { o.ResumeAfterBlocks = 40 }})
	doc := docs(1)[0]
	direct(t, p.sims[1], doc)
	eventually(t, 5*time.Second, "e1's inventory to hold the prompt", func() bool { return p.overlap(doc, "e1") > 0 })
	if err := p.sims[1].ClearCache(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "e1 unverified since its cache clear", func() bool { return endpointStatus(t, p, "e1").Exact.Restarts > 0 })
	var e1 gateway.EndpointStatus
	deadline := time.Now().Add(20 * time.Second)
	for {
		e1 = endpointStatus(t, p, "e1")
		if e1.Exact.State == "eligible" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("e1 still %s 20 s after its cache clear with no client traffic: %+v", e1.Exact.State, e1.Exact)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if e1.Exact.Parity.Mismatches != 0 || e1.Exact.Probes.Reproduced < 3 {
		t.Fatalf("e1 eligible with %+v", e1.Exact)
	}
}
