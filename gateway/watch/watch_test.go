package watch

import (
	"errors"
	"testing"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/vllm"
	"github.com/kvexact/kvexact/gateway/hashcore"
)

func strp(s string) *string { return &s }

func hasher(t testing.TB, algo hashcore.Algorithm, bs int, seed *string) *hashcore.Hasher {
	t.Helper()
	h, err := hashcore.New(hashcore.Binding{Algorithm: algo, BlockSize: bs, Seed: seed}, hashcore.Default())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func tokens(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i*7%5000)
	}
	return out
}

// stored is the BlockStored event an engine hashing with h publishes for a prompt of toks: the root
// chain, or (from > 0) the blocks from `from` on, chained on block from-1.
func stored(t testing.TB, h *hashcore.Hasher, toks []uint32, from int) *engines.Event {
	t.Helper()
	keys, err := h.Keys(toks, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	bs := h.Binding().BlockSize
	ev := &engines.Event{Kind: engines.BlockStored, BlockHashes: keys[from:], TokenIDs: toks[from*bs : len(keys)*bs], BlockSize: bs, HasExtraKeys: true,
		ExtraKeys: make([][]any, len(keys)-from)}
	if from > 0 {
		ev.Parent, ev.HasParent = keys[from-1], true
	}
	return ev
}

func newWatch(t testing.TB, h *hashcore.Hasher, cfg Config) *Watch {
	cfg.Hasher, cfg.Family = h, "vllm"
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestMatchingChainsAreChecked(t *testing.T) {
	h := hasher(t, hashcore.VLLMSHA256, 16, strp("0"))
	w := newWatch(t, h, Config{})
	toks := tokens(16*6, 100)
	// The prefix's root event, then a continuation chained on its last block.
	if o := w.Event(stored(t, h, toks[:16*4], 0)); o.Mismatch != nil || o.Matched != 4 || o.Checked != 4 {
		t.Fatalf("root event: %+v", o)
	}
	if o := w.Event(stored(t, h, toks, 4)); o.Mismatch != nil || o.Matched != 2 {
		t.Fatalf("continuation: %+v", o)
	}
	// A continuation whose parent the watch never verified cannot be checked.
	other := tokens(16*3, 9000)
	if o := w.Event(stored(t, h, other, 1)); o.Unchecked != 2 || o.Checked != 0 {
		t.Fatalf("unknown parent: %+v", o)
	}
	// After a reset the verified digests are gone.
	w.Reset()
	if o := w.Event(stored(t, h, toks, 4)); o.Unchecked != 2 {
		t.Fatalf("after reset: %+v", o)
	}
}

// TestMismatchNamesTheLeg: the engine's seed, algorithm, block size and tokens each differ from the
// rule's once; the watch reports a mismatch naming that leg.
func TestMismatchNamesTheLeg(t *testing.T) {
	rule := hasher(t, hashcore.VLLMSHA256, 16, strp("0"))
	toks := tokens(16*4, 100)
	cases := map[Leg]*engines.Event{
		LegSeed:      stored(t, hasher(t, hashcore.VLLMSHA256, 16, strp("1")), toks, 0),
		LegAlgorithm: stored(t, hasher(t, hashcore.VLLMSHA256CBOR, 16, strp("0")), toks, 0),
		LegBlockSize: stored(t, hasher(t, hashcore.VLLMSHA256, 32, strp("0")), toks, 0),
	}
	for leg, ev := range cases {
		w := newWatch(t, rule, Config{})
		o := w.Event(ev)
		if o.Mismatch == nil || o.Mismatch.Leg != leg {
			t.Errorf("%s: outcome %+v (mismatch %v)", leg, o, o.Mismatch)
		}
	}
	// Smaller engine blocks: the token count shows it even without a block_size field.
	small := stored(t, hasher(t, hashcore.VLLMSHA256, 8, strp("0")), toks, 0)
	small.BlockSize = 0
	if o := newWatch(t, rule, Config{}).Event(small); o.Mismatch == nil || o.Mismatch.Leg != LegBlockSize {
		t.Errorf("smaller blocks: %+v", o)
	}
	// Tokens: a continuation on a verified block whose tokens the engine hashed differently.
	w := newWatch(t, rule, Config{})
	w.Event(stored(t, rule, toks[:32], 0))
	ev := stored(t, rule, toks, 2)
	ev.TokenIDs = append([]uint32(nil), ev.TokenIDs...)
	ev.TokenIDs[3]++
	if o := w.Event(ev); o.Mismatch == nil || o.Mismatch.Leg != LegChain {
		t.Errorf("chain: %+v", o)
	}
	// Extra keys the event carries are hashed: a LoRA block matches only with them.
	ex := &hashcore.Extras{LoRAName: "adapter"}
	keys, _ := rule.Keys(toks, ex, nil)
	extras, _ := hashcore.ExtraKeys(ex, len(toks), 16)
	lora := &engines.Event{Kind: engines.BlockStored, BlockHashes: keys, TokenIDs: toks, BlockSize: 16, HasExtraKeys: true, ExtraKeys: extras}
	if o := newWatch(t, rule, Config{}).Event(lora); o.Mismatch != nil || o.Matched != 4 {
		t.Errorf("LoRA block: %+v", o)
	}
	lora.ExtraKeys = nil
	if o := newWatch(t, rule, Config{}).Event(lora); o.Mismatch == nil {
		t.Error("LoRA keys without their extra keys matched")
	}
}

func TestSampling(t *testing.T) {
	h := hasher(t, hashcore.VLLMSHA256, 16, strp("0"))
	w := newWatch(t, h, Config{CheckFirst: 4, SampleEvery: 3})
	checked := 0
	for i := range 16 {
		o := w.Event(stored(t, h, tokens(32, uint32(i*100)), 0))
		if o.Checked > 0 {
			checked++
		} else if o.Sampled != 2 {
			t.Fatalf("event %d neither checked nor sampled out: %+v", i, o)
		}
	}
	// Events 1..4 in full, then 6, 9, 12, 15.
	if checked != 8 {
		t.Fatalf("%d of 16 events checked, want 8", checked)
	}
}

func TestDigestsBounded(t *testing.T) {
	h := hasher(t, hashcore.VLLMSHA256, 16, strp("0"))
	w := newWatch(t, h, Config{MaxDigests: 10})
	for i := range 10 {
		w.Event(stored(t, h, tokens(16*3, uint32(i*1000)), 0))
	}
	if w.Held() != 10 {
		t.Fatalf("%d digests held, bound 10", w.Held())
	}
}

// FuzzWatchEvent: whatever the vLLM decoder accepts, the watch checks without panicking, and its
// account adds up (every listed block is checked or unchecked; a mismatch only on checked blocks).
func FuzzWatchEvent(f *testing.F) {
	h := hasher(f, hashcore.VLLMSHA256, 16, strp("0"))
	toks := tokens(16*4, 100)
	for _, ev := range []*engines.Event{stored(f, h, toks, 0), stored(f, h, toks, 2), stored(f, hasher(f, hashcore.VLLMSHA256, 16, strp("1")), toks, 0)} {
		b, err := vllm.EncodeBatch(engines.Batch{Timestamp: 1, Events: []engines.Event{*ev}}, vllm.LayoutMap)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := vllm.DecodeBatch(payload)
		if err != nil {
			var de *engines.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("untyped decode error %v", err)
			}
			return
		}
		w := newWatch(t, h, Config{CheckFirst: 2, SampleEvery: 2})
		for i := range b.Events {
			ev := &b.Events[i]
			o := w.Event(ev)
			if ev.Kind != engines.BlockStored || len(ev.BlockHashes) == 0 {
				continue
			}
			if o.Checked+o.Unchecked+o.Sampled != len(ev.BlockHashes) || o.Matched > o.Checked || (o.Mismatch != nil && o.Checked == 0) {
				t.Fatalf("event %d with %d blocks: outcome %+v", i, len(ev.BlockHashes), o)
			}
		}
	})
}

// The watch runs only for families whose engine keys the gateway reproduces (engines.KeyRules).
func TestFamilyWithoutReproducibleKeysRefused(t *testing.T) {
	h := hasher(t, hashcore.VLLMSHA256, 16, strp("0"))
	for _, fam := range []string{"trtllm", "llamacpp", "nosuch"} {
		_, err := New(Config{Hasher: h, Family: fam})
		want := `watch: family "` + fam + `": only vllm and sglang publish reproducible engine keys`
		if err == nil || err.Error() != want {
			t.Errorf("New(%s) error = %v, want %q", fam, err, want)
		}
	}
	for _, fam := range []string{"vllm", "sglang"} {
		if _, err := New(Config{Hasher: h, Family: fam}); err != nil {
			t.Errorf("New(%s): %v", fam, err)
		}
	}
}

// TestTaggedReleaseEventsRetagged: a tagged release (vLLM v0.31.0+) hashes ("cache_salt", salt),
// ("mm", id, offset) and ("prompt_embeds", digest) but publishes the bare values; the watch tags
// them again, so a salted or multimodal block is checked and matches. A LoRA block (its path is in
// the hash, not in the event) stays unchecked; an untagged watch reads the same event as a mismatch.
func TestTaggedReleaseEventsRetagged(t *testing.T) {
	h := hasher(t, hashcore.VLLMSHA256, 16, strp("0"))
	toks := tokens(16*2, 300)
	digest := []byte{1, 2, 3, 4}
	tagged := [][]any{{[]any{"mm", "img-1", int64(0)}, []any{"cache_salt", "tenant-a"}, []any{"prompt_embeds", digest}}, nil}
	_, keys, err := h.ChainFrom(h.Root(), toks, tagged)
	if err != nil {
		t.Fatal(err)
	}
	event := func(first []any, lora string) *engines.Event {
		return &engines.Event{Kind: engines.BlockStored, BlockHashes: keys, TokenIDs: toks, BlockSize: 16, HasExtraKeys: true,
			ExtraKeys: [][]any{first, nil}, LoRAName: lora}
	}
	published := []any{[]any{"img-1", int64(0)}, "tenant-a", digest} // vLLM's to_event_extra_keys
	if o := newWatch(t, h, Config{TaggedExtraKeys: true}).Event(event(published, "")); o.Mismatch != nil || o.Matched != 2 {
		t.Fatalf("tagged watch: %+v", o)
	}
	if o := newWatch(t, h, Config{}).Event(event(published, "")); o.Mismatch == nil {
		t.Fatalf("untagged watch on a tagged release's event: %+v, want a mismatch", o)
	}
	if o := newWatch(t, h, Config{TaggedExtraKeys: true}).Event(event([]any{"sql-lora"}, "sql-lora")); o.Unchecked != 2 || o.Mismatch != nil {
		t.Fatalf("LoRA block: %+v, want unchecked", o)
	}
}
