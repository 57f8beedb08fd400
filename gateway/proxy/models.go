package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvexact/kvexact/gateway/apierror"
	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/route"
)

// modelsTimeout bounds the /v1/models fan-out to a wildcard rule's endpoints.
const modelsTimeout = 5 * time.Second

// models serves /v1/models (id == "") and /v1/models/{id}: the listener's rules' configured models,
// and for wildcard rules the union of their healthy endpoints' own lists, de-duplicated by id in
// rule then endpoint order.
func (c *call) models(id string) {
	routers := c.p.cfg.Routes.Routers(c.listener)
	seen := map[string]bool{}
	var data []json.RawMessage
	add := func(mid string, entry json.RawMessage) {
		if mid != "" && !seen[mid] {
			seen[mid] = true
			data = append(data, entry)
		}
	}
	asked, answered := 0, 0
	for _, rt := range routers {
		r := rt.Rule()
		if len(r.Models) > 0 {
			for _, m := range r.Models {
				add(m, rawJSON(map[string]any{"id": m, "object": "model", "created": 0, "owned_by": "kvexact"}))
			}
			for _, a := range rt.Adapters() { // LoRA adapters (declared and discovered), with their base model as vLLM lists them
				add(a.Name, rawJSON(map[string]any{"id": a.Name, "object": "model", "created": 0, "owned_by": "kvexact", "parent": a.Base}))
			}
			continue
		}
		lists := c.fetchModels(rt)
		for _, l := range lists {
			asked++
			if l.ok {
				answered++
			}
			for _, e := range l.entries {
				add(e.id, e.raw)
			}
		}
	}
	if asked > 0 && answered == 0 && len(data) == 0 {
		c.fail(apierror.Server(http.StatusServiceUnavailable, "no_healthy_endpoint", "no endpoint answered /v1/models"))
		return
	}
	var out []byte
	if id != "" {
		for _, e := range data {
			var v struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(e, &v) == nil && v.ID == id {
				out = e
			}
		}
		if out == nil {
			c.fail(&apierror.Error{Status: http.StatusNotFound, Type: apierror.TypeInvalid, Param: "model", Code: "model_not_found", Message: "the model `" + id + "` does not exist"})
			return
		}
	} else {
		if data == nil {
			data = []json.RawMessage{}
		}
		out = rawJSON(map[string]any{"object": "list", "data": data})
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(out)))
	c.commitHeaders(http.StatusOK, h)
	_, _ = c.w.Write(out)
}

func rawJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v) // only called with plain values
	return b
}

type modelEntry struct {
	id  string
	raw json.RawMessage
}

type modelList struct {
	ok      bool
	entries []modelEntry
}

// fetchModels asks every non-excluded endpoint for its /v1/models, concurrently.
func (c *call) fetchModels(rt *route.Router) []modelList {
	eps := rt.Endpoints()
	t, err := c.p.routerTransport(rt)
	if err != nil {
		return make([]modelList, len(eps))
	}
	ctx, cancel := context.WithTimeout(c.ctx, modelsTimeout)
	defer cancel()
	out := make([]modelList, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		if ep.Health != nil && ep.Health.Excluded() != health.NotExcluded {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = c.fetchModelList(ctx, t, ep)
		}()
	}
	wg.Wait()
	return out
}

func (c *call) fetchModelList(ctx context.Context, t http.RoundTripper, ep *route.Endpoint) modelList {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep.Address+"/v1/models", nil)
	if err != nil {
		return modelList{}
	}
	req.Header.Set(HeaderRequestID, c.id)
	req.Header.Set("Accept", "application/json")
	if a := c.r.Header.Get("Authorization"); a != "" {
		req.Header.Set("Authorization", a)
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		c.p.log.Debug("/v1/models fan-out: endpoint unreachable", "endpoint", ep.Name, "err", err)
		return modelList{}
	}
	defer resp.Body.Close()
	b, whole, err := readAllLimit(resp.Body, maxLegBody)
	if err != nil || !whole || resp.StatusCode != http.StatusOK {
		return modelList{}
	}
	var v struct {
		Data []json.RawMessage `json:"data"`
	}
	if json.Unmarshal(b, &v) != nil {
		return modelList{}
	}
	l := modelList{ok: true}
	for _, e := range v.Data {
		var m struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(e, &m) == nil && m.ID != "" {
			l.entries = append(l.entries, modelEntry{id: m.ID, raw: e})
		}
	}
	return l
}
