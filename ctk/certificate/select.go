package certificate

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// CoversAny is Covers over several certificates: the coverage of the first one that covers the
// endpoint, else the reason of the certificate that says most about it, whatever the order the
// certificates were loaded in. A certificate for the rule's own profile that lists the endpoint
// (its failed legs) beats one for the profile without it, which beats one for another profile,
// which beats one not in force; among equals the first reason in byte order wins.
// The covering certificate is returned with its coverage (nil when none covers).
func CoversAny(certs []*Certificate, profileDigest string, id Identity, now time.Time) (*Certificate, []Coverage, string) {
	best, bestRank := "", -1
	for _, c := range certs {
		got, why := c.Covers(profileDigest, id, now)
		if got != nil {
			return c, got, ""
		}
		if r := c.relevance(profileDigest, id.Name, now); r > bestRank || r == bestRank && why < best {
			best, bestRank = why, r
		}
	}
	return nil, nil, best
}

// relevance ranks what a certificate that does not cover an endpoint says about it.
func (c *Certificate) relevance(profileDigest, endpoint string, now time.Time) int {
	if ok, _ := c.Valid(now); !ok {
		return 0
	}
	if profileDigest != c.ProfileDigest {
		return 1
	}
	for _, e := range c.Endpoints {
		if e.Name == endpoint {
			return 3
		}
	}
	return 2
}

// CoversProfile is CoversAny for a rule's whole staged profile: when the reason is a certificate
// for another profile, it names each field that differs with both values, so the operator sees
// which leg (seed, algorithm, template, binding, …) to fix rather than two digests.
func CoversProfile(certs []*Certificate, p Profile, id Identity, now time.Time) (*Certificate, []Coverage, string) {
	digest := p.Digest()
	c, got, why := CoversAny(certs, digest, id, now)
	if got != nil {
		return c, got, why
	}
	for _, c := range certs {
		if c.ProfileDigest == digest {
			continue
		}
		if _, w := c.Covers(digest, id, now); w == why {
			if d := ProfileDiff(c.Profile, p); len(d) > 0 {
				why = fmt.Sprintf("certificate profile %s differs from the rule's staged profile %s in %s; re-run ctk certify for this rule's profile, or change the rule to match the certificate",
					short(c.ProfileDigest), short(digest), strings.Join(d, "; "))
			}
			break
		}
	}
	return nil, nil, why
}

// ProfileDiff lists each field of the rule's profile that differs from the certificate's, with
// both values ("" entries shown as "none").
func ProfileDiff(cert, rule Profile) []string {
	var out []string
	field := func(name, c, r string) {
		if c != r {
			if c == "" {
				c = "none"
			}
			if r == "" {
				r = "none"
			}
			out = append(out, fmt.Sprintf("%s: certificate %q, rule %q", name, c, r))
		}
	}
	field("family", cert.Family, rule.Family)
	field("contract", cert.Contract, rule.Contract)
	field("model", cert.Model, rule.Model)
	field("tokenizer.json sha256", cert.TokenizerSHA256, rule.TokenizerSHA256)
	field("tokenizer_config.json sha256", cert.ConfigSHA256, rule.ConfigSHA256)
	field("chat template sha256", cert.TemplateSHA256, rule.TemplateSHA256)
	field("block size", strconv.Itoa(cert.BlockSize), strconv.Itoa(rule.BlockSize))
	field("binding", cert.Binding, rule.Binding)
	field("hash algorithm", cert.Algorithm, rule.Algorithm)
	field("seed fingerprint", cert.SeedFingerprint, rule.SeedFingerprint)
	field("router keys", cert.RouterKeys, rule.RouterKeys)
	return out
}
