package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// n > 1 is served as vLLM serves it: n choices indexed 0…n-1, completion tokens summed over them,
// and when streaming every index gets its deltas and its finish_reason.
func TestChoicesN(t *testing.T) {
	e := startSim(t, "vllm", "v0.25.1", nil)
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		body := map[string]any{"prompt": "count to three", "max_tokens": 3, "n": 2}
		if strings.Contains(path, "chat") {
			body = map[string]any{"messages": []any{map[string]any{"role": "user", "content": "count to three"}}, "max_tokens": 3, "n": 2}
		}
		resp, m := post(t, e.URL()+path, body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s n=2: %d %v", path, resp.StatusCode, m)
		}
		cs, _ := m["choices"].([]any)
		if len(cs) != 2 {
			t.Fatalf("%s n=2: %d choices: %v", path, len(cs), m)
		}
		for i, c := range cs {
			if idx, _ := c.(map[string]any)["index"].(json.Number).Int64(); idx != int64(i) {
				t.Fatalf("%s: choice %d has index %d", path, i, idx)
			}
		}
		u := m["usage"].(map[string]any)
		if ct, _ := u["completion_tokens"].(json.Number).Int64(); ct != 6 {
			t.Fatalf("%s: completion_tokens %d, want 2 choices × 3", path, ct)
		}

		body["stream"] = true
		raw, _ := json.Marshal(body)
		sresp, err := http.Post(e.URL()+path, "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		finished := map[int64]int{}
		deltas := map[int64]int{}
		sc := bufio.NewScanner(sresp.Body)
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || line == "[DONE]" {
				continue
			}
			dec := json.NewDecoder(strings.NewReader(line))
			dec.UseNumber()
			var ch struct {
				Choices []struct {
					Index        json.Number `json:"index"`
					FinishReason *string     `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := dec.Decode(&ch); err != nil {
				t.Fatalf("%s: chunk %q: %v", path, line, err)
			}
			for _, c := range ch.Choices {
				i, _ := c.Index.Int64()
				if c.FinishReason != nil {
					finished[i]++
				} else {
					deltas[i]++
				}
			}
		}
		sresp.Body.Close()
		if len(finished) != 2 || finished[0] != 1 || finished[1] != 1 || deltas[0] == 0 || deltas[0] != deltas[1] {
			t.Fatalf("%s stream n=2: finishes %v, deltas %v", path, finished, deltas)
		}
	}
	for _, n := range []int{0, -1, maxChoices + 1} {
		if resp, m := post(t, e.URL()+"/v1/completions", map[string]any{"prompt": "a", "n": n}); resp.StatusCode != 400 || !strings.Contains(m["error"].(map[string]any)["message"].(string), "n must be at least 1") {
			t.Fatalf("n=%d: %d %v", n, resp.StatusCode, m)
		}
	}
}
