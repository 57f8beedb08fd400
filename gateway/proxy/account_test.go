package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvexact/kvexact/gateway/rules"
)

func TestParseUsage(t *testing.T) {
	for name, tc := range map[string]struct {
		body           string
		prompt, cached int
		ok             bool
	}{
		"json":      {`{"id":"x","choices":[{"text":"a \"usage\": {"}],"usage":{"prompt_tokens":40,"total_tokens":44,"prompt_tokens_details":{"cached_tokens":32}}}`, 40, 32, true},
		"stream":    {"data: {\"choices\":[],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n", 9, 0, true},
		"no detail": {`{"usage":{"prompt_tokens":9}}`, 0, 0, false},
		"none":      {`{"choices":[]}`, 0, 0, false},
		"negative":  {`{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":-1}}}`, 0, 0, false},
		"repeated":  {`{"usage":{"prompt_tokens":1,"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":2}}}`, 9, 2, true},
		"truncated": {`{"usage":{"prompt_tokens":9,"prompt_tokens_det`, 0, 0, false},
	} {
		p, c, ok := parseUsage([]byte(tc.body))
		if p != tc.prompt || c != tc.cached || ok != tc.ok {
			t.Errorf("%s: got %d %d %v", name, p, c, ok)
		}
	}
}

// TestUsageTapKeepsTheTail: the tap passes every byte through unchanged and keeps the last
// usageTail bytes, across reads of any size.
func TestUsageTapKeepsTheTail(t *testing.T) {
	body := strings.Repeat("x", 3*usageTail) + `{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":4}}}`
	for _, chunk := range []int{1, 7, 4096, usageTail, 2 * usageTail} {
		tap := &usageTap{ReadCloser: io.NopCloser(&chunked{s: body, n: chunk})}
		got, err := io.ReadAll(tap)
		if err != nil || string(got) != body {
			t.Fatalf("chunk %d: body changed", chunk)
		}
		if !bytes.HasSuffix([]byte(body), tap.tail) || len(tap.tail) != usageTail {
			t.Fatalf("chunk %d: tail of %d bytes is not the body's end", chunk, len(tap.tail))
		}
		if p, c, ok := parseUsage(tap.tail); !ok || p != 5 || c != 4 {
			t.Fatalf("chunk %d: usage %d %d %v", chunk, p, c, ok)
		}
	}
}

func TestUsageTapTimesAStreamsFirstBytes(t *testing.T) {
	for _, stream := range []bool{true, false} {
		tap := &usageTap{ReadCloser: io.NopCloser(&chunked{s: "data: {}\n\n", n: 4}), stream: stream}
		before := time.Now()
		if _, err := io.ReadAll(tap); err != nil {
			t.Fatal(err)
		}
		// A whole (non-stream) answer's first byte comes after the last token: no receipt.
		if stream == tap.first.IsZero() || (stream && tap.first.Before(before)) {
			t.Fatalf("stream %v: first byte at %v", stream, tap.first)
		}
	}
}

type chunked struct {
	s string
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.n)], c.s)
	c.s = c.s[n:]
	return n, nil
}

func FuzzParseUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}}`))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte(`{"usage" : { "prompt_tokens_details" : {"x":"}\"","cached_tokens": 3 }, "prompt_tokens" : 7 }}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, c, ok := parseUsage(b)
		if ok && (p < 0 || c < 0) {
			t.Fatalf("negative usage %d %d accepted", p, c)
		}
		if !ok && (p != 0 || c != 0) {
			t.Fatal("values without ok")
		}
		// Where the usage object is valid JSON, encoding/json reads the same two numbers.
		if ok {
			i := bytes.LastIndex(b, usageKey)
			rest := skipSpace(b[i+len(usageKey):])
			obj, _ := value(skipSpace(rest[1:]))
			var u struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
			if json.Valid(obj) && json.Unmarshal(obj, &u) == nil && !bytes.Contains(obj, []byte(`\u`)) && (u.PromptTokens != p || u.PromptTokensDetails.CachedTokens != c) {
				t.Fatalf("hand scan %d %d, encoding/json %d %d on %q", p, c, u.PromptTokens, u.PromptTokensDetails.CachedTokens, obj)
			}
		}
	})
}

// BenchmarkUsageAccount is the accounting's cost per response: a 2 KiB completion body read
// through the tap in the relay's 32 KiB reads, then its usage parsed, beside the same read without
// the tap (baseline).
func BenchmarkUsageAccount(b *testing.B) {
	body := []byte(`{"id":"cmpl-1","object":"text_completion","model":"llama3","choices":[{"index":0,"text":"` + strings.Repeat("word ", 380) +
		`","finish_reason":"length"}],"usage":{"prompt_tokens":612,"total_tokens":628,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":592}}}`)
	buf := make([]byte, 32<<10)
	for _, tapped := range []bool{false, true} {
		name := "baseline"
		if tapped {
			name = "tap+parse"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var r io.ReadCloser = io.NopCloser(bytes.NewReader(body))
				var tap *usageTap
				if tapped {
					tap = &usageTap{ReadCloser: r}
					r = tap
				}
				for {
					if _, err := r.Read(buf); err != nil {
						break
					}
				}
				if tapped {
					if _, c, ok := parseUsage(tap.tail); !ok || c != 592 {
						b.Fatal("usage not found")
					}
				}
			}
		})
	}
}

// TestReceiptLearnsTheGatewayTime: under the ttft law, a streamed answer's receipt teaches the
// serving endpoint the request's time in the gateway before its upstream send (route
// Decision.Sent), which the receipt's time to first token, timed from that send, does not hold.
func TestReceiptLearnsTheGatewayTime(t *testing.T) {
	up := newUpstream(t, "a", func(u *upstream, w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\n")
		_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":70,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	p := newPool(t, "vllm", 3, []epSpec{{name: "a", addr: up.srv.URL}}, fixedKeyer{keys: []uint64{1, 2, 3, 4}},
		func(r *rules.Rule) { r.LoadLaw.Kind = "ttft" }, func(c *Config) { c.Usage = func(UsageReport) {} })
	resp, _ := p.post(t, "/v1/completions", `{"model":"m","prompt":"hello","stream":true}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// The receipt comes after the relay's last byte, which the client may read first: wait for it
	// (a bound on a missing receipt, not a timing assertion).
	r, ok := p.eps[0].Rates()
	for deadline := time.Now().Add(10 * time.Second); !ok && time.Now().Before(deadline); r, ok = p.eps[0].Rates() {
		time.Sleep(time.Millisecond)
	}
	if !ok || r.Gateway <= 0 {
		t.Fatalf("learned %+v (%v), want the gateway's own time", r, ok)
	}
}
