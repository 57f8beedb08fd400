package deploy_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/epp"
	"github.com/kvexact/kvexact/gateway/rules"
)

// TestDashboardMetricsExist: the dashboard is valid JSON, every panel queries something, and every
// kvexact metric it queries is registered by a real gateway (both front ends: the proxy's and the
// Endpoint Picker's metrics) — a renamed or removed metric fails here.
func TestDashboardMetricsExist(t *testing.T) {
	b, err := os.ReadFile("grafana/kvexact-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard: %v (uid %q, %d panels)", err, d.UID, len(d.Panels))
	}
	reg := gatewayRegistry(t)
	re := regexp.MustCompile(`kvexact_[a-z0-9_]+`)
	// Per-endpoint health and failure series: each must be charted by endpoint (a by clause that
	// keeps the endpoint label), or one bad engine is averaged away.
	perEndpoint := map[string]bool{"kvexact_endpoint_ready": false, "kvexact_endpoint_unready_reason": false,
		"kvexact_endpoint_breaker_state": false, "kvexact_proxy_upstream_errors_total": false, "kvexact_proxy_failovers_total": false}
	by := regexp.MustCompile(`by \(([^)]*)\)`)
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for name := range perEndpoint {
				if !regexp.MustCompile(`\b` + name + `\b`).MatchString(tg.Expr) {
					continue
				}
				for _, m := range by.FindAllStringSubmatch(tg.Expr, -1) {
					if !strings.Contains(m[1], "endpoint") {
						t.Fatalf("panel %q charts %s by (%s), losing the endpoint", p.Title, name, m[1])
					}
				}
				perEndpoint[name] = true
			}
		}
	}
	for name, seen := range perEndpoint {
		if !seen {
			t.Fatalf("no panel charts %s", name)
		}
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Fatalf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range re.FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				if !registered(t, reg, base) {
					t.Fatalf("panel %q queries %s, which the gateway does not register", p.Title, m)
				}
			}
		}
	}
}

// gatewayRegistry builds a gateway (not started: building registers every metric) and the Endpoint
// Picker's metrics on its registry, as gateway --epp does.
func gatewayRegistry(t *testing.T) *prometheus.Registry {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("t"), 0o600)
	cfg, err := rules.Parse([]byte(`
listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, tokenFile: ` + tok + `}
rules:
  - name: r
    models: [m]
    engine: {family: vllm, release: v0.25.1}
    endpoints: [{name: e, address: "http://127.0.0.1:1"}]
`))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := assemble.New(assemble.Config{Options: gateway.Options{Config: cfg}})
	if err != nil {
		t.Fatal(err)
	}
	reg := gw.Runtime.Registry()
	if _, err := epp.NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	return reg
}

// registered reports whether reg holds a metric named name. A registry lists a labelled metric only
// once it has a series, so it is asked directly: registering a probe of that name fails exactly when
// a metric of the name is already registered (same name: duplicate, or other labels or help).
func registered(t *testing.T, reg *prometheus.Registry, name string) bool {
	t.Helper()
	probe := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: "probe"}, []string{"kvexact_dashboard_probe"})
	err := reg.Register(probe)
	if err == nil {
		reg.Unregister(probe)
		return false
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) || strings.Contains(err.Error(), "same fully-qualified name") {
		return true
	}
	t.Fatalf("probing %s: %v", name, err)
	return false
}
