package vllm

import (
	"encoding/json"

	"github.com/kvexact/kvexact/engines"
)

func (family) PDDialect() engines.PDDialect { return nixl{} }

// nixl is the vllm-nixl-v1 dialect: a one-token prefill leg returns kv_transfer_params, which the
// decode leg (the client's body plus those params) uses to pull the KV. Missing params, a prefill
// 5xx or a broken prefill answer degrade to decode recomputing the prompt, never to a failure.
type nixl struct{}

func (nixl) Name() string { return "vllm-nixl-v1" }

// prefillParams asks the prefill engine to keep the KV for a remote decode (vLLM's NIXL
// connector, as its own toy proxy sends it).
var prefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

func (nixl) Serve(legs engines.PDLegs) {
	raw := legs.Request().Body
	pre, err := engines.PatchJSON(raw, func(m map[string]json.RawMessage) {
		m["kv_transfer_params"] = prefillParams
		m["stream"] = json.RawMessage("false")
		m["max_tokens"] = json.RawMessage("1")
		if _, ok := m["max_completion_tokens"]; ok {
			m["max_completion_tokens"] = json.RawMessage("1")
		}
		delete(m, "stream_options")
		delete(m, "min_tokens")
		delete(m, "min_completion_tokens")
	})
	if err != nil {
		legs.InternalError(err)
		return
	}
	a, done := legs.FetchPrefill(pre)
	if done {
		return
	}
	legs.AccountPrefill(a)
	prefill := legs.Endpoint(engines.PDPrefill).Name
	var params json.RawMessage
	switch {
	case a.Err != nil || a.Status >= 500:
		legs.Warn("vLLM prefill failed; decode recomputes the prompt", "prefill", prefill, "status", a.Status, "err", a.Err)
	case a.Status >= 400:
		// The prefill engine rejected the client's own body: the decode engine would too.
		legs.RelayPrefill(a)
		return
	case !a.Whole:
		legs.Warn("vLLM prefill answer too large to read; decode recomputes the prompt", "prefill", prefill)
	default:
		var v struct {
			KV json.RawMessage `json:"kv_transfer_params"`
		}
		if json.Unmarshal(a.Body, &v) != nil {
			legs.BadResponse()
		}
		switch {
		case len(v.KV) > engines.MaxTransferParams:
			legs.Warn("kv_transfer_params over 64 KB; decode recomputes the prompt", "bytes", len(v.KV))
		case len(v.KV) > 0 && v.KV[0] == '{':
			params = v.KV
		}
	}
	legs.Params(params != nil)
	body := raw
	if params != nil {
		body, err = engines.PatchJSON(raw, func(m map[string]json.RawMessage) { m["kv_transfer_params"] = params })
		if err != nil {
			legs.InternalError(err)
			return
		}
	}
	legs.RelayDecode(body, params != nil)
}
