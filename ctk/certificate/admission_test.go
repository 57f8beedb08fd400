package certificate

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func admissionCert(a *Admission) *Certificate {
	p := NewProfile("vllm", "vllm-v0.25", "llama3", "a", "b", "", 16, "auto", "sha256", nil)
	issued := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return &Certificate{Format: FormatVersion, Profile: p, ProfileDigest: p.Digest(), IssuedAt: issued, ExpiresAt: issued.Add(10 * time.Hour),
		Endpoints: []Endpoint{{Name: "e0", Certified: []Coverage{CoverEngine}}}, Admission: a}
}

// TestAdmissionPolicyParse: admit: probe only when the certificate says so (an old file without
// the field admits none), the field is signed like the rest, and bad values name the field.
func TestAdmissionPolicyParse(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	old := admissionCert(nil)
	old.Sign(priv)
	b, _ := json.Marshal(old)
	if strings.Contains(string(b), "admission") {
		t.Fatalf("a certificate without a policy must serialize as before (older gateways read it): %s", b)
	}
	c, err := Parse(b, pub)
	if err != nil || c.AdmitsByProbe() {
		t.Fatalf("an old certificate admits none: %v %v", err, c.AdmitsByProbe())
	}
	probe := admissionCert(&Admission{Admit: AdmitProbe, Specs: []string{"health"}})
	probe.Sign(priv)
	b, _ = json.Marshal(probe)
	if c, err := Parse(b, pub); err != nil || !c.AdmitsByProbe() || c.Lists("n1") || !c.Lists("e0") {
		t.Fatalf("probe policy: %v", err)
	}
	// The policy is under the signature: turning admit none into probe breaks it.
	none := admissionCert(&Admission{Admit: AdmitNone})
	none.Sign(priv)
	none.Admission.Admit = AdmitProbe
	b, _ = json.Marshal(none)
	if _, err := Parse(b, pub); err == nil || !strings.Contains(err.Error(), "signature") {
		t.Fatalf("an edited policy must fail the signature: %v", err)
	}
	for _, tc := range []struct {
		a    Admission
		want string
	}{
		{Admission{Admit: "always"}, `admission.admit "always"`},
		{Admission{Admit: AdmitProbe, ValidForSeconds: -1}, "admission.valid_for_seconds -1"},
	} {
		c := admissionCert(&tc.a)
		b, _ := json.Marshal(c)
		if _, err := Parse(b, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%+v: error %v, want %q", tc.a, err, tc.want)
		}
	}
}

// TestAdmissionExpiry: an admission lasts its window from the probe, never past the certificate;
// without a window, until the certificate expires.
func TestAdmissionExpiry(t *testing.T) {
	c := admissionCert(&Admission{Admit: AdmitProbe, ValidForSeconds: 3600})
	at := c.IssuedAt.Add(time.Hour)
	if got := c.AdmissionExpiry(at); !got.Equal(at.Add(time.Hour)) {
		t.Fatalf("window 1h from %s: %s", at, got)
	}
	// Probed one hour before the certificate expires: the window ends with it, not after.
	late := c.ExpiresAt.Add(-time.Hour)
	if got := c.AdmissionExpiry(late); !got.Equal(c.ExpiresAt) {
		t.Fatalf("at the certificate's expiry: %s, want %s", got, c.ExpiresAt)
	}
	if got := c.AdmissionExpiry(late.Add(-time.Second)); !got.Equal(c.ExpiresAt.Add(-time.Second)) {
		t.Fatalf("one second inside: %s", got)
	}
	c.Admission.ValidForSeconds = 0
	if got := c.AdmissionExpiry(at); !got.Equal(c.ExpiresAt) {
		t.Fatalf("no window: %s, want the certificate's %s", got, c.ExpiresAt)
	}
}
