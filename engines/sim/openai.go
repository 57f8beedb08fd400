package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// oaiBody holds the OpenAI request fields the simulator acts on. Types are checked as the engines'
// request models do (a string where an integer belongs is a 400).
type oaiBody struct {
	Model               *string         `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage         *bool `json:"include_usage"`
		ContinuousUsageStats *bool `json:"continuous_usage_stats"`
	} `json:"stream_options"`
	AddSpecialTokens *bool `json:"add_special_tokens"`
	// PromptLogprobs (vLLM) turns on skip_reading_prefix_cache unless the request sets that
	// itself (vLLM's SamplingParams: skip_reading_prefix_cache = prompt_logprobs is not None).
	PromptLogprobs         json.RawMessage `json:"prompt_logprobs"`
	SkipReadingPrefixCache *bool           `json:"skip_reading_prefix_cache"`
	CacheSalt              *string         `json:"cache_salt"`
	// SGLang: the request's session, echoed on its stores from v0.5.21 (PR #37482).
	SessionID *string `json:"session_id"`
	// vLLM P/D.
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	// SGLang P/D and DP pinning.
	BootstrapHost json.RawMessage `json:"bootstrap_host"`
	BootstrapPort json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom json.RawMessage `json:"bootstrap_room"`
	RoutedDPRank  *int            `json:"routed_dp_rank"`
	DataParallel  *int            `json:"data_parallel_rank"`
	// TensorRT-LLM P/D.
	DisaggregatedParams *trtDisaggParams `json:"disaggregated_params"`
}

type trtDisaggParams struct {
	RequestType        string   `json:"request_type"`
	FirstGenTokens     []uint32 `json:"first_gen_tokens"`
	CtxRequestID       *uint64  `json:"ctx_request_id"`
	EncodedOpaqueState *string  `json:"encoded_opaque_state"`
	DraftTokens        []uint32 `json:"draft_tokens"`
}

// trtAllowed are the request fields TensorRT-LLM's request models accept (extra="forbid").
var trtAllowed = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`model prompt messages max_tokens max_completion_tokens temperature top_p top_k min_p n
		stream stream_options stop stop_token_ids seed logprobs top_logprobs echo presence_penalty frequency_penalty
		repetition_penalty length_penalty user best_of logit_bias suffix ignore_eos min_tokens skip_special_tokens
		spaces_between_special_tokens add_special_tokens include_stop_str_in_output use_beam_search early_stopping
		truncate_prompt_tokens return_context_logits return_generation_logits disaggregated_params lora_request
		response_format tools tool_choice parallel_tool_calls chat_template chat_template_kwargs add_generation_prompt
		documents mm_processor_kwargs detokenize prompt_ignore_length reasoning_effort cache_salt`) {
		trtAllowed[f] = true
	}
}

// reqKind is completions or chat.
type reqKind int

const (
	kindCompletion reqKind = iota
	kindChat
)

// maxChoices bounds n: the simulator's own limit (vLLM sets none below its scheduler's capacity).
const maxChoices = 128

func (e *Engine) handleCompletions(w http.ResponseWriter, r *http.Request) {
	e.handleOAI(w, r, kindCompletion)
}
func (e *Engine) handleChat(w http.ResponseWriter, r *http.Request) { e.handleOAI(w, r, kindChat) }

// preparedReq is a validated request.
type preparedReq struct {
	kind      reqKind
	body      oaiBody
	prompt    []uint32
	maxTokens int
	stream    bool
	usage     bool // stream_options.include_usage
	rank      int
	ex        *hashcore.Extras
	session   string // SGLang session_id
	model     string
	n         int // choices (OpenAI n): one generation, n copies of it, as the prompt's blocks are shared
}

func (e *Engine) handleOAI(w http.ResponseWriter, r *http.Request, kind reqKind) {
	if code := e.faults.take5xx(); code != 0 {
		e.writeError(w, code, "simulated failure (fault switch status_5xx)", "")
		return
	}
	raw, ok := e.readBody(w, r)
	if !ok {
		return
	}
	p, status, msg := e.prepare(raw, kind, r)
	if status != 0 {
		if status == -1 {
			e.badJSON(w, errors.New(msg))
			return
		}
		e.writeError(w, status, msg, "")
		return
	}
	e.serveGeneration(w, r, p)
}

// prepare validates a request and tokenizes its prompt. status -1 means "malformed JSON".
func (e *Engine) prepare(raw []byte, kind reqKind, r *http.Request) (*preparedReq, int, string) {
	p := &preparedReq{kind: kind, rank: -1}
	if err := decodeJSON(raw, &p.body); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) || errors.Is(err, errEmptyBody) {
			if e.cfg.Family == "llamacpp" {
				return nil, -1, err.Error()
			}
		}
		return nil, 400, jsonErrorMessage(err)
	}
	b := &p.body
	if msg := e.checkFields(raw, kind); msg != "" {
		return nil, 400, msg
	}
	if e.cfg.Family == "trtllm" {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(raw, &keys); err == nil {
			var extra []string
			for k := range keys {
				if !trtAllowed[k] {
					extra = append(extra, k)
				}
			}
			sort.Strings(extra)
			if len(extra) > 0 {
				return nil, 400, fmt.Sprintf("1 validation error: %s: Extra inputs are not permitted", extra[0])
			}
		}
	}
	p.model = e.cfg.ServedModelName
	if b.Model != nil {
		p.model = *b.Model
	}
	var lora *loraModule
	if e.cfg.Family == "vllm" && b.Model != nil && *b.Model != e.cfg.ServedModelName {
		if lora = e.lora(*b.Model); lora == nil {
			return nil, 404, fmt.Sprintf("The model `%s` does not exist.", *b.Model)
		}
	}
	p.n = 1
	if b.N != nil {
		if *b.N < 1 || *b.N > maxChoices {
			return nil, 400, fmt.Sprintf("n must be at least 1 and at most %d, got %d.", maxChoices, *b.N)
		}
		p.n = *b.N
	}
	p.stream = b.Stream != nil && *b.Stream
	if b.StreamOptions != nil {
		if !p.stream && e.cfg.Family == "vllm" {
			return nil, 400, "Stream options can only be defined when `stream=True`."
		}
		p.usage = b.StreamOptions.IncludeUsage != nil && *b.StreamOptions.IncludeUsage
	}
	p.maxTokens = e.cfg.DefaultMaxTokens
	if b.MaxCompletionTokens != nil {
		p.maxTokens = *b.MaxCompletionTokens
	} else if b.MaxTokens != nil {
		p.maxTokens = *b.MaxTokens
	}
	if p.maxTokens < 1 {
		return nil, 400, fmt.Sprintf("max_tokens must be at least 1, got %d.", p.maxTokens)
	}
	if b.CacheSalt != nil {
		if *b.CacheSalt == "" {
			return nil, 400, "Parameter 'cache_salt' must be a non-empty string if provided."
		}
		if e.cfg.Family == "vllm" || e.cfg.Family == "sglang" {
			p.ex = &hashcore.Extras{CacheSalt: *b.CacheSalt}
		}
	}
	if b.SessionID != nil && e.cfg.Family == "sglang" {
		p.session = *b.SessionID
	}
	if lora != nil {
		if p.ex == nil {
			p.ex = &hashcore.Extras{}
		}
		p.ex.LoRAName = lora.name
	}
	switch {
	case b.RoutedDPRank != nil:
		p.rank = *b.RoutedDPRank
	case b.DataParallel != nil:
		p.rank = *b.DataParallel
	}
	if h := r.Header.Get("X-data-parallel-rank"); h != "" && e.cfg.Family == "vllm" {
		// vLLM reads the header with int() and ignores a value that is not an integer
		// (_get_data_parallel_rank); an integer out of range is a 400 below.
		if n, err := strconv.Atoi(strings.TrimSpace(h)); err == nil {
			p.rank = n
		}
	}
	if p.rank >= e.cfg.DPRanks || p.rank < -1 {
		return nil, 400, fmt.Sprintf("data parallel rank %d out of range [0, %d)", p.rank, e.cfg.DPRanks)
	}
	var err error
	var trunc truncation
	keep := -1
	if e.cfg.Family == "vllm" {
		if trunc, err = parseTruncation(raw); err != nil {
			return nil, 400, err.Error()
		}
		if keep, err = trunc.limit(e.cfg.MaxModelLen, p.maxTokens); err != nil {
			return nil, 400, err.Error()
		}
	}
	if kind == kindChat {
		var cr *tokenize.ChatRequest
		cr, err = tokenize.ParseChatRequest(raw)
		if err != nil {
			return nil, 400, err.Error()
		}
		p.prompt, _, err = e.tok.EncodeChat(cr)
		if err != nil {
			return nil, 400, err.Error()
		}
		p.prompt = trunc.slice(p.prompt, keep)
	} else {
		var text string
		if keep >= 0 && e.textPrompt(b.Prompt, &text) {
			p.prompt, err = e.truncateText(text, b.AddSpecialTokens == nil || *b.AddSpecialTokens, trunc, keep)
		} else {
			p.prompt, err = e.promptTokens(b.Prompt, b.AddSpecialTokens)
			p.prompt = trunc.slice(p.prompt, keep)
		}
		if err != nil {
			return nil, 400, err.Error()
		}
	}
	if len(p.prompt) == 0 {
		return nil, 400, "The decoder prompt cannot be empty"
	}
	if len(p.prompt)+p.maxTokens > e.cfg.MaxModelLen {
		return nil, 400, errTooLong{len(p.prompt), p.maxTokens, e.cfg.MaxModelLen}.Error()
	}
	return p, 0, ""
}

// textPrompt reports whether raw is a text prompt (a string, or one string in a list), and sets it.
func (e *Engine) textPrompt(raw json.RawMessage, text *string) bool {
	if json.Unmarshal(raw, text) == nil {
		return true
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) == 1 {
		*text = ss[0]
		return true
	}
	return false
}

// promptTokens accepts the OpenAI prompt forms: a string, one string in a list, token ids, or one
// token-id list in a list.
func (e *Engine) promptTokens(raw json.RawMessage, addSpecial *bool) ([]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("1 validation error: prompt: Field required")
	}
	add := addSpecial == nil || *addSpecial
	if e.cfg.Family == "llamacpp" {
		add = true // llama.cpp adds BOS to completion prompts
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return e.tok.Encode(s, add)
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 {
			return nil, fmt.Errorf("prompt: the simulator serves one prompt per request (got %d)", len(ss))
		}
		return e.tok.Encode(ss[0], add)
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) != nil {
		var nested [][]int64
		if json.Unmarshal(raw, &nested) != nil {
			return nil, errors.New("1 validation error: prompt: Input should be a valid string or a list of integers")
		}
		if len(nested) != 1 {
			return nil, fmt.Errorf("prompt: the simulator serves one prompt per request (got %d)", len(nested))
		}
		ids = nested[0]
	}
	vocab := e.tok.VocabSize()
	out := make([]uint32, len(ids))
	for i, t := range ids {
		if t < 0 || t >= int64(vocab) {
			return nil, fmt.Errorf("Token id %d is out of vocabulary", t)
		}
		out[i] = uint32(t)
	}
	return out, nil
}

// serveGeneration runs the request (with its P/D dialect) and writes the response.
func (e *Engine) serveGeneration(w http.ResponseWriter, r *http.Request, p *preparedReq) {
	ctx := r.Context()
	id := e.responseID(p.kind)
	created := time.Now().Unix()
	q := &genReq{rank: p.rank, prompt: p.prompt, maxTokens: p.maxTokens, ex: p.ex, session: p.session, skipRead: e.cfg.Family == "vllm" && p.body.skipsPrefixCache()}
	pd, status, msg := e.preparePD(ctx, p, q)
	if status != 0 {
		e.writeError(w, status, msg, "")
		return
	}
	if pd.prefilledBy != "" {
		w.Header().Set(PrefilledByHeader, pd.prefilledBy)
	}
	var sse *sseWriter
	if p.stream && !pd.forceJSON {
		sse = &sseWriter{w: w, e: e, id: id, created: created, model: p.model, kind: p.kind, n: p.n}
		q.onPrefilled = func(int) { sse.start() }
		q.onToken = func(i int, tok uint32) { sse.token(tok) }
	}
	res, err := e.generate(ctx, q)
	if pd.after != nil {
		pd.after(res, err)
	}
	if err != nil {
		if ctx.Err() != nil {
			return // client went away
		}
		if sse != nil && sse.started {
			sse.errorEvent(err)
			return
		}
		status := http.StatusBadRequest
		var tl errTooLong
		if !errors.As(err, &tl) && !strings.Contains(err.Error(), "out of range") {
			status = http.StatusInternalServerError
		}
		if pd.failStatus != 0 {
			status = pd.failStatus
		}
		e.writeError(w, status, err.Error(), "")
		return
	}
	usage := e.usage(len(p.prompt), res, p.n)
	if sse != nil {
		sse.start()
		sse.finish(res.finish, usage, p.usage)
		return
	}
	text, _ := e.tok.Decode(res.output, true)
	choices := make([]any, p.n)
	for i := range choices {
		if p.kind == kindChat {
			choices[i] = map[string]any{"index": i, "message": map[string]any{"role": "assistant", "content": text, "tool_calls": []any{}},
				"logprobs": nil, "finish_reason": res.finish, "stop_reason": nil}
		} else {
			choices[i] = map[string]any{"index": i, "text": text, "logprobs": nil, "finish_reason": res.finish, "stop_reason": nil}
		}
	}
	choice := choices[0].(map[string]any)
	obj := "text_completion"
	if p.kind == kindChat {
		obj = "chat.completion"
	}
	resp := map[string]any{"id": id, "object": obj, "created": created, "model": p.model,
		"choices": choices, "usage": usage}
	if pd.decorate != nil {
		pd.decorate(resp, choice, res)
	}
	writeJSON(w, http.StatusOK, resp)
}

func (e *Engine) responseID(kind reqKind) string {
	prefix := "cmpl-"
	if kind == kindChat {
		prefix = "chatcmpl-"
	}
	return fmt.Sprintf("%s%s-%d%06d", prefix, e.cfg.Endpoint, e.created.Unix()%100000, e.reqID.Add(1))
}

// usage is the OpenAI usage object with the prefix-cache receipt; the completion tokens are summed
// over the choices, as vLLM does.
func (e *Engine) usage(prompt int, res *genRes, choices int) map[string]any {
	n := len(res.output) * choices
	return map[string]any{"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n,
		"prompt_tokens_details": map[string]any{"cached_tokens": res.cached}}
}

// sseWriter streams OpenAI chunks.
type sseWriter struct {
	w       http.ResponseWriter
	e       *Engine
	id      string
	created int64
	model   string
	kind    reqKind
	n       int // choices: every chunk is sent once per choice index
	started bool
	done    bool
}

func (s *sseWriter) send(v any) {
	b, _ := json.Marshal(v)
	_, _ = s.w.Write([]byte("data: "))
	_, _ = s.w.Write(b)
	_, _ = s.w.Write([]byte("\n\n"))
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *sseWriter) chunk(choices []any, usage any) map[string]any {
	obj := "text_completion"
	if s.kind == kindChat {
		obj = "chat.completion.chunk"
	}
	return map[string]any{"id": s.id, "object": obj, "created": s.created, "model": s.model, "choices": choices, "usage": usage}
}

// start writes the headers (and, for chat, the role delta) once the first token is ready.
func (s *sseWriter) start() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	s.w.WriteHeader(http.StatusOK)
	if s.kind == kindChat {
		for i := range max(s.n, 1) {
			s.send(s.chunk([]any{map[string]any{"index": i, "delta": map[string]any{"role": "assistant", "content": ""},
				"logprobs": nil, "finish_reason": nil}}, nil))
		}
	}
}

func (s *sseWriter) token(tok uint32) {
	s.start()
	text, _ := s.e.tok.Decode([]uint32{tok}, true)
	for i := range max(s.n, 1) {
		if s.kind == kindChat {
			s.send(s.chunk([]any{map[string]any{"index": i, "delta": map[string]any{"content": text}, "logprobs": nil, "finish_reason": nil}}, nil))
		} else {
			s.send(s.chunk([]any{map[string]any{"index": i, "text": text, "logprobs": nil, "finish_reason": nil, "stop_reason": nil}}, nil))
		}
	}
}

func (s *sseWriter) finish(reason string, usage map[string]any, includeUsage bool) {
	if s.done {
		return
	}
	s.done = true
	for i := range max(s.n, 1) {
		if s.kind == kindChat {
			s.send(s.chunk([]any{map[string]any{"index": i, "delta": map[string]any{}, "logprobs": nil, "finish_reason": reason, "stop_reason": nil}}, nil))
		} else {
			s.send(s.chunk([]any{map[string]any{"index": i, "text": "", "logprobs": nil, "finish_reason": reason, "stop_reason": nil}}, nil))
		}
	}
	if includeUsage {
		s.send(s.chunk([]any{}, usage))
	}
	_, _ = s.w.Write([]byte("data: [DONE]\n\n"))
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
}

// errorEvent reports a failure after streaming started, as vLLM does (an error object as data).
func (s *sseWriter) errorEvent(err error) {
	s.send(map[string]any{"error": map[string]any{"message": err.Error(), "type": "InternalServerError", "param": nil, "code": 500}})
	_, _ = s.w.Write([]byte("data: [DONE]\n\n"))
}

// skipsPrefixCache is vLLM's skip_reading_prefix_cache for the body: its own value when given, else
// whether prompt_logprobs is set (not null).
func (b *oaiBody) skipsPrefixCache() bool {
	if b.SkipReadingPrefixCache != nil {
		return *b.SkipReadingPrefixCache
	}
	v := bytes.TrimSpace(b.PromptLogprobs)
	return len(v) > 0 && !bytes.Equal(v, []byte("null"))
}
