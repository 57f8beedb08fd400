package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestEPPUsage: ctk epp without its required flags, or with an unreadable CA, exits 2 naming the
// flag.
func TestEPPUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--picker and --pool are required"},
		{[]string{"--picker", "127.0.0.1:1"}, "--picker and --pool are required"},
		{[]string{"--picker", "127.0.0.1:1", "--pool", "127.0.0.1:2", "--tls-ca", "/nonexistent"}, "--tls-ca"},
		{[]string{"--bogus"}, "bogus"},
		// The self-starting mode: a pool address that cannot be listened on is unusable input.
		{[]string{"--picker", "127.0.0.1:1", "--pool", "192.0.2.1:1", "--envoy", "/nonexistent"}, "192.0.2.1:1"},
	} {
		var out, errb bytes.Buffer
		if code := eppCommand(context.Background(), c.args, &out, &errb); code != 2 || !strings.Contains(errb.String(), c.want) {
			t.Fatalf("%v: exit %d, stderr %q; want 2 naming %s", c.args, code, errb.String(), c.want)
		}
	}
}
