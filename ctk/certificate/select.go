package certificate

import "time"

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
