package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
	"github.com/kvexact/kvexact/internal/envoytest"
)

// TestEPPUsage: ctk epp without its required flags, or with an unreadable CA, exits 2 naming the
// flag.
func TestEPPUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--picker and --pool are required"},
		{[]string{"--picker", "127.0.0.1:1"}, "--picker and --pool are required"},
		{[]string{"--picker", "127.0.0.1:1", "--pool", "127.0.0.1:2", "--tls-ca", "/nonexistent"}, "--tls-ca"},
		{[]string{"--bogus"}, "bogus"},
		// The self-starting mode: a pool address that cannot be listened on is unusable input.
		{[]string{"--picker", "127.0.0.1:1", "--pool", "192.0.2.1:1", "--envoy", "/nonexistent"}, "192.0.2.1:1"},
	} {
		var out, errb bytes.Buffer
		if code := eppCommand(context.Background(), c.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Fatalf("%v: exit %d, stderr %q; want 2 naming %s", c.args, code, errb.String(), c.want)
		}
	}
}

// TestEPPThroughEnvoyCommand runs `ctk epp` as a user does, in its default mode, against
// kvexact's picker (a gateway with a static rule over the --pool addresses, no certificate: the
// rule's selector routes): ctk starts the simulated pool and Envoy itself, prints seven PASS lines
// and exits 0.
func TestEPPThroughEnvoyCommand(t *testing.T) {
	envoy := envoytest.Binary(t)
	var pool []string
	rule := rules.Rule{Name: "pool", Models: []string{"llama3"}, Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, Selector: "rr"}
	for i := 0; i < 2; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		a := l.Addr().String()
		l.Close()
		pool = append(pool, a)
		rule.Endpoints = append(rule.Endpoints, rules.Endpoint{Name: fmt.Sprintf("e%d", i), Address: "http://" + a})
	}
	cfg := &rules.Config{Listen: "127.0.0.1:0", Admin: rules.Admin{Listen: "127.0.0.1:0", Token: "t"}, Rules: []rules.Rule{rule}}
	if err := cfg.Normalize(); err != nil {
		t.Fatal(err)
	}
	gw, err := assemble.New(assemble.Config{Options: gateway.Options{Config: cfg, Tokenizers: tokenize.NewPool(""), Registry: prometheus.NewRegistry(),
		ProbeInterval: -1, ReprobeInterval: -1, Log: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		gw.Shutdown(sctx)
	}()
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.StartPicker(ctx, assemble.Picker{Listener: pl}); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := eppCommand(ctx, []string{"--picker", pl.Addr().String(), "--pool", strings.Join(pool, ","), "--envoy", envoy}, &out, &errb)
	t.Logf("ctk epp:\n%s%s", out.String(), errb.String())
	if code != 0 || strings.Count(out.String(), "PASS  ") != 7 {
		t.Fatalf("ctk epp against kvexact's picker: exit %d", code)
	}
}
