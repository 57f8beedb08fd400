package rules

import (
	"fmt"
	"strings"
)

// engineAdminRoutes are engine routes that change or reveal an engine's state (caches, weights,
// sleep, profiling, adapters, event drains, the simulator's controls). The proxy never forwards a
// path it does not serve or a rule does not list under passthrough; these may not be listed at all.
// Sources: vLLM's api_server (dev-mode and admin routes), SGLang's http_server, trtllm-serve's
// event drain, llama.cpp's server, engines/sim (docs/proxy.md, "API surface").
var engineAdminRoutes = []string{
	"/reset_prefix_cache", "/reset_mm_cache", "/sleep", "/wake_up", "/is_sleeping", "/collective_rpc",
	"/start_profile", "/stop_profile", "/scale_elastic_ep", "/is_scaling_elastic_ep", "/pause", "/resume",
	"/load_lora_adapter", "/unload_lora_adapter", "/v1/load_lora_adapter", "/v1/unload_lora_adapter",
	"/flush_cache", "/update_weights_from_disk", "/update_weights_from_distributed", "/update_weights_from_tensor",
	"/init_weights_update_group", "/release_memory_occupation", "/resume_memory_occupation", "/abort_request",
	"/configure_logging", "/set_internal_state", "/start_expert_distribution_record", "/stop_expert_distribution_record",
	"/kv_cache_events", "/slots", "/sim/",
}

// maxPassthrough caps a rule's passthrough list.
const maxPassthrough = 64

// checkPassthrough validates a rule's passthrough paths: absolute URL paths (no query, no dot
// segments, URL path characters only), an optional trailing "/*" matching every path below, and
// never an engine admin route.
func checkPassthrough(paths []string) error {
	if len(paths) > maxPassthrough {
		return fieldErr("passthrough", "%d paths; at most %d", len(paths), maxPassthrough)
	}
	for i, p := range paths {
		f := fmt.Sprintf("passthrough[%d]", i)
		if !strings.HasPrefix(p, "/") || len(p) > 256 {
			return fieldErr(f, "%q must be an absolute path (starting with /) of at most 256 bytes", p)
		}
		base := strings.TrimSuffix(p, "/*")
		for j := 0; j < len(base); j++ {
			if !pathByte(base[j]) {
				return fieldErr(f, "%q: byte %d (%s) is not allowed in a path (no query, no spaces, no control characters)", p, j, describeByte(base[j]))
			}
		}
		for _, seg := range strings.Split(base, "/") {
			if seg == "." || seg == ".." {
				return fieldErr(f, "%q has a dot segment", p)
			}
		}
		for _, a := range engineAdminRoutes {
			if pathCovers(p, a) {
				return fieldErr(f, "%q reaches the engine admin route %s, which is never exposed on a client listener", p, strings.TrimSuffix(a, "/"))
			}
		}
	}
	return nil
}

// pathCovers reports whether the passthrough entry p would forward the admin route a (an exact
// route, or with a trailing "/" every route below it).
func pathCovers(p, a string) bool {
	prefix, wild := strings.CutSuffix(p, "/*")
	if strings.HasSuffix(a, "/") { // a family of routes
		return strings.HasPrefix(p, a) || strings.TrimSuffix(a, "/") == p || wild && strings.HasPrefix(a, prefix+"/")
	}
	if wild {
		return strings.HasPrefix(a, prefix+"/")
	}
	return p == a
}

// pathByte: RFC 3986 pchar and "/", without "%" (a percent-encoded entry would be compared with
// the decoded request path).
func pathByte(b byte) bool {
	switch {
	case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9':
		return true
	}
	return strings.IndexByte("/-._~!$&'()*+,;=:@", b) >= 0
}

// Passes reports whether the rule lists path under passthrough.
func (r *Rule) Passes(path string) bool {
	for _, p := range r.Passthrough {
		if prefix, wild := strings.CutSuffix(p, "/*"); wild {
			if strings.HasPrefix(path, prefix+"/") {
				return true
			}
		} else if p == path {
			return true
		}
	}
	return false
}

// Serves reports whether path is in the OpenAI API surface of the rule's engine family: the exact
// paths its contract lists under api (a TensorRT-LLM rule has no /v1/embeddings, a vLLM one has
// /v1/audio/transcriptions).
func (r *Rule) Serves(path string) bool { return r.Contract().ServesAPI(path) }

// Forwards reports whether the rule sends path to its endpoints at all: its family's API surface or
// its passthrough list.
func (r *Rule) Forwards(path string) bool { return r.Serves(path) || r.Passes(path) }
