// Package cowmap is a copy-on-write map for lookups on the request path that almost never miss:
// a read is an atomic pointer load and a typed map index (no lock, no interface hashing, which is
// what sync.Map costs with struct keys); a write copies the map under a mutex.
package cowmap

import (
	"sync"
	"sync/atomic"
)

// Map maps K to V. The zero Map is empty and ready to use; it must not be copied after first use.
type Map[K comparable, V any] struct {
	m  atomic.Pointer[map[K]V]
	mu sync.Mutex // serializes writers
}

// Load returns the value stored for k.
func (c *Map[K, V]) Load(k K) (V, bool) {
	if m := c.m.Load(); m != nil {
		v, ok := (*m)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// LoadOrCreate returns the value stored for k, storing create(k) first if there is none. create
// runs at most once per missing key, under the writers' lock.
func (c *Map[K, V]) LoadOrCreate(k K, create func(K) V) V {
	if v, ok := c.Load(k); ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.Load(k); ok {
		return v
	}
	v := create(k)
	c.write(func(m map[K]V) { m[k] = v })
	return v
}

// Range calls f for every entry of one snapshot of the map.
func (c *Map[K, V]) Range(f func(K, V)) {
	if m := c.m.Load(); m != nil {
		for k, v := range *m {
			f(k, v)
		}
	}
}

// DeleteFunc deletes the entries del reports true for.
func (c *Map[K, V]) DeleteFunc(del func(K, V) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.write(func(m map[K]V) {
		for k, v := range m {
			if del(k, v) {
				delete(m, k)
			}
		}
	})
}

// write applies edit to a copy of the map and publishes it; c.mu is held.
func (c *Map[K, V]) write(edit func(map[K]V)) {
	old := c.m.Load()
	n := 1
	if old != nil {
		n += len(*old)
	}
	m := make(map[K]V, n)
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	edit(m)
	c.m.Store(&m)
}
