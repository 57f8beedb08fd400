package sim

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// pdPlan is what a request's P/D dialect changes about how it is served.
type pdPlan struct {
	prefilledBy string // the prefill endpoint whose KV this decode used
	forceJSON   bool
	failStatus  int
	after       func(res *genRes, err error)
	decorate    func(resp, choice map[string]any, res *genRes)
}

// vllmKVParams are vLLM's NIXL kv_transfer_params.
type vllmKVParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	// Endpoint is the simulator's own addition: the prefill endpoint's receipt name.
	Endpoint string `json:"kvexact_endpoint,omitempty"`
}

// trtOpaque is what the simulator puts in encoded_opaque_state (opaque to everyone else).
type trtOpaque struct {
	Endpoint string `json:"endpoint"`
	Prompt   int    `json:"prompt_tokens"`
}

// preparePD applies the family's disaggregation dialect to q. A non-zero status rejects the request.
func (e *Engine) preparePD(ctx context.Context, p *preparedReq, q *genReq) (pdPlan, int, string) {
	var plan pdPlan
	b := &p.body
	switch e.cfg.Family {
	case "vllm":
		var kp *vllmKVParams
		if len(b.KVTransferParams) > 0 && string(b.KVTransferParams) != "null" {
			kp = &vllmKVParams{}
			if err := json.Unmarshal(b.KVTransferParams, kp); err != nil {
				return plan, 400, "kv_transfer_params: " + jsonErrorMessage(err)
			}
		}
		plan.decorate = func(resp, _ map[string]any, res *genRes) { resp["kv_transfer_params"] = nil }
		if kp == nil || e.cfg.Role == RoleNormal {
			// Without a KV connector vLLM accepts and ignores the parameters.
			return plan, 0, ""
		}
		if kp.DoRemoteDecode {
			plan.decorate = func(resp, _ map[string]any, res *genRes) {
				host, port := e.cfg.KVHost, e.cfg.KVPort
				resp["kv_transfer_params"] = map[string]any{"do_remote_prefill": true, "do_remote_decode": false,
					"remote_block_ids": res.blocks, "remote_engine_id": e.engineID, "remote_host": host, "remote_port": port,
					"tp_size": 1, "kvexact_endpoint": e.cfg.Endpoint}
			}
		}
		if kp.DoRemotePrefill && len(kp.RemoteBlockIDs) > 0 {
			// The decode engine pulls the prompt's KV from the prefill engine instead of computing it.
			q.remote = min(len(kp.RemoteBlockIDs)*e.cfg.BlockSize, len(q.prompt))
			plan.prefilledBy = kp.Endpoint
			if plan.prefilledBy == "" && kp.RemoteEngineID != nil {
				plan.prefilledBy = *kp.RemoteEngineID
			}
		}
	case "sglang":
		if e.cfg.Role == RoleNormal {
			return plan, 0, ""
		}
		host, port, room, err := sglangBootstrap(b)
		if err != nil {
			return plan, 400, err.Error()
		}
		if room < 0 {
			return plan, 400, fmt.Sprintf("bootstrap_room is required on a %s server (disaggregation mode)", e.cfg.Role)
		}
		if e.cfg.Role == RolePrefill {
			q.prefillOnly = true
			plan.forceJSON = false
			q.hold = func(ctx context.Context) error {
				return e.boot.serveRoom(ctx, room, e.cfg.BootstrapTimeout, map[string]any{"endpoint": e.cfg.Endpoint, "prompt_tokens": len(q.prompt)})
			}
			return plan, 0, ""
		}
		// Decode: join the room at the prefill engine's bootstrap server; the KV arrives from there.
		info, err := joinRoom(ctx, host, port, room, e.cfg.BootstrapTimeout)
		if err != nil {
			return plan, 500, "KV transfer from the prefill engine failed: " + err.Error()
		}
		q.remote = len(q.prompt)
		plan.prefilledBy = info.Endpoint
	case "trtllm":
		dp := b.DisaggregatedParams
		if dp == nil {
			return plan, 0, ""
		}
		switch dp.RequestType {
		case "context_only":
			q.prefillOnly = true
			ctxID := e.ctxID.Add(1)
			plan.decorate = func(resp, choice map[string]any, res *genRes) {
				st, _ := json.Marshal(trtOpaque{Endpoint: e.cfg.Endpoint, Prompt: len(q.prompt)})
				choice["disaggregated_params"] = map[string]any{"request_type": "context_only", "first_gen_tokens": res.output,
					"ctx_request_id": ctxID, "encoded_opaque_state": base64.StdEncoding.EncodeToString(st), "draft_tokens": nil}
				resp["prompt_token_ids"] = q.prompt
			}
			plan.forceJSON = true
		case "generation_only":
			if dp.CtxRequestID == nil || len(dp.FirstGenTokens) == 0 {
				return plan, 400, "disaggregated_params: generation_only needs ctx_request_id and first_gen_tokens"
			}
			q.first = dp.FirstGenTokens
			q.remote = len(q.prompt)
			if dp.EncodedOpaqueState != nil {
				if raw, err := base64.StdEncoding.DecodeString(*dp.EncodedOpaqueState); err == nil {
					var op trtOpaque
					if json.Unmarshal(raw, &op) == nil {
						plan.prefilledBy = op.Endpoint
					}
				}
			}
		default:
			return plan, 400, fmt.Sprintf("disaggregated_params.request_type: %q is not one of context_only, generation_only", dp.RequestType)
		}
	}
	return plan, 0, ""
}

// sglangBootstrap reads the bootstrap triple (room -1 when absent). Batched (list) values are
// refused: the simulator serves one prompt per request.
func sglangBootstrap(b *oaiBody) (host string, port int, room int64, err error) {
	room = -1
	if len(b.BootstrapHost) > 0 && string(b.BootstrapHost) != "null" {
		if err := json.Unmarshal(b.BootstrapHost, &host); err != nil {
			return "", 0, 0, fmt.Errorf("bootstrap_host: %s", jsonErrorMessage(err))
		}
	}
	if len(b.BootstrapPort) > 0 && string(b.BootstrapPort) != "null" {
		if err := json.Unmarshal(b.BootstrapPort, &port); err != nil {
			return "", 0, 0, fmt.Errorf("bootstrap_port: %s", jsonErrorMessage(err))
		}
	}
	if len(b.BootstrapRoom) > 0 && string(b.BootstrapRoom) != "null" {
		if err := json.Unmarshal(b.BootstrapRoom, &room); err != nil || room < 0 {
			return "", 0, 0, fmt.Errorf("bootstrap_room: must be an integer in [0, 2^63-1]")
		}
	}
	return host, port, room, nil
}

// bootstrap is an SGLang prefill engine's rendezvous server: the decode engine joins a room, the
// prefill engine (holding the prompt's KV) releases it once joined.
type bootstrap struct {
	ln    net.Listener
	srv   *http.Server
	mu    sync.Mutex
	rooms map[int64]*room
	wait  time.Duration
}

type room struct {
	ready  chan struct{}
	joined chan struct{}
	once   sync.Once
	info   map[string]any
}

func startBootstrap(addr string) (*bootstrap, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	b := &bootstrap{ln: ln, rooms: map[int64]*room{}, wait: DefaultBootstrapTimeout}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /bootstrap/join", b.handleJoin)
	b.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = b.srv.Serve(ln) }()
	return b, nil
}

func (b *bootstrap) addr() string { return b.ln.Addr().String() }

func (b *bootstrap) close() { _ = b.srv.Close() }

func (b *bootstrap) room(id int64) *room {
	b.mu.Lock()
	defer b.mu.Unlock()
	rm := b.rooms[id]
	if rm == nil {
		rm = &room{ready: make(chan struct{}), joined: make(chan struct{})}
		b.rooms[id] = rm
	}
	return rm
}

func (b *bootstrap) drop(id int64) {
	b.mu.Lock()
	delete(b.rooms, id)
	b.mu.Unlock()
}

// serveRoom publishes the prefilled KV in room id and waits for the decode engine to take it.
func (b *bootstrap) serveRoom(ctx context.Context, id int64, timeout time.Duration, info map[string]any) error {
	rm := b.room(id)
	b.mu.Lock()
	rm.info = info
	b.mu.Unlock()
	close(rm.ready)
	defer b.drop(id)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-rm.joined:
		return nil
	case <-t.C:
		return fmt.Errorf("bootstrap room %d: no decode engine joined within %s", id, timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *bootstrap) handleJoin(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.URL.Query().Get("room"), 10, 64)
	if err != nil || id < 0 {
		http.Error(w, "room: want a non-negative integer", http.StatusBadRequest)
		return
	}
	rm := b.room(id)
	t := time.NewTimer(b.wait)
	defer t.Stop()
	select {
	case <-rm.ready:
	case <-t.C:
		http.Error(w, "prefill did not arrive", http.StatusGatewayTimeout)
		return
	case <-r.Context().Done():
		return
	}
	rm.once.Do(func() { close(rm.joined) })
	b.mu.Lock()
	info := rm.info
	b.mu.Unlock()
	writeJSON(w, http.StatusOK, info)
}

type roomInfo struct {
	Endpoint string `json:"endpoint"`
	Prompt   int    `json:"prompt_tokens"`
}

func joinRoom(ctx context.Context, host string, port int, id int64, timeout time.Duration) (roomInfo, error) {
	var info roomInfo
	if host == "" || port <= 0 || port > 65535 {
		return info, fmt.Errorf("bootstrap_host/bootstrap_port missing or invalid (%q, %d)", host, port)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := fmt.Sprintf("http://%s/bootstrap/join?room=%d", net.JoinHostPort(trimBrackets(host), strconv.Itoa(port)), id)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return info, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return info, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return info, fmt.Errorf("bootstrap %s: %s: %s", u, resp.Status, body)
	}
	err = json.Unmarshal(body, &info)
	return info, err
}

func trimBrackets(h string) string {
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		return h[1 : len(h)-1]
	}
	return h
}
