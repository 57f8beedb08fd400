package certificate

import (
	"crypto/ed25519"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func sample() *Certificate {
	seed := "0"
	p := Profile{Family: "vllm", Contract: "vllm-kv-map-v2", Model: "llama3", TokenizerSHA256: "aa", ConfigSHA256: "bb", BlockSize: 16, Binding: "auto", Algorithm: "sha256", SeedFingerprint: SeedFingerprint(&seed), RouterKeys: "kvexact-xxh3-v1"}
	now := time.Now().UTC().Truncate(time.Second)
	return &Certificate{Format: FormatVersion, Profile: p, ProfileDigest: p.Digest(), IssuedAt: now, ExpiresAt: now.Add(24 * time.Hour),
		Endpoints: []Endpoint{{Name: "e0", Certified: []Coverage{CoverEngine, CoverRouter}}, {Name: "e1", Failures: []string{"hash parity: seed differs"}}}}
}

func TestRoundTripAndCoverage(t *testing.T) {
	c := sample()
	path := filepath.Join(t.TempDir(), "cert.json")
	if err := c.Write(path); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if cov, why := got.Covers(c.ProfileDigest, "e0", now); len(cov) != 2 || why != "" {
		t.Fatalf("e0: %v %s", cov, why)
	}
	if cov, why := got.Covers(c.ProfileDigest, "e1", now); cov != nil || !strings.Contains(why, "seed differs") {
		t.Fatalf("e1: %v %s", cov, why)
	}
	if _, why := got.Covers(c.ProfileDigest, "e9", now); !strings.Contains(why, "not in the certificate") {
		t.Fatalf("e9: %s", why)
	}
	other := c.Profile
	other.BlockSize = 32
	if _, why := got.Covers(other.Digest(), "e0", now); !strings.Contains(why, "differs from the rule's staged profile") {
		t.Fatalf("profile mismatch: %s", why)
	}
	if _, why := got.Covers(c.ProfileDigest, "e0", now.Add(25*time.Hour)); !strings.Contains(why, "expired") {
		t.Fatalf("expiry: %s", why)
	}
}

func TestDigestSensitivity(t *testing.T) {
	seed0, seed1, empty := "0", "1", ""
	if SeedFingerprint(&seed0) == SeedFingerprint(&seed1) || SeedFingerprint(&empty) == SeedFingerprint(nil) {
		t.Fatal("seed fingerprints collide")
	}
	base := sample().Profile
	for name, edit := range map[string]func(p *Profile){
		"model":     func(p *Profile) { p.Model = "x" },
		"tokenizer": func(p *Profile) { p.TokenizerSHA256 = "x" },
		"template":  func(p *Profile) { p.TemplateSHA256 = "x" },
		"block":     func(p *Profile) { p.BlockSize = 32 },
		"algorithm": func(p *Profile) { p.Algorithm = "sha256_cbor" },
		"seed":      func(p *Profile) { p.SeedFingerprint = SeedFingerprint(&seed1) },
		"binding":   func(p *Profile) { p.Binding = "router" },
	} {
		p := base
		edit(&p)
		if p.Digest() == base.Digest() {
			t.Errorf("%s does not enter the digest", name)
		}
	}
}

func TestTamperAndSignature(t *testing.T) {
	c := sample()
	pub, priv, _ := ed25519.GenerateKey(nil)
	c.Sign(priv)
	b := c.Payload()
	_ = b
	path := filepath.Join(t.TempDir(), "cert.json")
	c.Write(path)
	if _, err := Load(path, pub); err != nil {
		t.Fatalf("signed certificate rejected: %v", err)
	}
	otherPub, _, _ := ed25519.GenerateKey(nil)
	if _, err := Load(path, otherPub); err == nil || !strings.Contains(err.Error(), "signature does not verify") {
		t.Fatalf("wrong key accepted: %v", err)
	}
	// Edit an endpoint after signing: the signature breaks.
	c.Endpoints[1].Certified = []Coverage{CoverEngine}
	c.Write(path)
	if _, err := Load(path, pub); err == nil {
		t.Fatal("edited signed certificate accepted")
	}
	// Edit the profile without fixing the digest: rejected even unsigned.
	c2 := sample()
	c2.Profile.BlockSize = 64
	c2.Write(path)
	if _, err := Load(path, nil); err == nil || !strings.Contains(err.Error(), "was edited") {
		t.Fatalf("profile edit not caught: %v", err)
	}
	unsigned := sample()
	unsigned.Write(path)
	if _, err := Load(path, pub); err == nil || !strings.Contains(err.Error(), "unsigned") {
		t.Fatalf("unsigned accepted with a key configured: %v", err)
	}
}

func TestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "k"), filepath.Join(dir, "k.pub")
	if err := GenerateKeyFiles(priv, pub); err != nil {
		t.Fatal(err)
	}
	sk, err := LoadPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := LoadPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	c := sample()
	c.Sign(sk)
	path := filepath.Join(dir, "c.json")
	c.Write(path)
	if _, err := Load(path, pk); err != nil {
		t.Fatalf("round trip through key files: %v", err)
	}
	if _, err := LoadPublicKey(priv); err == nil {
		t.Fatal("private key file accepted as public key")
	}
}
