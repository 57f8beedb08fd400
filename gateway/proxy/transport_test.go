package proxy

import (
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/rules"
)

// TestHTTPSEndpointWithCA: an https:// endpoint is reached when its certificate chains to the
// rule's upstream.caFile, and refused (no response relayed) when it does not.
func TestHTTPSEndpointWithCA(t *testing.T) {
	u := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"over TLS","finish_reason":"stop"}]}`)
	}))
	defer u.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, withCA := range []bool{true, false} {
		p := newPool(t, "vllm", 0, []epSpec{{name: "a", addr: u.URL}}, nil, func(r *rules.Rule) {
			if withCA {
				r.Upstream.CAFile = ca
			}
		}, nil)
		resp, b := p.post(t, "/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
		switch {
		case withCA && (resp.StatusCode != 200 || !strings.Contains(string(b), "over TLS")):
			t.Fatalf("with the CA: %d %s", resp.StatusCode, b)
		case !withCA && resp.StatusCode != http.StatusServiceUnavailable:
			t.Fatalf("without the CA: %d %s", resp.StatusCode, b)
		}
		p.proxy.CloseIdleConnections()
	}
}

// TestRuleTransportPerVersion: each rule gets its own transport, a changed rule a new one (its
// settings apply), and Forget drops a deleted rule's.
func TestRuleTransportPerVersion(t *testing.T) {
	p := New(Config{})
	r1 := &rules.Rule{Name: "a"}
	r1b := &rules.Rule{Name: "a", Upstream: rules.Upstream{MaxConnsPerHost: 7}}
	r2 := &rules.Rule{Name: "b"}
	t1, _ := p.transportOf(r1)
	if again, _ := p.transportOf(r1); again != t1 {
		t.Fatal("the same rule got a second transport")
	}
	t2, _ := p.transportOf(r2)
	if t2 == t1 {
		t.Fatal("two rules share a transport")
	}
	t1b, _ := p.transportOf(r1b)
	if t1b == t1 || t1b.(*http.Transport).MaxConnsPerHost != 7 || t1.(*http.Transport).MaxIdleConnsPerHost != 1024 {
		t.Fatal("a changed rule kept its old transport or settings")
	}
	n := 0
	p.transports.Range(func(*rules.Rule, ruleTransport) { n++ })
	if n != 2 {
		t.Fatalf("%d transports kept, want 2 (the old version dropped)", n)
	}
	p.Forget("a")
	n = 0
	p.transports.Range(func(r *rules.Rule, _ ruleTransport) {
		if r.Name == "a" {
			n++
		}
	})
	if n != 0 {
		t.Fatal("Forget kept the deleted rule's transport")
	}
}
