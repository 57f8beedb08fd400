package gateway_test

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway"
	"github.com/kvexact/kvexact/gateway/hub/hubtest"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/promtest"
)

// llama3Files reads the staged llama3 tokenizer files the simulators use.
func llama3Files(t *testing.T) map[string][]byte {
	tok, err := tokenizerPool(t).Get("llama3")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, n := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(tok.Dir(), n))
		if err != nil {
			t.Fatal(err)
		}
		out[n] = b
	}
	return out
}

// missingTokenizerPool starts a certified pool whose gateway finds no tokenizer at first: cfg
// points the tokenizers somewhere (cfgMod), the gateway builds its own pool from it and retries
// every 100ms; log collects its lines.
func missingTokenizerPool(t *testing.T, cfgMod func(c *rules.Config)) (*pool, *syncBuffer) {
	log := &syncBuffer{}
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true, cfgMod: cfgMod,
		gwMod: func(o *gateway.Options) {
			o.Tokenizers, o.TokenizerRetry = nil, 100*time.Millisecond
			o.Log = slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo}))
		}})
	return p, log
}

// checkMissing: the named state, everywhere it shows.
func checkMissing(t *testing.T, p *pool, log *syncBuffer) {
	t.Helper()
	st := p.g.Status().Rules[0].Exact
	if st.Enabled || st.Code != "tokenizer" || !strings.Contains(st.Reason, "llama3") || st.Tokenizer != nil {
		t.Fatalf("missing tokenizer: status %+v", st)
	}
	if got := ruleReasonLabel(t, p); got != "tokenizer" {
		t.Fatalf("kvexact_rule_exact_enabled reason %q, want tokenizer", got)
	}
	if e0 := endpointStatus(t, p, "e0"); e0.Exact.State == "eligible" || eligibleMetric(t, p, "e0") != 0 || !strings.Contains(strings.Join(e0.Exact.Reasons, ";"), "tokenizer") {
		t.Fatalf("e0 without a tokenizer: %+v (it must not be eligible, and must say why)", e0.Exact)
	}
	c := p.complete(docs(1)[0], false)
	if c.status != 200 || strings.Contains(c.decision, `"tier":"kv-exact"`) {
		t.Fatalf("without a tokenizer: status %d, decision %s (the rule must serve by its selector)", c.status, c.decision)
	}
}

// checkRecovered: the rule turns exact by itself, the state's WARN and INFO lines appear once each.
func checkRecovered(t *testing.T, p *pool, log *syncBuffer) gateway.ExactStatus {
	t.Helper()
	// A liveness bound, not a speed one: loading the tokenizer takes about 5 s under the race
	// detector alone, and more beside the other packages' tests on two cores.
	eventually(t, 60*time.Second, "the rule to become exact once the tokenizer files exist", func() bool { return p.g.Status().Rules[0].Exact.Enabled })
	eventually(t, 5*time.Second, "the rule metric to follow", func() bool {
		return promtest.Value(t, p.reg, "kvexact_rule_exact_enabled", map[string]string{"rule": "pool"}) == 1
	})
	time.Sleep(300 * time.Millisecond) // three more retry intervals: nothing may log again
	out := log.String()
	if n := strings.Count(out, "tokenizer missing"); n != 1 || !strings.Contains(out, "level=WARN msg=\"tokenizer missing") {
		t.Fatalf("want one WARN line for the missing tokenizer, got %d:\n%s", n, out)
	}
	if n := strings.Count(out, "tokenizer loaded"); n != 1 {
		t.Fatalf("want one INFO line when it loads, got %d:\n%s", n, out)
	}
	warmThenHit(t, p, false)
	return p.g.Status().Rules[0].Exact
}

// TestE2ETokenizerAppearsLater: the tokenizer root is empty when the gateway starts; the rule is in
// the missing-tokenizer state (status code, metric label, selector routing, one WARN line), and
// when the files are copied in it becomes KV-exact by itself with the files' digests recorded.
func TestE2ETokenizerAppearsLater(t *testing.T) {
	files := llama3Files(t)
	root := t.TempDir()
	p, log := missingTokenizerPool(t, func(c *rules.Config) { c.Tokenizers.Root = root })
	checkMissing(t, p, log)
	if !strings.Contains(p.g.Status().Rules[0].Exact.Reason, root) {
		t.Fatalf("the reason does not name where it looked: %q", p.g.Status().Rules[0].Exact.Reason)
	}
	dir := filepath.Join(root, "llama3")
	os.MkdirAll(dir, 0o755)
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st := checkRecovered(t, p, log)
	if st.Tokenizer == nil || st.Tokenizer.Dir != dir || st.Tokenizer.Files["tokenizer.json"] == "" || st.Tokenizer.Commit != "" {
		t.Fatalf("tokenizer source after recovery: %+v", st.Tokenizer)
	}
}

// TestE2ETokenizerFromHub: the model's tokenizer comes from a hub (a local server speaking the
// hub's file API) that has no tokenizer files at first; once the repository gets a commit with
// them the rule becomes exact by itself, its status recording the repository, the commit the
// revision resolved to and every file's digest.
func TestE2ETokenizerFromHub(t *testing.T) {
	files := llama3Files(t)
	srv := hubtest.NewServer(t, "meta-llama/Meta-Llama-3-8B-Instruct", map[string][]byte{"README.md": []byte("weights only")})
	cache := t.TempDir()
	p, log := missingTokenizerPool(t, func(c *rules.Config) {
		c.Tokenizers.Hub = &rules.TokenizerHub{Endpoint: srv.URL, CacheDir: cache,
			Models: map[string]rules.HubModel{"llama3": {Repo: "meta-llama/Meta-Llama-3-8B-Instruct", Revision: "main"}}}
	})
	checkMissing(t, p, log)
	if r := p.g.Status().Rules[0].Exact.Reason; !strings.Contains(r, "has no tokenizer.json") {
		t.Fatalf("the reason does not say what the hub lacks: %q", r)
	}
	commit := strings.Repeat("5e", 20)
	srv.Set(commit, files)
	st := checkRecovered(t, p, log)
	want := filepath.Join(cache, "meta-llama--Meta-Llama-3-8B-Instruct", commit)
	if st.Tokenizer == nil || st.Tokenizer.Dir != want || st.Tokenizer.Repo != "meta-llama/Meta-Llama-3-8B-Instruct" || st.Tokenizer.Commit != commit ||
		st.Tokenizer.Files["tokenizer.json"] != digestOf(files["tokenizer.json"]) || st.Tokenizer.Files["tokenizer_config.json"] != digestOf(files["tokenizer_config.json"]) {
		t.Fatalf("tokenizer source: %+v (want dir %s, commit %s)", st.Tokenizer, want, commit)
	}
}

func digestOf(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
