package gateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/engines/sim"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// engineErrorCase is one engine error sent through the gateway: the request and what its message
// must say.
type engineErrorCase struct {
	Name    string         `json:"name"`
	BaseURL string         `json:"baseURL"`
	Kind    string         `json:"kind"`
	Params  map[string]any `json:"params"`
	status  int
	want    string
}

// TestEngineErrorsReachClientsInOpenAIShape: an engine error of every family — a 400 for an
// ill-typed field in the family's own shape, a 503 from the fault switch — reaches the client with
// the engine's status and message in OpenAI's {"error":{message,type,param,code}}; the OpenAI SDK
// (npm openai) shows that message, not "status code (no body)".
func TestEngineErrorsReachClientsInOpenAIShape(t *testing.T) {
	var cases []engineErrorCase
	var sims []*sim.Engine
	// arm makes each engine answer its next inference request (the 503 case, first of its family)
	// with the fault switch's 503.
	arm := func() {
		for _, e := range sims {
			n := 1
			if _, err := e.SetFaults(sim.FaultPatch{Status5xx: &n}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, f := range []struct{ family, release string }{{"vllm", "v0.25.1"}, {"sglang", "v0.5.18"}, {"trtllm", "1.2"}, {"llamacpp", "b10573"}} {
		p := startPool(t, poolSpec{family: f.family, release: f.release, n: 1, seed: strp("0"), mode: 0})
		sims = append(sims, p.sims[0])
		base := p.base + "/v1"
		cases = append(cases, engineErrorCase{Name: f.family + " 503", BaseURL: base, Kind: "completion",
			Params: map[string]any{"model": "llama3", "prompt": "hello", "max_tokens": 1}, status: 503, want: "simulated failure"})
		if f.family != "llamacpp" { // llama.cpp reads the fields it knows and ignores the types of others
			cases = append(cases, engineErrorCase{Name: f.family + " 400 chat", BaseURL: base, Kind: "chat",
				Params: map[string]any{"model": "llama3", "messages": []map[string]any{{"role": "user", "content": "hi"}}, "temperature": "hot", "max_tokens": 1},
				status: 400, want: "temperature"})
		}
	}
	arm()
	for _, c := range cases {
		body, _ := json.Marshal(c.Params)
		path := "/completions"
		if c.Kind == "chat" {
			path = "/chat/completions"
		}
		resp, err := http.Post(c.BaseURL+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var v struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
			} `json:"error"`
		}
		if resp.StatusCode != c.status || json.Unmarshal(raw, &v) != nil || !strings.Contains(v.Error.Message, c.want) || v.Error.Type == "" {
			t.Errorf("%s: status %d, body %s; want %d with error.message containing %q", c.Name, resp.StatusCode, raw, c.status, c.want)
		}
	}
	arm()
	sdkSees(t, cases)
}

// sdkSees sends the cases with the OpenAI SDK and checks the message it shows, or skips naming
// what is missing.
func sdkSees(t *testing.T, cases []engineErrorCase) {
	t.Helper()
	dir := sdkDir(t)
	repo := tokenize.RepoRoot()
	if repo == "" {
		t.Skip("the OpenAI SDK check needs the repository checkout (scripts/openai-errors.js)")
	}
	in, _ := json.Marshal(cases)
	cmd := exec.Command("node", filepath.Join(repo, "scripts", "openai-errors.js"))
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"))
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("openai-errors.js: %v", err)
	}
	var got []struct {
		Name    string `json:"name"`
		Status  int    `json:"status"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(out, &got); err != nil || len(got) != len(cases) {
		t.Fatalf("openai-errors.js printed %s (%v)", out, err)
	}
	for i, g := range got {
		c := cases[i]
		if g.Status != c.status || !strings.Contains(g.Message, c.want) || strings.Contains(g.Message, "no body") {
			t.Errorf("%s: the SDK saw status %d message %q; want %d with %q", c.Name, g.Status, g.Message, c.status, c.want)
		}
	}
}
