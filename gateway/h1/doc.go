// Package h1 owns the HTTP/1.1 wire exchange of the gateway's data path:
// a lean client-facing server that serves an ordinary http.Handler (Server),
// and an upstream client (Transport).
//
// Both sides share one header-block reader (header.go) so that the rules for
// what a field line may contain (RFC 9112 §5, RFC 9110 §5) live in one place.
//
// The package exists because net/http's per-request machinery (a background
// read goroutine, contexts, response structs, header snapshots) dominates the
// CPU cost of a small keep-alive request through the gateway. The server here
// keeps the semantics handlers rely on while allocating little per request.
//
// Two mechanisms span both sides. Each side flushes what it sends inside a
// RawConn.Read wait, so it never reads before the answer is there (net.Conn's
// read-first costs a failed read per request on a proxy). And a Transport
// exchange running under a Server request's own context registers with that
// request, whose cancellation interrupts it, instead of a context.AfterFunc.
package h1
