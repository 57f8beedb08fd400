package hub_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/hub"
	"github.com/kvexact/kvexact/gateway/hub/hubtest"
)

func files() map[string][]byte {
	return map[string][]byte{"tokenizer.json": []byte(`{"model":{}}`), "tokenizer_config.json": []byte(`{"bos_token":"<s>"}`), "README.md": []byte("x")}
}

func digest(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestFetchResolvesRevisionAndRecordsDigests: the branch resolves to its commit, the files are
// fetched at that commit into the cache, with each file's sha256 recorded; README.md (not a
// tokenizer file) is not fetched; a second fetch of the commit needs no hub.
func TestFetchResolvesRevisionAndRecordsDigests(t *testing.T) {
	srv := hubtest.NewServer(t, "org/model", files())
	c := &hub.Client{CacheDir: t.TempDir()}
	snap, err := c.Fetch(context.Background(), hub.Source{Endpoint: srv.URL, Repo: "org/model", Revision: "main"})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Commit != srv.Commit || snap.Dir != filepath.Join(c.CacheDir, "org--model", srv.Commit) {
		t.Fatalf("snapshot %+v", snap)
	}
	if len(snap.Files) != 2 || snap.Files["tokenizer.json"] != digest(srv.Files["tokenizer.json"]) || snap.Files["tokenizer_config.json"] != digest(srv.Files["tokenizer_config.json"]) {
		t.Fatalf("digests %v", snap.Files)
	}
	if b, _ := os.ReadFile(filepath.Join(snap.Dir, "tokenizer_config.json")); string(b) != `{"bos_token":"<s>"}` {
		t.Fatalf("cached file %q", b)
	}
	srv.Close() // the hub is gone: a pinned commit in the cache is enough
	again, err := c.Fetch(context.Background(), hub.Source{Endpoint: srv.URL, Repo: "org/model", Revision: srv.Commit})
	if err != nil || again.Dir != snap.Dir {
		t.Fatalf("cached fetch: %+v, %v", again, err)
	}
	// A branch must be resolved, so without the hub it fails, naming the call.
	if _, err := c.Fetch(context.Background(), hub.Source{Endpoint: srv.URL, Repo: "org/model", Revision: "main"}); err == nil || !strings.Contains(err.Error(), "/api/models/org/model/revision/main") {
		t.Fatalf("branch without hub: %v", err)
	}
}

// TestFetchRefusesCorruptOrUnauthorized: a body that does not match the hub's X-Linked-Etag is
// refused and leaves no snapshot; a gated repository without the token says which setting is
// missing; with it the fetch succeeds; a repository without tokenizer_config.json is named.
func TestFetchRefusesCorruptOrUnauthorized(t *testing.T) {
	srv := hubtest.NewServer(t, "org/model", files())
	c := &hub.Client{CacheDir: t.TempDir()}
	src := hub.Source{Endpoint: srv.URL, Repo: "org/model"}
	srv.Corrupt.Store(true)
	if _, err := c.Fetch(context.Background(), src); err == nil || !strings.Contains(err.Error(), "X-Linked-Etag") {
		t.Fatalf("corrupt body: %v", err)
	}
	if _, err := os.Stat(filepath.Join(c.CacheDir, "org--model", srv.Commit)); !os.IsNotExist(err) {
		t.Fatalf("a failed fetch left a snapshot: %v", err)
	}
	srv.Corrupt.Store(false)
	srv.SetToken("hf_secret")
	if _, err := c.Fetch(context.Background(), src); err == nil || !strings.Contains(err.Error(), "tokenizers.hub.tokenFile") {
		t.Fatalf("gated without token: %v", err)
	}
	src.Token = "hf_secret"
	if _, err := c.Fetch(context.Background(), src); err != nil {
		t.Fatalf("gated with token: %v", err)
	}
	srv.Set(strings.Repeat("cd", 20), map[string][]byte{"tokenizer.json": []byte(`{}`)})
	if _, err := c.Fetch(context.Background(), src); err == nil || !strings.Contains(err.Error(), "has no tokenizer_config.json") {
		t.Fatalf("missing file: %v", err)
	}
}

// TestSourceValidate: names reach URLs and paths only after validation.
func TestSourceValidate(t *testing.T) {
	ok := hub.Source{Endpoint: "https://hub.example", Repo: "org/model", Revision: "v1.0"}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []hub.Source{
		{Endpoint: "ftp://x", Repo: "org/model"},
		{Endpoint: "https://hub.example", Repo: "../etc"},
		{Endpoint: "https://hub.example", Repo: "org/model/extra"},
		{Endpoint: "https://hub.example", Repo: "org/..model"},
		{Endpoint: "https://hub.example", Repo: "org/model", Revision: "../../x"},
		{Endpoint: "https://hub.example", Repo: "org/model", Revision: "a b"},
	} {
		if err := bad.Validate(); err == nil {
			t.Fatalf("%+v accepted", bad)
		}
	}
}
