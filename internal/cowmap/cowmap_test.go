package cowmap

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

func TestLoadOrCreateOncePerKey(t *testing.T) {
	var m Map[string, int]
	if _, ok := m.Load("a"); ok {
		t.Fatal("an empty map found a key")
	}
	var made atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				k := fmt.Sprint(j % 10)
				v := m.LoadOrCreate(k, func(k string) int { made.Add(1); return len(k) + 100 })
				if v != 101 {
					t.Errorf("value %d for %q", v, k)
					return
				}
			}
		}()
	}
	wg.Wait()
	if made.Load() != 10 {
		t.Fatalf("created %d values for 10 keys", made.Load())
	}
	m.DeleteFunc(func(k string, _ int) bool { return k < "5" })
	for j := 0; j < 10; j++ {
		_, ok := m.Load(fmt.Sprint(j))
		if ok != (j >= 5) {
			t.Fatalf("key %d present=%v after deleting keys below 5", j, ok)
		}
	}
}

func BenchmarkLoad(b *testing.B) {
	type key struct{ a, b string }
	var m Map[key, int]
	var s sync.Map
	for _, k := range []key{{"r1", "selector"}, {"r1", "kv_exact"}, {"r2", "selector"}} {
		m.LoadOrCreate(k, func(key) int { return 1 })
		s.Store(k, 1)
	}
	k := key{"r1", "selector"}
	b.Run("cowmap", func(b *testing.B) {
		for b.Loop() {
			m.Load(k)
		}
	})
	b.Run("sync.Map", func(b *testing.B) {
		for b.Loop() {
			s.Load(k)
		}
	})
}
