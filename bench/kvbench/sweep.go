package kvbench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
)

// A sweep is long (tens of minutes at default size, more at 64 engines) and one cell can fail
// (a port taken, an engine that does not start): the report is saved after every cell, a failing
// cell is recorded with its reason and the sweep goes on, and the document names the cells a run
// planned but never measured.

// CellID names one planned cell.
type CellID struct {
	Workload string  `json:"workload"`
	Policy   string  `json:"policy"`
	Load     float64 `json:"load"`
}

func (id CellID) String() string {
	return fmt.Sprintf("%s / %s / load %.1f", id.Workload, id.Policy, id.Load)
}

// PlannedCell is one cell of the plan, with the policy to run there.
type PlannedCell struct {
	CellID
	Pol Policy
}

// PlannedCells lists the plan's cells in the order Run measures them: workload by workload (the
// plan's workloads, then the law-only ones), load by load, the main policies then the law variants.
func PlannedCells(plan Plan) []PlannedCell {
	workloads := append([]string(nil), plan.Workloads...)
	for _, w := range plan.LawWorkloads {
		if !contains(workloads, w) {
			workloads = append(workloads, w)
		}
	}
	loads := append([]float64(nil), plan.Loads...)
	for _, l := range plan.LawLoads {
		if !slices.Contains(loads, l) {
			loads = append(loads, l)
		}
	}
	slices.Sort(loads)
	var out []PlannedCell
	for _, w := range workloads {
		for _, l := range loads {
			var pols []Policy
			if contains(plan.Workloads, w) && slices.Contains(plan.Loads, l) {
				pols = append(pols, plan.Policies...)
			}
			if contains(plan.LawWorkloads, w) && slices.Contains(plan.LawLoads, l) {
				pols = append(pols, plan.LawPolicies...)
			}
			for _, p := range pols {
				out = append(out, PlannedCell{CellID{w, p.Name, l}, p})
			}
		}
	}
	return out
}

// Missing lists the planned cells the report holds no cell for (an interrupted run).
func (r *Report) Missing() []CellID {
	var out []CellID
	for _, p := range PlannedCells(r.Plan) {
		if r.cell(p.Workload, p.Policy, p.Load) == nil {
			out = append(out, p.CellID)
		}
	}
	return out
}

// Failed lists the cells that did not run to the end (Cell.Error set).
func (r *Report) Failed() []*Cell {
	var out []*Cell
	for _, c := range r.Cells {
		if c.Error != "" {
			out = append(out, c)
		}
	}
	return out
}

// failedCell records a cell that could not be measured: invalid, with the reason.
func failedCell(id CellID, rate float64, err error) *Cell {
	reason := "failed: " + err.Error()
	return &Cell{Workload: id.Workload, Policy: id.Policy, Load: id.Load, Rate: rate, Error: err.Error(), Invalid: []string{reason}}
}

// SaveReport writes rep as JSON to path atomically (a temporary file in the same directory, then
// rename): a reader, or a run killed mid-write, sees the previous complete report or the new one.
func SaveReport(path string, rep *Report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(path, b)
}

func writeAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// buildCommit is the commit the running binary was built from (go build records it; "" under go
// test or outside a repository), "+dirty" when the tree had uncommitted changes.
func buildCommit() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	rev, modified := vcsStamp(bi)
	if rev == "" {
		return ""
	}
	if modified {
		return rev + "+dirty"
	}
	return rev
}

// vcsStamp is the commit and dirty flag go build recorded in bi ("" when it recorded none).
func vcsStamp(bi *debug.BuildInfo) (rev string, modified bool) {
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			rev = kv.Value
		case "vcs.modified":
			modified = kv.Value == "true"
		}
	}
	return rev, modified
}
