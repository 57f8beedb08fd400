package kvbench

import (
	"context"
	"net"
	"testing"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// freePorts must hand out n different ports: the client-side policies bind one listener per
// engine, and a repeated port fails the gateway's config at 64 engines.
func TestFreePortsDistinct(t *testing.T) {
	ps, err := freePorts(256)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if seen[p] {
			t.Fatalf("port %d handed out twice among %d", p, len(ps))
		}
		seen[p] = true
	}
}

// A 64-engine pool for a client-side policy (the oracle) starts, with one listener per engine.
func TestClientSidePoolAt64Engines(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 64 simulators")
	}
	toks := tokenize.NewPool("")
	if _, err := toks.Get("llama3"); err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	p, err := StartPool(context.Background(), toks, "llama3", DefaultPoolShape().Scaled(64), Policy{Name: PolicyOracle, Oracle: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if len(p.URLs) != 64 {
		t.Fatalf("%d per-engine listeners, want 64", len(p.URLs))
	}
	seen := map[string]bool{}
	for _, u := range p.URLs {
		if seen[u] {
			t.Fatalf("listener %s twice", u)
		}
		seen[u] = true
	}
}

// A listener port taken between choosing and binding it fails that start; the pool retries with
// fresh ports instead of failing the run (a 64-engine sweep lost a cell to "address already in use").
func TestClientSidePoolRetriesATakenPort(t *testing.T) {
	toks := tokenize.NewPool("")
	if _, err := toks.Get("llama3"); err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	calls := 0
	pickPorts = func(n int) ([]int, error) {
		calls++
		ps, err := freePorts(n)
		if err == nil && calls == 1 {
			ps[n-1] = taken.Addr().(*net.TCPAddr).Port
		}
		return ps, err
	}
	defer func() { pickPorts = freePorts }()
	p, err := StartPool(context.Background(), toks, "llama3", DefaultPoolShape(), Policy{Name: PolicyOracle, Oracle: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if calls != 2 || len(p.URLs) != 4 {
		t.Fatalf("%d port choices, %d listeners; want 2 choices (one retry) and 4 listeners", calls, len(p.URLs))
	}
}
