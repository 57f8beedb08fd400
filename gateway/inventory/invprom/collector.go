// Package invprom exports a rule's block inventory (gateway/inventory) as Prometheus metrics.
//
// It lives apart from the inventory so that the ingest and routing paths, which import the
// inventory, do not pull in the Prometheus client. The collector reads the inventory's counters
// at scrape time: nothing is updated on the hot paths, and series of removed endpoints disappear
// with them (no ghost series).
package invprom

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/inventory"
)

var (
	labels     = []string{"rule", "endpoint", "ep_idx"}
	blocks     = prometheus.NewDesc("kvexact_inventory_blocks", "Blocks resident on the endpoint (GPU medium).", labels, nil)
	stored     = prometheus.NewDesc("kvexact_inventory_stored_total", "Block copies the endpoint reported stored.", labels, nil)
	removed    = prometheus.NewDesc("kvexact_inventory_removed_total", "Block copies the endpoint reported removed.", labels, nil)
	unknown    = prometheus.NewDesc("kvexact_inventory_unknown_removes_total", "Removes of blocks the endpoint did not hold.", labels, nil)
	retired    = prometheus.NewDesc("kvexact_inventory_cap_retirements_total", "Blocks retired oldest-first by the per-endpoint capacity cap.", labels, nil)
	clears     = prometheus.NewDesc("kvexact_inventory_clears_total", "Clears of the endpoint's inventory.", labels, nil)
	keys       = prometheus.NewDesc("kvexact_inventory_keys", "Distinct block keys in the rule's table.", []string{"rule"}, nil)
	nodes      = prometheus.NewDesc("kvexact_inventory_overflow_nodes", "Overflow nodes (keys held by several endpoints).", []string{"rule"}, nil)
	refused    = prometheus.NewDesc("kvexact_inventory_refused_total", "Updates refused for lack of overflow nodes.", []string{"rule"}, nil)
	allMetrics = []*prometheus.Desc{blocks, stored, removed, unknown, retired, clears, keys, nodes, refused}
)

type collector struct {
	ix   *inventory.Index
	rule string
}

// NewCollector returns a collector of ix's metrics, labelled with the rule's name.
func NewCollector(ix *inventory.Index, rule string) prometheus.Collector {
	return &collector{ix: ix, rule: rule}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allMetrics {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range c.ix.Endpoints() {
		lv := []string{c.rule, e.Name, strconv.Itoa(int(e.ID))}
		ch <- prometheus.MustNewConstMetric(blocks, prometheus.GaugeValue, float64(e.Resident), lv...)
		ch <- prometheus.MustNewConstMetric(stored, prometheus.CounterValue, float64(e.Stored), lv...)
		ch <- prometheus.MustNewConstMetric(removed, prometheus.CounterValue, float64(e.Removed), lv...)
		ch <- prometheus.MustNewConstMetric(unknown, prometheus.CounterValue, float64(e.UnknownRemoves), lv...)
		ch <- prometheus.MustNewConstMetric(retired, prometheus.CounterValue, float64(e.Retirements), lv...)
		ch <- prometheus.MustNewConstMetric(clears, prometheus.CounterValue, float64(e.Clears), lv...)
	}
	st := c.ix.Stats()
	ch <- prometheus.MustNewConstMetric(keys, prometheus.GaugeValue, float64(st.Keys), c.rule)
	ch <- prometheus.MustNewConstMetric(nodes, prometheus.GaugeValue, float64(st.OverflowNodes), c.rule)
	ch <- prometheus.MustNewConstMetric(refused, prometheus.CounterValue, float64(st.Refused), c.rule)
}
