package inventory

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// The benchmarks compare the index with the naive map index (naive_test.go) in the same run.
// Run them with -cpu 1; BenchmarkMemory with -benchtime 1x (see docs/benchmarks/inventory.md).

// splitmix gives distinct, well-spread keys, like engine block hashes.
type splitmix uint64

func (s *splitmix) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

type impl interface {
	store(EndpointID, []uint64)
	remove(EndpointID, []uint64)
	score([]uint64, Mask, []Score) []Score
}

type indexImpl struct{ *Index }

func (x indexImpl) store(ep EndpointID, k []uint64)  { _ = x.Store(ep, k) }
func (x indexImpl) remove(ep EndpointID, k []uint64) { _ = x.Remove(ep, k) }
func (x indexImpl) score(k []uint64, m Mask, out []Score) []Score {
	return x.Score(k, m, out)
}

func newImpl(b *testing.B, name string, eps int) impl {
	if name == "naive" {
		return newNaive(0)
	}
	ix := New(Config{})
	addEndpoints(b, ix, eps)
	return indexImpl{ix}
}

// fill stores n distinct keys spread over eps endpoints in batches of 256, one endpoint per key.
func fill(x impl, n, eps int, seed splitmix) {
	batch := make([]uint64, 0, 256)
	for i := 0; i < n; i += 256 {
		batch = batch[:0]
		for j := i; j < min(n, i+256); j++ {
			batch = append(batch, seed.next())
		}
		x.store(EndpointID(i/256%eps), batch)
	}
}

// BenchmarkStoreRemove measures steady-state ingest at 1M resident keys (8 endpoints × 128Ki):
// every iteration, one endpoint evicts its oldest batch and stores a batch of new keys, as an
// engine with a full cache does. blockops/s counts each stored and removed key per wall second;
// blockops/cpu-s per second of process CPU time (GC included), which a loaded machine distorts less.
func BenchmarkStoreRemove(b *testing.B) {
	for _, name := range []string{"index", "naive"} {
		for _, size := range []int{16, 256} {
			b.Run(fmt.Sprintf("%s/batch=%d", name, size), func(b *testing.B) {
				const eps = 8
				x := newImpl(b, name, eps)
				perEP := (1 << 20) / eps / size
				var rng splitmix = 99
				queues := make([][][]uint64, eps) // per endpoint, oldest batch first
				for q := 0; q < perEP; q++ {
					for ep := range eps {
						batch := make([]uint64, size)
						for j := range batch {
							batch[j] = rng.next()
						}
						x.store(EndpointID(ep), batch)
						queues[ep] = append(queues[ep], batch)
					}
				}
				heads := make([]int, eps)
				cpu0 := cpuTime()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					ep := i % eps
					batch := queues[ep][heads[ep]]
					heads[ep] = (heads[ep] + 1) % perEP
					x.remove(EndpointID(ep), batch)
					for j := range batch {
						batch[j] = rng.next()
					}
					x.store(EndpointID(ep), batch)
				}
				b.StopTimer()
				ops := float64(2*size) * float64(b.N)
				b.ReportMetric(ops/b.Elapsed().Seconds(), "blockops/s")
				b.ReportMetric(ops/(cpuTime()-cpu0).Seconds(), "blockops/cpu-s")
			})
		}
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkScore scores a 512-key prompt over 16 candidates. Endpoint e holds the prompt's first
// 32·e keys plus every seventh key, and the table holds `table` other keys.
func BenchmarkScore(b *testing.B) {
	for _, name := range []string{"index", "naive"} {
		for _, table := range []int{10_000, 1 << 20} {
			b.Run(fmt.Sprintf("%s/table=%d", name, table), func(b *testing.B) {
				x := newImpl(b, name, 16)
				fill(x, table, 16, 7)
				var rng splitmix = 3
				prompt := make([]uint64, 512)
				for i := range prompt {
					prompt[i] = rng.next()
				}
				var mask Mask
				for e := range 16 {
					id := EndpointID(e)
					mask.Set(id)
					held := append([]uint64(nil), prompt[:32*e]...)
					for i := 32 * e; i < len(prompt); i += 7 {
						held = append(held, prompt[i])
					}
					x.store(id, held)
				}
				out := x.score(prompt, mask, nil)
				if out[15].Prefix != 481 || out[0].Prefix != 1 {
					b.Fatalf("endpoint 15 prefix %d", out[15].Prefix)
				}
				cpu0 := cpuTime()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					out = x.score(prompt, mask, out)
				}
				b.StopTimer()
				b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			})
		}
	}
}

// BenchmarkMemory measures the heap cost of keys distinct keys spread over 8 endpoints, each
// resident on one endpoint: heap in use (and live bytes) after minus before, over keys. The
// index's FIFO is always kept, so it is included. Run with -benchtime 1x.
func BenchmarkMemory(b *testing.B) {
	for _, tc := range []struct {
		name string
		keys int
	}{{"index", 1 << 20}, {"index", 10_000_000}, {"naive", 1 << 20}} {
		b.Run(fmt.Sprintf("%s/keys=%d", tc.name, tc.keys), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				before := heap()
				x := newImpl(b, tc.name, 8)
				fill(x, tc.keys, 8, splitmix(i))
				after := heap()
				b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/float64(tc.keys), "inuse-B/key")
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(tc.keys), "alloc-B/key")
				if ix, ok := x.(indexImpl); ok && ix.Stats().Resident != int64(tc.keys) {
					b.Fatalf("resident %d", ix.Stats().Resident)
				}
				runtime.KeepAlive(x)
			}
		})
	}
}

func heap() runtime.MemStats {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m
}
