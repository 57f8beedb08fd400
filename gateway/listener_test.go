package gateway_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/rules"
)

// TestListenerTimeouts: the admin listener has the client listeners' header and idle timeouts: a
// connection that sends nothing, or half a request head, is closed by the server.
func TestListenerTimeouts(t *testing.T) {
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 1, seed: strp("0"), mode: 0, cfgMod: func(c *rules.Config) {
		c.Server.ReadHeaderTimeout = rules.Duration(300 * time.Millisecond)
		c.Server.IdleTimeout = rules.Duration(300 * time.Millisecond)
	}})
	for name, addr := range map[string]string{"admin": p.srv.Admin, "client": p.srv.Client["127.0.0.1:0"]} {
		for what, send := range map[string]string{"nothing": "", "half a head": "GET /admin/status HTTP/1.1\r\nHost: x\r\n"} {
			t.Run(name+"/"+what, func(t *testing.T) {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second)) // the test's bound, far past the server's
				if _, err := io.WriteString(c, send); err != nil {
					t.Fatal(err)
				}
				_, err = io.ReadAll(c)
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatal("the server never closed the connection")
				}
			})
		}
	}
}
