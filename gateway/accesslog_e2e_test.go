package gateway_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/proxy"
)

// syncBuffer is a log sink the proxy's goroutines and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func (s *syncBuffer) lines() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// TestE2EAccessLog: one JSON access-log line per request, with the request id the client got, the
// rule, the endpoint and tier that served, the predicted and realized cached tokens (a repeated
// prompt on a certified pool: KV-exact predicts what the engine then reports), the status, TTFB
// and duration; a request no rule serves is logged too, with rule and tier "none".
func TestE2EAccessLog(t *testing.T) {
	var sink syncBuffer
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", seed: strp("0"), n: 2, mode: 3, certify: true, blockSize: 16,
		accessLog: slog.New(slog.NewJSONHandler(&sink, nil))})
	prompt := strings.Repeat("The access log names what served each request. ", 24)
	first := p.complete(prompt, false)
	var second completion
	eventually(t, 10*time.Second, "a KV-exact hit on the repeated prompt", func() bool {
		second = p.complete(prompt, false)
		return second.status == 200 && second.cached > 0
	})
	if first.status != 200 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	resp, err := http.Post(p.base+"/v1/completions", "application/json", strings.NewReader(`{"model":"no-such-model","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	unknownID := resp.Header.Get(proxy.HeaderRequestID)

	var lines []map[string]any
	eventually(t, 5*time.Second, "the access-log lines", func() bool {
		lines = sink.lines()
		return len(lines) > 0 && lines[len(lines)-1]["request_id"] == unknownID
	})
	n := 0
	for _, l := range lines {
		if l["msg"] == "access" {
			n++
		}
	}
	// warm-up requests go to the engines directly; every request through the gateway is one line
	if n < 3 {
		t.Fatalf("%d access lines for at least 3 requests: %v", n, lines)
	}
	hit := lines[len(lines)-2]
	for k, want := range map[string]any{"msg": "access", "method": "POST", "path": "/v1/completions", "rule": "pool", "endpoint": second.endpoint,
		"tier": "kv-exact", "status": float64(200), "realized_cached_tokens": float64(second.cached)} {
		if hit[k] != want {
			t.Errorf("hit line %s = %v, want %v (%v)", k, hit[k], want, hit)
		}
	}
	if id, _ := hit["request_id"].(string); !strings.HasPrefix(id, "kvx-") {
		t.Errorf("request_id %v", hit["request_id"])
	}
	if pred, _ := hit["predicted_cached_tokens"].(float64); pred < float64(second.cached) || pred <= 0 {
		t.Errorf("predicted_cached_tokens %v for %d realized", hit["predicted_cached_tokens"], second.cached)
	}
	ttfb, _ := hit["ttfb"].(float64) // JSON: nanoseconds
	d, _ := hit["duration"].(float64)
	if ttfb <= 0 || d < ttfb {
		t.Errorf("ttfb %v, duration %v", hit["ttfb"], hit["duration"])
	}
	miss := lines[len(lines)-1]
	for k, want := range map[string]any{"rule": "none", "tier": "none", "status": float64(404), "predicted_cached_tokens": float64(0)} {
		if miss[k] != want {
			t.Errorf("unknown-model line %s = %v, want %v (%v)", k, miss[k], want, miss)
		}
	}
	if ttfb, _ := miss["ttfb"].(float64); ttfb <= 0 {
		t.Errorf("unknown-model line ttfb %v: the gateway's own answer has a first byte too", miss["ttfb"])
	}
	for _, k := range []string{"endpoint", "realized_cached_tokens"} {
		if _, ok := miss[k]; ok {
			t.Errorf("unknown-model line has %s: %v", k, miss)
		}
	}
	closedSetLabels(t, p)
}

// closedSetLabels: after traffic, every label value of every series is a validated name (rule,
// endpoint), the build's stamp, or a code of a closed set — never free text, which would open the
// label set (a reason's words belong in /admin/status).
func closedSetLabels(t *testing.T, p *pool) {
	t.Helper()
	mfs, err := p.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	code := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,39}$|^$`) // one word, bounded
	named := map[string]bool{"rule": true, "endpoint": true, "version": true, "revision": true, "goversion": true, "le": true, "quantile": true}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if !named[lp.GetName()] && !code.MatchString(lp.GetValue()) {
					t.Errorf("%s{%s=%q}: not a code of a closed set", mf.GetName(), lp.GetName(), lp.GetValue())
				}
			}
		}
	}
}
