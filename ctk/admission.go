package ctk

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvexact/kvexact/contracts"
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

// AdmissionSpecs is the spec set `ctk certify --admit probe` writes by default: every spec an
// admission may run, which is every spec but the cache clear. The clear spec resets the engine's
// whole prefix cache (the family's reset route, or a pool's clear URL), and
// the gateway admits a pod that is already Ready, whose cache its selector tiers may already be
// filling with clients' prompts; no engine offers a clear scoped to the probe's own blocks. What
// the spec proves — the engine announces a reset on its event stream — is the release's code: the
// CI gate's ctk certify run proves it for the certified release and profile, and an admission
// requires the same contract (release spec) and the same profile. On the admitted pod a reset
// that went unannounced would still not pass silently: the gateway's realized-hit check
// (predicted against the engine's reported cached tokens) suspends KV-exact on a shortfall.
func AdmissionSpecs() []string {
	return slices.DeleteFunc(SpecIDs(), func(id string) bool { return id == idClear })
}

// AdmissionAddedTokensPerText is how many added tokens an admission's tokenizer specs join into
// one tokenize call (Options.AddedTokensPerText): Llama 3's 256 take 8 calls per
// add_special_tokens setting instead of 512, each token still pinned by the ids of its text.
const AdmissionAddedTokensPerText = 32

// CheckAdmission says whether the gateway's admission probe can run what a certificate's policy
// requires: an admit value it knows, and for admit probe an explicit spec list (never defaulted
// by the reader, so a certificate means the same to every gateway) of spec ids this ctk knows,
// holding every binding spec and not the cache clear, which an admission never runs. The error
// names the field and the spec.
func CheckAdmission(a *certificate.Admission) error {
	if a == nil || a.Admit == certificate.AdmitNone {
		return nil
	}
	if a.Admit != certificate.AdmitProbe {
		return fmt.Errorf("admission.admit %q is not %q or %q", a.Admit, certificate.AdmitProbe, certificate.AdmitNone)
	}
	if len(a.Specs) == 0 {
		return fmt.Errorf("admission.specs is empty: a certificate that admits by probe lists the specs its probe runs (ctk certify --admit probe writes them)")
	}
	all := SpecIDs()
	for _, id := range a.Specs {
		switch {
		case id == idClear:
			return fmt.Errorf("admission.specs lists %q: an admission probe never runs the cache-clear spec (it would empty the prefix cache of an engine already serving requests); the CI gate's ctk certify run proves it", id)
		case !slices.Contains(all, id):
			return fmt.Errorf("admission.specs lists %q, which this gateway's probe does not know (known: %s)", id, strings.Join(all, ", "))
		}
	}
	for _, id := range bindingSpecs {
		if !slices.Contains(a.Specs, id) {
			return fmt.Errorf("admission.specs lacks %q, which coverage needs (required: %s)", id, strings.Join(bindingSpecs, ", "))
		}
	}
	return nil
}

// CheckCertificateAdmission is CheckAdmission for a certificate's policy, and refuses admit probe
// for a profile whose engine's events are drained (Contract.Drained): a drain has one consumer,
// the gateway's own ingest, so its probe cannot run the event specs every admission requires.
func CheckCertificateAdmission(c *certificate.Certificate) error {
	if err := CheckAdmission(c.Admission); err != nil {
		return err
	}
	if !c.AdmitsByProbe() {
		return nil
	}
	if ct, err := contracts.ByID(c.Profile.Contract); err == nil && ct.Drained() {
		return fmt.Errorf("admission.admit %q: %s", certificate.AdmitProbe, drainedAdmission(c.Profile.Family))
	}
	return nil
}

func drainedAdmission(family string) string {
	return fmt.Sprintf("%s events are drained over HTTP by one consumer, the gateway's own ingest, so its probe cannot run the event specs an admission requires; certify such endpoints with ctk certify (admit none)", family)
}

// NewAdmission is the admission policy of a certificate: admit (certificate.AdmitProbe or
// AdmitNone), the specs a probe runs (nil: AdmissionSpecs; the binding specs are added whatever
// is listed; the cache clear is refused) and the window an admission lasts (0: until the
// certificate expires). The specs are written out in full, binding specs included.
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
	if err := CheckAdmission(a); err != nil {
		return nil, fmt.Errorf("admit: %w", err)
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
	if err := CheckCertificateAdmission(cert); err != nil {
		return nil, fmt.Errorf("ctk: the certificate for profile %s: %w", cert.ProfileDigest, err)
	}
	opts.Only = slices.Clone(cert.Admission.Specs)
	if opts.AddedTokensPerText == 0 {
		opts.AddedTokensPerText = AdmissionAddedTokensPerText
	}
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
	if opts.AddedTokensPerText == 0 {
		opts.AddedTokensPerText = AdmissionAddedTokensPerText // a serving engine, as an admission's
	}
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
