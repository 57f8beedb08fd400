package engines

// Load is where the family's engine reports its own queue: the Prometheus gauges of requests it
// runs and requests it holds waiting, summed over their label sets (ranks, models). Gateway
// replicas that share an engine each count only their own in-flight requests; the engine's gauges
// count everyone's, so a replica adds what the engine reports beyond its own share
// (gateway/engineload).
type Load interface {
	// LoadGauges names the gauges; the zero value means the engine reports none the gateway reads.
	LoadGauges() LoadGauges
}

// LoadGauges are the metric names of an engine's own request counts, served on Path.
type LoadGauges struct {
	Path    string   // the metrics path on the engine's API address (/metrics)
	Running []string // gauges of requests being executed
	Waiting []string // gauges of requests queued, not yet scheduled
}

// Reported reports whether the engine reports any gauge.
func (g LoadGauges) Reported() bool { return g.Path != "" && len(g.Running)+len(g.Waiting) > 0 }
