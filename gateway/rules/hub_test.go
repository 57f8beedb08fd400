package rules_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/gateway/rules"
)

// TestTokenizerHubConfig: a hub section loads with its defaults and token, and each bad field is
// named in the error.
func TestTokenizerHubConfig(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "hub-token")
	os.WriteFile(tok, []byte("hf_x\n"), 0o600)
	base := `
rules:
  - name: r
    models: [llama3]
    engine: {family: vllm, release: v0.25.1}
    endpoints: [{name: e, address: "http://127.0.0.1:1"}]
tokenizers:
  hub:
`
	ok := base + "    tokenFile: " + tok + "\n    cacheDir: /var/cache/t\n    models: {llama3: {repo: meta-llama/Meta-Llama-3-8B-Instruct, revision: main}}\n"
	c, err := rules.Parse([]byte(ok))
	if err != nil {
		t.Fatal(err)
	}
	h := c.Tokenizers.Hub
	if h.Endpoint != "https://huggingface.co" || h.Token != "hf_x" || h.Source(h.Models["llama3"]).Repo != "meta-llama/Meta-Llama-3-8B-Instruct" {
		t.Fatalf("hub %+v", h)
	}
	for _, tc := range []struct{ body, field string }{
		{"    models: {llama3: {repo: a/b}}\n", "tokenizers.hub.cacheDir"},
		{"    cacheDir: /c\n", "tokenizers.hub.models"},
		{"    cacheDir: /c\n    models: {llama3: {repo: ../etc}}\n", "tokenizers.hub.models.llama3"},
		{"    cacheDir: /c\n    models: {llama3: {repo: a/b, revision: ../x}}\n", "tokenizers.hub.models.llama3"},
		{"    endpoint: ftp://x\n    cacheDir: /c\n    models: {llama3: {repo: a/b}}\n", "tokenizers.hub.models.llama3"},
		{"    tokenFile: /nonexistent/t\n    cacheDir: /c\n    models: {llama3: {repo: a/b}}\n", "tokenizers.hub.tokenFile"},
	} {
		_, err := rules.Parse([]byte(base + tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%q: error %v, want it to name %s", tc.body, err, tc.field)
		}
	}
}
