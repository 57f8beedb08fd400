package tokenize

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// Benchmark inputs (same as bench/hf-encode.js): the first 32768 bytes of Debian's GPL-3 text, and
// GPL-3 + GFDL-1.3 cut after token 8192 (the decode of the first 8192 ids).
func benchInputs(b *testing.B, tk *Tokenizer) (text32k, text8k string) {
	gpl, err1 := os.ReadFile("/usr/share/common-licenses/GPL-3")
	gfdl, err2 := os.ReadFile("/usr/share/common-licenses/GFDL-1.3")
	if err1 != nil || err2 != nil {
		b.Skip("benchmark text missing: /usr/share/common-licenses/{GPL-3,GFDL-1.3} (Debian base-files)")
	}
	ids, err := tk.Encode(string(gpl)+string(gfdl), false)
	if err != nil || len(ids) < 8192 {
		b.Fatalf("building the 8k-token prompt: %v (%d ids)", err, len(ids))
	}
	text8k, err = tk.Decode(ids[:8192], false)
	if err != nil {
		b.Fatal(err)
	}
	return string(gpl[:32768]), text8k
}

func BenchmarkEncode(b *testing.B) {
	for _, model := range []string{"llama3", "qwen3", "gptoss"} {
		tk := loadRefTokenizer(b, model)
		t32, t8 := benchInputs(b, tk)
		for _, in := range []struct{ name, text string }{{"32KB", t32}, {"8k-tokens", t8}} {
			b.Run(model+"/"+in.name, func(b *testing.B) {
				ids, _ := tk.Encode(in.text, true) // warm the word cache, as HF's is in its benchmark
				b.SetBytes(int64(len(in.text)))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					ids, _ = tk.AppendEncode(ids[:0], in.text, true)
				}
				b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}

// BenchmarkEncodeCold is the first encode after load: the word cache is empty.
func BenchmarkEncodeCold(b *testing.B) {
	tk := loadRefTokenizer(b, "llama3")
	t32, _ := benchInputs(b, tk)
	b.SetBytes(int64(len(t32)))
	var n int
	for i := 0; i < b.N; i++ {
		tk.model.cache.init(8192)
		ids, _ := tk.Encode(t32, true)
		n = len(ids)
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkLoad is loading llama3's tokenizer.json (9 MB).
func BenchmarkLoad(b *testing.B) {
	dir, err := FindModelDir(DefaultRoots(), "llama3")
	if err != nil {
		b.Skip(err)
	}
	for i := 0; i < b.N; i++ {
		if _, err := Load(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// multiTurnPrompt is a ChatML conversation of about n tokens (turns of ≈ 2000 tokens cut from the
// GPL-3 / GFDL text), ending after an assistant turn, and a new user turn i to append to it.
func multiTurnPrompt(b *testing.B, tk *Tokenizer, n int) (prefix string, turn func(i int) string) {
	gpl, err1 := os.ReadFile("/usr/share/common-licenses/GPL-3")
	gfdl, err2 := os.ReadFile("/usr/share/common-licenses/GFDL-1.3")
	if err1 != nil || err2 != nil {
		b.Skip("benchmark text missing: /usr/share/common-licenses/{GPL-3,GFDL-1.3} (Debian base-files)")
	}
	src := string(gpl) + string(gfdl)
	var sb strings.Builder
	for k := 0; ; k++ {
		ids, _ := tk.Encode(sb.String(), false)
		if len(ids) >= n {
			break
		}
		off := (k * 7919) % (len(src) - 9000)
		fmt.Fprintf(&sb, "<|im_start|>%s\n%d. %s<|im_end|>\n", []string{"user", "assistant"}[k%2], k, src[off:off+8000])
	}
	return sb.String(), func(i int) string {
		off := (i * 104729) % (len(src) - 3000)
		return fmt.Sprintf("<|im_start|>user\nQuestion %d: %s<|im_end|>\n<|im_start|>assistant\n", i, src[off:off+2000])
	}
}

// BenchmarkEncodeMultiTurn is a 100k-token multi-turn prompt (qwen3's ChatML) with one new user
// turn per iteration: "cold" encodes it without a segment cache (BPE's word cache warm, as in
// BenchmarkEncode), "segment-cache" with the earlier turns cached by the previous request.
func BenchmarkEncodeMultiTurn(b *testing.B) {
	tk := loadRefTokenizer(b, "qwen3")
	prefix, turn := multiTurnPrompt(b, tk, 100_000)
	cached := tk.WithSegmentCache(NewSegmentCache(DefaultSegmentCacheBytes))
	for _, c := range []struct {
		name string
		tk   *Tokenizer
	}{{"cold", tk}, {"segment-cache", cached}} {
		b.Run(c.name, func(b *testing.B) {
			ids, _ := c.tk.Encode(prefix, false) // the previous request: earlier turns
			b.SetBytes(int64(len(prefix)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				ids, _ = c.tk.AppendEncode(ids[:0], prefix+turn(i), false)
			}
			b.ReportMetric(float64(len(ids)), "tokens")
		})
	}
}
