package epp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/route"
)

// pick is one decided request: the router's decision and what the data plane is told.
type pick struct {
	router *route.Router
	d      *route.Decision
	// dest is the endpoint Envoy sends the request to: the decision's target, or for a P/D decision
	// its decode endpoint (whose sidecar runs the prefill leg on prefill).
	dest *route.Endpoint
	// list is dest's address followed by the fallbacks, "ip:port" each.
	list    []string
	prefill string // "ip:port" of a P/D decision's prefill endpoint
	// rankHeader and rank, when the decision pins a data-parallel rank of dest (not in P/D: the
	// header would reach the decode endpoint), are the header the engine reads it from and its value.
	rankHeader string
	rank       int
	byAddr     map[string]*route.Endpoint
}

// decide parses the request, resolves its rule and routes it, honouring the subset hint.
func (s *Server) decide(ctx context.Context, hr *http.Request, body []byte, subset []string, hasSubset bool) (*pick, *apierror.Error) {
	var req *route.Request
	var router *route.Router
	if body == nil {
		// A request without a body (GET /v1/models, say) has no model: the listener's only rule
		// serves it, through its selector.
		rs := s.cfg.Routes.Routers(s.cfg.Listener)
		if len(rs) != 1 {
			return nil, invalid(http.StatusBadRequest, "missing_body", "a request without a body cannot be routed: %d rules serve this picker, and only the body's model chooses between them", len(rs))
		}
		router, req = rs[0], &route.Request{}
	} else {
		var err error
		if req, err = s.cfg.Parse(hr, body); err != nil {
			// The proxy's parse errors carry the status the standalone gateway answers (400, 415).
			code := http.StatusBadRequest
			var se interface{ StatusCode() int }
			if errors.As(err, &se) && se.StatusCode() >= 400 && se.StatusCode() < 500 {
				code = se.StatusCode()
			}
			return nil, invalid(code, "invalid_request", "%v", err)
		}
		if router, err = s.cfg.Routes.Resolve(s.cfg.Listener, req.Model); err != nil {
			return nil, invalid(http.StatusNotFound, "model_not_found", "%v", err)
		}
	}
	if e := s.surface(router, hr); e != nil {
		return nil, e
	}
	p := &pick{router: router, byAddr: map[string]*route.Endpoint{}}
	var outside inventory.Mask // endpoints the subset hint leaves out (prefill endpoints are never Envoy's destination)
	inSubset := 0
	for _, e := range router.Endpoints() {
		a, err := HostPort(e)
		if err != nil {
			return nil, unavailable(http.StatusInternalServerError, "bad_endpoint_address", "%v", err)
		}
		p.byAddr[a] = e
		if e.Role == route.RolePrefill {
			// The prefill leg is the decode endpoint's sidecar's: no rank header reaches it.
			req.RanksUnpinned = true
		}
		if !hasSubset || e.Role == route.RolePrefill {
			continue
		}
		if slices.Contains(subset, a) {
			inSubset++
		} else {
			outside.Set(e.ID)
		}
	}
	if hasSubset && inSubset == 0 {
		return nil, unavailable(http.StatusServiceUnavailable, "subset_empty", "none of the %d endpoints of the subset hint belongs to rule %q", len(subset), router.Rule().Name)
	}
	d, err := router.Route(ctx, req, outside)
	if err != nil {
		return nil, routeError(err)
	}
	p.d = d
	if hasSubset {
		// The router sees the subset's exclusions as a retry mask; the evidence says what they are.
		for i, ev := range d.Endpoints {
			if e := byName(router, ev.Name); e != nil && outside.Has(e.ID) {
				d.Endpoints[i].Excluded = "outside_subset_hint"
			}
		}
	}
	p.dest = d.Target
	if d.Decode != nil {
		p.dest = d.Decode
		if p.prefill, err = HostPort(d.Target); err != nil {
			d.Release()
			return nil, unavailable(http.StatusInternalServerError, "bad_endpoint_address", "%v", err)
		}
	}
	if d.Decode == nil && d.Rank != nil && d.Target.RankHeader != "" {
		p.rankHeader, p.rank = d.Target.RankHeader, *d.Rank
	}
	a, err := HostPort(p.dest)
	if err != nil {
		d.Release()
		return nil, unavailable(http.StatusInternalServerError, "bad_endpoint_address", "%v", err)
	}
	p.list = append(p.list, a)
	p.list = append(p.list, s.fallbacks(p, outside)...)
	return p, nil
}

// fallbacks lists, after the destination, the endpoints of its role that health does not exclude
// and the subset hint allows, best first: deepest cached prefix of the decision's evidence, then
// least load, then configuration order. Envoy tries them in order when the destination fails.
func (s *Server) fallbacks(p *pick, outside inventory.Mask) []string {
	if s.cfg.Fallbacks == 0 {
		return nil
	}
	score := map[string]int{}
	for _, ev := range p.d.Endpoints {
		if p.router.Rule().Scoring == "prefix" {
			score[ev.Name] = ev.Prefix
		} else {
			score[ev.Name] = ev.Overlap
		}
	}
	var cands []*route.Endpoint
	for _, e := range p.router.Endpoints() {
		if e == p.dest || e.Role != p.dest.Role || outside.Has(e.ID) {
			continue
		}
		if e.Health != nil && e.Health.Excluded() != health.NotExcluded {
			continue
		}
		if p.rankHeader != "" && max(e.DPRanks, 1) <= p.rank {
			continue // the rank header reaches the fallbacks too: the engine refuses a rank it lacks
		}
		cands = append(cands, e)
	}
	slices.SortStableFunc(cands, func(a, b *route.Endpoint) int {
		if d := score[b.Name] - score[a.Name]; d != 0 {
			return d
		}
		if d := a.Load() - b.Load(); d != 0 {
			return d
		}
		return a.Index - b.Index
	})
	var out []string
	for _, e := range cands {
		if len(out) == s.cfg.Fallbacks {
			break
		}
		if a, err := HostPort(e); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// evidence is the decision as compact JSON, exactly as the standalone proxy's debug header.
func (p *pick) evidence() string {
	b, err := json.Marshal(p.d)
	if err != nil {
		return ""
	}
	return string(b)
}

func byName(rt *route.Router, name string) *route.Endpoint {
	for _, e := range rt.Endpoints() {
		if e.Name == name {
			return e
		}
	}
	return nil
}
