package vllmpool

import (
	"fmt"
	"os"

	"go.yaml.in/yaml/v3"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/gateway/rules"
)

// Profile is what a pool of engines was started with, as the pool file and the rule stage it.
type Profile struct {
	Model     string  // served model name
	Tokenizer string  // tokenizer folder (the tiny model's folder holds the shared files)
	BlockSize int     // default BlockSize
	HashAlgo  string  // default sha256
	Seed      *string // the staged PYTHONHASHSEED; nil: unknown (the release's default-seed rule)
	Binding   string  // auto (default), engine or router
}

func (p Profile) filled() Profile {
	if p.BlockSize == 0 {
		p.BlockSize = BlockSize
	}
	if p.HashAlgo == "" {
		p.HashAlgo = "sha256"
	}
	return p
}

// Pool is the ctk pool document of the engines under the staged profile.
func Pool(prof Profile, engines []*Engine) (*ctk.Pool, error) {
	prof = prof.filled()
	p := &ctk.Pool{Model: prof.Model, Tokenizer: prof.Tokenizer, Engine: ctk.EngineRef{Family: "vllm", Release: Release},
		BlockSize: prof.BlockSize, HashAlgorithm: prof.HashAlgo, Seed: prof.Seed, Binding: prof.Binding}
	for _, e := range engines {
		ep := ctk.Endpoint{Name: e.Name, Address: e.URL, Events: ctk.Events{ZMQ: e.Publish, Replay: e.Replay, Topic: topic(e)}}
		if e.LoRA != "" {
			p.DiscoverAdapters = true
		}
		p.Endpoints = append(p.Endpoints, ep)
	}
	b, err := yaml.Marshal(p)
	if err != nil {
		return nil, err
	}
	return ctk.ParsePool(b) // normalized the way ctk reads a file
}

// Rule is the gateway rule routing the engines under the staged profile (KV-exact, single pool).
func Rule(name string, prof Profile, engines []*Engine) rules.Rule {
	prof = prof.filled()
	r := rules.Rule{Name: name, Models: []string{prof.Model}, Engine: rules.EngineRef{Family: "vllm", Release: Release},
		KVExactMode: 3, BlockSize: prof.BlockSize, HashAlgorithm: prof.HashAlgo, Seed: prof.Seed, Binding: prof.Binding}
	for _, e := range engines {
		if e.LoRA != "" {
			r.DiscoverAdapters = true // the adapter's name and path as the engine lists them
		}
		r.Endpoints = append(r.Endpoints, rules.Endpoint{Name: e.Name, Address: e.URL,
			Events: rules.Events{ZMQ: e.Publish, Replay: e.Replay, Topic: topic(e)}})
	}
	return r
}

func topic(e *Engine) string {
	if e.NoEvents {
		return ""
	}
	return "kv"
}

// WriteFiles writes pool.yaml (for ctk certify) and gateway.yaml (listening on listen, admin on
// adminListen with token) into dir.
func WriteFiles(dir string, prof Profile, engines []*Engine, listen, adminListen, token string) error {
	p, err := Pool(prof, engines)
	if err != nil {
		return err
	}
	pb, err := yaml.Marshal(p)
	if err != nil {
		return err
	}
	cfg := rules.Config{Listen: listen, Admin: rules.Admin{Listen: adminListen, Token: token}, DebugHeader: true,
		Rules: []rules.Rule{Rule("vllm", prof, engines)}}
	cb, err := yaml.Marshal(&cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(dir+"/pool.yaml", pb, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(dir+"/gateway.yaml", cb, 0o644); err != nil {
		return fmt.Errorf("vllmpool: %v", err)
	}
	return nil
}
