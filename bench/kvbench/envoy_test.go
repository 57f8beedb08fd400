package kvbench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvexact/kvexact/internal/envoytest"
)

// TestEnvoyRoundRobinConfig: the "envoy" target's configuration is one Envoy accepts (its own
// validate mode), with every upstream as an endpoint.
func TestEnvoyRoundRobinConfig(t *testing.T) {
	bin := envoytest.Binary(t)
	cfg := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(cfg, []byte(envoyRoundRobin(9901, 9900, []string{"127.0.0.1:8001", "127.0.0.1:8002"})), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "--mode", "validate", "-c", cfg).CombinedOutput(); err != nil {
		t.Fatalf("envoy rejects the round-robin configuration: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(cfg)
	for _, want := range []string{"port_value: 8001", "port_value: 8002", "lb_policy: ROUND_ROBIN"} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("the configuration lacks %q:\n%s", want, b)
		}
	}
}
