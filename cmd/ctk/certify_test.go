package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// certifySim starts a SGLang simulator on 127.0.0.1 and writes its pool file into dir.
func certifySim(t *testing.T, dir string) string {
	t.Helper()
	tdir, err := tokenize.FindModelDir(tokenize.DefaultRoots(), "llama3")
	if err != nil {
		t.Skipf("the llama3 tokenizer is not available (run make tokenizers or set KVEXACT_TOKENIZERS): %v", err)
	}
	e, err := sim.New(sim.Config{Family: "sglang", Release: "v0.5.18", Model: tdir, ServedModelName: "llama3",
		PublishAddr: "tcp://*:0", ReplayAddr: "tcp://*:0", PrefillPerToken: time.Microsecond, DecodePerToken: time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	pool := filepath.Join(dir, "pool.yaml")
	doc := fmt.Sprintf("model: llama3\ntokenizer: %s\nengine: {family: sglang, release: v0.5.18}\nendpoints:\n  - name: S0\n    address: %s\n    events: {zmq: [%s], replay: [%s]}\n",
		tdir, e.URL(), e.PublishAddrs()[0], e.ReplayAddrs()[0])
	if err := os.WriteFile(pool, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return pool
}

func TestCertifyWritesSignedCertificateReportAndJUnit(t *testing.T) {
	dir := t.TempDir()
	pool := certifySim(t, dir)
	var out, errb bytes.Buffer
	if code := keygen([]string{"--out", filepath.Join(dir, "ca")}, &out, &errb); code != 0 {
		t.Fatalf("keygen exit %d: %s", code, errb.String())
	}
	outDir := filepath.Join(dir, "out")
	code := certify(context.Background(), []string{"--pool", pool, "--out", outDir, "--sign-key", filepath.Join(dir, "ca.key"), "--valid-for", "24h"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d, want 0\n%s\n%s", code, out.String(), errb.String())
	}
	pub, err := certificate.LoadPublicKey(filepath.Join(dir, "ca.pub"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := certificate.Load(filepath.Join(outDir, "certificate.json"), pub)
	if err != nil {
		t.Fatalf("certificate.Load: %v", err)
	}
	if got := c.ExpiresAt.Sub(c.IssuedAt); got != 24*time.Hour {
		t.Errorf("lifetime %s, want 24h (--valid-for)", got)
	}
	if len(c.Endpoints) != 1 || c.Endpoints[0].Name != "S0" || len(c.Endpoints[0].Certified) == 0 {
		t.Errorf("endpoints %+v, want S0 certified", c.Endpoints)
	}
	report, err := os.ReadFile(filepath.Join(outDir, "report.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"PASS S0 | identity: answers its health endpoint", "# CERTIFIED S0", "# exit 0"} {
		if !strings.Contains(string(report), want) {
			t.Errorf("report.txt lacks %q:\n%s", want, report)
		}
	}
	junit, err := os.ReadFile(filepath.Join(outDir, "junit.xml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(junit), "<testsuite") || !strings.Contains(string(junit), "stores blocks of the staged block size") {
		t.Errorf("junit.xml does not list the specs:\n%.400s", junit)
	}
}

func TestCertifyExitsOneWhenAnEndpointFails(t *testing.T) {
	dir := t.TempDir()
	pool := certifySim(t, dir)
	b, _ := os.ReadFile(pool)
	// The engine's pages are 1 token; staging 16 is the wrong geometry.
	if err := os.WriteFile(pool, append([]byte("blockSize: 16\n"), b...), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := certify(context.Background(), []string{"--pool", pool, "--out", filepath.Join(dir, "out"), "--event-timeout", "2s"}, &out, &errb)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "leg: block size") || !strings.Contains(out.String(), "fix: set blockSize: 1") {
		t.Errorf("the report does not name the block size leg and its fix:\n%s", out.String())
	}
}

func TestCertifyExitsTwoNamingTheField(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct {
		args []string
		doc  string
		want string
	}{
		"no pool flag":    {args: []string{}, want: "--pool is required"},
		"bad valid-for":   {args: []string{"--valid-for", "-1h"}, doc: "x", want: "--valid-for"},
		"missing model":   {doc: "endpoints: [{address: http://127.0.0.1:1}]\n", want: "model: required"},
		"llama.cpp exact": {doc: "model: m\nengine: {family: llamacpp, release: b10573}\nendpoints: [{address: http://127.0.0.1:1, require: exact}]\n", want: "endpoints[0].require"},
		"admit clear":     {args: []string{"--admit", "probe", "--admit-specs", "replay,clear"}, doc: "x", want: `"clear": an admission probe never runs the cache-clear spec`},
		"missing key":     {args: []string{"--sign-key", filepath.Join(dir, "nope.key")}, doc: "model: m\nengine: {family: llamacpp, release: b10573}\nendpoints: [{address: http://127.0.0.1:1}]\n", want: "--sign-key"},
	} {
		t.Run(name, func(t *testing.T) {
			args := c.args
			if c.doc != "" {
				p := filepath.Join(t.TempDir(), "pool.yaml")
				if err := os.WriteFile(p, []byte(c.doc), 0o644); err != nil {
					t.Fatal(err)
				}
				args = append([]string{"--pool", p}, args...)
			}
			var out, errb bytes.Buffer
			if code := certify(context.Background(), args, &out, &errb); code != 2 {
				t.Fatalf("exit %d, want 2: %s", code, errb.String())
			}
			if !strings.Contains(errb.String(), c.want) {
				t.Errorf("stderr %q does not name %q", errb.String(), c.want)
			}
		})
	}
}

func TestKeygenRefusesToOverwrite(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "k")
	var out, errb bytes.Buffer
	if code := keygen([]string{"--out", prefix}, &out, &errb); code != 0 {
		t.Fatalf("first keygen exit %d: %s", code, errb.String())
	}
	if _, err := certificate.LoadPrivateKey(prefix + ".key"); err != nil {
		t.Fatalf("the key written does not load: %v", err)
	}
	if code := keygen([]string{"--out", prefix}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "exists") {
		t.Fatalf("second keygen exit %d (%s), want 2 refusing to overwrite", code, errb.String())
	}
}
