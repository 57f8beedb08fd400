package vllme2e_test

import (
	"slices"
	"testing"

	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/vllm/vllmpool"
)

// TestPublishedXXHashKeysEqualGatewayKeys: e1 restarted with --prefix-caching-hash-algo xxhash
// (pickle + XXH3-128; PYTHONHASHSEED=0, since without a seed vLLM roots xxhash chains in random
// bytes) is certified for the engine binding under xxhash, and the key-parity corpus holds on it:
// every full block the engine publishes is the key the gateway computes. e1 is restarted with its
// certified configuration by the next test that needs the engines.
func TestPublishedXXHashKeysEqualGatewayKeys(t *testing.T) {
	// e1 is restarted here whatever it runs now: a configuration a test before left on it needs
	// no restart of its own first.
	delete(drifted, 1)
	needEngines(t)
	restartWith(t, 1, func(s *vllmpool.Spec) { *s = certified[1]; s.HashAlgo = "xxhash" })
	drifted[1] = true
	xx := prof
	xx.HashAlgo = "xxhash"
	es := []*vllmpool.Engine{engines[1]}
	cs, err := certifyPool(xx, es)
	if err != nil {
		t.Fatal(err)
	}
	if got := cs[0].Entry(es[0].Name); got == nil || !slices.Contains(got.Certified, certificate.CoverEngine) {
		t.Fatalf("e1 under xxhash: certificate entry %+v, want the engine binding certified", got)
	}
	publishedKeysEqualGatewayKeys(t, startGatewayOn(t, xx, es, cs), es[0])
}
