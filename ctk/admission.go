package ctk

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvexact/kvexact/ctk/certificate"
)

// bindingSpecs are the specs whose passing result the coverage of any binding needs (verdict):
// an admission always runs them, whatever its policy lists.
var bindingSpecs = []string{idHealth, idRelease, idModel, idTokTrue, idTokFalse, idEvents, idBlockSize, idTokens, idKeys}

// SpecIDs is every spec id of an endpoint's tree, in run order.
func SpecIDs() []string {
	var r endpointRun
	var out []string
	for _, n := range r.tree() {
		out = append(out, n.id)
	}
	return out
}

// AdmissionSpecs is the spec set `ctk certify --admit probe` writes by default: every spec but
// the cache clear, which would empty the joining endpoint's prefix cache while the gateway's other
// tiers already route requests to it (the certified endpoints proved the release announces
// clears; the gateway's own restart detection watches for them).
func AdmissionSpecs() []string {
	return slices.DeleteFunc(SpecIDs(), func(id string) bool { return id == idClear })
}

// NewAdmission is the admission policy of a certificate: admit (certificate.AdmitProbe or
// AdmitNone), the specs a probe runs (nil: AdmissionSpecs; the binding specs are added whatever
// is listed) and the window an admission lasts (0: until the certificate expires).
func NewAdmission(admit string, specs []string, validFor time.Duration) (*certificate.Admission, error) {
	switch admit {
	case certificate.AdmitNone:
		return &certificate.Admission{Admit: certificate.AdmitNone}, nil
	case certificate.AdmitProbe:
	default:
		return nil, fmt.Errorf("admit: %q is not %q or %q", admit, certificate.AdmitProbe, certificate.AdmitNone)
	}
	if validFor < 0 {
		return nil, fmt.Errorf("admit: validity window %s is negative", validFor)
	}
	if specs == nil {
		specs = AdmissionSpecs()
	}
	all := SpecIDs()
	want := map[string]bool{}
	for _, id := range append(slices.Clone(bindingSpecs), specs...) {
		if !slices.Contains(all, id) {
			return nil, fmt.Errorf("admit: spec %q is not one of %s", id, strings.Join(all, ", "))
		}
		want[id] = true
	}
	a := &certificate.Admission{Admit: certificate.AdmitProbe, ValidForSeconds: int64(validFor / time.Second)}
	for _, id := range all { // run order, whatever order they were given in
		if want[id] {
			a.Specs = append(a.Specs, id)
		}
	}
	return a, nil
}

// Admit certifies one endpoint of the pool the way ctk certify does, running the specs the
// certificate's admission policy lists, and says whether it may be covered under the certificate:
// the pool's staged profile must be the certificate's (an admission never widens a profile) and
// the endpoint must pass for the binding the pool asks. The result's endpoint verdict names the
// failed legs when it may not.
func Admit(ctx context.Context, p *Pool, cert *certificate.Certificate, opts Options) (*Result, error) {
	if !cert.AdmitsByProbe() {
		return nil, fmt.Errorf("ctk: the certificate for profile %s does not admit endpoints by probe", cert.ProfileDigest)
	}
	if len(p.Endpoints) != 1 {
		return nil, fmt.Errorf("ctk: an admission probes one endpoint, the pool has %d", len(p.Endpoints))
	}
	opts.Only = cert.Admission.Specs
	if opts.Only == nil {
		opts.Only = AdmissionSpecs()
	}
	opts.Only = append(slices.Clone(opts.Only), bindingSpecs...)
	res, err := Certify(ctx, p, opts)
	if err != nil {
		return nil, err
	}
	if er := &res.Endpoints[0]; er.OK && res.ExitCode != 0 {
		// Covered for one binding with another's leg failing (binding auto): ctk certify exits 1
		// for it, and an admission never lets through what the CI gate would not.
		er.OK = false
	}
	if res.Certificate.ProfileDigest != cert.ProfileDigest {
		er := &res.Endpoints[0]
		er.OK = false
		er.Reason = "the staged profile differs from the certificate's: " + strings.Join(certificate.ProfileDiff(cert.Profile, res.Certificate.Profile), "; ")
		res.ExitCode = 1
	}
	return res, nil
}

// ProveAdapters runs ctk certify's adapter spec (and the binding specs it builds on) on the pool's
// one endpoint for the pool's adapters, under cert's profile: the LoRA names proven, or why none
// was (a failed leg, a skipped adapter spec, or a staged profile that is not the certificate's).
// The gateway calls it for adapters an endpoint lists that its certificate entry did not prove.
func ProveAdapters(ctx context.Context, p *Pool, cert *certificate.Certificate, opts Options) (proved []string, reason string, err error) {
	if len(p.Endpoints) != 1 {
		return nil, "", fmt.Errorf("ctk: an adapter probe probes one endpoint, the pool has %d", len(p.Endpoints))
	}
	if len(p.Adapters) == 0 {
		return nil, "", fmt.Errorf("ctk: an adapter probe needs the adapters to probe (adapters)")
	}
	opts.Only = append(slices.Clone(bindingSpecs), idLoRA)
	res, err := Certify(ctx, p, opts)
	if err != nil {
		return nil, "", err
	}
	if res.Certificate.ProfileDigest != cert.ProfileDigest {
		return nil, "the staged profile differs from the certificate's: " + strings.Join(certificate.ProfileDiff(cert.Profile, res.Certificate.Profile), "; "), nil
	}
	var fails []string
	for _, s := range res.Specs {
		if s.State == Fail {
			fails = append(fails, fmt.Sprintf("%s (%s leg): %s", s.Text, s.Leg, s.Message))
		}
	}
	if len(fails) > 0 {
		return nil, strings.Join(fails, "; "), nil
	}
	if ce := res.Certificate.Entry(p.Endpoints[0].Name); ce != nil && ce.Adapters != nil && len(*ce.Adapters) > 0 {
		return *ce.Adapters, "", nil
	}
	var r endpointRun
	for _, n := range r.tree() {
		if n.id != idLoRA {
			continue
		}
		for _, s := range res.Specs {
			if s.Text == n.text {
				return nil, "the adapter spec did not pass: " + s.Message, nil
			}
		}
	}
	return nil, "the adapter spec did not run", nil
}
