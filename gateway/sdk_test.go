package gateway_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/internal/openaisdk"
)

// sdkDir is the folder whose node_modules holds the pinned npm OpenAI SDK, or skips.
func sdkDir(t *testing.T) string { return openaisdk.Node(t) }

// TestOpenAISDKOverTLSAndHTTP2 runs the official OpenAI Node SDK against the gateway in front of
// simulated vLLM engines, over TLS with HTTP/2: chat, streaming, receipts, and the SDK's view of
// the gateway's errors (an unknown model; an engine admin route, refused).
func TestOpenAISDKOverTLSAndHTTP2(t *testing.T) {
	dir := sdkDir(t)
	f := newTLSFiles(t)
	var mu sync.Mutex
	protos := map[string]int{}
	p := startPool(t, poolSpec{family: "vllm", release: "v0.25.1", n: 2, seed: strp("0"), mode: 3, certify: true,
		cfgMod: func(c *rules.Config) { c.Server.TLS = rules.TLS{CertFile: f.cert, KeyFile: f.key} },
		wrap: func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				protos[r.Proto]++
				mu.Unlock()
				h.ServeHTTP(w, r)
			})
		}})
	script, _ := filepath.Abs(filepath.Join("testdata", "openai_sdk.js"))
	cmd := exec.Command("node", script, p.base+"/v1", filepath.Join(f.dir, "ca.crt"))
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"))
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("node: %v\n%s\n%s", err, out, stderr)
	}
	var res struct {
		ChatObject, ChatContent, StreamText, Endpoint string
		StreamChunks                                  int
		UnknownModel                                  struct {
			Status      int
			Code, Param string
		}
		AdminRoute struct {
			Status int
			Code   string
		}
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("SDK: %s; protocols seen: %v", out, protos)
	if res.ChatObject != "chat.completion" || res.ChatContent == "" {
		t.Errorf("chat: %+v", res)
	}
	if res.StreamChunks < 2 || res.StreamText == "" {
		t.Errorf("stream: %d chunks, %q", res.StreamChunks, res.StreamText)
	}
	if res.Endpoint != "e0" && res.Endpoint != "e1" {
		t.Errorf("receipt %q", res.Endpoint)
	}
	if res.UnknownModel.Status != 404 || res.UnknownModel.Code != "model_not_found" || res.UnknownModel.Param != "model" {
		t.Errorf("unknown model: %+v", res.UnknownModel)
	}
	if res.AdminRoute.Status != 404 || res.AdminRoute.Code != "unknown_url" {
		t.Errorf("admin route: %+v", res.AdminRoute)
	}
	mu.Lock()
	defer mu.Unlock()
	if protos["HTTP/2.0"] < 5 || len(protos) != 1 {
		t.Errorf("requests by protocol %v: the SDK did not speak HTTP/2 throughout", protos)
	}
}
