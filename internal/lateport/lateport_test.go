package lateport

import (
	"net"
	"strconv"
	"testing"
)

// TestPickOutsideEphemeral: every port picked lies outside the kernel's ephemeral range, is free
// when returned, and none is handed out twice.
func TestPickOutsideEphemeral(t *testing.T) {
	first, last := ephemeral()
	seen := map[int]bool{}
	for range 50 {
		p, err := Pick("127.0.0.1", 2)
		if err != nil {
			t.Fatal(err)
		}
		for r := range 2 {
			q := p + r
			if q >= first && q <= last {
				t.Fatalf("port %d inside the ephemeral range %d–%d", q, first, last)
			}
			if q < low || seen[q] {
				t.Fatalf("port %d below %d or handed out twice", q, low)
			}
			seen[q] = true
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
			if err != nil {
				t.Fatalf("picked port %d is not free: %v", q, err)
			}
			l.Close()
		}
	}
}

// TestPickSkipsBound: in a span of three ports, the two another listener holds are never picked,
// the third is, and once it is handed out the span has none left.
func TestPickSkipsBound(t *testing.T) {
	b, err := Pick("127.0.0.1", 3)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for r := range 3 {
		delete(given, b+r)
	}
	mu.Unlock()
	for r := range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(b+r))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	if p, err := pick("127.0.0.1", 1, b, b+3); err != nil || p != b+2 {
		t.Fatalf("pick in [%d, %d) with two bound = %d, %v; want %d", b, b+3, p, err, b+2)
	}
	if p, err := pick("127.0.0.1", 1, b, b+3); err == nil {
		t.Fatalf("pick with every port bound or handed out = %d, want an error", p)
	}
}

// TestSpan: the wider side of the ephemeral range is drawn from, never below low.
func TestSpan(t *testing.T) {
	for _, c := range []struct{ first, last, lo, hi int }{
		{32768, 60999, 10000, 32768},
		{1024, 65535, 10000, 10000}, // no room: the fallback
		{20000, 30000, 30001, 65536},
		{49152, 65535, 10000, 49152},
	} {
		if lo, hi := span(c.first, c.last); lo != c.lo || hi != c.hi {
			t.Errorf("span(%d, %d) = [%d, %d), want [%d, %d)", c.first, c.last, lo, hi, c.lo, c.hi)
		}
	}
}
