package rules

import (
	"strings"
	"testing"
)

// TestEngineBindingSeedRule: an engine-binding rule without a seed is accepted where the release
// roots its hashes in a default seed for the rule's algorithm, and refused with the release's
// reason where the roots are random.
func TestEngineBindingSeedRule(t *testing.T) {
	const tmpl = `
rules:
  - name: r
    engine: {family: vllm, release: RELEASE}
    kvExactMode: 3
    binding: engine
    EXTRA
    endpoints: [{address: "http://127.0.0.1:1"}]
`
	for _, tc := range []struct{ release, extra, want string }{
		{"v0.30.0", "", ""},
		{"v0.29.0", "hashAlgorithm: sha256_cbor", ""},
		{"v0.29.0", "hashAlgorithm: xxhash_cbor", "rules[0].seed: required for the engine binding: the engine roots its block hashes in random bytes per process: vllm v0.29.0 – v0.29.x keeps a random root for xxhash_cbor"},
		{"v0.27.1", "", "rules[0].seed: required for the engine binding: the engine roots its block hashes in random bytes per process: vllm v0.27.0 – v0.27.x has no default seed"},
		{"v0.27.1", `seed: ""`, ""},
	} {
		src := strings.NewReplacer("RELEASE", tc.release, "EXTRA", tc.extra).Replace(tmpl)
		c, err := Parse([]byte(src))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %q: rejected: %v", tc.release, tc.extra, err)
		case tc.want == "" && c.Rules[0].Seed != nil && tc.extra == "":
			t.Errorf("%s: the rule's seed must stay unset (the default is the engine's, not the rule's): %q", tc.release, *c.Rules[0].Seed)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s %q: want error containing %q, got %v", tc.release, tc.extra, tc.want, err)
		}
	}
}
