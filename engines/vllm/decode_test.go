package vllm

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/internal/mpack"
	"github.com/kvexact/kvexact/vectors"
)

type sample struct{ vectors.Sample }

// loadSamples reads every release's event samples (v0.25.1: 7, v0.28.0: 5 with the v0.26+ fields)
// through the one sample loader.
func loadSamples(t testing.TB) []sample {
	t.Helper()
	var all []sample
	for _, rel := range []struct {
		dir string
		n   int
	}{{"v0.25.1", 7}, {"v0.28.0", 5}} {
		f, err := vectors.LoadSamples(filepath.Join("..", "..", "vectors", "vllm", rel.dir, "events-samples.json"))
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Samples) != rel.n {
			t.Fatalf("%s: %d samples, want %d", rel.dir, len(f.Samples), rel.n)
		}
		for _, s := range f.Samples {
			all = append(all, sample{s})
		}
	}
	return all
}

func (s sample) bytes(testing.TB) []byte { return s.Payload }

func (s sample) layout() Layout {
	if s.Name == "legacy_array_like_stored_first_blocks" {
		return LayoutArraySpecKind // v0.23.0's classes
	}
	return LayoutMap
}

func TestSamplesReencodeByteEqual(t *testing.T) {
	for _, s := range loadSamples(t) {
		t.Run(s.Name, func(t *testing.T) {
			p := s.bytes(t)
			b, err := DecodeBatch(p)
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Events) == 0 || !b.HasDPRank {
				t.Fatalf("decoded %+v", b)
			}
			out, err := EncodeBatch(b, s.layout())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out, s.Payload) {
				t.Fatalf("re-encoded\n got %x\nwant %x", out, s.Payload)
			}
		})
	}
}

func TestStoredFirstBlocksFields(t *testing.T) {
	s := loadSamples(t)[0]
	b, err := DecodeBatch(s.bytes(t))
	if err != nil {
		t.Fatal(err)
	}
	e := b.Events[0]
	if b.Timestamp != 1752345678.25 || b.DPRank != 0 || !b.HasDPRank {
		t.Fatalf("batch header %v %v %v", b.Timestamp, b.DPRank, b.HasDPRank)
	}
	want := []uint64{3302526995696995067, 9937998661152047377}
	if !cmp.Equal(e.BlockHashes, want) || e.HasParent || e.BlockSize != 16 || len(e.TokenIDs) != 32 ||
		e.TokenIDs[0] != 119235 || e.Medium != "GPU" || e.HasLoRAID || e.LoRAName != "" ||
		!e.HasExtraKeys || len(e.ExtraKeys) != 2 || e.ExtraKeys[0] != nil || !e.HasGroupIdx ||
		e.GroupIdx != 0 || e.SpecKind != "full_attention" || len(e.BlockTokens) != 2 ||
		e.BlockTokens[1][0] != e.TokenIDs[16] {
		t.Fatalf("event %+v", e)
	}
}

func TestBytesHashesLastEightBytes(t *testing.T) {
	ss := loadSamples(t)
	ints, _ := DecodeBatch(ss[0].bytes(t))
	raw, err := DecodeBatch(ss[5].bytes(t))
	if err != nil {
		t.Fatal(err)
	}
	if !cmp.Equal(raw.Events[0].BlockHashes, ints.Events[0].BlockHashes) {
		t.Fatalf("bytes hashes %v, int hashes %v", raw.Events[0].BlockHashes, ints.Events[0].BlockHashes)
	}
	if len(raw.Events[0].RawHashes) != 2 || len(raw.Events[0].RawHashes[0]) != 32 {
		t.Fatalf("raw %x", raw.Events[0].RawHashes)
	}
}

func TestLegacyEqualsMap(t *testing.T) {
	ss := loadSamples(t)
	m, _ := DecodeBatch(ss[0].bytes(t))
	a, err := DecodeBatch(ss[6].bytes(t))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(m, a); d != "" {
		t.Fatal(d)
	}
}

func TestTruncatedEveryOffset(t *testing.T) {
	for _, s := range loadSamples(t) {
		p := s.bytes(t)
		for n := 0; n < len(p); n++ {
			_, err := DecodeBatch(p[:n])
			var de *engines.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("%s cut at %d: %v, want *engines.DecodeError", s.Name, n, err)
			}
			if de.Reason != engines.ReasonDecodeError || de.Offset < 0 || de.Offset > n {
				t.Fatalf("%s cut at %d: %v", s.Name, n, de)
			}
		}
		if _, err := DecodeBatch(append(p, 0)); err == nil {
			t.Fatalf("%s: trailing byte accepted", s.Name)
		}
	}
}

// mutate re-encodes a one-event map batch after replacing one field's value with raw msgpack.
func mapBatch(fields ...any) []byte {
	b := mpack.AppendArrayLen(nil, 3)
	b = mpack.AppendFloat64(b, 1)
	b = mpack.AppendArrayLen(b, 1)
	b = mpack.AppendMapLen(b, len(fields)/2)
	for i := 0; i < len(fields); i += 2 {
		b = mpack.AppendStr(b, fields[i].(string))
		switch v := fields[i+1].(type) {
		case rawValue:
			b = append(b, v...)
		default:
			b, _ = mpack.AppendAny(b, v)
		}
	}
	return mpack.AppendUint(b, 0)
}

type rawValue []byte

func storedFields(override string, v any) []any {
	base := []any{
		"type", "BlockStored",
		"block_hashes", []any{uint64(1), uint64(2)},
		"parent_block_hash", nil,
		"token_ids", []any{uint64(1), uint64(2), uint64(3), uint64(4)},
		"block_size", uint64(2),
		"lora_id", nil,
		"medium", "GPU",
		"lora_name", nil,
	}
	for i := 0; i < len(base); i += 2 {
		if base[i] == override {
			base[i+1] = v
		}
	}
	return base
}

func TestWrongTypesNameTheField(t *testing.T) {
	cases := []struct {
		field  string
		value  any
		reason engines.RejectReason
		want   string
	}{
		{"block_hashes", "x", engines.ReasonSchemaMismatch, "events[0].block_hashes"},
		{"block_hashes", []any{uint64(1), "x"}, engines.ReasonSchemaMismatch, "events[0].block_hashes[1]"},
		{"block_hashes", []any{int64(-1)}, engines.ReasonSchemaMismatch, "events[0].block_hashes[0]"},
		{"parent_block_hash", "x", engines.ReasonSchemaMismatch, "events[0].parent_block_hash"},
		{"token_ids", []any{uint64(1), uint64(1) << 32}, engines.ReasonTokenRange, "events[0].token_ids[1]"},
		{"token_ids", []any{int64(-5)}, engines.ReasonTokenRange, "events[0].token_ids[0]"},
		{"token_ids", []any{"a"}, engines.ReasonSchemaMismatch, "events[0].token_ids[0]"},
		{"block_size", "16", engines.ReasonSchemaMismatch, "events[0].block_size"},
		{"lora_id", "5", engines.ReasonSchemaMismatch, "events[0].lora_id"},
		{"medium", uint64(1), engines.ReasonSchemaMismatch, "events[0].medium"},
		{"type", "BlockExploded", engines.ReasonUnknownEvent, "events[0].type"},
	}
	for _, c := range cases {
		_, err := DecodeBatch(mapBatch(storedFields(c.field, c.value)...))
		var de *engines.DecodeError
		if !errors.As(err, &de) || de.Reason != c.reason || de.Field != c.want || de.Offset <= 0 {
			t.Errorf("%s=%v: %v, want %s in %s", c.field, c.value, err, c.reason, c.want)
		}
	}
	// Missing required field.
	f := storedFields("", nil)
	_, err := DecodeBatch(mapBatch(append(f[:6:6], f[8:]...)...)) // drop token_ids
	var de *engines.DecodeError
	if !errors.As(err, &de) || de.Field != "events[0].token_ids" || de.Reason != engines.ReasonSchemaMismatch {
		t.Errorf("missing token_ids: %v", err)
	}
	// Unknown keys are ignored, the tag need not come first.
	f = storedFields("", nil)
	f = append(f[2:], "type", "BlockStored", "future_field", []any{"x", uint64(1)})
	b, err := DecodeBatch(mapBatch(f...))
	if err != nil || len(b.Events[0].BlockTokens) != 2 {
		t.Errorf("unknown key / late tag: %v %+v", err, b)
	}
}

func TestAnyIntegerWidth(t *testing.T) {
	for _, raw := range []rawValue{{0x05}, {0xcc, 0x05}, {0xcd, 0, 5}, {0xce, 0, 0, 0, 5}, {0xcf, 0, 0, 0, 0, 0, 0, 0, 5}, {0xd3, 0, 0, 0, 0, 0, 0, 0, 5}} {
		f := storedFields("block_hashes", rawValue(append([]byte{0x91}, raw...)))
		b, err := DecodeBatch(mapBatch(f...))
		if err != nil || b.Events[0].BlockHashes[0] != 5 {
			t.Errorf("%x: %v %v", raw, err, b)
		}
	}
}

func TestLayoutForRelease(t *testing.T) {
	for tag, want := range map[string]Layout{
		"v0.25.1": LayoutMap, "v0.24.0": LayoutMap, "0.26.0rc1": LayoutMap, "v0.23.1": LayoutArraySpecKind,
		"v0.22.0": LayoutArraySpecKind, "v0.21.0": LayoutArrayGroupIdx, "v0.20.0": LayoutArrayGroupIdx,
		"v0.19.0": LayoutArrayExtraKeys, "v0.17.0": LayoutArrayExtraKeys, "v0.16.0": LayoutArrayLoRAName,
		"v0.14.0": LayoutArrayLoRAName, "v0.13.0": LayoutArrayMedium, "v0.11.0.post1": LayoutArrayMedium,
		"v0.10.2": LayoutArrayMedium,
	} {
		if got, err := LayoutForRelease(tag); err != nil || got != want {
			t.Errorf("%s: %v %v, want %v", tag, got, err, want)
		}
	}
	for _, tag := range []string{"v0.10.1.1", "v0.9.2", "v0.8.5", "latest", ""} {
		if _, err := LayoutForRelease(tag); err == nil {
			t.Errorf("%s accepted", tag)
		}
	}
}

// randomBatch builds a batch the given layout can carry in full.
func randomBatch(r *rand.Rand, layout Layout) engines.Batch {
	b := engines.Batch{Timestamp: r.Float64() * 2e9, HasDPRank: r.IntN(4) > 0}
	if b.HasDPRank {
		b.DPRank = r.IntN(8)
	}
	for n := r.IntN(5); n > 0; n-- {
		e := engines.Event{Kind: engines.Kind(1 + r.IntN(3))}
		if e.Kind == engines.AllBlocksCleared {
			b.Events = append(b.Events, e)
			continue
		}
		nb := r.IntN(4)
		bytesMode := r.IntN(4) == 0
		for j := 0; j < nb; j++ {
			h := r.Uint64() >> (r.IntN(64))
			e.BlockHashes = append(e.BlockHashes, h)
			if bytesMode {
				raw := make([]byte, 32)
				for k := range raw {
					raw[k] = byte(r.IntN(256))
				}
				e.RawHashes = append(e.RawHashes, raw)
				e.BlockHashes[j] = hash64(raw)
			}
		}
		if r.IntN(2) == 0 {
			e.Medium = []string{"GPU", "CPU", "cpu"}[r.IntN(3)]
		}
		if layout >= LayoutArrayGroupIdx && r.IntN(2) == 0 {
			e.GroupIdx, e.HasGroupIdx = r.IntN(3), true
		}
		if e.Kind == engines.BlockStored {
			if r.IntN(2) == 0 {
				e.Parent, e.HasParent = r.Uint64(), true
			}
			e.BlockSize = 1 + r.IntN(4)
			for j := 0; j < nb*e.BlockSize+r.IntN(2); j++ {
				e.TokenIDs = append(e.TokenIDs, r.Uint32()>>r.IntN(32))
			}
			if r.IntN(2) == 0 {
				e.LoRAID, e.HasLoRAID = int64(r.IntN(100))-3, true
			}
			if layout >= LayoutArrayLoRAName && r.IntN(2) == 0 {
				e.LoRAName = "lora-ü"
			}
			if layout >= LayoutArrayExtraKeys && r.IntN(2) == 0 {
				e.HasExtraKeys = true
				for j := 0; j < nb; j++ {
					if r.IntN(2) == 0 {
						e.ExtraKeys = append(e.ExtraKeys, nil)
					} else {
						e.ExtraKeys = append(e.ExtraKeys, []any{"name", []any{"mm", int64(-r.IntN(70) - 1)}, []any{"mm", uint64(r.IntN(70))}, []byte{1, 2}})
					}
				}
			}
			if layout >= LayoutArraySpecKind && r.IntN(2) == 0 {
				e.SpecKind = "sliding_window"
				e.SlidingWin = 4096
			}
			splitBlocks(&e)
		}
		b.Events = append(b.Events, e)
	}
	return b
}

func TestRoundTripRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	opts := cmpopts.EquateEmpty()
	for _, layout := range []Layout{LayoutArrayMedium, LayoutArrayLoRAName, LayoutArrayExtraKeys, LayoutArrayGroupIdx, LayoutArraySpecKind, LayoutMap} {
		var into engines.Batch
		for i := 0; i < 300; i++ {
			b := randomBatch(r, layout)
			p, err := EncodeBatch(b, layout)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeBatch(p)
			if err != nil {
				t.Fatalf("%v: %v\n%+v\n%x", layout, err, b, p)
			}
			if d := cmp.Diff(b, got, opts); d != "" {
				t.Fatalf("%v round trip (-sent +decoded):\n%s", layout, d)
			}
			if err := DecodeBatchInto(&into, p); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(b, into, opts); d != "" {
				t.Fatalf("%v DecodeBatchInto (-sent +decoded):\n%s", layout, d)
			}
		}
	}
}

func FuzzDecodeVLLM(f *testing.F) {
	for _, s := range loadSamples(f) {
		f.Add(s.bytes(f))
	}
	// A real engine's offloading-connector batches (host stores and evictions, medium CPU).
	off, err := vectors.LoadSamples(filepath.Join("..", "..", "vectors", "vllm", "v0.31.0", "offload-samples.json"))
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range off.Samples {
		f.Add(s.Payload)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := DecodeBatch(p)
		if err != nil {
			var de *engines.DecodeError
			if !errors.As(err, &de) || de.Offset > len(p) {
				t.Fatalf("untyped or out-of-range error %v", err)
			}
			return
		}
		// Whatever decodes re-encodes in the map layout and decodes to the same batch.
		out, err := EncodeBatch(b, LayoutMap)
		if err != nil {
			t.Fatalf("encode of a decoded batch: %v", err)
		}
		b2, err := DecodeBatch(out)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if d := cmp.Diff(b, b2, cmpopts.EquateEmpty(), cmpopts.EquateNaNs()); d != "" {
			t.Fatalf("unstable:\n%s", d)
		}
	})
}

// TestLookaheadStoreRefused: a v0.33+ store whose hashes cover lookahead tokens (EAGLE block drop) is
// refused naming the field; the field at nil (lookahead hashing off) reads as any other store, and
// a following field still decodes.
func TestLookaheadStoreRefused(t *testing.T) {
	f := append(storedFields("", nil), "lookahead_token_ids", []any{[]any{uint64(7)}, []any{uint64(8)}})
	_, err := DecodeBatch(mapBatch(f...))
	var de *engines.DecodeError
	if !errors.As(err, &de) || de.Reason != engines.ReasonSchemaMismatch || de.Field != "events[0].lookahead_token_ids" || de.Offset <= 0 {
		t.Fatalf("lookahead store: %v", err)
	}
	f = append(storedFields("", nil), "lookahead_token_ids", nil, "group_idx", uint64(3))
	b, err := DecodeBatch(mapBatch(f...))
	if err != nil || len(b.Events) != 1 || !b.Events[0].HasGroupIdx || b.Events[0].GroupIdx != 3 {
		t.Fatalf("lookahead nil: %v %+v", err, b)
	}
}
