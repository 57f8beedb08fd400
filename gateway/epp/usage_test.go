package epp_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/promtest"
)

// endpointStatus is one endpoint's admin status.
func (w *world) endpointStatus(name string) gateway.EndpointStatus {
	w.t.Helper()
	for _, rs := range w.g.Status().Rules {
		for _, e := range rs.Endpoints {
			if e.Name == name {
				return e
			}
		}
	}
	w.t.Fatalf("no endpoint %s in the status", name)
	return gateway.EndpointStatus{}
}

// TestShortfallThroughPickerSuspends is the standalone gateway's drift scenario
// (TestE2ETemplateDriftSeenOnlyByRealizedHits) seen through the picker: e1's engine renders chats
// with another template than the certified one, so its events stay self-consistent while the
// picker's KV-exact hits on e1 come back with 0 cached tokens. The response path's usage reaches
// the gateway's accounting, and after ShortfallHits such hits e1 is suspended with the drift
// reason, the predicted and realized counters showing why.
func TestShortfallThroughPickerSuspends(t *testing.T) {
	const drifted = "{{ messages[-1]['content'] }}\n{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
	w := startWorld(t, worldSpec{n: 2, sim: func(i int, c *sim.Config) {
		if i == 1 {
			c.ServeChatTemplate = drifted
		}
	}})
	system := prefixes(1)[0]
	chat := func(k int) []byte {
		b, _ := json.Marshal(map[string]any{"model": "llama3", "max_tokens": 1, "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": fmt.Sprintf("Question number %d: what is topic %d about?", k, k)}}})
		return b
	}
	// The certified rendering of question 0, sent to e1 as token ids: the shared system prompt's
	// blocks are on e1 under the keys the gateway computes for every question.
	tok, _ := tokenize.NewPool("").Get("llama3")
	cr, err := tokenize.ParseChatRequest(chat(0))
	if err != nil {
		t.Fatal(err)
	}
	ids, _, err := tok.EncodeChat(cr)
	if err != nil {
		t.Fatal(err)
	}
	warm, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": ids, "max_tokens": 1})
	resp, err := http.Post(w.sims[1].URL()+"/v1/completions", "application/json", bytes.NewReader(warm))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	eventually(t, 10*time.Second, "e1's inventory to hold the system prompt", func() bool { return w.endpointStatus("e1").Resident > 10 })
	var e1 gateway.EndpointStatus
	for k := 1; ; k++ {
		if k == 20 {
			t.Fatalf("e1 not suspended after 20 chats through the picker: %+v", e1.Exact)
		}
		res := w.request(envoyRequest{path: "/v1/chat/completions", body: chat(k)})
		if res.immediate != nil {
			t.Fatalf("chat %d: immediate response %v", k, res.immediate)
		}
		w.forward(res, "/v1/chat/completions", "")
		if e1 = w.endpointStatus("e1"); e1.Exact.State == "suspended" {
			break
		}
	}
	if !slices.Equal(e1.Exact.Holds, []string{"realized_shortfall"}) || !strings.Contains(e1.Fenced, "tokenizer or template drift suspected") {
		t.Fatalf("e1 suspended with %+v (fence %q)", e1.Exact, e1.Fenced)
	}
	if e1.Exact.Parity.Mismatches != 0 || e1.Exact.Parity.MatchedBlocks == 0 {
		t.Fatalf("the event watch should have seen only matching blocks: %+v", e1.Exact.Parity)
	}
	pred := promtest.Value(t, w.reg, "kvexact_predicted_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": "e1"})
	real := promtest.Value(t, w.reg, "kvexact_realized_cached_tokens_total", map[string]string{"rule": "pool", "endpoint": "e1"})
	if pred < 3*16 || pred != float64(e1.Exact.PredictedCachedTokens) || real != 0 {
		t.Fatalf("metrics: predicted %v (status %d), realized %v", pred, e1.Exact.PredictedCachedTokens, real)
	}
	if st := w.endpointStatus("e0"); st.Exact.State != "eligible" {
		t.Fatalf("e0: %+v", st.Exact)
	}
	w.noLeak()
}
