package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvexact/kvexact/ctk/certificate"
)

// TestRequireSignedRefusesUnverified: --require-signed refuses to start on a certificate that was not
// verified (unsigned, or without the key to check it) with exit status 2, before anything listens.
func TestRequireSignedRefusesUnverified(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gateway.yaml")
	os.WriteFile(cfg, []byte(`listen: 127.0.0.1:0
admin: {listen: 127.0.0.1:0, token: x}
rules:
  - name: r
    models: [m]
    engine: {family: vllm, release: v0.25.1}
    kvExactMode: 0
    endpoints: [{name: e0, address: "http://127.0.0.1:1"}]
`), 0o644)
	p := certificate.Profile{Family: "vllm", Contract: "vllm-kv-map-v2", Model: "m", BlockSize: 16, Binding: "auto", Algorithm: "sha256"}
	c := &certificate.Certificate{Format: certificate.FormatVersion, Profile: p, ProfileDigest: p.Digest(), IssuedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}
	cert := filepath.Join(dir, "cert.json")
	if err := c.Write(cert); err != nil {
		t.Fatal(err)
	}
	priv, pub := filepath.Join(dir, "k.key"), filepath.Join(dir, "k.pub")
	if err := certificate.GenerateKeyFiles(priv, pub); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"no key":   {"--config", cfg, "--certificate", cert, "--require-signed"},
		"unsigned": {"--config", cfg, "--certificate", cert, "--require-signed", "--certificate-key", pub},
	} {
		if code := run(args); code != 2 {
			t.Errorf("%s: exit %d, want 2", name, code)
		}
	}
}
