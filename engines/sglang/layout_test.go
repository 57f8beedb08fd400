package sglang

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/internal/mpack"
	"github.com/kvexact/kvexact/vectors"
)

// The contract's wireSchema and LayoutForRelease say the same thing twice (the contract for
// certification, LayoutForRelease for the encoder the simulator uses): a release's contract that
// names one wire while layout.go gives it the other fails here.
func TestLayoutMatchesContractWireSchema(t *testing.T) {
	n := 0
	for _, c := range contracts.All() {
		if c.Family != Family.Name() {
			continue
		}
		n++
		l, err := LayoutForRelease(c.Pin.Release)
		if err != nil {
			t.Errorf("contract %s: pin %s: %v", c.ID, c.Pin.Release, err)
			continue
		}
		if l.WireSchema() != c.WireSchema {
			t.Errorf("contract %s: wireSchema %s, but LayoutForRelease(%s) = %s (%s)", c.ID, c.WireSchema, c.Pin.Release, l, l.WireSchema())
		}
	}
	if n < 2 {
		t.Fatalf("%d sglang contracts, want the array and the map pins", n)
	}
}

func TestLayoutForRelease(t *testing.T) {
	for tag, want := range map[string]Layout{"v0.5.18": LayoutArray, "0.5.6": LayoutArray, "v0.5.20": LayoutArray,
		"v0.5.21": LayoutMap, "v0.5.21.post1": LayoutMap, "0.6.0": LayoutMap} {
		if got, err := LayoutForRelease(tag); err != nil || got != want {
			t.Errorf("%s: %v %v, want %v", tag, got, err, want)
		}
	}
	if _, err := LayoutForRelease("latest"); err == nil {
		t.Error("a tag without a number was accepted")
	}
}

func loadMap(t testing.TB) *vectors.SampleFile {
	t.Helper()
	f, err := vectors.LoadSamples(filepath.Join("..", "..", "vectors", "sglang", "v0.5.21", "events-samples.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Samples) != 7 {
		t.Fatalf("%d v0.5.21 samples, want 7", len(f.Samples))
	}
	return f
}

// Every v0.5.21 sample decodes and re-encodes byte for byte in the map layout; the array encoder
// writes something else (the layouts really differ).
func TestMapSamplesReencodeByteEqual(t *testing.T) {
	for _, s := range loadMap(t).Samples {
		b, err := DecodeBatch(s.Payload)
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		out, err := EncodeBatchLayout(b, LayoutMap)
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		if !bytes.Equal(out, s.Payload) {
			t.Fatalf("%s re-encoded\n got %x\nwant %x", s.Name, out, s.Payload)
		}
		if arr, _ := EncodeBatch(b); bytes.Equal(arr, s.Payload) {
			t.Fatalf("%s: the array layout wrote the map payload", s.Name)
		}
	}
}

func TestMapSamplesFields(t *testing.T) {
	f := loadMap(t)
	get := func(name string) engines.Batch {
		s, ok := f.Sample(name)
		if !ok {
			t.Fatalf("no sample %s", name)
		}
		b, err := DecodeBatch(s.Payload)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	e := get("stored_root_prompt_coalesced").Events[0]
	first := int64(-3515930894756335561)
	if e.Kind != engines.BlockStored || e.BlockHashes[0] != uint64(first) || e.HasParent ||
		e.BlockSize != 4 || len(e.BlockTokens) != 2 || e.Medium != "GPU" || e.CacheSalt != "" || e.SessionID != "" {
		t.Fatalf("%+v", e)
	}
	s := get("stored_session_and_salt")
	if s.Events[0].SessionID != "agent-7" || !s.Events[0].HasParent || s.Events[2].CacheSalt != "tenant-a" || s.Events[2].SessionID != "agent-9" {
		t.Fatalf("%+v", s.Events)
	}
	if get("stored_salted").Events[0].CacheSalt != "tenant-a" {
		t.Fatal("cache_salt lost")
	}
	bg := get("stored_bigram_eagle_dp1")
	if !bg.Events[0].Bigram || !cmp.Equal(bg.Events[0].TokenIDs, []uint32{10, 20, 30, 40, 50}) || bg.DPRank != 1 {
		t.Fatalf("%+v", bg)
	}
	if k := get("startup_all_blocks_cleared").Events[0].Kind; k != engines.AllBlocksCleared {
		t.Fatal(k)
	}
}

func TestMapTruncatedEveryOffset(t *testing.T) {
	for _, s := range loadMap(t).Samples {
		p := s.Payload
		for n := 0; n < len(p); n++ {
			_, err := DecodeBatch(p[:n])
			var de *engines.DecodeError
			if !errors.As(err, &de) || de.Reason != engines.ReasonDecodeError || de.Offset < 0 || de.Offset > n {
				t.Fatalf("%s cut at %d: %v", s.Name, n, err)
			}
		}
	}
}

// mapBatch builds a one-event batch from ordered key/value pairs.
func mapBatch(kv ...any) []byte {
	b := mpack.AppendArrayLen(nil, 3)
	b = mpack.AppendFloat64(b, 1)
	b = mpack.AppendArrayLen(b, 1)
	b = mpack.AppendMapLen(b, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		b = mpack.AppendStr(b, kv[i].(string))
		b, _ = mpack.AppendAny(b, kv[i+1])
	}
	return mpack.AppendUint(b, 0)
}

func TestMapWrongTypesNameTheField(t *testing.T) {
	good := func() []any {
		return []any{"type", "BlockStored", "block_hashes", []any{int64(-1), uint64(2)}, "parent_block_hash", nil,
			"token_ids", []any{uint64(1), uint64(2)}, "block_size", uint64(1), "lora_id", nil, "medium", "GPU",
			"cache_salt", "s", "session_id", "x"}
	}
	set := func(key string, v any) []any {
		kv := good()
		for i := 0; i < len(kv); i += 2 {
			if kv[i] == key {
				kv[i+1] = v
			}
		}
		return kv
	}
	drop := func(key string) []any {
		kv := good()
		for i := 0; i < len(kv); i += 2 {
			if kv[i] == key {
				return append(kv[:i:i], kv[i+2:]...)
			}
		}
		return kv
	}
	cases := []struct {
		kv     []any
		reason engines.RejectReason
		field  string
	}{
		{set("block_hashes", "x"), engines.ReasonSchemaMismatch, "events[0].block_hashes"},
		{set("block_hashes", []any{int64(-1), "x"}), engines.ReasonSchemaMismatch, "events[0].block_hashes[1]"},
		{set("parent_block_hash", "x"), engines.ReasonSchemaMismatch, "events[0].parent_block_hash"},
		{set("token_ids", []any{uint64(1), int64(-2)}), engines.ReasonTokenRange, "events[0].token_ids[1]"},
		{set("block_size", "4"), engines.ReasonSchemaMismatch, "events[0].block_size"},
		{set("medium", uint64(1)), engines.ReasonSchemaMismatch, "events[0].medium"},
		{set("cache_salt", uint64(1)), engines.ReasonSchemaMismatch, "events[0].cache_salt"},
		{set("session_id", []any{}), engines.ReasonSchemaMismatch, "events[0].session_id"},
		{set("type", "BlockMoved"), engines.ReasonUnknownEvent, "events[0].type"},
		{drop("type"), engines.ReasonSchemaMismatch, "events[0].type"},
		{drop("token_ids"), engines.ReasonSchemaMismatch, "events[0].token_ids"},
		{drop("parent_block_hash"), engines.ReasonSchemaMismatch, "events[0].parent_block_hash"},
	}
	for _, c := range cases {
		p := mapBatch(c.kv...)
		_, err := DecodeBatch(p)
		var de *engines.DecodeError
		if !errors.As(err, &de) || de.Reason != c.reason || de.Field != c.field || de.Offset < 0 || de.Offset > len(p) {
			t.Errorf("%v: %v, want %s in %s", c.kv, err, c.reason, c.field)
		}
	}
	// Optional fields absent, keys in another order and keys of a later release are accepted.
	kv := drop("session_id")
	kv = append([]any{"future", []any{uint64(1), "x"}}, kv...)
	if b, err := DecodeBatch(mapBatch(kv...)); err != nil || b.Events[0].CacheSalt != "s" || b.Events[0].SessionID != "" {
		t.Errorf("reordered with an unknown key: %v %+v", err, b)
	}
}

func TestMapRoundTripRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	var into engines.Batch
	for i := 0; i < 1000; i++ {
		b := randomBatch(r)
		for j := range b.Events {
			if b.Events[j].Kind == engines.BlockStored && r.IntN(3) == 0 {
				b.Events[j].SessionID = "session-ü"
			}
		}
		p, err := EncodeBatchLayout(b, LayoutMap)
		if err != nil {
			t.Fatal(err)
		}
		if err := DecodeBatchInto(&into, p); err != nil {
			t.Fatalf("%v\n%x", err, p)
		}
		if d := cmp.Diff(b, into, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("round trip (-sent +decoded):\n%s", d)
		}
	}
}

// FuzzDecodeSGLangMap: the map branch never panics, rejects with a typed error inside the input,
// and what it accepts re-encodes (map layout) to a payload that decodes to the same batch.
func FuzzDecodeSGLangMap(f *testing.F) {
	for _, s := range loadMap(f).Samples {
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
		out, err := EncodeBatchLayout(b, LayoutMap)
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

// BenchmarkDecodeSGLangLayouts decodes the same 256-page store in both layouts; the sub-benchmarks
// alternate within each -count round, so the two are compared on the same machine state.
func BenchmarkDecodeSGLangLayouts(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 5))
	e := engines.Event{Kind: engines.BlockStored, BlockSize: 16, Medium: "GPU", SessionID: "agent-7"}
	for i := 0; i < 256; i++ {
		e.BlockHashes = append(e.BlockHashes, uint64(int64(r.Uint64())))
		for j := 0; j < 16; j++ {
			e.TokenIDs = append(e.TokenIDs, uint32(r.IntN(151000)))
		}
	}
	for _, l := range []Layout{LayoutArray, LayoutMap} {
		p, _ := EncodeBatchLayout(engines.Batch{Timestamp: 1, Events: []engines.Event{e}, HasDPRank: true}, l)
		b.Run(l.String(), func(b *testing.B) {
			var dst engines.Batch
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				if err := DecodeBatchInto(&dst, p); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(256*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}
