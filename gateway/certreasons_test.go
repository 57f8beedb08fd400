package gateway_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/ctk/certificate"
)

// TestStatusReasonIndependentOfCertificateOrder: with a certificate for another profile and one for
// the rule's own profile in which the endpoints failed, the status names the failed legs whichever
// certificate was loaded first.
func TestStatusReasonIndependentOfCertificateOrder(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: false})
	tok, _ := tokenizerPool(t).Get("llama3")
	js, cs := tok.Files()
	cert := func(seed string, failed bool) *certificate.Certificate {
		prof := certificate.NewProfile("vllm", "vllm-kv-map-v2", "llama3", js, cs, tok.Config().ChatTemplate, 16, "auto", "sha256", strp(seed))
		c := &certificate.Certificate{Format: certificate.FormatVersion, Profile: prof, ProfileDigest: prof.Digest(), IssuedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}
		for _, n := range []string{"e0", "e1"} {
			e := certificate.Endpoint{Name: n, Certified: []certificate.Coverage{certificate.CoverEngine}}
			if failed {
				e.Certified, e.Failures = []certificate.Coverage{}, []string{"geometry and hash parity: publishes the block keys the gateway computes (seed)"}
			}
			c.Endpoints = append(c.Endpoints, e)
		}
		return c
	}
	other, own := cert("1", false), cert("0", true)
	for _, order := range [][]*certificate.Certificate{{other, own}, {own, other}} {
		if err := p.g.SetCertificates(order); err != nil {
			t.Fatal(err)
		}
		st := p.g.Status().Rules[0].Exact
		if st.Enabled {
			t.Fatalf("exact enabled by failed certificates: %+v", st)
		}
		for _, n := range []string{"e0", "e1"} {
			if why := st.Endpoints[n]; !strings.Contains(why, "failed certification") || !strings.Contains(why, "(seed)") {
				t.Errorf("order %s first: %s: reason %q, want the failed certification (seed)", order[0].Profile.SeedFingerprint, n, why)
			}
		}
	}
}
