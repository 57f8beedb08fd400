package epp_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/promtest"
)

// world is a simulator pool on 127.0.0.1 behind one gateway with both front ends: the standalone
// proxy (HTTP) and the picker (ext_proc over gRPC).
type world struct {
	t      testing.TB
	sims   []*sim.Engine
	g      *gateway.Gateway
	base   string // the standalone proxy
	picker *epp.Server
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
	reg    *prometheus.Registry
	byAddr map[string]string // "ip:port" → endpoint name
	roles  []string          // worldSpec.roles
}

type worldSpec struct {
	n      int
	roles  []string
	mod    func(r *rules.Rule)
	cfg    func(c *rules.Config)      // changes the configuration (after the rule's mod)
	picker func(p *assemble.Picker)   // changes the picker's setup
	sim    func(i int, c *sim.Config) // changes endpoint i's simulator
	tracer trace.Tracer               // the picker's tracer (nil: traces off)
}

func startWorld(t testing.TB, spec worldSpec) *world {
	t.Helper()
	toks := tokenize.NewPool("")
	tok, err := toks.Get("llama3")
	if err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	ct, err := contracts.Lookup("vllm", "v0.25.1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	seed := "0"
	w := &world{t: t, byAddr: map[string]string{}, roles: spec.roles}
	rule := rules.Rule{Name: "pool", Models: []string{"llama3"}, Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, KVExactMode: 3, Seed: &seed, Selector: "chwbl"}
	zero := 0
	rule.LoadLaw.ColdStartSeedN = &zero
	for i := 0; i < spec.n; i++ {
		role := "normal"
		if i < len(spec.roles) {
			role = spec.roles[i]
		}
		sc := sim.Config{Family: "vllm", Release: "v0.25.1", Model: "llama3", Tokenizer: tok, ServedModelName: "llama3",
			Endpoint: fmt.Sprintf("e%d", i), Seed: &seed, Role: sim.Role(role), PublishAddr: "tcp://*:0",
			PrefillPerToken: 20 * time.Microsecond, DecodePerToken: 200 * time.Microsecond}
		if spec.sim != nil {
			spec.sim(i, &sc)
		}
		e, err := sim.New(sc)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		w.sims = append(w.sims, e)
		rule.Endpoints = append(rule.Endpoints, rules.Endpoint{Name: fmt.Sprintf("e%d", i), Address: e.URL(), Role: role, Events: rules.Events{ZMQ: e.PublishAddrs()}})
		w.byAddr[strings.TrimPrefix(e.URL(), "http://")] = fmt.Sprintf("e%d", i)
	}
	if spec.mod != nil {
		spec.mod(&rule)
	}
	cfg := &rules.Config{Listen: "127.0.0.1:0", Admin: rules.Admin{Listen: "127.0.0.1:0", Token: "t"}, DebugHeader: true, Rules: []rules.Rule{rule}}
	if spec.cfg != nil {
		spec.cfg(cfg)
	}
	if err := cfg.Normalize(); err != nil {
		t.Fatal(err)
	}
	r := cfg.Rules[0]
	js, cs := tok.Files()
	prof := certificate.NewProfile(ct.Family, ct.ID, "llama3", js, cs, tok.Config().ChatTemplate, r.BlockSize, r.Binding, r.HashAlgorithm, r.Seed)
	c := &certificate.Certificate{Format: certificate.FormatVersion, Profile: prof, ProfileDigest: prof.Digest(), IssuedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}
	for i := range r.Endpoints {
		id := gateway.IdentityOf(&r, i)
		ev := id.Events
		c.Endpoints = append(c.Endpoints, certificate.Endpoint{Name: id.Name, Address: id.Address, Release: id.Release, Model: id.Model, Events: &ev,
			Certified: []certificate.Coverage{certificate.CoverEngine, certificate.CoverRouter}})
	}
	w.reg = prometheus.NewRegistry()
	gw, err := assemble.New(assemble.Config{Options: gateway.Options{Config: cfg, Certificates: []*certificate.Certificate{c}, Tokenizers: toks, Registry: w.reg, ProbeInterval: -1, ReprobeInterval: -1}, Tracer: spec.tracer})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		gw.Shutdown(sctx)
	})
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w.g = gw.Runtime
	w.base = "http://" + gw.Servers.Client["127.0.0.1:0"]

	pk := assemble.Picker{}
	if spec.picker != nil {
		spec.picker(&pk)
	}
	if pk.Listener, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := gw.StartPicker(ctx, pk); err != nil {
		t.Fatal(err)
	}
	w.picker = gw.Picker()
	l := pk.Listener
	if w.conn, err = grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.conn.Close() })
	w.client = extprocv3.NewExternalProcessorClient(w.conn)
	w.awaitSubscriptions()
	w.awaitReady()
	return w
}

// awaitReady waits for the picker's gRPC readiness, as Envoy's health check would: it follows the
// gateway's readiness (every event stream connected), which the picker re-reads periodically.
func (w *world) awaitReady() {
	w.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !w.picker.Ready() {
		if time.Now().After(deadline) {
			w.t.Fatalf("the picker did not turn ready within 10s: %+v", w.g.Readiness())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// awaitSubscriptions sends each engine unique prompts directly until their blocks reach the
// inventory. A ZeroMQ subscription takes effect some time after its connect and the publisher drops
// what it sends before then; on a loaded machine that window can swallow a test's first request.
func (w *world) awaitSubscriptions() {
	w.t.Helper()
	for i, e := range w.sims {
		if i < len(w.roles) && w.roles[i] == "decode" {
			continue // a decode engine's blocks are not routed on (no subscription is awaited)
		}
		name := fmt.Sprintf("e%d", i)
		live := func() bool {
			return promtest.Value(w.t, w.reg, "kvexact_ingest_blocks", map[string]string{"rule": "pool", "endpoint": name}) > 0
		}
		n := 0
		eventually(w.t, 30*time.Second, name+"'s event stream", func() bool {
			if live() {
				return true
			}
			n++
			body := completionBody(fmt.Sprintf("Subscription probe %d.%d: %s", i, n, strings.Repeat("the event stream is live. ", 8)))
			resp, err := http.Post(e.URL()+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				return false
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return true // an engine that serves no plain completion (a P/D role): nothing to wait for
			}
			time.Sleep(50 * time.Millisecond)
			return live()
		})
	}
}

// envoyRequest is what the test's data plane sends the picker for one HTTP request.
type envoyRequest struct {
	path   string
	body   []byte
	chunk  int      // body chunk size (0: one chunk)
	subset []string // nil: no hint
	hint   bool     // send the subset key even when subset is empty
	// contentType defaults to application/json.
	contentType string
	headers     []string // more request headers, key, value, …
	// duplexResponse: the first message's protocol_config says the response body comes
	// FULL_DUPLEX_STREAMED (each chunk given back); otherwise STREAMED, as deploy/envoy has it.
	duplexResponse bool
}

// envoyResult is what the picker answered.
type envoyResult struct {
	stream    extprocv3.ExternalProcessor_ProcessClient
	cancel    context.CancelFunc
	header    string // x-gateway-destination-endpoint
	metadata  string // dynamic_metadata envoy.lb x-gateway-destination-endpoint
	prefill   string
	decision  string
	body      []byte // the request body as given back
	immediate *extprocv3.ImmediateResponse
	mutation  *extprocv3.HeaderMutation // the request headers' mutation
	duplex    bool                      // envoyRequest.duplexResponse
}

func hdrs(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// request plays Envoy's request side message by message: headers (with the subset hint), the body in
// chunks, then reads the picker's answers up to the body's end (or an immediate response).
func (w *world) request(r envoyRequest) *envoyResult {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	st, err := w.client.Process(ctx)
	if err != nil {
		cancel()
		w.t.Fatal(err)
	}
	res := &envoyResult{stream: st, cancel: cancel, duplex: r.duplexResponse}
	w.t.Cleanup(cancel)
	respMode := filterv3.ProcessingMode_STREAMED
	if r.duplexResponse {
		respMode = filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	hm := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers:     hdrs(append([]string{":method", "POST", ":path", r.path, ":authority", "gw", "content-type", cmp.Or(r.contentType, "application/json")}, r.headers...)...),
		EndOfStream: r.body == nil,
	}}, ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseBodyMode: respMode}}
	if r.subset != nil || r.hint {
		var vals []any
		for _, s := range r.subset {
			vals = append(vals, s)
		}
		sv, _ := structpb.NewStruct(map[string]any{epp.SubsetKey: vals})
		hm.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.SubsetNamespace: sv}}
	}
	if err := st.Send(hm); err != nil {
		w.t.Fatal(err)
	}
	chunk := r.chunk
	if chunk <= 0 {
		chunk = len(r.body) + 1
	}
	for off := 0; r.body != nil; off += chunk {
		end := min(off+chunk, len(r.body))
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: r.body[off:end], EndOfStream: end == len(r.body)}}}); err != nil {
			break // the picker may have answered (413) and closed
		}
		if end == len(r.body) {
			break
		}
	}
	for {
		resp, err := st.Recv()
		if err != nil {
			w.t.Fatalf("picker stream: %v", err)
		}
		switch m := resp.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			res.immediate = m.ImmediateResponse
			return res
		case *extprocv3.ProcessingResponse_RequestHeaders:
			res.mutation = m.RequestHeaders.GetResponse().GetHeaderMutation()
			for _, h := range m.RequestHeaders.GetResponse().GetHeaderMutation().GetSetHeaders() {
				switch h.Header.Key {
				case epp.DestinationHeader:
					res.header = string(h.Header.RawValue)
				case epp.PrefillHeader:
					res.prefill = string(h.Header.RawValue)
				case epp.DecisionHeader:
					res.decision = string(h.Header.RawValue)
				}
			}
			res.metadata = resp.GetDynamicMetadata().GetFields()[epp.DestinationNamespace].GetStructValue().GetFields()[epp.DestinationHeader].GetStringValue()
			if r.body == nil {
				return res
			}
		case *extprocv3.ProcessingResponse_RequestBody:
			sr := m.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			res.body = append(res.body, sr.GetBody()...)
			if sr.GetEndOfStream() {
				return res
			}
		default:
			w.t.Fatalf("unexpected picker answer %T", m)
		}
	}
}

// forward plays the rest of Envoy's part: the request goes to the first endpoint of the destination
// list (or served, when given: a failover), and the response comes back through the stream with
// the served-endpoint metadata. It returns the receipt header the picker set and the response body.
func (w *world) forward(res *envoyResult, path string, served string) (receipt string, body []byte) {
	w.t.Helper()
	target, _, _ := strings.Cut(res.header, ",")
	if served == "" {
		served = target
	}
	resp, err := http.Post("http://"+served+path, "application/json", bytes.NewReader(res.body))
	if err != nil {
		w.t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	sv, _ := structpb.NewStruct(map[string]any{epp.ServedKey: served})
	st := res.stream
	if err := st.Send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: hdrs(":status", fmt.Sprint(resp.StatusCode), "content-type", "application/json")}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{epp.DestinationNamespace: sv}},
	}); err != nil {
		w.t.Fatal(err)
	}
	hr, err := st.Recv()
	if err != nil {
		w.t.Fatal(err)
	}
	for _, h := range hr.GetResponseHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.Header.Key == epp.ReceiptHeader {
			receipt = string(h.Header.RawValue)
		}
	}
	// Two chunks, as a stream would come. In STREAMED mode (deploy/envoy's) each answer lets the
	// chunk through as it is (no mutation); in full duplex each gives it back; what reaches the
	// client is body.
	half := len(raw) / 2
	for i, part := range [][]byte{raw[:half], raw[half:]} {
		if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: part, EndOfStream: i == 1}}}); err != nil {
			w.t.Fatal(err)
		}
		br, err := st.Recv()
		if err != nil || br.GetResponseBody() == nil {
			w.t.Fatalf("response body chunk %d: %v %v", i, br, err)
		}
		m := br.GetResponseBody().GetResponse().GetBodyMutation()
		switch {
		case res.duplex && m.GetStreamedResponse() == nil:
			w.t.Fatalf("full duplex: response body chunk %d should be given back, got %v", i, br)
		case res.duplex:
			body = append(body, m.GetStreamedResponse().GetBody()...)
		case m != nil:
			w.t.Fatalf("STREAMED: response body chunk %d should be answered without a mutation, got %v", i, br)
		default:
			body = append(body, part...)
		}
	}
	st.CloseSend()
	if _, err := st.Recv(); err != io.EOF {
		w.t.Fatalf("after the response the picker should end the stream, got %v", err)
	}
	res.cancel()
	return receipt, body
}

func completionBody(prompt string) []byte {
	b, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": prompt, "max_tokens": 2})
	return b
}

// proxied sends the request through the standalone proxy: the endpoint that served and the tier.
func (w *world) proxied(body []byte) (endpoint, tier string) {
	w.t.Helper()
	resp, err := http.Post(w.base+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		w.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		w.t.Fatalf("standalone proxy: status %d", resp.StatusCode)
	}
	var d struct {
		Tier string `json:"tier"`
	}
	json.Unmarshal([]byte(resp.Header.Get(proxy.HeaderDecision)), &d)
	return resp.Header.Get(proxy.HeaderEndpoint), d.Tier
}

// tierOf reads the tier from the picker's debug header.
func tierOf(decision string) string {
	var d struct {
		Tier string `json:"tier"`
	}
	json.Unmarshal([]byte(decision), &d)
	return d.Tier
}

func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", d, what)
}
