package proxy

import (
	"net/http"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/route"
)

// resolved is the resolve step's result: the rule serving the request.
type resolved struct {
	name     string // the metrics' rule label: "none" until resolved
	rt       *route.Router
	inflight bool // counted in the rule's in-flight gauge (account.go takes it back)
}

// resolve finds the model's router.
func (c *call) resolve(model string) *apierror.Error {
	rt, err := c.p.cfg.Routes.Resolve(c.listener, model)
	if err != nil { // *resolver.UnknownModelError, the only error Resolve returns
		if model == "" {
			return badRequest("model", "missing_model", "you must provide a model parameter")
		}
		return &apierror.Error{Status: http.StatusNotFound, Type: apierror.TypeInvalid, Param: "model", Code: "model_not_found", Message: "the model `" + model + "` does not exist"}
	}
	c.rule.rt, c.rule.name = rt, rt.Rule().Name
	c.rule.inflight = true
	c.p.cfg.Metrics.inflightAdd(c.rule.name, 1)
	return nil
}
