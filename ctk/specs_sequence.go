package ctk

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvexact/kvexact/engines"
)

// startGaps finds messages lost at the start of the live stream, where the sequence window has no
// earlier message to compare with.
//
// ZeroMQ, per rank with a replay address: the replay is asked again for everything from 0 and
// compared with what arrived live. Every message published after the connect-time replay (whose
// last sequence ctk saw) and up to the last one that arrived live must have arrived live or by a
// replay; one the engine's buffer holds but the stream never delivered was dropped by the
// publisher. (A message published before ctk subscribed is not a loss: PUB sends it to nobody,
// and the connect-time replay delivers it. Without a replay address the start cannot be checked.)
//
// TensorRT-LLM: event_id starts at 0 with the engine, whose first event is `created`; ctk starts
// draining before it sends anything, so a first event above 0 means events were drained by another
// consumer or discarded by the engine before ctk saw them.
func (r *endpointRun) startGaps(ctx context.Context, evs []seen) []string {
	if r.st.Contract.Drained() {
		return trtStartGaps(evs)
	}
	var bad []string
	for rank, addr := range r.ep.Events.Replay {
		if addr == "" {
			continue
		}
		connectMax, delivered, live, liveMax := int64(-1), map[uint64]bool{}, false, uint64(0)
		for _, ev := range evs {
			if ev.Rank != rank {
				continue
			}
			delivered[ev.Seq] = true
			if ev.Replayed && !live {
				connectMax = max(connectMax, int64(ev.Seq))
			}
			if !ev.Replayed {
				live, liveMax = true, max(liveMax, ev.Seq)
			}
		}
		if !live {
			continue
		}
		var missing []uint64
		ring, ringMin := map[uint64]bool{}, uint64(0)
		err := replayAll(ctx, addr, 0, r.opts.EventTimeout, func(seq uint64, _ []byte) bool {
			if len(ring) == 0 {
				ringMin = seq
			}
			ring[seq] = true
			if int64(seq) > connectMax && seq <= liveMax && !delivered[seq] {
				missing = append(missing, seq)
			}
			return seq < liveMax
		})
		if err != nil {
			bad = append(bad, fmt.Sprintf("rank %d: replay from 0 on %s to compare with the live stream: %v", rank, addr, err))
			continue
		}
		if len(missing) > 0 {
			bad = append(bad, fmt.Sprintf("rank %d: %d message(s) the engine published after ctk subscribed never arrived live (seq %s; its replay buffer holds them): the publisher dropped them", rank, len(missing), seqRanges(missing)))
		}
		// Numbers neither the buffer nor the stream has were never used: the engine skips sequence
		// numbers, which the gateway's window counts as gaps (and clears on when they are large).
		var skipped []uint64
		for sq := max(uint64(connectMax+1), ringMin); len(ring) > 0 && sq <= liveMax && len(skipped) < 1000; sq++ {
			if !ring[sq] && !delivered[sq] {
				skipped = append(skipped, sq)
			}
		}
		if len(skipped) > 0 {
			bad = append(bad, fmt.Sprintf("rank %d: the engine skipped sequence number(s) %s (neither its replay buffer nor the live stream has a message for them)", rank, seqRanges(skipped)))
		}
	}
	return bad
}

func trtStartGaps(evs []seen) []string {
	first := map[int]seen{}
	for _, ev := range evs {
		if _, ok := first[ev.Rank]; !ok {
			first[ev.Rank] = ev
		}
	}
	var bad []string
	for rank, ev := range first {
		if ev.Seq > 0 {
			what := "event"
			if ev.Kind == engines.CacheCreated {
				what = "created event"
			}
			bad = append(bad, fmt.Sprintf("rank %d: the first event ctk drained (a %s) has event_id %d: events 0..%d were drained by another consumer or discarded by the engine before ctk saw them (certify an engine nothing else drains, freshly started)", rank, what, ev.Seq, ev.Seq-1))
		}
	}
	slices.Sort(bad)
	return bad
}

// seqRanges writes sorted sequence numbers as ranges: "3, 5..7".
func seqRanges(s []uint64) string {
	slices.Sort(s)
	out := ""
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if out != "" {
			out += ", "
		}
		if j > i {
			out += fmt.Sprintf("%d..%d", s[i], s[j])
		} else {
			out += fmt.Sprintf("%d", s[i])
		}
		i = j + 1
	}
	return out
}

// lostLive looks in the replay buffers for the probe's own batch when it never arrived live: found
// there, the engine published it and the stream dropped it (a sequence fault, not missing events).
func (r *endpointRun) lostLive(ctx context.Context, evs []seen) string {
	p := r.probe
	for rank, addr := range r.ep.Events.Replay {
		if addr == "" {
			continue
		}
		delivered := map[uint64]bool{}
		for _, ev := range evs {
			if ev.Rank == rank {
				delivered[ev.Seq] = true
			}
		}
		found := ""
		_ = replayAll(ctx, addr, 0, r.opts.EventTimeout, func(seq uint64, payload []byte) bool {
			if delivered[seq] {
				return true
			}
			b, err := decodeReplayed(r.ep.Family, payload)
			if err != nil {
				return true
			}
			for _, ev := range b.Events {
				s := seen{Kind: ev.Kind, Hashes: ev.BlockHashes, Tokens: ev.TokenIDs, BlockSize: ev.BlockSize, Medium: ev.Medium}
				if ev.Kind == engines.BlockStored && p.isOwn(s, s.blockSize(), r.tok) {
					found = fmt.Sprintf("rank %d: the probe's batch (seq %d) was published — the replay buffer at %s holds it — but never arrived on the live stream %s", rank, seq, addr, r.streamName())
					return false
				}
			}
			return true
		})
		if found != "" {
			return found
		}
	}
	return ""
}
