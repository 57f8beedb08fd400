package epp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/promtest"
)

// prefixes are long shared prefixes (many blocks each), one per group of the workload.
func prefixes(n int) []string {
	out := make([]string, n)
	for i := range out {
		var b strings.Builder
		for j := 0; j < 40; j++ {
			fmt.Fprintf(&b, "Group %d, line %d: the quick brown fox %d jumps over the lazy dog. ", i, j, i*j)
		}
		out[i] = b.String()
	}
	return out
}

// TestPickerDecidesAsTheGateway is the differential: a shared-prefix workload goes alternately
// through the standalone proxy and through the picker (the test playing Envoy, forwarding to the
// chosen endpoint and streaming the response back); every request gets the same endpoint and the
// same tier from both front ends, the destination header equals the metadata, the body comes back
// unchanged, the receipt names the served endpoint and the realized cached tokens are counted.
func TestPickerDecidesAsTheGateway(t *testing.T) {
	w := startWorld(t, worldSpec{n: 3})
	groups := prefixes(6)
	// Warm: each group's prefix lands on one endpoint and its events reach the inventory.
	for gi, p := range groups {
		ep, _ := w.proxied(completionBody(p))
		rt, _ := w.g.Router("pool")
		eventually(t, 30*time.Second, "group "+fmt.Sprint(gi)+" in the inventory", func() bool {
			req, _ := http.NewRequest("POST", "/v1/completions", nil)
			r, err := proxy.ParseRequest(req, completionBody(p+" probe"))
			if err != nil {
				t.Fatal(err)
			}
			d, err := rt.Explain(context.Background(), r)
			return err == nil && d.Tier == route.TierKVExact && d.TargetN == ep
		})
	}
	kvExact := 0
	for i := 0; i < 24; i++ {
		body := completionBody(groups[i%len(groups)] + fmt.Sprintf(" question %d?", i))
		wantEp, wantTier := w.proxied(body)
		// Every other request as an Envoy whose response body is full duplex (each chunk given
		// back), the rest as deploy/envoy's (STREAMED, answered without a mutation).
		res := w.request(envoyRequest{path: "/v1/completions", body: body, chunk: 700, duplexResponse: i%2 == 1})
		if res.immediate != nil {
			t.Fatalf("request %d: immediate response %v", i, res.immediate)
		}
		if res.header == "" || res.header != res.metadata {
			t.Fatalf("request %d: destination header %q and metadata %q must be equal and set", i, res.header, res.metadata)
		}
		if string(res.body) != string(body) {
			t.Fatalf("request %d: the body came back changed (%d bytes for %d)", i, len(res.body), len(body))
		}
		first, _, _ := strings.Cut(res.header, ",")
		if got := w.byAddr[first]; got != wantEp || tierOf(res.decision) != wantTier {
			t.Fatalf("request %d: picker chose %s (%s), the standalone gateway %s (%s)", i, got, tierOf(res.decision), wantEp, wantTier)
		}
		if wantTier == route.TierKVExact {
			kvExact++
		}
		receipt, rbody := w.forward(res, "/v1/completions", "")
		if receipt != wantEp {
			t.Fatalf("request %d: receipt %q, want %q", i, receipt, wantEp)
		}
		if !strings.Contains(string(rbody), `"usage"`) {
			t.Fatalf("request %d: response body not given back: %q", i, rbody)
		}
	}
	if kvExact < 20 {
		t.Fatalf("only %d of 24 decisions were KV-exact: the workload does not test exact routing", kvExact)
	}
	// The standalone proxy accounts its responses too (as in production): what the picker's
	// response path accounts is the counters' growth over picker-only requests, once the proxy's
	// last report has landed.
	usage := func() (pred, real float64) {
		for ep := range 3 {
			l := map[string]string{"rule": "pool", "endpoint": fmt.Sprintf("e%d", ep)}
			pred += promtest.Value(t, w.reg, "kvexact_predicted_cached_tokens_total", l)
			real += promtest.Value(t, w.reg, "kvexact_realized_cached_tokens_total", l)
		}
		return pred, real
	}
	p0, r0 := usage()
	eventually(t, 5*time.Second, "the standalone proxy's usage reports to settle", func() bool {
		time.Sleep(50 * time.Millisecond)
		p1, r1 := usage()
		settled := p1 == p0 && r1 == r0
		p0, r0 = p1, r1
		return settled
	})
	for i, g := range groups {
		res := w.request(envoyRequest{path: "/v1/completions", body: completionBody(g + fmt.Sprintf(" picker question %d?", i)), chunk: 700})
		if res.immediate != nil {
			t.Fatalf("picker-only request %d: immediate response %v", i, res.immediate)
		}
		w.forward(res, "/v1/completions", "")
	}
	pred, real := usage()
	pred, real = pred-p0, real-r0
	if pred <= 0 || real < pred {
		t.Fatalf("predicted %v, realized %v cached tokens: the response stream's usage was not accounted (a healthy pool realizes what was predicted)", pred, real)
	}
	w.noLeak()
}

// noLeak: every stream ended and every decision gave its load back.
func (w *world) noLeak() {
	w.t.Helper()
	eventually(w.t, 5*time.Second, "streams closed and load released", func() bool {
		rt, _ := w.g.Router("pool")
		for _, e := range rt.Endpoints() {
			if e.Load() != 0 {
				return false
			}
		}
		return promtest.Value(w.t, w.reg, "kvexact_epp_streams_active", nil) == 0
	})
}

func TestSubsetHint(t *testing.T) {
	w := startWorld(t, worldSpec{n: 3})
	var addrs []string
	for a := range w.byAddr {
		addrs = append(addrs, a)
	}
	for _, only := range addrs {
		for i := 0; i < 4; i++ {
			res := w.request(envoyRequest{path: "/v1/completions", body: completionBody(strings.Repeat(fmt.Sprintf("subset prompt %d for %s. ", i, only), 12)), subset: []string{only, "10.9.9.9:1"}})
			if res.header != only {
				t.Fatalf("subset [%s]: destination %q (fallbacks must stay inside the subset too)", only, res.header)
			}
			if strings.Contains(res.decision, "connect_failed") {
				t.Fatalf("the evidence must call a subset exclusion what it is: %s", res.decision)
			}
			res.cancel()
		}
	}
	res := w.request(envoyRequest{path: "/v1/completions", body: completionBody("x"), subset: []string{"10.9.9.9:1"}})
	if res.immediate == nil || res.immediate.Status.Code != http.StatusServiceUnavailable {
		t.Fatalf("subset of unknown endpoints: want ImmediateResponse 503, got %+v", res)
	}
	res = w.request(envoyRequest{path: "/v1/completions", body: completionBody("x"), hint: true})
	if res.immediate == nil || res.immediate.Status.Code != http.StatusServiceUnavailable {
		t.Fatalf("empty subset: want ImmediateResponse 503, got %+v", res)
	}
	w.noLeak()
}

func TestFallbackList(t *testing.T) {
	w := startWorld(t, worldSpec{n: 4, picker: func(p *assemble.Picker) { p.Fallbacks = 2 }})
	res := w.request(envoyRequest{path: "/v1/completions", body: completionBody("fallback prompt")})
	list := strings.Split(res.header, ",")
	if len(list) != 3 || list[0] == list[1] || list[1] == list[2] || list[0] == list[2] {
		t.Fatalf("want primary and 2 distinct fallbacks, got %q", res.header)
	}
	res.cancel()
	// An endpoint taken down is never listed.
	down := w.byAddr[list[1]]
	if !w.g.SetEndpointState("pool", down, "down") {
		t.Fatal("could not take", down, "down")
	}
	for i := 0; i < 8; i++ {
		res := w.request(envoyRequest{path: "/v1/completions", body: completionBody(fmt.Sprintf("fallback prompt %d", i))})
		for _, a := range strings.Split(res.header, ",") {
			if w.byAddr[a] == down {
				t.Fatalf("endpoint %s is down but listed in %q", down, res.header)
			}
		}
		res.cancel()
	}
	// A failover: Envoy reports a fallback served; the receipt follows it and the failover counts.
	res = w.request(envoyRequest{path: "/v1/completions", body: completionBody("failover prompt")})
	list = strings.Split(res.header, ",")
	receipt, _ := w.forward(res, "/v1/completions", list[1])
	if receipt != w.byAddr[list[1]] {
		t.Fatalf("failover receipt %q, want %q", receipt, w.byAddr[list[1]])
	}
	if v := promtest.Value(t, w.reg, "kvexact_epp_failovers_total", map[string]string{"rule": "pool"}); v != 1 {
		t.Fatalf("failovers %v, want 1", v)
	}
	w.noLeak()
}

func TestNothingEligible503(t *testing.T) {
	w := startWorld(t, worldSpec{n: 2})
	for _, n := range []string{"e0", "e1"} {
		w.g.SetEndpointState("pool", n, "down")
	}
	res := w.request(envoyRequest{path: "/v1/completions", body: completionBody("no one home")})
	if res.immediate == nil || res.immediate.Status.Code != http.StatusServiceUnavailable {
		t.Fatalf("want 503, got %+v", res)
	}
	var e struct {
		Error struct{ Code, Type string }
	}
	if err := json.Unmarshal(res.immediate.Body, &e); err != nil || e.Error.Code != "no_healthy_endpoint" {
		t.Fatalf("503 body %q is not OpenAI-shaped with code no_healthy_endpoint", res.immediate.Body)
	}
	res = w.request(envoyRequest{path: "/v1/completions", body: completionBody("x")[:5]})
	if res.immediate == nil || res.immediate.Status.Code != http.StatusBadRequest {
		t.Fatalf("truncated JSON: want 400, got %+v", res)
	}
	res = w.request(envoyRequest{path: "/v1/completions", body: completionBody("x"), contentType: "text/plain"})
	if res.immediate == nil || res.immediate.Status.Code != http.StatusUnsupportedMediaType {
		t.Fatalf("text/plain body: want 415 as the standalone proxy answers, got %+v", res)
	}
	res = w.request(envoyRequest{path: "/v1/completions", body: []byte(`{"model":"nope","prompt":"x"}`)})
	if res.immediate == nil || res.immediate.Status.Code != http.StatusNotFound {
		t.Fatalf("unknown model: want 404, got %+v", res)
	}
	w.noLeak()
}

func TestBodyLimit413(t *testing.T) {
	w := startWorld(t, worldSpec{n: 1, cfg: func(c *rules.Config) { c.MaxBodyBytes = 1000 }})
	res := w.request(envoyRequest{path: "/v1/completions", body: completionBody(strings.Repeat("long ", 400)), chunk: 300})
	if res.immediate == nil || res.immediate.Status.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("want 413, got %+v", res)
	}
	w.noLeak()
}

// TestPrefillDecode: a P/D rule's decision names the decode endpoint as the destination and the
// prefill endpoint in x-prefiller-host-port; with admission shedding, a request finding every
// prefill endpoint at its cap gets 429, and the slot is free again once the first stream ends.
func TestPrefillDecode(t *testing.T) {
	w := startWorld(t, worldSpec{n: 2, roles: []string{"prefill", "decode"}, mod: func(r *rules.Rule) {
		r.KVExactMode = 1
		r.Selector = ""
		r.Admission = rules.Admission{Enabled: true, Mode: "shed", MaxInflightPerEndpoint: 1}
	}})
	var prefill, decode string
	for a, n := range w.byAddr {
		if n == "e0" {
			prefill = a
		} else {
			decode = a
		}
	}
	first := w.request(envoyRequest{path: "/v1/completions", body: completionBody("disaggregated prompt")})
	if first.header != decode || first.metadata != decode || first.prefill != prefill {
		t.Fatalf("P/D: destination %q / metadata %q / prefill %q, want decode %s and prefill %s", first.header, first.metadata, first.prefill, decode, prefill)
	}
	second := w.request(envoyRequest{path: "/v1/completions", body: completionBody("disaggregated prompt 2")})
	if second.immediate == nil || second.immediate.Status.Code != http.StatusTooManyRequests {
		t.Fatalf("prefill at its cap with admission shed: want 429, got %+v", second)
	}
	first.cancel() // Envoy drops the stream: the slot must come back
	eventually(t, 5*time.Second, "the shed slot freed", func() bool {
		r := w.request(envoyRequest{path: "/v1/completions", body: completionBody("disaggregated prompt 3")})
		defer r.cancel()
		return r.immediate == nil && r.header == decode
	})
	w.noLeak()
}

// TestMalformedStreams: each malformed stream ends with InvalidArgument naming what was wrong, the
// picker keeps serving, and nothing leaks.
func TestMalformedStreams(t *testing.T) {
	w := startWorld(t, worldSpec{n: 2})
	headers := func(kv ...string) *extprocv3.ProcessingRequest {
		return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs(kv...)}}}
	}
	body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: completionBody("m"), EndOfStream: true}}}
	badSubset := headers(":path", "/v1/completions")
	notList, _ := structpb.NewStruct(map[string]any{epp.SubsetKey: "10.0.0.1:80"})
	badSubset.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.SubsetNamespace: notList}}
	cases := []struct {
		name string
		msgs []*extprocv3.ProcessingRequest
		want string
	}{
		{"body first", []*extprocv3.ProcessingRequest{body}, "request_body before request_headers"},
		{"no path", []*extprocv3.ProcessingRequest{headers(":method", "POST")}, "no :path"},
		{"headers twice", []*extprocv3.ProcessingRequest{headers(":path", "/v1/completions"), headers(":path", "/v1/completions")}, "received twice"},
		{"subset not a list", []*extprocv3.ProcessingRequest{badSubset}, "x-gateway-destination-endpoint-subset"},
		{"response first", []*extprocv3.ProcessingRequest{{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{}}}}, "response_headers before"},
		{"empty message", []*extprocv3.ProcessingRequest{{}}, "without any request field"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			st, err := w.client.Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range c.msgs {
				st.Send(m)
			}
			_, err = st.Recv()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want InvalidArgument mentioning %q, got %v", c.want, err)
			}
		})
	}
	// Body after a decision was made, i.e. after the end of stream: also malformed, and the decision
	// taken before is given back.
	res := w.request(envoyRequest{path: "/v1/completions", body: completionBody("decided")})
	res.stream.Send(body)
	if _, err := res.stream.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("body after end of stream: want InvalidArgument, got %v", err)
	}
	if v := promtest.Value(t, w.reg, "kvexact_epp_malformed_streams_total", nil); v != float64(len(cases)+1) {
		t.Fatalf("malformed streams counted %v, want %d", v, len(cases)+1)
	}
	// Still serving.
	if ok := w.request(envoyRequest{path: "/v1/completions", body: completionBody("after")}); ok.header == "" {
		t.Fatal("the picker stopped deciding after malformed streams")
	} else {
		ok.cancel()
	}
	w.noLeak()
}

func TestHealthServices(t *testing.T) {
	w := startWorld(t, worldSpec{n: 1})
	hc := healthpb.NewHealthClient(w.conn)
	check := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("health %q: %v", svc, err)
		}
		return r.Status
	}
	for _, svc := range []string{epp.HealthLiveness, epp.HealthReadiness, epp.HealthExtProc} {
		if s := check(svc); s != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%s: %v, want SERVING", svc, s)
		}
	}
	w.picker.SetReady(false)
	if s := check(epp.HealthReadiness); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("readiness after SetReady(false): %v", s)
	}
	if s := check(epp.HealthExtProc); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("ext_proc after SetReady(false): %v", s)
	}
	if s := check(epp.HealthLiveness); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("liveness must not follow readiness: %v", s)
	}
}

// TestHeadersOnlyRequest: a request without a body (GET /v1/models) is routed by the listener's
// only rule, through its selector; the destination comes with the headers response.
func TestHeadersOnlyRequest(t *testing.T) {
	w := startWorld(t, worldSpec{n: 2})
	res := w.request(envoyRequest{path: "/v1/models"})
	if res.immediate != nil || res.header == "" || res.header != res.metadata {
		t.Fatalf("headers-only request: %+v", res)
	}
	if first, _, _ := strings.Cut(res.header, ","); w.byAddr[first] == "" {
		t.Fatalf("destination %q is not one of the pool's endpoints", res.header)
	}
	res.cancel()
	w.noLeak()
}
