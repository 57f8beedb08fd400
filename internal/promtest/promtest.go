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
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !matches(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
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

// Sum adds up every series of name whose labels include every pair in labels (as Value reads
// each): a counter's total over the labels left out.
func Sum(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !matches(m, labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

// Series returns the label sets of every series of name whose labels include every pair in labels
// (as Value matches them), in the registry's order: how many there are, or a label's value.
func Series(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) []map[string]string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	var out []map[string]string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !matches(m, labels) {
				continue
			}
			l := make(map[string]string, len(m.GetLabel()))
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			out = append(out, l)
		}
	}
	return out
}
