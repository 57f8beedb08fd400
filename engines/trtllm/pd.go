package trtllm

import (
	"encoding/json"
	"fmt"

	"github.com/kvexact/kvexact/engines"
)

func (family) PDDialect() engines.PDDialect { return ctxFirst{} }

// ctxFirst is the trtllm-ctx-first-v1 dialect: a context-only leg returns disaggregated_params
// (with ctx_request_id); a request it already finished is relayed as is, else the generation leg
// (the client's body plus those params as generation_only) streams the answer. A context 5xx, a
// broken or unusable context answer, or params over 64 KB degrade to the decode endpoint serving
// the client's body alone.
type ctxFirst struct{}

func (ctxFirst) Name() string { return "trtllm-ctx-first-v1" }

func (ctxFirst) Serve(legs engines.PDLegs) {
	req := legs.Request()
	pre, err := engines.PatchJSON(req.Body, func(m map[string]json.RawMessage) {
		m["disaggregated_params"] = json.RawMessage(`{"request_type":"context_only"}`)
		m["stream"] = json.RawMessage("false")
		m["stream_options"] = json.RawMessage("null")
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
		legs.Warn("TensorRT-LLM context leg failed; the generation endpoint serves the whole request", "prefill", prefill, "status", a.Status, "err", a.Err)
	case a.Status >= 400:
		legs.RelayPrefill(a)
		return
	case !a.Whole:
		legs.Warn("TensorRT-LLM context answer too large to read", "prefill", prefill)
	default:
		var v struct {
			Choices []struct {
				FinishReason *string         `json:"finish_reason"`
				Params       json.RawMessage `json:"disaggregated_params"`
			} `json:"choices"`
		}
		var ids struct {
			CtxRequestID json.RawMessage `json:"ctx_request_id"`
		}
		switch {
		case json.Unmarshal(a.Body, &v) != nil || len(v.Choices) != 1:
			legs.BadResponse()
			legs.Warn("TensorRT-LLM context answer does not carry exactly one choice", "prefill", prefill)
		case len(v.Choices[0].Params) > engines.MaxTransferParams:
			legs.Warn("disaggregated_params over 64 KB; the generation endpoint recomputes", "bytes", len(v.Choices[0].Params))
		case json.Unmarshal(v.Choices[0].Params, &ids) != nil || engines.IsNull(ids.CtxRequestID):
			legs.Warn("TensorRT-LLM context answer has no disaggregated_params.ctx_request_id", "prefill", prefill)
		default:
			if fr := v.Choices[0].FinishReason; fr != nil && *fr != "length" && *fr != "not_finished" {
				// The context step already finished the request (stop token, one-token answer).
				legs.Params(true)
				earlyExit(legs, req, a)
				return
			}
			var m map[string]json.RawMessage
			if json.Unmarshal(v.Choices[0].Params, &m) == nil {
				m["request_type"] = json.RawMessage(`"generation_only"`)
				params = engines.RawJSON(m)
			}
		}
	}
	legs.Params(params != nil)
	body := req.Body
	if params != nil {
		body, err = engines.PatchJSON(req.Body, func(m map[string]json.RawMessage) { m["disaggregated_params"] = params })
		if err != nil {
			legs.InternalError(err)
			return
		}
	}
	legs.RelayDecode(body, params != nil)
}

// earlyExit relays a context answer that finished the request: as is for a JSON client,
// re-framed as one SSE chunk plus [DONE] for a streaming one.
func earlyExit(legs engines.PDLegs, req engines.PDRequest, a engines.LegAnswer) {
	if !req.Stream {
		legs.RelayPrefill(a)
		return
	}
	ev, err := reframeSSE(a.Body, req.Chat)
	if err != nil {
		legs.InternalError(err)
		return
	}
	legs.RelayPrefillEvents(ev)
}

// reframeSSE turns a complete (non-streamed) completion into the equivalent single stream chunk.
func reframeSSE(body []byte, chat bool) ([]byte, error) {
	var r struct {
		ID      json.RawMessage              `json:"id"`
		Created json.RawMessage              `json:"created"`
		Model   json.RawMessage              `json:"model"`
		Usage   json.RawMessage              `json:"usage"`
		Choices []map[string]json.RawMessage `json:"choices"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("context answer: %w", err)
	}
	chunk := map[string]json.RawMessage{"id": r.ID, "created": r.Created, "model": r.Model}
	chunk["object"] = engines.RawJSON("text_completion")
	if chat {
		chunk["object"] = engines.RawJSON("chat.completion.chunk")
	}
	if !engines.IsNull(r.Usage) {
		chunk["usage"] = r.Usage
	}
	choices := make([]map[string]json.RawMessage, 0, len(r.Choices))
	for _, ch := range r.Choices {
		out := map[string]json.RawMessage{"index": ch["index"], "finish_reason": ch["finish_reason"]}
		if lp, ok := ch["logprobs"]; ok {
			out["logprobs"] = lp
		}
		if chat {
			out["delta"] = ch["message"]
		} else {
			out["text"] = ch["text"]
		}
		for k, v := range out {
			if v == nil {
				out[k] = json.RawMessage("null")
			}
		}
		choices = append(choices, out)
	}
	chunk["choices"] = engines.RawJSON(choices)
	for k, v := range chunk {
		if v == nil {
			chunk[k] = json.RawMessage("null")
		}
	}
	b, err := json.Marshal(chunk)
	if err != nil {
		return nil, err
	}
	out := append([]byte("data: "), b...)
	return append(out, "\n\ndata: [DONE]\n\n"...), nil
}
