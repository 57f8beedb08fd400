package kvbench

import (
	"fmt"
	"math"
	"strings"
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

// Targets checks the routing targets for the gateway's default KV-exact rule (PolicyDefault) on every shared-prefix
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
		kx, orc, rr := r.cell(w, PolicyDefault, ModerateLoad), r.cell(w, PolicyOracle, ModerateLoad), r.cell(w, PolicyRR, ModerateLoad)
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
			kx, ll := r.cell(w, PolicyDefault, l), r.cell(w, PolicyLeastLoad, l)
			t := check(Target{Name: "TTFT p90 ≤ least-load's", Workload: w, Load: l, Want: "≤ least-load"}, kx, ll)
			if t.Evaluated {
				t.Got = fmt.Sprintf("%.0f ms vs %.0f ms", kx.TTFT.P90, ll.TTFT.P90)
				t.Met = kx.TTFT.P90 <= ll.TTFT.P90
			}
			out = append(out, t)
		}
	}
	out = append(out, peerTargets(r)...)
	return append(out, OracleChecks(r)...)
}

// noise is the difference two cells' cached ratios may show by chance: two standard errors of the
// difference.
func noise(a, b *Cell) float64 {
	return 2 * math.Sqrt(a.CachedRatioSE*a.CachedRatioSE+b.CachedRatioSE*b.CachedRatioSE)
}

// peerTargets: on every sharing workload and load, KV-exact (default) against each peer strategy's
// cached-token ratio and TTFT p90, and against 90 % of the oracle's cached tokens.
func peerTargets(r *Report) []Target {
	var out []Target
	for _, w := range r.Plan.Workloads {
		if !Sharing(w) {
			continue
		}
		for _, l := range r.Plan.Loads {
			kx := r.cell(w, PolicyDefault, l)
			if kx == nil {
				continue
			}
			for _, p := range r.Plan.Policies {
				if p.Peer == "" && p.Name != PolicyLLMDPrecise {
					continue
				}
				pc := r.cell(w, p.Name, l)
				t := Target{Name: "cached ratio and TTFT p90 ≥ " + p.Name, Workload: w, Load: l, Want: "cached ≥ (within noise), TTFT p90 ≤"}
				if pc == nil || !pc.Valid || !kx.Valid {
					t.Note = "cell missing or invalid"
					out = append(out, t)
					continue
				}
				t.Evaluated = true
				t.Got = fmt.Sprintf("cached %.3f vs %.3f (noise %.3f), TTFT p90 %.0f vs %.0f ms", kx.CachedRatio, pc.CachedRatio, noise(kx, pc), kx.TTFT.P90, pc.TTFT.P90)
				t.Met = kx.CachedRatio >= pc.CachedRatio-noise(kx, pc) && kx.TTFT.P90 <= pc.TTFT.P90
				out = append(out, t)
			}
			orc := r.bestOracle(w, l)
			t := Target{Name: "cached ratio ≥ 90% of oracle", Workload: w, Load: l, Want: "≥ 0.90"}
			if orc == nil || !orc.Valid || !kx.Valid {
				t.Note = "cell missing or invalid"
			} else {
				t.Evaluated = true
				ratio := 0.0
				if orc.CachedRatio > 0 {
					ratio = kx.CachedRatio / orc.CachedRatio
				}
				t.Got = fmt.Sprintf("%.3f (%.3f vs %.3f)", ratio, kx.CachedRatio, orc.CachedRatio)
				t.Met = orc.CachedRatio > 0 && ratio >= 0.90
			}
			out = append(out, t)
		}
	}
	return out
}

// isOracle says whether a cell's policy is one of the oracles.
func isOracle(name string) bool {
	return name == PolicyOracle || name == PolicyOracleCacheFirst || name == PolicyOracleTTFT
}

// bestOracle is the valid oracle cell with the highest cached ratio (nil when none is valid).
func (r *Report) bestOracle(w string, l float64) *Cell {
	var best *Cell
	for _, n := range []string{PolicyOracle, PolicyOracleCacheFirst} {
		if c := r.cell(w, n, l); c != nil && c.Valid && (best == nil || c.CachedRatio > best.CachedRatio) {
			best = c
		}
	}
	if best == nil {
		return r.cell(w, PolicyOracle, l)
	}
	return best
}

// OracleChecks verifies that the oracle is an upper bound: in every (workload, load) with a valid
// oracle cell, no valid policy's cached ratio exceeds the oracle's by more than the run's noise.
// When one does, the check is missed and names it: the oracle is not an upper bound for that cell.
func OracleChecks(r *Report) []Target {
	var out []Target
	seen := map[string]bool{}
	for _, c0 := range r.Cells {
		if c0.Policy == PolicyOracleTTFT {
			out = append(out, ttftBound(r, c0))
			continue
		}
		if !isOracle(c0.Policy) {
			continue
		}
		key := fmt.Sprintf("%s/%g", c0.Workload, c0.Load)
		if seen[key] {
			continue
		}
		seen[key] = true
		o := r.bestOracle(c0.Workload, c0.Load)
		t := Target{Name: "oracle is an upper bound", Workload: o.Workload, Load: o.Load, Want: "no policy's cached ratio above the oracle's + noise"}
		if !o.Valid {
			t.Note = "oracle cell invalid"
			out = append(out, t)
			continue
		}
		t.Evaluated, t.Met = true, true
		var above []string
		maxName, maxGap := "", math.Inf(-1)
		for _, c := range r.Cells {
			if c.Workload != o.Workload || c.Load != o.Load || isOracle(c.Policy) || !c.Valid {
				continue
			}
			gap := c.CachedRatio - o.CachedRatio
			if gap > maxGap {
				maxName, maxGap = c.Policy, gap
			}
			if gap > noise(c, o) {
				above = append(above, fmt.Sprintf("%s %.3f > %.3f + %.3f", c.Policy, c.CachedRatio, o.CachedRatio, noise(c, o)))
			}
		}
		if len(above) > 0 {
			t.Met = false
			t.Got = "NOT an upper bound for this cell (best oracle: " + o.Policy + "): " + strings.Join(above, "; ")
		} else if maxName != "" {
			t.Got = fmt.Sprintf("%s %.3f; closest %s %+.3f", o.Policy, o.CachedRatio, maxName, maxGap)
		} else {
			t.Got = fmt.Sprintf("oracle %.3f; no other valid cell", o.CachedRatio)
		}
		out = append(out, t)
	}
	return out
}

// ttftSlack is how far below the ttft oracle's TTFT p90 a policy may come before the check says
// the oracle is not a bound: a single cell's p90 moves by about that much between runs.
const ttftSlack = 0.10

// ttftBound checks that no valid policy's TTFT p90 in o's cell is below the ttft oracle's by more
// than ttftSlack. The oracle is greedy, so a miss is possible in principle (docs/routing.md).
func ttftBound(r *Report, o *Cell) Target {
	t := Target{Name: "oracle ttft bounds TTFT p90", Workload: o.Workload, Load: o.Load, Want: fmt.Sprintf("no policy's TTFT p90 below the oracle's by more than %.0f%%", 100*ttftSlack)}
	if !o.Valid {
		t.Note = "oracle ttft cell invalid"
		return t
	}
	t.Evaluated, t.Met = true, true
	var below []string
	for _, c := range r.Cells {
		if c.Workload == o.Workload && c.Load == o.Load && !isOracle(c.Policy) && c.Valid && c.TTFT.P90 < (1-ttftSlack)*o.TTFT.P90 {
			below = append(below, fmt.Sprintf("%s %.0f ms", c.Policy, c.TTFT.P90))
		}
	}
	t.Got = fmt.Sprintf("oracle ttft %.0f ms", o.TTFT.P90)
	if len(below) > 0 {
		t.Met = false
		t.Got += "; below it: " + strings.Join(below, ", ")
	}
	return t
}
