package kvbench

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// Workload names.
const (
	WorkloadSystemPrompt = "system-prompt" // shared system prompts, Zipf popularity
	WorkloadMultiTurn    = "multi-turn"    // chats that grow turn by turn
	WorkloadRAG          = "rag"           // documents reused across users
	WorkloadControl      = "control"       // nothing shared
	// WorkloadChatTrace follows LMSYS-Chat-1M's published statistics (Zheng et al. 2023,
	// arXiv:2309.11998, Table 1, also the dataset card's "Basic Statistics"; checked, see
	// docs/benchmarks/peers.md): 2.0 turns per conversation on average, 69.5-token user turns,
	// 214.5-token replies (Llama 2 tokens in the paper; drawn here in the pool's tokenizer's).
	WorkloadChatTrace = "chat-trace"
	// WorkloadTenants is the system-prompt workload with each request salted by its tenant
	// (cache_salt): the same prompt of two tenants shares no KV block, so a router that ignores
	// the salt predicts hits the engine cannot give (false sharing).
	WorkloadTenants = "tenant-salted"
	// WorkloadPressure is the system-prompt workload over Shape.PressurePrefixes prompts drawn
	// uniformly: a working set about 3× the 4-engine pool's GPU KV, so engines evict and a router's
	// picture of their caches goes stale.
	WorkloadPressure = "pressure"
	// WorkloadBurst is the system-prompt workload with bursty arrivals: the mean rate, sent as
	// bursts at 4× the rate for a quarter of every half second and silence in between.
	WorkloadBurst = "burst"
	// WorkloadOffload is the pressure workload on engines with vLLM's CPU offloading tier
	// (PoolShape.OffloadBlocks): the working set exceeds the pool's GPU KV but fits its host
	// memory, so a prompt evicted from a GPU is still a transfer away where it was computed.
	WorkloadOffload = "offload"
	// WorkloadLoRATenants is the system-prompt workload served through Shape.Adapters LoRA adapters
	// to Shape.LoRATenants tenants: each request names one adapter (uniform) and carries its tenant's
	// cache_salt (uniform), so one prompt has adapters × tenants different block chains and a
	// router that keys text alone predicts hits the engine cannot give.
	WorkloadLoRATenants = "lora-tenants"
	// WorkloadSmallPool is the real-vLLM benchmark's situation (scripts/bench-vllm.sh) on the
	// simulator: Shape.SmallPoolPrefixes system prompts of about 38 blocks (Zipf), each with a
	// unique question, on 3 engines of 96 blocks (PoolShape.ShapeFor). The six prefixes fit the
	// pool two an engine (76 of 96 blocks) but not three (114): where a prefix's first request goes
	// decides whether the engines evict prefixes still in use.
	WorkloadSmallPool = "small-pool"
)

// AdapterName is the served name of the lora-tenants workload's i-th adapter.
func AdapterName(i int) string { return fmt.Sprintf("adapter-%d", i) }

// Workloads lists them in report order.
var Workloads = []string{WorkloadSystemPrompt, WorkloadMultiTurn, WorkloadRAG, WorkloadControl, WorkloadChatTrace, WorkloadTenants, WorkloadPressure, WorkloadBurst, WorkloadOffload, WorkloadLoRATenants, WorkloadSmallPool}

// Sharing reports whether a workload has shared prefixes (the control has none).
func Sharing(name string) bool { return name != WorkloadControl }

// Request is one client request of a workload: the body it sends and the prompt tokens the engine
// will see (rendered and tokenized as the engine does), which only the oracle reads.
type Request struct {
	Chat   bool
	Body   []byte
	Tokens []uint32
	// CacheSalt is the body's cache_salt ("" = none); the engine hashes it into every block key.
	CacheSalt string
	// LoRAName is the adapter the body names ("" = the base model); vLLM hashes it into every block.
	LoRAName string
	// Arrival is the scheduled send time, from the start of the run (open loop, Poisson).
	Arrival time.Duration
}

// Workload is a seeded, reproducible request sequence.
type Workload struct {
	Name     string
	Requests []Request
	// MeanPromptTokens is the mean rendered prompt length.
	MeanPromptTokens float64
	// MaxTokens is every request's output length.
	MaxTokens int
}

// extras are the request fields the engine hashes into block keys besides the tokens.
func (q *Request) extras() *hashcore.Extras {
	if q.CacheSalt == "" && q.LoRAName == "" {
		return nil
	}
	return &hashcore.Extras{CacheSalt: q.CacheSalt, LoRAName: q.LoRAName}
}

// Shape sets the sizes of the workloads, in tokens (approximate: text is drawn in words).
type Shape struct {
	SystemPrompts      int // distinct shared system prompts
	SystemPromptTokens int
	ZipfS              float64 // popularity exponent (> 1)
	UserTokens         int     // the unique question of a request
	Conversations      int     // multi-turn: conversations active at once
	TurnTokens         int     // multi-turn: user turn length
	ReplyTokens        int     // multi-turn: assistant reply length (synthetic, fixed per turn)
	MaxTurns           int     // multi-turn: a conversation ends after 3..MaxTurns turns
	Documents          int     // RAG: corpus size
	DocumentTokens     int
	DocsPerRequest     int
	ControlTokens      int // control: unique prompt length
	MaxTokens          int // output tokens per request
	// Chat trace (LMSYS-Chat-1M, Table 1 of arXiv:2309.11998): mean turns per conversation, mean
	// user-turn and reply lengths; turns are geometric, lengths exponential around those means.
	TraceConversations int
	TraceMeanTurns     float64
	TracePromptTokens  float64
	TraceReplyTokens   float64
	Tenants            int // tenant-salted: distinct cache_salt values
	// PressurePrefixes is the pressure workload's number of distinct system prompts (drawn
	// uniformly): 96 of ~1000 tokens are ~3× the 32,768 tokens of KV of 4 engines of 512 blocks.
	PressurePrefixes int
	// OffloadPrefixes is the offload workload's number of distinct system prompts (drawn
	// uniformly): 48 of ~1000 tokens are ~3,000 blocks, 1.5× the 4 × 512 blocks of GPU KV and
	// under the 4 × 1,024 of host memory (PoolShape.OffloadBlocksFor).
	OffloadPrefixes int
	// lora-tenants: LoRAPrompts system prompts (Zipf) through Adapters adapters to LoRATenants
	// tenants: 4 × 8 × 2 = 64 block chains of ~63 blocks, about twice the 4-engine pool's GPU KV.
	LoRAPrompts, Adapters, LoRATenants int
	// small-pool: SmallPoolPrefixes system prompts of SmallPoolPrefixTokens (38 blocks of 16
	// tokens), Zipf SmallPoolZipfS, as kvbench drive's six 38-block prefixes at Zipf 1.2.
	SmallPoolPrefixes, SmallPoolPrefixTokens int
	SmallPoolZipfS                           float64
}

// DefaultShape keeps prompts near 1k tokens so every workload costs about the same uncached.
func DefaultShape() Shape {
	return Shape{SystemPrompts: 48, SystemPromptTokens: 1000, ZipfS: 1.1, UserTokens: 80,
		Conversations: 24, TurnTokens: 150, ReplyTokens: 60, MaxTurns: 8,
		Documents: 64, DocumentTokens: 450, DocsPerRequest: 2, ControlTokens: 1000, MaxTokens: 6,
		TraceConversations: 24, TraceMeanTurns: 2.0, TracePromptTokens: 69.5, TraceReplyTokens: 214.5, Tenants: 4, PressurePrefixes: 96, OffloadPrefixes: 48, LoRAPrompts: 4, Adapters: 8, LoRATenants: 2,
		SmallPoolPrefixes: 6, SmallPoolPrefixTokens: 38 * 16, SmallPoolZipfS: 1.2}
}

// tokensPerWord is measured once per tokenizer on the synthetic vocabulary.
func tokensPerWord(tok *tokenize.Tokenizer) float64 {
	ids, err := tok.Encode(words(textRand(1, "calibrate", 0), 2000), false)
	if err != nil || len(ids) == 0 {
		return 2
	}
	return float64(len(ids)) / 2000
}

// BuildWorkload draws n requests of the named workload with Poisson arrivals at rate (requests/s).
// The same (name, seed, n, rate) always gives the same requests and arrival times.
func BuildWorkload(name string, seed uint64, n int, rate float64, sh Shape, model string, tok *tokenize.Tokenizer) (*Workload, error) {
	tpw := tokensPerWord(tok)
	text := func(kind string, id, tokens int) string {
		return words(textRand(seed, kind, id), max(1, int(math.Round(float64(tokens)/tpw))))
	}
	r := rand.New(rand.NewPCG(seed, uint64(len(name))*7919+1))
	w := &Workload{Name: name, MaxTokens: sh.MaxTokens}
	completion := func(prompt string) Request {
		body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": sh.MaxTokens,
			"stream": true, "stream_options": map[string]any{"include_usage": true}})
		return Request{Body: body}
	}
	switch name {
	case WorkloadTenants:
		// The system-prompt workload's prompts, each request from one of the tenants (uniform).
		z := rand.NewZipf(r, sh.ZipfS, 1, uint64(sh.SystemPrompts-1))
		sys := make([]string, sh.SystemPrompts)
		for i := range sys {
			sys[i] = fmt.Sprintf("You are assistant %d. ", i) + text("system", i, sh.SystemPromptTokens)
		}
		for i := 0; i < n; i++ {
			s := sys[z.Uint64()]
			salt := fmt.Sprintf("tenant-%d", r.IntN(max(sh.Tenants, 1)))
			body, _ := json.Marshal(map[string]any{"model": model, "prompt": s + "\n\nUser: " + text("question", i, sh.UserTokens) + "\nAssistant:",
				"max_tokens": sh.MaxTokens, "cache_salt": salt, "stream": true, "stream_options": map[string]any{"include_usage": true}})
			w.Requests = append(w.Requests, Request{Body: body, CacheSalt: salt})
		}
	case WorkloadLoRATenants:
		z := rand.NewZipf(r, sh.ZipfS, 1, uint64(max(sh.LoRAPrompts, 2)-1))
		sys := make([]string, max(sh.LoRAPrompts, 2))
		for i := range sys {
			sys[i] = fmt.Sprintf("You are assistant %d. ", i) + text("system", i, sh.SystemPromptTokens)
		}
		for i := 0; i < n; i++ {
			s := sys[z.Uint64()]
			adapter := AdapterName(r.IntN(max(sh.Adapters, 1)))
			salt := fmt.Sprintf("tenant-%d", r.IntN(max(sh.LoRATenants, 1)))
			body, _ := json.Marshal(map[string]any{"model": adapter, "prompt": s + "\n\nUser: " + text("question", i, sh.UserTokens) + "\nAssistant:",
				"max_tokens": sh.MaxTokens, "cache_salt": salt, "stream": true, "stream_options": map[string]any{"include_usage": true}})
			w.Requests = append(w.Requests, Request{Body: body, CacheSalt: salt, LoRAName: adapter})
		}
	case WorkloadChatTrace:
		type conv struct {
			id, turns, limit int
			msgs             []map[string]string
		}
		length := func(mean float64) int { return max(1, int(math.Round(r.ExpFloat64()*mean))) }
		next := 0
		fresh := func() *conv {
			// Geometric turn count with the trace's mean: P(k) = p(1−p)^(k−1), p = 1/mean.
			c := &conv{id: next, limit: 1}
			for r.Float64() > 1/sh.TraceMeanTurns {
				c.limit++
			}
			next++
			return c
		}
		slots := make([]*conv, max(sh.TraceConversations, 1))
		for i := range slots {
			slots[i] = fresh()
		}
		for i := 0; i < n; i++ {
			k := r.IntN(len(slots))
			c := slots[k]
			c.turns++
			c.msgs = append(c.msgs, map[string]string{"role": "user", "content": fmt.Sprintf("Chat %d turn %d. ", c.id, c.turns) + text("trace-turn", c.id*1000+c.turns, length(sh.TracePromptTokens))})
			body, _ := json.Marshal(map[string]any{"model": model, "messages": c.msgs, "max_tokens": sh.MaxTokens,
				"stream": true, "stream_options": map[string]any{"include_usage": true}})
			w.Requests = append(w.Requests, Request{Chat: true, Body: body})
			c.msgs = append(c.msgs, map[string]string{"role": "assistant", "content": text("trace-reply", c.id*1000+c.turns, length(sh.TraceReplyTokens))})
			if c.turns >= c.limit {
				slots[k] = fresh()
			}
		}
	case WorkloadPressure, WorkloadOffload:
		n0 := sh.PressurePrefixes
		if name == WorkloadOffload {
			n0 = sh.OffloadPrefixes
		}
		sys := make([]string, max(n0, 1))
		for i := range sys {
			sys[i] = fmt.Sprintf("You are assistant %d. ", i) + text("system", i, sh.SystemPromptTokens)
		}
		for i := 0; i < n; i++ {
			w.Requests = append(w.Requests, completion(sys[r.IntN(len(sys))]+"\n\nUser: "+text("question", i, sh.UserTokens)+"\nAssistant:"))
		}
	case WorkloadSystemPrompt, WorkloadBurst, WorkloadSmallPool:
		prompts, tokens, zs := sh.SystemPrompts, sh.SystemPromptTokens, sh.ZipfS
		if name == WorkloadSmallPool {
			prompts, tokens, zs = sh.SmallPoolPrefixes, sh.SmallPoolPrefixTokens, sh.SmallPoolZipfS
		}
		z := rand.NewZipf(r, zs, 1, uint64(max(prompts, 2)-1))
		sys := make([]string, max(prompts, 2))
		for i := range sys {
			sys[i] = fmt.Sprintf("You are assistant %d. ", i) + text("system", i, tokens)
		}
		for i := 0; i < n; i++ {
			s := sys[z.Uint64()]
			w.Requests = append(w.Requests, completion(s+"\n\nUser: "+text("question", i, sh.UserTokens)+"\nAssistant:"))
		}
	case WorkloadRAG:
		z := rand.NewZipf(r, sh.ZipfS, 1, uint64(sh.Documents-1))
		instr := "Answer the question using only the documents below. Cite the document numbers you used, and say so when the documents do not contain the answer. " + text("instruction", 0, 10)
		for i := 0; i < n; i++ {
			var b strings.Builder
			b.WriteString(instr)
			seen := map[uint64]bool{}
			for len(seen) < sh.DocsPerRequest {
				d := z.Uint64()
				if seen[d] {
					continue
				}
				seen[d] = true
				fmt.Fprintf(&b, "\n\nDocument %d: %s", d, text("document", int(d), sh.DocumentTokens))
			}
			b.WriteString("\n\nQuestion: " + text("question", i, sh.UserTokens) + "\nAnswer:")
			w.Requests = append(w.Requests, completion(b.String()))
		}
	case WorkloadControl:
		for i := 0; i < n; i++ {
			w.Requests = append(w.Requests, completion(fmt.Sprintf("Request %d. ", i)+text("control", i, sh.ControlTokens)))
		}
	case WorkloadMultiTurn:
		type conv struct {
			id, turns, limit int
			msgs             []map[string]string
		}
		next := 0
		fresh := func() *conv {
			c := &conv{id: next, limit: 3 + r.IntN(max(1, sh.MaxTurns-2))}
			next++
			c.msgs = []map[string]string{{"role": "system", "content": fmt.Sprintf("Conversation %d. ", c.id) + text("persona", c.id, 80)}}
			return c
		}
		slots := make([]*conv, sh.Conversations)
		for i := range slots {
			slots[i] = fresh()
		}
		for i := 0; i < n; i++ {
			k := r.IntN(len(slots))
			c := slots[k]
			c.turns++
			c.msgs = append(c.msgs, map[string]string{"role": "user", "content": text("turn", c.id*100+c.turns, sh.TurnTokens)})
			body, _ := json.Marshal(map[string]any{"model": model, "messages": c.msgs, "max_tokens": sh.MaxTokens,
				"stream": true, "stream_options": map[string]any{"include_usage": true}})
			w.Requests = append(w.Requests, Request{Chat: true, Body: body})
			// The next turn carries a synthetic reply, as trace replays carry the recorded one.
			c.msgs = append(c.msgs, map[string]string{"role": "assistant", "content": text("reply", c.id*100+c.turns, sh.ReplyTokens)})
			if c.turns >= c.limit {
				slots[k] = fresh()
			}
		}
	default:
		return nil, fmt.Errorf("workload %q: not one of %s", name, strings.Join(Workloads, ", "))
	}
	// Render and tokenize as the engine will (completions add BOS; chat renders the template).
	var total int
	for i := range w.Requests {
		q := &w.Requests[i]
		var err error
		if q.Chat {
			var cr *tokenize.ChatRequest
			if cr, err = tokenize.ParseChatRequest(q.Body); err == nil {
				q.Tokens, _, err = tok.EncodeChat(cr)
			}
		} else {
			var b struct{ Prompt string }
			_ = json.Unmarshal(q.Body, &b)
			q.Tokens, err = tok.Encode(b.Prompt, true)
		}
		if err != nil {
			return nil, fmt.Errorf("workload %s request %d: %w", name, i, err)
		}
		total += len(q.Tokens)
	}
	if n > 0 {
		w.MeanPromptTokens = float64(total) / float64(n)
	}
	// Open-loop Poisson arrivals.
	ar := rand.New(rand.NewPCG(seed^0x9e3779b97f4a7c15, 1)) // same draws at every rate, scaled
	var t float64
	for i := range w.Requests {
		t += ar.ExpFloat64() / rate
		w.Requests[i].Arrival = time.Duration(t * float64(time.Second))
		if name == WorkloadBurst {
			w.Requests[i].Arrival = burstTime(t)
		}
	}
	return w, nil
}

// burstPeriod and burstOn shape the burst workload: arrivals drawn at the mean rate over "on"
// time are packed into the first burstOn of every burstPeriod, so the rate in a burst is
// burstPeriod/burstOn (4×) the mean and the mean is kept.
const (
	burstPeriod = 500 * time.Millisecond
	burstOn     = burstPeriod / 4
)

// burstTime maps t seconds of Poisson time at the mean rate to its place in the bursts.
func burstTime(t float64) time.Duration {
	on := t * float64(time.Second) * float64(burstOn) / float64(burstPeriod)
	k := math.Floor(on / float64(burstOn))
	return time.Duration(k*float64(burstPeriod) + (on - k*float64(burstOn)))
}
