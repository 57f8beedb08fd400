package vllm

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvexact/kvexact/engines"
)

// benchPayload is one v0.25.1 batch: a BlockStored of nb chained blocks (block size 16, vocab-range
// token ids, 64-bit hashes) as the GPU block pool publishes it.
func benchPayload(nb int, layout Layout) []byte {
	r := rand.New(rand.NewPCG(7, 7))
	e := engines.Event{Kind: engines.BlockStored, BlockSize: 16, Medium: "GPU", HasGroupIdx: true,
		SpecKind: "full_attention", HasExtraKeys: true, Parent: r.Uint64(), HasParent: true}
	for i := 0; i < nb; i++ {
		e.BlockHashes = append(e.BlockHashes, r.Uint64())
		e.ExtraKeys = append(e.ExtraKeys, nil)
		for j := 0; j < 16; j++ {
			e.TokenIDs = append(e.TokenIDs, uint32(r.IntN(151000)))
		}
	}
	p, err := EncodeBatch(engines.Batch{Timestamp: 1752345678.25, Events: []engines.Event{e}, HasDPRank: true}, layout)
	if err != nil {
		panic(err)
	}
	return p
}

func BenchmarkDecodeVLLM(b *testing.B) {
	for _, nb := range []int{16, 256} {
		for _, layout := range []Layout{LayoutMap, LayoutArraySpecKind} {
			p := benchPayload(nb, layout)
			b.Run(fmt.Sprintf("blocks=%d/%v/into", nb, layout), func(b *testing.B) {
				var dst engines.Batch
				b.SetBytes(int64(len(p)))
				b.ReportAllocs()
				for b.Loop() {
					if err := DecodeBatchInto(&dst, p); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(nb)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
			})
		}
		p := benchPayload(nb, LayoutMap)
		b.Run(fmt.Sprintf("blocks=%d/map-v0.24/fresh", nb), func(b *testing.B) {
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeBatch(p); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(nb)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
		// Baseline in the same run: the generic reflective decoder into []any.
		b.Run(fmt.Sprintf("blocks=%d/map-v0.24/baseline-msgpack-any", nb), func(b *testing.B) {
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				var v []any
				if err := msgpack.Unmarshal(p, &v); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(nb)*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

func BenchmarkEncodeVLLM(b *testing.B) {
	p := benchPayload(256, LayoutMap)
	batch, err := DecodeBatch(p)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, len(p))
	b.ReportAllocs()
	for b.Loop() {
		if buf, err = AppendBatch(buf[:0], &batch, LayoutMap); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(256*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}
