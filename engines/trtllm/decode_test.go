package trtllm

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/vectors"
)

type body struct {
	Name string
	Text string
	TPB  int
}

// loadBodies reads the drain bodies through the one sample loader.
func loadBodies(t testing.TB) []body {
	t.Helper()
	f, err := vectors.LoadSamples(filepath.Join("..", "..", "vectors", "trtllm", "v1.2", "kv-cache-events-samples.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Samples) != 6 {
		t.Fatalf("%d bodies, want 6", len(f.Samples))
	}
	var out []body
	for _, s := range f.Samples {
		out = append(out, body{Name: s.Name, Text: string(s.Payload), TPB: s.BlockSize})
	}
	return out
}

func TestBodiesReencodeByteEqual(t *testing.T) {
	for _, b := range loadBodies(t) {
		evs, err := DecodeDrain([]byte(b.Text))
		if err != nil {
			t.Fatalf("%s: %v", b.Name, err)
		}
		out, err := EncodeDrain(evs)
		if err != nil {
			t.Fatalf("%s: %v", b.Name, err)
		}
		if string(out) != b.Text {
			t.Fatalf("%s re-encoded\n got %s\nwant %s", b.Name, out, b.Text)
		}
	}
}

func TestStartupFields(t *testing.T) {
	evs, err := DecodeDrain([]byte(loadBodies(t)[0].Text))
	if err != nil {
		t.Fatal(err)
	}
	c, s := evs[0], evs[1]
	if c.Kind != engines.CacheCreated || !cmp.Equal(c.NumBlocks, []int{14336, 4096}) || c.WindowSize != 8192 || c.EventID != 0 {
		t.Fatalf("created %+v", c)
	}
	if s.Kind != engines.BlockStored || s.HasParent || len(s.BlockHashes) != 4 || s.BlockHashes[2] != 17122258844080141714 ||
		len(s.BlockTokens) != 4 || len(s.BlockTokens[3]) != 3 || s.BlockTokens[0][0] != 128000 || len(s.TokenIDs) != 27 ||
		!cmp.Equal(s.Priorities, []int{35, 35, 35, 35}) || !cmp.Equal(s.CacheLevels, []int{0, 0, 0, 0}) || s.BlockExtraIDs != nil {
		t.Fatalf("stored %+v", s)
	}
}

func TestHexAndNegativeHashes(t *testing.T) {
	in := `[{"event_id":1,"data":{"type":"removed","block_hashes":["d34b69a192983cfa00",-3221364965783356166,18446744073709551615]},"hash_algo":"v2_sha256"}]`
	evs, err := DecodeDrain([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []uint64{0xd34b69a192983cfa, 0xd34b69a192983cfa, 18446744073709551615}
	if !cmp.Equal(evs[0].BlockHashes, want) || len(evs[0].RawHashes[0]) != 9 || evs[0].RawHashes[1] != nil {
		t.Fatalf("%+v", evs[0])
	}
}

func TestNewerOptionalFields(t *testing.T) {
	in := `[{"event_id":7,"data":{"blocks":[{"type":"stored_block","block_hash":1,"tokens":[{"type":"unique_token","token_id":5,"token_extra_id":0},{"token_id":6,"token_extra_id":9}],"cache_level":1,"priority":80,"mm_keys":[{"type":"mm_key","hash":"ab","start_offset":3}],"cache_salt":"s","lora_id":4,"lora_name":"x","future":{"a":[1,2]}}],"type":"stored","parent_hash":"0x10"},"window_size":null,"layer_group_id":2}]`
	evs, err := DecodeDrain([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	e := evs[0]
	if e.HasWindowSize || e.Parent != 16 || e.CacheSalt != "s" || e.LoRAID != 4 || e.LoRAName != "x" ||
		!cmp.Equal(e.BlockExtraIDs, [][]uint64{{0, 9}}) || e.BlockMMKeys[0][0] != (engines.MMKey{Hash: "ab", StartOffset: 3}) ||
		e.CacheLevels[0] != 1 || e.Priorities[0] != 80 {
		t.Fatalf("%+v", e)
	}
}

func TestErrorsNameTheJSONPath(t *testing.T) {
	base := loadBodies(t)[1].Text
	cases := []struct {
		old, new string
		reason   engines.RejectReason
		path     string
	}{
		{`"block_hash":13689879506904170507`, `"block_hash":13689879506904170507.0`, engines.ReasonSchemaMismatch, "$[0].data.blocks[1].block_hash"},
		{`"block_hash":13689879506904170507`, `"block_hash":18446744073709551616`, engines.ReasonSchemaMismatch, "$[0].data.blocks[1].block_hash"},
		{`"block_hash":13689879506904170507`, `"block_hash":"zz"`, engines.ReasonSchemaMismatch, "$[0].data.blocks[1].block_hash"},
		{`"token_id":48189`, `"token_id":4294967296`, engines.ReasonTokenRange, "$[0].data.blocks[1].tokens[2].token_id"},
		{`"token_id":48189`, `"token_id":"48189"`, engines.ReasonSchemaMismatch, "$[0].data.blocks[1].tokens[2].token_id"},
		{`"type":"removed"`, `"type":"evicted"`, engines.ReasonUnknownEvent, "$[3].data.type"},
		{`"new_value":80`, `"new_value":[80]`, engines.ReasonSchemaMismatch, "$[1].data.priority.new_value"},
		{`{"event_id":5,`, `{"event_id":-5,`, engines.ReasonSchemaMismatch, "$[3].event_id"},
	}
	for _, c := range cases {
		if !strings.Contains(base, c.old) {
			t.Fatalf("sample lacks %s", c.old)
		}
		_, err := DecodeDrain([]byte(strings.Replace(base, c.old, c.new, 1)))
		var de *engines.DecodeError
		if !errors.As(err, &de) || de.Reason != c.reason || de.Field != c.path || de.Offset <= 0 {
			t.Errorf("%s: %v, want %s at %s", c.new, err, c.reason, c.path)
		}
	}
}

func TestTruncatedEveryOffset(t *testing.T) {
	for _, b := range loadBodies(t) {
		for n := 0; n < len(b.Text); n++ {
			_, err := DecodeDrain([]byte(b.Text[:n]))
			var de *engines.DecodeError
			if !errors.As(err, &de) || de.Offset < 0 || de.Offset > n {
				t.Fatalf("%s cut at %d: %v", b.Name, n, err)
			}
		}
	}
}

func TestWindowFilter(t *testing.T) {
	evs, err := DecodeDrain([]byte(loadBodies(t)[2].Text))
	if err != nil {
		t.Fatal(err)
	}
	var f WindowFilter
	var kept []uint64
	for i := range evs {
		if f.Keep(&evs[i]) {
			kept = append(kept, evs[i].EventID)
		}
	}
	if m, ok := f.Max(); m != 32768 || !ok || !cmp.Equal(kept, []uint64{0, 1, 3}) {
		t.Fatalf("max %d %v kept %v", m, ok, kept)
	}
	// Restart: a new run of created events relearns the maximum; events without window pass.
	for _, e := range []engines.Event{
		{Kind: engines.CacheCreated, WindowSize: 4096, HasWindowSize: true},
		{Kind: engines.BlockStored, WindowSize: 4096, HasWindowSize: true},
		{Kind: engines.BlockStored},
	} {
		if !f.Keep(&e) {
			t.Fatalf("dropped %+v", e)
		}
	}
	var fresh WindowFilter // nothing learned: keep the largest window seen so far
	for i, w := range []int{1024, 32768, 1024} {
		e := engines.Event{Kind: engines.BlockStored, WindowSize: w, HasWindowSize: true}
		if got := fresh.Keep(&e); got != (i < 2) {
			t.Fatalf("window %d #%d: %v", w, i, got)
		}
	}
}

func TestIDTracker(t *testing.T) {
	evs, err := DecodeDrain([]byte(loadBodies(t)[3].Text))
	if err != nil {
		t.Fatal(err)
	}
	var tr IDTracker
	var got []Continuity
	for i := range evs {
		c, _ := tr.Observe(&evs[i])
		got = append(got, c)
	}
	if !cmp.Equal(got, []Continuity{IDFirst, IDFirst, IDNext, IDNext}) {
		t.Fatalf("per-rank continuity %v", got)
	}
	e := engines.Event{EventID: 25}
	if c, missed := tr.Observe(&e); c != IDGap || missed != 6 {
		t.Fatalf("gap: %v %d", c, missed)
	}
	e.EventID = 0
	if c, _ := tr.Observe(&e); c != IDRestart {
		t.Fatalf("restart: %v", c)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestDrainRequestResponse(t *testing.T) {
	text := loadBodies(t)[0].Text
	client := &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		if r.Method != http.MethodPost || r.URL.Path != DrainPath || r.URL.Host != "127.0.0.1:8000" {
			t.Errorf("request %s %s", r.Method, r.URL)
		}
		return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(text))}, nil
	})}
	req, err := NewDrainRequest(context.Background(), "http://127.0.0.1:8000/")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := ReadDrainResponse(resp, 0)
	if err != nil || len(evs) != 2 {
		t.Fatalf("%v %d", err, len(evs))
	}
	if _, err := ReadDrainResponse(&http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(text))}, 10); err == nil {
		t.Fatal("oversized body accepted")
	}
	if _, err := ReadDrainResponse(&http.Response{StatusCode: 503, Body: io.NopCloser(strings.NewReader("busy"))}, 0); err == nil {
		t.Fatal("503 accepted")
	}
}

func randomEvents(r *rand.Rand) []engines.Event {
	var out []engines.Event
	for n := r.IntN(6); n > 0; n-- {
		e := engines.Event{Kind: []engines.Kind{engines.CacheCreated, engines.BlockStored, engines.BlockRemoved, engines.BlockUpdated}[r.IntN(4)],
			EventID: r.Uint64() >> r.IntN(64)}
		if r.IntN(4) > 0 {
			e.WindowSize, e.HasWindowSize = 1<<r.IntN(16), true
		}
		if r.IntN(3) == 0 {
			e.DPRank, e.HasDPRank = r.IntN(4), true
		}
		hash := func() (uint64, []byte) {
			if r.IntN(5) == 0 {
				raw := make([]byte, 8+r.IntN(25))
				for k := range raw {
					raw[k] = byte(r.IntN(256))
				}
				var v uint64
				for _, c := range raw[:8] {
					v = v<<8 | uint64(c)
				}
				return v, raw
			}
			return r.Uint64() >> r.IntN(64), nil
		}
		addHash := func(j int) {
			v, raw := hash()
			if raw != nil && e.RawHashes == nil {
				e.RawHashes = make([][]byte, j)
			}
			if e.RawHashes != nil {
				e.RawHashes = append(e.RawHashes, raw)
			}
			e.BlockHashes = append(e.BlockHashes, v)
		}
		switch e.Kind {
		case engines.CacheCreated:
			e.NumBlocks = []int{r.IntN(100000), r.IntN(100)}
		case engines.BlockRemoved:
			for j := 0; j < 1+r.IntN(3); j++ {
				addHash(j)
			}
		case engines.BlockUpdated:
			addHash(0)
			if r.IntN(2) == 0 {
				e.LevelDiff = engines.Diff{Old: 0, New: 1, Set: true}
				e.CacheLevels = []int{1}
			}
			if r.IntN(2) == 0 {
				e.PriorityDiff = engines.Diff{Old: 35, New: r.IntN(101), Set: true}
			}
		case engines.BlockStored:
			if r.IntN(2) == 0 {
				e.Parent, e.RawParent = hash()
				e.HasParent = true
			}
			nb := 1 + r.IntN(3)
			var lens []int
			for j := 0; j < nb; j++ {
				addHash(j)
				k := 1 + r.IntN(4)
				lens = append(lens, k)
				for ; k > 0; k-- {
					e.TokenIDs = append(e.TokenIDs, r.Uint32()>>r.IntN(32))
				}
				e.CacheLevels = append(e.CacheLevels, r.IntN(2))
				e.Priorities = append(e.Priorities, r.IntN(101))
			}
			off := 0
			for _, k := range lens {
				e.BlockTokens = append(e.BlockTokens, e.TokenIDs[off:off+k:off+k])
				off += k
			}
			if r.IntN(4) == 0 {
				e.BlockExtraIDs = make([][]uint64, nb)
				x := make([]uint64, lens[nb-1])
				x[0] = 7
				e.BlockExtraIDs[nb-1] = x
			}
			if r.IntN(4) == 0 {
				e.BlockMMKeys = make([][]engines.MMKey, nb)
				e.BlockMMKeys[0] = []engines.MMKey{{Hash: "00ff", StartOffset: 2}}
				e.CacheSalt, e.LoRAName = "sa\"lt\n✓", "lo"
				e.LoRAID, e.HasLoRAID = 3, true
			}
		}
		out = append(out, e)
	}
	return out
}

func TestRoundTripRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for i := 0; i < 1000; i++ {
		evs := randomEvents(r)
		p, err := EncodeDrain(evs)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeDrain(p)
		if err != nil {
			t.Fatalf("%v\n%s", err, p)
		}
		if d := cmp.Diff(evs, got, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("round trip (-sent +decoded):\n%s\n%s", d, p)
		}
	}
}

func FuzzDecodeTRTLLMDrain(f *testing.F) {
	for _, b := range loadBodies(f) {
		f.Add([]byte(b.Text))
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		evs, err := DecodeDrain(p)
		if err != nil {
			var de *engines.DecodeError
			if !errors.As(err, &de) || de.Offset > len(p) || !strings.HasPrefix(de.Field, "$") {
				t.Fatalf("untyped or malformed error %v", err)
			}
			return
		}
		out, err := EncodeDrain(evs)
		if err != nil {
			return // e.g. an updated event with several block_hash keys: decodable, not re-encodable
		}
		evs2, err := DecodeDrain(out)
		if err != nil {
			t.Fatalf("re-decode: %v\n%s", err, out)
		}
		if d := cmp.Diff(evs, evs2, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("unstable:\n%s", d)
		}
	})
}

func BenchmarkDecodeTRTLLMDrain(b *testing.B) {
	text := []byte(loadBodies(b)[2].Text)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeDrain(text); err != nil {
			b.Fatal(err)
		}
	}
}
