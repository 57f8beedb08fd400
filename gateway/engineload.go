package gateway

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/engines/registry"
	"github.com/kvexact/kvexact/gateway/engineload"
	"github.com/kvexact/kvexact/gateway/route"
)

// EngineLoadStatus is one endpoint's engine load report as /admin/status shows it.
type EngineLoadStatus struct {
	Running  int     `json:"running"`
	Waiting  int     `json:"waiting"`
	Own      int     `json:"own_at_scrape"`
	Others   int     `json:"others"`
	AgeSec   float64 `json:"age_seconds"`
	Interval string  `json:"interval"`
	Stale    bool    `json:"stale"`
	Err      string  `json:"error,omitempty"`
}

func (g *Gateway) engineLoadStatus(e *route.Endpoint) *EngineLoadStatus {
	r := e.LastEngineReport()
	if r == nil {
		return nil
	}
	now := g.now()
	return &EngineLoadStatus{Running: r.Running, Waiting: r.Waiting, Own: r.Own, Others: r.Others,
		AgeSec: now.Sub(r.At).Seconds(), Interval: g.engineLoadInterval().String(), Stale: now.After(r.Until), Err: r.Err}
}

// engineLoadInterval is the scrape interval (0: off).
func (g *Gateway) engineLoadInterval() time.Duration {
	iv := g.opts.EngineLoadInterval
	if iv <= 0 {
		return 0
	}
	return max(iv, engineload.MinInterval)
}

// runEngineLoad scrapes every endpoint's load gauges (where its family reports them) each
// interval, all endpoints of a round concurrently, each scrape bounded by the interval.
func (g *Gateway) runEngineLoad(ctx context.Context, iv time.Duration, m *engineLoadMetrics) {
	hc := &http.Client{Transport: g.transport(), Timeout: iv}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		g.scrapeEngineLoads(ctx, hc, iv, m)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (g *Gateway) scrapeEngineLoads(ctx context.Context, hc *http.Client, iv time.Duration, m *engineLoadMetrics) {
	g.mu.RLock()
	rts := make([]*ruleRuntime, 0, len(g.runtimes))
	for _, rt := range g.runtimes {
		rts = append(rts, rt)
	}
	g.mu.RUnlock()
	var wg sync.WaitGroup
	for _, rt := range rts {
		fam, err := registry.Lookup(rt.rule.Engine.Family)
		if err != nil {
			continue
		}
		gauges := fam.LoadGauges()
		if !gauges.Reported() {
			continue
		}
		for _, e := range rt.eps {
			wg.Go(func() {
				own, pending := e.Active(), e.Pending()
				at := g.now()
				sctx, cancel := context.WithTimeout(ctx, iv)
				defer cancel()
				running, waiting, err := engineload.Scrape(sctx, hc, e.Address, gauges)
				if ctx.Err() != nil {
					return
				}
				prev := e.LastEngineReport()
				if err != nil {
					m.errors.WithLabelValues(rt.rule.Name, e.Name, engineload.KindOf(err)).Inc()
					r := &route.EngineReport{At: at, Err: err.Error()}
					if prev != nil {
						r.Running, r.Waiting, r.Own, r.Others, r.WaitingOthers, r.At, r.Until = prev.Running, prev.Waiting, prev.Own, prev.Others, prev.WaitingOthers, prev.At, prev.Until
					}
					e.SetEngineReport(r)
					return
				}
				r := engineload.Report{Running: running, Waiting: waiting, Own: own, Pending: pending, At: at, Stale: engineload.StaleAfter * iv}
				e.SetEngineReport(&route.EngineReport{Running: running, Waiting: waiting, Own: own, Others: r.Others(),
					WaitingOthers: r.WaitingOthers(), At: at, Until: at.Add(r.Stale)})
			})
		}
	}
	wg.Wait()
}

// engineLoadMetrics are the scrape's series; the per-endpoint gauges are read at scrape time from
// the endpoints' reports (engineLoadCollector).
type engineLoadMetrics struct {
	errors *prometheus.CounterVec
}

func newEngineLoadMetrics(reg prometheus.Registerer, g *Gateway, iv time.Duration) (*engineLoadMetrics, error) {
	m := &engineLoadMetrics{errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvexact_engine_load_scrape_errors_total",
		Help: "Failed scrapes of an engine's load gauges, by kind (connect, status, size, parse, missing)."}, []string{"rule", "endpoint", "kind"})}
	if err := reg.Register(m.errors); err != nil {
		return nil, err
	}
	if err := reg.Register(&engineLoadCollector{g: g, iv: iv,
		interval: prometheus.NewDesc("kvexact_engine_load_interval_seconds", "How often each engine's load gauges are scraped.", nil, nil),
		requests: prometheus.NewDesc("kvexact_engine_load_requests", "The engine's own count of requests as last scraped (every replica's), by state (running, waiting).", []string{"rule", "endpoint", "state"}, nil),
		others:   prometheus.NewDesc("kvexact_engine_load_others", "Requests the engine counted beyond this gateway's own in-flight share at the last scrape (other replicas'), added to the load while fresh.", []string{"rule", "endpoint"}, nil),
		age:      prometheus.NewDesc("kvexact_engine_load_age_seconds", "Age of the engine's last good load report; past the staleness bound it is not used.", []string{"rule", "endpoint"}, nil),
	}); err != nil {
		return nil, err
	}
	return m, nil
}

type engineLoadCollector struct {
	g                               *Gateway
	iv                              time.Duration
	interval, requests, others, age *prometheus.Desc
}

func (c *engineLoadCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.interval
	ch <- c.requests
	ch <- c.others
	ch <- c.age
}

func (c *engineLoadCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.interval, prometheus.GaugeValue, c.iv.Seconds())
	now := c.g.now()
	c.g.mu.RLock()
	defer c.g.mu.RUnlock()
	for name, rt := range c.g.runtimes {
		for _, e := range rt.eps {
			r := e.LastEngineReport()
			if r == nil || r.Until.IsZero() {
				continue
			}
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(r.Running), name, e.Name, "running")
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.GaugeValue, float64(r.Waiting), name, e.Name, "waiting")
			ch <- prometheus.MustNewConstMetric(c.others, prometheus.GaugeValue, float64(r.Others), name, e.Name)
			ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, now.Sub(r.At).Seconds(), name, e.Name)
		}
	}
}
