package assemble_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// TestReadinessFollowsEachCause: /readyz on the client listener and the picker's gRPC readiness
// turn not ready at each cause — an endpoint down (the rule's last ready one), an event stream not
// connected (a real ZeroMQ publisher closed), a tokenizer missing, no rule at all — and ready again
// when it goes; /healthz stays 200 throughout and neither path reaches an engine.
func TestReadinessFollowsEachCause(t *testing.T) {
	if _, err := tokenize.NewPool("").Get("llama3"); err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	old := assemble.ReadinessPoll
	assemble.ReadinessPoll = 20 * time.Millisecond
	defer func() { assemble.ReadinessPoll = old }()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	pubAddr := "tcp://" + pub.Addr().String()

	// The engine address is a server that records the paths reaching it: the probes' must not.
	engine, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reached := make(chan string, 64)
	esrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case reached <- r.URL.Path:
		default:
		}
		http.NotFound(w, r)
	})}
	go esrv.Serve(engine)
	defer esrv.Close()
	cfg, err := rules.Parse([]byte(`
listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, token: tok}
rules:
  - name: chat
    models: [chat-model]
    engine: {family: llamacpp, release: b10573}
    selector: rr
    endpoints: [{name: a, address: "http://` + engine.Addr().String() + `"}]
  - name: cached
    models: [llama3]
    engine: {family: vllm, release: v0.25.1}
    seed: "0"
    kvExactMode: 3
    endpoints: [{name: v, address: "http://` + engine.Addr().String() + `", events: {zmq: ["` + pubAddr + `"]}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := assemble.New(assemble.Config{Options: gateway.Options{Config: cfg, Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if rd := gw.Runtime.Readiness(); rd.Ready || rd.Reason != "not_started" {
		t.Fatalf("before Start: %+v", rd)
	}
	defer gw.Shutdown(context.Background())
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.StartPicker(ctx, assemble.Picker{Listener: l}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	base := "http://" + gw.Servers.Client["127.0.0.1:0"]

	get := func(path string) (int, gateway.Readiness) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var rd gateway.Readiness
		if path == "/readyz" {
			if err := json.Unmarshal(b, &rd); err != nil {
				t.Fatalf("%s: %v: %s", path, err, b)
			}
		}
		return resp.StatusCode, rd
	}
	// want waits until /readyz and the picker agree on ready, then checks what /readyz says.
	want := func(step string, ready bool, check func(gateway.Readiness) bool) {
		t.Helper()
		wantCode, wantGRPC := http.StatusServiceUnavailable, healthpb.HealthCheckResponse_NOT_SERVING
		if ready {
			wantCode, wantGRPC = http.StatusOK, healthpb.HealthCheckResponse_SERVING
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, rd := get("/readyz")
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: epp.HealthReadiness})
			if code == wantCode && rd.Ready == ready && err == nil && r.Status == wantGRPC && (check == nil || check(rd)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: /readyz %d %+v, picker %v %v", step, code, rd, r, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if code, _ := get("/healthz"); code != http.StatusOK {
			t.Fatalf("%s: /healthz %d", step, code)
		}
	}
	rule := func(rd gateway.Readiness, name string) gateway.RuleReadiness {
		for _, r := range rd.Rules {
			if r.Name == name {
				return r
			}
		}
		return gateway.RuleReadiness{}
	}
	endpoint := func(rd gateway.Readiness, ruleName, ep string) gateway.EndpointReadiness {
		for _, e := range rule(rd, ruleName).Endpoints {
			if e.Name == ep {
				return e
			}
		}
		return gateway.EndpointReadiness{}
	}

	want("start", true, nil)

	gw.Runtime.SetEndpointState("chat", "a", "down")
	want("endpoint down", false, func(rd gateway.Readiness) bool {
		return endpoint(rd, "chat", "a").Reason == "admin_down" && slices.Equal(rule(rd, "chat").Reasons, []string{gateway.ReasonNoReadyEndpoint}) && rule(rd, "cached").Ready
	})
	gw.Runtime.SetEndpointState("chat", "a", "up")
	want("endpoint up", true, nil)

	pub.Close()
	want("event stream lost", false, func(rd gateway.Readiness) bool {
		return endpoint(rd, "cached", "v").Reason == "events_unsynced" && rule(rd, "chat").Ready
	})
	pub2 := zmq4.NewPub(ctx)
	defer pub2.Close()
	if err := pub2.Listen(pubAddr); err != nil {
		t.Fatal(err)
	}
	want("event stream back", true, nil)

	cached, _ := gw.Runtime.Store().Get("cached")
	missing := cached.Clone()
	missing.Models = []string{"no-such-model"}
	if _, err := gw.Runtime.Store().Put(missing); err != nil {
		t.Fatal(err)
	}
	want("tokenizer missing", false, func(rd gateway.Readiness) bool {
		r := rule(rd, "cached")
		return slices.Contains(r.Reasons, gateway.ReasonTokenizerMissing) && r.Tokenizer != ""
	})
	if _, err := gw.Runtime.Store().Put(cached.Clone()); err != nil {
		t.Fatal(err)
	}
	want("tokenizer back", true, nil)

	for _, n := range []string{"chat", "cached"} {
		if err := gw.Runtime.Store().Delete(n); err != nil {
			t.Fatal(err)
		}
	}
	want("no rules", false, func(rd gateway.Readiness) bool { return rd.Reason == "no_rules" })
	if _, err := gw.Runtime.Store().Put(cached.Clone()); err != nil {
		t.Fatal(err)
	}
	want("a rule again", true, nil)

	esrv.Close()
	for len(reached) > 0 {
		if p := <-reached; p == "/healthz" || p == "/readyz" {
			t.Fatalf("%s reached the engine", p)
		}
	}
}
