package security

import (
	"strings"

	"github.com/kvexact/kvexact/gateway/rules"
	"testing"
	"time"
)

// HTTP/1.1 framing and smuggling: a request whose length two parsers could read differently is
// refused, or answered once and the connection closed, so that nothing after its body is read as
// a second request. The smuggled request is always GET /v1/models (a 200 if it were answered).
// Each row: the raw request, the first status, how many responses the connection may carry, and
// whether the engine may see a request.
func TestFraming(t *testing.T) {
	// A short idle timeout closes every kept-alive connection soon after its last answer.
	g := start(t, func(c *rules.Config) { c.Server.IdleTimeout = rules.Duration(300 * time.Millisecond) })
	body := completionBody("")
	smuggled := "GET /v1/models HTTP/1.1\r\nHost: gw\r\n\r\n"
	for _, tc := range []struct {
		name, raw, want string
		responses       int
	}{
		{"CL and TE: TE wins, then closed", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(body) + smuggled, "200", 1},
		{"TE and CL", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + chunk(body) + smuggled, "200", 1},
		{"two differing Content-Lengths", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}" + smuggled, "400", 1},
		{"Content-Length list", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: 2, 3\r\n\r\n{}" + smuggled, "400", 1},
		{"negative Content-Length", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: -1\r\n\r\n" + smuggled, "400", 1},
		{"plus-signed Content-Length", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: +2\r\n\r\n{}" + smuggled, "400", 1},
		{"unknown Transfer-Encoding", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunk(body) + smuggled, "501", 1},
		{"Transfer-Encoding with a space before the colon", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding : chunked\r\nContent-Length: 2\r\n\r\n{}" + smuggled, "400", 1},
		// net/http unfolds obs-fold into one value (RFC 9112 §5.2 allows it): the framing is not in
		// doubt, so the pipelined request after the 2-byte body is a request of its own.
		{"obs-fold unfolded", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\n{}" + smuggled, "400", 2},
		{"overflowing chunk size", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff1\r\n{}\r\n0\r\n\r\n" + smuggled, "400", 1},
		{"chunk size with junk", "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2x\r\n{}\r\n0\r\n\r\n" + smuggled, "400", 1},
		{"bare LF line ends", "POST /v1/completions HTTP/1.1\nHost: gw\nContent-Length: 2\n\n{}", "", 0}, // net/http reads bare LF; the answer must be one response either way
		{"two Host headers", "GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "400", 1},
		{"no Host", "GET /v1/models HTTP/1.1\r\n\r\n", "400", 1},
		{"NUL in a header value", "GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-A: a\x00b\r\n\r\n", "400", 1},
		{"CR in a header value", "GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-A: a\rb\r\n\r\n", "400", 1},
		{"HTTP/0.9 request line", "GET /v1/models\r\n\r\n", "400", 1},
		{"HTTP/2 version on HTTP/1", "GET /v1/models HTTP/2.0\r\nHost: gw\r\n\r\n", "505", 1},
		{"header block over maxHeaderBytes", "GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-A: " + strings.Repeat("a", 70<<10) + "\r\n\r\n", "431", 1},
		{"too many header fields", "GET /v1/models HTTP/1.1\r\nHost: gw\r\n" + strings.Repeat("X-A: a\r\n", 101) + "\r\n", "431", 1},
		{"admin path on the client listener", "GET /admin/status HTTP/1.1\r\nHost: gw\r\n\r\n", "404", 1},
		{"metrics on the client listener", "GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n", "404", 1},
		{"engine admin route, absolute form", "POST http://127.0.0.1/reset_prefix_cache HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n\r\n", "404", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, held := exchange(t, g.client, tc.raw, 10*time.Second)
			if tc.want == "" {
				if n := responses(out); n > 1 {
					t.Fatalf("%d responses:\n%s", n, out)
				}
				return
			}
			if held {
				t.Fatalf("the connection was held past the idle timeout:\n%s", out)
			}
			if status(out) != tc.want {
				t.Fatalf("status %q, want %s:\n%s", status(out), tc.want, out)
			}
			if n := responses(out); n != tc.responses {
				t.Fatalf("%d responses, want %d (a smuggled request was answered):\n%s", n, tc.responses, out)
			}
		})
	}
}

func chunk(b string) string {
	return strings.ToLower(strings.TrimLeft(strings.ToUpper(hex(len(b))), "0")) + "\r\n" + b + "\r\n0\r\n\r\n"
}

func hex(n int) string {
	const digits = "0123456789abcdef"
	s := ""
	for ; n > 0; n /= 16 {
		s = string(digits[n%16]) + s
	}
	return s
}
