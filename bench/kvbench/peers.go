package kvbench

import (
	"container/list"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// The peers' routing strategies, each written from the peer's published algorithm and defaults
// (docs/benchmarks/peers.md cites every source). They decide in the client, like the oracle, and
// send through the same proxy (one single-endpoint listener per engine), so only the decision
// differs between them and the gateway's own policies. Each knows what the peer's router knows:
// the prompt (text, or the engine's tokens where the peer tokenizes exactly), its own past
// decisions and its own in-flight requests per endpoint. None sees the engines' caches.

// Peer strategy names (Policy.Peer).
const (
	PeerDynamoApprox = "dynamo-approx"  // Dynamo KV router with --no-router-kv-events
	PeerSGLangTree   = "sglang-tree"    // SGLang model gateway cache_aware (approximate radix tree)
	PeerAIBrix       = "aibrix-prefix"  // AIBrix prefix-cache routing (character blocks, mean + kσ)
	PeerLLMDEstimate = "llm-d-estimate" // llm-d / GIE prefix-cache-scorer (≈ 4 bytes per token)
)

// Peers are the peer strategies, labelled with the system whose strategy each models. llm-d's
// precise mode (router-owned keys from the engine's event tokens) runs in the gateway itself: it
// is KV-exact's router binding (PeerPolicies adds it).
func Peers() []Policy {
	return []Policy{
		{Name: "Dynamo approx (no KV events)", Peer: PeerDynamoApprox},
		{Name: "SGLang gateway approx tree", Peer: PeerSGLangTree},
		{Name: "AIBrix prefix-cache", Peer: PeerAIBrix},
		{Name: "llm-d estimate", Peer: PeerLLMDEstimate},
	}
}

// PolicyLLMDPrecise models llm-d's precise prefix-cache scorer: exact tokens, keys the router
// computes from the tokens the engine's events carry (KV-exact's router binding).
const PolicyLLMDPrecise = "llm-d precise (router keys)"

// PeerPolicies are the peer strategies plus llm-d precise.
func PeerPolicies() []Policy {
	return append(Peers(), Policy{Name: PolicyLLMDPrecise, Selector: "least-load", Exact: true, Scoring: "prefix", Law: "hard", Binding: "router"})
}

// ticket is one client-side decision: the endpoint, the cached prefix (tokens) the strategy
// expects there, and what it must give back when the request ends.
type ticket struct {
	idx       int
	predicted int
	blocks    int      // in-flight blocks the decision added (Dynamo's active blocks, llm-d's usage)
	keys      []uint64 // the oracle's in-flight keys
	job       uint64   // the ttft oracle's id of the request
}

// chooser is a policy deciding in the client.
type chooser interface {
	// pick chooses an endpoint for q (keys: the engine's block keys of its tokens, which only the
	// oracle may read) and takes one load unit on it.
	pick(q *Request, keys []uint64) ticket
	done(t ticket)
}

// newChooser builds the client-side chooser of a peer strategy. bs is the engine's block size,
// capBlocks an engine's KV capacity, conc its running-request limit, maxTokens the output length.
func newChooser(peer string, n, bs, capBlocks, conc, maxTokens int, model string, now func() time.Time) chooser {
	base := &loads{load: make([]int, n), blocks: make([]int, n), bs: bs, maxTokens: maxTokens}
	switch peer {
	case PeerDynamoApprox:
		return &dynamoApprox{loads: base, ttl: 120 * time.Second, maxBlocks: 1 << 20, now: now, idx: mapsOf[time.Time](n)}
	case PeerSGLangTree:
		return &sglangTree{loads: base, trees: make([]textTree, n), threshold: 0.3, absT: 64, relT: 1.5}
	case PeerAIBrix:
		return &aibrixPrefix{loads: base, blockChars: 128, maxBlocks: 200000, imbalanceAbs: 16, k: 2, table: map[uint64][]int64{}}
	case PeerLLMDEstimate:
		return &llmdEstimate{loads: base, blockBytes: bs * 4, maxBlocks: 256, lruCap: 31250, model: model,
			wPrefix: 3, wQueue: 2, wKV: 2, conc: conc, capBlocks: capBlocks, lru: make([]lru, n)}
	}
	return nil
}

func mapsOf[V any](n int) []map[uint64]V {
	out := make([]map[uint64]V, n)
	for i := range out {
		out[i] = map[uint64]V{}
	}
	return out
}

// loads is what every router knows by itself: its own requests in flight per endpoint, and the
// blocks they occupy (prompt + output, in engine blocks).
type loads struct {
	mu        sync.Mutex
	load      []int
	blocks    []int
	bs        int
	maxTokens int
	turn      int
}

func (l *loads) take(idx, predicted, promptTokens int) ticket {
	t := ticket{idx: idx, predicted: predicted, blocks: (promptTokens + l.maxTokens + l.bs - 1) / l.bs}
	l.load[idx]++
	l.blocks[idx] += t.blocks
	return t
}

func (l *loads) done(t ticket) {
	l.mu.Lock()
	l.load[t.idx]--
	l.blocks[t.idx] -= t.blocks
	l.mu.Unlock()
}

// leastLoaded is the shortest queue, ties rotating so that no endpoint is favoured by its index.
func (l *loads) leastLoaded() int {
	l.turn++
	n := len(l.load)
	best := -1
	for j := 0; j < n; j++ {
		i := (l.turn + j) % n
		if best < 0 || l.load[i] < l.load[best] {
			best = i
		}
	}
	return best
}

// promptOf is what a text-based router reads of a request: the completions prompt, or for chat the
// messages' contents joined (SGLang, AIBrix) or the messages' JSON (llm-d), and the cache_salt.
type promptOf struct {
	text, messagesJSON, salt string
}

func readPrompt(q *Request) promptOf {
	var b struct {
		Prompt   string            `json:"prompt"`
		Messages []json.RawMessage `json:"messages"`
		Salt     string            `json:"cache_salt"`
	}
	_ = json.Unmarshal(q.Body, &b)
	p := promptOf{text: b.Prompt, salt: b.Salt}
	if q.Chat {
		var sb strings.Builder
		for _, m := range b.Messages {
			var c struct {
				Content string `json:"content"`
			}
			_ = json.Unmarshal(m, &c)
			sb.WriteString(c.Content)
		}
		p.text = sb.String()
		js, _ := json.Marshal(b.Messages)
		p.messagesJSON = string(js)
	}
	return p
}

// routerSeed makes the peers' own block hashes: any chained 64-bit hash of the same blocks routes
// the same, so one process-wide seed serves them all.
var routerSeed = maphash.MakeSeed()

// chainBytes hashes s in whole blocks of size bytes, each key chained on the previous one (root:
// the hash of root). A partial last block is left out, as every peer does.
func chainBytes(root, s string, size, maxBlocks int) []uint64 {
	prev := maphash.String(routerSeed, root)
	var out []uint64
	var buf [8]byte
	for i := 0; i+size <= len(s) && (maxBlocks <= 0 || len(out) < maxBlocks); i += size {
		var h maphash.Hash
		h.SetSeed(routerSeed)
		h.WriteString(s[i : i+size])
		binary.LittleEndian.PutUint64(buf[:], prev)
		h.Write(buf[:])
		prev = h.Sum64()
		out = append(out, prev)
	}
	return out
}

// chainTokens hashes token ids in whole blocks of bs tokens (Dynamo's router-side block hashes).
func chainTokens(tokens []uint32, bs int) []uint64 {
	var out []uint64
	var prev uint64
	buf := make([]byte, 8+4*bs)
	for i := 0; i+bs <= len(tokens); i += bs {
		binary.LittleEndian.PutUint64(buf, prev)
		for j, t := range tokens[i : i+bs] {
			binary.LittleEndian.PutUint32(buf[8+4*j:], t)
		}
		prev = maphash.Bytes(routerSeed, buf)
		out = append(out, prev)
	}
	return out
}

// dynamoApprox is Dynamo's KV router without KV events: it hashes the prompt's tokens in engine
// blocks, remembers the blocks of every request it routed on that worker for a TTL (120 s,
// --router-ttl-secs), and picks the lowest cost = overlap weight (1.0) × new prefill blocks +
// potential active (decode) blocks, temperature 0 (deterministic; ties to the least loaded).
type dynamoApprox struct {
	*loads
	ttl       time.Duration
	maxBlocks int
	now       func() time.Time
	idx       []map[uint64]time.Time
}

func (d *dynamoApprox) pick(q *Request, _ []uint64) ticket {
	blocks := chainTokens(q.Tokens, d.bs)
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	newBlocks := (len(q.Tokens) + d.maxTokens + d.bs - 1) / d.bs
	best, bestCost, bestOverlap := -1, math.Inf(1), 0
	d.turn++
	n := len(d.load)
	for j := 0; j < n; j++ {
		i := (d.turn + j) % n
		overlap := 0
		for _, k := range blocks {
			exp, ok := d.idx[i][k]
			if !ok || now.After(exp) {
				break
			}
			overlap++
		}
		prefill := float64(len(q.Tokens)-overlap*d.bs) / float64(d.bs)
		cost := 1.0*prefill + float64(d.blocks[i]+newBlocks)
		if cost < bestCost || (cost == bestCost && d.load[i] < d.load[best]) {
			best, bestCost, bestOverlap = i, cost, overlap
		}
	}
	exp := now.Add(d.ttl)
	for _, k := range blocks {
		d.idx[best][k] = exp
	}
	d.prune(now)
	return d.take(best, bestOverlap*d.bs, len(q.Tokens))
}

// prune drops expired blocks once the predicted tree outgrows --router-max-tree-size.
func (d *dynamoApprox) prune(now time.Time) {
	total := 0
	for _, m := range d.idx {
		total += len(m)
	}
	if total <= d.maxBlocks {
		return
	}
	for _, m := range d.idx {
		for k, exp := range m {
			if now.After(exp) {
				delete(m, k)
			}
		}
	}
}

// textTree is one worker's approximate radix tree of request text: the distinct texts it was sent,
// sorted, so the longest prefix any of them shares with a query is shared with a sorted neighbour.
// Its size is the tree's character count (Σ len − common prefix with the previous text).
type textTree struct {
	texts []string
	size  int
}

func lcp(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// match is the longest prefix of s the tree holds, in bytes.
func (t *textTree) match(s string) int {
	i := sort.SearchStrings(t.texts, s)
	m := 0
	if i < len(t.texts) {
		m = lcp(s, t.texts[i])
	}
	if i > 0 {
		m = max(m, lcp(s, t.texts[i-1]))
	}
	return m
}

func (t *textTree) insert(s string) {
	i := sort.SearchStrings(t.texts, s)
	if i < len(t.texts) && t.texts[i] == s {
		return
	}
	var a, b string
	if i > 0 {
		a = t.texts[i-1]
	}
	if i < len(t.texts) {
		b = t.texts[i]
	}
	t.size += len(s) - lcp(s, a)
	if i < len(t.texts) {
		t.size += lcp(a, b) - lcp(b, s)
	}
	t.texts = slices.Insert(t.texts, i, s)
}

// sglangTree is SGLang's model gateway cache_aware policy: when the pool is imbalanced (max − min
// load > 64 and max > 1.5 × min) the shortest queue; otherwise the worker whose approximate tree
// shares the longest text prefix when match ÷ length > 0.3, else the worker with the smallest tree.
// The chosen worker's tree gets the request's text. Its trees hold text, not tokens, and know
// nothing of cache_salt or of what the engine evicted (the gateway's max_tree_size of 64 Mi
// characters is never reached by these runs, so its eviction never runs either).
type sglangTree struct {
	*loads
	trees      []textTree
	threshold  float64
	absT, relT float64
}

func (s *sglangTree) pick(q *Request, _ []uint64) ticket {
	text := readPrompt(q).text
	s.mu.Lock()
	defer s.mu.Unlock()
	lo, hi := s.load[0], s.load[0]
	for _, l := range s.load {
		lo, hi = min(lo, l), max(hi, l)
	}
	var best, matched int
	switch {
	case float64(hi-lo) > s.absT && float64(hi) > s.relT*float64(lo):
		best = s.leastLoaded()
	default:
		best = -1
		for i := range s.trees {
			m := s.trees[i].match(text)
			if best < 0 || m > matched || (m == matched && s.load[i] < s.load[best]) {
				best, matched = i, m
			}
		}
		if len(text) == 0 || float64(matched)/float64(len(text)) <= s.threshold {
			best, matched = 0, 0
			for i := range s.trees {
				if s.trees[i].size < s.trees[best].size {
					best = i
				}
			}
			matched = s.trees[best].match(text)
		}
	}
	s.trees[best].insert(text)
	// The prediction in tokens: the matched share of the prompt.
	pred := 0
	if len(text) > 0 {
		pred = int(float64(len(q.Tokens)) * float64(matched) / float64(len(text)))
	}
	return s.take(best, pred, len(q.Tokens))
}

// aibrixPrefix is AIBrix's prefix-cache routing with its default character tokenizer: the prompt
// in blocks of 128 characters, chained hashes in a table of at most 200 000 blocks (least recently
// used out), each block listing the pods it was routed to. Imbalanced pods (max − min running >
// 16) go to the least running; otherwise the pods matching a prefix, by match percentage down and
// running requests up, the first whose running ≤ mean + 2σ; else the least running.
type aibrixPrefix struct {
	*loads
	blockChars   int
	maxBlocks    int
	imbalanceAbs int
	k            float64
	table        map[uint64][]int64 // block → per pod: the routing step that last added it (0 = never)
	clock        int64
	order        []uint64 // insertion order, for the block cap
}

func (a *aibrixPrefix) pick(q *Request, _ []uint64) ticket {
	text := readPrompt(q).text
	blocks := chainBytes("", text, a.blockChars, 0)
	a.mu.Lock()
	defer a.mu.Unlock()
	n := len(a.load)
	lo, hi := a.load[0], a.load[0]
	var mean float64
	for _, l := range a.load {
		lo, hi = min(lo, l), max(hi, l)
		mean += float64(l)
	}
	mean /= float64(n)
	var sd float64
	for _, l := range a.load {
		sd += (float64(l) - mean) * (float64(l) - mean)
	}
	sd = math.Sqrt(sd / float64(n))
	best, matched := -1, 0
	if hi-lo <= a.imbalanceAbs && len(blocks) > 0 {
		match := make([]int, n)
		for i := 0; i < n; i++ {
			for _, b := range blocks {
				if pods, ok := a.table[b]; !ok || pods[i] == 0 {
					break
				}
				match[i]++
			}
		}
		order := make([]int, 0, n)
		for i := 0; i < n; i++ {
			if match[i] > 0 {
				order = append(order, i)
			}
		}
		sort.SliceStable(order, func(x, y int) bool {
			i, j := order[x], order[y]
			if match[i] != match[j] {
				return match[i] > match[j]
			}
			return a.load[i] < a.load[j]
		})
		for _, i := range order {
			if float64(a.load[i]) <= mean+a.k*sd {
				best, matched = i, match[i]
				break
			}
		}
	}
	if best < 0 {
		best, matched = a.leastLoaded(), 0
	}
	a.clock++
	for _, b := range blocks {
		pods, ok := a.table[b]
		if !ok {
			pods = make([]int64, n)
			a.table[b] = pods
			a.order = append(a.order, b)
		}
		pods[best] = a.clock
	}
	for len(a.table) > a.maxBlocks && len(a.order) > 0 {
		delete(a.table, a.order[0])
		a.order = a.order[1:]
	}
	pred := 0
	if len(text) > 0 {
		pred = int(float64(len(q.Tokens)) * float64(matched*a.blockChars) / float64(len(text)))
	}
	return a.take(best, pred, len(q.Tokens))
}

// lru is one server's block set of llm-d's approximate indexer, least recently used out.
type lru struct {
	at    map[uint64]*list.Element
	order list.List // front: most recent
}

func (l *lru) has(k uint64) bool { _, ok := l.at[k]; return ok }

func (l *lru) add(keys []uint64, capacity int) {
	if l.at == nil {
		l.at = map[uint64]*list.Element{}
	}
	for _, k := range keys {
		if e, ok := l.at[k]; ok {
			l.order.MoveToFront(e)
			continue
		}
		l.at[k] = l.order.PushFront(k)
	}
	for len(l.at) > capacity {
		e := l.order.Back()
		delete(l.at, e.Value.(uint64))
		l.order.Remove(e)
	}
}

// llmdEstimate is llm-d's default inference scheduling (the GIE prefix-cache-scorer): the prompt
// bytes (the completions prompt, or the chat messages' JSON) in blocks of the engine block size × 4
// bytes (≈ 4 bytes per token), at most 256 blocks, chained from a root over model and cache_salt;
// each server's blocks in an LRU of 31 250 entries, added when a request is routed there. Scores:
// prefix = matched ÷ total blocks (weight 3), queue = min-max normalised waiting requests (2),
// KV-cache utilisation = 1 − used ÷ capacity (2); the highest weighted sum wins. Queue and usage
// are the router's estimate from its own in-flight requests (llm-d scrapes them from engine
// metrics).
type llmdEstimate struct {
	*loads
	blockBytes, maxBlocks, lruCap int
	model                         string
	wPrefix, wQueue, wKV          float64
	conc, capBlocks               int
	lru                           []lru
}

func (l *llmdEstimate) pick(q *Request, _ []uint64) ticket {
	p := readPrompt(q)
	input := p.text
	if q.Chat {
		input = p.messagesJSON
	}
	blocks := chainBytes(l.model+p.salt, input, l.blockBytes, l.maxBlocks)
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(l.load)
	queue := make([]int, n)
	qlo, qhi := math.MaxInt, 0
	for i := range queue {
		queue[i] = max(l.load[i]-l.conc, 0)
		qlo, qhi = min(qlo, queue[i]), max(qhi, queue[i])
	}
	best, bestScore, bestMatch := -1, math.Inf(-1), 0
	l.turn++
	for j := 0; j < n; j++ {
		i := (l.turn + j) % n
		match := 0
		for _, b := range blocks {
			if !l.lru[i].has(b) {
				break
			}
			match++
		}
		prefix := 0.0
		if len(blocks) > 0 {
			prefix = float64(match) / float64(len(blocks))
		}
		qs := 1.0
		if qhi > qlo {
			qs = float64(qhi-queue[i]) / float64(qhi-qlo)
		}
		kv := 1 - min(float64(l.blocks[i])/float64(max(l.capBlocks, 1)), 1)
		score := l.wPrefix*prefix + l.wQueue*qs + l.wKV*kv
		if score > bestScore {
			best, bestScore, bestMatch = i, score, match
		}
	}
	l.lru[best].add(blocks, l.lruCap)
	pred := 0
	if len(input) > 0 {
		pred = int(float64(len(q.Tokens)) * float64(bestMatch*l.blockBytes) / float64(len(input)))
	}
	return l.take(best, pred, len(q.Tokens))
}

// PeerRouter is one peer strategy deciding for a pool outside the harness (kvbench drive on real
// engines): the same chooser, told only what the peer's router knows.
type PeerRouter struct {
	mu sync.Mutex
	ch chooser
}

// NewPeerRouter builds the peer strategy peer (a Peer* name) for n engines of block size bs,
// capBlocks KV blocks and conc running requests each, serving maxTokens output tokens of model.
func NewPeerRouter(peer string, n, bs, capBlocks, conc, maxTokens int, model string) (*PeerRouter, error) {
	ch := newChooser(peer, n, bs, capBlocks, conc, maxTokens, model, time.Now)
	if ch == nil {
		return nil, fmt.Errorf("kvbench: unknown peer strategy %q", peer)
	}
	return &PeerRouter{ch: ch}, nil
}

// Pick chooses the engine for a completion body whose prompt the engine tokenizes to tokens, and
// returns it with the call that ends the request's load on it.
func (p *PeerRouter) Pick(body []byte, tokens []uint32) (int, func()) {
	p.mu.Lock()
	t := p.ch.pick(&Request{Body: body, Tokens: tokens}, nil)
	p.mu.Unlock()
	return t.idx, func() {
		p.mu.Lock()
		p.ch.done(t)
		p.mu.Unlock()
	}
}
