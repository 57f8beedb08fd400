package assemble_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/gateway/leader"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/kubetest"
)

// TestMain stops the package's API server (kubetest) after the tests.
func TestMain(m *testing.M) { kubetest.Main(m) }

// TestPickersActivePassive: two pickers share a Lease (client-go's fake clientset, and a real API
// server). Both
// gateways are ready; only the lease holder's gRPC readiness is SERVING, the standby's
// NOT_SERVING. When the holder stops competing (its elector's context ends and it releases the
// lease) the standby turns SERVING and the former holder NOT_SERVING.
func TestPickersActivePassive(t *testing.T) {
	kubetest.Each(t, "ns", testPickersActivePassive)
}

func testPickersActivePassive(t *testing.T, c kubetest.Cluster) {
	old := assemble.ReadinessPoll
	assemble.ReadinessPoll = 20 * time.Millisecond
	defer func() { assemble.ReadinessPoll = old }()
	engine, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	client := c.Kube
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type replica struct {
		hc   healthpb.HealthClient
		stop context.CancelFunc
		el   *leader.Elector
	}
	start := func(id string) replica {
		cfg, err := rules.Parse([]byte(`
listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, token: tok}
rules:
  - name: chat
    models: [chat-model]
    engine: {family: llamacpp, release: b10573}
    selector: rr
    endpoints: [{name: a, address: "http://` + engine.Addr().String() + `"}]
`))
		if err != nil {
			t.Fatal(err)
		}
		gw, err := assemble.New(assemble.Config{Options: gateway.Options{Config: cfg, Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { gw.Shutdown(context.Background()) })
		if err := gw.Start(ctx); err != nil {
			t.Fatal(err)
		}
		ectx, stop := context.WithCancel(ctx)
		el, err := leader.Start(ectx, leader.Config{Client: client, Namespace: c.Namespace, Name: "picker", Identity: id,
			LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if err := gw.StartPicker(ctx, assemble.Picker{Listener: l, Leader: el}); err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if !gw.Runtime.Readiness().Ready {
			t.Fatalf("%s: gateway not ready: %+v", id, gw.Runtime.Readiness())
		}
		return replica{hc: healthpb.NewHealthClient(conn), stop: stop, el: el}
	}
	a := start("a")
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	status := func(r replica) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := r.hc.Check(ctx, &healthpb.HealthCheckRequest{Service: epp.HealthReadiness})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Status
	}
	waitFor("a to lead and serve", func() bool { return a.el.Leading() && status(a) == healthpb.HealthCheckResponse_SERVING })
	b := start("b")
	for range 10 {
		time.Sleep(30 * time.Millisecond)
		if status(b) != healthpb.HealthCheckResponse_NOT_SERVING || status(a) != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("a %v, b %v: want only the holder serving", status(a), status(b))
		}
	}
	a.stop()
	<-a.el.Done()
	waitFor("b to take over", func() bool {
		return status(b) == healthpb.HealthCheckResponse_SERVING && status(a) == healthpb.HealthCheckResponse_NOT_SERVING
	})
}
