package sim

import (
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sglang"
)

// TestSGLangSessionIDOnStores: a request's session_id comes back on its stores where the release's
// wire has the field (v0.5.21, tagged maps) and nowhere on v0.5.18's arrays; stores of different
// sessions are not coalesced into one event (SGLang's metadata-aware coalescing).
func TestSGLangSessionIDOnStores(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    string
	}{{"v0.5.18", ""}, {"v0.5.21", "agent-7"}} {
		t.Run(tc.release, func(t *testing.T) {
			e := startSim(t, "sglang", tc.release, func(c *Config) { c.BlockSize = 4 })
			sub := subscribe(t, e.PublishAddrs()[0], "")
			probe := 0
			waitFor(t, 10*time.Second, "first live event", func() bool {
				probe++
				post(t, e.URL()+"/v1/completions", map[string]any{"prompt": []int{probe, 1000 + probe, 2, 3, 4}, "max_tokens": 1})
				return len(sub.snapshot()) > 0
			})
			n := len(sub.snapshot())
			prompt := []int{900, 901, 902, 903, 904, 905, 906, 907, 908}
			resp, _ := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "session_id": "agent-7"})
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			// The same prefix continued by another session: its new blocks are that session's.
			resp, _ = post(t, e.URL()+"/v1/completions", map[string]any{"prompt": append(prompt, 909, 910, 911, 912), "max_tokens": 1, "session_id": "agent-8"})
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			var stores []engines.Event
			waitFor(t, 10*time.Second, "both requests' stores", func() bool {
				stores = stores[:0]
				for _, f := range sub.snapshot()[n:] {
					b, err := sglang.DecodeBatch(f.payload)
					if err != nil {
						t.Fatal(err)
					}
					for _, ev := range b.Events {
						if ev.Kind == engines.BlockStored {
							stores = append(stores, ev)
						}
					}
				}
				return len(stores) >= 2
			})
			if got := stores[0].SessionID; got != tc.want {
				t.Fatalf("first store's session_id %q, want %q: %+v", got, tc.want, stores)
			}
			if tc.want != "" && stores[1].SessionID != "agent-8" {
				t.Fatalf("the continuation's store is not agent-8's: %+v", stores[1])
			}
		})
	}
}
