package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/bench/kvbench"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// TestQuick runs the harness end to end (kvbench --quick) and asserts the evidence, not the speed:
// every cell valid, KV-exact's hit counters moved by exactly the decisions its headers named, the
// backends' receipts confirm hits, the baselines moved no counter, and the JSON, charts and
// document come out.
func TestQuick(t *testing.T) {
	if _, err := tokenize.NewPool("").Get("llama3"); err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	dir := t.TempDir()
	out, charts := filepath.Join(dir, "raw", "kvbench"), filepath.Join(dir, "charts")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if code := runSweep(ctx, []string{"--quick", "--out", out, "--charts", charts}); code != 0 {
		t.Fatalf("kvbench --quick exited %d", code)
	}
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep kvbench.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Cells) != 5 {
		t.Fatalf("%d cells, want 5 (round-robin, kv-exact, kv-exact default, llm-d estimate, oracle)", len(rep.Cells))
	}
	for _, c := range rep.Cells {
		if !c.Valid {
			t.Errorf("%s: invalid: %v", c.Policy, c.Invalid)
		}
		ev := c.Evidence
		if ev.ReceiptMismatches != 0 || c.Measured == 0 || c.Errors == c.Measured {
			t.Errorf("%s: %d receipt mismatches, %d measured, %d errors", c.Policy, ev.ReceiptMismatches, c.Measured, c.Errors)
		}
		var moved float64
		for _, v := range ev.HitCounterDelta {
			moved += v
		}
		switch c.Policy {
		case kvbench.PolicyKVXDefault:
			seen := 0
			for ep, n := range ev.KVExactByEndpoint {
				seen += n
				if int(ev.HitCounterDelta[ep]) < n {
					t.Errorf("endpoint %s: counter %v below the %d decisions seen", ep, ev.HitCounterDelta[ep], n)
				}
			}
			if moved == 0 || seen == 0 || ev.ConfirmedHits == 0 || c.CachedRatio <= 0 {
				t.Errorf("kv-exact: counter moved %v, %d decisions seen, %d confirmed by receipts, cached ratio %.3f", moved, seen, ev.ConfirmedHits, c.CachedRatio)
			}
		case kvbench.PolicyRR:
			if moved != 0 {
				t.Errorf("round-robin moved the KV-exact hit counters: %v", ev.HitCounterDelta)
			}
		case kvbench.PolicyOracle:
			if ev.ConfirmedHits == 0 {
				t.Errorf("oracle: no receipt confirms a hit")
			}
		case kvbench.PolicyDefault:
			// The default rule predicts on route: predicted hits are counted apart; the engine-confirmed ones still need receipts.
			if moved == 0 || ev.ConfirmedHits+ev.PredictedConfirmed == 0 || ev.PredictedConfirmed > ev.PredictedHits {
				t.Errorf("kv-exact default: counter moved %v, %d confirmed, %d of %d predicted confirmed", moved, ev.ConfirmedHits, ev.PredictedConfirmed, ev.PredictedHits)
			}
		case "llm-d estimate":
			// A client-side peer: no KV-exact counter, its own hits under tier "peer", receipts decide.
			if moved != 0 || ev.Tiers["peer"] == 0 || ev.ConfirmedHits == 0 {
				t.Errorf("llm-d estimate: counters moved %v, tiers %v, %d confirmed", moved, ev.Tiers, ev.ConfirmedHits)
			}
		}
	}
	for _, f := range kvbench.ChartFiles {
		svg, err := os.ReadFile(filepath.Join(charts, f.Name))
		if err != nil || !strings.HasPrefix(string(svg), "<svg") || !strings.Contains(string(svg), "polyline") {
			t.Errorf("chart %s: %v", f.Name, err)
		}
	}
	doc := filepath.Join(dir, "BENCHMARKS.md")
	if code := runDoc([]string{"--raw", filepath.Join(dir, "raw"), "--sections", "../../docs/benchmarks", "--charts", charts, "--out", doc}); code != 0 {
		t.Fatalf("kvbench doc exited %d", code)
	}
	md, _ := os.ReadFile(doc)
	for _, want := range []string{"## 1. Routing quality", "### Targets", "kv-exact overlap/hard", "llm-d estimate", "oracle is an upper bound", "## 3. Component benchmarks"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("document lacks %q", want)
		}
	}
}

// TestOverheadWithoutNginx: a missing nginx (or wrk) is named with how to install it, the decision
// figures are still written, the JSON and the document say why the comparison did not run, and the
// command exits 3 (scripts/bench.sh goes on to the document on that status only).
func TestOverheadWithoutNginx(t *testing.T) {
	if _, err := tokenize.NewPool("").Get("llama3"); err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "raw", "kvbench")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if code := runOverhead(ctx, []string{"--out", out, "--nginx", filepath.Join(dir, "no-nginx"), "--gateway", "/bin/true"}); code != exitNoProxy {
		t.Fatalf("kvbench overhead without nginx exited %d, want %d", code, exitNoProxy)
	}
	b, err := os.ReadFile(filepath.Join(out, "overhead.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ov kvbench.Overhead
	if err := json.Unmarshal(b, &ov); err != nil {
		t.Fatal(err)
	}
	if len(ov.Decision) == 0 || len(ov.Proxy) != 0 || !strings.Contains(ov.ProxyError, "nginx not found") || !strings.Contains(ov.ProxyError, "apt-get install -y nginx-light wrk") {
		t.Errorf("%d decision figures, %d proxy rounds, proxy error %q", len(ov.Decision), len(ov.Proxy), ov.ProxyError)
	}
	doc := filepath.Join(dir, "BENCHMARKS.md")
	if code := runDoc([]string{"--raw", filepath.Join(dir, "raw"), "--sections", "../../docs/benchmarks", "--charts", dir, "--out", doc}); code != 0 {
		t.Fatalf("kvbench doc exited %d", code)
	}
	md, _ := os.ReadFile(doc)
	if !strings.Contains(string(md), "Not measured in this run: nginx not found") {
		t.Error("the document does not say why the proxy comparison did not run")
	}
}

// TestOverheadNoDecision: --no-decision measures the proxy comparison alone (no decision figures,
// so alternating gateway builds takes seconds, not the decision benchmarks' minute); the proxy's
// prerequisites are still checked, and together with --no-proxy nothing is left to run (exit 2).
func TestOverheadNoDecision(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "kvbench")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if code := runOverhead(ctx, []string{"--no-decision", "--no-proxy", "--out", out}); code != 2 {
		t.Fatalf("--no-decision --no-proxy exited %d, want 2", code)
	}
	if code := runOverhead(ctx, []string{"--no-decision", "--out", out, "--nginx", filepath.Join(dir, "no-nginx"), "--gateway", "/bin/true"}); code != exitNoProxy {
		t.Fatalf("--no-decision without nginx exited %d, want %d", code, exitNoProxy)
	}
	b, err := os.ReadFile(filepath.Join(out, "overhead.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ov kvbench.Overhead
	if err := json.Unmarshal(b, &ov); err != nil {
		t.Fatal(err)
	}
	if len(ov.Decision) != 0 || !strings.Contains(ov.ProxyError, "nginx not found") {
		t.Errorf("%d decision figures (want none), proxy error %q", len(ov.Decision), ov.ProxyError)
	}
}

// TestScaleSmoke runs kvbench scale on a tiny plan: every decision must be the KV-exact hit on the
// endpoint holding the prompt (MeasureScale fails otherwise), and the JSON and table come out.
func TestScaleSmoke(t *testing.T) {
	if _, err := tokenize.NewPool("").Get("llama3"); err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	dir := t.TempDir()
	if code := runScale(context.Background(), []string{"--out", dir, "--endpoints", "3", "--resident", "20000", "--prompts", "256", "--repeats", "5"}); code != 0 {
		t.Fatalf("kvbench scale exited %d", code)
	}
	b, err := os.ReadFile(filepath.Join(dir, "scale.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sc kvbench.Scale
	if err := json.Unmarshal(b, &sc); err != nil {
		t.Fatal(err)
	}
	if len(sc.Cells) != 1 || sc.Cells[0].Decisions != 5 || sc.Cells[0].Score != sc.Cells[0].Blocks || sc.Cells[0].Blocks < 16 || sc.Cells[0].CPUms < 0 {
		t.Fatalf("cells %+v", sc.Cells)
	}
	if len(sc.Inventories) != 1 || sc.Inventories[0].BytesPerKey <= 0 || sc.Inventories[0].StoreOpsPerSec <= 0 {
		t.Fatalf("inventories %+v", sc.Inventories)
	}
	if code := runScale(context.Background(), []string{"--out", dir, "--endpoints", "300"}); code != 2 {
		t.Fatalf("--endpoints 300 exited %d, want 2 (the limit is 256)", code)
	}
}

// TestScaleMultiTurnSmoke: an 8k-token prompt gets a multi-turn cell beside its cold one, whose
// decisions (one new turn each) score at least the stored earlier turns' blocks; and the cold cells
// refuse a tokenizer pool with a segment cache (their decisions would be cache hits).
func TestScaleMultiTurnSmoke(t *testing.T) {
	if _, err := tokenize.NewPool("").Get("llama3"); err != nil {
		t.Skipf("llama3 tokenizer not found (%v): run make tokenizers or set KVEXACT_TOKENIZERS", err)
	}
	dir := t.TempDir()
	if code := runScale(context.Background(), []string{"--out", dir, "--endpoints", "3", "--resident", "20000", "--prompts", "8192", "--repeats", "5"}); code != 0 {
		t.Fatalf("kvbench scale exited %d", code)
	}
	b, err := os.ReadFile(filepath.Join(dir, "scale.json"))
	if err != nil {
		t.Fatal(err)
	}
	var sc kvbench.Scale
	if err := json.Unmarshal(b, &sc); err != nil {
		t.Fatal(err)
	}
	if len(sc.Cells) != 2 || sc.Cells[0].MultiTurn || !sc.Cells[1].MultiTurn {
		t.Fatalf("cells %+v, want a cold cell then a multi-turn one", sc.Cells)
	}
	if c := sc.Cells[1]; c.Decisions != 5 || c.Score < c.Blocks || c.Blocks < 256 || c.PromptTokens < 8000 {
		t.Fatalf("multi-turn cell %+v", c)
	}
	md, err := os.ReadFile(filepath.Join(dir, "scale.md"))
	if err != nil || !strings.Contains(string(md), " multi-turn |") {
		t.Fatalf("scale.md has no multi-turn row (%v):\n%s", err, md)
	}
	// One multi-turn cell per --key-cache-bytes value, the same conversation on the same endpoint.
	if code := runScale(context.Background(), []string{"--out", dir, "--endpoints", "3", "--resident", "20000", "--prompts", "8192", "--repeats", "5", "--key-cache-bytes", "0,1048576"}); code != 0 {
		t.Fatalf("kvbench scale --key-cache-bytes 0,1048576 exited %d", code)
	}
	if b, err = os.ReadFile(filepath.Join(dir, "scale.json")); err != nil {
		t.Fatal(err)
	}
	sc = kvbench.Scale{}
	if err := json.Unmarshal(b, &sc); err != nil {
		t.Fatal(err)
	}
	if len(sc.Cells) != 3 || sc.Cells[1].KeyCacheBytes != 0 || sc.Cells[2].KeyCacheBytes != 1<<20 || sc.Cells[2].Score < sc.Cells[2].Blocks {
		t.Fatalf("cells %+v, want a cold cell and multi-turn ones without and with a key cache", sc.Cells)
	}
	if code := runScale(context.Background(), []string{"--out", dir, "--key-cache-bytes", "-1"}); code != 2 {
		t.Fatalf("--key-cache-bytes -1 exited %d, want 2", code)
	}
	_, err = kvbench.MeasureScale(context.Background(), tokenize.NewPool("", tokenize.WithSegmentCacheBytes(1<<20)), "llama3", kvbench.DefaultScalePlan(), nil)
	if err == nil || !strings.Contains(err.Error(), "segment cache") {
		t.Fatalf("MeasureScale on a cached pool: %v, want a refusal", err)
	}
}

// TestBenchScriptDocumentOnly runs scripts/bench.sh as one does after merging
// benchmark sections (SKIP_GO_BENCH=1 SKIP_KVBENCH=1): nothing is measured, the document is assembled from
// the raw results given, and the machine line of the run that measured them is kept.
func TestBenchScriptDocumentOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kvbench through scripts/bench.sh")
	}
	raw := t.TempDir()
	machine := "cores: 2, cpu: test, go1.27.3 linux/amd64, load average at start: 1.00 2.00 3.00, started 2026-12-01 15:00 UTC, commit abc1234\n"
	if err := os.MkdirAll(filepath.Join(raw, "kvbench"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(raw, "machine.txt"), []byte(machine), 0o644); err != nil {
		t.Fatal(err)
	}
	bench := "# command: go test -run '^$' -bench . -benchmem -cpu 1 -benchtime 1s ./gateway/inventory\n# cores: 2\nBenchmarkStore-1   	 1000	  1234 ns/op	 0 B/op	 0 allocs/op\n"
	if err := os.WriteFile(filepath.Join(raw, kvbench.RawName("gateway/inventory")), []byte(bench), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := &kvbench.Report{Command: "kvbench --quick", Plan: kvbench.QuickPlan(), Machine: kvbench.Machine{Cores: 2, Commit: "abc1234"}}
	if err := kvbench.SaveReport(filepath.Join(raw, "kvbench", "results.json"), rep); err != nil {
		t.Fatal(err)
	}
	doc := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	cmd := exec.Command("../../scripts/bench.sh")
	cmd.Env = append(os.Environ(), "SKIP_GO_BENCH=1", "SKIP_KVBENCH=1", "BENCH_RAW="+raw, "BENCH_DOC="+doc)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bench.sh: %v\n%s", err, out)
	}
	if b, _ := os.ReadFile(filepath.Join(raw, "machine.txt")); string(b) != machine {
		t.Errorf("machine.txt rewritten by a document-only pass: %q", b)
	}
	md, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"load average at start: 1.00 2.00 3.00", "commit abc1234", "**Partial run: 0 of 5 planned cells measured.**",
		"`BenchmarkStore-1` | 1000 | 1.23 µs", "## 3. Component benchmarks"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("document lacks %q", want)
		}
	}
}

// TestReplicasFlags: bad replica counts and a failover run of one replica are refused before
// anything starts; a missing nginx fails naming it.
func TestReplicasFlags(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{{"--counts", "1,x"}, {"--counts", "0"}, {"--counts", "17"}, {"--kill", "1"}, {"--kill", "17"}} {
		if code := runReplicas(ctx, args); code != 2 {
			t.Errorf("kvbench replicas %v exited %d, want 2", args, code)
		}
	}
	for _, args := range [][]string{{"--counts", "16", "--kill", "0"}, {"--kill", "16"}} {
		if code := runReplicas(ctx, append(args, "--nginx", filepath.Join(t.TempDir(), "no-nginx"))); code != 1 {
			t.Errorf("kvbench replicas %v without nginx exited %d, want 1 (the flags are valid)", args, code)
		}
	}
}

// TestSelectPolicies pins --policies: the list's order is the run's order (so one invocation can
// alternate variants), and a name that is unknown or repeated is refused, naming it.
func TestSelectPolicies(t *testing.T) {
	known := []kvbench.Policy{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	got, err := selectPolicies("c, a,b", known)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, p.Name)
	}
	if want := []string{"c", "a", "b"}; !slices.Equal(names, want) {
		t.Errorf("order %v, want %v", names, want)
	}
	for list, want := range map[string]string{"a,x": `"x" is not one of: a, b, c`, "a,b,a": `"a" is named twice`} {
		if _, err := selectPolicies(list, known); err == nil || err.Error() != want {
			t.Errorf("selectPolicies(%q) = %v, want %q", list, err, want)
		}
	}
}
