package kvbench

import (
	"fmt"
	"math"
)

// Target is one stated goal checked against measured cells.
type Target struct {
	Name     string  `json:"name"`
	Workload string  `json:"workload"`
	Load     float64 `json:"load"`
	Want     string  `json:"want"`
	Got      string  `json:"got"`
	Met      bool    `json:"met"`
	// Evaluated is false when a cell it needs is missing or invalid.
	Evaluated bool   `json:"evaluated"`
	Note      string `json:"note,omitempty"`
}

// ModerateLoad is the load the cache-ratio targets are read at.
const ModerateLoad = 0.6

func (r *Report) cell(workload, policy string, load float64) *Cell {
	for _, c := range r.Cells {
		if c.Workload == workload && c.Policy == policy && math.Abs(c.Load-load) < 1e-9 {
			return c
		}
	}
	return nil
}

// Targets checks the targets for the default KV-exact policy on every shared-prefix
// workload: at moderate load ≥ 95 % of the oracle's cached-token ratio and ≥ 2× round-robin's;
// at and past saturation a TTFT p90 no worse than least-load's.
func Targets(r *Report) []Target {
	var out []Target
	check := func(t Target, cells ...*Cell) Target {
		for _, c := range cells {
			if c == nil {
				t.Note = "cell not measured"
				return t
			}
			if !c.Valid {
				t.Note = fmt.Sprintf("%s cell invalid: %v", c.Policy, c.Invalid)
				return t
			}
		}
		t.Evaluated = true
		return t
	}
	for _, w := range r.Plan.Workloads {
		if !Sharing(w) {
			continue
		}
		kx, orc, rr := r.cell(w, PolicyKVXDefault, ModerateLoad), r.cell(w, PolicyOracle, ModerateLoad), r.cell(w, PolicyRR, ModerateLoad)
		t := check(Target{Name: "cached ratio ≥ 95% of oracle", Workload: w, Load: ModerateLoad, Want: "≥ 0.95"}, kx, orc)
		if t.Evaluated {
			ratio := 0.0
			if orc.CachedRatio > 0 {
				ratio = kx.CachedRatio / orc.CachedRatio
			}
			t.Got = fmt.Sprintf("%.3f (%.3f vs %.3f)", ratio, kx.CachedRatio, orc.CachedRatio)
			t.Met = orc.CachedRatio > 0 && ratio >= 0.95
		}
		out = append(out, t)
		t = check(Target{Name: "cached ratio ≥ 2× round-robin", Workload: w, Load: ModerateLoad, Want: "≥ 2.0×"}, kx, rr)
		if t.Evaluated {
			if rr.CachedRatio > 0 {
				t.Got = fmt.Sprintf("%.2f× (%.3f vs %.3f)", kx.CachedRatio/rr.CachedRatio, kx.CachedRatio, rr.CachedRatio)
			} else {
				t.Got = fmt.Sprintf("∞ (%.3f vs 0)", kx.CachedRatio)
			}
			t.Met = kx.CachedRatio >= 2*rr.CachedRatio && kx.CachedRatio > 0
		}
		out = append(out, t)
		for _, l := range r.Plan.Loads {
			if l < 1 {
				continue
			}
			kx, ll := r.cell(w, PolicyKVXDefault, l), r.cell(w, PolicyLeastLoad, l)
			t := check(Target{Name: "TTFT p90 ≤ least-load's", Workload: w, Load: l, Want: "≤ least-load"}, kx, ll)
			if t.Evaluated {
				t.Got = fmt.Sprintf("%.0f ms vs %.0f ms", kx.TTFT.P90, ll.TTFT.P90)
				t.Met = kx.TTFT.P90 <= ll.TTFT.P90
			}
			out = append(out, t)
		}
	}
	return out
}
