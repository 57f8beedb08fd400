package ctk

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/hashcore"
	"github.com/kvexact/kvexact/gateway/ingest"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

// probeOutcome is what the hash-echo challenge saw: the probe prompt, our tokens for it, the
// engine's stored events after it was sent, which of them are the probe's own, and which of those
// align with our tokens.
type probeOutcome struct {
	prompt     string
	nonce      string   // the prompt's unique hex nonce
	want       []uint32 // our tokens for the prompt (add_special_tokens=true, as completions default)
	engineWant []uint32 // the engine's own tokens for it (its tokenize endpoint; nil without one)
	after      []seen   // stored events seen after the probe was sent
	own        []seen   // those that are the probe's: its tokens (ours or the engine's) or its nonce
	gaps       []string // stream irregularities seen while waiting for the probe's events
	aligned    []alignedEvent
	bs         int               // the engine's block size (from aligned events, else the probe's own)
	blocks     map[int]uint64    // block index → engine key, for full prompt blocks the engine stored
	parents    map[int]parentRef // block index of an event's first block → its parent
	covered    bool              // every block from the first stored one to the last full prompt block
	first      int               // first stored block index
	sentAt     int               // watcher event count when the probe was sent
	// engineCovered: the own events cover the engine's tokens as completely (no need to wait for
	// the gateway's tokens, which will not come).
	engineCovered bool
}

type alignedEvent struct {
	ev     seen
	offset int // token offset of the event's first block in want
}

type parentRef struct {
	has bool
	key uint64
}

// probeFiller is text appended after the nonce until the prompt spans enough blocks.
var probeFiller = []string{
	" Certification sends this prompt once and reads the engine's own cache events for it.",
	" Every block of it must come back with the keys the gateway computes.",
	" The nonce above makes the first blocks new to every engine cache.",
	" Numbers 0 1 2 3 4 5 6 7 8 9 and words keep the tokenizer honest.",
}

// newProbePrompt builds a unique prompt spanning at least two full blocks and a partial one.
func (r *endpointRun) newProbePrompt(bs int) (string, []uint32, error) {
	var nonce [16]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return "", nil, err
	}
	text := "kvexact certification probe " + hex.EncodeToString(nonce[:]) + "."
	target := max(2*bs+bs/2+1, 48)
	for i := 0; ; i++ {
		ids, err := r.tok.Encode(text, true)
		if err != nil {
			return "", nil, err
		}
		if len(ids) >= target || i > 4*target {
			return text, ids, nil
		}
		text += probeFiller[i%len(probeFiller)]
	}
}

func (r *endpointRun) noEventsReason() string {
	return fmt.Sprintf("%s publishes no KV-cache events: %s (certified for content affinity only)", r.ep.Family, r.st.Contract.Hash.NoneReason)
}

// ensureWatcher subscribes to the endpoint's event stream once per run (the events spec, or
// earlier the TensorRT-LLM tokenizer spec, which reads the prompt's ids from the engine's events).
func (r *endpointRun) ensureWatcher(ctx context.Context) error {
	if r.w != nil || r.watchErr != nil {
		return r.watchErr
	}
	w, err := startWatcher(ctx, r.ep.Family, r.ep.Release, r.st, r.ep.Events)
	if err != nil {
		r.watchErr = fmt.Errorf("event source: %w", err)
		return r.watchErr
	}
	r.w = w
	if err := w.ready(ctx, r.opts.SubscribeTimeout); err != nil {
		r.watchErr = fmt.Errorf("event stream %s: %w", r.streamName(), err)
	}
	return r.watchErr
}

func (r *endpointRun) specEvents(t *T) {
	if !r.st.Contract.HasEvents() {
		t.Skipf("%s", r.noEventsReason())
		return
	}
	if r.ep.Require == RequireAffinity && len(r.ep.Events.ZMQ) == 0 && r.ep.Events.Drain == "" {
		t.Skipf("the pool asks content affinity only of this endpoint and gives no event stream")
		return
	}
	ctx := t.Context()
	if err := r.ensureWatcher(ctx); err != nil {
		t.Failf(LegEvents, eventsHint, "%v", err)
		return
	}
	w := r.w
	if !r.st.Contract.Drained() {
		r.warmUp(ctx)
	}
	prompt, want, err := r.newProbePrompt(r.st.BlockSize)
	if err != nil {
		t.Failf(LegTokenizer, tokenizerHint, "probe prompt: %v", err)
		return
	}
	p := &probeOutcome{prompt: prompt, want: want, sentAt: w.count(), nonce: probeNonce(prompt)}
	r.probe = p
	// The engine's own ids for the prompt identify its events even when its tokenizer differs.
	if ids, err := r.pr.Tokenize(ctx, r.pool.Model, prompt, true); err == nil {
		p.engineWant = ids
	}
	noticesAt := w.noticeCount()
	if _, err := r.pr.Complete(ctx, engines.CompletionRequest{Model: r.pool.Model, Prompt: prompt, MaxTokens: 1}); err != nil {
		t.Failf(LegEvents, "the engine must serve a one-token completion of the probe prompt", "probe completion: %v", err)
		return
	}
	w.waitFor(ctx, r.opts.EventTimeout, func() bool {
		p.analyze(w.events[p.sentAt:], r.tok)
		return p.covered || p.engineCovered
	})
	evs, notices := w.snapshot()
	p.analyze(evs[p.sentAt:], r.tok)
	p.gaps = streamIrregularities(notices[noticesAt:])
	lost := ""
	if len(p.own) == 0 {
		lost = r.lostLive(ctx, evs)
	}
	switch {
	case len(p.own) > 0:
	case lost != "":
		t.Failf(LegSequence, sequenceHint, "%s", lost)
		return
	case len(p.gaps) > 0:
		t.Skipf("not comparable: no stored event for the probe arrived, and the stream lost messages meanwhile (%s): see the sequence spec", strings.Join(firstN(p.gaps, 2), "; "))
		return
	case len(p.after) > 0:
		t.Failf(LegEvents, fmt.Sprintf("give this endpoint's own publisher address as events (%s): the stream configured belongs to another endpoint or serves another model", r.eventsField()),
			"the stream at %s belongs to another endpoint/model: %d stored events arrived after the probe completion, none for the probe's tokens (as the engine tokenizes them) or its nonce", r.streamName(), len(p.after))
		return
	default:
		t.Failf(LegEvents, eventsHint, "no stored-block event arrived on %s within %s of the probe completion (%d other events seen)", r.streamName(), r.opts.EventTimeout, len(evs)-p.sentAt)
		return
	}
	if len(p.aligned) == 0 {
		t.Passf("%d stored events for the probe; none carries the gateway's tokens (see the token spec)", len(p.own))
		return
	}
	t.Passf("%d stored events for the probe, %d carrying the gateway's tokens (blocks %d..%d)", len(p.own), len(p.aligned), p.first, p.first+len(p.blocks)-1)
}

func (r *endpointRun) eventsField() string {
	if r.ep.Events.Drain != "" {
		return "events.drain"
	}
	return "events.zmq"
}

// joinSettle is how long after subscribing ctk waits before the first message it causes.
const joinSettle = 300 * time.Millisecond

// warmUp proves the live subscription before the probe: a ZeroMQ subscription reaches the
// publisher some time after the subscriber connects, and a message published before that is lost
// (the slow-joiner rule), so a unique warm-up completion is sent until one of its events arrives.
//
// The sequence spec counts a message the replay holds but the live stream never delivered as
// dropped, from the first message after the connect-time replay on. So the warm-up first lets the
// subscription settle (joinSettle after the connect) — a message published in the first
// milliseconds may be lost to the slow joiner, not by the engine.
func (r *endpointRun) warmUp(ctx context.Context) {
	sleep(ctx, time.Until(r.w.lastConnect().Add(joinSettle)))
	wait := min(time.Second, r.opts.SubscribeTimeout/3)
	for range 3 {
		prompt, _, err := r.newProbePrompt(r.st.BlockSize / 2)
		if err != nil {
			return
		}
		mark := r.w.count()
		if _, err := r.pr.Complete(ctx, engines.CompletionRequest{Model: r.pool.Model, Prompt: "warm-up " + prompt, MaxTokens: 1}); err != nil {
			return
		}
		if r.w.waitFor(ctx, wait, func() bool { return len(r.w.events) > mark }) {
			return
		}
	}
}

func (r *endpointRun) streamName() string {
	if r.ep.Events.Drain != "" {
		return r.ep.Events.Drain + r.st.Contract.Events.DrainPath
	}
	return strings.Join(r.ep.Events.ZMQ, ", ")
}

// analyze finds the probe's own stored events (GPU medium) among evs, and those whose tokens align
// with want at a multiple of their own block size, and records the engine keys of the full prompt
// blocks they hold.
func (p *probeOutcome) analyze(evs []seen, tok *tokenize.Tokenizer) {
	p.after, p.own = nil, nil
	// Events that state no block size (TensorRT-LLM) carry per-block token lists, and a finished
	// request's trailing partial block arrives alone: its few tokens would "align" anywhere. The
	// block size of such a stream is the longest block it ever stored.
	implied := 0
	for _, ev := range evs {
		if ev.Kind == engines.BlockStored && ev.BlockSize <= 0 {
			implied = max(implied, ev.blockSize())
		}
	}
	sizes := map[int]int{}
	for _, ev := range evs {
		if ev.Kind != engines.BlockStored || (ev.Medium != "" && ev.Medium != engines.MediumGPU) {
			continue
		}
		p.after = append(p.after, ev)
		bs := ev.blockSize()
		if ev.BlockSize <= 0 {
			bs = implied
		}
		if p.isOwn(ev, bs, tok) {
			p.own = append(p.own, ev)
			if bs > 0 {
				sizes[bs]++
			}
		}
	}
	c := cover(p.want, p.own, implied)
	p.aligned, p.bs, p.blocks, p.parents, p.covered, p.first = c.aligned, c.bs, c.blocks, c.parents, c.covered, c.first
	if p.bs == 0 {
		best := 0
		for bs, n := range sizes {
			if n > best || (n == best && bs < p.bs) {
				p.bs, best = bs, n
			}
		}
	}
	p.engineCovered = p.engineWant != nil && cover(p.engineWant, p.own, implied).covered
}

// isOwn says whether a stored event belongs to the probe: its tokens continue the gateway's or the
// engine's tokenization of the prompt at a block boundary, or they decode to text holding the nonce.
func (p *probeOutcome) isOwn(ev seen, bs int, tok *tokenize.Tokenizer) bool {
	if bs > 0 {
		toks, _ := fullBlocks(ev, bs)
		if alignAt(p.want, toks, bs) >= 0 || p.engineWant != nil && alignAt(p.engineWant, toks, bs) >= 0 {
			return true
		}
	}
	if p.nonce == "" || tok == nil {
		return false
	}
	toks := ev.Tokens
	if len(toks) == 0 {
		for _, b := range ev.Blocks {
			toks = append(toks, b...)
		}
	}
	text, err := tok.Decode(toks, false)
	return err == nil && strings.Contains(text, p.nonce[:16])
}

// alignAt is the token offset (a multiple of bs) at which toks continues want for at least one
// whole block, or -1.
func alignAt(want, toks []uint32, bs int) int {
	if bs <= 0 || len(toks) < bs {
		return -1
	}
	for o := 0; o+bs <= len(want); o += bs {
		m := min(len(toks), len(want)-o)
		if m >= bs && slices.Equal(want[o:o+m], toks[:m]) {
			return o
		}
	}
	return -1
}

// coverage is how a set of stored events covers one tokenization of the probe prompt.
type coverage struct {
	aligned []alignedEvent
	bs      int
	blocks  map[int]uint64
	parents map[int]parentRef
	covered bool
	first   int
}

func cover(want []uint32, evs []seen, implied int) coverage {
	c := coverage{blocks: map[int]uint64{}, parents: map[int]parentRef{}}
	for _, ev := range evs {
		bs := ev.blockSize()
		if ev.BlockSize <= 0 {
			bs = implied
		}
		toks, hashes := fullBlocks(ev, bs)
		if len(hashes) == 0 {
			continue
		}
		o := alignAt(want, toks, bs)
		if o < 0 {
			continue
		}
		m := min(len(toks), len(want)-o)
		c.aligned = append(c.aligned, alignedEvent{ev: ev, offset: o})
		c.bs = bs
		if _, ok := c.parents[o/bs]; !ok {
			c.parents[o/bs] = parentRef{has: ev.HasParent, key: ev.Parent}
		}
		for j, h := range hashes {
			if (j+1)*bs <= m {
				c.blocks[o/bs+j] = h
			}
		}
	}
	if len(c.blocks) == 0 || c.bs == 0 {
		return c
	}
	c.first = len(want)
	for i := range c.blocks {
		c.first = min(c.first, i)
	}
	for i := c.first; i <= len(want)/c.bs-1; i++ {
		if _, ok := c.blocks[i]; !ok {
			return c
		}
	}
	c.covered = true
	return c
}

// probeNonce is the hex nonce of a probe prompt ("" when there is none).
func probeNonce(prompt string) string {
	const lead = "kvexact certification probe "
	i := strings.Index(prompt, lead)
	if i < 0 || len(prompt) < i+len(lead)+32 {
		return ""
	}
	return prompt[i+len(lead) : i+len(lead)+32]
}

// streamIrregularities lists the gaps and rejects among notices.
func streamIrregularities(notices []notice) []string {
	var bad []string
	for _, n := range notices {
		switch n.Type {
		case "gap":
			bad = append(bad, fmt.Sprintf("rank %d: %d message(s) missing before seq %d (%s %s)", n.Rank, n.Missing, n.Seq, n.Reason, n.Detail))
		case "reject":
			bad = append(bad, fmt.Sprintf("rank %d: message seq %d rejected: %s %s", n.Rank, n.Seq, n.Reason, n.Detail))
		}
	}
	return bad
}

// fullBlocks returns the event's tokens and keys cut to whole blocks (TensorRT-LLM may store a
// trailing partial block; vLLM's token list may cover skipped null blocks, which it then cannot be
// aligned block for block).
func fullBlocks(ev seen, bs int) ([]uint32, []uint64) {
	if len(ev.Blocks) > 0 {
		var toks []uint32
		var hs []uint64
		for i, b := range ev.Blocks {
			if len(b) != bs || i >= len(ev.Hashes) {
				break
			}
			toks = append(toks, b...)
			hs = append(hs, ev.Hashes[i])
		}
		return toks, hs
	}
	if len(ev.Tokens) != len(ev.Hashes)*bs {
		return nil, nil
	}
	return ev.Tokens, ev.Hashes
}

// needProbe skips a spec when the events spec produced nothing to compare.
func (r *endpointRun) needProbe(t *T) bool {
	if !r.st.Contract.HasEvents() {
		t.Skipf("%s", r.noEventsReason())
		return false
	}
	if r.probe == nil || len(r.probe.own) == 0 {
		t.Skipf("not comparable: no stored-block event for the probe (see the events spec)")
		return false
	}
	return true
}

func (r *endpointRun) specBlockSize(t *T) {
	if !r.needProbe(t) {
		return
	}
	p := r.probe
	if p.bs != r.st.BlockSize {
		stated := ""
		if cfg, err := r.pr.Config(t.Context()); err == nil && cfg.BlockSize > 0 {
			stated = fmt.Sprintf(" (the engine's %s says %d)", cfg.Source, cfg.BlockSize)
		}
		t.Failf(LegBlockSize, fmt.Sprintf("set blockSize: %d in the pool and the rule, or start the engine with %d tokens per block (%s)", p.bs, r.st.BlockSize, blockSizeFlags),
			"the engine's probe events have block size %d%s; the pool stages %d", p.bs, stated, r.st.BlockSize)
		return
	}
	t.Passf("block size %d", p.bs)
}

func (r *endpointRun) specTokens(t *T) {
	if !r.needProbe(t) {
		return
	}
	p := r.probe
	if !p.covered && len(p.gaps) > 0 {
		t.Skipf("not comparable: the probe's blocks %v arrived, others may have been lost in a sequence gap (%s): see the sequence spec", sortedKeys(p.blocks), firstN(p.gaps, 1)[0])
		return
	}
	if !p.covered {
		msg := r.tokenMismatch(t.Context())
		t.Failf(LegTokens, tokenizerHint, "%s", msg)
		return
	}
	for _, a := range p.aligned {
		if a.ev.Extra {
			t.Failf(LegTokens, "the probe sends no LoRA and no cache_salt: check the engine adds no extra keys of its own (a default LoRA, a salt)", "the probe's stored blocks carry extra keys or a LoRA name")
			return
		}
	}
	n := len(p.want) / p.bs
	t.Passf("blocks %d..%d (%d tokens) equal the gateway's tokens", p.first, n-1, (n-p.first)*p.bs)
}

// tokenMismatch explains why no event carries our tokens: the engine's own tokenization of the
// probe (where it offers one) against ours, and what the first stored event after the probe holds.
func (r *endpointRun) tokenMismatch(ctx context.Context) string {
	p := r.probe
	var parts []string
	if theirs, err := r.pr.Tokenize(ctx, r.pool.Model, p.prompt, true); err == nil {
		if i := firstDiff(theirs, p.want); i >= 0 {
			parts = append(parts, fmt.Sprintf("the engine tokenizes the probe prompt differently: first difference at token %d: engine %s, gateway %s", i, r.around(theirs, i), r.around(p.want, i)))
		} else {
			parts = append(parts, "the engine's tokenize endpoint agrees with the gateway on the probe prompt, yet its stored events carry other tokens")
		}
	}
	if len(p.aligned) == 0 {
		ev := p.own[0]
		toks := ev.Tokens
		i := firstDiff(toks, p.want)
		if i < 0 {
			i = 0
		}
		parts = append(parts, fmt.Sprintf("no stored event after the probe carries the gateway's tokens; the first one (seq %d, %d tokens) reads %s where the gateway has %s", ev.Seq, len(toks), r.around(toks, i), r.around(p.want, i)))
	} else {
		parts = append(parts, fmt.Sprintf("the engine stored blocks %v of the probe's %d full blocks", sortedKeys(p.blocks), len(p.want)/p.bs))
	}
	return strings.Join(parts, "; ")
}

func sortedKeys(m map[int]uint64) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// keysFor computes the engine keys of want under algorithm a with the staged block size and seed.
func (r *endpointRun) keysFor(a string) ([]uint64, error) {
	seed, err := r.st.Contract.EngineSeed(a, r.st.Seed)
	if err != nil {
		return nil, err
	}
	h, err := hashcore.New(hashcore.Binding{Algorithm: hashcore.Algorithm(a), BlockSize: r.st.BlockSize, Seed: seed}, hashcore.Default())
	if err != nil {
		return nil, err
	}
	return h.Keys(r.probe.want, nil, nil)
}

// keysMatch compares the engine's stored keys (and the parents of aligned events) with keys.
func (p *probeOutcome) keysMatch(keys []uint64) (bool, string) {
	for _, i := range sortedKeys(p.blocks) {
		if i >= len(keys) {
			return false, fmt.Sprintf("block %d: no key computed", i)
		}
		if keys[i] != p.blocks[i] {
			return false, fmt.Sprintf("block %d: engine key %#016x, gateway %#016x", i, p.blocks[i], keys[i])
		}
	}
	for i, pr := range p.parents {
		switch {
		case i == 0 && pr.has:
			return false, fmt.Sprintf("block 0 has parent %#016x; the gateway's chain starts at the root", pr.key)
		case i > 0 && pr.has && i-1 < len(keys) && pr.key != keys[i-1]:
			return false, fmt.Sprintf("block %d: engine parent %#016x, gateway key of block %d %#016x", i, pr.key, i-1, keys[i-1])
		}
	}
	return true, ""
}

func (r *endpointRun) specKeys(t *T) {
	ct := r.st.Contract
	switch {
	case !ct.HasEvents():
		t.Skipf("%s", r.noEventsReason())
		return
	case !ct.SupportsBinding("engine"):
		t.Skipf("%s offers only the %s binding: its own block hashes are not reproducible, so the gateway rehashes event tokens", r.ep.Family, strings.Join(ct.Hash.Bindings, ", "))
		return
	case r.st.Binding == "router":
		t.Skipf("the pool stages the router binding")
		return
	}
	if _, err := ct.EngineSeed(r.st.Algorithm, r.st.Seed); err != nil {
		t.Skipf("the pool stages no seed and the engine binding cannot follow: %v", err)
		return
	}
	if !r.needProbe(t) {
		return
	}
	p := r.probe
	if p.bs != r.st.BlockSize {
		t.Skipf("not comparable: the block size differs (see the block-size spec)")
		return
	}
	if !p.covered {
		t.Skipf("not comparable: the tokens differ (see the token spec)")
		return
	}
	if cfg, err := r.pr.Config(t.Context()); err == nil && cfg.HashBlockSize > 0 && cfg.HashBlockSize != p.bs {
		// Hybrid geometry (vLLM resolve_kv_cache_block_sizes): the event's group is coarser than
		// the hash chain, so its keys are every k-th hash of a finer chain, which the engine
		// binding does not compute.
		t.Failf(LegBlockSize, fmt.Sprintf("stage binding: router or auto (the gateway rehashes the events' tokens at block size %d); the engine binding cannot follow a chain of %d-token hashes published per %d-token block", p.bs, cfg.HashBlockSize, p.bs),
			"the engine chains its block hashes at hash_block_size %d (%s) but its probe events carry block size %d: KV-cache groups of several block sizes (a hybrid model, or --prefix-match-unit)", cfg.HashBlockSize, cfg.Source, p.bs)
		return
	}
	keys, err := r.keysFor(r.st.Algorithm)
	if err != nil {
		t.Failf(LegAlgorithm, "", "hash core: %v", err)
		return
	}
	ok, why := p.keysMatch(keys)
	if ok {
		t.Passf("%d block keys equal (%s)", len(p.blocks), r.st.Algorithm)
		return
	}
	// Tokens and block size agree, so the seed or the algorithm differs. Try the other algorithms
	// with the staged seed: a match names the algorithm, none names the seed.
	for _, a := range ct.Hash.Algorithms {
		if a == r.st.Algorithm {
			continue
		}
		if k, err := r.keysFor(a); err == nil {
			if ok, _ := p.keysMatch(k); ok {
				t.Failf(LegAlgorithm, fmt.Sprintf("set hashAlgorithm: %s in the pool and the rule, or start the engine with --prefix-caching-hash-algo %s", a, r.st.Algorithm),
					"the engine's keys are %s keys; the pool stages %s (%s)", a, r.st.Algorithm, why)
				return
			}
		}
	}
	if ct.Hash.Seed != "pythonhashseed" {
		t.Failf(LegAlgorithm, fmt.Sprintf("the engine does not hash pages as %s %s does: check the release and that nothing salts the probe (cache_salt) or switches to bigram pages (EAGLE speculative decoding)", ct.Family, ct.Pin.Release),
			"tokens and block size match, the keys differ: %s", why)
		return
	}
	stated := ""
	if cfg, err := r.pr.Config(t.Context()); err == nil && cfg.Algorithm != "" && cfg.Algorithm != r.st.Algorithm {
		stated = fmt.Sprintf("; the engine's %s states algorithm %s", cfg.Source, cfg.Algorithm)
	}
	hint := fmt.Sprintf("set PYTHONHASHSEED on the engine to the rule's seed (%s roots block hashes at H(PYTHONHASHSEED); unset means random per process), or set seed in the pool and the rule to the engine's PYTHONHASHSEED", r.family().Display())
	if r.st.Seed == nil {
		seed, _ := ct.EngineSeed(r.st.Algorithm, nil)
		hint = fmt.Sprintf("the pool stages no seed, so the gateway used %s %s's default seed %q: unset PYTHONHASHSEED on the engine, or set seed in the pool and the rule to the engine's PYTHONHASHSEED", ct.Family, ct.Versions.String(), *seed)
	}
	t.Failf(LegSeed, hint,
		"tokens and block size match, but no %s algorithm reproduces the engine's keys with the staged seed: %s%s", r.family().Display(), why, stated)
}

func (r *endpointRun) specSequence(t *T) {
	if !r.st.Contract.HasEvents() {
		t.Skipf("%s", r.noEventsReason())
		return
	}
	if r.w == nil {
		t.Skipf("not run: no event stream (see the events spec)")
		return
	}
	evs, notices := r.w.snapshot()
	if len(evs) == 0 {
		t.Skipf("no event seen on %s", r.streamName())
		return
	}
	bad := streamIrregularities(notices)
	bad = append(bad, r.startGaps(t.Context(), evs)...)
	if len(bad) > 0 {
		t.Failf(LegSequence, sequenceHint, "%d irregularities: %s", len(bad), strings.Join(firstN(bad, 4), "; "))
		return
	}
	t.Passf("%d events, no gap, regression or reject", len(evs))
}

func (r *endpointRun) specReplay(t *T) {
	ct := r.st.Contract
	switch {
	case !ct.HasEvents():
		t.Skipf("%s", r.noEventsReason())
		return
	case ct.Events.Replay != "optional":
		t.Skipf("%s has no replay (contract %s): gaps clear the endpoint's mirror", r.ep.Family, ct.ID)
		return
	case len(r.ep.Events.Replay) == 0:
		t.Skipf("no replay address configured (events.replay); the engine serves replay only when its replay_endpoint is set, and without it the gateway cannot refill gaps")
		return
	}
	if !r.needProbe(t) {
		return
	}
	if len(r.probe.aligned) == 0 {
		t.Skipf("not comparable: no stored event carries the probe's tokens (see the token spec)")
		return
	}
	a := r.probe.aligned[0].ev
	if a.Rank >= len(r.ep.Events.Replay) {
		t.Failf(LegReplay, "give one replay address per rank", "the probe's batch came from rank %d; events.replay has %d address(es)", a.Rank, len(r.ep.Events.Replay))
		return
	}
	addr := r.ep.Events.Replay[a.Rank]
	if err := replayHas(t.Context(), r.ep.Family, addr, a.Seq, a.Hashes[0], r.opts.EventTimeout); err != nil {
		t.Failf(LegReplay, fmt.Sprintf("check that events.replay[%d] (%s) is the engine's replay_endpoint for rank %d (ranks use port + rank) and that its buffer_steps keeps recent batches", a.Rank, addr, a.Rank), "replay from seq %d on %s: %v", a.Seq, addr, err)
		return
	}
	t.Passf("replay from seq %d on %s returned the probe's batch", a.Seq, addr)
}

// replayHas asks a replay socket for everything from seq and wants a batch holding key.
func replayHas(ctx context.Context, family, addr string, seq, key uint64, timeout time.Duration) error {
	n, found := 0, false
	var ferr error
	err := replayAll(ctx, addr, seq, timeout, func(got uint64, payload []byte) bool {
		n++
		b, err := decodeReplayed(family, payload)
		if err != nil {
			ferr = fmt.Errorf("replayed batch seq %d: %w", got, err)
			return false
		}
		for _, ev := range b.Events {
			if ev.Kind == engines.BlockStored && slices.Contains(ev.BlockHashes, key) {
				if got != seq {
					ferr = fmt.Errorf("the probe's batch came back as seq %d, live it was seq %d", got, seq)
				}
				found = true
				return false
			}
		}
		return true
	})
	switch {
	case ferr != nil:
		return ferr
	case found:
		return nil
	case err != nil:
		return err
	}
	return fmt.Errorf("the replay ended after %d batch(es) without the probe's batch (seq %d)", n, seq)
}

// replayAll asks a replay socket for everything from start and hands each batch to fn until the
// end marker or fn returns false.
func replayAll(ctx context.Context, addr string, start uint64, timeout time.Duration, fn func(seq uint64, payload []byte) bool) error {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(timeout), zmq4.WithLogger(log.New(io.Discard, "", 0)),
		zmq4.WithMaxMessageSize(ingest.DefaultMaxMessageBytes)) // a bad frame header must not make ctk allocate what it announces
	defer d.Close()
	if err := d.Dial(addr); err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	if err := d.SendMulti(zmq4.NewMsgFrom(engines.ReplayRequest(start)...)); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	n := 0
	for {
		msg, err := d.Recv()
		if err != nil {
			if rctx.Err() != nil {
				return fmt.Errorf("no end marker within %s after %d batch(es)", timeout, n)
			}
			return fmt.Errorf("after %d batch(es): %w", n, err)
		}
		got, payload, end, err := engines.ParseReplayReply(msg.Frames)
		if err != nil {
			return err
		}
		if end {
			return nil
		}
		n++
		if !fn(got, payload) {
			return nil
		}
	}
}

func (r *endpointRun) specClear(t *T) {
	ct := r.st.Contract
	if !ct.HasEvents() {
		t.Skipf("%s", r.noEventsReason())
		return
	}
	if r.w == nil || r.probe == nil || len(r.probe.own) == 0 {
		t.Skipf("not run: no event stream (see the events spec)")
		return
	}
	ctx := t.Context()
	mark := r.w.count()
	refusals, err := r.clearWhenIdle(ctx)
	var ns *engines.NotSupportedError
	var refused *engines.ClearRefusedError
	switch {
	case errors.As(err, &ns):
		t.Skipf("%s (give the endpoint a clear URL to test it)", ns.Error())
		return
	case errors.As(err, &refused):
		t.Failf(LegClear, "the engine must accept a cache reset when idle: certify it while no other traffic runs on it",
			"endpoint %s: POST %s refused the cache reset %d times, %s apart: the engine stayed busy (requests running or transfers in flight); its last answer: HTTP %d: %s",
			r.ep.Name, refused.URL, refusals, clearRetryInterval, refused.Status, refused.Body)
		return
	case err != nil:
		t.Failf(LegClear, "the engine must accept a cache reset when idle", "endpoint %s: cache clear: %v", r.ep.Name, err)
		return
	}
	// vLLM publishes the events a step collected at the end of that step, so an idle engine holds
	// a reset's AllBlocksCleared until it next runs a request: a one-token prompt (shorter than a
	// block, it stores nothing) makes it run one.
	if err := r.stepEveryRank(ctx); err != nil {
		t.Failf(LegClear, clearHint, "the step after the clear (a one-token completion): %v", err)
		return
	}
	probeKeys := map[uint64]bool{}
	for _, a := range r.probe.aligned {
		for _, h := range a.ev.Hashes {
			probeKeys[h] = true
		}
	}
	ranks := max(r.w.ranks, 1)
	ok := r.w.waitFor(ctx, r.opts.EventTimeout, func() bool {
		cleared := map[int]bool{}
		removed := map[uint64]bool{}
		for _, ev := range r.w.events[mark:] {
			switch ev.Kind {
			case engines.AllBlocksCleared:
				cleared[ev.Rank] = true
			case engines.BlockRemoved:
				for _, h := range ev.Hashes {
					removed[h] = true
				}
			}
		}
		if len(cleared) >= ranks {
			return true
		}
		if len(probeKeys) == 0 {
			return false
		}
		for k := range probeKeys {
			if !removed[k] {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Failf(LegClear, clearHint, "the cache was cleared, but no AllBlocksCleared (on every rank) and no removal of the probe's blocks arrived within %s", r.opts.EventTimeout)
		return
	}
	t.Passf("the clear was announced on the event stream")
}

// The clear spec's patience with a busy engine: engines refuse a cache reset while requests hold
// blocks (vLLM 200 {"success": false}, SGLang 400, the simulator's /sim/clear 409), and the probe's
// own requests may still be finishing when the spec starts. clearAttempts tries, clearRetryInterval
// apart (about two seconds in all), then the spec fails naming the URL; any other error fails at
// once.
const (
	clearAttempts      = 10
	clearRetryInterval = 200 * time.Millisecond
)

// clearWhenIdle posts the endpoint's cache clear (its clear URL, else the family's own) until the
// engine accepts it, retrying only refusals (*engines.ClearRefusedError), at most clearAttempts
// times. It returns how many refusals it saw and the last error.
func (r *endpointRun) clearWhenIdle(ctx context.Context) (refusals int, err error) {
	for attempt := 1; ; attempt++ {
		err = r.clearOnce(ctx)
		var refused *engines.ClearRefusedError
		if !errors.As(err, &refused) {
			return refusals, err
		}
		refusals++
		if attempt == clearAttempts || ctx.Err() != nil {
			return refusals, err
		}
		sleep(ctx, clearRetryInterval)
	}
}

// clearOnce posts one cache clear: to the endpoint's clear URL read as its family reads a clear
// (engines.URLClearer) when it has one, else the family's own.
func (r *endpointRun) clearOnce(ctx context.Context) error {
	if r.ep.Clear == "" {
		return r.pr.Clear(ctx)
	}
	if uc, ok := r.pr.(engines.URLClearer); ok {
		return uc.ClearURL(ctx, r.ep.Clear)
	}
	return engines.NewClient(r.ep.Address, r.opts.HTTPClient).PostClear(ctx, r.ep.Clear)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// stepEveryRank runs a one-token completion on every data-parallel rank of the endpoint: each rank
// publishes its own AllBlocksCleared at the end of its own next step, and a request without the
// family's rank header runs on one rank only (vLLM's least loaded). One unpinned request where
// there is one rank or the family has no rank header.
func (r *endpointRun) stepEveryRank(ctx context.Context) error {
	step := engines.CompletionRequest{Model: r.pool.Model, Prompt: ".", MaxTokens: 1}
	hdr := ""
	if f := r.family(); f != nil {
		hdr = f.DPRankHeader()
	}
	if r.w.ranks < 2 || hdr == "" {
		_, err := r.pr.Complete(ctx, step)
		return err
	}
	base := http.DefaultTransport
	if r.opts.HTTPClient != nil && r.opts.HTTPClient.Transport != nil {
		base = r.opts.HTTPClient.Transport
	}
	for rank := range r.w.ranks {
		c := engines.NewClient(r.ep.Address, &http.Client{Timeout: 30 * time.Second, Transport: rankTransport{base: base, header: hdr, rank: rank}})
		if _, err := c.Complete(ctx, step); err != nil {
			return fmt.Errorf("rank %d: %w", rank, err)
		}
	}
	return nil
}

// rankTransport pins each request to one data-parallel rank with the family's header.
type rankTransport struct {
	base   http.RoundTripper
	header string
	rank   int
}

func (t rankTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(t.header, strconv.Itoa(t.rank))
	return t.base.RoundTrip(req)
}
