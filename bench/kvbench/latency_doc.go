package kvbench

import (
	"fmt"
	"slices"
	"strings"
)

// writeBaseline adds the baseline gateway's throughput, measured in the same rounds.
func writeBaseline(b *strings.Builder, ov *Overhead) {
	if ov.Baseline == "" {
		return
	}
	fmt.Fprintf(b, "**Baseline in the same rounds:** `%s` (binary %s), a fourth target in every round's rotation.\n\n", ov.Baseline, ov.BaselineBin)
	b.WriteString("| round | nginx req/s | gateway req/s | gateway CPU µs/req | " + ov.Baseline + " req/s | " + ov.Baseline + " CPU µs/req | gateway / nginx | " + ov.Baseline + " / nginx |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var br, bc []float64
	for i, r := range ov.Proxy {
		fmt.Fprintf(b, "| %d | %.0f | %.0f | %.1f | %.0f | %.1f | %.2f | %.2f |\n", i+1, r.Nginx, r.Gateway, r.GatewayCPUus, r.Baseline, r.BaselineCPUus, r.Gateway/r.Nginx, r.Baseline/r.Nginx)
		br, bc = append(br, r.Baseline), append(bc, r.BaselineCPUus)
	}
	md := ov.Medians()
	fmt.Fprintf(b, "| **median** | %.0f | %.0f | %.1f | %.0f | %.1f | **%.2f** | **%.2f** |\n\n", md.Nginx, md.Gateway, md.GatewayCPUus, median(br), median(bc), ov.RatioVsNginx, ov.RatioBaselineVsNginx)
}

// latencyTargets orders the targets of a latency table: direct, nginx, gateway, then the rest.
func latencyTargets(rounds []LatencyRound) []string {
	seen := map[string]bool{}
	for _, r := range rounds {
		for n := range r.Targets {
			seen[n] = true
		}
	}
	var out []string
	for _, n := range []string{"direct", "nginx", "gateway"} {
		if seen[n] {
			out = append(out, n)
			delete(seen, n)
		}
	}
	var rest []string
	for n := range seen {
		rest = append(rest, n)
	}
	slices.Sort(rest)
	return append(out, rest...)
}

func writeLatencyTable(b *strings.Builder, rounds []LatencyRound, cpu bool) {
	names := latencyTargets(rounds)
	b.WriteString("| round | order |")
	sep := "|---:|---|"
	for _, n := range names {
		b.WriteString(" " + n + " p50 / p99 µs |")
		sep += "---:|"
		if cpu && n != "direct" {
			b.WriteString(" " + n + " CPU µs/req |")
			sep += "---:|"
		}
	}
	b.WriteString("\n" + sep + "\n")
	for i, r := range rounds {
		fmt.Fprintf(b, "| %d | %s |", i+1, r.Order)
		for _, n := range names {
			f := r.Targets[n]
			fmt.Fprintf(b, " %.0f / %.0f |", f.P50us, f.P99us)
			if cpu && n != "direct" {
				fmt.Fprintf(b, " %.1f |", f.CPUus)
			}
		}
		b.WriteString("\n")
	}
}

func writeAdded(b *strings.Builder, a map[string]AddedLatency) {
	var names []string
	for n := range a {
		names = append(names, n)
	}
	slices.Sort(names)
	b.WriteString("\nAdded over direct (medians over the rounds of the per-round differences):")
	for _, n := range names {
		fmt.Fprintf(b, " %s **%+.0f µs p50, %+.0f µs p99**;", n, a[n].P50us, a[n].P99us)
	}
	b.WriteString(" a negative difference is noise: the target was faster than direct in that round's median.\n\n")
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// writeLatency renders the fixed-rate, saturation and streaming latency rounds with the proxy-overhead
// targets (added p99 ≤ 1 ms at 1,000 req/s, saturation ≥ 45 % of nginx).
func writeLatency(b *strings.Builder, ov *Overhead) {
	if len(ov.Latency) > 0 {
		fmt.Fprintf(b, "### Added latency at a fixed rate (%d small requests/s)\n\n", ov.LatencyRate)
		fmt.Fprintf(b, "Open loop from kvbench itself (Go net/http client, keep-alive): each request is due at its own instant, %d per second whatever the earlier ones are doing, and its latency counts from that instant to the last body byte, so a stall is charged in full (no coordinated omission). Every target in every round, the order rotating as above; CPU µs/request is the proxy's process group's CPU over the run divided by the requests completed; a run with a failed request aborts the comparison.\n\n", ov.LatencyRate)
		writeLatencyTable(b, ov.Latency, true)
		writeAdded(b, ov.AddedLatency)
		if g, ok := ov.AddedLatency["gateway"]; ok {
			fmt.Fprintf(b, "Target: added p99 ≤ 1 ms at %d req/s — gateway %+.0f µs: %s.\n\n", ov.LatencyRate, g.P99us, verdict(g.P99us <= 1000))
		}
	}
	if len(ov.Proxy) > 0 && len(ov.Proxy[0].Saturation) > 0 {
		b.WriteString("### Latency at saturation\n\nwrk's own latency distribution (`--latency`: closed loop, 32 connections, percentiles from its recorded samples) in the throughput runs above.\n\n")
		sat := make([]LatencyRound, len(ov.Proxy))
		for i, r := range ov.Proxy {
			sat[i] = LatencyRound{Order: r.Order, Targets: r.Saturation}
		}
		writeLatencyTable(b, sat, false)
		writeAdded(b, ov.AddedSaturation)
	}
	if len(ov.Stream) > 0 {
		b.WriteString("### Streaming time to first byte\n\n")
		fmt.Fprintf(b, "One streaming request at a time (`%s`; the upstream flushes its first event at once, then two more and `[DONE]`), timed from the request's send to the first body byte; %d per target per round, each stream read to its end and checked complete. nginx serves these from a location with `proxy_buffering off` (its default buffering would hold SSE).\n\n", streamRequest, ov.Stream[0].Targets["direct"].Requests)
		writeLatencyTable(b, ov.Stream, false)
		writeAdded(b, ov.AddedTTFB)
		if g, ok := ov.AddedTTFB["gateway"]; ok {
			fmt.Fprintf(b, "Target: TTFB p50 within 0.5 ms of direct — gateway %+.0f µs: %s.\n\n", g.P50us, verdict(g.P50us <= 500))
		}
	}
}
