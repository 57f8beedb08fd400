package kvbench

import (
	"fmt"
	"sort"
	"strings"
)

// summaryRow is one row of the summary table; anchor is the linked section's fragment.
type summaryRow struct{ figure, anchor, target, now, verdict string }

// writeSummary opens the document with its one summary table: every figure that has a target, the
// section it comes from, the target, this run's value and the verdict — the routing targets grouped
// by kind (each kind is read at several workloads and loads), the extra rows of TargetsFile (figures
// of a section's own runs), the proxy's overhead targets one by one.
func writeSummary(b *strings.Builder, rep *Report, ov *Overhead, extra []summaryRow) {
	type row = summaryRow
	var rows []row
	if rep != nil {
		type tally struct {
			met, missed, unevaluated int
			missedAt                 []string
		}
		byName := map[string]*tally{}
		var names []string
		for _, t := range rep.Targets {
			n := byName[t.Name]
			if n == nil {
				n = &tally{}
				byName[t.Name] = n
				names = append(names, t.Name)
			}
			switch {
			case !t.Evaluated:
				n.unevaluated++
			case t.Met:
				n.met++
			default:
				n.missed++
				n.missedAt = append(n.missedAt, fmt.Sprintf("%s %.1f", t.Workload, t.Load))
			}
		}
		for _, name := range names {
			n := byName[name]
			now := fmt.Sprintf("met in %d of %d", n.met, n.met+n.missed)
			if n.unevaluated > 0 {
				now += fmt.Sprintf(" (%d not evaluated)", n.unevaluated)
			}
			v := "met"
			if n.missed > 0 {
				sort.Strings(n.missedAt)
				at := n.missedAt
				if len(at) > 3 {
					at = append(at[:3:3], "…")
				}
				v = "**missed** at " + strings.Join(at, ", ")
			} else if n.met == 0 {
				v = "not evaluated"
			}
			rows = append(rows, row{"Routing quality (every workload and load the target applies to)", "#" + Anchor(targetsHeading), name, now, v})
		}
	}
	rows = append(rows, extra...)
	if ov != nil {
		if len(ov.Proxy) > 0 {
			rows = append(rows, row{"Proxy throughput vs nginx", "#proxy-throughput-round-robin-vs-nginx-proxy_pass-vs-direct", "gateway ≥ 0.45 × nginx req/s",
				fmt.Sprintf("%.2f × (median of %d rounds)", ov.RatioVsNginx, len(ov.Proxy)), verdict(ov.RatioVsNginx >= 0.45)})
		}
		if g, ok := ov.AddedLatency["gateway"]; ok {
			rows = append(rows, row{"Added latency", fmt.Sprintf("#added-latency-at-a-fixed-rate-%d-small-requestss", ov.LatencyRate), fmt.Sprintf("added p99 ≤ 1 ms at %d req/s", ov.LatencyRate),
				fmt.Sprintf("%+.0f µs p99, %+.0f µs p50", g.P99us, g.P50us), verdict(g.P99us <= 1000)})
		}
		if g, ok := ov.AddedTTFB["gateway"]; ok {
			rows = append(rows, row{"Streaming time to first byte", "#streaming-time-to-first-byte", "p50 within 0.5 ms of direct",
				fmt.Sprintf("%+.0f µs p50, %+.0f µs p99", g.P50us, g.P99us), verdict(g.P50us <= 500)})
		}
	}
	if len(rows) == 0 {
		b.WriteString("No figure with a target was measured in this run.\n\n")
		return
	}
	b.WriteString("Every figure of this run that has a target; each link leads to its section below, with the command, the machine's load and the same-run baseline.\n\n")
	b.WriteString("| figure | section | target | now | verdict |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(b, "| %s | [details](%s) | %s | %s | %s |\n", r.figure, r.anchor, r.target, r.now, r.verdict)
	}
	b.WriteString("\n")
}
