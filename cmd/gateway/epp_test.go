package main

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/rules"
)

// TestEPPFlags: --epp starts the picker beside the gateway, ready at once without discovery; the
// discovery flags refuse to run half-given.
func TestEPPFlags(t *testing.T) {
	cfg, err := rules.Parse([]byte(`
listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, token: t}
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
	gw, err := assemble.New(assemble.Config{Options: gateway.Options{Config: cfg, Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer gw.Shutdown(context.Background())
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, f := range []eppFlags{{pool: "ns/p"}, {addr: "127.0.0.1:0", pool: "ns/p"}, {addr: "127.0.0.1:0", rule: "chat", pool: "nons"}, {addr: "127.0.0.1:0", fallbacks: 9}, {addr: "127.0.0.1:0", certFile: "x"}} {
		if err := f.start(ctx, gw, slog.Default()); err == nil {
			t.Fatalf("%+v: want an error", f)
		}
	}
	// A fixed free port is not needed: the picker's bound address is only logged, so listen on a
	// port found here.
	f := eppFlags{addr: freeAddr(t), fallbacks: 2}
	if err := f.start(ctx, gw, slog.Default()); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "readiness"})
		if err == nil && r.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("picker not ready: %v %v", r, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.HasPrefix(f.addr, "127.0.0.1:") {
		t.Fatal(f.addr)
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
