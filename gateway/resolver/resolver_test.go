package resolver

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/route"
	"github.com/kvexact/kvexact/gateway/rules"
)

// router builds a real router for a one-endpoint vLLM rule serving models (none: a wildcard rule).
func router(t *testing.T, name string, models []string, adapters ...string) *route.Router {
	t.Helper()
	r := &rules.Rule{Name: name, Engine: rules.EngineRef{Family: "vllm", Release: "v0.25.1"}, Models: models,
		Endpoints: []rules.Endpoint{{Name: name + "-0", Address: "http://127.0.0.1:1"}}}
	for _, a := range adapters {
		r.Adapters = append(r.Adapters, rules.Adapter{Name: a, Base: models[0]})
	}
	if err := r.Normalize(); err != nil {
		t.Fatal(err)
	}
	inv := inventory.New(inventory.Config{})
	id, err := inv.AddEndpoint(r.Endpoints[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := route.New(route.Config{Rule: r, Endpoints: []*route.Endpoint{{ID: id, Name: r.Endpoints[0].Name, Address: r.Endpoints[0].Address, Capacity: 1}}, Index: inv})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func TestTable(t *testing.T) {
	var tb Table // the zero table is empty
	if _, err := tb.Resolve("l1", "x"); err == nil {
		t.Fatal("empty table resolved a model")
	}
	a, b, w := router(t, "b-rule", []string{"x", "y"}, "x-lora"), router(t, "a-rule", []string{"z"}), router(t, "wild", nil)
	tb.Set("l1", a)
	tb.Set("l1", b)
	tb.Set("l2", w)
	for _, c := range []struct {
		listener, model string
		want            *route.Router
	}{{"l1", "x", a}, {"l1", "y", a}, {"l1", "x-lora", a}, {"l1", "z", b}, {"l2", "anything", w}, {"l2", "", w}} {
		if got, err := tb.Resolve(c.listener, c.model); err != nil || got != c.want {
			t.Errorf("Resolve(%s, %s) = %v, %v", c.listener, c.model, got, err)
		}
	}
	_, err := tb.Resolve("l1", "nope")
	var ue *UnknownModelError
	if !errors.As(err, &ue) || ue.Listener != "l1" || ue.Model != "nope" || !slices.Equal(ue.Served, []string{"x", "y", "z"}) {
		t.Fatalf("Resolve(l1, nope) error = %#v", err)
	}
	if got, want := err.Error(), `the model "nope" does not exist; this listener serves x, y, z`; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	_, err = tb.Resolve("l3", "nope")
	if got, want := err.Error(), `the model "nope" does not exist on this gateway`; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	if got := tb.Routers("l1"); !slices.Equal(got, []*route.Router{b, a}) { // by rule name
		t.Errorf("Routers(l1) = %v", got)
	}

	// A rule's new router replaces its old one, on its (possibly new) listener.
	a2 := router(t, "b-rule", []string{"x"})
	tb.Set("l2", a2)
	if got, _ := tb.Resolve("l2", "x"); got != a2 {
		t.Errorf("after Set: Resolve(l2, x) = %v", got)
	}
	if _, err := tb.Resolve("l1", "x"); err == nil {
		t.Error("the rule still serves its old listener")
	}
	tb.Remove("wild")
	if _, err := tb.Resolve("l2", "anything"); err == nil {
		t.Error("a removed wildcard rule still serves")
	}
	tb.Clear()
	if got := tb.Routers("l1"); len(got) != 0 {
		t.Errorf("after Clear: Routers(l1) = %v", got)
	}
}
