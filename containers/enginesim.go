package containers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"time"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/engines/sim"
)

// TokenizersMount is where tokenizer folders appear inside containers.
const TokenizersMount = "/tokenizers"

// EngineSimSpec describes one simulated engine container.
type EngineSimSpec struct {
	// Endpoint names the engine in receipts and in the gateway's configuration.
	Endpoint string
	// Family and Release select the contract (default vllm v0.25.1).
	Family, Release string
	// Model is the tokenizer folder name under TokenizerRoot; it is also the served model name.
	Model string
	// TokenizerRoot is the host folder holding Model/ (bind-mounted read-only).
	TokenizerRoot string
	// Seed is PYTHONHASHSEED (nil: unset, a random root, as vLLM).
	Seed *string
	// Replay opens a replay socket (vLLM and SGLang).
	Replay bool
	// Args are extra enginesim flags (--capacity, --decode-per-token, fault flags, …).
	Args []string
	// Network runs the engine on that bridge network (its ports published on the host's
	// 127.0.0.1) instead of the host's network, so that its link can be cut.
	Network *Network
}

// Engine is a running simulated engine.
type Engine struct {
	*Container
	Spec                          EngineSimSpec
	HTTPPort, ZMQPort, ReplayPort int
	http                          *http.Client
}

// StartEngineSim starts enginesim (image EngineSimImage) on free host ports.
func (h *Harness) StartEngineSim(ctx context.Context, s EngineSimSpec) (*Engine, error) {
	if s.Family == "" {
		s.Family, s.Release = sim.DefaultFamily, sim.DefaultRelease
	}
	if s.Endpoint == "" || s.Model == "" || s.TokenizerRoot == "" {
		return nil, fmt.Errorf("engine sim: Endpoint, Model and TokenizerRoot are required")
	}
	ports, err := FreePorts(3)
	if err != nil {
		return nil, err
	}
	e := &Engine{Spec: s, HTTPPort: ports[0], ZMQPort: ports[1], http: &http.Client{Timeout: 30 * time.Second}}
	args := []string{"--family", s.Family, "--release", s.Release,
		"--model", path.Join(TokenizersMount, s.Model), "--served-model-name", s.Model,
		"--endpoint", s.Endpoint, "--http", bindHost(s.Network) + ":" + strconv.Itoa(e.HTTPPort)}
	if ct, err := contracts.Lookup(s.Family, s.Release); err == nil && ct.Published() {
		args = append(args, "--zmq", "tcp://*:"+strconv.Itoa(e.ZMQPort))
		if s.Replay {
			e.ReplayPort = ports[2]
			args = append(args, "--replay", "tcp://*:"+strconv.Itoa(e.ReplayPort))
		}
	} else {
		e.ZMQPort = 0
	}
	if s.Seed != nil {
		args = append(args, "--seed", *s.Seed)
	}
	args = append(args, s.Args...)
	var published []int
	if s.Network != nil {
		for _, p := range []int{e.HTTPPort, e.ZMQPort, e.ReplayPort} {
			if p != 0 {
				published = append(published, p)
			}
		}
	}
	c, err := h.Start(ctx, Spec{
		Role: "enginesim", Name: s.Endpoint, Image: EngineSimImage, Args: args, Network: s.Network, Publish: published,
		Binds: map[string]string{path.Join(s.TokenizerRoot, s.Model): path.Join(TokenizersMount, s.Model)},
		Ready: "enginesim listening",
	})
	if err != nil {
		return nil, err
	}
	e.Container = c
	return e, nil
}

// URL is the engine's API base URL.
func (e *Engine) URL() string { return "http://127.0.0.1:" + strconv.Itoa(e.HTTPPort) }

// PublishAddr is the ZeroMQ address a subscriber dials ("" without events).
func (e *Engine) PublishAddr() string {
	if e.ZMQPort == 0 {
		return ""
	}
	return "tcp://127.0.0.1:" + strconv.Itoa(e.ZMQPort)
}

// ReplayAddr is the replay address ("" without replay).
func (e *Engine) ReplayAddr() string {
	if e.ReplayPort == 0 {
		return ""
	}
	return "tcp://127.0.0.1:" + strconv.Itoa(e.ReplayPort)
}

// SetFaults patches the simulator's fault switches (POST /sim/faults).
func (e *Engine) SetFaults(ctx context.Context, p sim.FaultPatch) (sim.Faults, error) {
	var f sim.Faults
	err := doJSON(ctx, e.http, http.MethodPost, e.URL()+"/sim/faults", "", p, &f)
	return f, err
}

// Faults returns the current fault switches (GET /sim/faults); DropEvents counts down as
// messages are dropped.
func (e *Engine) Faults(ctx context.Context) (sim.Faults, error) {
	var f sim.Faults
	err := doJSON(ctx, e.http, http.MethodGet, e.URL()+"/sim/faults", "", nil, &f)
	return f, err
}

// Clear empties the engine's cache (POST /sim/clear: AllBlocksCleared on the wire).
func (e *Engine) Clear(ctx context.Context) error {
	return doJSON(ctx, e.http, http.MethodPost, e.URL()+"/sim/clear", "", struct{}{}, nil)
}

// RestartPublisher restarts the event publisher (sequence from 0, empty replay ring); engine also
// empties the cache silently, as a process restart would.
func (e *Engine) RestartPublisher(ctx context.Context, engine bool) error {
	u := e.URL() + "/sim/restart_publisher"
	if engine {
		u += "?engine=1"
	}
	return doJSON(ctx, e.http, http.MethodPost, u, "", struct{}{}, nil)
}

// Cache returns the engine's cached block keys with their copy counts (rank 0).
func (e *Engine) Cache(ctx context.Context) (map[uint64]int, error) {
	var out struct {
		Blocks map[string]int `json:"blocks"`
	}
	if err := doJSON(ctx, e.http, http.MethodGet, e.URL()+"/sim/cache?rank=0", "", nil, &out); err != nil {
		return nil, err
	}
	m := make(map[uint64]int, len(out.Blocks))
	for k, n := range out.Blocks {
		v, err := strconv.ParseUint(k, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("sim cache: key %q: %w", k, err)
		}
		m[v] = n
	}
	return m, nil
}

// Info is GET /sim/info.
func (e *Engine) Info(ctx context.Context) (sim.Info, error) {
	var in sim.Info
	err := doJSON(ctx, e.http, http.MethodGet, e.URL()+"/sim/info", "", nil, &in)
	return in, err
}

// doJSON sends v as JSON (nil: no body) and decodes a 2xx answer into out (nil: discarded).
func doJSON(ctx context.Context, c *http.Client, method, url, token string, v, out any) error {
	var body io.Reader
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return err
	}
	if v != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &engines.HTTPError{Op: method + " " + req.URL.RequestURI(), URL: url, Status: resp.StatusCode, Body: string(b)}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: decoding answer: %w", method, url, err)
	}
	return nil
}
