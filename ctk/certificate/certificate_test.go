package certificate

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
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
		Endpoints: []Endpoint{NewEndpoint(ident("e0"), []Coverage{CoverEngine, CoverRouter}), {Name: "e1", Failures: []string{"hash parity: seed differs"}}}}
}

// ident is e0's identity as the rule and the certificate both record it.
func ident(name string) Identity {
	return Identity{Name: name, Address: "http://127.0.0.1:8000", Release: "v0.25.1", Model: "llama3",
		Events: Events{ZMQ: []string{"tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"}, Replay: []string{"tcp://127.0.0.1:5600", "tcp://127.0.0.1:5601"}}}
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
	if cov, why := got.Covers(c.ProfileDigest, ident("e0"), now); len(cov) != 2 || why != "" {
		t.Fatalf("e0: %v %s", cov, why)
	}
	if cov, why := got.Covers(c.ProfileDigest, ident("e1"), now); cov != nil || !strings.Contains(why, "seed differs") {
		t.Fatalf("e1: %v %s", cov, why)
	}
	if _, why := got.Covers(c.ProfileDigest, ident("e9"), now); !strings.Contains(why, "not in the certificate") {
		t.Fatalf("e9: %s", why)
	}
	other := c.Profile
	other.BlockSize = 32
	if _, why := got.Covers(other.Digest(), ident("e0"), now); !strings.Contains(why, "differs from the rule's staged profile") {
		t.Fatalf("profile mismatch: %s", why)
	}
	if _, why := got.Covers(c.ProfileDigest, ident("e0"), now.Add(25*time.Hour)); !strings.Contains(why, "expired") {
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

// TestIdentityBinding: an entry covers only the endpoint it was certified as; every identity field
// that differs is named in the reason, and an entry written before identity binding covers nothing.
func TestIdentityBinding(t *testing.T) {
	c := sample()
	now := time.Now()
	for name, tc := range map[string]struct {
		edit func(id *Identity)
		want string
	}{
		"address":      {func(id *Identity) { id.Address = "http://127.0.0.1:9000" }, "certified for http://127.0.0.1:8000, rule has http://127.0.0.1:9000"},
		"rank missing": {func(id *Identity) { id.Events.ZMQ = id.Events.ZMQ[:1]; id.Events.Replay = id.Events.Replay[:1] }, "certified with events zmq tcp://127.0.0.1:5557,tcp://127.0.0.1:5558"},
		"ranks swapped": {func(id *Identity) {
			id.Events.ZMQ = []string{id.Events.ZMQ[1], id.Events.ZMQ[0]}
		}, "rule has zmq tcp://127.0.0.1:5558,tcp://127.0.0.1:5557"},
		"replay":  {func(id *Identity) { id.Events.Replay = nil }, "replay tcp://127.0.0.1:5600,tcp://127.0.0.1:5601, rule has zmq tcp://127.0.0.1:5557,tcp://127.0.0.1:5558"},
		"release": {func(id *Identity) { id.Release = "v0.24.0" }, `certified on engine release "v0.25.1", rule has "v0.24.0"`},
		"model":   {func(id *Identity) { id.Model = "qwen3" }, `certified serving model "llama3", rule has "qwen3"`},
	} {
		id := ident("e0")
		tc.edit(&id)
		cov, why := c.Covers(c.ProfileDigest, id, now)
		if cov != nil || !strings.Contains(why, tc.want) {
			t.Errorf("%s: coverage %v, reason %q; want a reason containing %q", name, cov, why, tc.want)
		}
	}
	id := ident("e0")
	id.Release = "0.25.1" // /version answers without the tag's v
	id.Address += "/"
	if cov, why := c.Covers(c.ProfileDigest, id, now); cov == nil {
		t.Fatalf("equal identity refused: %s", why)
	}
	c.Endpoints[0].Events = nil
	if cov, why := c.Covers(c.ProfileDigest, ident("e0"), now); cov != nil || !strings.Contains(why, "before identity binding") {
		t.Fatalf("legacy entry: %v %q", cov, why)
	}
}

func TestVerification(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	path := filepath.Join(t.TempDir(), "cert.json")
	c := sample()
	c.Write(path)
	if got, _ := Load(path, nil); got.Verification() != Unsigned {
		t.Fatalf("unsigned: %s", got.Verification())
	}
	c.Sign(priv)
	c.Write(path)
	if got, _ := Load(path, nil); got.Verification() != SignedUnverified {
		t.Fatalf("signed without key: %s", got.Verification())
	}
	if got, err := Load(path, pub); err != nil || got.Verification() != Verified {
		t.Fatalf("signed with key: %v %v", got, err)
	}
}

func TestProfileDiffNamesEachFieldWithBothValues(t *testing.T) {
	a := NewProfile("vllm", "vllm-kv-map-v2", "llama3", "tok", "cfg", "tmpl", 16, "auto", "sha256", nil)
	if d := ProfileDiff(a, a); len(d) != 0 {
		t.Fatalf("equal profiles differ: %v", d)
	}
	seed := "1"
	b := NewProfile("vllm", "vllm-kv-map-v2", "llama3", "tok", "cfg", "other template", 16, "engine", "sha256", &seed)
	d := ProfileDiff(a, b)
	want := []string{
		fmt.Sprintf("chat template sha256: certificate %q, rule %q", a.TemplateSHA256, b.TemplateSHA256),
		`binding: certificate "auto", rule "engine"`,
		fmt.Sprintf("seed fingerprint: certificate %q, rule %q", a.SeedFingerprint, b.SeedFingerprint),
	}
	if strings.Join(d, "\n") != strings.Join(want, "\n") {
		t.Fatalf("diff:\n%s\nwant:\n%s", strings.Join(d, "\n"), strings.Join(want, "\n"))
	}
}

// TestEndpointAdapters: an entry without the adapter list (a certificate written before adapters
// were recorded) restricts no adapter and re-marshals without the field, so its signature still
// verifies; an empty list proves none; a list proves exactly its LoRA names.
func TestEndpointAdapters(t *testing.T) {
	var old Endpoint
	if err := json.Unmarshal([]byte(`{"name":"e0","certified":["engine"]}`), &old); err != nil {
		t.Fatal(err)
	}
	if old.Adapters != nil || !old.CoversAdapter("any-lora") {
		t.Fatalf("an entry without adapters must cover every adapter: %+v", old)
	}
	if b, _ := json.Marshal(old); strings.Contains(string(b), "adapters") {
		t.Fatalf("an entry without adapters re-marshals with the field (breaks old signatures): %s", b)
	}
	var none Endpoint
	if err := json.Unmarshal([]byte(`{"name":"e0","certified":["engine"],"adapters":[]}`), &none); err != nil {
		t.Fatal(err)
	}
	if none.Adapters == nil || none.CoversAdapter("sql-lora") {
		t.Fatalf("an empty adapter list must cover no adapter: %+v", none)
	}
	if b, _ := json.Marshal(none); !strings.Contains(string(b), `"adapters":[]`) {
		t.Fatalf("an empty adapter list must survive a round trip: %s", b)
	}
	some := Endpoint{Adapters: &[]string{"sql-lora"}}
	if !some.CoversAdapter("sql-lora") || some.CoversAdapter("sql-v2") {
		t.Fatalf("adapter list [sql-lora]: covers sql-lora only")
	}
}
