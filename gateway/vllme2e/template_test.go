package vllme2e_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/route"
)

// TestChatTemplateDriftAfterRestart: e1 restarts with another --chat-template (the same seed,
// block size and tokenizer). Its completions hash as before, so the live parity watch sees only
// matching blocks; the chat probe the gateway sends after the restart, rendered with the certified
// template, is never stored by the engine: e1 stays suspended naming the chat template, and
// KV-exact never picks it for a chat. e1 is restarted with its certified configuration by the next
// test that needs the engines.
func TestChatTemplateDriftAfterRestart(t *testing.T) {
	g := startGateway(t)
	e1 := engines[1].Name
	tmpl := filepath.Join(t.TempDir(), "drifted.jinja")
	if err := os.WriteFile(tmpl, []byte("{{ messages[-1]['content'] }}\n{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The gateway's first replay of each engine's events runs while it starts: e1 is eligible once
	// its stream is synchronized.
	eventually(t, 60*time.Second, "e1 eligible before the restart", func() bool {
		return endpointStatus(t, g, e1).Exact.State == "eligible"
	})
	restartWith(t, 1, func(s *vllmpool.Spec) { s.Extra = []string{"--chat-template", tmpl} })
	drifted[1] = true

	// A few completions show the gateway the new process (its events, its identity) and feed the
	// parity watch; then the engine is left to the gateway's probes: more traffic would evict
	// under the small cache and leave a probe inconclusive.
	var st gateway.EndpointStatus
	for i := 0; i < 24; i++ {
		send(t, engines[1].URL, "/v1/completions", map[string]any{"model": g.model, "prompt": doc(fmt.Sprintf("after the template change %d", i), 4)}, false)
		time.Sleep(100 * time.Millisecond)
	}
	eventually(t, 60*time.Second, "e1 suspended by the chat probe", func() bool {
		st = endpointStatus(t, g, e1)
		return slices.Contains(st.Exact.Holds, "probe_not_reproduced")
	})
	if st.Exact.State != "suspended" || st.Exact.Parity.Mismatches != 0 || !strings.Contains(st.Fenced, "chat template") {
		t.Fatalf("e1 after the template change: fenced %q, %+v", st.Fenced, st.Exact)
	}
	if st.Exact.Probes.LastResult["completion"] != "reproduced" || !strings.HasPrefix(st.Exact.Probes.LastResult["chat"], "not reproduced") {
		t.Fatalf("probes: %+v (the completion probe reproduces, the chat probe does not)", st.Exact.Probes)
	}
	if st0 := endpointStatus(t, g, engines[0].Name); st0.Exact.State != "eligible" {
		t.Fatalf("e0 lost its eligibility with e1's restart: %+v", st0.Exact)
	}
	// A chat whose prefix only e1 holds (sent there directly) is still not routed there by KV-exact.
	held := []map[string]any{{"role": "user", "content": doc("held by the drifted e1", 8)}}
	send(t, engines[1].URL, "/v1/chat/completions", map[string]any{"model": g.model, "messages": held}, false)
	for range 3 {
		r := send(t, g.base, "/v1/chat/completions", map[string]any{"model": g.model, "messages": held}, false)
		if r.endpoint == e1 && r.decision.Tier == route.TierKVExact {
			t.Fatalf("KV-exact picked the drifted e1: %+v", r.decision)
		}
	}
}
