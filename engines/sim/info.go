package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/kvexact/kvexact/gateway/tokenize"
)

// version is the package version the family reports for the release tag.
func (e *Engine) version() string {
	if e.cfg.ReportVersion != "" {
		return e.cfg.ReportVersion
	}
	v := strings.TrimPrefix(e.cfg.Release, "v")
	return v
}

func (e *Engine) handleVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"version": e.version()})
}

func (e *Engine) handleHealth(w http.ResponseWriter, r *http.Request) {
	if e.faults.get().Unhealthy {
		if e.cfg.Family == "trtllm" {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"detail": "LLM is unavailable. Please check the server logs for more details."})
			return
		}
		e.writeError(w, http.StatusServiceUnavailable, "unhealthy (fault switch)", "")
		return
	}
	if e.cfg.Family == "llamacpp" {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (e *Engine) handleModels(w http.ResponseWriter, r *http.Request) {
	card := map[string]any{"id": e.cfg.ServedModelName, "object": "model", "created": e.created.Unix(),
		"owned_by": e.ownedBy(), "root": e.cfg.Model, "parent": nil, "max_model_len": e.cfg.MaxModelLen}
	if e.cfg.Family == "vllm" {
		card["permission"] = []any{map[string]any{"id": "modelperm-" + e.engineID, "object": "model_permission",
			"created": e.created.Unix(), "allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
			"allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false, "organization": "*",
			"group": nil, "is_blocking": false}}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": append([]any{card}, e.loraCards()...)})
}

func (e *Engine) ownedBy() string {
	switch e.cfg.Family {
	case "vllm":
		return "vllm"
	case "sglang":
		return "sglang"
	case "trtllm":
		return "tensorrt_llm"
	}
	return "llamacpp"
}

// ---- tokenize / detokenize ----

type tokenizeBody struct {
	Model            *string `json:"model"`
	Prompt           *string `json:"prompt"`
	Content          *string `json:"content"` // llama.cpp
	AddSpecialTokens *bool   `json:"add_special_tokens"`
	AddSpecial       *bool   `json:"add_special"` // llama.cpp
	WithPieces       bool    `json:"with_pieces"` // llama.cpp
	ReturnTokenStrs  bool    `json:"return_token_strs"`
	Messages         json.RawMessage
}

// handleTokenize serves vLLM's and SGLang's /tokenize (prompt or messages) and llama.cpp's
// (content, add_special default false).
func (e *Engine) handleTokenize(w http.ResponseWriter, r *http.Request) {
	raw, ok := e.readBody(w, r)
	if !ok {
		return
	}
	var b tokenizeBody
	if err := decodeJSON(raw, &b); err != nil {
		e.badJSON(w, err)
		return
	}
	var probe map[string]json.RawMessage
	_ = json.Unmarshal(raw, &probe)
	if m, ok := probe["messages"]; ok && string(m) != "null" && e.cfg.Family != "llamacpp" {
		cr, err := tokenize.ParseChatRequest(raw)
		if err != nil {
			e.writeError(w, http.StatusBadRequest, err.Error(), "")
			return
		}
		ids, _, err := e.tok.EncodeChat(cr)
		if err != nil {
			e.writeError(w, http.StatusBadRequest, err.Error(), "")
			return
		}
		e.writeTokens(w, ids, b.ReturnTokenStrs)
		return
	}
	if e.cfg.Family == "llamacpp" {
		if b.Content == nil {
			e.writeError(w, http.StatusBadRequest, "\"content\" must be provided", "")
			return
		}
		ids, err := e.tok.Encode(*b.Content, b.AddSpecial != nil && *b.AddSpecial)
		if err != nil {
			e.writeError(w, http.StatusBadRequest, err.Error(), "")
			return
		}
		if !b.WithPieces {
			writeJSON(w, http.StatusOK, map[string]any{"tokens": nonNil(ids)})
			return
		}
		out := make([]any, len(ids))
		for i, id := range ids {
			piece, _ := e.tok.Decode([]uint32{id}, false)
			out[i] = map[string]any{"id": id, "piece": piece}
		}
		writeJSON(w, http.StatusOK, map[string]any{"tokens": out})
		return
	}
	if b.Prompt == nil {
		e.writeError(w, http.StatusBadRequest, "1 validation error: prompt: Field required", "")
		return
	}
	add := b.AddSpecialTokens == nil || *b.AddSpecialTokens
	ids, err := e.tok.Encode(*b.Prompt, add)
	if err != nil {
		e.writeError(w, http.StatusBadRequest, err.Error(), "")
		return
	}
	e.writeTokens(w, ids, b.ReturnTokenStrs)
}

func nonNil(ids []uint32) []uint32 {
	if ids == nil {
		return []uint32{}
	}
	return ids
}

func (e *Engine) writeTokens(w http.ResponseWriter, ids []uint32, strs bool) {
	resp := map[string]any{"count": len(ids), "max_model_len": e.cfg.MaxModelLen, "tokens": nonNil(ids)}
	if e.cfg.Family == "vllm" {
		resp["token_strs"] = nil
		if strs {
			ts := make([]string, len(ids))
			for i, id := range ids {
				ts[i], _ = e.tok.Token(id)
			}
			resp["token_strs"] = ts
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

func (e *Engine) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	raw, ok := e.readBody(w, r)
	if !ok {
		return
	}
	var b struct {
		Tokens            []int64 `json:"tokens"`
		SkipSpecialTokens *bool   `json:"skip_special_tokens"`
	}
	if err := decodeJSON(raw, &b); err != nil {
		e.badJSON(w, err)
		return
	}
	ids := make([]uint32, len(b.Tokens))
	for i, t := range b.Tokens {
		if t < 0 || t >= int64(e.tok.VocabSize()) {
			e.writeError(w, http.StatusBadRequest, fmt.Sprintf("tokens[%d]: token id %d is out of vocabulary", i, t), "")
			return
		}
		ids[i] = uint32(t)
	}
	skip := e.cfg.Family == "sglang" && (b.SkipSpecialTokens == nil || *b.SkipSpecialTokens)
	text, err := e.tok.Decode(ids, skip)
	if err != nil {
		e.writeError(w, http.StatusBadRequest, err.Error(), "")
		return
	}
	switch e.cfg.Family {
	case "sglang":
		writeJSON(w, http.StatusOK, map[string]any{"text": text})
	case "llamacpp":
		writeJSON(w, http.StatusOK, map[string]any{"content": text})
	default:
		writeJSON(w, http.StatusOK, map[string]any{"prompt": text})
	}
}

// ---- cache resets ----

// handleResetPrefixCache is vLLM's dev-mode reset: ?reset_external=true (a FastAPI bool: 1, true,
// on, yes) empties the offload tier too, the plain reset keeps it. It answers 200 {"success":
// bool} as vLLM v0.31.0 does (entrypoints/serve/dev/cache/api_router.py reset_prefix_cache):
// false while a request holds blocks, for v1/core/sched/scheduler.py Scheduler.reset_prefix_cache
// returns False while BlockPool.reset_prefix_cache finds blocks not freed yet; a request that
// only waits holds none, so the reset goes ahead (Engine.busyLocked).
func (e *Engine) handleResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	clearCache := e.ClearCache
	switch v := strings.ToLower(r.URL.Query().Get("reset_external")); v {
	case "", "0", "false", "off", "no":
	case "1", "true", "on", "yes":
		clearCache = e.ClearCacheExternal
	default:
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": []map[string]any{{
			"type": "bool_parsing", "loc": []string{"query", "reset_external"},
			"msg": "Input should be a valid boolean, unable to interpret input", "input": r.URL.Query().Get("reset_external")}}})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"success": clearCache() == nil})
}

// handleFlushCache is SGLang's /flush_cache as python/sglang/srt/entrypoints/http_server.py
// flush_cache answers it (v0.5.18 to v0.5.23): 200 with its notice when the scheduler flushed,
// 400 "Flush cache failed.\n" when it did not (Scheduler.flush_cache refuses unless
// is_fully_idle, which a running or a waiting request denies, and the refusal carries no
// message), both a bare Response without a media type, so without a Content-Type.
func (e *Engine) handleFlushCache(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		e.writeError(w, http.StatusMethodNotAllowed, "Method Not Allowed", "")
		return
	}
	w.Header()["Content-Type"] = nil // keeps net/http from sniffing one
	if err := e.ClearCache(); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte("Flush cache failed.\n"))
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n"))
}

// ---- SGLang ----

func (e *Engine) kvEventsConfigJSON() string {
	if e.ct.Transport != "zmq-multipart-v1" || e.cfg.NoEvents {
		return ""
	}
	m := map[string]any{"publisher": "zmq", "endpoint": e.cfg.PublishAddr, "topic": e.cfg.Topic, "buffer_steps": e.cfg.ReplayBuffer}
	if e.cfg.Family == "vllm" {
		m["enable_kv_cache_events"] = true
	}
	if e.cfg.ReplayAddr != "" {
		m["replay_endpoint"] = e.cfg.ReplayAddr
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func (e *Engine) disaggMode() string {
	if e.cfg.Role == RoleNormal {
		return "null"
	}
	return string(e.cfg.Role)
}

func (e *Engine) handleSGLangServerInfo(w http.ResponseWriter, r *http.Request) {
	var desc any
	if pubs := e.PublishAddrs(); len(pubs) > 0 {
		host, port, err := splitTCP(e.cfg.PublishAddr)
		if err == nil {
			if port == 0 {
				_, port, _ = splitTCP(pubs[0])
			}
			desc = map[string]any{"publisher": "zmq", "endpoint_host": host, "endpoint_port_base": port, "topic": e.cfg.Topic,
				"block_size": e.cfg.BlockSize, "dp_size": e.cfg.DPRanks}
		}
	}
	states := make([]any, len(e.ranks))
	for i, rk := range e.ranks {
		states[i] = map[string]any{"dp_rank": i, "num_running_reqs": rk.running.Load(), "num_waiting_reqs": rk.waiting.Load()}
	}
	bootPort := 8998
	if e.boot != nil {
		if _, p, err := splitHostPortInt(e.boot.addr()); err == nil {
			bootPort = p
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"model_path": e.cfg.Model, "tokenizer_path": e.cfg.Model, "served_model_name": e.cfg.ServedModelName,
		"chat_template": nil, "page_size": e.cfg.BlockSize, "dp_size": e.cfg.DPRanks, "dcp_size": 1, "tp_size": 1,
		"context_length": e.cfg.MaxModelLen, "max_running_requests": e.cfg.MaxConcurrency,
		"speculative_algorithm": nil, "enable_cache_report": true, "enable_metrics": true,
		"kv_events_config": nilIfEmpty(e.kvEventsConfigJSON()), "disaggregation_mode": e.disaggMode(),
		"disaggregation_bootstrap_port": bootPort, "version": e.version(), "kv_events": desc, "internal_states": states,
	})
}

func (e *Engine) handleSGLangModelInfo(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"model_path": e.cfg.Model, "tokenizer_path": e.cfg.Model,
		"served_model_name": e.cfg.ServedModelName, "is_generation": true, "weight_version": "default",
		"model_type": nil, "architectures": nil, "preferred_sampling_params": nil})
}

func (e *Engine) handleSGLangLoads(w http.ResponseWriter, r *http.Request) {
	out := make([]any, len(e.ranks))
	for i, rk := range e.ranks {
		used, capTok := e.tokenUsage(rk)
		out[i] = map[string]any{"dp_rank": i, "num_running_reqs": rk.running.Load(), "num_waiting_reqs": rk.waiting.Load(),
			"num_used_tokens": used, "max_total_num_tokens": capTok, "token_usage": ratio(used, capTok)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"timestamp": time.Now().Unix(), "loads": out})
}

// ---- TensorRT-LLM ----

func (e *Engine) handleKVCacheEvents(w http.ResponseWriter, r *http.Request) {
	evs := e.drain.take(r.Context(), e.cfg.DrainWait)
	b, err := encodeDrain(evs)
	if err != nil {
		e.writeError(w, http.StatusInternalServerError, err.Error(), "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

func (e *Engine) handleTRTServerInfo(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"model": e.cfg.ServedModelName, "version": e.version(),
		"disaggregated_role": e.disaggMode(), "tokens_per_block": e.cfg.BlockSize, "max_seq_len": e.cfg.MaxModelLen,
		"attention_dp_size": e.cfg.DPRanks, "kv_cache_events": map[string]any{"path": e.ct.Events.DrainPath, "event_buffer_max_size": e.cfg.DrainBuffer}})
}

// ---- llama.cpp ----

func (e *Engine) handleProps(w http.ResponseWriter, r *http.Request) {
	tmpl := ""
	if c := e.tok.Config(); c != nil {
		tmpl = c.ChatTemplate
	}
	bos, _ := e.specialText(true)
	eos, _ := e.specialText(false)
	writeJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": map[string]any{"n_ctx": e.cfg.MaxModelLen, "params": map[string]any{"n_predict": -1, "cache_prompt": true}},
		"total_slots":                 e.cfg.MaxConcurrency, "model_alias": e.cfg.ServedModelName, "model_path": e.cfg.Model,
		"chat_template": tmpl, "chat_template_caps": map[string]any{}, "bos_token": bos, "eos_token": eos,
		"build_info": e.cfg.Release + "-sim", "modalities": map[string]any{"vision": false, "audio": false},
		"is_sleeping": false, "endpoint_slots": true, "endpoint_metrics": true,
	})
}

func (e *Engine) specialText(bos bool) (string, bool) {
	c := e.tok.Config()
	if c == nil {
		return "", false
	}
	spec := c.EOSToken
	if bos {
		spec = c.BOSToken
	}
	if spec == nil {
		return "", false
	}
	return spec.Content, true
}

func (e *Engine) handleApplyTemplate(w http.ResponseWriter, r *http.Request) {
	raw, ok := e.readBody(w, r)
	if !ok {
		return
	}
	cr, err := tokenize.ParseChatRequest(raw)
	if err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			e.badJSON(w, err)
			return
		}
		e.writeError(w, http.StatusBadRequest, err.Error(), "")
		return
	}
	text, err := e.tok.RenderChat(cr)
	if err != nil {
		e.writeError(w, http.StatusBadRequest, err.Error(), "")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"prompt": text})
}

func (e *Engine) handleSlots(w http.ResponseWriter, r *http.Request) {
	var out []any
	idle := false
	for _, rk := range e.ranks {
		rk.mu.Lock()
		for _, s := range rk.llama {
			if !s.busy {
				idle = true
			}
			out = append(out, map[string]any{"id": s.id, "id_task": int64(s.task), "n_ctx": e.cfg.MaxModelLen,
				"is_processing": s.busy, "params": map[string]any{"cache_prompt": true}, "next_token": []any{},
				"n_cached_tokens": len(s.cache)})
		}
		rk.mu.Unlock()
	}
	if r.URL.Query().Get("fail_on_no_slot") == "1" && !idle {
		e.writeError(w, http.StatusServiceUnavailable, "no slot available", "")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func splitHostPortInt(hp string) (string, int, error) {
	return splitTCP("tcp://" + hp)
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
