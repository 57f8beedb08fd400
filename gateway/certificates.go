package gateway

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kvexact/kvexact/ctk"
	"github.com/kvexact/kvexact/ctk/certificate"
	"github.com/kvexact/kvexact/gateway/exactness"
	"github.com/kvexact/kvexact/gateway/rules"
)

// IdentityOf is the certificate identity of a rule's i-th endpoint: what a certificate entry must
// have recorded for it to cover this endpoint.
func IdentityOf(r *rules.Rule, i int) certificate.Identity {
	e := r.Endpoints[i]
	id := certificate.Identity{Name: e.Name, Address: e.Address, Release: r.Engine.Release,
		Events: certificate.Events{ZMQ: e.Events.ZMQ, Replay: e.Events.Replay, Drain: e.Events.Drain}}
	if len(r.Models) == 1 {
		id.Model = r.Models[0]
	}
	return id
}

// noteExpiry keeps the earliest expiry of the certificates granting coverage to the runtime.
func (rt *ruleRuntime) noteExpiry(t time.Time) {
	if rt.expires.IsZero() || t.Before(rt.expires) {
		rt.expires = t
	}
}

// CertificateStatus is one loaded certificate in /admin/status.
type CertificateStatus struct {
	Path          string    `json:"path,omitempty"`
	ProfileDigest string    `json:"profile_digest"`
	IssuedAt      time.Time `json:"issued_at"`
	ExpiresAt     time.Time `json:"expires_at"`
	// Valid is false once expired (Reason says so); Verification is verified, unsigned, or
	// signed but not verified (no --certificate-key).
	Valid        bool   `json:"valid"`
	Reason       string `json:"reason,omitempty"`
	Verification string `json:"verification"`
	Endpoints    int    `json:"endpoints"`
	// Admission is the certificate's policy for endpoints it does not list (absent: admit none).
	Admission *certificate.Admission `json:"admission,omitempty"`
}

func (g *Gateway) certificateStatus() []CertificateStatus {
	g.mu.RLock()
	certs, paths := g.certs, g.certPaths
	g.mu.RUnlock()
	now := g.now()
	out := make([]CertificateStatus, 0, len(certs))
	for i, c := range certs {
		cs := CertificateStatus{ProfileDigest: c.ProfileDigest, IssuedAt: c.IssuedAt, ExpiresAt: c.ExpiresAt,
			Verification: string(c.Verification()), Endpoints: len(c.Endpoints), Admission: c.Admission}
		if i < len(paths) {
			cs.Path = paths[i]
		}
		cs.Valid, cs.Reason = c.Valid(now)
		out = append(out, cs)
	}
	return out
}

// ErrNotVerified is returned when RequireSigned refuses a certificate that was not verified.
var ErrNotVerified = errors.New("certificate not verified")

// CheckSigned refuses a certificate whose signature was not verified with a configured key when
// required is set (the gateway's --require-signed).
func CheckSigned(c *certificate.Certificate, required bool) error {
	if required && c.Verification() != certificate.Verified {
		return fmt.Errorf("%w: %s, and signed certificates are required (--require-signed; give the key with --certificate-key)", ErrNotVerified, c.Verification())
	}
	return nil
}

// CheckAdmission refuses a certificate whose admission policy the gateway's probe cannot run as
// written (ctk.CheckCertificateAdmission: no spec list, the cache clear, a spec this version does
// not know, a binding spec left out, a family whose events are drained): admitting by less than the certificate requires would widen it, and
// admitting nothing while it says probe would fail silently.
func CheckAdmission(c *certificate.Certificate) error {
	if err := ctk.CheckCertificateAdmission(c); err != nil {
		return fmt.Errorf("certificate for profile %s: %w", c.ProfileDigest, err)
	}
	return nil
}

// LoadCertificates reads certificate files with the gateway's key and signing policy.
func LoadCertificates(paths []string, key ed25519.PublicKey, requireSigned bool) ([]*certificate.Certificate, error) {
	var out []*certificate.Certificate
	for _, p := range paths {
		c, err := certificate.Load(p, key)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if err := CheckSigned(c, requireSigned); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if err := CheckAdmission(c); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// ReloadCertificates re-reads the certificate files (SIGHUP, POST /admin/certificates/reload) and
// re-evaluates every rule. When any file fails, nothing changes and the error names the file: the
// certificates in force stay in force. Rules keep serving throughout (a rule's runtime is swapped,
// never stopped first).
func (g *Gateway) ReloadCertificates() ([]CertificateStatus, error) {
	g.mu.RLock()
	paths := g.certPaths
	g.mu.RUnlock()
	cs, err := LoadCertificates(paths, g.opts.CertificateKey, g.opts.RequireSigned)
	if err != nil {
		g.log.Error("certificate reload failed: the certificates in force stay", "err", err)
		return nil, err
	}
	if err := g.SetCertificates(cs); err != nil {
		return nil, err
	}
	for _, c := range g.certificateStatus() {
		g.log.Info("certificate loaded", "file", c.Path, "profile", c.ProfileDigest, "expires", c.ExpiresAt, "verification", c.Verification, "valid", c.Valid)
	}
	return g.certificateStatus(), nil
}

// runCertificateWatch reloads the certificate files when their content changes: a Kubernetes
// Secret mounted as a volume is swapped in place when a certify Job rewrites it, a file a CI job
// writes is replaced; neither sends SIGHUP. Content is compared, not modification times (a
// Secret volume's files are symlinks whose targets change). A reload that fails leaves the
// certificates in force and is retried on the next change only.
func (g *Gateway) runCertificateWatch(ctx context.Context, interval time.Duration) {
	g.mu.RLock()
	paths := g.certPaths
	g.mu.RUnlock()
	last := certificateDigests(paths)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := certificateDigests(paths)
		if cur == last {
			continue
		}
		last = cur
		g.log.Info("certificate files changed: reloading", "files", paths)
		_, _ = g.ReloadCertificates() // logs its own failure
	}
}

// certificateDigests is one digest over the files' contents (a missing file counts as empty: a
// Secret being replaced may be absent for an instant).
func certificateDigests(paths []string) string {
	h := sha256.New()
	for _, p := range paths {
		b, _ := os.ReadFile(p)
		sum := sha256.Sum256(b)
		h.Write(sum[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// runExpiry re-evaluates a rule as soon as a certificate that granted it coverage expires, so
// KV-exact stops on what that certificate covered while the rule keeps serving with its selector.
func (g *Gateway) runExpiry(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := g.now()
		g.mu.RLock()
		var due []string
		for name, rt := range g.runtimes {
			if !rt.expires.IsZero() && !now.Before(rt.expires) {
				due = append(due, name)
			}
		}
		g.mu.RUnlock()
		for _, name := range due {
			g.log.Warn("a certificate or an admission expired: KV-exact stops on the endpoints it covered", "rule", name)
			if err := g.reevaluate(name); err != nil {
				g.log.Error("gateway: rule could not be re-evaluated after a certificate expired", "rule", name, "err", err)
			}
		}
	}
}

// recertified starts every endpoint's runtime exactness afresh after the certificates were
// (re)loaded: a re-certification lifts every hold seen while running (the evidence counters stay).
// A rule rebuilt by the reload has fresh state already; one whose runtime a membership-only apply
// kept (applyMembership) keeps its endpoints' state, holds included, so they are lifted here.
func (g *Gateway) recertified() {
	g.mu.RLock()
	var xs []*endpointExact
	for _, rt := range g.runtimes {
		xs = append(xs, rt.epExact...)
	}
	g.mu.RUnlock()
	for _, x := range xs {
		x.mu.Lock()
		if x.sm.Certified() {
			x.applyLocked(exactness.Evidence{Type: exactness.Certified, Detail: x.sm.CertificateReason()})
		}
		x.mu.Unlock()
	}
}
