package ctk_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/gateway/hub/hubtest"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// TestPoolTokenizerFromHub: a pool file's tokenizers.hub is the gateway's section, read by the same
// code: ctk fetches the model's tokenizer from a hub (a local server speaking the hub's file API)
// into the cache folder, the bearer token from tokenFile, and stages exactly the files served.
func TestPoolTokenizerFromHub(t *testing.T) {
	dir, err := tokenize.FindModelDir(tokenize.DefaultRoots(), "llama3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("missing: the llama3 tokenizer (%v): make tokenizers", err)
		}
		t.Skipf("missing: the llama3 tokenizer (%v): make tokenizers", err)
	}
	want, err := tokenize.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, n := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if files[n], err = os.ReadFile(filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	srv := hubtest.NewServer(t, "meta-llama/Meta-Llama-3-8B-Instruct", files)
	srv.SetToken("hub-secret")
	tmp := t.TempDir()
	tokenFile := filepath.Join(tmp, "hub-token")
	if err := os.WriteFile(tokenFile, []byte("hub-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(tmp, "cache")
	hubSection := `tokenizers:
  hub:
    endpoint: ` + srv.URL + `
    tokenFile: ` + tokenFile + `
    cacheDir: ` + cache + `
    models:
      llama3: {repo: meta-llama/Meta-Llama-3-8B-Instruct, revision: main}
`
	pool := `model: llama3
engine: {family: vllm, release: v0.25.1}
seed: "0"
endpoints: [{name: e0, address: "http://127.0.0.1:1", events: {zmq: ["tcp://127.0.0.1:2"]}}]
` + hubSection
	p, err := ctk.ParsePool([]byte(pool))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := ctk.LoadTokenizer(p)
	if err != nil {
		t.Fatalf("the tokenizer from the hub: %v", err)
	}
	gj, gc := tok.Files()
	wj, wc := want.Files()
	if gj != wj || gc != wc {
		t.Fatalf("staged files %s %s, the hub served %s %s", gj, gc, wj, wc)
	}
	if !strings.HasPrefix(tok.Dir(), cache) || !strings.Contains(tok.Dir(), srv.Commit) {
		t.Fatalf("tokenizer loaded from %s; want the snapshot of commit %s under %s", tok.Dir(), srv.Commit, cache)
	}

	// Without the token the gated repository refuses, and the error says where.
	if err := os.WriteFile(tokenFile, []byte("wrong"), 0o600); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(cache)
	p, err = ctk.ParsePool([]byte(pool))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctk.LoadTokenizer(p); err == nil || !strings.Contains(err.Error(), "tokenizers.hub") {
		t.Fatalf("a refused token: %v; want an error naming tokenizers.hub", err)
	}

	for _, c := range []struct{ doc, field string }{
		{strings.Replace(pool, "seed:", "tokenizer: /srv/llama3\nseed:", 1), "tokenizer"},
		{strings.Replace(pool, "llama3: {repo", "other: {repo", 1), "tokenizers.hub.models"},
		{strings.Replace(pool, "cacheDir: "+cache, "", 1), "cacheDir"},
		{strings.Replace(pool, "repo: meta-llama/", "repo: ../", 1), "models.llama3"},
	} {
		if _, err := ctk.ParsePool([]byte(c.doc)); err == nil || !strings.Contains(err.Error(), c.field) {
			t.Fatalf("pool %q: %v; want an error naming %s", c.doc, err, c.field)
		}
	}
}
