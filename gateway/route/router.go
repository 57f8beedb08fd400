package route

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/kvexact/kvexact/gateway/health"
	"github.com/kvexact/kvexact/gateway/inventory"
	"github.com/kvexact/kvexact/gateway/rules"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// Request is what the tiers need to know about one client request.
type Request struct {
	// Model is the requested model name.
	Model string
	// Chat is true for /v1/chat/completions.
	Chat bool
	// Body is the raw JSON body (chat rendering needs it verbatim).
	Body []byte
	// Prompt is a completions prompt given as text ("" otherwise).
	Prompt string
	// PromptTokens is a completions prompt given as token ids.
	PromptTokens []uint32
	// AffinityText is the text content affinity hashes (prompt, or the messages' text).
	AffinityText string
	// ConversationID is the client's X-Conversation-Id header.
	ConversationID string
	// User is the body's user field.
	User string
	// AddSpecialTokens is the body's add_special_tokens (nil: the endpoint's default — true for
	// completions, false for chat).
	AddSpecialTokens *bool
	// CacheSalt is the body's cache_salt ("" when absent); vLLM and SGLang hash it into block keys.
	CacheSalt string
	// LoRAName is set when the requested model is a LoRA adapter the rule serves (vLLM hashes it).
	// The router sets it from the rule's adapters; Model then names the base model.
	LoRAName string
	// ChatRequest is the chat body as the proxy parsed it, once (nil: the keyer parses Body);
	// ChatError, when set, says why the body is not a chat request the engine accepts.
	ChatRequest *tokenize.ChatRequest
	ChatError   error
	// Batch is the number of prompts of a completions request (0 or 1: a single prompt).
	Batch int
	// TruncatePromptTokens and TruncationSide are the body's truncate_prompt_tokens (nil: absent)
	// and truncation_side ("" when absent): the engine keeps that many prompt tokens.
	TruncatePromptTokens *int64
	TruncationSide       string
	// PromptEmbeds is true when the request carries prompt_embeds (hashed from tensors the gateway
	// does not decode).
	PromptEmbeds bool
}

// sessionKey is X-Conversation-Id, else user.
func (r *Request) sessionKey() string {
	if r.ConversationID != "" {
		return r.ConversationID
	}
	return r.User
}

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
)

// Misses lists every reason, for metrics.
var Misses = []Miss{MissModeOff, MissNoCertificate, MissTextEmpty, MissTokenizer, MissTokenize, MissHashes, MissNoWorker, MissExcluded, MissShallow,
	MissMultimodal, MissRequestTemplate, MissPromptEmbeds, MissTruncation, MissBatch, MissLoRA, MissCacheSalt}

// Keyer turns a request into the block keys the rule's inventory holds (tokenize, render, hash).
// A failure is a Miss with a human reason, never a guess.
type Keyer interface {
	Keys(ctx context.Context, r *Request) (keys []uint64, miss Miss, reason string)
}

// Tier names in decisions.
const (
	TierKVExact  = "kv-exact"
	TierSession  = "session"
	TierTrie     = "trie"
	TierMinLoad  = "min-load"
	TierRescue   = "rescue"
	TierSelector = "selector" // followed by ":" + selector name
)

// EndpointEvidence is one endpoint's part of a decision.
type EndpointEvidence struct {
	Name     string `json:"name"`
	Overlap  int    `json:"overlap"`
	Prefix   int    `json:"prefix"`
	Load     int    `json:"load"`
	Cap      int    `json:"cap,omitempty"`
	Excluded string `json:"excluded,omitempty"`
	Eligible bool   `json:"eligible"` // certified for KV-exact and a candidate of this tier

	// Predicted is how many blocks of Prefix come from predict-on-route, not from engine events.
	Predicted int `json:"predicted,omitempty"`
}

// Decision is a routing outcome with its evidence. Release must be called exactly once when the
// request ends (it gives back the load units the decision took).
type Decision struct {
	Target    *Endpoint          `json:"-"` // the endpoint that serves (mode 3/0) or prefills (mode 1)
	Decode    *Endpoint          `json:"-"` // mode 1 only
	TargetN   string             `json:"target"`
	DecodeN   string             `json:"decode,omitempty"`
	Tier      string             `json:"tier"`
	Miss      Miss               `json:"miss,omitempty"`
	Reason    string             `json:"reason,omitempty"` // detail of the miss
	Blocks    int                `json:"blocks"`           // full blocks in the prompt
	Score     int                `json:"score,omitempty"`  // winner's score (blocks)
	Spill     bool               `json:"spill,omitempty"`
	Seeded    bool               `json:"seeded,omitempty"`
	Endpoints []EndpointEvidence `json:"endpoints,omitempty"`

	// Predicted: the winner's score needed predicted blocks (predict-on-route), not only confirmed.
	Predicted bool `json:"predicted,omitempty"`

	released atomic.Bool
	rt       *Router // set by take: Release gives the load units back through it
	dry      bool
	candBuf  [8]*Endpoint // backs a pool's candidate list: no allocation for up to 8 endpoints
	keys     []uint64     // the prompt's block keys, for predict-on-route
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
	if d.Decode != nil {
		d.Decode.active.Add(-1)
	}
	d.rt.admission.released()
}

// ErrNoEndpoint: nothing healthy can serve (503).
var ErrNoEndpoint = errors.New("no healthy endpoint can serve this request")

// Config builds a router for one rule.
type Config struct {
	Rule      *rules.Rule
	Endpoints []*Endpoint
	Index     *inventory.Index
	// Keyer computes block keys; nil means KV-exact cannot run (miss unknown_tokenizer).
	Keyer Keyer
	// Certified marks the endpoints a valid certificate covers for this rule's profile. When
	// CertReason is non-empty, no endpoint is covered and it says why (miss no_certificate).
	Certified  inventory.Mask
	CertReason string
	Metrics    *Metrics
	Now        func() time.Time
	Log        *slog.Logger
}

// Router routes one rule's requests.
type Router struct {
	cfg       Config
	rule      *rules.Rule
	eps       []*Endpoint
	sel       Selector
	selTier   string // TierSelector + ":" + sel.Name(), built once
	law       Law
	minMatch  int
	sessions  *sessions
	trie      *prefixTrie
	admission *admission
	predict   *predictions // nil unless the rule sets predictOnRoute
	pd        bool

	tieDecode  atomic.Uint64
	tieMinLoad atomic.Uint64
	hits       atomic.Uint64 // KV-exact hits, for cold-start seeding
	zeroHits   atomic.Int64  // consecutive zero-overlap lookups against a non-empty inventory
	watchdog   atomic.Bool   // watchdog warning active

	// discovered are the adapters read from the endpoints' /v1/models (adapters.go).
	discovered atomic.Pointer[discoveredAdapters]
}

// New builds a router.
func New(cfg Config) (*Router, error) {
	r := cfg.Rule
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	sel, err := NewSelector(r.Selector, cfg.Endpoints, r.CHWBL.Replication, r.CHWBL.LoadFactor, r.CHWBL.PrefixChars)
	if err != nil {
		return nil, err
	}
	rt := &Router{cfg: cfg, rule: r, eps: cfg.Endpoints, sel: sel, selTier: TierSelector + ":" + sel.Name(), minMatch: *r.MinMatchTokens}
	rt.law = Law{Kind: LawKind(r.LoadLaw.Kind), FactorPct: int(100*(1+*r.LoadLaw.Epsilon) + 0.5), Lambda: r.LoadLaw.Lambda, SpillRelief: *r.LoadLaw.SpillRelief}
	rt.predict = newPredictions(time.Duration(r.PredictOnRoute), cfg.Now)
	for _, e := range cfg.Endpoints {
		if e.Role == RolePrefill || e.Role == RoleDecode {
			rt.pd = true
		}
	}
	if rt.pd {
		rt.sessions = newSessions(time.Duration(r.Session.TTL), cfg.Now)
		if r.Trie.Enabled {
			rt.trie = newPrefixTrie(64, 1<<16)
		}
		if r.Admission.Enabled {
			rt.admission = newAdmission(r.Admission.MaxInflightPerEndpoint, r.Admission.Mode == "shed", r.Admission.QueueDepth, time.Duration(r.Admission.MaxPark))
		}
	}
	return rt, nil
}

// Rule returns the rule the router serves.
func (rt *Router) Rule() *rules.Rule { return rt.rule }

// Endpoints returns the rule's endpoints in order.
func (rt *Router) Endpoints() []*Endpoint { return rt.eps }

// Route decides where a request goes. retry holds endpoints that already failed to connect for
// this request; they are excluded from every tier, so the second-best wins on a retry.
func (rt *Router) Route(ctx context.Context, req *Request, retry inventory.Mask) (*Decision, error) {
	retry = orMask(retry, rt.adapterAbsent(req.Model))
	if rt.pd {
		return rt.routePD(ctx, req, retry, false)
	}
	return rt.routePool(ctx, req, retry, false)
}

// Explain decides like Route but changes nothing: no load taken, no session or trie entry, no
// admission wait, no metric. It answers /admin/explain.
func (rt *Router) Explain(ctx context.Context, req *Request) (*Decision, error) {
	absent := rt.adapterAbsent(req.Model)
	if rt.pd {
		return rt.routePD(ctx, req, absent, true)
	}
	return rt.routePool(ctx, req, absent, true)
}

// candidates returns the non-excluded endpoints with the given roles.
func (rt *Router) candidates(retry inventory.Mask, roles ...Role) []*Endpoint {
	return rt.appendCandidates(nil, retry, roles...)
}

// appendCandidates appends the non-excluded endpoints with the given roles to out.
func (rt *Router) appendCandidates(out []*Endpoint, retry inventory.Mask, roles ...Role) []*Endpoint {
	for _, e := range rt.eps {
		if !hasRole(e.Role, roles) || e.excluded(retry) != health.NotExcluded {
			continue
		}
		out = append(out, e)
	}
	return out
}

func hasRole(r Role, roles []Role) bool {
	for _, x := range roles {
		if r == x {
			return true
		}
	}
	return false
}

// routePool is mode 3 (and mode 0 on a role-less rule): KV-exact, then the rule's selector.
func (rt *Router) routePool(ctx context.Context, req *Request, retry inventory.Mask, dry bool) (*Decision, error) {
	d := &Decision{dry: dry}
	cands := rt.appendCandidates(d.candBuf[:0], retry, RoleNormal)
	if rt.rule.KVExactMode == 3 {
		if w := rt.kvExact(ctx, req, d, retry, RoleNormal); w != nil {
			d.Target, d.Tier = w, TierKVExact
		}
	} else {
		rt.miss(d, MissModeOff, "kvExactMode is 0")
	}
	if d.Target == nil {
		if len(cands) == 0 {
			return nil, ErrNoEndpoint
		}
		d.Target = rt.sel.Pick(req, cands)
		d.Tier = rt.selTier
	}
	if !dry {
		rt.predict.routed(d)
	}
	rt.take(d)
	return d, nil
}

// routePD is mode 1 (and mode 0 on a P/D rule): admission, session, trie, KV-exact, min-load,
// decode pick, any-healthy rescue.
func (rt *Router) routePD(ctx context.Context, req *Request, retry inventory.Mask, dry bool) (*Decision, error) {
	prefills := func() []*Endpoint { return rt.candidates(retry, RolePrefill) }
	if !dry {
		if err := rt.admission.wait(ctx, prefills); err != nil {
			return nil, err
		}
	}
	ps := prefills()
	if rt.admission != nil {
		var open []*Endpoint
		for _, p := range ps {
			if p.Active() < rt.admission.maxInflight {
				open = append(open, p)
			}
		}
		ps = open
	}
	d := &Decision{dry: dry}
	pin, pinned := rt.sessions.get(req.sessionKey())
	if pinned {
		if p := byIndex(ps, pin.prefill); p != nil {
			d.Target, d.Tier = p, TierSession
		}
	}
	if d.Target == nil && rt.trie != nil && len(ps) > 0 && req.AffinityText != "" {
		if !rt.imbalanced(ps) {
			if eps, pct := rt.trie.match(req.AffinityText); pct >= rt.rule.Trie.ThresholdPct {
				for i := len(eps) - 1; i >= 0; i-- {
					if p := byIndex(ps, eps[i]); p != nil {
						d.Target, d.Tier = p, TierTrie
						break
					}
				}
			}
		}
	}
	if d.Target == nil {
		if rt.rule.KVExactMode == 1 {
			if w := rt.kvExact(ctx, req, d, retry, RolePrefill); w != nil && contains(ps, w) {
				d.Target, d.Tier = w, TierKVExact
			}
		} else {
			rt.miss(d, MissModeOff, "kvExactMode is 0")
		}
	}
	if d.Target == nil && len(ps) > 0 {
		d.Target, d.Tier = minLoad(ps, &rt.tieMinLoad), TierMinLoad
	}
	if d.Target == nil {
		// Any-healthy rescue: a role-less endpoint serves the whole request.
		if rescue := rt.candidates(retry, RoleNormal); len(rescue) > 0 {
			d.Target, d.Tier = minLoad(rescue, &rt.tieMinLoad), TierRescue
			rt.take(d)
			return d, nil
		}
		return nil, ErrNoEndpoint
	}
	decodes := rt.candidates(retry, RoleDecode)
	if pinned {
		d.Decode = byIndex(decodes, pin.decode)
	}
	if d.Decode == nil {
		d.Decode = minLoad(decodes, &rt.tieDecode)
	}
	if d.Decode == nil {
		return nil, ErrNoEndpoint
	}
	if !dry {
		rt.sessions.put(req.sessionKey(), d.Target.Index, d.Decode.Index)
	}
	if rt.trie != nil && req.AffinityText != "" && !dry {
		rt.trie.insert(req.AffinityText, d.Target.Index)
	}
	rt.take(d)
	return d, nil
}

// ReselectDecode re-validates the decode endpoint after a long prefill: if it became excluded, the
// least-loaded healthy decode endpoint takes over and the load unit moves with it.
func (rt *Router) ReselectDecode(d *Decision) *Endpoint {
	if d.Decode == nil || d.Decode.excluded(inventory.Mask{}) == health.NotExcluded {
		return d.Decode
	}
	next := minLoad(rt.candidates(inventory.Mask{}, RoleDecode), &rt.tieDecode)
	if next == nil {
		return nil
	}
	d.Decode.active.Add(-1)
	next.active.Add(1)
	d.Decode, d.DecodeN = next, next.Name
	return next
}

func (rt *Router) imbalanced(ps []*Endpoint) bool {
	lo, hi := ps[0].Active(), ps[0].Active()
	for _, p := range ps {
		lo, hi = min(lo, p.Active()), max(hi, p.Active())
	}
	return hi-lo > rt.rule.Trie.BalanceAbs
}

func byIndex(eps []*Endpoint, idx int) *Endpoint {
	for _, e := range eps {
		if e.Index == idx {
			return e
		}
	}
	return nil
}

func contains(eps []*Endpoint, e *Endpoint) bool { return byIndex(eps, e.Index) == e }

// take records the load units of a decision and arms its release.
func (rt *Router) take(d *Decision) {
	d.TargetN = d.Target.Name
	if d.Decode != nil {
		d.DecodeN = d.Decode.Name
	}
	if d.dry {
		return
	}
	d.Target.active.Add(1)
	d.Target.served.Add(1)
	if d.Decode != nil {
		d.Decode.active.Add(1)
		d.Decode.served.Add(1)
	}
	if rt.cfg.Metrics != nil {
		rt.cfg.Metrics.decided(rt.rule.Name, d)
	}
	d.rt = rt
}

func (rt *Router) miss(d *Decision, m Miss, reason string) {
	d.Miss, d.Reason = m, reason
	if rt.cfg.Metrics != nil && !d.dry {
		rt.cfg.Metrics.missed(rt.rule.Name, m)
	}
}

// kvExact runs the guard ladder and the load law over the candidates of role. It returns the winner,
// or nil with d.Miss set.
func (rt *Router) kvExact(ctx context.Context, req *Request, d *Decision, retry inventory.Mask, role Role) *Endpoint {
	if rt.cfg.CertReason != "" {
		rt.miss(d, MissNoCertificate, rt.cfg.CertReason)
		return nil
	}
	if m, reason := req.unkeyable(); m != MissNone {
		rt.miss(d, m, reason)
		return nil
	}
	absent := rt.adapterAbsent(req.Model)
	req = rt.adapt(req)
	if rt.cfg.Keyer == nil {
		rt.miss(d, MissTokenizer, "no tokenizer configured for this rule")
		return nil
	}
	keys, m, reason := rt.cfg.Keyer.Keys(ctx, req)
	if m != MissNone {
		rt.miss(d, m, reason)
		return nil
	}
	d.Blocks, d.keys = len(keys), keys
	if len(keys) == 0 {
		rt.miss(d, MissHashes, "the prompt is shorter than one block")
		return nil
	}
	// Score every endpoint of the role (for evidence), but only certified, non-excluded ones compete.
	var mask inventory.Mask
	for _, e := range rt.eps {
		if e.Role == role {
			mask.Set(e.ID)
		}
	}
	scores := rt.cfg.Index.Score(keys, mask, nil)
	byID := make(map[inventory.EndpointID]inventory.Score, len(scores))
	for _, s := range scores {
		byID[s.Endpoint] = s
	}
	var cands []Scored
	var candEps []*Endpoint
	anyResident, bestAll := false, 0
	var bestAllEp *Endpoint
	for _, e := range rt.eps {
		if e.Role != role {
			continue
		}
		s := byID[e.ID]
		var predicted int
		if rt.predict != nil {
			s.Prefix, predicted = rt.predict.extend(e.ID, keys, s.Prefix)
			s.Overlap = max(s.Overlap, s.Prefix)
		}
		score := s.Overlap
		if rt.rule.Scoring == "prefix" {
			score = s.Prefix
		}
		ev := EndpointEvidence{Name: e.Name, Overlap: s.Overlap, Prefix: s.Prefix, Load: e.Load(), Predicted: predicted}
		if ex := e.excluded(retry); ex != health.NotExcluded {
			ev.Excluded = string(ex)
		}
		if absent.Has(e.ID) {
			ev.Excluded = ExcludedAdapterNotListed
		}
		if f := e.Fenced(); f != "" && ev.Excluded == "" {
			ev.Excluded = "fenced: " + f
		}
		ev.Eligible = ev.Excluded == "" && rt.cfg.Certified.Has(e.ID)
		d.Endpoints = append(d.Endpoints, ev)
		if rt.cfg.Index.Resident(e.ID) > 0 {
			anyResident = true
		}
		if score > bestAll {
			bestAll, bestAllEp = score, e
		}
		if ev.Eligible {
			cands = append(cands, Scored{Index: e.Index, Score: score, Load: e.Load(), Capacity: max(e.Capacity, 1) * max(e.Weight, 1)})
			candEps = append(candEps, e)
		}
	}
	if !d.dry {
		rt.watch(bestAll, anyResident)
	}
	best := 0
	for _, c := range cands {
		best = max(best, c.Score)
	}
	if best <= 0 {
		if bestAll > 0 && bestAllEp != nil {
			rt.miss(d, MissExcluded, "the endpoint holding the prefix ("+bestAllEp.Name+") is excluded or not certified")
		} else {
			rt.miss(d, MissNoWorker, "no endpoint holds any of the prompt's blocks")
		}
		return nil
	}
	need := (rt.minMatch + rt.rule.BlockSize - 1) / rt.rule.BlockSize
	need = min(need, len(keys))
	if best < need {
		rt.miss(d, MissShallow, "best match is below minMatchTokens")
		return nil
	}
	v := rt.law.Pick(cands, len(keys))
	if v.Pos < 0 {
		rt.miss(d, MissNoWorker, "the load law found no candidate")
		return nil
	}
	w := candEps[v.Pos]
	d.Score, d.Spill = cands[v.Pos].Score, v.Spill
	for _, ev := range d.Endpoints {
		if ev.Name == w.Name && ev.Predicted > 0 {
			d.Predicted = true
		}
	}
	for i := range d.Endpoints {
		for j, c := range candEps {
			if c.Name == d.Endpoints[i].Name && v.Caps != nil {
				d.Endpoints[i].Cap = v.Caps[j]
			}
		}
	}
	// Cold-start seeding: every Nth hit goes to the lowest-index cold endpoint, so a new endpoint
	// starts learning prefixes instead of staying empty forever.
	if n := *rt.rule.LoadLaw.ColdStartSeedN; n > 0 && !d.dry {
		if rt.hits.Add(1)%uint64(n) == 0 {
			for _, e := range candEps {
				if e != w && rt.cfg.Index.Resident(e.ID) < rt.rule.LoadLaw.ColdStartMinBlocks {
					w, d.Seeded = e, true
					break
				}
			}
		}
	}
	return w
}

// watch is the zero-hit watchdog: a long run of lookups that find nothing while the inventory is
// not empty usually means a parity leg differs (seed, algorithm, block size, tokenizer). It warns
// once per transition and counts every occurrence.
func (rt *Router) watch(bestAll int, anyResident bool) {
	const threshold = 50
	if bestAll > 0 || !anyResident {
		rt.zeroHits.Store(0)
		rt.watchdog.Store(false)
		return
	}
	if rt.zeroHits.Add(1) >= threshold {
		if rt.cfg.Metrics != nil {
			rt.cfg.Metrics.zeroHit(rt.rule.Name)
		}
		if !rt.watchdog.Swap(true) {
			rt.cfg.Log.Warn("KV-exact found no cached block for 50 consecutive prompts while the inventory is not empty: check seed, hash algorithm, block size, tokenizer and chat template (ctk certify)", "rule", rt.rule.Name)
		}
	}
}
