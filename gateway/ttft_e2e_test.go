package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/rules"
)

// TestE2ETTFTLawLearnsFromStreamedReceipts: under the ttft law, streamed answers through the
// proxy teach the serving endpoints their rates (the receipt path), and the dry decision shows
// each candidate's prediction with its parts.
func TestE2ETTFTLawLearnsFromStreamedReceipts(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true,
		ruleMod: func(r *rules.Rule) { r.LoadLaw.Kind = "ttft" }})
	warmThenHit(t, p, true)
	rt, _ := p.g.Router("pool")
	learned := 0
	for _, e := range rt.Endpoints() {
		if r, ok := e.Rates(); ok && r.Prefill > 0 {
			// A receipt's TTFT runs from the upstream send to the first streamed bytes: no request
			// of this test takes a second, so no token can have taken one to prefill.
			if r.Prefill >= time.Second {
				t.Fatalf("%s learned a prefill rate of %v a token: the receipts' TTFT is not timed from the upstream send", e.Name, r.Prefill)
			}
			learned++
		}
		if e.Ahead() != 0 {
			t.Fatalf("%s: %d prefill tokens still queued after every request ended", e.Name, e.Ahead())
		}
	}
	if learned == 0 {
		t.Fatal("no endpoint learned its rates from the streamed receipts")
	}
	body, _ := json.Marshal(map[string]any{"model": p.model, "prompt": docs(1)[0] + " And a follow-up question?"})
	hr, _ := http.NewRequest("POST", "/v1/completions", nil)
	req, err := proxy.ParseRequest(hr, body)
	if err != nil {
		t.Fatal(err)
	}
	d, err := rt.Explain(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	// The holder's whole prompt is cached (0 own tokens, nothing in flight: 0 ms); the other
	// endpoint must prefill it.
	positive := 0
	for _, ev := range d.Endpoints {
		if ev.TTFT == nil || ev.TTFT.Rates.Prefill <= 0 {
			t.Fatalf("%s: no prediction in the decision: %+v", ev.Name, ev)
		}
		if ev.TTFT.TotalMS > 0 {
			positive++
		}
		if ev.TTFT.TotalMS >= 60_000 {
			t.Fatalf("%s: predicted %v ms to a first token", ev.Name, ev.TTFT.TotalMS)
		}
	}
	if positive == 0 {
		t.Fatalf("every candidate predicted 0 ms: %+v", d.Endpoints)
	}
}
