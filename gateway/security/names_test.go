package security

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/rules"
)

// A name reaching a response header, a log field or a metric label passes one rule (A-Z a-z 0-9
// . _ ~ : / @ + - [ ], 1..256 bytes), wherever it comes from: model names are refused like rule
// and endpoint names, through the admin API and in the YAML, the refusal naming the field and the
// byte offset. Each row: the JSON string of a model name and the byte the refusal must name.
func TestNamesWithControlBytesAreRefused(t *testing.T) {
	g := start(t, nil)
	for _, tc := range []struct{ json, byteDesc string }{
		{`"a\r\nb"`, `byte 1 (CR)`},
		{`"a\nb"`, `byte 1 (LF)`},
		{`"ab\u0000"`, `byte 2 (control character 0x00)`},
		{`"a b"`, `byte 1 (`},
		{`"llama\"3"`, `byte 5 (`},
		{`"m\u00fc"`, `byte 1 (non-ASCII byte 0xc3)`},
	} {
		t.Run(tc.json, func(t *testing.T) {
			rule := fmt.Sprintf(`{"name":"r2","models":[%s],"engine":{"family":"vllm","release":"v0.25.1"},"endpoints":[{"name":"x","address":"http://127.0.0.1:1"}]}`, tc.json)
			out, held := exchange(t, g.admin, post("/admin/rules", rule, "Authorization: Bearer "+token+"\r\n", "Connection: close\r\n"), 10*time.Second)
			if held || status(out) != "422" || !strings.Contains(out, "models[0]") || !strings.Contains(out, tc.byteDesc) {
				t.Fatalf("admin API: held %v, status %q, want 422 naming models[0] and %s:\n%s", held, status(out), tc.byteDesc, out)
			}
			yaml := fmt.Sprintf("rules:\n  - name: r\n    models: [%s]\n    engine: {family: vllm, release: v0.25.1}\n    endpoints: [{address: \"http://127.0.0.1:1\"}]\n", tc.json)
			_, err := rules.Parse([]byte(yaml))
			if err == nil || !strings.Contains(err.Error(), "rules[0].models[0]") || !strings.Contains(err.Error(), tc.byteDesc) {
				t.Fatalf("YAML: %v, want rules[0].models[0] and %s", err, tc.byteDesc)
			}
		})
	}
}
