package tokenize

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/hub"
	"github.com/kvexact/kvexact/gateway/hub/hubtest"
)

// tinyTokenizer writes a minimal valid tokenizer folder.
func tinyTokenizer(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tinyJSON), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{}`), 0o644))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestPoolLoadsOnceConcurrently(t *testing.T) {
	root := t.TempDir()
	tinyTokenizer(t, filepath.Join(root, "org__model"))
	var loads atomic.Int32
	p := NewPool(root, withLoader(func(d string) (*Tokenizer, error) {
		loads.Add(1)
		time.Sleep(20 * time.Millisecond)
		return Load(d)
	}))
	var wg sync.WaitGroup
	toks := make([]*Tokenizer, 16)
	for i := range toks {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			tk, err := p.Get("org/model")
			if err != nil {
				t.Error(err)
			}
			toks[i] = tk
		}(i)
	}
	wg.Wait()
	if n := loads.Load(); n != 1 {
		t.Fatalf("loaded %d times, want 1", n)
	}
	for _, tk := range toks {
		if tk == nil || tk != toks[0] {
			t.Fatal("callers got different tokenizers")
		}
	}
	if tk := toks[0]; !strings.HasSuffix(tk.Dir(), "org__model") {
		t.Errorf("dir %q, want the slug folder org__model", tk.Dir())
	}
}

func TestPoolFolderMappingAndLRU(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{"a", "b", "c"} {
		tinyTokenizer(t, filepath.Join(root, f))
	}
	abs := filepath.Join(t.TempDir(), "elsewhere")
	tinyTokenizer(t, abs)
	var loads atomic.Int32
	p := NewPool(root, WithMaxLoaded(2), WithFolder("model-b", "b"), WithFolder("far", abs),
		withLoader(func(d string) (*Tokenizer, error) { loads.Add(1); return Load(d) }))
	for _, m := range []string{"a", "model-b", "a", "c", "far"} {
		if _, err := p.Get(m); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
	}
	st := p.Status()
	if len(st) != 2 || st[0].Model != "c" || st[1].Model != "far" {
		t.Fatalf("kept %+v, want the two most recent (c, far)", st)
	}
	if st[1].Dir != abs {
		t.Errorf("far loaded from %q, want %q", st[1].Dir, abs)
	}
	if _, err := p.Get("a"); err != nil { // evicted: loads again
		t.Fatal(err)
	}
	if n := loads.Load(); n != 5 {
		t.Errorf("%d loads, want 5 (a, model-b, c, far, a again)", n)
	}
}

func TestPoolRemembersFailureAndRetries(t *testing.T) {
	root := t.TempDir()
	now := time.Unix(1000, 0)
	var loads atomic.Int32
	p := NewPool(root, WithRetryAfter(time.Minute), withClock(func() time.Time { return now }),
		withLoader(func(d string) (*Tokenizer, error) { loads.Add(1); return Load(d) }))
	_, err := p.Get("missing/model")
	var le *PoolLoadError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "missing__model/tokenizer.json") {
		t.Fatalf("error %v, want a PoolLoadError naming missing__model/tokenizer.json", err)
	}
	tinyTokenizer(t, filepath.Join(root, "missing__model"))
	if _, err2 := p.Get("missing/model"); err2 == nil || err2.Error() != err.Error() {
		t.Fatalf("within the retry interval the remembered error is expected, got %v", err2)
	}
	now = now.Add(2 * time.Minute)
	if _, err := p.Get("missing/model"); err != nil {
		t.Fatalf("after the interval the load is retried and succeeds, got %v", err)
	}
	if n := loads.Load(); n != 1 {
		t.Errorf("loader ran %d times, want 1 (the first attempt failed before loading: no folder)", n)
	}
}

// TestMissingHint: the hint for missing files fits where the process runs — the make target inside
// a checkout, the configuration's ways (a folder, the engines' model directory, a hub) anywhere else
// (a container, an installed binary), where no make target exists.
func TestMissingHint(t *testing.T) {
	_, err := FindModelDir([]string{t.TempDir()}, "llama3")
	if err == nil || !strings.Contains(err.Error(), "make tokenizers") {
		t.Fatalf("inside the checkout: %v", err)
	}
	t.Chdir(t.TempDir())
	_, err = FindModelDir([]string{t.TempDir()}, "llama3")
	if err == nil || strings.Contains(err.Error(), "make") || !strings.Contains(err.Error(), "tokenizers.hub") || !strings.Contains(err.Error(), "tokenizers.folders") {
		t.Fatalf("outside a checkout: %v", err)
	}
}

// TestPoolHubFetchInBackground: a hub slower than the pool's wait does not hold the load up — it
// fails at once with "still fetching" while the fetch goes on — and the first load after the retry
// interval picks the finished fetch up; a fast hub loads at once.
func TestPoolHubFetchInBackground(t *testing.T) {
	dir := t.TempDir()
	tinyTokenizer(t, dir)
	files := map[string][]byte{}
	for _, n := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(dir, n))
		must(t, err)
		files[n] = b
	}
	srv := hubtest.NewServer(t, "org/tiny", files)
	srv.Delay.Store(int64(400 * time.Millisecond))
	src := map[string]hub.Source{"tiny": {Endpoint: srv.URL, Repo: "org/tiny"}}
	p := NewPool(t.TempDir(), WithHub(&hub.Client{CacheDir: t.TempDir()}, src, time.Minute), WithRetryAfter(10*time.Millisecond))
	p.hubWait = 50 * time.Millisecond
	start := time.Now()
	if _, err := p.Get("tiny"); err == nil || !strings.Contains(err.Error(), "still fetching org/tiny") {
		t.Fatalf("slow hub: %v", err)
	}
	if d := time.Since(start); d > 300*time.Millisecond {
		t.Fatalf("the load waited %s for a slow hub", d)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		tok, err := p.Get("tiny")
		if err == nil {
			if snap := p.Snapshot("tiny"); snap == nil || snap.Commit != srv.Commit || tok.Dir() != snap.Dir {
				t.Fatalf("snapshot %+v, dir %s", snap, tok.Dir())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the background fetch never became the loaded tokenizer: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := srv.Calls.Load(); n != 3 { // one listing and two files: the fetch ran once
		t.Fatalf("%d hub calls, want 3", n)
	}
}
