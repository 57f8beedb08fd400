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
	return wireBody{Model: m["model"], Stream: m["stream"], User: m["user"], Prompt: m["prompt"], Messages: m["messages"],
		AddSpecialTokens: m["add_special_tokens"], CacheSalt: m["cache_salt"], TruncatePromptTokens: m["truncate_prompt_tokens"],
		TruncationSide: m["truncation_side"], PromptEmbeds: m["prompt_embeds"]}, true
}

// FuzzScanBody: scanBody accepts exactly the JSON objects encoding/json accepts and finds the same
// raw member values.
func FuzzScanBody(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","stream":true,"user":"u"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":3}`,
		`{"model":"m","prompt":[1,2],"cache_salt":"s","add_special_tokens":false,"truncate_prompt_tokens":2,"truncation_side":"left","prompt_embeds":null}`,
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
		}{{"model", got.Model, want.Model}, {"stream", got.Stream, want.Stream}, {"user", got.User, want.User}, {"prompt", got.Prompt, want.Prompt}, {"messages", got.Messages, want.Messages},
			{"add_special_tokens", got.AddSpecialTokens, want.AddSpecialTokens}, {"cache_salt", got.CacheSalt, want.CacheSalt},
			{"truncate_prompt_tokens", got.TruncatePromptTokens, want.TruncatePromptTokens}, {"truncation_side", got.TruncationSide, want.TruncationSide},
			{"prompt_embeds", got.PromptEmbeds, want.PromptEmbeds}} {
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

// FuzzParseChat: a chat body is decoded once into the template's value tree; the proxy accepts only
// what encoding/json accepts as an object, reads the same model, and never panics.
func FuzzParseChat(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}}]}],"cache_salt":"s"}`,
		`{"model":"a","model":"b","messages":[{"role":"user","content":null}],"truncate_prompt_tokens":-1}`,
		`{"model":"m","messages":[]}`, `{"model":"m","messages":[1]}`, `{"model":1}`, `[]`, `{`, "{\"model\":\"\xff\",\"messages\":[{}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, e := parseBody(raw, true)
		var m map[string]json.RawMessage
		jerr := json.Unmarshal(raw, &m)
		if e != nil {
			if jerr != nil && e.Code != "invalid_json" {
				t.Fatalf("parseBody(%q): %s/%s for a body encoding/json rejects (%v)", raw, e.Param, e.Code, jerr)
			}
			return
		}
		if jerr != nil || m == nil {
			t.Fatalf("parseBody(%q) accepted a body encoding/json rejects: %v", raw, jerr)
		}
		var model string
		if json.Unmarshal(m["model"], &model) != nil || model != p.model || model == "" {
			t.Fatalf("parseBody(%q) model %q, encoding/json %q", raw, p.model, m["model"])
		}
		if p.chatReq == nil && p.chatErr == nil {
			t.Fatalf("parseBody(%q): neither a chat request nor the reason", raw)
		}
	})
}

// benchChatBody is a typical multi-turn chat body with a tool (about 1.5 KB).
var benchChatBody = []byte(`{"model":"llama3","stream":true,"max_tokens":64,"messages":[` +
	`{"role":"system","content":"You are a helpful assistant. Answer briefly and cite the documents you use."},` +
	`{"role":"user","content":"What is the capital of France, and what is its population in the latest census?"},` +
	`{"role":"assistant","content":"Paris. About 2.1 million people live in the city proper."},` +
	`{"role":"user","content":[{"type":"text","text":"And the metropolitan area? Please give the number and the year."}]}],` +
	`"tools":[{"type":"function","function":{"name":"search","description":"Search the web","parameters":{"type":"object",` +
	`"properties":{"q":{"type":"string"},"n":{"type":"integer","minimum":1,"maximum":10}},"required":["q"]}}}],` +
	`"temperature":0.2,"cache_salt":"tenant-0123456789abcdef"}`)

func BenchmarkParseChat(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchChatBody)))
	for b.Loop() {
		if _, e := parseBody(benchChatBody, true); e != nil {
			b.Fatal(e)
		}
	}
}
