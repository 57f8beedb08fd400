package kvbench

import (
	"context"
	"fmt"
	"time"
)

// SeedStep is one measurement of RunSeeds: a planned cell under one seed.
type SeedStep struct {
	PlannedCell
	Seed uint64
}

// SeedOrder is the order RunSeeds measures in: cell by cell (PlannedCells' order), every seed of
// a cell before the next cell, so the machine's drift over a long sweep falls on all seeds of a
// cell alike; the seeds' order rotates by one from each cell to the next, so no seed is always
// measured first.
func SeedOrder(plan Plan, seeds []uint64) []SeedStep {
	var out []SeedStep
	for i, pc := range PlannedCells(plan) {
		for j := range seeds {
			out = append(out, SeedStep{pc, seeds[(i+j)%len(seeds)]})
		}
	}
	return out
}

// RunSeeds measures every cell of plan once per seed in SeedOrder and returns one report per seed
// (seeds' order), each as Run would have made it for that seed alone. progress, when set, sees the
// seed's report after each cell, its targets recomputed. A cancelled ctx stops it with the reports
// holding what was measured.
func RunSeeds(ctx context.Context, env *Env, plan Plan, seeds []uint64, progress func(*Report, *Cell)) ([]*Report, error) {
	reps := make([]*Report, len(seeds))
	bySeed := map[uint64]*Report{}
	for i, s := range seeds {
		if _, dup := bySeed[s]; dup {
			return nil, fmt.Errorf("seed %d given twice", s)
		}
		p := plan
		p.Seed = s
		reps[i] = &Report{Started: time.Now(), Machine: ThisMachine(), Plan: p, Pool: env.Pool, SLOms: ms(env.SLO), Warmup: env.Warmup, Capacity: map[string]float64{}}
		bySeed[s] = reps[i]
	}
	for _, st := range SeedOrder(plan, seeds) {
		if ctx.Err() != nil {
			break
		}
		rep := bySeed[st.Seed]
		// A plan of this one cell: Run builds its workload from the seed and sizes it from the
		// workload's capacity, as in the whole plan's run.
		one := plan
		one.Seed, one.Workloads, one.Loads, one.Policies = st.Seed, []string{st.Workload}, []float64{st.Load}, []Policy{st.Pol}
		one.LawPolicies, one.LawWorkloads, one.LawLoads = nil, nil, nil
		r, err := Run(ctx, env, one, nil)
		if r == nil {
			return reps, err
		}
		for w, c := range r.Capacity {
			rep.Capacity[w] = c
		}
		for _, c := range r.Cells {
			rep.Cells = append(rep.Cells, c)
			rep.Targets = Targets(rep)
			rep.Elapsed = time.Since(rep.Started).Seconds()
			rep.MachineAfter = ThisMachine()
			if progress != nil {
				progress(rep, c)
			}
		}
	}
	for _, rep := range reps {
		rep.Targets = Targets(rep)
		rep.Elapsed = time.Since(rep.Started).Seconds()
		rep.MachineAfter = ThisMachine()
	}
	if err := ctx.Err(); err != nil {
		return reps, fmt.Errorf("interrupted: %w", err)
	}
	return reps, nil
}
