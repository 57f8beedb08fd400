package h1

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"testing"
)

// FuzzReadResponse feeds arbitrary bytes to the transport's response reader as an upstream's answer:
// it must never panic, and what it accepts must be coherent (a final status, framing that agrees
// with the body actually read).
func FuzzReadResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n",
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nuntil close",
		"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n",
		"HTTP/1.1 2000 OK\r\n\r\n",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, head bool) {
		a, b := net.Pipe()
		defer b.Close()
		cc := &clientConn{t: &Transport{MaxResponseHeaderBytes: 8 << 10}, addr: "fuzz", nc: a,
			br: bufio.NewReaderSize(bytes.NewReader(data), 4<<10)}
		method := http.MethodGet
		if head {
			method = http.MethodHead
		}
		req, _ := http.NewRequest(method, "http://fuzz/", nil)
		r, err := cc.readResponse(req)
		if err != nil {
			return
		}
		resp := &r.resp
		if resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols || resp.StatusCode > 999 {
			t.Fatalf("accepted status %d", resp.StatusCode)
		}
		if resp.TransferEncoding != nil && resp.ContentLength != -1 {
			t.Fatalf("chunked with ContentLength %d", resp.ContentLength)
		}
		cc.attachBody(req, r, nil, nil)
		got, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err == nil && resp.ContentLength >= 0 && !head && int64(len(got)) != resp.ContentLength && len(got) < 1<<20 {
			t.Fatalf("read %d body bytes, Content-Length said %d", len(got), resp.ContentLength)
		}
		if head && len(got) != 0 {
			t.Fatalf("a HEAD response had a %d-byte body", len(got))
		}
	})
}
