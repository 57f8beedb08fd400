package rules

import (
	"testing"

	"github.com/kvexact/kvexact/contracts"
)

// TestAPISurfaceHoldsNoAdminRoute: no family's API surface (its contract's api list) reaches an
// engine admin route, and every rule forwards exactly its family's surface plus its passthrough.
func TestAPISurfaceHoldsNoAdminRoute(t *testing.T) {
	for _, c := range contracts.All() {
		for _, p := range c.API {
			for _, a := range engineAdminRoutes {
				if pathCovers(p, a) {
					t.Errorf("%s: api path %s is the engine admin route %s", c.ID, p, a)
				}
			}
		}
	}
	r := Rule{Name: "t", Engine: EngineRef{Family: "trtllm", Release: "1.2"}, Passthrough: []string{"/v1/rerank"},
		Endpoints: []Endpoint{{Address: "http://127.0.0.1:1"}}}
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{"/v1/responses": true, "/v1/rerank": true, "/v1/embeddings": false, "/kv_cache_events": false, "/v1/kv_cache_hints": false} {
		if got := r.Forwards(p); got != want {
			t.Errorf("trtllm rule forwards %s: %v, want %v", p, got, want)
		}
	}
}
