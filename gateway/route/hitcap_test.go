package route

import (
	"context"
	"testing"

	"github.com/kvexact/kvexact/engines"
)

// tokenKeyer is fixedKeyer with the prompt's length in tokens.
type tokenKeyer struct {
	keys   []uint64
	tokens int
}

func (k tokenKeyer) Keys(context.Context, *Request) ([]uint64, int, Miss, string) {
	return k.keys, k.tokens, MissNone, ""
}

// TestHitCapBlockBoundary: with the engine's hit cap (Config.HitLimit), a prompt that ends on a
// block boundary scores and predicts every block but the last, in a single pool and on a P/D
// prefill tier; one token more and the last block counts again. A one-block prompt on its
// boundary can hit nothing and says so.
func TestHitCapBlockBoundary(t *testing.T) {
	keys := keysN(8)
	for _, c := range []struct {
		name          string
		roles         []Role
		mode          int
		extra         int // tokens past 8 whole blocks
		prefix, score int
		maxHit        int
	}{
		{"pool boundary", []Role{RoleNormal, RoleNormal}, 3, 0, 7, 7, 7},
		{"pool one past", []Role{RoleNormal, RoleNormal}, 3, 1, 8, 8, 0},
		{"prefill boundary", []Role{RolePrefill, RoleDecode}, 1, 0, 7, 7, 7},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, c.roles, c.mode, nil, nil)
			bs := f.rt.rule.BlockSize
			f.rt.cfg.Keyer = tokenKeyer{keys: keys, tokens: 8*bs + c.extra}
			f.rt.cfg.HitLimit = engines.LastTokenComputed
			f.inv.Store(f.eps[0].ID, keys)
			d, err := f.rt.Explain(context.Background(), prompt)
			if err != nil || d.Tier != TierKVExact || d.Blocks != 8 || d.MaxHit != c.maxHit || d.Score != c.score {
				t.Fatalf("decision %+v (%v): want kv-exact, 8 blocks, maxHit %d, score %d", d, err, c.maxHit, c.score)
			}
			if ev := d.Endpoints[0]; ev.Prefix != c.prefix || ev.Overlap != c.prefix {
				t.Fatalf("evidence %+v: want prefix and overlap %d", ev, c.prefix)
			}
		})
	}
	t.Run("one block", func(t *testing.T) {
		f := newFixture(t, []Role{RoleNormal}, 3, nil, nil)
		f.rt.cfg.Keyer = tokenKeyer{keys: keys[:1], tokens: f.rt.rule.BlockSize}
		f.rt.cfg.HitLimit = engines.LastTokenComputed
		f.inv.Store(f.eps[0].ID, keys[:1])
		d, err := f.rt.Explain(context.Background(), prompt)
		if err != nil || d.Miss != MissHashes || d.Reason == "" {
			t.Fatalf("decision %+v (%v): want miss hashes with a reason", d, err)
		}
	})
}
