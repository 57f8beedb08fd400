package kvbench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sglang = "SGLang gateway approx tree"

// seedPlanPolicies: the default, a KV-exact variant, a peer, a baseline and both oracle kinds.
var seedPlanPolicies = []Policy{KVExactDefault(), {Name: PolicyTTFT, Exact: true}, Peers()[1],
	{Name: PolicyLeastLoad, Selector: "least-load"}, {Name: PolicyOracleTTFT, Oracle: true, TTFT: true}, {Name: PolicyOracle, Oracle: true}}

// fig is one cell's TTFT p90, goodput and cached ratio.
type fig struct{ ttft, good, cached float64 }

func seedReport(seed uint64, load float64, cells map[string]fig) *Report {
	r := &Report{Plan: DefaultPlan(), Pool: DefaultPoolShape(), SLOms: 300, Warmup: 0.2}
	r.Plan.Seed, r.Plan.Policies = seed, seedPlanPolicies
	for _, pol := range seedPlanPolicies { // the plan's order, as Run records them
		f, ok := cells[pol.Name]
		if !ok {
			continue
		}
		p := pol.Name
		r.Cells = append(r.Cells, &Cell{Workload: "w", Policy: p, Load: load, TTFT: Percentiles{P90: f.ttft}, Goodput: f.good, CachedRatio: f.cached, Valid: true})
	}
	return r
}

func TestSeedStat(t *testing.T) {
	s := seedStat([]float64{20, 10, 60})
	if s != (SeedStat{N: 3, Mean: 30, Min: 10, Max: 60}) || s.Spread() != 50 {
		t.Fatalf("seedStat = %+v, spread %g; want n 3, mean 30, 10–60, spread 50", s, s.Spread())
	}
	if s := seedStat(nil); s.N != 0 {
		t.Fatalf("seedStat(nil) = %+v", s)
	}
}

func TestCompareMeans(t *testing.T) {
	st := func(xs ...float64) SeedStat { return seedStat(xs) }
	def := st(90, 100, 110) // mean 100, spread 20
	for _, c := range []struct {
		name         string
		a, b         SeedStat
		higherBetter bool
		want         Compare
	}{
		{"ttft: peer lower by exactly the noise", def, st(75, 80, 85), false, Level},
		{"ttft: peer lower by one past the noise", def, st(74, 79, 84), false, Behind},
		{"ttft: peer higher by exactly the noise", def, st(115, 120, 125), false, Level},
		{"ttft: peer higher by one past the noise", def, st(116, 121, 126), false, Ahead},
		{"ttft: the peer's larger spread is the noise", def, st(50, 75, 100), false, Level}, // 75 vs 100: 25 past the default's 20, within the peer's 50
		{"goodput: ahead by exactly the noise", st(48, 50, 52), st(46, 46, 46), true, Level},
		{"goodput: ahead by one past the noise", st(48, 50, 52), st(45, 45, 45), true, Ahead},
		{"goodput: behind by one past the noise", st(48, 50, 52), st(55, 55, 55), true, Behind},
		{"one seed each: any difference counts", st(50), st(49), true, Ahead},
	} {
		if got := compareMeans(c.a, c.b, c.higherBetter); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestJudge(t *testing.T) {
	for _, c := range []struct {
		name string
		cmp  []PeerCompare
		want string
	}{
		{"no peer", nil, VerdictNone},
		{"ahead of every peer on one figure", []PeerCompare{{"a", Ahead, Level}, {"b", Level, Ahead}}, VerdictWon},
		{"level with one peer", []PeerCompare{{"a", Ahead, Level}, {"b", Level, Level}}, VerdictTie},
		{"behind one peer on goodput", []PeerCompare{{"a", Ahead, Ahead}, {"b", Ahead, Behind}}, VerdictLost},
		{"behind on TTFT, ahead on goodput", []PeerCompare{{"a", Behind, Ahead}}, VerdictLost},
	} {
		if got := Judge(c.cmp); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestBuildSeedTable: three seeds, seed 2 split over two files; the means, ranges and verdicts by
// hand.
func TestBuildSeedTable(t *testing.T) {
	seed := func(s uint64, d, peer, ll, ttftVar, orcTTFT, orc fig) *Report {
		return seedReport(s, 1, map[string]fig{PolicyDefault: d, sglang: peer, PolicyLeastLoad: ll, PolicyTTFT: ttftVar, PolicyOracleTTFT: orcTTFT, PolicyOracle: orc})
	}
	// default TTFT 90/100/110 (mean 100, spread 20), goodput 48/50/52 (50, 4);
	// SGLang TTFT 115/120/125 (120: level, exactly the noise), goodput 46 (level, exactly the noise);
	// least-load TTFT 200, goodput 30: the default is ahead on both;
	// kv-exact ttft is far better but not a peer; oracle ttft's goodput 43/44/45 (44, 2), and the
	// default's 50 is above it by 6 > 4 (flagged), SGLang's 46 by exactly the noise 2 (not).
	r1 := seed(1, fig{90, 48, 0.5}, fig{115, 46, 0.4}, fig{200, 30, 0.1}, fig{10, 99, 0.3}, fig{100, 43, 0.2}, fig{100, 45, 0.6})
	r2 := seed(2, fig{100, 50, 0.6}, fig{120, 46, 0.4}, fig{200, 30, 0.1}, fig{10, 99, 0.3}, fig{100, 44, 0.2}, fig{100, 45, 0.6})
	r3 := seed(3, fig{110, 52, 0.7}, fig{125, 46, 0.4}, fig{200, 30, 0.1}, fig{10, 99, 0.3}, fig{100, 45, 0.2}, fig{100, 45, 0.6})
	r2b := &Report{Plan: r2.Plan, Pool: r2.Pool, SLOms: r2.SLOms, Warmup: r2.Warmup, Cells: r2.Cells[:3:3]}
	r2.Cells = r2.Cells[3:]
	tab, err := BuildSeedTable([]SeedFile{{"s1.json", r1}, {"s2.json", r2}, {"s2b.json", r2b}, {"s3.json", r3}})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, r := range tab.Rows {
		order = append(order, r.Policy)
	}
	if got, want := strings.Join(order, ","), strings.Join([]string{PolicyDefault, PolicyTTFT, sglang, PolicyLeastLoad, PolicyOracleTTFT, PolicyOracle}, ","); got != want {
		t.Fatalf("rows %s, want %s", got, want)
	}
	d := tab.Rows[0]
	if d.TTFTp90 != (SeedStat{3, 100, 90, 110}) || d.Goodput != (SeedStat{3, 50, 48, 52}) || d.Cached.Mean < 0.6-1e-12 || d.Cached.Mean > 0.6+1e-12 || d.Cached.Min != 0.5 || d.Cached.Max != 0.7 {
		t.Fatalf("default row %+v", d)
	}
	if len(tab.Verdicts) != 1 {
		t.Fatalf("verdicts %+v", tab.Verdicts)
	}
	v := tab.Verdicts[0]
	if v.Verdict != VerdictTie || len(v.Peers) != 2 || v.Peers[0] != (PeerCompare{sglang, Level, Level}) || v.Peers[1] != (PeerCompare{PolicyLeastLoad, Ahead, Ahead}) {
		t.Fatalf("verdict %+v", v)
	}
	if len(v.AboveOracleTTFT) != 2 || !strings.HasPrefix(v.AboveOracleTTFT[0], PolicyDefault+": 50.0 vs 44.0 req/s, noise 4.0") || !strings.HasPrefix(v.AboveOracleTTFT[1], PolicyTTFT+":") {
		t.Fatalf("oracle bound %q", v.AboveOracleTTFT)
	}
	md := tab.Markdown()
	for _, want := range []string{"| 1 | kv-exact default | 3 | 100 (90–110) | 50.0 (48.0–52.0) | 0.600 (0.500–0.700) |",
		"- load 1: **tie within noise**: level with SGLang gateway approx tree; ahead of least-load. Goodput above"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}

	// SGLang's TTFT 74/79/84: 21 ms below the default's mean, one past the noise of 20: lost.
	r1.cell("w", sglang, 1).TTFT.P90, r2b.cell("w", sglang, 1).TTFT.P90, r3.cell("w", sglang, 1).TTFT.P90 = 74, 79, 84
	tab, err = BuildSeedTable([]SeedFile{{"s1.json", r1}, {"s2.json", r2}, {"s2b.json", r2b}, {"s3.json", r3}})
	if err != nil || tab.Verdicts[0].Verdict != VerdictLost {
		t.Fatalf("one past the noise: %v %+v", err, tab.Verdicts)
	}
	// An invalid cell is left out of its row (n 2) and named.
	r3.cell("w", sglang, 1).Valid = false
	tab, _ = BuildSeedTable([]SeedFile{{"s1.json", r1}, {"s2.json", r2}, {"s2b.json", r2b}, {"s3.json", r3}})
	if r := tab.Rows[2]; r.TTFTp90.N != 2 || len(r.Left) != 1 || r.Left[0] != 3 || !strings.Contains(tab.Markdown(), "SGLang gateway approx tree at 1 (seeds 3)") {
		t.Fatalf("invalid cell: %+v", r)
	}
}

func TestBuildSeedTableRefuses(t *testing.T) {
	base := func(s uint64) *Report {
		return seedReport(s, 1, map[string]fig{PolicyDefault: {100, 50, 0.5}, sglang: {100, 50, 0.5}})
	}
	geo := base(2)
	geo.Pool.CapacityBlocks++
	shape := base(2)
	shape.Plan.Shape.OffloadPrefixes++
	lacking := base(2)
	lacking.Cells = lacking.Cells[:1]
	for _, c := range []struct {
		name  string
		files []SeedFile
		want  []string
	}{
		{"pool", []SeedFile{{"a.json", base(1)}, {"b.json", geo}}, []string{"b.json", "pool.CapacityBlocks", "a.json"}},
		{"shape", []SeedFile{{"a.json", base(1)}, {"b.json", shape}}, []string{"b.json", "plan.shape.OffloadPrefixes"}},
		{"a cell one seed lacks", []SeedFile{{"a.json", base(1)}, {"b.json", lacking}}, []string{"cell w / ", " is not in seed 2 (b.json)"}},
		{"a cell twice in one seed", []SeedFile{{"a.json", base(1)}, {"b.json", base(1)}}, []string{"of seed 1 is in both a.json and b.json"}},
		{"nothing", nil, []string{"no results files"}},
	} {
		_, err := BuildSeedTable(c.files)
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", c.name, err, w)
			}
		}
	}
}

func TestReadSeedFilesNamesFileAndField(t *testing.T) {
	good, _ := json.Marshal(seedReport(1, 1, map[string]fig{PolicyDefault: {100, 50, 0.5}}))
	edit := func(f func(m map[string]any)) string {
		var m map[string]any
		json.Unmarshal(good, &m)
		f(m)
		b, _ := json.Marshal(m)
		return string(b)
	}
	cell := func(m map[string]any) map[string]any { return m["cells"].([]any)[0].(map[string]any) }
	dir := t.TempDir()
	for _, c := range []struct{ name, body, want string }{
		{"not JSON", "{", "not a results.json"},
		{"no plan", edit(func(m map[string]any) { delete(m, "plan") }), "plan: missing"},
		{"no seed", edit(func(m map[string]any) { delete(m["plan"].(map[string]any), "seed") }), "plan.seed: missing"},
		{"goodput a string", edit(func(m map[string]any) { cell(m)["goodput"] = "fast" }), "cells.0.goodput: string where float64 was expected"},
		{"no policy", edit(func(m map[string]any) { cell(m)["policy"] = "" }), "cells[0].policy: empty"},
		{"unknown policy", edit(func(m map[string]any) { cell(m)["policy"] = "x" }), `cells[0].policy: "x" is not among plan.policies`},
		{"zero load", edit(func(m map[string]any) { cell(m)["load"] = 0 }), "cells[0].load: 0 is not a positive load"},
		{"duplicate cell", edit(func(m map[string]any) { m["cells"] = append(m["cells"].([]any), cell(m)) }), "cells[1]: the same cell as cells[0]"},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".json")
		os.WriteFile(p, []byte(c.body), 0o644)
		_, err := ReadSeedFiles([]string{p})
		if err == nil || !strings.Contains(err.Error(), p+": ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %s: …%s", c.name, err, p, c.want)
		}
	}
	p := filepath.Join(dir, "good.json")
	os.WriteFile(p, good, 0o644)
	if _, err := ReadSeedFiles([]string{p}); err != nil {
		t.Fatal(err)
	}
}

func TestSeedOrder(t *testing.T) {
	p := QuickPlan()
	p.Policies = p.Policies[:3]
	var got []string
	for _, s := range SeedOrder(p, []uint64{1, 2, 3}) {
		got = append(got, fmt.Sprintf("%s/%d", s.Policy, s.Seed))
	}
	want := []string{PolicyRR + "/1", PolicyRR + "/2", PolicyRR + "/3", PolicyKVXDefault + "/2", PolicyKVXDefault + "/3", PolicyKVXDefault + "/1",
		PolicyDefault + "/3", PolicyDefault + "/1", PolicyDefault + "/2"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("order %v, want %v", got, want)
	}
}
