package sglang

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/internal/mpack"
	"github.com/kvexact/kvexact/vectors"
)

type sampleFile struct {
	// Samples are read by the one sample loader.
	Samples []vectors.Sample `json:"-"`
	// Replay is the file's recorded replay exchange (not a sample: the loader leaves it).
	Replay struct {
		Request  []string   `json:"request_frames_hex"`
		Response [][]string `json:"response_messages_hex"`
	} `json:"replay_exchange"`
}

func load(t testing.TB) sampleFile {
	t.Helper()
	path := filepath.Join("..", "..", "vectors", "sglang", "v0.5.18", "events-samples.json")
	sf, err := vectors.LoadSamples(path)
	if err != nil {
		t.Fatal(err)
	}
	f := sampleFile{Samples: sf.Samples}
	if len(f.Samples) != 6 {
		t.Fatalf("%d samples, want 6", len(f.Samples))
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

func unhex(t testing.TB, s string) []byte {
	p, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSamplesReencodeByteEqual(t *testing.T) {
	for _, s := range load(t).Samples {
		p := s.Payload
		b, err := DecodeBatch(p)
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		out, err := EncodeBatch(b)
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		if !bytes.Equal(out, s.Payload) {
			t.Fatalf("%s re-encoded\n got %x\nwant %x", s.Name, out, s.Payload)
		}
	}
}

func TestSignedHashesAndCoalescing(t *testing.T) {
	f := load(t)
	b, err := DecodeBatch(f.Samples[1].Payload)
	if err != nil {
		t.Fatal(err)
	}
	e := b.Events[0]
	neg := int64(-3515930894756335561)
	if e.BlockHashes[0] != uint64(neg) || e.BlockHashes[1] != 6739024289385430548 || e.HasParent ||
		e.BlockSize != 4 || len(e.BlockTokens) != 2 || !cmp.Equal(e.BlockTokens[1], []uint32{0, 358, 1097, 264}) ||
		e.Medium != "GPU" || e.HasLoRAID {
		t.Fatalf("%+v", e)
	}
	salted, err := DecodeBatch(f.Samples[3].Payload)
	if err != nil || salted.Events[0].CacheSalt != "tenant-a" {
		t.Fatalf("salted: %v %+v", err, salted)
	}
	bigram, err := DecodeBatch(f.Samples[5].Payload)
	if err != nil {
		t.Fatal(err)
	}
	be := bigram.Events[0]
	if !be.Bigram || !cmp.Equal(be.TokenIDs, []uint32{10, 20, 30, 40, 50}) || len(be.BlockTokens) != 2 ||
		!cmp.Equal(be.BlockTokens[1], []uint32{30, 40, 50}) || bigram.DPRank != 1 {
		t.Fatalf("bigram %+v", be)
	}
}

func TestReplayExchange(t *testing.T) {
	f := load(t)
	var req [][]byte
	for _, h := range f.Replay.Request {
		req = append(req, unhex(t, h))
	}
	if d := cmp.Diff(engines.ReplayRequest(3), req, cmpopts.EquateEmpty()); d != "" {
		t.Fatalf("replay request: %s", d)
	}
	want := uint64(3)
	for i, msg := range f.Replay.Response {
		var frames [][]byte
		for _, h := range msg {
			frames = append(frames, unhex(t, h))
		}
		seq, payload, end, err := engines.ParseReplayReply(frames)
		if err != nil {
			t.Fatal(err)
		}
		if i == len(f.Replay.Response)-1 {
			if !end || seq != engines.ReplayEndSeq {
				t.Fatalf("last reply not the end marker: %d %v", seq, end)
			}
			if d := cmp.Diff(engines.ReplayEnd(), frames, cmpopts.EquateEmpty()); d != "" {
				t.Fatal(d)
			}
			continue
		}
		if end || seq != want {
			t.Fatalf("reply %d: seq %d end %v", i, seq, end)
		}
		want++
		if _, err := DecodeBatch(payload); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
	}
}

func TestTruncatedEveryOffset(t *testing.T) {
	for _, s := range load(t).Samples {
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

func batchOf(event []any) []byte {
	b := mpack.AppendArrayLen(nil, 3)
	b = mpack.AppendFloat64(b, 1)
	b = mpack.AppendArrayLen(b, 1)
	b, _ = mpack.AppendAny(b, event)
	return mpack.AppendUint(b, 0)
}

func TestWrongTypesNameTheField(t *testing.T) {
	good := func() []any {
		return []any{"BlockStored", []any{int64(-1), uint64(2)}, nil, []any{uint64(1), uint64(2)}, uint64(1), nil, "GPU"}
	}
	cases := []struct {
		idx    int
		value  any
		reason engines.RejectReason
		field  string
	}{
		{1, "x", engines.ReasonSchemaMismatch, "events[0].block_hashes"},
		{1, []any{int64(-1), "x"}, engines.ReasonSchemaMismatch, "events[0].block_hashes[1]"},
		{2, "x", engines.ReasonSchemaMismatch, "events[0].parent_block_hash"},
		{3, []any{uint64(1), int64(-2)}, engines.ReasonTokenRange, "events[0].token_ids[1]"},
		{3, []any{[]any{uint64(1), uint64(2)}, []any{uint64(3), uint64(4)}}, engines.ReasonTokenRange, "events[0].token_ids[1][0]"},
		{3, []any{[]any{uint64(1)}}, engines.ReasonSchemaMismatch, "events[0].token_ids[0]"},
		{4, "4", engines.ReasonSchemaMismatch, "events[0].block_size"},
		{6, uint64(1), engines.ReasonSchemaMismatch, "events[0].medium"},
		{0, "BlockMoved", engines.ReasonUnknownEvent, "events[0].type"},
	}
	for _, c := range cases {
		ev := good()
		ev[c.idx] = c.value
		_, err := DecodeBatch(batchOf(ev))
		var de *engines.DecodeError
		if !errors.As(err, &de) || de.Reason != c.reason || de.Field != c.field {
			t.Errorf("[%d]=%v: %v, want %s in %s", c.idx, c.value, err, c.reason, c.field)
		}
	}
	// Absent trailing optionals (pre-v0.5.17) and extra trailing elements are accepted.
	for _, ev := range [][]any{good()[:5], good()[:6], append(good(), nil, "future")} {
		if _, err := DecodeBatch(batchOf(ev)); err != nil {
			t.Errorf("%v: %v", ev, err)
		}
	}
}

func randomBatch(r *rand.Rand) engines.Batch {
	b := engines.Batch{Timestamp: r.Float64() * 2e9, HasDPRank: r.IntN(4) > 0}
	if b.HasDPRank {
		b.DPRank = r.IntN(8)
	}
	media := []string{"", "GPU", "CPU_PINNED", "DISK", "EXTERNAL"}
	for n := r.IntN(5); n > 0; n-- {
		e := engines.Event{Kind: engines.Kind(1 + r.IntN(3))}
		if e.Kind != engines.AllBlocksCleared {
			nb := r.IntN(4)
			for j := 0; j < nb; j++ {
				e.BlockHashes = append(e.BlockHashes, uint64(int64(r.Uint64())>>r.IntN(64)))
			}
			e.Medium = media[r.IntN(len(media))]
		}
		if e.Kind == engines.BlockStored {
			if r.IntN(2) == 0 {
				e.Parent, e.HasParent = uint64(int64(r.Uint64())), true
			}
			e.BlockSize = 1 + r.IntN(4)
			e.Bigram = r.IntN(4) == 0 && len(e.BlockHashes) > 0
			units := len(e.BlockHashes) * e.BlockSize
			if e.Bigram {
				units++
			}
			for j := 0; j < units; j++ {
				e.TokenIDs = append(e.TokenIDs, r.Uint32()>>r.IntN(32))
			}
			if r.IntN(3) == 0 {
				e.CacheSalt = "tenant-ü"
			}
			splitBlocks(&e)
		}
		b.Events = append(b.Events, e)
	}
	return b
}

func TestRoundTripRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var into engines.Batch
	for i := 0; i < 1000; i++ {
		b := randomBatch(r)
		p, err := EncodeBatch(b)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeBatch(p)
		if err != nil {
			t.Fatalf("%v\n%x", err, p)
		}
		if d := cmp.Diff(b, got, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("round trip (-sent +decoded):\n%s", d)
		}
		if err := DecodeBatchInto(&into, p); err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(b, into, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("DecodeBatchInto (-sent +decoded):\n%s", d)
		}
	}
}

func FuzzDecodeSGLang(f *testing.F) {
	for _, s := range load(f).Samples {
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
		out, err := EncodeBatch(b)
		if err != nil {
			t.Fatalf("encode of a decoded batch: %v", err)
		}
		b2, err := DecodeBatch(out)
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		// The array layout has no session_id (a map event's, v0.5.21, is dropped by design).
		if d := cmp.Diff(b, b2, cmpopts.EquateEmpty(), cmpopts.EquateNaNs(), cmpopts.IgnoreFields(engines.Event{}, "SessionID")); d != "" {
			t.Fatalf("unstable:\n%s", d)
		}
	})
}

func BenchmarkDecodeSGLang(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 5))
	e := engines.Event{Kind: engines.BlockStored, BlockSize: 16, Medium: "GPU"}
	for i := 0; i < 256; i++ {
		e.BlockHashes = append(e.BlockHashes, uint64(int64(r.Uint64())))
		for j := 0; j < 16; j++ {
			e.TokenIDs = append(e.TokenIDs, uint32(r.IntN(151000)))
		}
	}
	p, _ := EncodeBatch(engines.Batch{Timestamp: 1, Events: []engines.Event{e}, HasDPRank: true})
	var dst engines.Batch
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if err := DecodeBatchInto(&dst, p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(256*float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
}
