package rules

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Numbers and durations that do not parse are refused naming their field path, not a line: in
// block style, in flow style (several fields on one line), and for unknown keys.
func TestDecodeErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct{ find, replace, want string }{
		{"    kvExactMode: 3\n", "    kvExactMode: 3\n    upstream: {idleTimeout: 5x}\n", `rules[0].upstream.idleTimeout: "5x" is not a duration`},
		{"    kvExactMode: 3\n", "    kvExactMode: 3\n    upstream:\n      dialTimeout: 1s\n      idleTimeout: soon\n", `rules[0].upstream.idleTimeout: "soon" is not a duration`},
		{"    kvExactMode: 3\n", "    kvExactMode: 3\n    blockSize: 99999999999999999999999\n", "rules[0].blockSize: cannot unmarshal !!float `9999999...` into int"},
		{"    kvExactMode: 3\n", "    kvExactMode: 3\n    upstream: {maxConnsPerHost: 1, maxIdleConnsPerHost: 1e999}\n", "rules[0].upstream.maxIdleConnsPerHost: cannot unmarshal"},
		{"admin: {token: secret}\n", "admin: {token: secret}\nserver: {writeTimeout: 1s, lingerBytes: many}\n", "server.lingerBytes: cannot unmarshal !!str `many`"},
		{"admin: {token: secret}\n", "admin: {token: secret}\nmaxBodyBytes: 1e30\n", "maxBodyBytes: cannot unmarshal"},
		{"    kvExactMode: 3\n", "    kvExactMode: 3\n    upstream: {idleTimeot: 1s}\n", "rules[0].upstream.idleTimeot: field idleTimeot not found"},
		{`      - {name: b, address: "http://127.0.0.1:8002/"}` + "\n", `      - {name: b, address: "http://127.0.0.1:8002/", weight: 1, capacityBlocks: 12345678901234567890}` + "\n", "rules[0].endpoints[1].capacityBlocks: cannot unmarshal"},
	} {
		src := strings.Replace(base, tc.find, tc.replace, 1)
		if src == base {
			t.Fatalf("%q not in the base config", tc.find)
		}
		_, err := Parse([]byte(src))
		var fe *FieldError
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &fe) {
			t.Errorf("%s\n got %v\nwant a FieldError containing %q", tc.replace, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "line ") {
			t.Errorf("%s: the error still names a line: %v", tc.replace, err)
		}
	}
}

// The new limits' defaults and their bounds at the edge: lingerTimeout 1m and lingerBytes 1 GiB
// are accepted, a model name of 256 bytes is.
func TestListenerLimitDefaults(t *testing.T) {
	c, err := Parse([]byte(strings.Replace(base, "admin: {token: secret}\n", "admin: {token: secret}\nserver: {lingerTimeout: 1m, lingerBytes: 1073741824}\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(c.Server.WriteTimeout).String() != "1m0s" || time.Duration(c.Server.LingerTimeout).String() != "1m0s" || c.Server.LingerBytes != 1<<30 {
		t.Fatalf("server: %+v", c.Server)
	}
	d := Server{}.WithDefaults()
	if time.Duration(d.WriteTimeout).String() != "1m0s" || time.Duration(d.LingerTimeout).String() != "5s" || d.LingerBytes != 4<<20 {
		t.Fatalf("server defaults: %+v", d)
	}
	if u := (Upstream{}).WithDefaults(); time.Duration(u.IdleTimeout).String() != "1m0s" {
		t.Fatalf("upstream.idleTimeout default %s, want 1m0s", time.Duration(u.IdleTimeout))
	}
	if _, err := Parse([]byte(strings.Replace(base, "models: [llama3]", "models: ["+strings.Repeat("m", 256)+"]", 1))); err != nil {
		t.Fatalf("a 256-byte model name: %v", err)
	}
}
