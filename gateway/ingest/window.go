package ingest

// Verdict is what the sequence window decides about one message of one rank.
type Verdict uint8

const (
	// First: no earlier message on this rank (a fresh mirror); apply.
	First Verdict = iota + 1
	// Next: seq == last+1; apply.
	Next
	// Duplicate: a message already applied (same sequence, same payload digest); drop it.
	Duplicate
	// Stale: an older sequence this rank never applied (it was missed and later messages were
	// applied), seen again in a replay; drop it rather than apply it out of order.
	Stale
	// GapKept: 1..Window messages missing; keep the inventory (temporary staleness) and apply.
	GapKept
	// GapCleared: more than Window messages missing; clear, then apply.
	GapCleared
	// Regression: seq < last and not a message this rank applied: the engine restarted behind a
	// transparent reconnect; clear, then apply.
	Regression
	// Restart: seq <= last but the payload differs from the one applied under that sequence: a
	// restarted publisher reusing sequence numbers; clear, then apply.
	Restart
)

func (v Verdict) String() string {
	return [...]string{"", "first", "next", "duplicate", "stale", "gap_kept", "gap_cleared", "regression", "restart"}[v]
}

// Clears reports whether the verdict clears the endpoint before the message is applied.
func (v Verdict) Clears() bool { return v == GapCleared || v == Regression || v == Restart }

// Applies reports whether the message is applied.
func (v Verdict) Applies() bool { return v != Duplicate && v != Stale }

// seqWindow is one rank's sequence state: the last applied sequence, the digests of the last Window
// applied messages (to tell a duplicate from a restart that reuses numbers), and, after a replay,
// the digests of everything replayed until live traffic passes the replay's end.
type seqWindow struct {
	last uint64
	has  bool
	ring [Window]struct {
		seq, digest uint64
		ok          bool
	}
	replayed    map[uint64]uint64
	replayedMax uint64
	// noDup: sequences never repeat legitimately (event ids from a destructive drain), so any
	// seq <= last is a regression.
	noDup bool
}

// Check decides about a message without changing state; missing is the number of messages skipped
// for the gap verdicts. replay says the message comes from a replay exchange, where older sequences
// this rank did not apply are Stale rather than a regression.
func (w *seqWindow) Check(seq, digest uint64, replay bool) (v Verdict, missing uint64) {
	if !w.has {
		return First, 0
	}
	if seq == w.last+1 {
		return Next, 0
	}
	if seq > w.last {
		missing = seq - w.last - 1
		if missing <= Window {
			return GapKept, missing
		}
		return GapCleared, missing
	}
	if w.noDup {
		return Regression, 0
	}
	if d, ok := w.digest(seq); ok {
		if d == digest {
			return Duplicate, 0
		}
		return Restart, 0
	}
	if replay {
		return Stale, 0
	}
	return Regression, 0
}

func (w *seqWindow) digest(seq uint64) (uint64, bool) {
	if e := &w.ring[seq%Window]; e.ok && e.seq == seq {
		return e.digest, true
	}
	if w.replayed != nil {
		d, ok := w.replayed[seq]
		return d, ok
	}
	return 0, false
}

// Accept records an applied message. During a replay (replay true) the digest is also kept until
// live traffic moves past the replay's last sequence.
func (w *seqWindow) Accept(seq, digest uint64, replay bool) {
	if !replay && w.replayed != nil && seq > w.replayedMax {
		w.replayed = nil
	}
	if replay {
		if w.replayed == nil {
			w.replayed = make(map[uint64]uint64)
		}
		w.replayed[seq] = digest
		if seq > w.replayedMax {
			w.replayedMax = seq
		}
	}
	w.last, w.has = seq, true
	w.ring[seq%Window] = struct {
		seq, digest uint64
		ok          bool
	}{seq, digest, true}
}

// Reset forgets everything: after a clear the next message starts a new epoch.
func (w *seqWindow) Reset() {
	noDup := w.noDup
	*w = seqWindow{noDup: noDup}
}

// ResumeFrom is the sequence a replay asks for on a reconnect: Window messages back from the last
// applied one (so the overlap proves the publisher did not restart), or 0 with nothing applied.
func (w *seqWindow) ResumeFrom() uint64 {
	if !w.has {
		return 0
	}
	if w.last < Window {
		return 0
	}
	return w.last + 1 - Window
}

// admit acts on the window's verdict v (from Check, computed once per message) for one message of
// rank: gap and clear bookkeeping, then Accept. It returns false when the message must be dropped
// (duplicate or stale).
func (p *pipeline) admit(rank int, w *seqWindow, seq, digest uint64, v Verdict, missing uint64, replay bool) bool {
	switch v {
	case Duplicate, Stale:
		p.trace(Trace{Type: "duplicate", Rank: rank, Seq: seq, HasSeq: true, Reason: v.String()})
		return false
	case GapKept:
		if !p.cfg.ClearUnreplayed {
			p.lab.gap(rank, "kept")
			p.trace(Trace{Type: "gap", Rank: rank, Seq: seq, HasSeq: true, Missing: missing, Reason: "kept"})
			break
		}
		// A gap no replay filled: the lost messages may have removed blocks the mirror still
		// holds, so the mirror starts again from this message rather than keep stale keys.
		fallthrough
	case GapCleared, Regression, Restart:
		p.lab.gap(rank, "cleared")
		p.trace(Trace{Type: "gap", Rank: rank, Seq: seq, HasSeq: true, Missing: missing, Reason: "cleared",
			Detail: v.String()})
		cause := "gap"
		if v != GapCleared && v != GapKept {
			cause = v.String()
		}
		p.clear(rank, cause)
		w.Reset()
	}
	w.Accept(seq, digest, replay)
	return true
}
