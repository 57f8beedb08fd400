package kvbench

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// KVBENCH_TRACE=dir writes one JSON line per request of a cell to dir/<workload>-<load>-<policy>.jsonl:
// every request in arrival order, where it went and what it hit, and for a request sharing a block
// prefix with an earlier one, that request (earlier, with the most shared blocks) and where it went.
func TestTraceLines(t *testing.T) {
	env := sweepEnv(t)
	dir := filepath.Join(t.TempDir(), "traces") // not there yet: the trace makes it
	t.Setenv("KVBENCH_TRACE", dir)
	plan := sweepPlan()
	plan.Policies = []Policy{KVExactDefault()}
	rep, err := Run(context.Background(), env, plan, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cells) != 1 || rep.Cells[0].Requests == 0 {
		t.Fatalf("cells %+v", rep.Cells)
	}
	if p := rep.Cells[0].Pool; p != nil {
		t.Errorf("a system-prompt cell records its pool %+v, the report's own", *p)
	}
	name := "system-prompt-0.6-kv-exact_default.jsonl" // the policy's spaces become underscores
	if got, _ := filepath.Glob(filepath.Join(dir, "*")); len(got) != 1 || filepath.Base(got[0]) != name {
		t.Fatalf("trace files %v, want one named %s", got, name)
	}
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l map[string]any
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %d: %v: %s", len(lines), err, sc.Bytes())
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(lines) != rep.Cells[0].Requests {
		t.Fatalf("%d trace lines, want one per request (%d)", len(lines), rep.Cells[0].Requests)
	}
	var traced []TraceLine
	for i, l := range lines {
		for _, k := range []string{"i", "arrivalMs", "blocks", "prompt", "cached", "endpoint", "prev", "shared", "ttftMs"} {
			if _, ok := l[k]; !ok {
				t.Fatalf("line %d has no %q: %v", i, k, l)
			}
		}
		b, _ := json.Marshal(l)
		var tl TraceLine
		if err := json.Unmarshal(b, &tl); err != nil {
			t.Fatal(err)
		}
		traced = append(traced, tl)
	}
	followed := 0
	for i, l := range traced {
		if l.I != i || l.Blocks == 0 || l.Prompt == 0 || l.Endpoint == "" || l.TTFTMS <= 0 || l.Cached > l.Prompt {
			t.Errorf("line %d: %+v", i, l)
		}
		if i > 0 && l.ArrivalMS < traced[i-1].ArrivalMS {
			t.Errorf("line %d arrives at %v ms, before line %d (%v ms)", i, l.ArrivalMS, i-1, traced[i-1].ArrivalMS)
		}
		if l.Prev < 0 {
			if l.Shared != 0 || l.PrevEndpoint != "" {
				t.Errorf("line %d shares %d blocks with no earlier request: %+v", i, l.Shared, l)
			}
			continue
		}
		p := traced[l.Prev]
		if l.Prev >= i || l.Shared == 0 || l.Shared > min(l.Blocks, p.Blocks) || l.PrevEndpoint != p.Endpoint || l.PrevDoneMS <= p.ArrivalMS {
			t.Errorf("line %d: prev %d (%+v), shared %d, prev endpoint %q done at %v ms", i, l.Prev, p, l.Shared, l.PrevEndpoint, l.PrevDoneMS)
		}
		followed++
	}
	if traced[0].Prev != -1 {
		t.Errorf("the first request names an earlier one: %+v", traced[0])
	}
	if followed == 0 {
		t.Error("no request of the system-prompt workload shares a prefix with an earlier one")
	}
	decided := 0
	for _, l := range traced {
		if l.Tier != "" && len(l.Decision) > 0 {
			decided++
		}
	}
	if decided == 0 {
		t.Error("no line carries the gateway's tier and decision")
	}
}

// A cell whose workload runs on a pool of its own (PoolShape.ShapeFor) records it: a small-pool
// cell's results name its 3 engines of 96 blocks, not the report's default pool.
func TestCellRecordsItsPool(t *testing.T) {
	env := sweepEnv(t)
	plan := sweepPlan()
	plan.Workloads, plan.Loads = []string{WorkloadSmallPool}, []float64{0.6}
	plan.Policies = []Policy{{Name: PolicyLeastLoad, Selector: "least-load"}}
	plan.LawPolicies, plan.LawWorkloads, plan.LawLoads = nil, nil, nil
	rep, err := Run(context.Background(), env, plan, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cells) != 1 || rep.Cells[0].Pool == nil {
		t.Fatalf("cells %+v: want one, with its pool", rep.Cells)
	}
	if p := rep.Cells[0].Pool; p.Endpoints != 3 || p.CapacityBlocks != 96 || rep.Pool.Endpoints != 4 {
		t.Errorf("the small-pool cell records %d engines of %d blocks (report: %d), want 3 of 96 (report: 4)", p.Endpoints, p.CapacityBlocks, rep.Pool.Endpoints)
	}
}
