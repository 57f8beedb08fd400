package invprom

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/inventory"
)

// gather registers c and returns every sample as "name{endpoint} value" (endpoint "" for the
// rule-wide series), failing on a rule label other than "chat".
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			ep := ""
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "endpoint":
					ep = l.GetValue()
				case "rule":
					if l.GetValue() != "chat" {
						t.Errorf("%s: rule label %q", mf.GetName(), l.GetValue())
					}
				}
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out[mf.GetName()+"{"+ep+"}"] = v
		}
	}
	return out
}

func TestCollector(t *testing.T) {
	ix := inventory.New(inventory.Config{CapacityPerEndpoint: 2})
	a, _ := ix.AddEndpoint("a")
	b, _ := ix.AddEndpoint("b")
	if err := ix.Store(a, []uint64{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	_ = ix.Store(b, []uint64{2})
	_ = ix.Remove(b, []uint64{9})
	_ = ix.Clear(b)
	got := gather(t, NewCollector(ix, "chat"))
	want := map[string]float64{
		"kvexact_inventory_blocks{a}": 2, "kvexact_inventory_blocks{b}": 0,
		"kvexact_inventory_stored_total{a}": 3, "kvexact_inventory_stored_total{b}": 1,
		"kvexact_inventory_removed_total{a}": 0, "kvexact_inventory_removed_total{b}": 0,
		"kvexact_inventory_unknown_removes_total{a}": 0, "kvexact_inventory_unknown_removes_total{b}": 1,
		"kvexact_inventory_cap_retirements_total{a}": 1, "kvexact_inventory_cap_retirements_total{b}": 0,
		"kvexact_inventory_clears_total{a}": 0, "kvexact_inventory_clears_total{b}": 1,
		"kvexact_inventory_keys{}": 2, "kvexact_inventory_overflow_nodes{}": 0, "kvexact_inventory_refused_total{}": 0,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	// A removed endpoint's series disappear with it.
	_ = ix.RemoveEndpoint(b)
	got = gather(t, NewCollector(ix, "chat"))
	if _, ok := got["kvexact_inventory_blocks{b}"]; ok || got["kvexact_inventory_blocks{a}"] != 2 {
		t.Errorf("after removing b: %v", got)
	}
}
