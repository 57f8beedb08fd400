package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/rules"
)

// TestStatusCommand: `gateway status` reads a running gateway's /admin/status with the token and
// prints each rule and endpoint (an endpoint taken down reads NOT ROUTABLE); a wrong token, no
// token and an unknown rule fail with the reason.
func TestStatusCommand(t *testing.T) {
	cfg, err := rules.Parse([]byte(`
listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, token: s3cret}
rules:
  - name: chat
    models: [llama3]
    engine: {family: llamacpp, release: b10573}
    selector: rr
    endpoints: [{name: a, address: "http://127.0.0.1:1"}, {name: b, address: "http://127.0.0.1:2"}]
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
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string, string) {
		var out, errs strings.Builder
		code := runStatus(args, &out, &errs)
		return code, out.String(), errs.String()
	}
	admin := "http://" + gw.Servers.Admin
	gw.Runtime.SetEndpointState("chat", "b", "down")
	code, out, errs := run("--admin", admin, "--token-file", tokenFile)
	want := "rule chat: KV-exact off: kvExactMode is 0\n"
	if code != 0 || !strings.HasPrefix(out, want) || !strings.Contains(out, "\n  a: ") || !strings.Contains(out, "\n  b: ") || !strings.Contains(out, "b: no certificate verdict (KV-exact is off for the rule), NOT ROUTABLE: admin_down\n") || strings.Contains(out, "a: no certificate verdict (KV-exact is off for the rule), NOT") {
		t.Fatalf("status: %d\n%s\n%s", code, out, errs)
	}
	if code, out, _ := run("--admin", admin, "--token-file", tokenFile, "--json"); code != 0 || !strings.Contains(out, `"admin_down"`) {
		t.Fatalf("--json: %d %s", code, out)
	}
	os.WriteFile(tokenFile, []byte("wrong"), 0o600)
	if code, _, errs := run("--admin", admin, "--token-file", tokenFile); code != 1 || !strings.Contains(errs, "401") {
		t.Fatalf("wrong token: %d %s", code, errs)
	}
	t.Setenv("KVEXACT_ADMIN_TOKEN", "")
	if code, _, errs := run("--admin", admin); code != 2 || !strings.Contains(errs, "no admin token") {
		t.Fatalf("no token: %d %s", code, errs)
	}
	t.Setenv("KVEXACT_ADMIN_TOKEN", "s3cret")
	if code, _, errs := run("--admin", admin, "--rule", "nosuch"); code != 1 || !strings.Contains(errs, `no rule "nosuch"`) {
		t.Fatalf("unknown rule: %d %s", code, errs)
	}
	if code, out, _ := run("--admin", admin, "--rule", "chat"); code != 0 || !strings.HasPrefix(out, want) {
		t.Fatalf("--rule chat with the token from the environment: %d %s", code, out)
	}
}
