package registry

import "testing"

// TestHitLimitComputesTheLastToken: every family's engine computes a prompt's last token, so a
// prompt of k whole blocks hits at most k−1 of them, one token more all k (docs/reference/
// routing-semantics.md §5.4 has each engine's source).
func TestHitLimitComputesTheLastToken(t *testing.T) {
	const bs = 16
	for _, f := range All() {
		for _, c := range []struct{ tokens, want int }{{0, 0}, {1, 0}, {bs, 0}, {bs + 1, 1}, {8 * bs, 7}, {8*bs + 1, 8}, {9*bs - 1, 8}} {
			if got := f.HitLimit(c.tokens, bs); got != c.want {
				t.Errorf("%s: HitLimit(%d tokens, block %d) = %d, want %d", f.Name(), c.tokens, bs, got, c.want)
			}
		}
	}
}
