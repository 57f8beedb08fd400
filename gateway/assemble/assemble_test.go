package assemble_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/gateway/rules"
)

func config(t *testing.T) *rules.Config {
	t.Helper()
	cfg, err := rules.Parse([]byte(`
listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, token: tok}
rules:
  - name: chat
    models: [llama3]
    engine: {family: llamacpp, release: b10573}
    selector: rr
    endpoints: [{name: a, address: "http://127.0.0.1:1"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestAssembledGatewayServesAndStops: the assembled gateway binds its listeners, answers an unknown
// model as the proxy's model_not_found (the runtimes' resolver.UnknownModelError), runs
// every client request through Wrap, serves the admin API with its token, and Shutdown closes the
// listeners (a second Shutdown does nothing).
func TestAssembledGatewayServesAndStops(t *testing.T) {
	var wrapped atomic.Int32
	gw, err := assemble.New(assemble.Config{
		Options: gateway.Options{Config: config(t), Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1},
		Wrap: func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { wrapped.Add(1); h.ServeHTTP(w, r) })
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if gw.Err() != nil {
		t.Fatal("Err before Start must be nil")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer gw.Shutdown(context.Background())
	if err := gw.Start(ctx); err == nil {
		t.Fatal("a second Start must fail")
	}
	base := "http://" + gw.Servers.Client["127.0.0.1:0"]
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(`{"model":"nope","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Error struct{ Code string } `json:"error"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || body.Error.Code != "model_not_found" || wrapped.Load() != 1 {
		t.Fatalf("unknown model: status %d, code %q, wrapped %d", resp.StatusCode, body.Error.Code, wrapped.Load())
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+gw.Servers.Admin+"/admin/status", nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"chat"`) {
		t.Fatalf("admin status: %d %s", resp.StatusCode, raw)
	}
	sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
	defer c()
	if err := gw.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if err := gw.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if _, err := http.Get(base + "/v1/models"); err == nil {
		t.Fatal("client listener still accepting after Shutdown")
	}
}

// TestPickerReadyAndStopped: without discovery the picker is ready as soon as StartPicker returns,
// runs only once, and Shutdown stops its gRPC server.
func TestPickerReadyAndStopped(t *testing.T) {
	gw, err := assemble.New(assemble.Config{Options: gateway.Options{Config: config(t), Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer gw.Shutdown(context.Background())
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if gw.Picker() != nil {
		t.Fatal("no picker before StartPicker")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.StartPicker(ctx, assemble.Picker{Listener: l}); err != nil {
		t.Fatal(err)
	}
	if gw.Picker() == nil {
		t.Fatal("Picker is nil after StartPicker")
	}
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	if err := gw.StartPicker(ctx, assemble.Picker{Listener: l2}); err == nil {
		t.Fatal("a second StartPicker must fail")
	}
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: epp.HealthReadiness})
	if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("readiness: %v %v", r, err)
	}
	if err := gw.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	cctx, c := context.WithTimeout(ctx, 2*time.Second)
	defer c()
	if _, err := hc.Check(cctx, &healthpb.HealthCheckRequest{Service: epp.HealthReadiness}); err == nil {
		t.Fatal("picker still answering after Shutdown")
	}
}
