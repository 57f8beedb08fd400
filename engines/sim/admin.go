package sim

import (
	"errors"
	"net/http"
	"strconv"
)

// The admin API lives under /sim/ on the API listener (and on AdminAddr when set):
//
//	GET  /sim/faults                 current switches
//	POST /sim/faults                 patch {"drop_events":N,"refuse":true,"refuse_ms":…,"status_5xx":N,
//	                                 "status_code":503,"delay_ms":…,"replay_off":true,"unhealthy":true}
//	POST /sim/restart_publisher      sequence back to 0, empty replay buffer (?engine=1: whole restart)
//	POST /sim/clear                  clear the cache (AllBlocksCleared; 409 while requests run)
//	GET  /sim/cache?rank=R           cached keys (decimal strings) with their copy counts
//	GET  /sim/info                   addresses, binding, next sequence numbers
func (e *Engine) mountAdmin(m *http.ServeMux) {
	m.HandleFunc("GET /sim/faults", e.handleGetFaults)
	m.HandleFunc("POST /sim/faults", e.handleSetFaults)
	m.HandleFunc("POST /sim/restart_publisher", e.handleRestart)
	m.HandleFunc("POST /sim/clear", e.handleClear)
	m.HandleFunc("GET /sim/cache", e.handleCache)
	m.HandleFunc("GET /sim/info", e.handleInfo)
}

func (e *Engine) adminRoutes() http.Handler {
	m := http.NewServeMux()
	e.mountAdmin(m)
	return m
}

func (e *Engine) handleGetFaults(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, e.faults.get())
}

func (e *Engine) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	raw, ok := e.readBody(w, r)
	if !ok {
		return
	}
	var p FaultPatch
	if err := decodeJSON(raw, &p); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": jsonErrorMessage(err)})
		return
	}
	f, err := e.faults.apply(p)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, f)
}

func (e *Engine) handleRestart(w http.ResponseWriter, r *http.Request) {
	if err := e.RestartPublisher(r.URL.Query().Get("engine") == "1"); err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"restarted": true})
}

func (e *Engine) handleClear(w http.ResponseWriter, r *http.Request) {
	if err := e.ClearCache(); err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, ErrBusy) {
			status = http.StatusConflict
		}
		writeJSON(w, status, map[string]any{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"cleared": true})
}

func (e *Engine) handleCache(w http.ResponseWriter, r *http.Request) {
	rk := 0
	if s := r.URL.Query().Get("rank"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n >= len(e.ranks) {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": "rank: out of range"})
			return
		}
		rk = n
	}
	keys := e.CacheKeys(rk)
	out := make(map[string]int, len(keys))
	for k, n := range keys {
		out[strconv.FormatUint(k, 10)] = n
	}
	writeJSON(w, http.StatusOK, map[string]any{"rank": rk, "blocks": out})
}

// Info is what GET /sim/info reports.
type Info struct {
	Family       string   `json:"family"`
	Release      string   `json:"release"`
	Contract     string   `json:"contract"`
	Endpoint     string   `json:"endpoint"`
	Model        string   `json:"model"`
	HTTP         string   `json:"http"`
	Publish      []string `json:"publish,omitempty"`
	Replay       []string `json:"replay,omitempty"`
	Bootstrap    string   `json:"bootstrap,omitempty"`
	BlockSize    int      `json:"block_size"`
	Algorithm    string   `json:"algorithm,omitempty"`
	SeedSet      bool     `json:"seed_set"`
	Role         Role     `json:"role"`
	DPRanks      int      `json:"dp_ranks"`
	NextSequence []uint64 `json:"next_sequence"`
}

// Info describes the running engine.
func (e *Engine) Info() Info {
	in := Info{Family: e.cfg.Family, Release: e.cfg.Release, Contract: e.ct.ID, Endpoint: e.cfg.Endpoint,
		Model: e.cfg.ServedModelName, HTTP: e.httpAddr, Publish: e.PublishAddrs(), Replay: e.ReplayAddrs(),
		Bootstrap: e.BootstrapAddr(), BlockSize: e.cfg.BlockSize, SeedSet: e.cfg.Seed != nil, Role: e.cfg.Role, DPRanks: e.cfg.DPRanks}
	if e.cfg.Family == "vllm" || e.cfg.Family == "sglang" {
		in.Algorithm = e.cfg.Algorithm
	}
	for i := range e.ranks {
		in.NextSequence = append(in.NextSequence, e.NextSeq(i))
	}
	return in
}

func (e *Engine) handleInfo(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, e.Info())
}
