package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

func numbers(t *testing.T, v any) []uint32 {
	t.Helper()
	arr, ok := v.([]any)
	if !ok {
		t.Fatalf("not a list: %v", v)
	}
	out := make([]uint32, len(arr))
	for i, x := range arr {
		n, err := x.(json.Number).Int64()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = uint32(n)
	}
	return out
}

// TestTokenizeEqualsTokenizer: each family's tokenize endpoint answers what our tokenizer computes,
// with the family's defaults (vLLM/SGLang add special tokens for prompts, not for messages;
// llama.cpp adds none unless asked).
func TestTokenizeEqualsTokenizer(t *testing.T) {
	tok := testTokenizer(t)
	texts := []string{"Hello world", "  leading spaces and ünïcödé — 数字 123", "<|begin_of_text|>special inside", ""}
	msgs := []any{map[string]any{"role": "system", "content": "Be brief."}, map[string]any{"role": "user", "content": "What is KV caching?"}}
	for _, tc := range []struct{ family, release, path string }{
		{"vllm", "v0.25.1", "/tokenize"}, {"sglang", "v0.5.18", "/v1/tokenize"}, {"llamacpp", "b10573", "/tokenize"},
	} {
		t.Run(tc.family, func(t *testing.T) {
			e := startSim(t, tc.family, tc.release, nil)
			for _, text := range texts {
				for _, add := range []bool{true, false} {
					body := map[string]any{"prompt": text, "add_special_tokens": add}
					if tc.family == "llamacpp" {
						body = map[string]any{"content": text, "add_special": add}
					}
					resp, m := post(t, e.URL()+tc.path, body)
					if resp.StatusCode != 200 {
						t.Fatalf("%q: %d %v", text, resp.StatusCode, m)
					}
					want, err := tok.Encode(text, add)
					if err != nil {
						t.Fatal(err)
					}
					if diff := cmp.Diff(nonNil(want), numbers(t, m["tokens"])); diff != "" {
						t.Fatalf("%q add=%v (-tokenizer +endpoint):\n%s", text, add, diff)
					}
				}
			}
			// Defaults.
			body := map[string]any{"prompt": "Hi"}
			wantAdd := true
			if tc.family == "llamacpp" {
				body, wantAdd = map[string]any{"content": "Hi"}, false
			}
			_, m := post(t, e.URL()+tc.path, body)
			want, _ := tok.Encode("Hi", wantAdd)
			if diff := cmp.Diff(want, numbers(t, m["tokens"])); diff != "" {
				t.Fatalf("default add_special (-want +got):\n%s", diff)
			}
			if tc.family == "llamacpp" {
				raw, _ := json.Marshal(map[string]any{"messages": msgs})
				cr, err := tokenize.ParseChatRequest(raw)
				if err != nil {
					t.Fatal(err)
				}
				text, err := tok.RenderChat(cr)
				if err != nil {
					t.Fatal(err)
				}
				_, m := post(t, e.URL()+"/apply-template", raw)
				if m["prompt"] != text {
					t.Fatalf("apply-template: %q, want %q", m["prompt"], text)
				}
				return
			}
			raw, _ := json.Marshal(map[string]any{"messages": msgs})
			cr, err := tokenize.ParseChatRequest(raw)
			if err != nil {
				t.Fatal(err)
			}
			want, _, err = tok.EncodeChat(cr)
			if err != nil {
				t.Fatal(err)
			}
			_, m = post(t, e.URL()+tc.path, raw)
			if diff := cmp.Diff(want, numbers(t, m["tokens"])); diff != "" {
				t.Fatalf("messages (-tokenizer +endpoint):\n%s", diff)
			}
		})
	}
}

// streamTTFT sends a streaming completion and returns the time to the first data chunk and the
// usage of the final chunk.
func streamTTFT(t *testing.T, url string, prompt string) (time.Duration, map[string]any, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 4, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	start := time.Now()
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var ttft time.Duration
	var usage map[string]any
	var id string
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if ttft == 0 {
			ttft = time.Since(start)
		}
		data := strings.TrimPrefix(line, "data: ")
		if data == "[DONE]" {
			done = true
			break
		}
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(data))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			t.Fatal(err)
		}
		id, _ = m["id"].(string)
		if u, ok := m["usage"].(map[string]any); ok {
			usage = map[string]any{"usage": u}
		}
	}
	if !done || usage == nil {
		t.Fatalf("stream ended without usage or [DONE]")
	}
	return ttft, usage, id
}

// TestSharedPrefixIsCachedAndFaster: the second request of a shared-prefix pair reports cached
// tokens in whole blocks and reaches its first token sooner (prefill is proportional to uncached
// tokens: 1500 tokens × 400µs ≈ 0.6s cold, one chunk of a few tokens warm).
func TestSharedPrefixIsCachedAndFaster(t *testing.T) {
	for _, fam := range []struct{ family, release string }{{"vllm", "v0.25.1"}, {"sglang", "v0.5.18"}, {"trtllm", "1.2"}, {"llamacpp", "b10573"}} {
		t.Run(fam.family, func(t *testing.T) {
			e := startSim(t, fam.family, fam.release, func(c *Config) { c.PrefillPerToken = 400 * time.Microsecond })
			shared := strings.Repeat("The routing gateway keeps a mirror of every engine's cache. ", 125)
			t1, u1, id := streamTTFT(t, e.URL(), shared+"First question?")
			t2, u2, _ := streamTTFT(t, e.URL(), shared+"Second question?")
			c1, c2 := usageCached(t, u1), usageCached(t, u2)
			bs := e.cfg.BlockSize
			if c1 != 0 || c2 < 1400 || (bs > 0 && c2%bs != 0) {
				t.Fatalf("cached tokens: cold %d, warm %d (block size %d)", c1, c2, bs)
			}
			if t2 >= t1 {
				t.Fatalf("warm TTFT %s not shorter than cold %s", t2, t1)
			}
			if !strings.Contains(id, "ep-"+fam.family) {
				t.Fatalf("response id %q does not name the endpoint", id)
			}
			t.Logf("cold TTFT %s, warm TTFT %s, cached %d tokens", t1, t2, c2)
		})
	}
}

// TestMalformedBodies: bad input gets the family's error shape and status, never a crash.
func TestMalformedBodies(t *testing.T) {
	bodies := []string{"", "{", "[]", "null", `"x"`, `{"prompt":3}`, `{"prompt":[[1,2],[3]]}`, `{"prompt":"a","max_tokens":"8"}`,
		`{"prompt":"a","max_tokens":0}`, `{"prompt":"a","max_tokens":99999999}`, `{"prompt":[-1]}`, `{"prompt":[99999999999]}`,
		`{"prompt":"a","stream":"yes"}`, `{"messages":"nope"}`, `{"messages":[{"content":"no role"}]}`, `{"prompt":"a","n":0}`,
		`{"prompt":"a","cache_salt":""}`, `{"prompt":"a","disaggregated_params":{"request_type":"bogus"}}`,
		`{"prompt":"a","kv_transfer_params":"x"}`, `{"prompt":"a","bootstrap_room":"r"}`, "{\"prompt\":\"\xff\xfe\"}",
		`{"prompt":"` + strings.Repeat("deep ", 10000) + `"}`}
	for _, fam := range []struct{ family, release string }{{"vllm", "v0.25.1"}, {"sglang", "v0.5.18"}, {"trtllm", "1.2"}, {"llamacpp", "b10573"}} {
		t.Run(fam.family, func(t *testing.T) {
			e := startSim(t, fam.family, fam.release, func(c *Config) { c.MaxModelLen = 4096 })
			for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
				for _, b := range bodies {
					resp, m := post(t, e.URL()+path, b)
					if resp.StatusCode == 200 {
						continue // some bodies are valid for one endpoint (e.g. invalid UTF-8 is replaced)
					}
					if resp.StatusCode >= 500 && !(fam.family == "llamacpp" && resp.StatusCode == 500) {
						t.Fatalf("%s %.60q: status %d %v", path, b, resp.StatusCode, m)
					}
					checkErrorShape(t, fam.family, resp.StatusCode, m)
				}
			}
			resp, m := post(t, e.URL()+"/v1/completions", `{"prompt":"a","model":"nope"}`)
			if fam.family == "vllm" && resp.StatusCode != 404 {
				t.Fatalf("unknown model: %d %v", resp.StatusCode, m)
			}
			if fam.family == "trtllm" {
				resp, m := post(t, e.URL()+"/v1/completions", `{"prompt":"a","kv_transfer_params":{}}`)
				if resp.StatusCode != 400 {
					t.Fatalf("TensorRT-LLM accepted an unknown field: %d %v", resp.StatusCode, m)
				}
			}
			if resp, _ := post(t, e.URL()+"/v1/completions", `{"prompt":"still alive","max_tokens":1}`); resp.StatusCode != 200 {
				t.Fatalf("simulator broken after bad input: %d", resp.StatusCode)
			}
		})
	}
}

func checkErrorShape(t *testing.T, family string, status int, m map[string]any) {
	t.Helper()
	switch family {
	case "vllm", "llamacpp":
		er, ok := m["error"].(map[string]any)
		if !ok || er["message"] == nil || er["type"] == nil || fmt.Sprint(er["code"]) != fmt.Sprint(status) {
			t.Fatalf("%s error shape: %d %v", family, status, m)
		}
	default:
		if m["object"] != "error" || m["message"] == nil || fmt.Sprint(m["code"]) != fmt.Sprint(status) {
			t.Fatalf("%s error shape: %d %v", family, status, m)
		}
	}
}

// TestPDDialects: a prefill engine and a decode engine serve one request end to end in each
// family's dialect; the decode leg reports the prompt as cached and names the prefill endpoint.
func TestPDDialects(t *testing.T) {
	prompt := strings.Repeat("disaggregated prefill and decode ", 40)
	t.Run("vllm", func(t *testing.T) {
		p := startSim(t, "vllm", "v0.25.1", func(c *Config) { c.Role = RolePrefill; c.Endpoint = "P0" })
		d := startSim(t, "vllm", "v0.25.1", func(c *Config) { c.Role = RoleDecode; c.Endpoint = "D0" })
		resp, pm := post(t, p.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 1, "stream": false,
			"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
				"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}})
		kv, _ := pm["kv_transfer_params"].(map[string]any)
		if resp.StatusCode != 200 || kv == nil || kv["do_remote_prefill"] != true || len(kv["remote_block_ids"].([]any)) == 0 {
			t.Fatalf("prefill leg: %d %v", resp.StatusCode, pm)
		}
		resp, dm := post(t, d.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 5, "kv_transfer_params": kv})
		checkDecodeLeg(t, resp, dm, "D0", "P0", 5)
	})
	t.Run("sglang", func(t *testing.T) {
		p := startSim(t, "sglang", "v0.5.18", func(c *Config) { c.Role = RolePrefill; c.Endpoint = "P1" })
		d := startSim(t, "sglang", "v0.5.18", func(c *Config) { c.Role = RoleDecode; c.Endpoint = "D1" })
		host, port, _ := splitHostPortInt(p.BootstrapAddr())
		body := map[string]any{"prompt": prompt, "max_tokens": 5, "bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": 12345}
		var wg sync.WaitGroup
		var presp *http.Response
		wg.Add(1)
		go func() { defer wg.Done(); presp, _ = post(t, p.URL()+"/v1/completions", body) }()
		resp, dm := post(t, d.URL()+"/v1/completions", body)
		wg.Wait()
		if presp.StatusCode != 200 {
			t.Fatalf("prefill leg: %d", presp.StatusCode)
		}
		checkDecodeLeg(t, resp, dm, "D1", "P1", 5)
		resp, m := post(t, d.URL()+"/v1/completions", map[string]any{"prompt": "x"})
		if resp.StatusCode != 400 {
			t.Fatalf("decode without bootstrap fields: %d %v", resp.StatusCode, m)
		}
	})
	t.Run("trtllm", func(t *testing.T) {
		p := startSim(t, "trtllm", "1.2", func(c *Config) { c.Role = RolePrefill; c.Endpoint = "P2" })
		d := startSim(t, "trtllm", "1.2", func(c *Config) { c.Role = RoleDecode; c.Endpoint = "D2" })
		resp, cm := post(t, p.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 5, "stream": false,
			"disaggregated_params": map[string]any{"request_type": "context_only"}})
		if resp.StatusCode != 200 {
			t.Fatalf("context leg: %d %v", resp.StatusCode, cm)
		}
		ch := cm["choices"].([]any)[0].(map[string]any)
		dp := ch["disaggregated_params"].(map[string]any)
		if dp["ctx_request_id"] == nil || ch["finish_reason"] != "length" || cm["prompt_token_ids"] == nil {
			t.Fatalf("context response: %v", cm)
		}
		dp["request_type"] = "generation_only"
		resp, dm := post(t, d.URL()+"/v1/completions", map[string]any{"prompt": cm["prompt_token_ids"], "max_tokens": 5, "disaggregated_params": dp})
		checkDecodeLeg(t, resp, dm, "D2", "P2", 5)
	})
}

func checkDecodeLeg(t *testing.T, resp *http.Response, m map[string]any, served, prefilled string, out int) {
	t.Helper()
	if resp.StatusCode != 200 {
		t.Fatalf("decode leg: %d %v", resp.StatusCode, m)
	}
	if resp.Header.Get(ReceiptHeader) != served || resp.Header.Get(PrefilledByHeader) != prefilled {
		t.Fatalf("receipts: served %q prefilled %q", resp.Header.Get(ReceiptHeader), resp.Header.Get(PrefilledByHeader))
	}
	u := m["usage"].(map[string]any)
	prompt, _ := u["prompt_tokens"].(json.Number).Int64()
	if c := usageCached(t, m); c == 0 || int64(c) > prompt {
		t.Fatalf("decode leg cached %d of %d", c, prompt)
	}
	if n, _ := u["completion_tokens"].(json.Number).Int64(); n != int64(out) {
		t.Fatalf("completion tokens %d", n)
	}
}
