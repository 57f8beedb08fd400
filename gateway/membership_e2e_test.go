package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/route"
)

// TestE2EMembershipKeepsInventory: endpoints removed from and added to a rule (what Kubernetes
// discovery does on every pod change) leave the other endpoints' inventory, subscriptions and
// exactness evidence in place: their resident blocks are there at once after each change, their
// prefixes keep routing KV-exact to them, a removed endpoint's keys are forgotten and an added one
// is subscribed.
func TestE2EMembershipKeepsInventory(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 3, seed: strp("0"), mode: 3, certify: true})
	full, _ := p.g.Store().Get("pool")
	put := func(names ...string) {
		t.Helper()
		r := full.Clone()
		r.Endpoints = nil
		for _, e := range full.Endpoints {
			if slices.Contains(names, e.Name) {
				r.Endpoints = append(r.Endpoints, e)
			}
		}
		if _, err := p.g.Store().Put(r); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, "the router over endpoints "+fmt.Sprint(names), func() bool {
			rt, _ := p.g.Router("pool")
			var got []string
			for _, e := range rt.Endpoints() {
				got = append(got, e.Name)
			}
			return slices.Equal(got, names)
		})
	}
	// Each endpoint caches its own document (sent to the engine directly).
	ds := docs(4)
	warm := func(i int, doc string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "llama3", "prompt": doc, "max_tokens": 1})
		resp, err := http.Post(p.sims[i].URL()+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ep := fmt.Sprintf("e%d", i)
		eventually(t, 10*time.Second, ep+"'s document in the inventory", func() bool { return p.overlap(doc+" Follow-up?", ep) >= 10 })
	}
	for i := range 3 {
		warm(i, ds[i])
	}
	exactTo := func(doc, ep string) {
		t.Helper()
		c := p.complete(doc+" Follow-up?", false)
		var d route.Decision
		json.Unmarshal([]byte(c.decision), &d)
		if c.status != 200 || c.endpoint != ep || d.Tier != route.TierKVExact || c.cached <= 0 {
			t.Fatalf("%s's prefix went to %s (tier %s, %d cached, status %d): %s", ep, c.endpoint, d.Tier, c.cached, c.status, c.decision)
		}
	}
	matched := func(ep string) uint64 {
		for _, e := range p.g.Status().Rules[0].Endpoints {
			if e.Name == ep {
				return e.Exact.Parity.MatchedBlocks
			}
		}
		return 0
	}
	before := map[string]int{}
	for _, ep := range []string{"e0", "e1", "e2"} {
		before[ep] = p.resident(ep)
	}
	parity0 := matched("e0")

	// e2 leaves: e0 and e1 keep every block and their KV-exact routing; e2's keys are forgotten.
	put("e0", "e1")
	for _, ep := range []string{"e0", "e1"} {
		if got := p.resident(ep); got < before[ep] {
			t.Fatalf("after removing e2, %s holds %d blocks; it held %d", ep, got, before[ep])
		}
	}
	if _, ok := p.g.Inventory("pool", "e2"); ok {
		t.Fatal("e2 removed but still in the inventory")
	}
	if m := matched("e0"); m < parity0 || m == 0 {
		t.Fatalf("e0's parity evidence restarted: %d matched blocks, %d before", m, parity0)
	}
	exactTo(ds[0], "e0")
	exactTo(ds[1], "e1")

	// e2 comes back and e1 leaves: e0 still holds its blocks, e2 is subscribed anew.
	put("e0", "e2")
	if got := p.resident("e0"); got < before["e0"] {
		t.Fatalf("after the second change e0 holds %d blocks; it held %d", got, before["e0"])
	}
	if _, ok := p.g.Inventory("pool", "e1"); ok {
		t.Fatal("e1 removed but still in the inventory")
	}
	exactTo(ds[0], "e0")
	warm(2, ds[3])
	exactTo(ds[3], "e2")
	if st := p.g.Status().Rules[0]; !st.Exact.Enabled {
		t.Fatalf("KV-exact off after membership changes: %+v", st.Exact)
	}
}
