package parity

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/kvexact/kvexact/gateway/hashcore"
)

// fuzzInput derives a binding, tokens and extras from fuzz bytes.
func fuzzInput(data []byte) (hashcore.Binding, []uint32, *hashcore.Extras, int) {
	take := func(n int) []byte {
		if len(data) < n {
			out := make([]byte, n)
			copy(out, data)
			data = nil
			return out
		}
		out := data[:n]
		data = data[n:]
		return out
	}
	hdr := take(8)
	a := hashcore.Algorithms[int(hdr[0])%len(hashcore.Algorithms)]
	b := hashcore.Binding{Algorithm: a, BlockSize: 1 + int(hdr[1])%40}
	if a.IsVLLM() {
		s := string(take(int(hdr[2]) % 6))
		b.Seed = &s
	}
	if a == hashcore.SGLangSHA256 {
		b.Bigram = hdr[3]&1 == 1
	}
	ex := &hashcore.Extras{}
	if hdr[4]&1 != 0 {
		ex.LoRAName = string(take(int(hdr[5]) % 5))
	}
	if hdr[4]&2 != 0 {
		ex.CacheSalt = string(take(int(hdr[6]) % 5))
	}
	if hdr[4]&4 != 0 && a != hashcore.SGLangSHA256 {
		off := 0
		for i := range int(hdr[7]) % 4 {
			m := take(3)
			off += int(m[0]) % 20
			ex.MM = append(ex.MM, hashcore.MMFeature{Identifier: string(rune('a' + i%2)), Offset: off, Length: int(m[1]) % 30})
		}
	}
	if hdr[4]&8 != 0 && a != hashcore.SGLangSHA256 {
		ex.PromptEmbeds = [][]byte{}
		for range int(hdr[5]) % 30 {
			ex.PromptEmbeds = append(ex.PromptEmbeds, take(4))
		}
	}
	var tokens []uint32
	for len(data) >= 4 && len(tokens) < 600 {
		tokens = append(tokens, binary.LittleEndian.Uint32(take(4)))
	}
	promptLen := 0
	if len(tokens) > 0 {
		promptLen = int(hdr[6]) % len(tokens)
	}
	return b, tokens, ex, promptLen
}

// FuzzGoVsC is the differential fuzz: the C core must agree with the Go reference on every key,
// digest, block-0 pre-image and incremental sequence, or fail the same way.
func FuzzGoVsC(f *testing.F) {
	f.Add([]byte{0, 15, 1, 0, 0, 0, 0, 0, '0', 1, 0, 0, 0, 2, 0, 0, 0})
	f.Add([]byte{1, 3, 2, 0, 15, 3, 2, 3, '4', '2', 'l', 'o', 'r', 's', 'a', 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 255, 255, 255, 255})
	f.Add([]byte{4, 3, 0, 1, 2, 0, 4, 0, 't', 'e', 'n', 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0, 5, 0, 0, 0})
	f.Add([]byte{5, 1, 0, 0, 5, 1, 1, 2, 'x', 'y', 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Fuzz(func(t *testing.T, data []byte) {
		if !hashcore.ImplC.Available() {
			t.Skip("C core not built")
		}
		b, tokens, ex, promptLen := fuzzInput(data)
		g, gerr := hashcore.New(b, hashcore.ImplGo)
		c, cerr := hashcore.New(b, hashcore.ImplC)
		if (gerr == nil) != (cerr == nil) {
			t.Fatalf("New: go %v, c %v", gerr, cerr)
		}
		if gerr != nil {
			return
		}
		if !bytes.Equal(g.Root(), c.Root()) {
			t.Fatalf("root: go %x, c %x", g.Root(), c.Root())
		}
		gd, gk, gerr := g.Digests(tokens, ex)
		cd, ck, cerr := c.Digests(tokens, ex)
		if (gerr == nil) != (cerr == nil) {
			t.Fatalf("errors differ: go %v, c %v", gerr, cerr)
		}
		if gerr != nil {
			return
		}
		if !reflect.DeepEqual(gk, ck) || !reflect.DeepEqual(gd, cd) {
			t.Fatalf("%+v: keys go %x, c %x", b, gk, ck)
		}
		if len(gk) > 0 {
			gp, _ := g.FirstPreimage(tokens, ex)
			cp, _ := c.FirstPreimage(tokens, ex)
			if !bytes.Equal(gp, cp) {
				t.Fatalf("pre-image: go %x, c %x", gp, cp)
			}
		}
		gs, cs := g.NewSequence(ex), c.NewSequence(ex)
		_, e1 := gs.Append(tokens[:promptLen]...)
		_, e2 := cs.Append(tokens[:promptLen]...)
		for _, tk := range tokens[promptLen:] {
			if e1 != nil || e2 != nil {
				break
			}
			_, e1 = gs.Append(tk)
			_, e2 = cs.Append(tk)
		}
		if (e1 == nil) != (e2 == nil) || !reflect.DeepEqual(gs.Keys(), cs.Keys()) {
			t.Fatalf("sequence: go %x (%v), c %x (%v)", gs.Keys(), e1, cs.Keys(), e2)
		}
	})
}
