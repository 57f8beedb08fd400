package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "g", Help: "h"}, []string{"rule", "endpoint"})
	reg.MustRegister(g)
	g.WithLabelValues("r", "a").Set(0) // a series at zero still counts
	g.WithLabelValues("r", "b").Set(2)
	g.WithLabelValues("s", "a").Set(3)
	if n := len(Series(t, reg, "g", nil)); n != 3 {
		t.Errorf("%d series of g, want 3", n)
	}
	got := Series(t, reg, "g", map[string]string{"endpoint": "a"})
	if len(got) != 2 || got[0]["rule"] != "r" || got[1]["rule"] != "s" || got[0]["endpoint"] != "a" {
		t.Errorf("series of g with endpoint a: %v", got)
	}
	if got := Series(t, reg, "g", map[string]string{"endpoint": "c"}); len(got) != 0 {
		t.Errorf("series of g with endpoint c: %v", got)
	}
	if got := Series(t, reg, "other", nil); len(got) != 0 {
		t.Errorf("series of an unregistered name: %v", got)
	}
}
