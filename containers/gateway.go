package containers

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kvexact/kvexact/gateway"
)

// ConfigMount is where the gateway's configuration folder appears inside its container.
const ConfigMount = "/etc/kvexact"

// GatewaySpec describes one gateway container.
type GatewaySpec struct {
	Name string
	// Config is gateway.yaml. Its tokenizers.root must be TokenizersMount and its listeners
	// 127.0.0.1 ports (the container shares the host's network).
	Config []byte
	// AdminToken is the admin bearer token the config sets.
	AdminToken string
	// Certificates are certificate files by name, passed as --certificate each.
	Certificates map[string][]byte
	// TokenizerRoot is the host folder mounted at TokenizersMount; Models are the folders of it to
	// mount (only those are bound, read-only).
	TokenizerRoot string
	Models        []string
	// Args are extra gateway flags.
	Args []string
}

// Gateway is a running gateway container.
type Gateway struct {
	*Container
	Spec GatewaySpec
	// Admin and Listeners are the bound addresses from the ready line of the latest start.
	Admin     string
	Listeners []string
	http      *http.Client
}

// StartGateway writes the configuration into a temporary folder (bound read-only at ConfigMount)
// and starts the gateway image. The folder is removed by Terminate.
func (h *Harness) StartGateway(ctx context.Context, s GatewaySpec) (*Gateway, error) {
	dir, err := os.MkdirTemp("", "kvexact-gateway-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "gateway.yaml"), s.Config, 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	args := []string{"--config", ConfigMount + "/gateway.yaml", "--shutdown-grace", "2s", "--probe-interval", "1s"}
	names := make([]string, 0, len(s.Certificates))
	for n := range s.Certificates {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), s.Certificates[n], 0o644); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		args = append(args, "--certificate", ConfigMount+"/"+n)
	}
	args = append(args, s.Args...)
	binds := map[string]string{dir: ConfigMount}
	for _, m := range s.Models {
		binds[filepath.Join(s.TokenizerRoot, m)] = TokenizersMount + "/" + m
	}
	if s.Name == "" {
		s.Name = "gw"
	}
	c, err := h.Start(ctx, Spec{Role: "gateway", Name: s.Name, Image: GatewayImage, Args: args, Binds: binds, Ready: "gateway ready"})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	g := &Gateway{Container: c, Spec: s, http: &http.Client{Timeout: 30 * time.Second}}
	c.onTerminate = func() { os.RemoveAll(dir) }
	if err := g.readAddrs(ctx); err != nil {
		g.Terminate(ctx)
		return nil, err
	}
	return g, nil
}

// readAddrs parses "gateway ready admin=A listeners=L1,L2" of the latest start.
func (g *Gateway) readAddrs(ctx context.Context) error {
	lines, err := g.ReadyLines(ctx)
	if err != nil || len(lines) == 0 {
		return fmt.Errorf("gateway: no ready line (%v)", err)
	}
	line := lines[len(lines)-1]
	g.Admin, g.Listeners = "", nil
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "admin="); ok {
			g.Admin = v
		}
		if v, ok := strings.CutPrefix(f, "listeners="); ok && v != "" {
			g.Listeners = strings.Split(v, ",")
		}
	}
	if g.Admin == "" || len(g.Listeners) == 0 {
		return fmt.Errorf("gateway: ready line %q lacks admin= or listeners=", line)
	}
	return nil
}

// Restart stops the gateway gracefully and starts it again (a new process: empty inventory,
// every subscriber connecting afresh, replay from 0 where configured).
func (g *Gateway) Restart(ctx context.Context) error {
	if err := g.Container.Restart(ctx); err != nil {
		return err
	}
	return g.readAddrs(ctx)
}

// URL is the base URL of the first client listener.
func (g *Gateway) URL() string { return "http://" + g.Listeners[0] }

func (g *Gateway) admin(ctx context.Context, method, p string, in, out any) error {
	return doJSON(ctx, g.http, method, "http://"+g.Admin+p, g.Spec.AdminToken, in, out)
}

// Status is GET /admin/status.
func (g *Gateway) Status(ctx context.Context) (gateway.Status, error) {
	var st gateway.Status
	err := g.admin(ctx, http.MethodGet, "/admin/status", nil, &st)
	return st, err
}

// Inventory is GET /admin/inventory/{rule}/{endpoint}: the endpoint's resident keys and counts.
func (g *Gateway) Inventory(ctx context.Context, rule, endpoint string) (map[uint64]int, error) {
	var out struct {
		Total  int `json:"total"`
		Blocks []struct {
			Key   string `json:"key"`
			Count int    `json:"count"`
		} `json:"blocks"`
	}
	if err := g.admin(ctx, http.MethodGet, "/admin/inventory/"+rule+"/"+endpoint, nil, &out); err != nil {
		return nil, err
	}
	m := make(map[uint64]int, len(out.Blocks))
	for _, b := range out.Blocks {
		k, err := strconv.ParseUint(b.Key, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("inventory: key %q: %w", b.Key, err)
		}
		m[k] = b.Count
	}
	if out.Total != len(m) {
		return nil, fmt.Errorf("inventory: total %d but %d distinct blocks", out.Total, len(m))
	}
	return m, nil
}

// Decision is the JSON of a routing decision (/admin/explain).
type Decision struct {
	Target    string `json:"target"`
	Tier      string `json:"tier"`
	Miss      string `json:"miss"`
	Reason    string `json:"reason"`
	Blocks    int    `json:"blocks"`
	Score     int    `json:"score"`
	Endpoints []struct {
		Name     string `json:"name"`
		Overlap  int    `json:"overlap"`
		Prefix   int    `json:"prefix"`
		Load     int    `json:"load"`
		Excluded string `json:"excluded"`
		Eligible bool   `json:"eligible"`
	} `json:"endpoints"`
}

// Overlap returns an endpoint's overlap in the decision's evidence (-1 when absent).
func (d *Decision) Overlap(endpoint string) int {
	for _, e := range d.Endpoints {
		if e.Name == endpoint {
			return e.Overlap
		}
	}
	return -1
}

// Explain asks where an OpenAI request body would go, changing nothing.
func (g *Gateway) Explain(ctx context.Context, body any) (*Decision, error) {
	var out struct {
		Rule     string    `json:"rule"`
		Decision *Decision `json:"decision"`
	}
	if err := g.admin(ctx, http.MethodPost, "/admin/explain", body, &out); err != nil {
		return nil, err
	}
	if out.Decision == nil {
		return nil, fmt.Errorf("explain: no decision in the answer")
	}
	return out.Decision, nil
}

// Metrics scrapes the admin listener's /metrics.
func (g *Gateway) Metrics(ctx context.Context) (Metrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.Admin+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+g.Spec.AdminToken)
	resp, err := g.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("metrics: status %d", resp.StatusCode)
	}
	return ParseMetrics(resp.Body)
}
