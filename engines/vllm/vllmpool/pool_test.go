package vllmpool

import (
	"testing"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/gateway/rules"
)

// TestWriteFiles: the pool file and the gateway config written for two engines load with ctk's
// and the gateway's own readers and say the same profile and addresses.
func TestWriteFiles(t *testing.T) {
	seed := "0"
	es := []*Engine{
		{Spec: Spec{Name: "e0"}, URL: "http://127.0.0.1:8001", Publish: []string{"tcp://127.0.0.1:5557"}, Replay: []string{"tcp://127.0.0.1:5600"}},
		{Spec: Spec{Name: "e1", LoRA: "/tmp/tiny-lora"}, URL: "http://127.0.0.1:8002", Publish: []string{"tcp://127.0.0.1:5558"}, Replay: []string{"tcp://127.0.0.1:5601"}},
	}
	dir := t.TempDir()
	if err := WriteFiles(dir, Profile{Model: "llama3", Tokenizer: dir, Seed: &seed}, es, "127.0.0.1:8080", "127.0.0.1:8081", "token"); err != nil {
		t.Fatal(err)
	}
	p, err := ctk.LoadPool(dir + "/pool.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.BlockSize != BlockSize || p.HashAlgorithm != "sha256" || p.Seed == nil || *p.Seed != "0" || p.Engine.Release != Release || !p.DiscoverAdapters {
		t.Fatalf("pool profile %+v", p)
	}
	if len(p.Endpoints) != 2 || p.Endpoints[1].Address != es[1].URL || p.Endpoints[1].Events.ZMQ[0] != es[1].Publish[0] || p.Endpoints[1].Events.Replay[0] != es[1].Replay[0] {
		t.Fatalf("pool endpoints %+v", p.Endpoints)
	}
	c, err := rules.Load(dir + "/gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	if r.BlockSize != BlockSize || r.KVExactMode != 3 || r.Seed == nil || *r.Seed != "0" || len(r.Endpoints) != 2 || r.Endpoints[0].Events.ZMQ[0] != es[0].Publish[0] || r.Endpoints[0].Name != "e0" || !r.DiscoverAdapters {
		t.Fatalf("rule %+v", r)
	}
}
