package epp

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestParseUsage(t *testing.T) {
	cases := []struct {
		in     string
		cached int
		found  bool
		has    bool
	}{
		{`{"id":"x","usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}}`, 32, true, true},
		{"data: {\"usage\":null}\n\ndata: {\"choices\":[],\"usage\": {\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n", 16, true, true},
		{`{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":0}}}`, 0, true, true},
		{`{"usage":{"prompt_tokens":5}}`, 0, true, false},
		{`{"usage":{"prompt_tokens":5,"prompt_tokens_details":null}}`, 0, true, false},
		{`{"text":"the \"usage\" word"}`, 0, false, false},
		{`no json at all`, 0, false, false},
	}
	for _, c := range cases {
		u, err := ParseUsage([]byte(c.in))
		if err != nil || u.CachedTokens != c.cached || u.Found != c.found || u.HasCached != c.has {
			t.Errorf("ParseUsage(%q) = %+v, %v; want cached %d found %v has-cached %v", c.in, u, err, c.cached, c.found, c.has)
		}
	}
	if _, err := ParseUsage([]byte(`{"usage":{"prompt_tokens":"many"}}`)); err == nil || !strings.Contains(err.Error(), "byte 1") {
		t.Errorf("a malformed usage object must be an error naming its offset, got %v", err)
	}
}

func FuzzParseUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}}`))
	f.Add([]byte("data: {\"usage\":null}\n\ndata: {\"usage\":{\"prompt_tokens\":1}}\n\n"))
	f.Add([]byte(`"usage":`))
	f.Fuzz(func(t *testing.T, b []byte) {
		u, err := ParseUsage(b)
		if err != nil && u.Found {
			t.Fatal("an error must not report a usage")
		}
		if u.HasCached && !u.Found {
			t.Fatal("cached tokens reported without a usage object")
		}
	})
}

// FuzzSubsetHint decodes arbitrary bytes as the request's metadata_context and reads the subset hint:
// never a panic, and a hint is either a list of strings or an error.
func FuzzSubsetHint(f *testing.F) {
	ok, _ := structpb.NewStruct(map[string]any{SubsetKey: []any{"10.0.0.1:8000", "10.0.0.2:8000"}})
	bad, _ := structpb.NewStruct(map[string]any{SubsetKey: []any{"10.0.0.1:8000", 3.0}})
	for _, s := range []*structpb.Struct{ok, bad} {
		b, _ := proto.Marshal(&corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: s}})
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var md corev3.Metadata
		if proto.Unmarshal(b, &md) != nil {
			return
		}
		list, has, err := subsetHint(&md)
		if err != nil && (has || list != nil) {
			t.Fatal("an error must not return a hint")
		}
		if len(list) > maxSubset {
			t.Fatalf("%d entries passed the %d limit", len(list), maxSubset)
		}
	})
}
