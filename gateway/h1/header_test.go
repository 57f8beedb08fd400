package h1

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func TestReadLine(t *testing.T) {
	for _, tc := range []struct {
		in      string
		size    int // bufio size; 0 = default
		budget  int
		want    []string
		wantErr error
		left    int // budget left after the lines
	}{
		{in: "abc\r\ndef\n", budget: 100, want: []string{"abc", "def"}, left: 100 - 5 - 5},
		{in: "abc\r\n", budget: 5, want: []string{"abc"}, left: 0},
		{in: "abc\r\n", budget: 4, wantErr: ErrHeaderTooLarge},
		{in: "abc\n", budget: 5, want: []string{"abc"}, left: 0},
		{in: "a\rb\r\n", budget: 100, want: []string{"a\rb"}, left: 95},
		{in: "", budget: 100, wantErr: io.EOF},
		{in: "abc", budget: 100, wantErr: io.ErrUnexpectedEOF},
		// Longer than the reader's buffer: assembled across reads.
		{in: strings.Repeat("x", 100) + "\r\n", size: 16, budget: 102, want: []string{strings.Repeat("x", 100)}, left: 0},
		{in: strings.Repeat("x", 100) + "\r\n", size: 16, budget: 101, wantErr: ErrHeaderTooLarge},
		{in: strings.Repeat("x", 100), size: 16, budget: 1000, wantErr: io.ErrUnexpectedEOF},
		{in: strings.Repeat("x", 1000) + "\r\n", size: 16, budget: 50, wantErr: ErrHeaderTooLarge},
	} {
		br := bufio.NewReader(strings.NewReader(tc.in))
		if tc.size > 0 {
			br = bufio.NewReaderSize(strings.NewReader(tc.in), tc.size)
		}
		budget := tc.budget
		var got []string
		var err error
		for {
			var line []byte
			if line, err = readLine(br, &budget); err != nil {
				break
			}
			got = append(got, string(line))
		}
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) || len(got) != len(tc.want) {
				t.Errorf("%.20q: lines %q err %v, want %q then %v", tc.in, got, err, tc.want, tc.wantErr)
			}
			continue
		}
		if err != io.EOF || !reflect.DeepEqual(got, tc.want) || budget != tc.left {
			t.Errorf("%.20q: lines %q err %v budget %d, want %q, EOF, budget %d", tc.in, got, err, budget, tc.want, tc.left)
		}
	}
}

func TestReadHeader(t *testing.T) {
	in := "content-type: application/json\r\n" +
		"X-REQUEST-ID:   abc \t\r\n" +
		"x-custom-thing: 1\r\n" +
		"X-Custom-Thing: 2\r\n" +
		"accept:\r\n" +
		"Weird_Name.x: v:w\r\n" +
		"\r\n" +
		"rest"
	br := bufio.NewReader(strings.NewReader(in))
	h := http.Header{}
	budget := 1000
	if err := readHeader(br, h, &budget); err != nil {
		t.Fatal(err)
	}
	want := http.Header{
		"Content-Type":   {"application/json"},
		"X-Request-Id":   {"abc"},
		"X-Custom-Thing": {"1", "2"},
		"Accept":         {""},
		"Weird_name.x":   {"v:w"},
	}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("got %q\nwant %q", h, want)
	}
	if budget != 1000-(len(in)-len("rest")) {
		t.Errorf("budget left %d, want %d", budget, 1000-(len(in)-len("rest")))
	}
	if rest, _ := io.ReadAll(br); string(rest) != "rest" {
		t.Errorf("read past the header block: rest %q", rest)
	}
	// Appending to a value slice must not write into another key's values.
	h["Accept"] = append(h["Accept"], "x")
	if h["X-Custom-Thing"][0] != "1" || h["Content-Type"][0] != "application/json" {
		t.Error("values share writable backing")
	}
}

func TestReadHeaderErrors(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		is       error
	}{
		{in: "A: 1\r\nB: 2\r\nx y: 3\r\n\r\n", want: `header line 3: invalid field name "x y"`},
		{in: "A: 1\r\n b\r\n\r\n", want: "header line 2: obs-fold (line folding) is not allowed"},
		{in: "A: 1\r\n\tb\r\n\r\n", want: "header line 2: obs-fold (line folding) is not allowed"},
		{in: " A: 1\r\n\r\n", want: "header line 1: whitespace before the first header field"},
		{in: "A 1\r\n\r\n", want: `header line 1: missing colon in "A 1"`},
		{in: ": 1\r\n\r\n", want: "header line 1: empty field name"},
		{in: "A : 1\r\n\r\n", want: `header line 1: invalid field name "A "`},
		{in: "A: x\x00y\r\n\r\n", want: "header line 1: invalid byte 0x00 in value of A at offset 4"},
		{in: "A: x\ry\r\n\r\n", want: "header line 1: invalid byte 0x0d in value of A at offset 4"},
		{in: "Ab: \x7f\r\n\r\n", want: "header line 1: invalid byte 0x7f in value of Ab at offset 4"},
		{in: "A\xff: 1\r\n\r\n", want: `header line 1: invalid field name "A\xff"`},
		{in: "A: 1\r\n", is: io.ErrUnexpectedEOF, want: "header line 2: unexpected EOF"},
		{in: "A: 1\r\nB: 2", is: io.ErrUnexpectedEOF, want: "header line 2: unexpected EOF"},
		{in: "A: " + strings.Repeat("v", 100) + "\r\n\r\n", is: ErrHeaderTooLarge, want: "header line 1: h1: header block too large"},
	} {
		budget := 64
		err := readHeader(bufio.NewReader(strings.NewReader(tc.in)), http.Header{}, &budget)
		if err == nil || err.Error() != tc.want || tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("%q: err %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestCanonicalKey(t *testing.T) {
	for _, k := range []string{"content-type", "CONTENT-LENGTH", "x-request-id", "x-forwarded-for", "a", "a-b-c", "foo_bar", "x-1a", "-x", "x--y",
		"ACCEPT-ENCODING", "www-authenticate", strings.Repeat("ab-", 40)} {
		if got, want := canonicalKey([]byte(k)), http.CanonicalHeaderKey(k); got != want {
			t.Errorf("canonicalKey(%q) = %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"content-type", "Content-Length", "HOST", "accept", "user-agent", "connection", "transfer-encoding",
		"authorization", "x-request-id", "x-forwarded-for", "accept-encoding", "cache-control", "date", "server", "expect"} {
		b := []byte(k)
		if n := testing.AllocsPerRun(100, func() { canonicalKey(b) }); n != 0 {
			t.Errorf("canonicalKey(%q) allocates %v times; common keys are interned", k, n)
		}
	}
}

func TestReadHeaderAllocs(t *testing.T) {
	block := "Host: x\r\nContent-Type: a\r\nContent-Length: 1\r\nAccept: b\r\nUser-Agent: c\r\nX-Request-Id: d\r\n\r\n"
	sr := strings.NewReader(block)
	br := bufio.NewReader(sr)
	h := make(http.Header, 8)
	n := testing.AllocsPerRun(100, func() {
		sr.Reset(block)
		br.Reset(sr)
		clear(h)
		budget := 1 << 20
		if err := readHeader(br, h, &budget); err != nil {
			t.Fatal(err)
		}
	})
	// One string for all values and one []string backing; the keys are
	// interned and the map has room.
	if n > 2 {
		t.Errorf("readHeader of 6 common fields: %v allocations, want 2", n)
	}
}

func TestAppendHeader(t *testing.T) {
	h := http.Header{
		"Content-Type": {"text/plain"},
		"X-Multi":      {"a", "b"},
		"X-Evil":       {"ok", "bad\r\nSet-Cookie: x", "bad\nX: y", "bad\r"},
		"Bad Key":      {"v"},
		"Bad\r\nKey":   {"v"},
		"":             {"v"},
	}
	got := string(appendHeader([]byte("start\r\n"), h))
	for _, want := range []string{"start\r\n", "Content-Type: text/plain\r\n", "X-Multi: a\r\nX-Multi: b\r\n", "X-Evil: ok\r\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in %q", want, got)
		}
	}
	if strings.Count(got, "\r\n") != 5 || strings.Contains(got, "bad") || strings.Contains(got, "Key") {
		t.Errorf("injected or invalid fields written: %q", got)
	}
	if strings.Count(got, "\n") != strings.Count(got, "\r\n") {
		t.Errorf("bare LF written: %q", got)
	}
}

func TestHeaderValuesContainToken(t *testing.T) {
	for _, tc := range []struct {
		vv    []string
		token string
		want  bool
	}{
		{[]string{"close"}, "close", true},
		{[]string{"Close"}, "close", true},
		{[]string{"keep-alive, close"}, "close", true},
		{[]string{"keep-alive ,\tCLOSE\t"}, "close", true},
		{[]string{"keep-alive", "upgrade, close"}, "close", true},
		{[]string{"closed"}, "close", false},
		{[]string{"x-close"}, "close", false},
		{[]string{"clo se"}, "close", false},
		{[]string{""}, "close", false},
		{nil, "close", false},
		{[]string{",,close,,"}, "close", true},
		{[]string{"Keep-Alive"}, "keep-alive", true},
	} {
		if got := headerValuesContainToken(tc.vv, tc.token); got != tc.want {
			t.Errorf("%q contains %q: %v, want %v", tc.vv, tc.token, got, tc.want)
		}
	}
}
