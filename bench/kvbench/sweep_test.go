package kvbench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// sweepPlan is a tiny plan of three cells whose middle one cannot run (a peer strategy that does
// not exist: RunCell fails before it sends anything).
func sweepPlan() Plan {
	p := QuickPlan()
	p.MinRequests, p.MaxRequests, p.Duration = 30, 30, 300*time.Millisecond
	p.Policies = []Policy{{Name: PolicyRR, Selector: "rr"}, {Name: "no such peer", Peer: "no-such-strategy"}, {Name: PolicyLeastLoad, Selector: "least-load"}}
	return p
}

func sweepEnv(t *testing.T) *Env {
	toks := tokenize.NewPool("")
	if _, err := toks.Get("llama3"); err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	return &Env{Tokenizers: toks, Model: "llama3", Pool: DefaultPoolShape(), SLO: 300 * time.Millisecond, Warmup: 0.2, Drain: 10 * time.Second}
}

// A failing cell is recorded with its reason and the sweep goes on; the report is saved after every
// cell (the file on disk grows cell by cell), atomically (no temporary file left behind).
func TestSweepRecordsFailedCellAndGoesOn(t *testing.T) {
	env := sweepEnv(t)
	path := filepath.Join(t.TempDir(), "results.json")
	var onDisk []int
	rep, err := Run(context.Background(), env, sweepPlan(), func(r *Report, c *Cell) {
		if err := SaveReport(path, r); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var saved Report
		if err := json.Unmarshal(b, &saved); err != nil {
			t.Fatalf("results.json after cell %s: %v", c.Policy, err)
		}
		onDisk = append(onDisk, len(saved.Cells))
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cells) != 3 || len(onDisk) != 3 || onDisk[0] != 1 || onDisk[1] != 2 || onDisk[2] != 3 {
		t.Fatalf("%d cells, saved after each: %v; want 3 cells saved as 1, 2, 3", len(rep.Cells), onDisk)
	}
	bad := rep.Cells[1]
	if bad.Valid || !strings.Contains(bad.Error, `unknown peer strategy "no-such-strategy"`) || len(bad.Invalid) != 1 || !strings.HasPrefix(bad.Invalid[0], "failed: ") {
		t.Errorf("failed cell: valid %v, error %q, invalid %q", bad.Valid, bad.Error, bad.Invalid)
	}
	if f := rep.Failed(); len(f) != 1 || f[0] != bad {
		t.Errorf("Failed() = %v", f)
	}
	if c := rep.Cells[2]; c.Policy != PolicyLeastLoad || !c.Valid || c.Error != "" || c.Measured == 0 {
		t.Errorf("the cell after the failure: %s valid %v error %q measured %d", c.Policy, c.Valid, c.Error, c.Measured)
	}
	if m := rep.Missing(); len(m) != 0 {
		t.Errorf("a complete run misses %v", m)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".results.json.*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// An interrupted sweep returns what it measured; Missing names the rest, and the document renders
// the partial run, naming the missing cells and the failed one.
func TestSweepInterruptedThenDocumented(t *testing.T) {
	env := sweepEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	plan := sweepPlan()
	// The failing cell first, then the two that run: stop after the first of those.
	plan.Policies = []Policy{plan.Policies[1], plan.Policies[0], plan.Policies[2]}
	rep, err := Run(ctx, env, plan, func(r *Report, c *Cell) {
		if c.Policy == PolicyRR {
			cancel()
		}
	})
	if err == nil || !strings.Contains(err.Error(), "interrupted after 2 of 3 cells") {
		t.Fatalf("Run after cancel: %v, want an interruption after 2 of 3 cells", err)
	}
	if rep == nil || len(rep.Cells) != 2 {
		t.Fatalf("report %+v", rep)
	}
	missing := rep.Missing()
	if len(missing) != 1 || missing[0] != (CellID{WorkloadSystemPrompt, PolicyLeastLoad, 0.6}) {
		t.Fatalf("missing %v", missing)
	}
	raw := t.TempDir()
	if err := SaveReport(filepath.Join(raw, "kvbench", "results.json"), rep); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	if err := WriteDocument(raw, "../../docs/benchmarks", filepath.Join(raw, "charts"), out); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(out)
	for _, want := range []string{
		"2 cells, 1 valid, 1 invalid (of which 1 failed to run).",
		"**Partial run: 2 of 3 planned cells measured.**",
		"- system-prompt / least-load / load 0.6\n",
		"| no such peer | 0.6 |",
		"**failed**",
		`system-prompt / no such peer / load 0.6: failed: `,
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("document lacks %q", want)
		}
	}
}
