// Package promtest reads metric values back from a Prometheus registry in tests: the one place that
// walks gathered metric families, so every test asserts on metrics the same way.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value returns the value of the first series of name whose labels include every pair in labels: a
// counter's or gauge's value, a histogram's sample count. A series that does not exist reads 0.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	for _, m := range matching(t, g, name, labels) {
		if v, ok := value(m); ok {
			return v
		}
	}
	return 0
}

// Sum adds up every series of name whose labels include every pair in labels (as Value reads
// each): a counter's total over the labels left out.
func Sum(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	sum := 0.0
	for _, m := range matching(t, g, name, labels) {
		v, _ := value(m)
		sum += v
	}
	return sum
}

// Series returns the label sets of every series of name whose labels include every pair in labels
// (as Value matches them), in the registry's order: how many there are, or a label's value.
func Series(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) []map[string]string {
	t.Helper()
	var out []map[string]string
	for _, m := range matching(t, g, name, labels) {
		l := make(map[string]string, len(m.GetLabel()))
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		out = append(out, l)
	}
	return out
}

// matching gathers g and returns the series of name whose labels include every pair in labels.
func matching(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) []*dto.Metric {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matches(m, labels) {
				out = append(out, m)
			}
		}
	}
	return out
}

// value is a counter's or gauge's value or a histogram's sample count; false for other kinds.
func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount()), true
	}
	return 0, false
}

func matches(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := labels[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(labels)
}
