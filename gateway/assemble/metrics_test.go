package assemble_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
)

// TestMetricsListener: admin.metricsListen serves GET /metrics without a token — the gateway's
// series with the build, Go runtime, process and per-endpoint health series — and nothing else;
// the admin listener's /metrics still wants the token.
func TestMetricsListener(t *testing.T) {
	cfg := config(t)
	cfg.Admin.MetricsListen = "127.0.0.1:0"
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
	if gw.Servers.Metrics == "" {
		t.Fatal("no metrics listener bound")
	}
	get := func(url, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	metrics := "http://" + gw.Servers.Metrics
	code, body := get(metrics+"/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("metrics listener /metrics without a token: %d %s", code, body)
	}
	for _, series := range []string{
		"kvexact_build_info{", "go_goroutines ", "process_cpu_seconds_total ", "kvexact_ready 1",
		`kvexact_endpoint_breaker_state{endpoint="a",rule="chat",state="closed"} 1`,
		`kvexact_endpoint_ready{endpoint="a",rule="chat"} 1`,
		`kvexact_endpoint_unready_reason{endpoint="a",reason="breaker_open",rule="chat"} 0`,
	} {
		if !strings.Contains(body, series) {
			t.Errorf("metrics listener lacks %q", series)
		}
	}
	for _, path := range []string{"/admin/status", "/debug/pprof/", "/readyz", "/v1/models"} {
		if code, _ := get(metrics+path, ""); code != http.StatusNotFound {
			t.Errorf("metrics listener %s: %d, want 404", path, code)
		}
		if code, _ := get(metrics+path, "tok"); code != http.StatusNotFound {
			t.Errorf("metrics listener %s with the admin token: %d, want 404", path, code)
		}
	}
	admin := "http://" + gw.Servers.Admin
	if code, _ := get(admin+"/metrics", ""); code != http.StatusUnauthorized {
		t.Fatalf("admin /metrics without the token: %d, want 401", code)
	}
	if code, body := get(admin+"/metrics", "tok"); code != http.StatusOK || !strings.Contains(body, "kvexact_build_info{") {
		t.Fatalf("admin /metrics with the token: %d", code)
	}
}

// TestMetricsListenerOff: without admin.metricsListen nothing more is bound.
func TestMetricsListenerOff(t *testing.T) {
	gw, err := assemble.New(assemble.Config{Options: gateway.Options{Config: config(t), Registry: prometheus.NewRegistry(), ProbeInterval: -1, ReprobeInterval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Shutdown(context.Background())
	if err := gw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if gw.Servers.Metrics != "" {
		t.Fatalf("a metrics listener is bound at %s without admin.metricsListen", gw.Servers.Metrics)
	}
}
