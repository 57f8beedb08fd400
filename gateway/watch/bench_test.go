package watch

import (
	"testing"
	"time"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/hashcore"
)

// BenchmarkCheckedBlock is the watch's CPU per block it checks: root events of 16 blocks (vLLM
// sha256 pickle, the default, and sha256_cbor), every event checked, keys matching.
func BenchmarkCheckedBlock(b *testing.B) {
	for _, algo := range []hashcore.Algorithm{hashcore.VLLMSHA256, hashcore.VLLMSHA256CBOR} {
		b.Run(string(algo), func(b *testing.B) {
			h := hasher(b, algo, 16, strp("0"))
			w := newWatch(b, h, Config{SampleEvery: 1})
			evs := make([]*engines.Event, 64)
			for i := range evs {
				evs[i] = stored(b, h, tokens(16*16, uint32(i*1000)), 0)
			}
			b.ReportAllocs()
			start := time.Now()
			blocks := 0
			for i := 0; b.Loop(); i++ {
				o := w.Event(evs[i%len(evs)])
				if o.Mismatch != nil || o.Checked != 16 {
					b.Fatalf("%+v", o)
				}
				blocks += o.Checked
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(blocks), "ns/block")
		})
	}
}
