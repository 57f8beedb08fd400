package gateway_test

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/internal/promtest"
)

// lockedBuffer is a log sink several goroutines write.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestE2EReplicaSeedsFromPeerSnapshot: the engines keep only their last few batches for replay,
// so a replica started late rebuilds from replay only part of what they cache. Started with a
// peer's snapshot, it holds exactly the peer's inventory at its first ready moment, endpoint by
// endpoint, and routes the warm prompts as the peer does. With a wrong token, or a snapshot cut
// short on the way, the snapshot is not used: the replica says why (401; the field and byte
// offset), still becomes ready from replay, and holds less.
func TestE2EReplicaSeedsFromPeerSnapshot(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, replay: true,
		simMod: func(i int, c *sim.Config) { c.ReplayBuffer, c.OffloadBlocks = 2, 4096 },
		gwMod:  func(o *gateway.Options) { o.EventReplayTimeout = 500 * time.Millisecond }})
	ds := docs(6)
	home := map[int]string{}
	for i, d := range ds {
		c := p.complete(d, false)
		if c.status != 200 {
			t.Fatalf("doc %d: %d %s", i, c.status, c.body)
		}
		home[i] = c.endpoint
	}
	follow := func(i int) string { return ds[i] + " A follow-up question?" }
	for i := range ds {
		eventually(t, 15*time.Second, fmt.Sprint("the peer to learn doc ", i), func() bool { return p.overlap(follow(i), home[i]) > 0 })
	}
	seeded := func(token, url string) (*pool, *lockedBuffer) {
		logs := &lockedBuffer{}
		r := p.startReplicaWith(t, func(o *gateway.Options) {
			o.PeerSnapshot = &gateway.PeerSnapshot{URL: url, Token: token}
			o.Log = slog.New(slog.NewTextHandler(logs, nil))
		})
		eventually(t, 15*time.Second, "the replica to turn ready", func() bool { code, _ := r.readyz(); return code == http.StatusOK })
		return r, logs
	}
	outcome := func(r *pool, ep, o string) float64 {
		return promtest.Value(t, r.reg, "kvexact_ingest_snapshots_total", map[string]string{"rule": "pool", "endpoint": ep, "outcome": o})
	}
	// same: every tier of every endpoint holds the peer's keys, in the peer's age order (the
	// order the capacity cap retires them in).
	same := func(r *pool) bool {
		for _, s := range p.sims {
			ep := s.Config().Endpoint
			for _, tier := range []engines.Tier{engines.TierGPU, engines.TierCPU} {
				a, b := p.g.TierAged("pool", ep, tier), r.g.TierAged("pool", ep, tier)
				if len(a) == 0 || !slices.Equal(a, b) {
					return false
				}
			}
		}
		return true
	}

	r, _ := seeded(p.token, p.admin)
	for _, s := range p.sims {
		if n := outcome(r, s.Config().Endpoint, "accepted"); n != 1 {
			t.Fatalf("%s: accepted snapshots %v, want 1", s.Config().Endpoint, n)
		}
	}
	if !same(r) {
		t.Fatal("the seeded replica's inventory differs from the peer's at its first ready moment")
	}
	// TierInventory is the tier's residency as TierAged holds it, whatever the order.
	for _, s := range p.sims {
		ep := s.Config().Endpoint
		aged := p.g.TierAged("pool", ep, engines.TierCPU)
		got, ok := p.g.TierInventory("pool", ep, engines.TierCPU)
		slices.SortFunc(aged, func(a, b inventory.KeyCount) int { return cmp.Compare(a.Key, b.Key) })
		slices.SortFunc(got, func(a, b inventory.KeyCount) int { return cmp.Compare(a.Key, b.Key) })
		if !ok || len(got) == 0 || !slices.Equal(got, aged) {
			t.Fatalf("%s: TierInventory(cpu) %d keys (%v), TierAged %d", ep, len(got), ok, len(aged))
		}
	}
	if _, ok := p.g.TierInventory("pool", "nobody", engines.TierCPU); ok {
		t.Fatal("TierInventory answers for an endpoint the rule does not have")
	}
	for i := range ds {
		if a, b := p.overlap(follow(i), home[i]), r.overlap(follow(i), home[i]); a != b || a == 0 {
			t.Fatalf("doc %d on %s: overlap %d on the peer, %d on the seeded replica", i, home[i], a, b)
		}
	}

	bad, logs := seeded("not-the-token", p.admin)
	for _, s := range p.sims {
		if n := outcome(bad, s.Config().Endpoint, "unavailable"); n != 1 {
			t.Fatalf("%s with a wrong token: unavailable snapshots %v, want 1", s.Config().Endpoint, n)
		}
	}
	if !strings.Contains(logs.String(), "401") {
		t.Errorf("the refusal is not logged with its status:\n%s", logs.String())
	}
	if same(bad) {
		t.Fatal("a replica rebuilt from replay alone holds the peer's whole inventory: the test cannot tell the snapshot mattered")
	}

	// A snapshot cut in half on the way.
	cut := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		up, _ := http.NewRequest(http.MethodGet, p.admin+req.URL.Path, nil)
		up.Header.Set("Authorization", req.Header.Get("Authorization"))
		resp, err := http.DefaultClient.Do(up)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		w.Write(data[:len(data)/2])
	}))
	t.Cleanup(cut.Close)
	trunc, logs := seeded(p.token, cut.URL)
	for _, s := range p.sims {
		if n := outcome(trunc, s.Config().Endpoint, "unavailable"); n != 1 {
			t.Fatalf("%s with a truncated snapshot: unavailable snapshots %v, want 1", s.Config().Endpoint, n)
		}
	}
	if l := logs.String(); !strings.Contains(l, "bad snapshot: field") || !strings.Contains(l, "at byte") {
		t.Errorf("the truncation is not logged with its field and offset:\n%s", l)
	}
	if same(trunc) {
		t.Fatal("the replica with a truncated snapshot holds the peer's whole inventory")
	}

	// A replica serves no snapshot of an endpoint it is not synchronized with itself.
	on, off := true, false
	if _, err := p.sims[0].SetFaults(sim.FaultPatch{ReplayOff: &on}); err != nil {
		t.Fatal(err)
	}
	late := p.startReplica(t)
	var last string
	get := func(path string) int {
		req, _ := http.NewRequest(http.MethodGet, late.admin+path, nil)
		req.Header.Set("Authorization", "Bearer "+p.token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		last = string(b)
		return resp.StatusCode
	}
	e0 := p.sims[0].Config().Endpoint
	if code := get("/admin/snapshot/pool/" + e0); code != http.StatusConflict {
		t.Fatalf("snapshot of %s from a replica that has not replayed it: %d, want 409", e0, code)
	}
	if code := get("/admin/snapshot/pool/nowhere"); code != http.StatusNotFound {
		t.Fatalf("snapshot of an unknown endpoint: %d, want 404", code)
	}
	if _, err := p.sims[0].SetFaults(sim.FaultPatch{ReplayOff: &off}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for get("/admin/snapshot/pool/"+e0) != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatalf("the late replica serves no snapshot of %s once synchronized: %s", e0, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
