package route

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/rules"
)

// tierName names a tier of a built ladder for the test's expectations.
func tierName(t tier) string {
	switch t.(type) {
	case admissionTier:
		return "admission"
	case sessionTier:
		return "session"
	case trieTier:
		return "trie"
	case kvExactTier:
		return "kv-exact"
	case kvExactOffTier:
		return "kv-exact-off"
	case minLoadTier:
		return "min-load"
	case selectorTier:
		return "selector"
	case rescueTier:
		return "rescue"
	}
	return fmt.Sprintf("%T", t)
}

// TestLadderPerMode pins which tiers each rule shape tries, in order: a mode-3 rule is two tiers, a
// mode-1 rule the P/D list, and mode 0 keeps KV-exact's place so that the decision says mode_off.
func TestLadderPerMode(t *testing.T) {
	pool := []Role{RoleNormal, RoleNormal}
	pd := []Role{RolePrefill, RoleDecode, RoleNormal}
	both := func(r *rules.Rule) {
		r.Trie.Enabled, r.Admission.Enabled, r.Admission.MaxInflightPerEndpoint = true, true, 4
	}
	for _, c := range []struct {
		name  string
		roles []Role
		mode  int
		mod   func(*rules.Rule)
		role  Role
		want  string
	}{
		{"single pool, mode 3", pool, rules.KVExactPool, nil, RoleNormal, "kv-exact selector"},
		{"single pool, mode 0", pool, rules.KVExactOff, nil, RoleNormal, "kv-exact-off selector"},
		{"P/D, mode 1", pd, rules.KVExactPD, nil, RolePrefill, "session kv-exact min-load rescue"},
		{"P/D, mode 1, admission and trie", pd, rules.KVExactPD, both, RolePrefill, "admission session trie kv-exact min-load rescue"},
		{"P/D, mode 0, admission and trie", pd, rules.KVExactOff, both, RolePrefill, "admission session trie kv-exact-off min-load rescue"},
	} {
		f := newFixture(t, c.roles, c.mode, fixedKeyer{}, c.mod)
		var got []string
		for _, tr := range f.rt.ladder.tiers {
			got = append(got, tierName(tr))
		}
		if g := strings.Join(got, " "); g != c.want || f.rt.ladder.role != c.role {
			t.Errorf("%s: ladder %q over %s, want %q over %s", c.name, g, f.rt.ladder.role, c.want, c.role)
		}
	}
}
