package security

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/kvexact/kvexact/gateway/rules"
)

// h2conn is a raw HTTP/2 connection with prior knowledge (the listener's server.h2c).
type h2conn struct {
	c  net.Conn
	fr *http2.Framer
}

func dialH2(t *testing.T, addr string) *h2conn {
	t.Helper()
	c := dial(t, addr, 20*time.Second)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	return &h2conn{c: c, fr: fr}
}

func headerBlock(path string, extra ...string) []byte {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "gw"}, {":path", path}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for i := 0; i+1 < len(extra); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: extra[i], Value: extra[i+1]})
	}
	return buf.Bytes()
}

// closed reports whether the server ends the connection (GOAWAY or EOF) within the bound.
func (h *h2conn) closed() bool {
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			return !isTimeout(err)
		}
		if _, ok := f.(*http2.GoAwayFrame); ok {
			return true
		}
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// stillServes is the verdict of every flood: another client is answered at once.
func stillServes(t *testing.T, g *gw) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + g.client + "/v1/models")
	if err != nil {
		t.Fatalf("after the flood another client is not served: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after the flood another client got %d", resp.StatusCode)
	}
}

func h2gateway(t *testing.T) *gw {
	return start(t, func(c *rules.Config) { c.Server.H2C = true })
}

// HTTP/2 floods, each with its expectation: the flooding connection is ended or absorbed, the
// gateway keeps serving everyone else.
func TestH2Floods(t *testing.T) {
	// Rapid reset (CVE-2023-44487): streams opened and reset at once, thousands of them. net/http
	// bounds the handlers they start; the gateway keeps serving.
	t.Run("rapid reset", func(t *testing.T) {
		g := h2gateway(t)
		h := dialH2(t, g.client)
		block := headerBlock("/v1/models")
		for i := uint32(0); i < 5000; i++ {
			id := 2*i + 1
			if h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: true, EndHeaders: true}) != nil ||
				h.fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
				break // the server ended the connection: also a pass
			}
		}
		stillServes(t, g)
	})
	// CONTINUATION flood (CVE-2024-27316 class): one header block that never ends. The server
	// must end the connection once the block passes its header limit, not buffer it forever.
	t.Run("continuation flood", func(t *testing.T) {
		g := h2gateway(t)
		h := dialH2(t, g.client)
		junk := headerBlock("/v1/models", "x-a", strings.Repeat("a", 8<<10))
		if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: headerBlock("/v1/models"), EndHeaders: false}); err != nil {
			t.Fatal(err)
		}
		go func() {
			for i := 0; i < 2000; i++ { // 16 MiB of CONTINUATION if nothing stops it
				if h.fr.WriteContinuation(1, false, junk) != nil {
					return
				}
			}
		}()
		if !h.closed() {
			t.Fatal("the server kept reading an endless header block")
		}
		stillServes(t, g)
	})
	// PING flood: every PING is answered or the connection ended; nothing else is starved.
	t.Run("ping flood", func(t *testing.T) {
		g := h2gateway(t)
		h := dialH2(t, g.client)
		go func() { _, _ = io.Copy(io.Discard, h.c) }()
		for i := 0; i < 20000; i++ {
			if h.fr.WritePing(false, [8]byte{byte(i)}) != nil {
				break
			}
		}
		stillServes(t, g)
	})
	// HPACK: a header list far over maxHeaderBytes, made of one large literal repeated through the
	// dynamic table, is refused (431 or a reset), never decoded whole into memory.
	t.Run("hpack header list bomb", func(t *testing.T) {
		g := h2gateway(t)
		h := dialH2(t, g.client)
		var buf bytes.Buffer
		enc := hpack.NewEncoder(&buf)
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "gw"}, {":path", "/v1/models"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		big := hpack.HeaderField{Name: "x-a", Value: strings.Repeat("a", 3000)}
		for i := 0; i < 3000; i++ { // ≈ 9 MB decoded from a few KiB: indexed after the first
			_ = enc.WriteField(big)
		}
		if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: buf.Bytes(), EndStream: true, EndHeaders: true}); err != nil && buf.Len() < 16<<10 {
			t.Fatal(err)
		}
		for {
			f, err := h.fr.ReadFrame()
			if err != nil {
				break // connection ended
			}
			if hf, ok := f.(*http2.HeadersFrame); ok && hf.StreamID == 1 {
				dec := hpack.NewDecoder(4096, nil)
				fields, _ := dec.DecodeFull(hf.HeaderBlockFragment())
				for _, fl := range fields {
					if fl.Name == ":status" && fl.Value == "200" {
						t.Fatal("a 9 MB header list was accepted")
					}
				}
				break
			}
			if _, ok := f.(*http2.RSTStreamFrame); ok {
				break
			}
			if _, ok := f.(*http2.GoAwayFrame); ok {
				break
			}
		}
		stillServes(t, g)
	})
}
