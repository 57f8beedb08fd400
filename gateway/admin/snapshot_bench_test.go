package admin

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/metrics"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvexact/kvexact/gateway/ingest"
)

// snapshotBackend serves one prebuilt snapshot; the other Backend methods are not called.
type snapshotBackend struct {
	Backend
	s *ingest.Snapshot
}

func (b snapshotBackend) Registry() *prometheus.Registry { return prometheus.NewRegistry() }

func (b snapshotBackend) EndpointSnapshot(rule, endpoint string, w io.Writer) error {
	return b.s.Encode(w)
}

// peakWriter discards the body and samples the live heap at every write: the high-water mark of
// what serving the snapshot holds beyond the snapshot itself.
type peakWriter struct {
	h      http.Header
	sample []metrics.Sample
	peak   uint64
}

func (w *peakWriter) Header() http.Header { return w.h }
func (w *peakWriter) WriteHeader(int)     {}
func (w *peakWriter) Write(p []byte) (int, error) {
	metrics.Read(w.sample)
	w.peak = max(w.peak, w.sample[0].Value.Uint64())
	return len(p), nil
}

// BenchmarkSnapshotHandler serves a 1M-key router-binding snapshot (keys, presence, engine-id map)
// through the admin handler. peak-MB is the live heap's high-water mark during the answer above
// the heap before it (GC'd): the snapshot's own state is not counted.
func BenchmarkSnapshotHandler(b *testing.B) {
	const n = 1 << 20
	s := &ingest.Snapshot{Rule: "r", Endpoint: "e", Family: "vllm", Release: "v0.26.0", Binding: ingest.BindingRouter,
		BlockSize: 16, Ranks: []ingest.RankSeq{{Seq: 1}}, Groups: []ingest.GroupIndexed{{Group: 0, Indexed: true}}}
	for i := range uint64(n) {
		k := i*0x9e3779b97f4a7c15 | 1
		s.Keys = append(s.Keys, ingest.SnapshotKey{Key: k, Count: 1})
		s.Presence = append(s.Presence, ingest.PresenceKey{Key: k, Groups: 1})
		s.Mapped = append(s.Mapped, ingest.MappedEntry{EngineID: i, Key: k, Refs: 1, GPU: true})
	}
	h := Handler(snapshotBackend{s: s}, "t")
	var peak uint64
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		runtime.GC()
		w := &peakWriter{h: http.Header{}, sample: []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}}
		metrics.Read(w.sample)
		base := w.sample[0].Value.Uint64()
		r := httptest.NewRequest("GET", "/admin/snapshot/r/e", nil)
		r.Header.Set("Authorization", "Bearer t")
		b.StartTimer()
		h.ServeHTTP(w, r)
		if w.peak > base {
			peak = max(peak, w.peak-base)
		}
	}
	b.ReportMetric(float64(peak)/(1<<20), "peak-MB")
}
