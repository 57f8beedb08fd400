package tokenize

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// testSegmentCache keeps every segment (not only long ones), so that short random texts exercise it.
func testSegmentCache(maxBytes int64) *SegmentCache {
	c := NewSegmentCache(maxBytes)
	c.minBytes = 1
	return c
}

// segmentTexts are pieces placed next to added tokens: white space on either side (lstrip / rstrip
// territory), text that NFC composes or reorders (a combining mark right after an added token must
// not compose across it), characters only byte fallback encodes for SentencePiece models, partial
// added-token prefixes, and long runs that BPE merges across.
var segmentTexts = []string{" ", "  ", "\n", "\n\n", "\t", " \n ", "\u00a0", "\u3000", "\u0301", "\u0301abc", "e\u0301", "a\u0308\u0301",
	"\u1100\u1161\u11a8", "Å", "ﬁ", "İ", "ꙮ", "𠀀", "\U0001F9FF", "🇺🇸", "👍🏽", "<", "<|", "<|im_st", "<｜", "[INST", "</", "\u2581",
	"▁▁", "'s", "123456", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "                                ", "\r\n\r\n"}

// turnText is one random turn: a text of the HF differential's kind with adversarial pieces and the
// model's own added tokens around and inside it.
func turnText(r *rand.Rand, added []AddedToken) string {
	var b strings.Builder
	for range 1 + r.IntN(6) {
		switch k := r.IntN(10); {
		case k < 4:
			b.WriteString(tokenizerText(r))
		case k < 8:
			b.WriteString(segmentTexts[r.IntN(len(segmentTexts))])
		default:
			if len(added) > 0 {
				b.WriteString(added[r.IntN(len(added))].Content)
			}
		}
	}
	return b.String()
}

// renderings are the prompt texts of one conversation, turn by turn: the chat template's rendering
// when the model has one, else turns joined by the model's added tokens (with white space around
// them at random), as a completion prompt of a multi-turn conversation would be.
func renderings(t *testing.T, r *rand.Rand, tk *Tokenizer, added []AddedToken) []string {
	turns := 2 + r.IntN(6)
	var out []string
	if tk.Config().ChatTemplate != "" {
		var msgs []map[string]string
		if r.IntN(2) == 0 {
			msgs = append(msgs, map[string]string{"role": "system", "content": turnText(r, added)})
		}
		for i := range turns {
			role := []string{"user", "assistant"}[i%2]
			msgs = append(msgs, map[string]string{"role": role, "content": turnText(r, added)})
			if role == "assistant" {
				continue
			}
			body, _ := json.Marshal(map[string]any{"messages": msgs})
			req, err := ParseChatRequest(body)
			if err != nil {
				t.Fatal(err)
			}
			text, err := tk.RenderChat(req)
			if err != nil {
				continue // a template refusing this shape (e.g. a system message) is not the cache's concern
			}
			out = append(out, text)
		}
		return out
	}
	var b strings.Builder
	for range turns {
		if len(added) > 0 {
			b.WriteString(segmentTexts[r.IntN(3)])
			b.WriteString(added[r.IntN(len(added))].Content)
			b.WriteString(segmentTexts[r.IntN(3)])
		}
		b.WriteString(turnText(r, added))
		out = append(out, b.String())
	}
	return out
}

// TestSegmentCacheMatchesEncode: for every staged tokenizer, multi-turn renderings encoded turn by
// turn through a segment cache give exactly the ids of an uncached Encode, both add_special_tokens
// values, with a roomy cache and with one small enough to evict all the time. The seed is logged
// (KVEXACT_DIFF_SEED replays, KVEXACT_DIFF_N sizes).
func TestSegmentCacheMatchesEncode(t *testing.T) {
	seed, n := diffSeed(t)
	for mi, model := range refModels {
		t.Run(model, func(t *testing.T) {
			tk := loadRefTokenizer(t, model)
			if !tk.segmentLocal {
				t.Fatalf("%s: a staged tokenizer is not segment-local: its Encode would get no cache", model)
			}
			added := tk.AddedTokens()
			for _, bound := range []int64{64 << 20, 4 << 10} {
				c := testSegmentCache(bound)
				ct := tk.WithSegmentCache(c)
				if !ct.SegmentCached() {
					t.Fatalf("%s: WithSegmentCache gave an uncached tokenizer", model)
				}
				r := rand.New(rand.NewPCG(seed, uint64(mi)<<8|uint64(bound&0xff)))
				bad := 0
				for range max(1, n/10) {
					for _, text := range renderings(t, r, tk, added) {
						for _, special := range []bool{false, true} {
							want, err := tk.Encode(text, special)
							if err != nil {
								t.Fatal(err)
							}
							for pass := range 2 { // the second pass is all hits
								got, err := ct.Encode(text, special)
								if err != nil || !slices.Equal(got, want) {
									bad++
									t.Errorf("%s bound %d pass %d special=%v text %+q:\n cached %v (%v)\n  fresh %v", model, bound, pass, special, text, got, err, want)
								}
							}
						}
					}
					if bad >= 5 {
						t.Fatalf("%s: stopping after %d mismatches", model, bad)
					}
				}
				st := c.Stats()
				if st.Hits == 0 || st.Misses == 0 {
					t.Fatalf("%s bound %d: %+v: the cache was not exercised", model, bound, st)
				}
				if st.Bytes > st.MaxBytes {
					t.Fatalf("%s: %d bytes held over the %d bound", model, st.Bytes, st.MaxBytes)
				}
				if bound < 1<<20 && st.Evictions == 0 {
					t.Fatalf("%s bound %d: %+v: no evictions", model, bound, st)
				}
				t.Logf("%s bound %d: %+v", model, bound, st)
			}
		})
	}
}

// TestSegmentCacheReferenceIDs: every reference case of ../shared/tokenizer-ref, encoded through a
// segment cache cold and then warm, gives the engine's ids.
func TestSegmentCacheReferenceIDs(t *testing.T) {
	for _, model := range refModels {
		t.Run(model, func(t *testing.T) {
			ref := readRefText(t, model)
			ct := loadRefTokenizer(t, model).WithSegmentCache(testSegmentCache(64 << 20))
			for pass := range 2 {
				for _, c := range ref.Cases {
					got, err := ct.Encode(c.Text, c.AddSpecialTokens)
					if err != nil || !slices.Equal(got, c.IDs) {
						t.Fatalf("%s pass %d [add_special_tokens=%t]: cached %v (%v), engine %v", c.ID, pass, c.AddSpecialTokens, got, err, c.IDs)
					}
				}
			}
			if ct.segs.Stats().Hits == 0 {
				t.Fatal("no segment was served from the cache")
			}
		})
	}
}

// firstSegmentPrepend is a normalizer that is not segment-local: like Metaspace's prepend_scheme
// "first", it prefixes only the first segment an Encode normalizes (calls is reset before each).
type firstSegmentPrepend struct{ calls *int }

func (f firstSegmentPrepend) normalize(s string) string {
	*f.calls++
	if *f.calls == 1 {
		return "\u2581" + s
	}
	return s
}

// TestSegmentCacheBypassedWhereInexact: a tokenizer with a component segmentLocal does not know
// gets no cache from WithSegmentCache (so does a pool's), and forcing one on would change its ids —
// which is why the gate is there.
func TestSegmentCacheBypassedWhereInexact(t *testing.T) {
	base := loadRefTokenizer(t, "llama3")
	calls := 0
	u := *base
	u.normalizer = firstSegmentPrepend{&calls}
	u.segmentLocal = tokenizerSegmentLocal(&u)
	if u.segmentLocal {
		t.Fatal("a position-dependent normalizer was taken as segment-local")
	}
	text1 := "first turn, long enough" + "<|eot_id|>" + "second turn, long enough"
	text2 := "second turn, long enough" + "<|eot_id|>" + "first turn, long enough"
	encode := func(tk *Tokenizer, s string) []uint32 {
		calls = 0
		ids, err := tk.Encode(s, false)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	want1, want2 := encode(&u, text1), encode(&u, text2)

	gated := u.WithSegmentCache(testSegmentCache(1 << 20))
	if gated.SegmentCached() {
		t.Fatal("WithSegmentCache attached a cache to a tokenizer that is not segment-local")
	}
	if got1, got2 := encode(gated, text1), encode(gated, text2); !slices.Equal(got1, want1) || !slices.Equal(got2, want2) {
		t.Fatalf("gated tokenizer: %v %v, want %v %v", got1, got2, want1, want2)
	}

	forced := u
	forced.segs = testSegmentCache(1 << 20)
	encode(&forced, text1)
	if got2 := encode(&forced, text2); slices.Equal(got2, want2) {
		t.Fatalf("forcing the cache on did not change the ids (%v): this test could not fail", got2)
	}
}

// TestSegmentCacheBound: the cache holds at most its byte bound, drops the least recently used
// first, and counts hits, misses and evictions.
func TestSegmentCacheBound(t *testing.T) {
	if NewSegmentCache(0) != nil || NewSegmentCache(-1) != nil {
		t.Fatal("a cache of no bytes must be nil (no cache)")
	}
	var nilCache *SegmentCache
	if nilCache.Stats() != (SegmentCacheStats{}) {
		t.Fatal("a nil cache has zero stats")
	}
	text := func(i int) string { return strings.Repeat(string(rune('a'+i%26)), 100) + string(rune('A'+i/26)) }
	one := int64(len(text(0))) + 4*10 + segmentOverhead
	c := NewSegmentCache(3 * one)
	ids := make([]uint32, 10)
	for i := range 3 {
		c.put(segmentKey{"tk", text(i)}, ids)
	}
	if _, ok := c.get(segmentKey{"tk", text(0)}); !ok { // 0 becomes the most recent
		t.Fatal("entry 0 missing")
	}
	c.put(segmentKey{"tk", text(3)}, ids)
	if _, ok := c.get(segmentKey{"tk", text(1)}); ok {
		t.Fatal("entry 1, the least recently used, was not evicted")
	}
	if _, ok := c.get(segmentKey{"other", text(0)}); ok {
		t.Fatal("an entry of one tokenizer served another")
	}
	c.put(segmentKey{"tk", strings.Repeat("x", int(3*one))}, ids) // larger than the bound: not kept
	st := c.Stats()
	if st.Bytes > st.MaxBytes || st.Entries != 3 || st.Evictions != 1 || st.Hits != 1 || st.Misses != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestPoolSegmentCache: a pool's tokenizers have no cache unless WithSegmentCacheBytes gives one
// (benchmarks and ctk stay cold), and then share it.
func TestPoolSegmentCache(t *testing.T) {
	if _, err := FindModelDir(DefaultRoots(), "qwen3"); err != nil {
		t.Skip(err)
	}
	p := NewPool("", WithSegmentCacheBytes(DefaultSegmentCacheBytes))
	on, err := p.Get("qwen3")
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]PoolOption{nil, {WithSegmentCacheBytes(0)}} {
		off, err := NewPool("", opts...).Get("qwen3")
		if err != nil {
			t.Fatal(err)
		}
		if off.SegmentCached() {
			t.Fatalf("pool options %d: a tokenizer with a segment cache nobody asked for", len(opts))
		}
	}
	if !on.SegmentCached() {
		t.Fatal("WithSegmentCacheBytes gave no cache")
	}
	text := strings.Repeat("a long enough turn of a conversation, ", 8)
	if _, err := on.Encode(text+"<|im_end|>"+text, false); err != nil {
		t.Fatal(err)
	}
	if st := p.SegmentCacheStats(); st.Hits != 1 || st.Misses != 1 || st.Entries != 1 {
		t.Fatalf("pool stats %+v, want the repeated turn served once from the cache", st)
	}
}

// FuzzSegmentCache: for every staged tokenizer, a text and that text twice around one of the
// model's added tokens (so the second encode reuses segments of the first), encoded through a small
// segment cache, give the uncached ids.
func FuzzSegmentCache(f *testing.F) {
	for _, s := range []string{"", " ", "Hello, world!", " <|im_end|>\n", "e\u0301 \u0301x", "<|eot_id|> ", "\U0001F9FF ꙮ", "[INST] hi [/INST]", "<｜User｜>hi "} {
		f.Add(s, uint8(0))
	}
	type model struct {
		tk, ct *Tokenizer
		added  []AddedToken
	}
	var ms []model
	for _, m := range refModels {
		dir, err := FindModelDir(DefaultRoots(), m)
		if err != nil {
			continue
		}
		tk, err := Load(dir)
		if err != nil {
			f.Fatalf("%s: %v", m, err)
		}
		ms = append(ms, model{tk, tk.WithSegmentCache(testSegmentCache(256 << 10)), tk.AddedTokens()})
	}
	if len(ms) == 0 {
		f.Skip("no reference tokenizer found (run `make tokenizers`)")
	}
	f.Fuzz(func(t *testing.T, s string, k uint8) {
		for _, m := range ms {
			sep := m.added[int(k)%len(m.added)].Content
			for _, text := range []string{s, s + sep + s, sep + s + sep} {
				for _, special := range []bool{false, true} {
					want, werr := m.tk.Encode(text, special)
					got, gerr := m.ct.Encode(text, special)
					if (werr == nil) != (gerr == nil) || !slices.Equal(got, want) {
						t.Fatalf("%s special=%v %+q: cached %v (%v), fresh %v (%v)", m.tk.Dir(), special, text, got, gerr, want, werr)
					}
				}
			}
		}
	})
}
