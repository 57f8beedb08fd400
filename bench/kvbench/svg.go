package kvbench

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// Charts are written by hand as SVG: small multiples (one panel per workload), one line per policy,
// offered load on x. Invalid cells are left out, never drawn.

var policyColors = map[string]string{
	PolicyRR: "#7f7f7f", PolicyLeastLoad: "#1f77b4", PolicyCHWBL: "#9467bd",
	PolicyKVXDefault: "#d62728", "kv-exact prefix/hard": "#ff7f0e", PolicyOracle: "#2ca02c", PolicyOracleCacheFirst: "#006400", PolicyOracleTTFT: "#00a000",
	"kv-exact overlap/soft": "#8c564b", "kv-exact overlap/adaptive": "#e377c2", "kv-exact overlap/off": "#bcbd22",
	"kv-exact prefix/soft": "#17becf", "kv-exact prefix/adaptive": "#aec7e8", "kv-exact prefix/off": "#c49c94",
	// The peers' strategies.
	PolicyKVXPredict: "#800000", PolicyDefault: "#1f1f1f", PolicyTTFT: "#e6550d", "Dynamo approx (no KV events)": "#76b900", "SGLang gateway approx tree": "#f4a300",
	"AIBrix prefix-cache": "#0072b2", "llm-d estimate": "#cc79a7", PolicyLLMDPrecise: "#56b4e9",
}

var policyDash = map[string]string{PolicyOracle: "6,3", PolicyOracleTTFT: "6,3", PolicyOracleCacheFirst: "6,3", PolicyRR: "2,3",
	"Dynamo approx (no KV events)": "4,2", "SGLang gateway approx tree": "4,2", "AIBrix prefix-cache": "4,2", "llm-d estimate": "4,2", PolicyLLMDPrecise: "4,2"}

type series struct {
	name string
	x, y []float64
}

type axis struct {
	label    string
	log      bool
	min, max float64
	ticks    []float64
	format   func(float64) string
}

func (a axis) pos(v float64, lo, hi float64) float64 {
	if a.log {
		v = math.Log10(math.Max(v, a.min))
		return lo + (hi-lo)*(v-math.Log10(a.min))/(math.Log10(a.max)-math.Log10(a.min))
	}
	return lo + (hi-lo)*(v-a.min)/(a.max-a.min)
}

// smallMultiples draws one panel per title with the given series.
func smallMultiples(title string, panels []string, data map[string][]series, xa, ya axis) string {
	const pw, ph, ml, mr, mt, mb = 250.0, 190.0, 52.0, 12.0, 46.0, 40.0
	n := len(panels)
	names := []string{}
	seen := map[string]bool{}
	for _, p := range panels {
		for _, s := range data[p] {
			if !seen[s.name] {
				seen[s.name] = true
				names = append(names, s.name)
			}
		}
	}
	legendRows := (len(names) + 3) / 4
	W := float64(n)*(pw+ml+mr) + 10
	H := mt + ph + mb + float64(legendRows)*18 + 10
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica,Arial,sans-serif" font-size="11">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="8" y="18" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	for i, p := range panels {
		x0 := float64(i)*(pw+ml+mr) + ml
		y0, y1 := mt+ph, mt
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="12" font-weight="bold" text-anchor="middle">%s</text>`+"\n", x0+pw/2, mt-8, html.EscapeString(p))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#ccc"/>`+"\n", x0, y1, pw, ph)
		for _, t := range ya.ticks {
			y := ya.pos(t, y0, y1)
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/>`, x0, x0+pw, y, y)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", x0-4, y+4, ya.format(t))
		}
		for _, t := range xa.ticks {
			x := xa.pos(t, x0, x0+pw)
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/>`, x, x, y0, y1)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#555">%s</text>`+"\n", x, y0+14, xa.format(t))
		}
		if xa.min < 1 && xa.max > 1 { // saturation of a cache-blind pool
			x := xa.pos(1, x0, x0+pw)
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#999" stroke-dasharray="3,3"/>`+"\n", x, x, y0, y1)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#333">%s</text>`+"\n", x0+pw/2, y0+30, html.EscapeString(xa.label))
		if i == 0 {
			fmt.Fprintf(&b, `<text transform="translate(%.1f %.1f) rotate(-90)" text-anchor="middle" fill="#333">%s</text>`+"\n", 12.0, mt+ph/2, html.EscapeString(ya.label))
		}
		for _, s := range data[p] {
			col := policyColors[s.name]
			if col == "" {
				col = "#000"
			}
			var pts []string
			for k := range s.x {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xa.pos(s.x[k], x0, x0+pw), ya.pos(math.Min(math.Max(s.y[k], ya.min), ya.max), y0, y1)))
			}
			dash := ""
			if d := policyDash[s.name]; d != "" {
				dash = fmt.Sprintf(` stroke-dasharray="%s"`, d)
			}
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), col, dash)
			for _, pt := range pts {
				xy := strings.Split(pt, ",")
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="2.5" fill="%s"/>`, xy[0], xy[1], col)
			}
			b.WriteString("\n")
		}
	}
	ly := mt + ph + mb + 6
	for i, name := range names {
		col := policyColors[name]
		x := 10 + float64(i%4)*260
		y := ly + float64(i/4)*18
		dash := ""
		if d := policyDash[name]; d != "" {
			dash = fmt.Sprintf(` stroke-dasharray="%s"`, d)
		}
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="3"%s/>`, x, x+24, y, y, col, dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", x+30, y+4, html.EscapeString(name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// ChartFiles are the charts WriteCharts produces, with what each shows.
var ChartFiles = []struct{ Name, Caption string }{
	{"hit-ratio.svg", "Cached-token ratio (backend receipts) vs offered load"},
	{"ttft-p90.svg", "TTFT p90 vs offered load (log scale)"},
	{"goodput.svg", "Goodput (requests/s with TTFT within the SLO) vs offered load"},
}

// WriteCharts writes the sweep's charts into dir.
func WriteCharts(r *Report, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	panels := r.Plan.Workloads
	main := map[string]bool{}
	for _, p := range r.Plan.Policies {
		main[p.Name] = true
	}
	collect := func(val func(*Cell) float64) map[string][]series {
		out := map[string][]series{}
		for _, w := range panels {
			for _, p := range r.Plan.Policies {
				s := series{name: p.Name}
				for _, c := range r.Cells {
					if c.Workload == w && c.Policy == p.Name && c.Valid {
						s.x, s.y = append(s.x, c.Load), append(s.y, val(c))
					}
				}
				if len(s.x) > 0 {
					out[w] = append(out[w], s)
				}
			}
		}
		return out
	}
	lo, hi := 0.0, 1.6
	for _, l := range r.Plan.Loads {
		hi = math.Max(hi, l+0.1)
	}
	xa := axis{label: "offered load (× uncached capacity)", min: lo, max: hi, ticks: []float64{0, 0.5, 1, 1.5}, format: func(v float64) string { return fmt.Sprintf("%.1f", v) }}
	pctFmt := func(v float64) string { return fmt.Sprintf("%.0f%%", 100*v) }
	charts := map[string]string{
		"hit-ratio.svg": smallMultiples("Cached-token ratio from backend receipts (higher is better)", panels, collect(func(c *Cell) float64 { return c.CachedRatio }), xa,
			axis{label: "cached / prompt tokens", min: 0, max: 1, ticks: []float64{0, 0.25, 0.5, 0.75, 1}, format: pctFmt}),
		"ttft-p90.svg": smallMultiples("Time to first token, p90 (lower is better)", panels, collect(func(c *Cell) float64 { return c.TTFT.P90 }), xa,
			axis{label: "TTFT p90 (ms, log)", log: true, min: 10, max: 10000, ticks: []float64{10, 30, 100, 300, 1000, 3000, 10000}, format: func(v float64) string { return fmt.Sprintf("%g", v) }}),
	}
	maxGood := 1.0
	for _, c := range r.Cells {
		maxGood = math.Max(maxGood, c.Goodput/math.Max(r.Capacity[c.Workload], 1e-9))
	}
	top := math.Ceil(maxGood*4) / 4
	var gt []float64
	for v := 0.0; v <= top+1e-9; v += 0.25 {
		gt = append(gt, v)
	}
	charts["goodput.svg"] = smallMultiples(fmt.Sprintf("Goodput at TTFT ≤ %.0f ms, as a fraction of uncached capacity (higher is better)", r.SLOms), panels,
		collect(func(c *Cell) float64 { return c.Goodput / r.Capacity[c.Workload] }), xa,
		axis{label: "goodput (× uncached capacity)", min: 0, max: top, ticks: gt, format: func(v float64) string { return fmt.Sprintf("%.2g", v) }})
	for name, svg := range charts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(svg), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// WriteProxyChart writes proxy-throughput.svg when the comparison ran.
func WriteProxyChart(ov *Overhead, dir string) error {
	if ov == nil || len(ov.Proxy) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "proxy-throughput.svg"), []byte(proxyChart(ov)), 0o644)
}
