package gateway

import (
	"fmt"
	"sort"

	"github.com/kvexact/kvexact/gateway/rules"
)

// ReloadRules applies a re-read configuration's rules to the live rule set: a rule that changed is
// put (an endpoint added there is certified, or admitted by probe, like any rule change), one no
// longer listed is deleted, one unchanged is left alone. The listeners, admin and TLS settings are
// the process's and need a restart; they are not compared. On the first refused rule the error
// names it, and the rules before it in name order stay applied.
func (g *Gateway) ReloadRules(cfg *rules.Config) error {
	want := map[string]bool{}
	sorted := append([]rules.Rule(nil), cfg.Rules...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for i := range sorted {
		r := &sorted[i]
		want[r.Name] = true
		if cur, ok := g.store.Get(r.Name); ok && sameJSON(cur, r) {
			continue
		}
		if _, err := g.store.Put(r); err != nil {
			return fmt.Errorf("rule %q: %w", r.Name, err)
		}
	}
	for _, r := range g.store.List() {
		if !want[r.Name] {
			if err := g.store.Delete(r.Name); err != nil {
				return fmt.Errorf("rule %q: %w", r.Name, err)
			}
		}
	}
	return nil
}
