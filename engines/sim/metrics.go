package sim

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// promWriter writes Prometheus text exposition.
type promWriter struct{ b strings.Builder }

func (p *promWriter) family(name, typ, help string) {
	fmt.Fprintf(&p.b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

func (p *promWriter) sample(name string, labels map[string]string, v float64) {
	p.b.WriteString(name)
	if len(labels) > 0 {
		keys := make([]string, 0, len(labels))
		for k := range labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		p.b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				p.b.WriteByte(',')
			}
			fmt.Fprintf(&p.b, "%s=%q", k, labels[k])
		}
		p.b.WriteByte('}')
	}
	p.b.WriteByte(' ')
	s := strconv.FormatFloat(v, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEnN") {
		s += ".0" // prometheus_client writes floats: 0.0, 3.0
	}
	p.b.WriteString(s)
	p.b.WriteByte('\n')
}

// tokenUsage is the rank's KV tokens in use and its capacity in tokens.
func (e *Engine) tokenUsage(rk *rank) (used, capacity int) {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	if rk.cache == nil {
		for _, s := range rk.llama {
			used += len(s.cache)
		}
		return used, e.cfg.MaxModelLen * len(rk.llama)
	}
	return rk.cache.used * e.cfg.BlockSize, rk.cache.capacity() * e.cfg.BlockSize
}

func (e *Engine) cacheCounters(rk *rank) (queried, hit uint64) {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	if rk.cache == nil {
		return rk.queriedTokensL.Load(), rk.cachedTokens.Load()
	}
	return rk.cache.queriedTokens, rk.cache.hitTokens
}

// handleMetrics serves the engine's own metric names: vLLM and SGLang Prometheus text (labels
// model_name and engine / dp_rank), llama.cpp's unlabelled llamacpp:*, TensorRT-LLM's JSON
// iteration stats.
func (e *Engine) handleMetrics(w http.ResponseWriter, r *http.Request) {
	if e.cfg.Family == "trtllm" {
		e.trtMetrics(w)
		return
	}
	var p promWriter
	model := e.cfg.ServedModelName
	switch e.cfg.Family {
	case "vllm":
		lab := func(rk *rank) map[string]string {
			return map[string]string{"model_name": model, "engine": strconv.Itoa(rk.idx)}
		}
		p.family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.")
		for _, rk := range e.ranks {
			p.sample("vllm:num_requests_running", lab(rk), float64(rk.running.Load()))
		}
		p.family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.")
		for _, rk := range e.ranks {
			p.sample("vllm:num_requests_waiting", lab(rk), float64(rk.waiting.Load()))
		}
		p.family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.")
		for _, rk := range e.ranks {
			u, c := e.tokenUsage(rk)
			p.sample("vllm:kv_cache_usage_perc", lab(rk), ratio(u, c))
		}
		p.family("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.")
		for _, rk := range e.ranks {
			q, _ := e.cacheCounters(rk)
			p.sample("vllm:prefix_cache_queries_total", lab(rk), float64(q))
		}
		p.family("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.")
		for _, rk := range e.ranks {
			_, h := e.cacheCounters(rk)
			p.sample("vllm:prefix_cache_hits_total", lab(rk), float64(h))
		}
		p.family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
		for _, rk := range e.ranks {
			p.sample("vllm:prompt_tokens_total", lab(rk), float64(rk.promptTokens.Load()))
		}
		p.family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.")
		for _, rk := range e.ranks {
			p.sample("vllm:generation_tokens_total", lab(rk), float64(rk.genTokens.Load()))
		}
		p.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
		for _, rk := range e.ranks {
			p.sample("vllm:cache_config_info", map[string]string{"engine": strconv.Itoa(rk.idx),
				"block_size": strconv.Itoa(e.cfg.BlockSize), "hash_block_size": strconv.Itoa(e.cfg.BlockSize),
				"prefix_caching_hash_algo": e.cfg.Algorithm, "enable_prefix_caching": "True",
				"num_gpu_blocks": strconv.Itoa(e.cfg.CapacityBlocks), "cache_dtype": "auto"}, 1)
		}
	case "sglang":
		lab := func(rk *rank) map[string]string {
			return map[string]string{"model_name": model, "dp_rank": strconv.Itoa(rk.idx)}
		}
		gauge := func(name, help string, f func(rk *rank) float64) {
			p.family(name, "gauge", help)
			for _, rk := range e.ranks {
				p.sample(name, lab(rk), f(rk))
			}
		}
		gauge("sglang:num_running_reqs", "The number of running requests.", func(rk *rank) float64 { return float64(rk.running.Load()) })
		gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", func(rk *rank) float64 { return float64(rk.waiting.Load()) })
		gauge("sglang:num_used_tokens", "The number of used tokens.", func(rk *rank) float64 { u, _ := e.tokenUsage(rk); return float64(u) })
		gauge("sglang:token_usage", "The token usage.", func(rk *rank) float64 { return ratio(e.tokenUsage(rk)) })
		gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", func(rk *rank) float64 {
			q, h := e.cacheCounters(rk)
			return ratio(int(h), int(q))
		})
		p.family("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.")
		for _, rk := range e.ranks {
			p.sample("sglang:prompt_tokens_total", lab(rk), float64(rk.promptTokens.Load()))
		}
		p.family("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.")
		for _, rk := range e.ranks {
			p.sample("sglang:generation_tokens_total", lab(rk), float64(rk.genTokens.Load()))
		}
	case "llamacpp":
		var prompt, gen uint64
		var running, waiting int64
		for _, rk := range e.ranks {
			prompt += rk.promptTokens.Load()
			gen += rk.genTokens.Load()
			running += rk.running.Load()
			waiting += rk.waiting.Load()
		}
		p.family("llamacpp:prompt_tokens_total", "counter", "Number of prompt tokens processed.")
		p.sample("llamacpp:prompt_tokens_total", nil, float64(prompt))
		p.family("llamacpp:tokens_predicted_total", "counter", "Number of generation tokens processed.")
		p.sample("llamacpp:tokens_predicted_total", nil, float64(gen))
		p.family("llamacpp:requests_processing", "gauge", "Number of requests processing.")
		p.sample("llamacpp:requests_processing", nil, float64(running))
		p.family("llamacpp:requests_deferred", "gauge", "Number of requests deferred.")
		p.sample("llamacpp:requests_deferred", nil, float64(waiting))
		p.family("llamacpp:n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call.")
		p.sample("llamacpp:n_busy_slots_per_decode", nil, float64(running))
		p.family("llamacpp:n_tokens_max", "counter", "Largest observed n_tokens.")
		p.sample("llamacpp:n_tokens_max", nil, float64(e.cfg.MaxModelLen))
	}
	if e.cfg.Family == "vllm" || e.cfg.Family == "sglang" {
		// prometheus_client's process collector: the process identity a gateway re-probe compares
		// to tell a restart on the same ports.
		p.family("process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
		p.sample("process_start_time_seconds", nil, float64(e.created.UnixMicro())/1e6)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(p.b.String()))
}

// trtMetrics answers GET /metrics as trtllm-serve does: a JSON array of iteration stats. The
// simulator reports one entry per call (the current state) rather than a queue of iterations.
func (e *Engine) trtMetrics(w http.ResponseWriter) {
	var out []any
	for _, rk := range e.ranks {
		rk.mu.Lock()
		c := rk.cache
		used, capb := c.used, c.capacity()
		q, h := c.queriedTokens, c.hitTokens
		rk.mu.Unlock()
		hitRate := 0.0
		if q > 0 {
			hitRate = float64(h) / float64(q)
		}
		entry := map[string]any{"iter": rk.requests.Load(), "timestamp": time.Now().UTC().Format("01-02-2006 15:04:05"),
			"numActiveRequests": rk.running.Load(), "numQueuedRequests": rk.waiting.Load(),
			"inflightBatchingStats": map[string]any{"numPausedRequests": 0, "numContextRequests": 0, "numGenRequests": rk.running.Load()},
			"kvCacheStats": map[string]any{"maxNumBlocks": capb, "freeNumBlocks": capb - used, "usedNumBlocks": used,
				"tokensPerBlock": e.cfg.BlockSize, "allocTotalBlocks": used, "reusedBlocks": h / uint64(e.cfg.BlockSize),
				"cacheHitRate": hitRate}}
		if e.cfg.DPRanks > 1 {
			entry["attentionDpRank"] = rk.idx
		}
		out = append(out, entry)
	}
	writeJSON(w, http.StatusOK, out)
}
