package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
)

// TestE2ERouterBindingTokenDrift: on the router binding (TensorRT-LLM) the gateway hashes the
// engine's own token ids, so no key can disagree; e1's engine renders chats with another template
// than the certified one, and only the token side shows it. The gateway looks for each routed
// prompt's deepest block among what the endpoint then published: e0 reproduces every prompt, e1
// stores blocks that are never ours and is suspended with token_drift after TokenDriftChecks
// prompts — before any KV-exact decision chose it, so the realized shortfall has nothing to see.
// The operator's clear lifts it.
func TestE2ERouterBindingTokenDrift(t *testing.T) {
	const drifted = "{{ messages[-1]['content'] }}\n{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
	p := startPool(t, poolSpec{family: "trtllm", release: "1.2", n: 2, seed: strp("0"), mode: 3, certify: true,
		simMod: func(i int, c *sim.Config) {
			if i == 1 {
				c.ServeChatTemplate = drifted
			}
		},
		gwMod: func(o *gateway.Options) { o.TokenCheckGrace = 300 * time.Millisecond }})
	if st := p.g.Status().Rules[0].Exact; !st.Enabled || st.Binding != "router" {
		t.Fatalf("exact %+v: the test needs KV-exact on the router binding", st)
	}
	system := docs(1)[0]
	chat := func(k int) []byte {
		b, _ := json.Marshal(map[string]any{"model": "llama3", "max_tokens": 1, "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": fmt.Sprintf("Question number %d: what is topic %d about?", k, k)}}})
		return b
	}
	send := func(k int) {
		resp, err := http.Post(p.base+"/v1/chat/completions", "application/json", bytes.NewReader(chat(k)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("chat %d: status %d", k, resp.StatusCode)
		}
	}
	// e0 down: every chat goes to e1.
	if code, body := p.adminDo("POST", "/admin/rules/pool/endpoints/e0/down", p.token, ""); code != http.StatusOK {
		t.Fatalf("e0 down: %d %s", code, body)
	}
	var e0, e1 gateway.EndpointStatus
	for k := 0; ; k++ {
		if k == 30 {
			t.Fatalf("e1 not suspended after 30 chats: e1 %+v, token check %+v", e1.Exact, e1.Exact.TokenCheck)
		}
		send(k)
		time.Sleep(100 * time.Millisecond) // let the checks' grace pass between requests
		if e1 = endpointStatus(t, p, "e1"); e1.Exact.State == "suspended" {
			break
		}
	}
	if !slices.Equal(e1.Exact.Holds, []string{"token_drift"}) || !strings.Contains(e1.Fenced, "tokenizer or template drift") {
		t.Fatalf("e1 suspended with %+v (fence %q)", e1.Exact, e1.Fenced)
	}
	if tc := e1.Exact.TokenCheck; tc == nil || tc.NotReproduced < gateway.DefaultTokenDriftChecks || tc.Reproduced != 0 || !strings.Contains(tc.LastMiss, "is not among") {
		t.Fatalf("e1 token check %+v", e1.Exact.TokenCheck)
	}
	if reasonMetric(t, p, "e1", "token_drift") != 1 || eligibleMetric(t, p, "e1") != 0 {
		t.Fatal("metrics: e1 not reported ineligible for token_drift")
	}
	// e0 renders as certified: every conclusive check reproduced the prompt.
	if code, body := p.adminDo("POST", "/admin/rules/pool/endpoints/e0/up", p.token, ""); code != http.StatusOK {
		t.Fatalf("e0 up: %d %s", code, body)
	}
	for k := 100; k < 106; k++ {
		send(k)
	}
	eventually(t, 5*time.Second, "e0's checks", func() bool {
		e0 = endpointStatus(t, p, "e0")
		return e0.Exact.TokenCheck != nil && e0.Exact.TokenCheck.Reproduced > 0
	})
	if e0.Exact.State != "eligible" || e0.Exact.TokenCheck.NotReproduced != 0 {
		t.Fatalf("e0: %+v, token check %+v", e0.Exact, e0.Exact.TokenCheck)
	}
	// After fixing the engine the operator clears the hold.
	code, body := p.adminDo("POST", "/admin/rules/pool/endpoints/e1/exact/clear?hold=token_drift", p.token, "")
	if code != http.StatusOK || endpointStatus(t, p, "e1").Exact.State != "eligible" {
		t.Fatalf("clear: %d %s", code, body)
	}
}
