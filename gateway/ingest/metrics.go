package ingest

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the event path's Prometheus series, labelled by rule, endpoint and (where a rank
// tells something) data-parallel rank. One value serves every source of a registry; a source
// deletes its series when it stops, so a removed rule leaves no ghost series.
type Metrics struct {
	applied    *prometheus.CounterVec   // rule, endpoint, rank, kind
	rejects    *prometheus.CounterVec   // rule, endpoint, rank, reason
	skips      *prometheus.CounterVec   // rule, endpoint, rank, reason
	gaps       *prometheus.CounterVec   // rule, endpoint, rank, decision
	clears     *prometheus.CounterVec   // rule, endpoint, cause
	replays    *prometheus.CounterVec   // rule, endpoint, rank, outcome
	reconnects *prometheus.CounterVec   // rule, endpoint, rank
	connected  *prometheus.GaugeVec     // rule, endpoint, rank
	blocks     *prometheus.GaugeVec     // rule, endpoint
	lag        *prometheus.HistogramVec // rule, endpoint, rank
	queueFull  *prometheus.CounterVec   // rule, endpoint, rank
	queueDepth *prometheus.GaugeVec     // rule, endpoint, rank
	snapshots  *prometheus.CounterVec   // rule, endpoint, outcome
}

// NewMetrics creates the series and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	rer := []string{"rule", "endpoint", "rank"}
	m := &Metrics{
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_ingest_events_applied_total",
			Help: "Engine events applied to the inventory, by event kind.",
		}, append(rer, "kind")),
		rejects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_ingest_rejects_total",
			Help: "Messages or drain bodies rejected whole, by reason (schema_mismatch, decode_error, rank_mismatch, frames, http, message_size).",
		}, append(rer, "reason")),
		skips: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_ingest_skipped_total",
			Help: "Events or blocks deliberately not indexed, by reason (medium, extra_keys, group_kind, unknown_parent, partial_block, unknown_block, block_count, block_size, bigram, window).",
		}, append(rer, "reason")),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_ingest_gaps_total",
			Help: "Sequence discontinuities, by decision (replayed: asked of the replay socket first, then judged again; kept: <= 64 missing, unless unreplayed gaps clear; cleared: more, a regression or a restart).",
		}, append(rer, "decision")),
		clears: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_ingest_clears_total",
			Help: "Endpoint inventory clears, by cause (engine, created, gap, reconnect, publisher_restart, regression, restart, map_overflow, start).",
		}, []string{"rule", "endpoint", "cause"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_ingest_replays_total",
			Help: "Replay exchanges, by outcome (requested, completed, failed; truncated: a fresh mirror's replay from 0 began past sequence 0, so blocks stored before the publisher's buffer are unknown to this gateway).",
		}, append(rer, "outcome")),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_ingest_reconnects_total",
			Help: "Subscriber reconnects after a dropped connection.",
		}, rer),
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvexact_ingest_connected",
			Help: "1 while the rank's event subscription (or drain poller) is connected.",
		}, rer),
		blocks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvexact_ingest_blocks",
			Help: "Resident blocks of the endpoint in the inventory (all ranks together).",
		}, []string{"rule", "endpoint"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvexact_ingest_event_lag_seconds",
			Help:    "Wall clock at apply minus the batch timestamp the engine stamped.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		}, rer),
		queueFull: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_ingest_queue_full_total",
			Help: "Messages dropped because the rank's queue between socket and pipeline was full (Config.QueueLimit); the sequence window sees the gap.",
		}, rer),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvexact_ingest_queue_depth",
			Help: "Messages waiting in the rank's queue between socket and pipeline.",
		}, rer),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvexact_ingest_snapshots_total",
			Help: "Peer snapshots asked for at start, by outcome (accepted; unavailable: not fetched; mismatch: another rule, engine, binding or rank count; unverified: the replay did not answer; gap, stale, publisher: the engine's stream does not continue from the snapshot's sequence).",
		}, []string{"rule", "endpoint", "outcome"}),
	}
	for _, c := range []prometheus.Collector{m.applied, m.rejects, m.skips, m.gaps, m.clears, m.replays, m.reconnects, m.connected, m.blocks, m.lag, m.queueFull, m.queueDepth, m.snapshots} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// labels binds one source's rule and endpoint; a nil *Metrics makes every method a no-op.
type labels struct {
	m              *Metrics
	rule, endpoint string
}

func (l labels) rank(r int) string { return strconv.Itoa(r) }

func (l labels) applied(r int, kind string, n int) {
	if l.m != nil && n > 0 {
		l.m.applied.WithLabelValues(l.rule, l.endpoint, l.rank(r), kind).Add(float64(n))
	}
}
func (l labels) reject(r int, reason string) {
	if l.m != nil {
		l.m.rejects.WithLabelValues(l.rule, l.endpoint, l.rank(r), reason).Inc()
	}
}
func (l labels) skip(r int, reason string, n int) {
	if l.m != nil && n > 0 {
		l.m.skips.WithLabelValues(l.rule, l.endpoint, l.rank(r), reason).Add(float64(n))
	}
}
func (l labels) gap(r int, decision string) {
	if l.m != nil {
		l.m.gaps.WithLabelValues(l.rule, l.endpoint, l.rank(r), decision).Inc()
	}
}
func (l labels) clear(cause string) {
	if l.m != nil {
		l.m.clears.WithLabelValues(l.rule, l.endpoint, cause).Inc()
	}
}
func (l labels) replay(r int, outcome string) {
	if l.m != nil {
		l.m.replays.WithLabelValues(l.rule, l.endpoint, l.rank(r), outcome).Inc()
	}
}
func (l labels) snapshot(outcome string) {
	if l.m != nil {
		l.m.snapshots.WithLabelValues(l.rule, l.endpoint, outcome).Inc()
	}
}
func (l labels) reconnect(r int) {
	if l.m != nil {
		l.m.reconnects.WithLabelValues(l.rule, l.endpoint, l.rank(r)).Inc()
	}
}
func (l labels) connected(r int, up bool) {
	if l.m != nil {
		v := 0.0
		if up {
			v = 1
		}
		l.m.connected.WithLabelValues(l.rule, l.endpoint, l.rank(r)).Set(v)
	}
}
func (l labels) lag(r int, seconds float64) {
	if l.m != nil {
		l.m.lag.WithLabelValues(l.rule, l.endpoint, l.rank(r)).Observe(max(seconds, 0))
	}
}

// queue resolves one rank's queue series (at each connect, so the reader's hot path only touches
// the resolved counter and gauge).
func (l labels) queue(r int) queueMetrics {
	if l.m == nil {
		return queueMetrics{}
	}
	lv := []string{l.rule, l.endpoint, l.rank(r)}
	return queueMetrics{full: l.m.queueFull.WithLabelValues(lv...), depth: l.m.queueDepth.WithLabelValues(lv...)}
}

// SetBlocks records the endpoint's resident block count; the inventory sink calls it after every
// update.
func (m *Metrics) SetBlocks(rule, endpoint string, n int) {
	if m != nil {
		m.blocks.WithLabelValues(rule, endpoint).Set(float64(n))
	}
}

// Forget deletes every series of one endpoint (the rule or endpoint went away).
func (m *Metrics) Forget(rule, endpoint string) {
	if m == nil {
		return
	}
	match := prometheus.Labels{"rule": rule, "endpoint": endpoint}
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{m.applied, m.rejects, m.skips, m.gaps, m.clears, m.replays, m.reconnects, m.connected, m.blocks, m.lag, m.queueFull, m.queueDepth, m.snapshots} {
		v.DeletePartialMatch(match)
	}
}
