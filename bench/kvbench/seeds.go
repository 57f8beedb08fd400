package kvbench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
)

// The seeds table: a routing target is judged on the means of several workload seeds, because one
// cell's TTFT p90 and goodput move with the machine from one run to the next. SeedTable reads the
// results.json of runs that differ only in their seed (or several files per seed, each holding some
// of the policies) and gives, per workload, load and policy, the mean and range over the seeds,
// with a verdict per (workload, load) for the default rule against every peer.

// SeedFile is one results.json, read.
type SeedFile struct {
	Path   string
	Report *Report
}

// ReadSeedFiles reads and checks results.json files; an error names the file and the field.
func ReadSeedFiles(paths []string) ([]SeedFile, error) {
	var out []SeedFile
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		rep, err := DecodeSeedReport(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		out = append(out, SeedFile{Path: p, Report: rep})
	}
	return out, nil
}

// DecodeSeedReport decodes one results.json and checks the fields the seeds table reads; an error
// names the field (as a JSON path).
func DecodeSeedReport(b []byte) (*Report, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return nil, fmt.Errorf("not a results.json: %w", err)
	}
	for _, k := range []string{"plan", "pool", "sloTTFTms", "cells"} {
		if _, ok := top[k]; !ok {
			return nil, fmt.Errorf("%s: missing", k)
		}
	}
	var plan map[string]json.RawMessage
	if err := json.Unmarshal(top["plan"], &plan); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	for _, k := range []string{"seed", "shape", "duration", "policies"} {
		if _, ok := plan[k]; !ok {
			return nil, fmt.Errorf("plan.%s: missing", k)
		}
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("%s: %s where %s was expected", te.Field, te.Value, te.Type)
		}
		return nil, err
	}
	seen := map[string]int{}
	for i, c := range rep.Cells {
		switch {
		case c == nil:
			return nil, fmt.Errorf("cells[%d]: null", i)
		case c.Workload == "":
			return nil, fmt.Errorf("cells[%d].workload: empty", i)
		case c.Policy == "":
			return nil, fmt.Errorf("cells[%d].policy: empty", i)
		case !(c.Load > 0):
			return nil, fmt.Errorf("cells[%d].load: %g is not a positive load", i, c.Load)
		case rep.policy(c.Policy) == nil:
			return nil, fmt.Errorf("cells[%d].policy: %q is not among plan.policies or plan.lawPolicies", i, c.Policy)
		}
		k := cellKey(c.Workload, c.Policy, c.Load)
		if j, ok := seen[k]; ok {
			return nil, fmt.Errorf("cells[%d]: the same cell as cells[%d] (%s)", i, j, CellID{c.Workload, c.Policy, c.Load})
		}
		seen[k] = i
	}
	return &rep, nil
}

func (r *Report) policy(name string) *Policy {
	for _, ps := range [][]Policy{r.Plan.Policies, r.Plan.LawPolicies} {
		for i := range ps {
			if ps[i].Name == name {
				return &ps[i]
			}
		}
	}
	return nil
}

// cellKey identifies a cell across files (loads compared to 1e-6).
func cellKey(w, p string, load float64) string {
	return fmt.Sprintf("%s\x00%s\x00%d", w, p, int64(math.Round(load*1e6)))
}

// SeedStat is a figure over the seeds: how many, their mean, least and greatest.
type SeedStat struct {
	N              int
	Mean, Min, Max float64
}

// Spread is the range of the figure over the seeds, the noise the verdicts allow.
func (s SeedStat) Spread() float64 { return s.Max - s.Min }

func seedStat(xs []float64) SeedStat {
	if len(xs) == 0 {
		return SeedStat{}
	}
	s := SeedStat{N: len(xs), Min: xs[0], Max: xs[0]}
	sum := 0.0
	for _, x := range xs {
		sum += x
		s.Min, s.Max = min(s.Min, x), max(s.Max, x)
	}
	s.Mean = sum / float64(len(xs))
	return s
}

// SeedRow is one (workload, load, policy) over the seeds. Only valid cells count: Left names the
// seeds whose cell was invalid or failed.
type SeedRow struct {
	Workload string
	Load     float64
	Policy   string
	Role     string // RoleDefault, RoleKVExact, RolePeer or RoleOracle
	TTFTp90  SeedStat
	Goodput  SeedStat
	Cached   SeedStat
	Left     []uint64
}

// The roles of a policy in the verdict.
const (
	RoleDefault = "default"
	RoleKVExact = "kv-exact variant"
	RolePeer    = "peer"
	RoleOracle  = "oracle"
)

// PolicyRole says what a policy is to the verdict: the default rule, another KV-exact variant (not
// judged against), a peer (a peer router's strategy, llm-d precise, or a baseline selector:
// round-robin, least-load, chwbl) or an oracle.
func PolicyRole(p Policy) string {
	switch {
	case p.Name == PolicyDefault:
		return RoleDefault
	case p.Oracle:
		return RoleOracle
	case p.Peer != "" || p.Name == PolicyLLMDPrecise || !p.Exact:
		return RolePeer
	default:
		return RoleKVExact
	}
}

// Compare is the default rule against one peer on one figure.
type Compare int

// Ahead: better by more than the noise; Level: within it; Behind: worse by more than it.
const (
	Level Compare = iota
	Ahead
	Behind
)

// compareMeans compares a's mean with b's, allowing the larger of their two spreads over the seeds
// (a difference equal to it is level). higherBetter is true for goodput, false for TTFT p90. The
// tolerance of 1e-9 absorbs the rounding of the means, nothing else.
func compareMeans(a, b SeedStat, higherBetter bool) Compare {
	noise := max(a.Spread(), b.Spread())
	d := a.Mean - b.Mean
	if !higherBetter {
		d = -d
	}
	eps := 1e-9 * max(1, math.Abs(a.Mean), math.Abs(b.Mean))
	switch {
	case d > noise+eps:
		return Ahead
	case d < -noise-eps:
		return Behind
	}
	return Level
}

// PeerCompare is the default rule against one peer in one (workload, load).
type PeerCompare struct {
	Peer          string
	TTFT, Goodput Compare
}

// The verdicts of a (workload, load).
const (
	VerdictWon  = "won"
	VerdictLost = "lost"
	VerdictTie  = "tie within noise"
	// VerdictNone: the default rule or every peer has no valid cell there.
	VerdictNone = "not judged"
)

// SeedVerdict is the default rule against every peer in one (workload, load), and the policies
// whose mean goodput is above the ttft oracle's by more than the noise.
type SeedVerdict struct {
	Workload string
	Load     float64
	Verdict  string
	Peers    []PeerCompare
	// Unjudged: peers with no valid cell there.
	Unjudged []string
	// AboveOracleTTFT: "policy: mean vs oracle ttft's mean, noise" for each policy flagged.
	AboveOracleTTFT []string
	// OracleTTFT is whether the ttft oracle has a valid cell there (the bound was checked).
	OracleTTFT bool
}

// Judge gives the verdict from the comparisons: lost when the default is behind some peer on TTFT
// p90 or goodput by more than the noise; won when it is behind none and ahead of every peer on at
// least one of the two; otherwise a tie within noise. A routing target "at least every peer's within
// the measured noise" is met when the verdict is won or a tie.
func Judge(cmp []PeerCompare) string {
	if len(cmp) == 0 {
		return VerdictNone
	}
	won := true
	for _, c := range cmp {
		if c.TTFT == Behind || c.Goodput == Behind {
			return VerdictLost
		}
		if c.TTFT != Ahead && c.Goodput != Ahead {
			won = false
		}
	}
	if won {
		return VerdictWon
	}
	return VerdictTie
}

// SeedTable is the seeds table of a set of results.json files.
type SeedTable struct {
	Files    []SeedFile
	Seeds    []uint64
	Rows     []SeedRow // workload by workload (first seen), load ascending, policies by role
	Verdicts []SeedVerdict
}

// geometry is what must be equal in every file: the plan but its seed, workloads, loads and
// policies, the pool, the SLO and the warm-up.
func geometry(r *Report) map[string]any {
	p := r.Plan
	return map[string]any{"plan.shape": p.Shape, "plan.duration": p.Duration, "plan.minRequests": p.MinRequests,
		"plan.maxRequests": p.MaxRequests, "pool": r.Pool, "sloTTFTms": r.SLOms, "warmupFraction": r.Warmup}
}

// firstDiff is the JSON path of the first field where a and b differ ("" when equal).
func firstDiff(path string, a, b any) string {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if bytes.Equal(ja, jb) {
		return ""
	}
	var ma, mb map[string]any
	if json.Unmarshal(ja, &ma) != nil || json.Unmarshal(jb, &mb) != nil {
		return fmt.Sprintf("%s (%s vs %s)", path, ja, jb)
	}
	keys := map[string]bool{}
	for k := range ma {
		keys[k] = true
	}
	for k := range mb {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		if d := firstDiff(path+"."+k, ma[k], mb[k]); d != "" {
			return d
		}
	}
	return path
}

// BuildSeedTable groups the files by plan.seed (the cells of one seed may come from several files,
// each cell from one), refuses files whose geometry differs from the first's and cells that some
// seeds lack, and computes the rows and verdicts.
func BuildSeedTable(files []SeedFile) (*SeedTable, error) {
	if len(files) == 0 {
		return nil, errors.New("no results files")
	}
	t := &SeedTable{Files: files}
	g0 := geometry(files[0].Report)
	type at struct {
		cell *Cell
		file string
	}
	bySeed := map[uint64]map[string]at{}
	filesOf := map[uint64][]string{}
	pols := map[string]Policy{}
	var order []string // cell keys, first seen
	ids := map[string]CellID{}
	for _, f := range files {
		g := geometry(f.Report)
		for _, k := range slices.Sorted(maps.Keys(g0)) {
			if d := firstDiff(k, g0[k], g[k]); d != "" {
				return nil, fmt.Errorf("%s: %s differs from %s's", f.Path, d, files[0].Path)
			}
		}
		s := f.Report.Plan.Seed
		if bySeed[s] == nil {
			bySeed[s] = map[string]at{}
			t.Seeds = append(t.Seeds, s)
		}
		filesOf[s] = append(filesOf[s], f.Path)
		for _, c := range f.Report.Cells {
			k := cellKey(c.Workload, c.Policy, c.Load)
			if prev, ok := bySeed[s][k]; ok {
				return nil, fmt.Errorf("cell %s of seed %d is in both %s and %s", CellID{c.Workload, c.Policy, c.Load}, s, prev.file, f.Path)
			}
			bySeed[s][k] = at{c, f.Path}
			if _, ok := ids[k]; !ok {
				ids[k] = CellID{c.Workload, c.Policy, c.Load}
				order = append(order, k)
			}
			if _, ok := pols[c.Policy]; !ok {
				pols[c.Policy] = *f.Report.policy(c.Policy)
			}
		}
	}
	slices.Sort(t.Seeds)
	var missing []string
	for _, k := range order {
		var lack []string
		for _, s := range t.Seeds {
			if _, ok := bySeed[s][k]; !ok {
				lack = append(lack, fmt.Sprintf("seed %d (%s)", s, strings.Join(filesOf[s], ", ")))
			}
		}
		if len(lack) > 0 {
			missing = append(missing, fmt.Sprintf("cell %s is not in %s", ids[k], strings.Join(lack, "; ")))
		}
	}
	if len(missing) > 0 {
		return nil, errors.New(strings.Join(missing, "\n"))
	}
	// Rows: workloads in the order first seen, loads ascending, the default first, then the
	// KV-exact variants, the peers and the oracles, each in the order first seen.
	var workloads []string
	for _, k := range order {
		if !slices.Contains(workloads, ids[k].Workload) {
			workloads = append(workloads, ids[k].Workload)
		}
	}
	rank := map[string]int{RoleDefault: 0, RoleKVExact: 1, RolePeer: 2, RoleOracle: 3}
	sort.SliceStable(order, func(i, j int) bool {
		a, b := ids[order[i]], ids[order[j]]
		if a.Workload != b.Workload {
			return slices.Index(workloads, a.Workload) < slices.Index(workloads, b.Workload)
		}
		if a.Load != b.Load {
			return a.Load < b.Load
		}
		return rank[PolicyRole(pols[a.Policy])] < rank[PolicyRole(pols[b.Policy])]
	})
	for _, k := range order {
		id := ids[k]
		row := SeedRow{Workload: id.Workload, Load: id.Load, Policy: id.Policy, Role: PolicyRole(pols[id.Policy])}
		var ttft, good, cached []float64
		for _, s := range t.Seeds {
			c := bySeed[s][k].cell
			if !c.Valid || c.Error != "" {
				row.Left = append(row.Left, s)
				continue
			}
			ttft, good, cached = append(ttft, c.TTFT.P90), append(good, c.Goodput), append(cached, c.CachedRatio)
		}
		row.TTFTp90, row.Goodput, row.Cached = seedStat(ttft), seedStat(good), seedStat(cached)
		t.Rows = append(t.Rows, row)
	}
	t.Verdicts = verdicts(t.Rows)
	return t, nil
}

// verdicts judges every (workload, load) that has a default row; rows come grouped by them.
func verdicts(rows []SeedRow) []SeedVerdict {
	var out []SeedVerdict
	for i := 0; i < len(rows); {
		j := i
		for j < len(rows) && rows[j].Workload == rows[i].Workload && rows[j].Load == rows[i].Load {
			j++
		}
		group := rows[i:j]
		i = j
		var def, orc *SeedRow
		for k := range group {
			switch group[k].Policy {
			case PolicyDefault:
				def = &group[k]
			case PolicyOracleTTFT:
				orc = &group[k]
			}
		}
		v := SeedVerdict{Workload: group[0].Workload, Load: group[0].Load}
		if orc != nil && orc.Goodput.N > 0 {
			v.OracleTTFT = true
			for _, r := range group {
				if r.Role == RoleOracle || r.Goodput.N == 0 {
					continue
				}
				if compareMeans(r.Goodput, orc.Goodput, true) == Ahead {
					v.AboveOracleTTFT = append(v.AboveOracleTTFT, fmt.Sprintf("%s: %.1f vs %.1f req/s, noise %.1f", r.Policy, r.Goodput.Mean, orc.Goodput.Mean, max(r.Goodput.Spread(), orc.Goodput.Spread())))
				}
			}
		}
		if def == nil {
			if v.OracleTTFT {
				v.Verdict = VerdictNone
				out = append(out, v)
			}
			continue
		}
		for _, r := range group {
			if r.Role != RolePeer {
				continue
			}
			if r.TTFTp90.N == 0 || def.TTFTp90.N == 0 {
				v.Unjudged = append(v.Unjudged, r.Policy)
				continue
			}
			v.Peers = append(v.Peers, PeerCompare{Peer: r.Policy, TTFT: compareMeans(def.TTFTp90, r.TTFTp90, false), Goodput: compareMeans(def.Goodput, r.Goodput, true)})
		}
		v.Verdict = Judge(v.Peers)
		out = append(out, v)
	}
	return out
}

// SeedRule is the verdict rule as the table states it.
const SeedRule = "Verdict per load, `kv-exact default` against every peer (the peer routers' strategies, llm-d precise, " +
	"round-robin, least-load and chwbl; not the oracles nor the other KV-exact variants), on the means over the seeds, " +
	"the noise of a comparison being the larger of the two policies' ranges (max − min) over the seeds: " +
	"*behind* a peer when its TTFT p90 is above the peer's by more than the noise, or its goodput below by more than the noise; " +
	"*ahead* when better by more than the noise on that figure. **lost**: behind some peer on either figure; " +
	"**won**: behind none and ahead of every peer on at least one of the two; **tie within noise** otherwise. " +
	"A target \"at least every peer's within the noise\" is met when the verdict is won or a tie. " +
	"Oracle bound: a policy whose mean goodput is above `oracle ttft`'s by more than the noise is named."

// Markdown renders the table, per workload, in the shape of the docs' multi-seed tables, with the
// verdicts and the oracle bound check after each.
func (t *SeedTable) Markdown() string {
	var b strings.Builder
	seeds := make([]string, len(t.Seeds))
	for i, s := range t.Seeds {
		seeds[i] = fmt.Sprint(s)
	}
	b.WriteString("Runs (plan seed, load average at the start → end):\n\n")
	for _, f := range t.Files {
		fmt.Fprintf(&b, "- `%s`: seed %d, %s → %s\n", f.Path, f.Report.Plan.Seed, orDash(f.Report.Machine.Load), orDash(f.Report.MachineAfter.Load))
	}
	b.WriteString("\n")
	for i := 0; i < len(t.Rows); {
		w := t.Rows[i].Workload
		fmt.Fprintf(&b, "`%s`, seeds %s: means over the seeds, (min–max) over them:\n\n", w, strings.Join(seeds, ", "))
		b.WriteString("| load | policy | n | TTFT p90 ms mean (min–max) | goodput req/s mean (min–max) | cached mean (min–max) |\n|---|---|---|---|---|---|\n")
		var left []string
		for ; i < len(t.Rows) && t.Rows[i].Workload == w; i++ {
			r := t.Rows[i]
			fmt.Fprintf(&b, "| %g | %s | %d | %s | %s | %s |\n", r.Load, r.Policy, r.TTFTp90.N,
				statText(r.TTFTp90, "%.0f"), statText(r.Goodput, "%.1f"), statText(r.Cached, "%.3f"))
			if len(r.Left) > 0 {
				left = append(left, fmt.Sprintf("%s at %g (seeds %s)", r.Policy, r.Load, joinSeeds(r.Left)))
			}
		}
		b.WriteString("\n")
		if len(left) > 0 {
			fmt.Fprintf(&b, "Left out, invalid or failed: %s.\n\n", strings.Join(left, "; "))
		}
		var lines []string
		for _, v := range t.Verdicts {
			if v.Workload == w {
				lines = append(lines, verdictLine(v))
			}
		}
		if len(lines) > 0 {
			b.WriteString("Verdicts:\n\n" + strings.Join(lines, "") + "\n")
		}
	}
	b.WriteString(SeedRule + "\n")
	return b.String()
}

func statText(s SeedStat, f string) string {
	if s.N == 0 {
		return "—"
	}
	return fmt.Sprintf(f+" ("+f+"–"+f+")", s.Mean, s.Min, s.Max)
}

func joinSeeds(s []uint64) string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = fmt.Sprint(x)
	}
	return strings.Join(out, ", ")
}

// verdictLine: the verdict, then the peers the default is behind (on which figure), level with and
// ahead of, and the oracle bound.
func verdictLine(v SeedVerdict) string {
	var b strings.Builder
	fmt.Fprintf(&b, "- load %g: ", v.Load)
	if v.Verdict == VerdictNone {
		b.WriteString(VerdictNone)
	} else {
		fmt.Fprintf(&b, "**%s**", v.Verdict)
	}
	var behind, level, ahead []string
	for _, c := range v.Peers {
		var on []string
		if c.TTFT == Behind {
			on = append(on, "TTFT p90")
		}
		if c.Goodput == Behind {
			on = append(on, "goodput")
		}
		switch {
		case len(on) > 0:
			behind = append(behind, c.Peer+" ("+strings.Join(on, ", ")+")")
		case c.TTFT == Ahead || c.Goodput == Ahead:
			ahead = append(ahead, c.Peer)
		default:
			level = append(level, c.Peer)
		}
	}
	var parts []string
	for _, p := range []struct {
		label string
		names []string
	}{{"behind", behind}, {"level with", level}, {"ahead of", ahead}, {"not judged (no valid cell)", v.Unjudged}} {
		if len(p.names) > 0 {
			parts = append(parts, p.label+" "+strings.Join(p.names, ", "))
		}
	}
	if len(parts) > 0 {
		b.WriteString(": " + strings.Join(parts, "; "))
	}
	switch {
	case len(v.AboveOracleTTFT) > 0:
		b.WriteString(". Goodput above `oracle ttft`'s beyond the noise: " + strings.Join(v.AboveOracleTTFT, "; "))
	case v.OracleTTFT:
		b.WriteString(". No policy's goodput above `oracle ttft`'s beyond the noise")
	}
	b.WriteString(".\n")
	return b.String()
}
