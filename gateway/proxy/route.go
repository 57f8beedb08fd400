package proxy

import (
	"errors"
	"net/http"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/route"
)

// run is the retry loop: route, try, and on a connect failure exclude the endpoint and re-run the
// whole selection (so the second-best overlap serves), at most once per endpoint of the rule.
func (c *call) run() {
	var retry inventory.Mask
	var last error
	n := len(c.rule.rt.Endpoints())
	for i := 0; i < n; i++ {
		d, err := c.decide(i, retry)
		if err != nil {
			if c.ctx.Err() != nil {
				return
			}
			c.fail(routeError(err, last))
			return
		}
		c.d, c.tier = d, d.Tier
		failed, ferr := c.try(d)
		if failed == nil {
			if c.p.cfg.OnDecision != nil {
				c.p.cfg.OnDecision(c.r, d)
			}
			d.Release()
			return
		}
		d.Release()
		last = ferr
		retry.Set(failed.ID)
		c.p.cfg.Metrics.failover(c.rule.name, failed.Name)
		// Debug: the endpoint's health logs the state change once (unreachable, excluded, back).
		c.p.log.Debug("upstream unreachable, re-running selection without it", "rule", c.rule.name, "endpoint", failed.Name, "err", ferr, "request_id", c.id)
	}
	c.fail(apierror.Server(http.StatusServiceUnavailable, "no_healthy_endpoint", "no endpoint could be reached (last failure: %v)", last))
}

// try is one attempt at serving the request on decision d: a single request for role-less
// decisions and pass-through paths, else the rule's P/D dialect. It returns the endpoint whose
// connect failed (nil when the request was answered, well or badly) and the failure.
func (c *call) try(d *route.Decision) (*route.Endpoint, error) {
	if d.Decode == nil || c.in.body == nil {
		return c.single(d.Target)
	}
	return c.pd(d)
}

// routeError maps the router's errors to client answers.
func routeError(err error, lastConnect error) *apierror.Error {
	switch {
	case errors.Is(err, route.ErrShed):
		return &apierror.Error{Status: http.StatusTooManyRequests, Message: err.Error() + "; retry later", Type: apierror.TypeRateLimit, Code: "overloaded"}
	case errors.Is(err, route.ErrParkTimeout):
		return apierror.Server(http.StatusGatewayTimeout, "park_timeout", "%v", err)
	case errors.Is(err, route.ErrNoEndpoint) && lastConnect != nil:
		return apierror.Server(http.StatusServiceUnavailable, "no_healthy_endpoint", "no endpoint could be reached (last failure: %v)", lastConnect)
	case errors.Is(err, route.ErrNoEndpoint):
		return apierror.Server(http.StatusServiceUnavailable, "no_healthy_endpoint", "%v", err)
	}
	return apierror.Server(http.StatusInternalServerError, "routing_failed", "routing failed: %v", err)
}
