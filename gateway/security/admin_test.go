package security

import (
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/rules"
)

// shortDeadlines makes the gateway's read deadlines short enough for a test to outlast them.
func shortDeadlines(c *rules.Config) {
	c.Server.ReadHeaderTimeout = rules.Duration(500 * time.Millisecond)
	c.Server.BodyTimeout = rules.Duration(500 * time.Millisecond)
}

// The admin listener reads every request within the header and body deadlines, authenticated or
// not: a client that declares a body and sends one byte of it is answered and closed, never held
// (net/http discards an unread body before it closes, and without a read deadline waits for it).
func TestAdminBodyDeadline(t *testing.T) {
	g := start(t, shortDeadlines)
	for _, tc := range []struct {
		name, auth string
		want       string // the status the client reads before the connection closes
	}{
		{"no token", "", "401"},
		{"wrong token", "Authorization: Bearer nope\r\n", "401"},
		{"valid token, body too slow", "Authorization: Bearer " + token + "\r\n", "400"}, // the decoder's read fails at the deadline
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := "POST /admin/rules HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n" + tc.auth + "Content-Length: 1000\r\n\r\n{"
			out, held := exchange(t, g.admin, raw, 8*time.Second)
			if held {
				t.Fatalf("the admin listener held the connection past the test's 8 s (deadlines 0.5 s); read so far:\n%s", out)
			}
			if status(out) != tc.want {
				t.Fatalf("status %q, want %s:\n%s", status(out), tc.want, out)
			}
		})
	}
}

// Without the right token every admin path answers 401 and nothing else; with a body it also
// closes the connection (the body is never read). Each row: the request's credentials and path,
// what the gateway must answer.
func TestAdminTokenBypasses(t *testing.T) {
	g := start(t, nil)
	for _, tc := range []struct {
		name, request, want string
	}{
		{"no header", "GET /admin/status HTTP/1.1\r\nHost: gw\r\n\r\n", "401"},
		{"basic scheme", "GET /admin/status HTTP/1.1\r\nHost: gw\r\nAuthorization: Basic " + token + "\r\n\r\n", "401"},
		{"token as scheme", "GET /admin/status HTTP/1.1\r\nHost: gw\r\nAuthorization: " + token + "\r\n\r\n", "401"},
		{"token prefix", "GET /admin/status HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + token[:len(token)-1] + "\r\n\r\n", "401"},
		{"token plus suffix", "GET /admin/status HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + token + "x\r\n\r\n", "401"},
		{"token in the query", "GET /admin/status?token=" + token + " HTTP/1.1\r\nHost: gw\r\n\r\n", "401"},
		{"two headers, second right", "GET /admin/status HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer x\r\nAuthorization: Bearer " + token + "\r\n\r\n", "401"},
		{"metrics without token", "GET /metrics HTTP/1.1\r\nHost: gw\r\n\r\n", "401"},
		{"dot segments to metrics", "GET /admin/../metrics HTTP/1.1\r\nHost: gw\r\n\r\n", "401"},
		{"pprof without token", "GET /debug/pprof/ HTTP/1.1\r\nHost: gw\r\n\r\n", "401"},
		{"NUL in the token", "GET /admin/status HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + token + "\x00\r\n\r\n", "400"}, // net/http refuses the header
		{"lower-case scheme is the scheme", "GET /admin/status HTTP/1.1\r\nHost: gw\r\nAuthorization: bearer " + token + "\r\n\r\n", "200"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, held := exchange(t, g.admin, strings.Replace(tc.request, "\r\n\r\n", "\r\nConnection: close\r\n\r\n", 1), 8*time.Second)
			if held || status(out) != tc.want {
				t.Fatalf("held %v, status %q, want %s:\n%s", held, status(out), tc.want, out)
			}
			if tc.want == "401" && !strings.HasSuffix(out, "unauthorized\n") {
				t.Fatalf("a 401 says more than unauthorized:\n%s", out)
			}
		})
	}
}
