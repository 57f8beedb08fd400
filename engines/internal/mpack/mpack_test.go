package mpack

import (
	"encoding/hex"
	"math"
	"testing"
)

func TestIntForms(t *testing.T) {
	cases := []struct {
		v    int64
		want string
	}{
		{0, "00"}, {127, "7f"}, {128, "cc80"}, {255, "ccff"}, {256, "cd0100"}, {65535, "cdffff"},
		{65536, "ce00010000"}, {math.MaxUint32, "ceffffffff"}, {math.MaxUint32 + 1, "cf0000000100000000"},
		{-1, "ff"}, {-32, "e0"}, {-33, "d0df"}, {-128, "d080"}, {-129, "d1ff7f"}, {-32769, "d2ffff7fff"},
		{math.MinInt32 - 1, "d3ffffffff7fffffff"}, {math.MinInt64, "d38000000000000000"},
	}
	for _, c := range cases {
		b := AppendInt(nil, c.v)
		if hex.EncodeToString(b) != c.want {
			t.Errorf("%d: %x, want %s", c.v, b, c.want)
		}
		r := NewReader(b)
		bits, neg, err := r.Int()
		if err != nil || int64(bits) != c.v || neg != (c.v < 0) || r.Len() != 0 {
			t.Errorf("%d read back as %d %v %v", c.v, int64(bits), neg, err)
		}
	}
}

func TestStrAndContainerForms(t *testing.T) {
	for n, want := range map[int]string{0: "a0", 31: "bf", 32: "d920", 255: "d9ff", 256: "da0100"} {
		s := make([]byte, n)
		b := AppendStr(nil, string(s))
		if hex.EncodeToString(b[:len(b)-n]) != want {
			t.Errorf("str %d: header %x, want %s", n, b[:len(b)-n], want)
		}
		r := NewReader(b)
		if got, err := r.Str(); err != nil || len(got) != n {
			t.Errorf("str %d: %v", n, err)
		}
	}
	for n, want := range map[int]string{0: "90", 15: "9f", 16: "dc0010", 65536: "dd00010000"} {
		if got := hex.EncodeToString(AppendArrayLen(nil, n)); got != want {
			t.Errorf("array %d: %s, want %s", n, got, want)
		}
	}
}

func TestHostileLengthsAndDepth(t *testing.T) {
	r := NewReader([]byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x00})
	if _, err := r.ArrayLen(); err == nil {
		t.Fatal("4G-element array header accepted")
	}
	deep := make([]byte, 1000)
	for i := range deep {
		deep[i] = 0x91
	}
	r = NewReader(deep)
	if err := r.Skip(); err == nil {
		t.Fatal("1000-deep nesting accepted")
	}
	r = NewReader([]byte{0xc1})
	if _, err := r.Peek(); err == nil {
		t.Fatal("reserved marker accepted")
	}
}

func TestAnyRoundTrip(t *testing.T) {
	in := []any{"a", uint64(3), int64(-2), []byte{1}, nil, true, 1.5, []any{"x", int64(-66)}}
	b, err := AppendAny(nil, in)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReader(b)
	out, err := r.Any()
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := AppendAny(nil, out)
	if hex.EncodeToString(b) != hex.EncodeToString(b2) {
		t.Fatalf("%x != %x", b, b2)
	}
}
