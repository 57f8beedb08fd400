package gateway

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/promtest"
)

// series counts the series of metric name with the given endpoint label.
func series(t *testing.T, reg *prometheus.Registry, name, endpoint string) int {
	t.Helper()
	return len(promtest.Series(t, reg, name, map[string]string{"endpoint": endpoint}))
}

// TestStatusMetricsRepublishInPlace: republishing a rule's exactness gauges (every membership
// change does) writes over the series, so a scrape at any moment finds each current endpoint's
// eligibility, reasons and re-probe fence; a removed endpoint's series go, and a changed rule
// reason replaces the old label. The scrapes run beside the republishing: one that deleted first and wrote after is
// caught in between.
func TestStatusMetricsRepublishInPlace(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newStatusMetrics(reg)
	now := func() time.Time { return time.Unix(0, 0) }
	exact := func(name string, certified bool) *endpointExact {
		return newEndpointExact("pool", &route.Endpoint{Name: name, Address: "http://127.0.0.1:1"}, exactness.Config{}, certified, "", now, m, nil)
	}
	rt := &ruleRuntime{rule: &rules.Rule{Name: "pool"}, exact: ExactStatus{Binding: "router", Code: "no_certificate"},
		epExact: []*endpointExact{exact("a", false), exact("b", true)}}
	rt.epExact[1].apply(exactness.Evidence{Type: exactness.ReprobeFailed, Detail: "another tokenizer"})
	m.set(rt)
	fence := map[string]string{"rule": "pool", "endpoint": "b"}
	if series(t, reg, "kvexact_endpoint_exact_fenced", "b") != 1 || promtest.Value(t, reg, "kvexact_endpoint_exact_fenced", fence) != 1 {
		t.Fatal("after the first publish: b's failed re-probe is not exported as its fence")
	}
	if series(t, reg, "kvexact_endpoint_exact_fenced", "a") != 1 || promtest.Value(t, reg, "kvexact_endpoint_exact_fenced", map[string]string{"endpoint": "a"}) != 0 {
		t.Fatal("after the first publish: a has no fence series at 0")
	}
	reasons := series(t, reg, "kvexact_endpoint_exact_ineligible_reason", "a")
	if reasons != len(exactness.Causes) || series(t, reg, "kvexact_endpoint_exact_eligible", "a") != 1 {
		t.Fatalf("after the first publish: %d reason series for a, want %d", reasons, len(exactness.Causes))
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2000; i++ {
			m.set(rt)
		}
	}()
	for scrapes := 0; ; scrapes++ {
		select {
		case <-done:
			if scrapes == 0 {
				t.Log("the republishing ended before a scrape ran beside it")
			}
			goto removed
		default:
		}
		if n := series(t, reg, "kvexact_endpoint_exact_ineligible_reason", "b"); n != reasons {
			<-done
			t.Fatalf("a scrape during a republish found %d reason series for b, want %d", n, reasons)
		}
		if promtest.Value(t, reg, "kvexact_endpoint_exact_fenced", fence) != 1 {
			<-done
			t.Fatal("a scrape during a republish found b's fence missing")
		}
	}
removed:
	rt.epExact = rt.epExact[:1]
	rt.exact.Code = "mode_off"
	m.set(rt)
	if n := series(t, reg, "kvexact_endpoint_exact_ineligible_reason", "b") + series(t, reg, "kvexact_endpoint_exact_eligible", "b") + series(t, reg, "kvexact_endpoint_exact_fenced", "b"); n != 0 {
		t.Fatalf("removed endpoint b keeps %d series", n)
	}
	if series(t, reg, "kvexact_endpoint_exact_eligible", "a") != 1 {
		t.Fatal("endpoint a lost its series")
	}
	if got := promtest.Series(t, reg, "kvexact_rule_exact_enabled", nil); len(got) != 1 || got[0]["reason"] != "mode_off" {
		t.Fatalf("kvexact_rule_exact_enabled after the reason changed: %v, want one series with reason mode_off", got)
	}
	m.forget("pool")
	if series(t, reg, "kvexact_endpoint_exact_eligible", "a")+series(t, reg, "kvexact_endpoint_exact_fenced", "a") != 0 {
		t.Fatal("a forgotten rule keeps its endpoints' series")
	}
}
