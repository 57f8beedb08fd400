package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
)

// seedRequests are the raw requests of the differential table.
func seedRequests() []string {
	var seeds []string
	for _, tc := range differentialCases(strings.Repeat("a", 300)) {
		seeds = append(seeds, tc.raw)
	}
	return seeds
}

// FuzzReadRequest parses arbitrary bytes as a request head and reads its
// body; nothing may panic, and an accepted request must be well-formed.
func FuzzReadRequest(f *testing.F) {
	for _, s := range seedRequests() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxHeader = 4 << 10
		br := bufio.NewReaderSize(bytes.NewReader(data), 64) // small: exercises long lines
		var r http.Request
		var info reqInfo
		err := readRequest(br, maxHeader, &r, &info)
		if err != nil {
			var re *requestError
			switch {
			case err == io.EOF:
			case errors.As(err, &re):
				switch re.status {
				case 400, 417, 431, 501, 505:
				default:
					t.Fatalf("status %d for %q", re.status, data)
				}
				if re.detail == "" {
					t.Fatal("error without detail")
				}
			default:
				t.Fatalf("unexpected error type %T: %v", err, err)
			}
			return
		}
		if !isToken(r.Method) {
			t.Fatalf("method %q is not a token", r.Method)
		}
		if r.Proto != "HTTP/1.1" && r.Proto != "HTTP/1.0" || r.ProtoMajor != 1 || r.Proto[7] != byte('0'+r.ProtoMinor) {
			t.Fatalf("proto %q %d.%d", r.Proto, r.ProtoMajor, r.ProtoMinor)
		}
		if r.URL == nil || r.RequestURI == "" {
			t.Fatal("no URL")
		}
		if r.RequestURI[0] != '/' && r.RequestURI != "*" && (r.URL.Scheme == "" || r.URL.Host == "") {
			t.Fatalf("request target %q is none of the allowed forms", r.RequestURI)
		}
		if r.ContentLength < -1 {
			t.Fatalf("ContentLength %d", r.ContentLength)
		}
		if (r.ContentLength == -1) != (info.bodyKind == bodyChunked) || (r.ContentLength > 0) != (info.bodyKind == bodyLength) {
			t.Fatalf("ContentLength %d with body kind %d", r.ContentLength, info.bodyKind)
		}
		if _, ok := r.Header["Host"]; ok {
			t.Fatal("Host left in the header map")
		}
		if invalidHostByte(r.Host) >= 0 && r.URL.Host == "" {
			t.Fatalf("invalid Host %q accepted", r.Host)
		}
		if r.ProtoMinor == 1 && r.Header["Transfer-Encoding"] != nil {
			t.Fatal("Transfer-Encoding left in the header map")
		}
		if info.bodyKind == bodyChunked && r.Header["Content-Length"] != nil {
			t.Fatal("both framings accepted")
		}
		for k, vv := range r.Header {
			if k != http.CanonicalHeaderKey(k) || !isToken(k) {
				t.Fatalf("key %q", k)
			}
			for _, v := range vv {
				if strings.ContainsAny(v, "\r\n\x00") || trimOWSString(v) != v {
					t.Fatalf("value %q", v)
				}
			}
		}
		// The body must read without panicking, and never past its length.
		if info.bodyKind != bodyNone {
			var b reqBody
			b.init(br, info.bodyKind, r.ContentLength, maxHeader)
			n, err := io.Copy(io.Discard, &b)
			if info.bodyKind == bodyLength && (n > r.ContentLength || err == nil && n != r.ContentLength) {
				t.Fatalf("read %d body bytes of %d (err %v)", n, r.ContentLength, err)
			}
		}

		// Whatever we accept, net/http's parser accepts too, the same way
		// (the documented exceptions aside).
		if bytes.HasPrefix(data, []byte("\r\n")) || bytes.HasPrefix(data, []byte("\n")) {
			return // we skip leading empty lines, net/http does not
		}
		ref, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data)))
		if err != nil {
			if r.RequestURI == "*" || r.ProtoMinor == 0 && info.expectContinue {
				return
			}
			t.Fatalf("net/http rejects what we accept: %v\n%q", err, data)
		}
		if ref.Method != r.Method || ref.RequestURI != r.RequestURI || ref.Host != r.Host || ref.ContentLength != r.ContentLength || ref.URL.String() != r.URL.String() {
			t.Fatalf("parsed differently:\nours     %s %s host %q cl %d url %s\nnet/http %s %s host %q cl %d url %s",
				r.Method, r.RequestURI, r.Host, r.ContentLength, r.URL, ref.Method, ref.RequestURI, ref.Host, ref.ContentLength, ref.URL)
		}
	})
}

// FuzzReadHeader reads arbitrary bytes as a header block; nothing may panic,
// and an accepted block must hold canonical keys and clean values, the same
// that net/textproto reads.
func FuzzReadHeader(f *testing.F) {
	for _, s := range seedRequests() {
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			f.Add([]byte(s[i+1:])) // the block after the request line
		}
	}
	f.Add([]byte("A: 1\r\n b\r\n\r\n"))
	f.Add([]byte("a-b-c: x\r\nA-B-C: y\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 32)
		h := http.Header{}
		budget := 1 << 10
		err := readHeader(br, h, &budget)
		if budget < 0 {
			t.Fatalf("budget overdrawn: %d", budget)
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "header line ") {
				t.Fatalf("error %q does not name the line", err)
			}
			return
		}
		used := 1<<10 - budget
		if used > len(data)+bytes.Count(data, []byte("\n")) {
			t.Fatalf("charged %d bytes for %d of input", used, len(data))
		}
		for k, vv := range h {
			if k != http.CanonicalHeaderKey(k) || !isToken(k) {
				t.Fatalf("key %q", k)
			}
			for _, v := range vv {
				if strings.ContainsAny(v, "\r\n\x00") || trimOWSString(v) != v {
					t.Fatalf("value %q", v)
				}
			}
		}
		ref, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(data))).ReadMIMEHeader()
		if err != nil {
			t.Fatalf("net/textproto rejects what we accept: %v\n%q", err, data)
		}
		if len(ref) != len(h) {
			t.Fatalf("%d keys, net/textproto %d", len(h), len(ref))
		}
		for k, vv := range ref {
			if strings.Join(vv, "\x00") != strings.Join(h[k], "\x00") {
				t.Fatalf("%s: %q, net/textproto %q", k, h[k], vv)
			}
		}
	})
}
