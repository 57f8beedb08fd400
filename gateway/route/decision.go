package route

import (
	"sync/atomic"
	"time"
)

// Tier names in decisions.
const (
	TierKVExact  = "kv-exact"
	TierSession  = "session"
	TierTrie     = "trie"
	TierMinLoad  = "min-load"
	TierRescue   = "rescue"
	TierSelector = "selector" // followed by ":" + selector name
	// TierPlacement: KV-exact missed and placed the prompt by KV headroom (placement.go).
	TierPlacement = "placement"
)

// Miss says why KV-exact did not decide a request. Each miss counts exactly one reason.
type Miss string

const (
	MissNone          Miss = ""
	MissModeOff       Miss = "mode_off"       // the rule's kvExactMode is 0
	MissNoCertificate Miss = "no_certificate" // no valid certificate covers the rule's profile
	MissTextEmpty     Miss = "text_empty"     // no prompt could be extracted
	MissTokenizer     Miss = "unknown_tokenizer"
	MissTokenize      Miss = "tokenize" // tokenize or chat-template failure
	MissHashes        Miss = "hashes"   // zero full blocks
	MissNoWorker      Miss = "no_worker"
	MissExcluded      Miss = "excluded"
	MissShallow       Miss = "shallow"
	// Request fields whose keys cannot be had exactly (docs/request-fields.md).
	MissMultimodal      Miss = "multimodal"       // image/audio/video parts: the processor's hashes
	MissRequestTemplate Miss = "request_template" // a request chat_template
	MissPromptEmbeds    Miss = "prompt_embeds"    // prompt_embeds tensors
	MissTruncation      Miss = "truncation"       // truncate_prompt_tokens cuts the prompt unknowably
	MissBatch           Miss = "batch"            // several prompts in one completions request
	MissLoRA            Miss = "lora"             // the engine's keys do not separate LoRA adapters
	MissCacheSalt       Miss = "cache_salt"       // the engine's keys do not carry cache_salt
	MissNoCacheRead     Miss = "no_cache_read"    // prompt_logprobs / skip_reading_prefix_cache: the engine reads no cached block
	// MissAdapterUncertified: no endpoint's certificate proved the requested adapter's LoRA name.
	MissAdapterUncertified Miss = "adapter_uncertified"
)

// Misses lists every reason, for metrics.
var Misses = []Miss{MissModeOff, MissNoCertificate, MissTextEmpty, MissTokenizer, MissTokenize, MissHashes, MissNoWorker, MissExcluded, MissShallow,
	MissMultimodal, MissRequestTemplate, MissPromptEmbeds, MissTruncation, MissBatch, MissLoRA, MissCacheSalt, MissNoCacheRead, MissAdapterUncertified}

// Decision is a routing outcome with its evidence. Release must be called exactly once when the
// request ends (it gives back the load units the decision took).
type Decision struct {
	Target  *Endpoint `json:"-"` // the endpoint that serves (mode 3/0) or prefills (mode 1)
	Decode  *Endpoint `json:"-"` // mode 1 only
	TargetN string    `json:"target"`
	DecodeN string    `json:"decode,omitempty"`
	Tier    string    `json:"tier"`
	Miss    Miss      `json:"miss,omitempty"`
	Reason  string    `json:"reason,omitempty"` // detail of the miss
	Blocks  int       `json:"blocks"`           // full blocks in the prompt
	// MaxHit, when below Blocks, is the most blocks the engine's cache may serve of this prompt
	// (it computes the last prompt token, so a prompt ending on a block boundary can hit all its
	// blocks but the last): scores and prefixes stop there.
	MaxHit int `json:"maxHit,omitempty"`
	Score  int `json:"score,omitempty"` // winner's score (blocks)
	// Rank is the data-parallel rank of Target that KV-exact scored, when the request must go to
	// it (the proxy and the picker send Target.RankHeader with it).
	Rank      *int               `json:"rank,omitempty"`
	Spill     bool               `json:"spill,omitempty"`
	Seeded    bool               `json:"seeded,omitempty"`
	Endpoints []EndpointEvidence `json:"endpoints,omitempty"`

	// Predicted: the winner's score needed predicted blocks (predict-on-route), not only confirmed.
	Predicted bool `json:"predicted,omitempty"`

	released atomic.Bool
	received atomic.Bool // Receipt was called
	drained  atomic.Bool // own left Target's queued prefill (first token, receipt or release)
	// Under the ttft law: own is the request's uncached prompt tokens on Target (added to its
	// queued prefill until the receipt or the release), aheadAt and loadAt Target's queued
	// prefill (with the engine's reported waiting work) and load when routed, ttftPredicted the
	// winner's prediction, slotWaitAt the wait for a running slot in it; gateway the request's
	// time in the gateway before its upstream send (Sent); hitAt the prompt tokens predicted
	// cached on Target's GPU (added to its queued hits, Endpoint.AheadHit, like own).
	own, aheadAt, loadAt      int
	hitAt                     HitTokens
	lowerAt                   [nLower]int // the tokens Target was predicted to load from each lower tier
	ttftPredicted, slotWaitAt time.Duration
	gateway                   time.Duration
	queued                    bool    // the ttft law's accounting ran (queuePrefill)
	rt                        *Router // set by take: Release gives the load units back through it
	dry                       bool
	keys                      []uint64 // the prompt's block keys, for predict-on-route
	tokens                    int      // the prompt's length in tokens (its last, partial block included)
	hit                       int      // how many of keys the engine's cache may serve (MaxHit, or all of them)
	// c is the decision in the making, which the tiers read and fill in (ladder.go). It lives
	// here because the decision is allocated anyway: a choice of its own would be one more
	// allocation per request.
	c       choice
	candBuf [8]*Endpoint // backs the ladder's candidate list: no allocation for up to 8 endpoints
}

// Release gives back the decision's load units (idempotent).
func (d *Decision) Release() {
	if d == nil {
		return
	}
	if d.rt == nil || d.released.Swap(true) {
		return
	}
	d.Target.active.Add(-1)
	d.received.Store(true)
	d.drain()
	if d.Decode != nil {
		d.Decode.active.Add(-1)
	}
	d.rt.admission.released()
}

// FirstToken reports that the answer's first token came: the request's prefill is over, so its
// uncached tokens leave its target's queued prefill (the ttft law's ahead) now rather than when
// its answer ends. Safe on nil and idempotent.
func (d *Decision) FirstToken() {
	if d != nil && d.rt != nil {
		d.drain()
	}
}

// drain takes the decision's own prefill out of its target's queue, once.
func (d *Decision) drain() {
	if d.queued && !d.drained.Swap(true) {
		d.Target.ahead.Add(-int64(d.own))
		d.Target.aheadHit.Add(-int64(d.hitAt.Confirmed))
		d.Target.aheadAssumed.Add(-int64(d.hitAt.Assumed))
		d.Target.pending.Add(-1)
	}
}

// LastKey is the key of the prompt's deepest full block as the gateway computed it (its chain
// covers the whole keyed prompt), false when the decision computed no keys. The gateway's
// token-side check (router binding) looks for it in the engine's published blocks.
func (d *Decision) LastKey() (uint64, bool) {
	if d == nil || len(d.keys) == 0 {
		return 0, false
	}
	return d.keys[len(d.keys)-1], true
}
