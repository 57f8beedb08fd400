package proxy

import (
	"bytes"
	"encoding/json"
	"testing"
)

// referenceFields is the oracle scanBody is checked against: encoding/json decoding the body into
// a map, which matches member names exactly and keeps the last of duplicates.
func referenceFields(raw []byte) (wireBody, bool) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return wireBody{}, false
	}
	return wireBody{Model: m["model"], Stream: m["stream"], User: m["user"], Prompt: m["prompt"], Messages: m["messages"]}, true
}

// FuzzScanBody: scanBody accepts exactly the JSON objects encoding/json accepts and finds the same
// raw member values.
func FuzzScanBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","stream":true,"user":"u"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":3}`,
		`{"model":"a","model":"b"}`,
		`{"mod\u0065l":"m","Model":"x"}`,
		` {"model" : "m" , "n":{"model":"inner"} } `,
		`{"model":"m"} {}`,
		`[1,2]`, `"s"`, `null`, `{`, `{"model":}`, "{\"user\":\"\xff\"}", `{}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var got wireBody
		err := scanBody(raw, &got)
		want, ok := referenceFields(raw)
		if (err == nil) != ok {
			t.Fatalf("scanBody(%q) error %v, encoding/json accepts an object: %v", raw, err, ok)
		}
		if err != nil {
			return
		}
		for _, f := range []struct {
			name      string
			got, want json.RawMessage
		}{{"model", got.Model, want.Model}, {"stream", got.Stream, want.Stream}, {"user", got.User, want.User}, {"prompt", got.Prompt, want.Prompt}, {"messages", got.Messages, want.Messages}} {
			if !bytes.Equal(f.got, f.want) {
				t.Fatalf("scanBody(%q) %s = %q, encoding/json %q", raw, f.name, f.got, f.want)
			}
		}
	})
}

func BenchmarkParseBody(b *testing.B) {
	raw := []byte(`{"model":"llama3","prompt":"Say hello.","max_tokens":1}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, e := parseBody(raw, false); e != nil {
			b.Fatal(e)
		}
	}
}

func BenchmarkParseBodyReference(b *testing.B) {
	raw := []byte(`{"model":"llama3","prompt":"Say hello.","max_tokens":1}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := referenceFields(raw); !ok {
			b.Fatal("no")
		}
	}
}
