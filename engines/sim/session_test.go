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
			// The probes' stores may still arrive: pick the two requests' stores by their first token.
			var first, cont *engines.Event
			waitFor(t, 10*time.Second, "both requests' stores", func() bool {
				for _, f := range sub.snapshot()[n:] {
					b, err := sglang.DecodeBatch(f.payload)
					if err != nil {
						t.Fatal(err)
					}
					for i := range b.Events {
						ev := b.Events[i]
						if ev.Kind != engines.BlockStored || len(ev.TokenIDs) == 0 {
							continue
						}
						switch ev.TokenIDs[0] {
						case 900:
							first = &ev
						case 908:
							cont = &ev
						}
					}
				}
				if tc.want == "" && first != nil && len(first.BlockHashes) >= 3 {
					cont = first // one session (none): the continuation may be coalesced into the first store
				}
				return first != nil && cont != nil
			})
			if first.SessionID != tc.want {
				t.Fatalf("the first request's store has session_id %q, want %q: %+v", first.SessionID, tc.want, first)
			}
			if want := map[string]string{"": "", "agent-7": "agent-8"}[tc.want]; cont.SessionID != want {
				t.Fatalf("the continuation's store has session_id %q, want %q: %+v", cont.SessionID, want, cont)
			}
		})
	}
}
