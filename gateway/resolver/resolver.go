// Package resolver owns the table that says which rule's router serves a model on a client
// listener, and the one error for "no rule serves this model". The gateway writes the table as it
// applies and removes rules; the front ends — the proxy, the Endpoint Picker, the admin API's
// explain — read it per request and never call back into the gateway. Reads are lock-free: a
// write replaces an immutable snapshot.
package resolver

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/kvexact/kvexact/gateway/route"
)

// UnknownModelError says no rule on the listener serves the model: a client's 404
// model_not_found, before any routing tier runs.
type UnknownModelError struct {
	Listener, Model string
	// Served lists the models the listener's rules name, sorted.
	Served []string
}

func (e *UnknownModelError) Error() string {
	if len(e.Served) == 0 {
		return fmt.Sprintf("the model %q does not exist on this gateway", e.Model)
	}
	return fmt.Sprintf("the model %q does not exist; this listener serves %s", e.Model, strings.Join(e.Served, ", "))
}

// Table maps (listener, model) to the router of the rule serving it. The zero Table is empty and
// ready to use.
type Table struct {
	mu    sync.Mutex // serializes writers
	rules map[string]entry
	snap  atomic.Pointer[snapshot]
}

type entry struct {
	listener string
	router   *route.Router
}

type snapshot map[string]*listenerRoutes // by listener

// listenerRoutes is one listener's rules.
type listenerRoutes struct {
	routers  []*route.Router          // by rule name
	models   map[string]*route.Router // a rule's models and declared adapters
	wildcard *route.Router            // a rule naming no model
	served   []string                 // the rules' models, sorted (for UnknownModelError)
}

// Set makes rt serve its rule's models on listener, replacing the rule's previous router (the
// rule is rt.Rule().Name).
func (t *Table) Set(listener string, rt *route.Router) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.rules == nil {
		t.rules = map[string]entry{}
	}
	t.rules[rt.Rule().Name] = entry{listener: listener, router: rt}
	t.publish()
}

// Remove drops a rule.
func (t *Table) Remove(rule string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.rules, rule)
	t.publish()
}

// Clear drops every rule.
func (t *Table) Clear() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.rules)
	t.publish()
}

func (t *Table) publish() {
	s := snapshot{}
	names := make([]string, 0, len(t.rules))
	for n := range t.rules {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		e := t.rules[n]
		l := s[e.listener]
		if l == nil {
			l = &listenerRoutes{models: map[string]*route.Router{}}
			s[e.listener] = l
		}
		l.routers = append(l.routers, e.router)
		r := e.router.Rule()
		for _, m := range r.Models {
			l.models[m] = e.router
		}
		for _, a := range r.Adapters {
			l.models[a.Name] = e.router
		}
		if len(r.Models) == 0 && len(r.Adapters) == 0 {
			l.wildcard = e.router
		}
		l.served = append(l.served, r.Models...)
	}
	for _, l := range s {
		sort.Strings(l.served)
	}
	t.snap.Store(&s)
}

func (t *Table) listener(l string) *listenerRoutes {
	if s := t.snap.Load(); s != nil {
		return (*s)[l]
	}
	return nil
}

// Resolve finds the router serving model on listener: a rule naming the model (or declaring it as
// a LoRA adapter), then one that discovered it as an adapter, then the listener's wildcard rule.
// Otherwise it returns an *UnknownModelError.
func (t *Table) Resolve(listener, model string) (*route.Router, error) {
	l := t.listener(listener)
	if l == nil {
		return nil, &UnknownModelError{Listener: listener, Model: model}
	}
	if rt := l.models[model]; rt != nil {
		return rt, nil
	}
	for _, rt := range l.routers {
		if rt.ServesAdapter(model) {
			return rt, nil
		}
	}
	if l.wildcard != nil {
		return l.wildcard, nil
	}
	return nil, &UnknownModelError{Listener: listener, Model: model, Served: slices.Clone(l.served)}
}

// Routers lists the routers of every rule on listener, by rule name. The slice is shared: callers
// must not modify it.
func (t *Table) Routers(listener string) []*route.Router {
	if l := t.listener(listener); l != nil {
		return l.routers
	}
	return nil
}
