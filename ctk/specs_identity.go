package ctk

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvexact/kvexact/contracts"
	"github.com/kvexact/kvexact/engines"
	"github.com/kvexact/kvexact/gateway/tokenize"
)

func (r *endpointRun) specHealth(t *T) {
	if err := r.pr.Health(t.Context()); err != nil {
		r.unreachable = true
		t.Failf(LegReachability, fmt.Sprintf("check that %s is the engine's API base URL and that the engine is up and reachable from here", r.ep.Address), "%v", err)
		return
	}
	t.Passf("%s answers", r.ep.Address)
}

func (r *endpointRun) specRelease(t *T) {
	v, err := r.pr.Version(t.Context())
	if err != nil {
		t.Failf(LegRelease, "the engine must report its release ("+r.ep.Contract().Probes["version"]+")", "%v", err)
		return
	}
	r.release = v
	ct, err := contracts.Lookup(r.ep.Family, v)
	var unknown *contracts.UnknownError
	switch {
	case errors.As(err, &unknown) && unknown.Nearest != nil:
		n := unknown.Nearest
		t.Failf(LegRelease, fmt.Sprintf("run a pinned release, or pin this one: add its contract (contracts/data) and vectors after verifying %s", strings.Join(n.RecheckList(), "; ")),
			"the engine reports %s %s, which no pinned contract covers; nearest pinned: %s %s (contract %s, pin %s), whose facts are not assumed to hold", r.ep.Family, v, n.Family, n.Versions.String(), n.ID, n.Pin.Release)
		return
	case errors.As(err, &unknown):
		t.Failf(LegRelease, "run a pinned release, or add a contract for this one (contracts/data) with its vectors", "the engine reports %s %s, which no pinned contract covers; known: %s", r.ep.Family, v, strings.Join(unknown.Known, "; "))
		return
	case err != nil:
		t.Failf(LegRelease, "the engine's version string must be a release number", "%v", err)
		return
	case ct.ID != r.st.Contract.ID:
		t.Failf(LegRelease, fmt.Sprintf("stage the engine's release in the pool and the rule (engine.release: %s), or run a %s release the staged contract covers (%s)", v, r.ep.Family, r.st.Contract.Versions.String()),
			"the engine reports %s, contract %s; the pool stages %s %s, contract %s", v, ct.ID, r.ep.Family, r.ep.Release, r.st.Contract.ID)
		return
	}
	t.Passf("the engine reports %s %s: contract %s", r.ep.Family, v, ct.ID)
}

func (r *endpointRun) specModel(t *T) {
	models, err := r.pr.Models(t.Context())
	if err != nil {
		t.Failf(LegModel, "the engine must list its models on /v1/models", "%v", err)
		return
	}
	hint := fmt.Sprintf("serve the model under the name the rule routes (%q; %s), or set model in the pool and the rule to the served name", r.pool.Model, servedModelFlags)
	if !slices.Contains(models, r.pool.Model) {
		// Named plainly (not a matcher's dump): the operator needs the served name to fix either side.
		t.Failf(LegModel, hint, "the engine serves %s, not %q", servedList(models), r.pool.Model)
		return
	}
	t.Passf("serves %q", r.pool.Model)
}

const tokenizerHint = "stage the engine's own tokenizer.json and tokenizer_config.json for the model (the pool's tokenizer folder, the gateway's tokenizers.folders), or serve the model whose tokenizer the gateway stages"

// byEvents says whether this endpoint's prompts are read back from its stored events (TensorRT-LLM,
// which has no tokenize endpoint), subscribing to them first; false leaves prompt-token counts.
//
// The stream is first proven to be this engine's: a nonce-led completion must come back as a
// stored event holding the nonce. A stream that is not (another engine's drain) would otherwise
// lend its requests' ids to the probes; the events spec then names it.
func (r *endpointRun) byEvents(ctx context.Context) bool {
	if !r.st.Contract.Drained() || r.ep.Events.Drain == "" {
		return false
	}
	if r.streamOwn != nil {
		return *r.streamOwn
	}
	own := false
	r.streamOwn = &own
	if r.ensureWatcher(ctx) != nil {
		return false
	}
	prompt, _, err := r.newProbePrompt(r.st.BlockSize / 2)
	if err != nil {
		return false
	}
	p := &probeOutcome{nonce: probeNonce(prompt)}
	mark := r.w.count()
	if _, err := r.pr.Complete(ctx, engines.CompletionRequest{Model: r.pool.Model, Prompt: prompt, MaxTokens: 1}); err != nil {
		return false
	}
	own = r.w.waitFor(ctx, r.opts.EventTimeout, func() bool {
		for _, ev := range r.w.events[mark:] {
			if ev.Kind == engines.BlockStored && p.isOwn(ev, 0, r.tok) {
				return true
			}
		}
		return false
	})
	return own
}

// idTally counts how probes were compared where the engine has no tokenize endpoint.
type idTally struct {
	ids, counts int
	noEvents    bool // the stream stores nothing for these probes (events off, or another stream)
}

func (c idTally) String() string {
	if c.counts == 0 {
		return "token ids equal (read from the engine's stored events)"
	}
	return fmt.Sprintf("%d by token ids (from the engine's stored events), %d by prompt-token count only (no new stored event: already cached, or events unavailable)", c.ids, c.counts)
}

// compareByEvents compares ours with what the engine reports for a request it just served: the
// ids its stored events hold when they can be read, else its prompt-token count. It returns a
// difference ("" when equal).
func (r *endpointRun) compareByEvents(ctx context.Context, events bool, mark, promptTokens int, ours []uint32, tally *idTally) string {
	if events && !tally.noEvents {
		if ids, off, ok := r.promptFromEvents(ctx, mark, promptTokens, ours); ok {
			tally.ids++
			seg := ours[min(off, len(ours)):]
			n := min(len(ids), len(seg))
			if i := firstDiff(ids[:n], seg[:n]); i >= 0 || n < len(ids) {
				if i < 0 {
					i = n
				}
				return fmt.Sprintf("first difference at token %d: engine %s, gateway %s", off+i, r.around(ids, i), r.around(ours, off+i))
			}
			if promptTokens != len(ours) {
				return fmt.Sprintf("the engine counts %d prompt tokens, the gateway %d", promptTokens, len(ours))
			}
			return ""
		}
	}
	tally.counts++
	if tally.counts >= 3 && tally.ids*2 < tally.counts {
		// Most probes stored nothing readable (events off, prompts cached, another stream): stop
		// waiting for events; counts it is.
		tally.noEvents = true
	}
	if promptTokens != len(ours) {
		return fmt.Sprintf("the engine counts %d prompt tokens, the gateway %d", promptTokens, len(ours))
	}
	return ""
}

func (r *endpointRun) specTokenizer(t *T, addSpecial bool) {
	ctx := t.Context()
	var diffs []string
	corpus := Corpus(r.tok)
	perText := r.opts.AddedTokensPerText
	switch {
	case r.st.Contract.Drained():
		corpus = grouped(corpus, 16) // one completion and event round trip per probe
		perText = 0                  // each group is read back from events as a whole
	case perText > 1:
		corpus = grouped(corpus, 2*perText) // each token alone and glued
	default:
		perText = 0
	}
	countOnly, events := false, false
	var tally idTally
	probes, calls := 0, 0
	// compare probes one text and returns its difference ("" when equal); fatal is set when the
	// spec already failed.
	compare := func(p Probe) (diff string, fatal bool) {
		calls++
		ours, err := r.tok.Encode(p.Text, addSpecial)
		if err != nil {
			t.Failf(LegTokenizer, "the staged tokenizer must encode the probe corpus", "probe %s: our tokenizer: %v", p.Name, err)
			return "", true
		}
		theirs, err := r.pr.Tokenize(ctx, r.pool.Model, p.Text, addSpecial)
		if engines.IsNotSupported(err) {
			// TensorRT-LLM: the ids its events store for the same prompt, else what it counts.
			if !countOnly {
				countOnly, events = true, r.byEvents(ctx)
			}
			mark := 0
			if events {
				mark = r.w.count()
			}
			c, cerr := r.pr.Complete(ctx, engines.CompletionRequest{Model: r.pool.Model, Prompt: p.Text, MaxTokens: 1, AddSpecial: &addSpecial})
			if cerr != nil {
				t.Failf(LegTokenizer, "the engine must answer a probe completion", "probe %s: %v (%v)", p.Name, cerr, err)
				return "", true
			}
			if d := r.compareByEvents(ctx, events, mark, c.PromptTokens, ours, &tally); d != "" {
				return p.Name + ": " + d, false
			}
			return "", false
		}
		if err != nil {
			t.Failf(LegTokenizer, "the engine's tokenize endpoint must answer", "probe %s: %v", p.Name, err)
			return "", true
		}
		if i := firstDiff(theirs, ours); i >= 0 {
			return fmt.Sprintf("%s: first difference at token %d: engine %s, gateway %s", p.Name, i, r.around(theirs, i), r.around(ours, i)), false
		}
		return "", false
	}
	for _, p := range corpus {
		if perText == 0 || len(p.Parts) == 0 {
			probes++
			d, fatal := compare(p)
			if fatal {
				return
			}
			if d != "" {
				diffs = append(diffs, d)
			}
			continue
		}
		probes += len(p.Parts)
		ok, err := pins(r.tok, p)
		if err != nil {
			t.Failf(LegTokenizer, "the staged tokenizer must encode the probe corpus", "probe %s: our tokenizer: %v", p.Name, err)
			return
		}
		if ok {
			d, fatal := compare(p)
			if fatal {
				return
			}
			if d == "" {
				continue
			}
			// The text differs: its parts one by one name the tokens; the text itself is named
			// only when none differs alone.
			n := len(diffs)
			for _, q := range p.Parts {
				qd, fatal := compare(q)
				if fatal {
					return
				}
				if qd != "" {
					diffs = append(diffs, qd)
				}
			}
			if len(diffs) == n {
				diffs = append(diffs, d)
			}
			continue
		}
		for _, q := range p.Parts { // the joined text would not pin each token
			d, fatal := compare(q)
			if fatal {
				return
			}
			if d != "" {
				diffs = append(diffs, d)
			}
		}
	}
	if len(diffs) > 0 {
		t.Failf(LegTokenizer, tokenizerHint, "%d of %d probes differ: %s", len(diffs), probes, strings.Join(firstN(diffs, 4), "; "))
		return
	}
	if countOnly {
		t.Passf("%d probes (%s has no tokenize endpoint): %s", probes, r.ep.Family, tally)
		return
	}
	if calls < probes {
		t.Passf("%d probes in %d tokenize calls (up to %d added tokens to a text, each pinned by its text's ids): token ids equal", probes, calls, perText)
		return
	}
	t.Passf("%d probes: token ids equal", probes)
}

func (r *endpointRun) specTemplate(t *T) {
	ctx := t.Context()
	if r.tok.Config().ChatTemplate == "" {
		t.Skipf("the staged tokenizer has no chat template: chat requests are not routed by tokens")
		return
	}
	var diffs []string
	countOnly, events := false, false
	var tally idTally
	convs := append(append([]conversation(nil), conversations...), addedTokenConversations(r.tok, 16)...)
	for _, c := range convs {
		body := chatBody(r.pool.Model, c.Messages)
		req, err := tokenize.ParseChatRequest(body)
		if err != nil {
			t.Failf(LegTemplate, "", "conversation %s: %v", c.Name, err)
			return
		}
		ours, text, err := r.tok.EncodeChat(req)
		if err != nil {
			t.Failf(LegTemplate, "the staged chat template must render the probe conversations", "conversation %s: our template: %v", c.Name, err)
			return
		}
		rendered, err := r.pr.RenderChat(ctx, body)
		switch {
		case err == nil:
			if rendered != text {
				i := firstDiffString(rendered, text)
				diffs = append(diffs, fmt.Sprintf("%s: rendered text differs at byte %d: engine %q, gateway %q", c.Name, i, clipAt(rendered, i), clipAt(text, i)))
				continue
			}
		case !engines.IsNotSupported(err):
			t.Failf(LegTemplate, "the engine's template endpoint must answer", "conversation %s: %v", c.Name, err)
			return
		}
		theirs, err := r.pr.TokenizeChat(ctx, body)
		if engines.IsNotSupported(err) {
			if !countOnly {
				countOnly, events = true, r.byEvents(ctx)
			}
			mark := 0
			if events {
				mark = r.w.count()
			}
			cc, cerr := r.pr.Chat(ctx, body, 1)
			if cerr != nil {
				t.Failf(LegTemplate, "the engine must answer a probe chat completion", "conversation %s: %v", c.Name, cerr)
				return
			}
			if d := r.compareByEvents(ctx, events, mark, cc.PromptTokens, ours, &tally); d != "" {
				diffs = append(diffs, c.Name+": "+d)
			}
			continue
		}
		if err != nil {
			t.Failf(LegTemplate, "the engine's chat tokenize endpoint must answer", "conversation %s: %v", c.Name, err)
			return
		}
		if i := firstDiff(theirs, ours); i >= 0 {
			diffs = append(diffs, fmt.Sprintf("%s: first difference at token %d: engine %s, gateway %s", c.Name, i, r.around(theirs, i), r.around(ours, i)))
		}
	}
	if len(diffs) > 0 {
		t.Failf(LegTemplate, templateHint, "%d of %d conversations differ: %s", len(diffs), len(convs), strings.Join(firstN(diffs, 3), "; "))
		return
	}
	if countOnly {
		t.Passf("%d conversations: %s", len(convs), tally)
		return
	}
	t.Passf("%d conversations: token ids equal", len(convs))
}

// firstDiff is the first index where a and b differ (-1 when equal).
func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

func firstDiffString(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func clipAt(s string, i int) string {
	lo, hi := max(0, i-20), min(len(s), i+20)
	return s[lo:hi]
}

// around shows ids[i-2 : i+3] with their token strings.
func (r *endpointRun) around(ids []uint32, i int) string {
	lo, hi := max(0, i-2), min(len(ids), i+3)
	parts := make([]string, 0, hi-lo)
	for _, id := range ids[lo:hi] {
		s, _ := r.tok.Token(id)
		parts = append(parts, fmt.Sprintf("%d%q", id, s))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("[end after %d tokens]", len(ids))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func firstN(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("… %d more", len(s)-n))
}

// servedList names the models /v1/models listed, for the model leg's message.
func servedList(models []string) string {
	if len(models) == 0 {
		return "no model"
	}
	q := make([]string, len(models))
	for i, m := range models {
		q[i] = strconv.Quote(m)
	}
	return strings.Join(q, ", ")
}
