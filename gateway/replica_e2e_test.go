package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/assemble"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/proxy"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/promtest"
)

// startReplica starts another gateway with p's options over p's engines, as a second replica
// behind the same load balancer would run: its own registry, its own listeners, the same rules and
// certificates. It returns a pool view whose requests and dry runs go to the replica.
func (p *pool) startReplica(t *testing.T) *pool {
	t.Helper()
	return p.startReplicaWith(t, nil)
}

// startReplicaWith is startReplica with mod applied to the replica's options.
func (p *pool) startReplicaWith(t *testing.T, mod func(o *gateway.Options)) *pool {
	t.Helper()
	opts := p.opts
	if mod != nil {
		mod(&opts)
	}
	cfg := *opts.Config
	opts.Config = &cfg
	opts.Registry = prometheus.NewRegistry()
	gw, err := assemble.New(assemble.Config{Options: opts, Transport: proxy.DefaultTransport()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		gw.Shutdown(sctx)
		cancel()
	})
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r := *p
	r.g, r.srv, r.reg = gw.Runtime, gw.Servers, opts.Registry
	r.base = "http://" + gw.Servers.Client["127.0.0.1:0"]
	r.admin = "http://" + gw.Servers.Admin
	r.cleanup = nil
	return &r
}

// readyz is the replica's /readyz answer: status code and body.
func (p *pool) readyz() (int, gateway.Readiness) {
	p.t.Helper()
	resp, err := http.Get(p.base + "/readyz")
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	var rd gateway.Readiness
	if err := json.NewDecoder(resp.Body).Decode(&rd); err != nil {
		p.t.Fatal(err)
	}
	return resp.StatusCode, rd
}

func sortedKeys(kc []inventory.KeyCount) []inventory.KeyCount {
	out := slices.Clone(kc)
	slices.SortFunc(out, func(a, b inventory.KeyCount) int {
		switch {
		case a.Key < b.Key:
			return -1
		case a.Key > b.Key:
			return 1
		}
		return 0
	})
	return out
}

// TestE2ELateReplicaReadyWhenSynchronized is the case of a gateway replica started after the
// engines have cached prompts: it is not ready while an endpoint's inventory is not yet rebuilt
// from the engine's replay (the replay socket answers nothing at first), /readyz names the
// endpoint and the rule's reason; once the replay answers it turns ready, and from its first ready
// moment it holds exactly the inventory of the replica that saw everything live, explains the same
// scores, and serves warm prompts with the same hit ratio.
func TestE2ELateReplicaReadyWhenSynchronized(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 3, seed: strp("0"), mode: 3, certify: true, replay: true,
		gwMod: func(o *gateway.Options) { o.EventReplayTimeout = 300 * time.Millisecond }})
	ds := docs(6)
	home := map[int]string{}
	for i, d := range ds {
		c := p.complete(d, false)
		if c.status != 200 {
			t.Fatalf("doc %d: %d %s", i, c.status, c.body)
		}
		home[i] = c.endpoint
	}
	follow := func(i int, tag string) string { return ds[i] + " A follow-up question " + tag + "?" }
	for i := range ds {
		eventually(t, 15*time.Second, fmt.Sprint("the first replica to learn doc ", i), func() bool { return p.overlap(follow(i, "a"), home[i]) > 0 })
	}
	warmOn := map[string]bool{}
	for _, ep := range home {
		warmOn[ep] = true
	}
	// The late replica cannot replay the busiest endpoint yet.
	late := home[0]
	var lateSim *sim.Engine
	for _, s := range p.sims {
		if s.Config().Endpoint == late {
			lateSim = s
		}
	}
	on, off := true, false
	if _, err := lateSim.SetFaults(sim.FaultPatch{ReplayOff: &on}); err != nil {
		t.Fatal(err)
	}
	r := p.startReplica(t)
	unsynced := func(rd gateway.Readiness) bool {
		if rd.Ready || len(rd.Rules) != 1 || !slices.Contains(rd.Rules[0].Reasons, gateway.ReasonUnsynchronized) {
			return false
		}
		for _, e := range rd.Rules[0].Endpoints {
			if (e.Name == late) != e.Unsynchronized || (e.Name == late) == e.Ready {
				return false
			}
		}
		return true
	}
	eventually(t, 10*time.Second, "the late replica to sync every endpoint but "+late, func() bool {
		code, rd := r.readyz()
		return code == http.StatusServiceUnavailable && unsynced(rd)
	})
	// Several replay timeouts and redials later it is still not ready: a failed replay never
	// leaves it routing from the live stream alone.
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		if code, rd := r.readyz(); code != http.StatusServiceUnavailable || !unsynced(rd) {
			t.Fatalf("ready before %s was replayed: %d %+v", late, code, rd)
		}
	}
	if _, err := lateSim.SetFaults(sim.FaultPatch{ReplayOff: &off}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := r.readyz(); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			_, rd := r.readyz()
			t.Fatalf("the late replica never turned ready: %+v", rd)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Its first ready moment: the same inventory, endpoint by endpoint.
	for _, s := range p.sims {
		ep := s.Config().Endpoint
		a, _ := p.g.Inventory("pool", ep)
		b, _ := r.g.Inventory("pool", ep)
		if !slices.Equal(sortedKeys(a), sortedKeys(b)) {
			t.Fatalf("endpoint %s: first replica holds %d keys, the late one %d at its first ready moment", ep, len(a), len(b))
		}
		if warmOn[ep] && len(a) == 0 {
			t.Fatalf("endpoint %s: warmed but empty", ep)
		}
	}
	// The same scores for every warm prompt, then the same hit ratio served: the first replica
	// serves follow-ups "a", the late one follow-ups "b" (same prefixes, distinct tails).
	for i := range ds {
		for _, ep := range p.sims {
			name := ep.Config().Endpoint
			if a, b := p.overlap(follow(i, "b"), name), r.overlap(follow(i, "b"), name); a != b {
				t.Fatalf("doc %d on %s: overlap %d on the first replica, %d on the late one", i, name, a, b)
			}
		}
	}
	var cachedA, cachedB, promptA, promptB int
	for i := range ds {
		a, b := p.complete(follow(i, "a"), false), r.complete(follow(i, "b"), false)
		if a.endpoint != home[i] || b.endpoint != home[i] {
			t.Fatalf("doc %d cached on %s: first replica routed to %s, late one to %s (%s)", i, home[i], a.endpoint, b.endpoint, b.decision)
		}
		cachedA, promptA = cachedA+a.cached, promptA+a.prompt
		cachedB, promptB = cachedB+b.cached, promptB+b.prompt
	}
	if cachedA == 0 || cachedA != cachedB || promptA != promptB {
		t.Fatalf("hit ratio: first replica %d/%d cached, late one %d/%d", cachedA, promptA, cachedB, promptB)
	}
}

// TestE2EReplicasShareLoadThroughEngineGauges: two replicas over the same engines, the
// least-load selector on both. Requests held in flight on one endpoint through replica B are
// invisible to replica A's own count; with the engines' gauges scraped, A's status shows them as
// the endpoint's other load (the engine's running count beyond A's share), and A's cold prompts
// avoid that endpoint (without the engines' count both endpoints are idle to A and it alternates).
func TestE2EReplicasShareLoadThroughEngineGauges(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), replay: true,
		ruleMod: func(r *rules.Rule) { r.Selector = "least-load" },
		gwMod:   func(o *gateway.Options) { o.EngineLoadInterval = 50 * time.Millisecond }})
	b := p.startReplica(t)
	const held = 3
	done := make(chan completion, held)
	body, _ := json.Marshal(map[string]any{"model": p.model, "prompt": "hold the line", "max_tokens": 4000})
	for range held {
		go func() {
			resp, err := http.Post(b.base+"/v1/completions", "application/json", bytes.NewReader(body))
			c := completion{}
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				c.status, c.endpoint = resp.StatusCode, resp.Header.Get(proxy.HeaderEndpoint)
			}
			done <- c
		}()
	}
	// B spreads its three over both endpoints (least-load): find the busier one as the engines
	// report it, through A's status.
	var busy string
	eventually(t, 10*time.Second, "replica A to read the engines' running gauges", func() bool {
		total := 0
		for _, e := range p.g.Status().Rules[0].Endpoints {
			if e.EngineLoad == nil || e.EngineLoad.Stale || e.EngineLoad.Err != "" {
				return false
			}
			total += e.EngineLoad.Others
			if busy == "" || e.EngineLoad.Others > 1 {
				if e.EngineLoad.Others > 1 {
					busy = e.Name
				}
			}
		}
		return total == held && busy != ""
	})
	for _, e := range p.g.Status().Rules[0].Endpoints {
		if e.Active != 0 || e.EngineLoad.Own != 0 || e.EngineLoad.Running != e.EngineLoad.Others {
			t.Fatalf("%s: A's own %d (at scrape %d), engine running %d, others %d", e.Name, e.Active, e.EngineLoad.Own, e.EngineLoad.Running, e.EngineLoad.Others)
		}
	}
	for i := range 4 {
		c := p.complete(fmt.Sprintf("a cold prompt number %d about nothing in particular", i), false)
		if c.status != 200 || c.endpoint == busy {
			t.Fatalf("cold prompt %d: status %d on %s, the endpoint the other replica keeps busy", i, c.status, c.endpoint)
		}
	}
	for range held {
		if c := <-done; c.status != 200 {
			t.Fatalf("held request: %+v", c)
		}
	}
}

// tcpCut forwards 127.0.0.1 connections to target until cut: then it closes its listener and
// every forwarded connection, as a network partition between one replica and one engine would.
type tcpCut struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newTCPCut(t *testing.T, target string) *tcpCut {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &tcpCut{l: l}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			c.mu.Lock()
			c.conns = append(c.conns, in, out)
			c.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	t.Cleanup(c.cut)
	return c
}

func (c *tcpCut) addr() string { return "tcp://" + c.l.Addr().String() }

func (c *tcpCut) cut() {
	c.l.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range c.conns {
		x.Close()
	}
	c.conns = nil
}

// TestE2EReplicaCutFromOneEngineFencesOnlyThere: replica B reaches engine e0's event publisher
// through a link that is then cut. B holds e0 out of KV-exact (exactness events_unsynced, its
// explain shows e0 not eligible) and stays ready (e0 was synchronized once and still serves);
// replica A, still subscribed, keeps routing the warm prompt to e0 exactly. Before the cut both
// replicas' explains agree on every endpoint's score.
func TestE2EReplicaCutFromOneEngineFencesOnlyThere(t *testing.T) {
	var link *tcpCut
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true})
	link = newTCPCut(t, strings.TrimPrefix(p.sims[0].PublishAddrs()[0], "tcp://"))
	opts := p.opts
	cfg := *opts.Config
	cfg.Rules = slices.Clone(cfg.Rules)
	cfg.Rules[0].Endpoints = slices.Clone(cfg.Rules[0].Endpoints)
	cfg.Rules[0].Endpoints[0].Events.ZMQ = []string{link.addr()}
	p.opts.Config = &cfg
	// B's certificate names the address B reads e0's events from (the certificate binds it).
	cert := *opts.Certificates[0]
	cert.Endpoints = slices.Clone(cert.Endpoints)
	cert.Endpoints[0] = certificate.NewEndpoint(gateway.IdentityOf(&cfg.Rules[0], 0), cert.Endpoints[0].Certified)
	p.opts.Certificates = []*certificate.Certificate{&cert}
	b := p.startReplica(t)
	p.opts = opts
	for _, ep := range []string{"e0", "e1"} {
		eventually(t, 10*time.Second, "replica B subscribed to "+ep, func() bool {
			rd := b.g.Readiness()
			for _, e := range rd.Rules[0].Endpoints {
				if e.Name == ep {
					return e.Ready
				}
			}
			return false
		})
	}
	doc := docs(1)[0]
	var home string
	for {
		c := p.complete(doc, false)
		if c.status != 200 {
			t.Fatalf("%d %s", c.status, c.body)
		}
		if home = c.endpoint; home == "e0" {
			break
		}
		doc += " Again." // until a version lands on e0, the engine B gets cut from
	}
	follow := doc + " A follow-up?"
	eventually(t, 10*time.Second, "both replicas to learn the prompt on e0", func() bool {
		return p.overlap(follow, "e0") > 0 && b.overlap(follow, "e0") == p.overlap(follow, "e0")
	})
	for _, ep := range []string{"e0", "e1"} {
		if a, bb := p.overlap(follow, ep), b.overlap(follow, ep); a != bb {
			t.Fatalf("%s: explain overlap %d on A, %d on B", ep, a, bb)
		}
	}
	if err := b.g.EndpointSnapshot("pool", "e0", io.Discard); err != nil {
		t.Fatalf("replica B's snapshot of e0 while synchronized: %v", err)
	}
	link.cut()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := b.g.Status().Rules[0].Endpoints[0]
		if st.Exact != nil && slices.Contains(st.Exact.Holds, "events_unsynced") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica B did not fence e0: %+v %+v readiness %+v", st, st.Exact, b.g.Readiness())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Nor does it offer a peer its view of e0 now.
	var se interface{ StatusCode() int }
	if err := b.g.EndpointSnapshot("pool", "e0", io.Discard); !errors.As(err, &se) || se.StatusCode() != http.StatusConflict {
		t.Fatalf("replica B's snapshot of e0 after losing its stream: %v, want a 409", err)
	}
	if code, rd := b.readyz(); code != http.StatusOK {
		t.Fatalf("replica B unready after losing one engine's stream: %+v", rd)
	}
	explain := func(q *pool) route.EndpointEvidence {
		body, _ := json.Marshal(map[string]any{"model": q.model, "prompt": follow})
		hr, _ := http.NewRequest("POST", "/v1/completions", nil)
		req, err := proxy.ParseRequest(hr, body)
		if err != nil {
			t.Fatal(err)
		}
		rt, _ := q.g.Router("pool")
		d, err := rt.Explain(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range d.Endpoints {
			if e.Name == "e0" {
				return e
			}
		}
		t.Fatalf("no e0 in %+v", d)
		return route.EndpointEvidence{}
	}
	if ea, eb := explain(p), explain(b); !ea.Eligible || eb.Eligible {
		t.Fatalf("e0 eligible on A %v (want true), on B %v (want false)", ea.Eligible, eb.Eligible)
	}
	c := p.complete(follow, false)
	if c.endpoint != "e0" || c.cached == 0 {
		t.Fatalf("replica A: warm prompt to %s with %d cached tokens, want e0 with a hit (%s)", c.endpoint, c.cached, c.decision)
	}
}

// replays is a registry's kvexact_ingest_replays_total for one endpoint and outcome.
func replays(t *testing.T, reg *prometheus.Registry, endpoint, outcome string) float64 {
	return promtest.Sum(t, reg, "kvexact_ingest_replays_total", map[string]string{"endpoint": endpoint, "outcome": outcome})
}

// TestE2ELateReplicaSeesTruncatedReplay: when the engine's replay buffer no longer holds its
// first batches, a replica started later cannot rebuild what they stored; it says so (replay
// outcome truncated, counted per endpoint) instead of silently under-predicting. The replica that
// followed from the start counts none.
func TestE2ELateReplicaSeesTruncatedReplay(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), replay: true,
		simMod: func(_ int, c *sim.Config) { c.ReplayBuffer = 4 }})
	for i, d := range docs(6) {
		if c := p.complete(d, false); c.status != 200 {
			t.Fatalf("doc %d: %d", i, c.status)
		}
	}
	r := p.startReplica(t)
	eventually(t, 10*time.Second, "the late replica to count a truncated replay", func() bool { return replays(t, r.reg, "e0", "truncated") == 1 })
	if n := replays(t, p.reg, "e0", "truncated"); n != 0 {
		t.Fatalf("the replica that followed from the start counted %v truncated replays", n)
	}
}
