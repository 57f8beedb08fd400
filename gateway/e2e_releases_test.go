package gateway_test

import "testing"

// TestE2EPinnedVLLMReleases routes the oldest and the newest pinned vLLM release end to end with the
// engine binding; the newest runs with PYTHONHASHSEED unset on the engines and no seed in the rule,
// so the keys the gateway computes are rooted in the release's default seed, as the engines' are.
func TestE2EPinnedVLLMReleases(t *testing.T) {
	for _, tc := range []struct {
		release string
		seed    *string
	}{{"v0.23.0", strp("0")}, {"v0.30.0", nil}} {
		t.Run(tc.release, func(t *testing.T) {
			p := startPool(t, poolSpec{family: "vllm", release: tc.release, n: 2, seed: tc.seed, mode: 3, certify: true})
			st := p.g.Status().Rules[0]
			if !st.Exact.Enabled || st.Exact.Binding != "engine" {
				t.Fatalf("exact not enabled on the engine binding: %+v", st.Exact)
			}
			warmThenHit(t, p, false)
		})
	}
}
