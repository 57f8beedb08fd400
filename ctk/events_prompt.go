package ctk

import (
	"context"
	"time"

	"github.com/kvexact/kvexact/engines"
)

// TensorRT-LLM has no tokenize endpoint, but its stored events carry each block's token ids. For a
// probe request ctk reads back the ids the engine cached for the prompt: the last block it stored
// after the request, followed through its parents across every event ctk has drained (earlier
// requests may have stored a shared prefix), back to the root or to a block stored before ctk
// subscribed. That, not a count, is compared id by id with the gateway's tokens.

// eventPromptWait bounds the wait for one probe's events.
const eventPromptWait = time.Second

// promptFromEvents returns the ids the engine stored for the request sent when the watcher had
// seen mark events, and their offset in the prompt of promptTokens tokens; ok is false when no
// stored event came (the engine had the whole prompt cached already). Of the chains stored after
// mark that end where such a prompt ends, the one closest to ours is taken: other traffic on the
// engine cannot pass for the probe, and the probe's own chain, when it differs, is still the
// closest.
func (r *endpointRun) promptFromEvents(ctx context.Context, mark, promptTokens int, ours []uint32) (ids []uint32, offset int, ok bool) {
	wait := min(r.opts.EventTimeout, eventPromptWait)
	pick := func(evs []seen) {
		ids, offset, ok = nil, 0, false
		best := -2
		for _, c := range chains(evs, mark) {
			off := c.offset
			if off < 0 {
				// The chain reaches a block stored before ctk subscribed: it ends where the prompt ends.
				off = promptTokens - len(c.toks)
			}
			bs := longestBlock(evs[mark:])
			// The request's chain ends where its prompt ends (its trailing partial block stored),
			// or at its last full block.
			if end := off + len(c.toks); off < 0 || end != promptTokens && end != promptTokens-promptTokens%bs {
				continue
			}
			score := agreement(c.toks, ours, off)
			if score > best {
				ids, offset, ok, best = c.toks, off, true, score
			}
		}
	}
	r.w.waitFor(ctx, wait, func() bool {
		pick(r.w.events)
		return ok && offset+len(ids) >= promptTokens
	})
	evs, _ := r.w.snapshot()
	pick(evs)
	return ids, offset, ok
}

// agreement is how many leading tokens of toks equal ours from off (len(toks) when all do).
func agreement(toks, ours []uint32, off int) int {
	for i, t := range toks {
		if off+i >= len(ours) || ours[off+i] != t {
			return i
		}
	}
	return len(toks)
}

// longestBlock is the most tokens any stored block among evs holds (the block size).
func longestBlock(evs []seen) int {
	n := 1
	for _, ev := range evs {
		for _, b := range ev.Blocks {
			n = max(n, len(b))
		}
	}
	return n
}

type chainBlock struct {
	parent    uint64
	hasParent bool
	toks      []uint32
}

// chain is the tokens from a stored block back through its parents, and the offset of its first
// block (0 at the root, -1 when a parent was never seen).
type chain struct {
	toks   []uint32
	offset int
}

// chains follows the last block of every event stored after mark back through its parents,
// across every event seen.
func chains(evs []seen, mark int) []chain {
	idx := map[uint64]chainBlock{}
	var ends []uint64
	for i, ev := range evs {
		if ev.Kind != engines.BlockStored || (ev.Medium != "" && ev.Medium != engines.MediumGPU) || len(ev.Blocks) != len(ev.Hashes) {
			continue
		}
		for j, h := range ev.Hashes {
			b := chainBlock{toks: ev.Blocks[j]}
			if j > 0 {
				b.parent, b.hasParent = ev.Hashes[j-1], true
			} else {
				b.parent, b.hasParent = ev.Parent, ev.HasParent
			}
			idx[h] = b
		}
		if i >= mark && len(ev.Hashes) > 0 {
			ends = append(ends, ev.Hashes[len(ev.Hashes)-1])
		}
	}
	out := make([]chain, 0, len(ends))
	for _, h := range ends {
		var rev [][]uint32
		offset := -1
		for range len(idx) {
			b, ok := idx[h]
			if !ok {
				break
			}
			rev = append(rev, b.toks)
			if !b.hasParent {
				offset = 0
				break
			}
			h = b.parent
		}
		var toks []uint32
		for i := len(rev) - 1; i >= 0; i-- {
			toks = append(toks, rev[i]...)
		}
		out = append(out, chain{toks: toks, offset: offset})
	}
	return out
}
