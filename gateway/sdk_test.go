package gateway_test

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvexact/kvexact/gateway/rules"
)

// Pinned SDK and HTTP client for the end-to-end test (undici 7: Node ≥ 20.18; openai 6 has no
// engine floor).
const sdkPackages = "openai@6.30.1 undici@7.30.2"

// sdkDir installs the pinned packages once into .cache/npm/openai-sdk (from the npm registry) and
// returns the folder, or skips naming what is missing.
func sdkDir(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node not found: install Node.js ≥ 20.18 and npm (Debian: apt-get install nodejs npm; .ci/run does) for the OpenAI SDK test")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("npm not found: install npm (Debian: apt-get install npm; .ci/run does) for the OpenAI SDK test")
	}
	dir, err := filepath.Abs(filepath.Join("..", ".cache", "npm", "openai-sdk"))
	if err != nil {
		t.Fatal(err)
	}
	stamp := filepath.Join(dir, ".installed")
	if b, err := os.ReadFile(stamp); err == nil && string(b) == sdkPackages {
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(npm, append([]string{"install", "--no-audit", "--no-fund", "--no-save", "--prefix", dir}, strings.Fields(sdkPackages)...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("npm install %s failed (the npm registry must be reachable): %v\n%s", sdkPackages, err, out)
	}
	if err := os.WriteFile(stamp, []byte(sdkPackages), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

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
