package kvbench

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
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
// round-robin baseline, default KV-exact, KV-exact with predict-on-route, one peer strategy
// (llm-d estimate: the client-side peer path) and the oracle.
func QuickPlan() Plan {
	p := DefaultPlan()
	p.Loads = []float64{0.6}
	p.Duration = 1500 * time.Millisecond
	p.MinRequests, p.MaxRequests = 60, 100
	p.Workloads = []string{WorkloadSystemPrompt}
	p.Policies = []Policy{{Name: PolicyRR, Selector: "rr"}, KVExact("overlap", "hard"), KVExactPredict(), Peers()[3], {Name: PolicyOracle, Oracle: true}}
	p.LawPolicies, p.LawWorkloads = nil, nil
	return p
}

// Machine describes where a run happened.
type Machine struct {
	Cores int    `json:"cores"`
	CPU   string `json:"cpu"`
	Go    string `json:"go"`
	Load  string `json:"loadAverage"`
}

// ThisMachine reads the core count, CPU model and load average.
func ThisMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version()}
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

// Run measures every cell of the plan. progress, when set, sees each cell as it finishes.
func Run(ctx context.Context, env *Env, plan Plan, progress func(*Cell)) (*Report, error) {
	rep := &Report{Started: time.Now(), Machine: ThisMachine(), Plan: plan, Pool: env.Pool, SLOms: ms(env.SLO), Warmup: env.Warmup,
		Capacity: map[string]float64{}}
	tok, err := env.Tokenizers.Get(env.Model)
	if err != nil {
		return nil, err
	}
	workloads := append([]string(nil), plan.Workloads...)
	for _, w := range plan.LawWorkloads {
		if !contains(workloads, w) {
			workloads = append(workloads, w)
		}
	}
	for _, wn := range workloads {
		// Size the sweep from the workload's own prompts: capacity is for nothing cached.
		probe, err := BuildWorkload(wn, plan.Seed, 200, 1, plan.Shape, env.Model, tok)
		if err != nil {
			return nil, err
		}
		capRate := env.Pool.Capacity(probe.MeanPromptTokens, plan.Shape.MaxTokens)
		rep.Capacity[wn] = capRate
		loads := append([]float64(nil), plan.Loads...)
		for _, l := range plan.LawLoads {
			if !slices.Contains(loads, l) {
				loads = append(loads, l)
			}
		}
		slices.Sort(loads)
		for _, load := range loads {
			pols := []Policy{}
			if contains(plan.Workloads, wn) && slices.Contains(plan.Loads, load) {
				pols = append(pols, plan.Policies...)
			}
			if contains(plan.LawWorkloads, wn) && slices.Contains(plan.LawLoads, load) {
				pols = append(pols, plan.LawPolicies...)
			}
			if len(pols) == 0 {
				continue
			}
			rate := load * capRate
			n := int(math.Round(rate * plan.Duration.Seconds()))
			n = min(max(n, plan.MinRequests), plan.MaxRequests)
			w, err := BuildWorkload(wn, plan.Seed, n, rate, plan.Shape, env.Model, tok)
			if err != nil {
				return nil, err
			}
			for _, pol := range pols {
				c, err := RunCell(ctx, env, w, pol, load, rate)
				if err != nil {
					return rep, fmt.Errorf("%s / %s / load %.2f: %w", wn, pol.Name, load, err)
				}
				rep.Cells = append(rep.Cells, c)
				if progress != nil {
					progress(c)
				}
			}
		}
	}
	rep.Targets = Targets(rep)
	rep.Elapsed = time.Since(rep.Started).Seconds()
	rep.MachineAfter = ThisMachine()
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
