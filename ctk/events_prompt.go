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
// stored event came (the engine had the whole prompt cached already).
func (r *endpointRun) promptFromEvents(ctx context.Context, mark, promptTokens int) (ids []uint32, offset int, ok bool) {
	wait := min(r.opts.EventTimeout, eventPromptWait)
	r.w.waitFor(ctx, wait, func() bool {
		ids, offset = chainTokens(r.w.events, mark)
		return ids != nil && offset >= 0 && offset+len(ids) >= promptTokens
	})
	evs, _ := r.w.snapshot()
	ids, offset = chainTokens(evs, mark)
	if ids == nil || len(ids) > promptTokens {
		return nil, 0, false
	}
	if offset < 0 {
		// The chain reaches a block stored before ctk subscribed: it ends where the prompt ends.
		offset = promptTokens - len(ids)
	}
	// A chain that does not end within the prompt's last block is another request's (traffic from
	// elsewhere, or a stream that is not this engine's): compare the count instead.
	if end := offset + len(ids); end > promptTokens || end <= promptTokens-longestBlock(evs[mark:]) {
		return nil, 0, false
	}
	return ids, offset, true
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

// chainTokens follows the last block stored after mark back through its parents: the tokens from
// the first block found to it, and the offset of that first block (0 at the root, -1 when its
// parent was never seen).
func chainTokens(evs []seen, mark int) ([]uint32, int) {
	idx := map[uint64]chainBlock{}
	var last uint64
	found := false
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
			last, found = ev.Hashes[len(ev.Hashes)-1], true
		}
	}
	if !found {
		return nil, 0
	}
	var rev [][]uint32
	h, offset := last, -1
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
	var out []uint32
	for i := len(rev) - 1; i >= 0; i-- {
		out = append(out, rev[i]...)
	}
	return out, offset
}
