// Package certificate is the format `ctk certify` writes and the gateway enforces: a profile digest
// (engine release, model, tokenizer and template digests, block size, binding, algorithm, seed
// fingerprint) bound to the endpoints that proved it, with an issue time, an expiry and an optional
// ed25519 signature. The gateway enables KV-exact for a rule only on endpoints a valid certificate
// covers for the rule's own staged profile; anything else is a named reason, never a silent pass.
package certificate

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kvexact/kvexact/contracts"
)

// FormatVersion is the certificate schema version.
const FormatVersion = "kvexact-certificate-v1"

// Profile is what must match between gateway and engine for exact routing to work. Every field
// enters the digest; two profiles with equal digests route identically.
type Profile struct {
	// Engine family and the contract id the engine's /version mapped to.
	Family   string `json:"family"`
	Contract string `json:"contract"`
	// Model is the served model name.
	Model string `json:"model"`
	// TokenizerSHA256 and ConfigSHA256 are the staged tokenizer.json and tokenizer_config.json.
	TokenizerSHA256 string `json:"tokenizer_sha256"`
	ConfigSHA256    string `json:"config_sha256"`
	// TemplateSHA256 is the chat template text's digest ("" when the model has none).
	TemplateSHA256 string `json:"template_sha256"`
	// BlockSize in tokens.
	BlockSize int `json:"block_size"`
	// Binding requested by the rule: auto, engine or router.
	Binding string `json:"binding"`
	// Algorithm is the engine's hash algorithm (router keys add their version below).
	Algorithm string `json:"algorithm"`
	// SeedFingerprint is SeedFingerprint(seed) ("" for engines without a seed, "unset" when absent).
	SeedFingerprint string `json:"seed_fingerprint"`
	// RouterKeys names the router-key version the gateway computes.
	RouterKeys string `json:"router_keys"`
}

// SeedFingerprint hides the seed value while still telling seeds apart: a seed is configuration an
// operator may not want written into files that travel.
func SeedFingerprint(seed *string) string {
	if seed == nil {
		return "unset"
	}
	sum := sha256.Sum256([]byte("kvexact-seed-v1\x00" + *seed))
	return hex.EncodeToString(sum[:8])
}

// Digest is the profile's identity: sha256 over its canonical JSON (fixed field order).
func (p Profile) Digest() string {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // plain strings and ints cannot fail
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Coverage says what an endpoint proved.
type Coverage string

const (
	// CoverEngine: engine-binding keys equal the engine's published keys.
	CoverEngine Coverage = "engine"
	// CoverRouter: the engine's event tokens equal the gateway's, so router keys work.
	CoverRouter Coverage = "router"
	// CoverAffinity: content affinity only (llama.cpp); no KV-exact.
	CoverAffinity Coverage = "affinity"
)

// Endpoint is one endpoint's result, with the identity it was certified under: the gateway grants
// coverage only to a rule endpoint whose name, HTTP address, event addresses, engine release and
// model all equal these (see Covers), so a certificate cannot follow a name to another engine.
type Endpoint struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	// Release is the engine's /version answer at certification.
	Release string `json:"release"`
	// Model is the model the endpoint served at certification (written since identity binding;
	// "" in older certificates, which then cover nothing).
	Model string `json:"model,omitempty"`
	// Events are the event addresses certified; nil in certificates written before identity
	// binding (they cover nothing), empty for an engine without events.
	Events *Events `json:"events,omitempty"`
	// Certified lists the bindings proven (empty when the endpoint failed).
	Certified []Coverage `json:"certified"`
	// Adapters are the LoRA names (as the engine hashes them: the rule's loraName) whose adapter
	// probes passed on this endpoint; KV-exact routes an adapter's requests only to endpoints that
	// list its LoRA name. Nil in certificates written before adapters were recorded: those restrict
	// no adapter (CoversAdapter is true for every name), as they did.
	Adapters *[]string `json:"adapters,omitempty"`
	// Failures name the specs that failed, for humans.
	Failures []string `json:"failures,omitempty"`
}

// CoversAdapter reports whether the entry proved the adapter whose blocks the engine keys with
// loraName (every name for an entry without an adapter list).
func (e *Endpoint) CoversAdapter(loraName string) bool {
	return e.Adapters == nil || slices.Contains(*e.Adapters, loraName)
}

// Entry returns the certificate's entry for the endpoint named name (nil when it lists none).
func (c *Certificate) Entry(name string) *Endpoint {
	for i := range c.Endpoints {
		if c.Endpoints[i].Name == name {
			return &c.Endpoints[i]
		}
	}
	return nil
}

// Events are an endpoint's KV event addresses: ZeroMQ publish and replay, one per data-parallel rank
// in rank order, or the TensorRT-LLM drain URL.
type Events struct {
	ZMQ    []string `json:"zmq,omitempty"`
	Replay []string `json:"replay,omitempty"`
	Drain  string   `json:"drain,omitempty"`
}

// Identity is what a certificate entry binds: the running rule's endpoint as the gateway reaches it.
type Identity struct {
	Name    string
	Address string
	Release string // the rule's engine release (v0.25.1); compared without a leading "v"
	Model   string
	Events  Events
}

// NewEndpoint is the certificate entry of an endpoint certified for cov under identity id.
func NewEndpoint(id Identity, cov []Coverage) Endpoint {
	ev := id.Events
	return Endpoint{Name: id.Name, Address: id.Address, Release: id.Release, Model: id.Model, Events: &ev, Certified: cov}
}

// Admission policies.
const (
	// AdmitNone: only the endpoints the certificate lists are covered.
	AdmitNone = "none"
	// AdmitProbe: the gateway runs ctk's specs on an endpoint of the same rule that the
	// certificate does not list, and covers it once they pass for the certified profile.
	AdmitProbe = "probe"
)

// Admission says how endpoints that join after certification may be covered.
type Admission struct {
	// Admit is AdmitProbe or AdmitNone.
	Admit string `json:"admit"`
	// Specs are the ctk spec ids an admission probe runs and must not fail (the specs that
	// prove the bindings are required whatever this lists; see ctk.AdmissionSpecs).
	Specs []string `json:"specs,omitempty"`
	// ValidForSeconds bounds an admission's life from the probe (0: until the certificate
	// expires); a due admission is probed again.
	ValidForSeconds int64 `json:"valid_for_seconds,omitempty"`
}

// AdmitsByProbe reports whether the certificate lets the gateway admit unlisted endpoints by
// probe: only when it says so, never by default.
func (c *Certificate) AdmitsByProbe() bool {
	return c.Admission != nil && c.Admission.Admit == AdmitProbe
}

// AdmissionExpiry is when an admission probed at t lapses: its validity window, never past the
// certificate's own expiry.
func (c *Certificate) AdmissionExpiry(t time.Time) time.Time {
	if c.Admission != nil && c.Admission.ValidForSeconds > 0 {
		if e := t.Add(time.Duration(c.Admission.ValidForSeconds) * time.Second); e.Before(c.ExpiresAt) {
			return e
		}
	}
	return c.ExpiresAt
}

// Lists reports whether the certificate has an entry named name (such an endpoint keeps its
// identity binding: it is never admitted by probe).
func (c *Certificate) Lists(name string) bool {
	for _, e := range c.Endpoints {
		if e.Name == name {
			return true
		}
	}
	return false
}

// Verification says how far a loaded certificate's origin was checked.
type Verification string

const (
	// Verified: signed, and the signature verifies with the configured key.
	Verified Verification = "verified"
	// Unsigned: no signature; anyone who can write the file could have edited it.
	Unsigned Verification = "unsigned"
	// SignedUnverified: signed, but no key was configured to check the signature.
	SignedUnverified Verification = "signed, not verified (no --certificate-key)"
)

// Certificate binds a profile to endpoints.
type Certificate struct {
	Format        string     `json:"format"`
	Profile       Profile    `json:"profile"`
	ProfileDigest string     `json:"profile_digest"`
	Endpoints     []Endpoint `json:"endpoints"`
	IssuedAt      time.Time  `json:"issued_at"`
	ExpiresAt     time.Time  `json:"expires_at"`
	Issuer        string     `json:"issuer,omitempty"`
	// Admission is the policy for endpoints the certificate does not list (nil in certificates
	// written before it, which mean admit none: only the listed endpoints are covered).
	Admission *Admission `json:"admission,omitempty"`
	// Signature is base64 ed25519 over Payload() when the certificate is signed.
	Signature string `json:"signature,omitempty"`

	verification Verification // set by Parse
}

// Verification reports whether Parse verified the signature, found none, or had no key to check it.
func (c *Certificate) Verification() Verification {
	if c.verification == "" {
		if c.Signature == "" {
			return Unsigned
		}
		return SignedUnverified
	}
	return c.verification
}

// Payload is the signed bytes: the certificate's JSON with an empty signature.
func (c *Certificate) Payload() []byte {
	cp := *c
	cp.Signature = ""
	b, err := json.Marshal(cp)
	if err != nil {
		panic(err)
	}
	return b
}

// Sign signs the certificate with an ed25519 private key.
func (c *Certificate) Sign(key ed25519.PrivateKey) {
	c.Signature = base64.StdEncoding.EncodeToString(ed25519.Sign(key, c.Payload()))
}

// Write stores the certificate as indented JSON.
func (c *Certificate) Write(path string) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Load reads a certificate. With a public key, the signature must verify (an unsigned certificate
// is refused). Without one, any certificate whose profile digest matches its profile is accepted,
// signed or not, and Verification says so (Unsigned or SignedUnverified): nothing then proves who
// wrote it, which the gateway's status shows and `--require-signed` refuses.
func Load(path string, pub ed25519.PublicKey) (*Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(b, pub)
}

// Parse decodes and checks a certificate.
func Parse(b []byte, pub ed25519.PublicKey) (*Certificate, error) {
	var c Certificate
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("certificate: %w", err)
	}
	if c.Format != FormatVersion {
		return nil, fmt.Errorf("certificate: format %q, want %q", c.Format, FormatVersion)
	}
	if a := c.Admission; a != nil {
		if a.Admit != AdmitProbe && a.Admit != AdmitNone {
			return nil, fmt.Errorf("certificate: admission.admit %q is not %q or %q", a.Admit, AdmitProbe, AdmitNone)
		}
		if a.ValidForSeconds < 0 {
			return nil, fmt.Errorf("certificate: admission.valid_for_seconds %d is negative", a.ValidForSeconds)
		}
	}
	if got := c.Profile.Digest(); got != c.ProfileDigest {
		return nil, fmt.Errorf("certificate: profile_digest %s does not match its profile (%s): the file was edited", c.ProfileDigest, got)
	}
	if pub != nil {
		if c.Signature == "" {
			return nil, errors.New("certificate: unsigned, but a verification key is configured")
		}
		sig, err := base64.StdEncoding.DecodeString(c.Signature)
		if err != nil || !ed25519.Verify(pub, c.Payload(), sig) {
			return nil, errors.New("certificate: signature does not verify with the configured key")
		}
		c.verification = Verified
	}
	return &c, nil
}

// Valid reports whether the certificate is in force at now, with the reason when not.
func (c *Certificate) Valid(now time.Time) (bool, string) {
	if now.Before(c.IssuedAt.Add(-5 * time.Minute)) {
		return false, fmt.Sprintf("certificate issued in the future (%s)", c.IssuedAt.Format(time.RFC3339))
	}
	if !now.Before(c.ExpiresAt) {
		return false, fmt.Sprintf("certificate expired at %s", c.ExpiresAt.Format(time.RFC3339))
	}
	return true, ""
}

// Covers reports which bindings the certificate proves for the endpoint id under a profile digest,
// or why it proves none. The entry is found by name; its recorded identity (address, event
// addresses, release, model) must then equal id's, so a name moved to another engine is a named
// mismatch, never a silent pass.
func (c *Certificate) Covers(profileDigest string, id Identity, now time.Time) ([]Coverage, string) {
	if ok, why := c.Valid(now); !ok {
		return nil, why
	}
	if profileDigest != c.ProfileDigest {
		return nil, fmt.Sprintf("certificate profile %s differs from the rule's staged profile %s (%s)", short(c.ProfileDigest), short(profileDigest), c.diffHint())
	}
	for _, e := range c.Endpoints {
		if e.Name == id.Name {
			if len(e.Certified) == 0 {
				return nil, fmt.Sprintf("endpoint %s failed certification: %s", id.Name, strings.Join(e.Failures, "; "))
			}
			if why := e.mismatch(id); why != "" {
				return nil, why
			}
			return e.Certified, ""
		}
	}
	names := make([]string, len(c.Endpoints))
	for i, e := range c.Endpoints {
		names[i] = e.Name
	}
	sort.Strings(names)
	return nil, fmt.Sprintf("endpoint %s is not in the certificate (it covers %s)", id.Name, strings.Join(names, ", "))
}

// mismatch names the first identity field of the entry that differs from id ("" when all match).
func (e *Endpoint) mismatch(id Identity) string {
	const rerun = "re-run ctk certify with identity binding"
	if e.Events == nil || e.Model == "" {
		return fmt.Sprintf("the certificate entry for %s records no event addresses or model (written before identity binding): %s", id.Name, rerun)
	}
	if a, b := strings.TrimRight(e.Address, "/"), strings.TrimRight(id.Address, "/"); a != b {
		return fmt.Sprintf("certified for %s, rule has %s", e.Address, id.Address)
	}
	if !slices.Equal(e.Events.ZMQ, id.Events.ZMQ) || !slices.Equal(e.Events.Replay, id.Events.Replay) ||
		strings.TrimRight(e.Events.Drain, "/") != strings.TrimRight(id.Events.Drain, "/") {
		return fmt.Sprintf("certified with events %s, rule has %s", e.Events, &id.Events)
	}
	if strings.TrimPrefix(e.Release, "v") != strings.TrimPrefix(id.Release, "v") {
		return fmt.Sprintf("certified on engine release %q, rule has %q", e.Release, id.Release)
	}
	if e.Model != id.Model {
		return fmt.Sprintf("certified serving model %q, rule has %q", e.Model, id.Model)
	}
	return ""
}

// String lists the addresses for reasons.
func (ev *Events) String() string {
	var parts []string
	if len(ev.ZMQ) > 0 {
		parts = append(parts, "zmq "+strings.Join(ev.ZMQ, ","))
	}
	if len(ev.Replay) > 0 {
		parts = append(parts, "replay "+strings.Join(ev.Replay, ","))
	}
	if ev.Drain != "" {
		parts = append(parts, "drain "+ev.Drain)
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, " ")
}

func (c *Certificate) diffHint() string {
	return "re-run ctk certify for this rule's model, tokenizer, block size, binding and seed"
}

func short(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

// NewProfile assembles a profile from the staged configuration. templateText is the model's chat
// template ("" when it has none); seed is the rule's seed (nil when unset).
func NewProfile(family, contract, model, tokenizerSHA256, configSHA256, templateText string, blockSize int, binding, algorithm string, seed *string) Profile {
	p := Profile{Family: family, Contract: contract, Model: model, TokenizerSHA256: tokenizerSHA256, ConfigSHA256: configSHA256,
		BlockSize: blockSize, Binding: binding, Algorithm: algorithm, RouterKeys: RouterKeysVersion}
	if templateText != "" {
		sum := sha256.Sum256([]byte(templateText))
		p.TemplateSHA256 = hex.EncodeToString(sum[:])
	}
	if c, err := contracts.ByID(contract); err == nil && c.Seeded() {
		p.SeedFingerprint = SeedFingerprint(seed)
	}
	return p
}

// RouterKeysVersion is the router-key scheme the gateway computes (DESIGN.md, Decisions).
const RouterKeysVersion = "kvexact-xxh3-v1"
