package kvbench

import (
	"sync"

	"github.com/kvexact/kvexact/engines/sim"
)

// Policy is one routing policy under test.
type Policy struct {
	Name string `json:"name"`
	// Selector is the rule's selector: the whole policy for the baselines, the fallback on a
	// KV-exact miss otherwise.
	Selector string `json:"selector,omitempty"`
	Exact    bool   `json:"exact,omitempty"`
	Scoring  string `json:"scoring,omitempty"`
	Law      string `json:"law,omitempty"`
	// Oracle routes in the client with the simulators' true cache contents.
	Oracle bool `json:"oracle,omitempty"`
}

// The policy names used in reports.
const (
	PolicyRR         = "round-robin"
	PolicyLeastLoad  = "least-load"
	PolicyCHWBL      = "chwbl"
	PolicyOracle     = "oracle"
	PolicyKVXDefault = "kv-exact overlap/hard"
)

// KVExact is a KV-exact policy; its fallback on a miss is least-load.
func KVExact(scoring, law string) Policy {
	return Policy{Name: "kv-exact " + scoring + "/" + law, Selector: "least-load", Exact: true, Scoring: scoring, Law: law}
}

// MainPolicies run on every workload and load: the three baselines, KV-exact with each scoring under
// the default law, and the oracle.
func MainPolicies() []Policy {
	return []Policy{
		{Name: PolicyRR, Selector: "rr"},
		{Name: PolicyLeastLoad, Selector: "least-load"},
		{Name: PolicyCHWBL, Selector: "chwbl"},
		KVExact("overlap", "hard"),
		KVExact("prefix", "hard"),
		{Name: PolicyOracle, Oracle: true},
	}
}

// LawPolicies are the other load laws, run on the system-prompt workload.
func LawPolicies() []Policy {
	var out []Policy
	for _, s := range []string{"overlap", "prefix"} {
		for _, l := range []string{"soft", "adaptive", "off"} {
			out = append(out, KVExact(s, l))
		}
	}
	return out
}

// oracle routes with perfect knowledge: the simulators' true cache contents and the true number of
// requests each one holds, under the same bounded-load law as the gateway's default (hard,
// ε = 0.75): the deepest cached prefix among endpoints under cap, ties to the least loaded; with
// nothing cached anywhere, the least loaded.
type oracle struct {
	mu    sync.Mutex
	sims  []*sim.Engine
	load  []int
	turn  int
	eps   float64
	depth []int
}

func newOracle(sims []*sim.Engine) *oracle {
	return &oracle{sims: sims, load: make([]int, len(sims)), depth: make([]int, len(sims)), eps: 0.75}
}

// pick chooses an endpoint for a prompt's block keys and takes one load unit on it.
func (o *oracle) pick(keys []uint64) (idx, depth int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := len(o.sims)
	total := 0
	for i, s := range o.sims {
		total += o.load[i]
		cache := s.CacheKeys(0)
		d := 0
		for _, k := range keys {
			if cache[k] <= 0 {
				break
			}
			d++
		}
		o.depth[i] = d
	}
	capN := int((1+o.eps)*float64(total)/float64(n) + 0.999999)
	capN = max(capN, 1)
	best := -1
	o.turn++
	for j := 0; j < n; j++ {
		i := (o.turn + j) % n // rotate ties among equals so no endpoint is favoured by its index
		if o.load[i] >= capN {
			continue
		}
		if best < 0 || o.depth[i] > o.depth[best] || (o.depth[i] == o.depth[best] && o.load[i] < o.load[best]) {
			best = i
		}
	}
	if best < 0 { // cannot happen (the least loaded is always under cap); stay safe
		best = 0
		for i := range o.load {
			if o.load[i] < o.load[best] {
				best = i
			}
		}
	}
	if o.depth[best] == 0 {
		for j := 0; j < n; j++ {
			i := (o.turn + j) % n
			if o.load[i] < o.load[best] {
				best = i
			}
		}
	}
	o.load[best]++
	return best, o.depth[best]
}

func (o *oracle) done(i int) {
	o.mu.Lock()
	o.load[i]--
	o.mu.Unlock()
}
