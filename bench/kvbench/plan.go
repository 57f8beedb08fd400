package kvbench

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
)

// Plan is the grid a run measures.
type Plan struct {
	Seed        uint64        `json:"seed"`
	Shape       Shape         `json:"shape"`
	Loads       []float64     `json:"loads"`    // fractions of the uncached pool capacity
	Duration    time.Duration `json:"duration"` // arrival window per cell
	MinRequests int           `json:"minRequests"`
	MaxRequests int           `json:"maxRequests"`
	Workloads   []string      `json:"workloads"`
	Policies    []Policy      `json:"policies"`
	// LawPolicies run on LawWorkloads only, at LawLoads.
	LawPolicies  []Policy  `json:"lawPolicies,omitempty"`
	LawWorkloads []string  `json:"lawWorkloads,omitempty"`
	LawLoads     []float64 `json:"lawLoads,omitempty"`
}

// DefaultPlan finishes in a few minutes on 2 cores.
func DefaultPlan() Plan {
	return Plan{Seed: 1, Shape: DefaultShape(), Loads: []float64{0.3, 0.6, 1.0, 1.5}, Duration: 2500 * time.Millisecond,
		MinRequests: 100, MaxRequests: 500, Workloads: Workloads, Policies: MainPolicies(),
		LawPolicies: LawPolicies(), LawWorkloads: []string{WorkloadSystemPrompt}, LawLoads: []float64{0.6, 1.5}}
}

// QuickPlan checks the harness end to end in seconds: one shared-prefix workload, one load, the
// round-robin baseline, KV-exact overlap/hard, the gateway's default KV-exact rule, one peer strategy
// (llm-d estimate: the client-side peer path) and the oracle.
func QuickPlan() Plan {
	p := DefaultPlan()
	p.Loads = []float64{0.6}
	p.Duration = 1500 * time.Millisecond
	p.MinRequests, p.MaxRequests = 60, 100
	p.Workloads = []string{WorkloadSystemPrompt}
	p.Policies = []Policy{{Name: PolicyRR, Selector: "rr"}, KVExact("overlap", "hard"), KVExactDefault(), Peers()[3], {Name: PolicyOracle, Oracle: true}}
	p.LawPolicies, p.LawWorkloads = nil, nil
	return p
}

// Machine describes where a run happened.
type Machine struct {
	Cores int    `json:"cores"`
	CPU   string `json:"cpu"`
	Go    string `json:"go"`
	Load  string `json:"loadAverage"`
	// Commit is the commit the binary was built from (other work lands while a long run goes on).
	Commit string `json:"commit,omitempty"`
}

// ThisMachine reads the core count, CPU model and load average.
func ThisMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version(), Commit: buildCommit()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if _, v, ok := strings.Cut(l, ":"); ok {
					m.CPU = strings.TrimSpace(v)
				}
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.Load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return m
}

// Report is the JSON result of a run.
type Report struct {
	Command      string             `json:"command"`
	Started      time.Time          `json:"started"`
	Elapsed      float64            `json:"elapsedSeconds"`
	Machine      Machine            `json:"machine"`
	MachineAfter Machine            `json:"machineAfter"`
	Plan         Plan               `json:"plan"`
	Pool         PoolShape          `json:"pool"`
	SLOms        float64            `json:"sloTTFTms"`
	Warmup       float64            `json:"warmupFraction"`
	Capacity     map[string]float64 `json:"capacity"` // uncached pool capacity per workload, requests/s
	Cells        []*Cell            `json:"cells"`
	Targets      []Target           `json:"targets"`
	Overhead     *Overhead          `json:"overhead,omitempty"`
}

// Run measures every cell of the plan (PlannedCells' order). A cell that fails is recorded with
// its reason (Cell.Error, invalid) and the sweep goes on; only a cancelled ctx stops it, and then
// the report holds what was measured (Report.Missing names the rest). progress, when set, sees the
// report after each cell, its targets recomputed: the caller saves it there.
func Run(ctx context.Context, env *Env, plan Plan, progress func(*Report, *Cell)) (*Report, error) {
	rep := &Report{Started: time.Now(), Machine: ThisMachine(), Plan: plan, Pool: env.Pool, SLOms: ms(env.SLO), Warmup: env.Warmup,
		Capacity: map[string]float64{}}
	tok, err := env.Tokenizers.Get(env.Model)
	if err != nil {
		return nil, err
	}
	finish := func() {
		rep.Targets = Targets(rep)
		rep.Elapsed = time.Since(rep.Started).Seconds()
		rep.MachineAfter = ThisMachine()
	}
	record := func(c *Cell) {
		rep.Cells = append(rep.Cells, c)
		finish()
		if progress != nil {
			progress(rep, c)
		}
	}
	type built struct {
		w    *Workload
		rate float64
		err  error
	}
	cache := map[string]built{} // the workload of the current (workload, load), shared by its policies
	for _, pc := range PlannedCells(plan) {
		if ctx.Err() != nil {
			break
		}
		capRate, ok := rep.Capacity[pc.Workload]
		if !ok {
			// Size the sweep from the workload's own prompts: capacity is for nothing cached.
			probe, err := BuildWorkload(pc.Workload, plan.Seed, 200, 1, plan.Shape, env.Model, tok)
			if err != nil {
				record(failedCell(pc.CellID, 0, fmt.Errorf("build workload: %w", err)))
				continue
			}
			capRate = env.Pool.ShapeFor(pc.Workload).Capacity(probe.MeanPromptTokens, plan.Shape.MaxTokens)
			rep.Capacity[pc.Workload] = capRate
		}
		key := fmt.Sprintf("%s/%g", pc.Workload, pc.Load)
		b, ok := cache[key]
		if !ok {
			clear(cache)
			b.rate = pc.Load * capRate
			n := int(math.Round(b.rate * plan.Duration.Seconds()))
			n = min(max(n, plan.MinRequests), plan.MaxRequests)
			b.w, b.err = BuildWorkload(pc.Workload, plan.Seed, n, b.rate, plan.Shape, env.Model, tok)
			cache[key] = b
		}
		if b.err != nil {
			record(failedCell(pc.CellID, b.rate, fmt.Errorf("build workload: %w", b.err)))
			continue
		}
		c, err := RunCell(ctx, env, b.w, pc.Pol, pc.Load, b.rate)
		switch {
		case ctx.Err() != nil:
			// Interrupted: the cell's figures are partial, so it is not recorded (it stays missing).
		case err != nil:
			record(failedCell(pc.CellID, b.rate, err))
		default:
			record(c)
		}
	}
	finish()
	if err := ctx.Err(); err != nil {
		return rep, fmt.Errorf("interrupted after %d of %d cells: %w", len(rep.Cells), len(PlannedCells(plan)), err)
	}
	return rep, nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
