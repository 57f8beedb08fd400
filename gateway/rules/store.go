package rules

import (
	"encoding/json"
	"fmt"
	"sort"
	"sync"
)

// Store is the live rule set. Readers get immutable snapshots; writers validate a copy and swap it
// in, so a rejected change mutates nothing. Watchers hear about every accepted change, in order.
type Store struct {
	mu       sync.Mutex
	listen   string
	rules    map[string]*Rule
	gen      uint64
	watchers []func(Change)
}

// Change is one accepted mutation: Old is nil on create, New is nil on delete.
type Change struct {
	Generation uint64
	Old, New   *Rule
}

// NewStore builds a store from an already validated configuration.
func NewStore(c *Config) *Store {
	s := &Store{listen: c.Listen, rules: map[string]*Rule{}}
	for i := range c.Rules {
		r := c.Rules[i].Clone()
		s.rules[r.Name] = r
	}
	return s
}

// Watch registers fn for every later change. Callbacks run with the store's lock held, so they must
// not call back into the store.
func (s *Store) Watch(fn func(Change)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchers = append(s.watchers, fn)
}

// List returns copies of all rules, sorted by name.
func (s *Store) List() []*Rule {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Rule, 0, len(s.rules))
	for _, r := range s.rules {
		out = append(out, r.Clone())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Get returns a copy of the named rule.
func (s *Store) Get(name string) (*Rule, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rules[name]
	if !ok {
		return nil, false
	}
	return r.Clone(), true
}

// Put creates or replaces a rule. The rule is validated (with defaults filled) on a copy, then checked
// against the others for listener/model overlap; on any error the store is unchanged.
func (s *Store) Put(in *Rule) (*Rule, error) {
	r := in.Clone()
	if err := r.Normalize(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.rules[r.Name]
	if old != nil && (old.Engine.Family != r.Engine.Family) {
		return nil, fieldErr("engine.family", "cannot change from %q to %q on a live rule; delete and recreate it", old.Engine.Family, r.Engine.Family)
	}
	all := make([]Rule, 0, len(s.rules)+1)
	for name, x := range s.rules {
		if name != r.Name {
			all = append(all, *x)
		}
	}
	all = append(all, *r)
	if err := CheckOverlap(s.listen, all); err != nil {
		return nil, err
	}
	s.rules[r.Name] = r
	s.gen++
	ch := Change{Generation: s.gen, Old: old, New: r}
	for _, w := range s.watchers {
		w(ch)
	}
	return r.Clone(), nil
}

// Delete removes a rule.
func (s *Store) Delete(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.rules[name]
	if !ok {
		return fmt.Errorf("rule %q does not exist", name)
	}
	delete(s.rules, name)
	s.gen++
	ch := Change{Generation: s.gen, Old: old}
	for _, w := range s.watchers {
		w(ch)
	}
	return nil
}

// Generation counts accepted changes.
func (s *Store) Generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// Clone deep-copies a rule (through its JSON form, which carries every field but secrets — rules
// hold none).
func (r *Rule) Clone() *Rule {
	b, err := json.Marshal(r)
	if err != nil {
		panic(fmt.Sprintf("rules: clone: %v", err))
	}
	var c Rule
	if err := json.Unmarshal(b, &c); err != nil {
		panic(fmt.Sprintf("rules: clone: %v", err))
	}
	return &c
}
