package exactness

import (
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

var engineCfg = Config{ParityBlocks: 4, Probes: []Kind{Completion, Chat}}
var routerCfg = Config{Probes: []Kind{Completion, Chat}}

func ev(t EvidenceType) Evidence { return Evidence{Type: t, At: t0, Detail: "d"} }
func probe(t EvidenceType, k Kind) Evidence {
	return Evidence{Type: t, Kind: k, At: t0, Detail: "other blocks"}
}
func parity(n int) Evidence    { return Evidence{Type: ParityMatched, Blocks: n, At: t0} }
func cleared(c Cause) Evidence { return Evidence{Type: Cleared, Cause: c, At: t0} }
func restarted() Evidence {
	return Evidence{Type: Restarted, Detail: "the event sequence went backwards", At: t0}
}

func causes(hs []Hold) []Cause {
	var out []Cause
	for _, h := range hs {
		out = append(out, h.Cause)
	}
	return out
}

// TestTransitions walks each cause from its raise to the evidence that lifts it, and pins that
// evidence for another cause does not.
func TestTransitions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cfg       Config
		certified bool
		steps     []Evidence
		state     State
		holds     []Cause
	}{
		{"certified is eligible", engineCfg, true, nil, StateEligible, nil},
		{"uncertified", engineCfg, false, nil, StateUncertified, []Cause{Uncertified}},
		{"uncertified ignores restarts", engineCfg, false, []Evidence{restarted()}, StateUncertified, []Cause{Uncertified}},
		{"certificate loaded", engineCfg, false, []Evidence{ev(Certified)}, StateEligible, nil},
		{"certificate expires", engineCfg, true, []Evidence{ev(NotCertified)}, StateUncertified, []Cause{Uncertified}},

		{"restart verifies", engineCfg, true, []Evidence{restarted()}, StateVerifying, []Cause{Restart}},
		{"restart: parity alone does not lift", engineCfg, true, []Evidence{restarted(), parity(10)}, StateVerifying, []Cause{Restart}},
		{"restart: completion probe and parity do not lift (chat template unverified)", engineCfg, true,
			[]Evidence{restarted(), parity(10), probe(ProbeReproduced, Completion)}, StateVerifying, []Cause{Restart}},
		{"restart: probes without enough parity blocks", engineCfg, true,
			[]Evidence{restarted(), parity(3), probe(ProbeReproduced, Completion), probe(ProbeReproduced, Chat)}, StateVerifying, []Cause{Restart}},
		{"restart: parity at the count and both probes lift", engineCfg, true,
			[]Evidence{restarted(), parity(3), probe(ProbeReproduced, Completion), probe(ProbeReproduced, Chat), parity(1)}, StateEligible, nil},
		{"restart: blocks before the restart do not count", engineCfg, true,
			[]Evidence{parity(10), probe(ProbeReproduced, Completion), probe(ProbeReproduced, Chat), restarted()}, StateVerifying, []Cause{Restart}},
		{"restart: a second restart starts the count again", engineCfg, true,
			[]Evidence{restarted(), parity(4), probe(ProbeReproduced, Completion), restarted(), probe(ProbeReproduced, Chat)}, StateVerifying, []Cause{Restart}},
		{"router restart needs a passing re-probe", routerCfg, true,
			[]Evidence{restarted(), probe(ProbeReproduced, Completion), probe(ProbeReproduced, Chat)}, StateVerifying, []Cause{Restart}},
		{"router restart lifts on re-probe and probes", routerCfg, true,
			[]Evidence{restarted(), ev(ReprobePassed), probe(ProbeReproduced, Completion), probe(ProbeReproduced, Chat)}, StateEligible, nil},
		{"restart lifts on re-certification", engineCfg, true, []Evidence{restarted(), ev(Certified)}, StateEligible, nil},

		{"parity mismatch", engineCfg, true, []Evidence{ev(ParityMismatched)}, StateSuspended, []Cause{Parity}},
		{"parity mismatch is not lifted by matching blocks", engineCfg, true, []Evidence{ev(ParityMismatched), parity(100)}, StateSuspended, []Cause{Parity}},
		{"parity mismatch during verification blocks the lift", engineCfg, true,
			[]Evidence{restarted(), ev(ParityMismatched), parity(10), probe(ProbeReproduced, Completion), probe(ProbeReproduced, Chat)}, StateSuspended, []Cause{Restart, Parity}},
		{"a restart replaces a parity mismatch by its verification", engineCfg, true, []Evidence{ev(ParityMismatched), restarted()}, StateVerifying, []Cause{Restart}},

		{"geometry mismatch", routerCfg, true, []Evidence{ev(GeometryMismatched)}, StateSuspended, []Cause{Geometry}},
		{"geometry mismatch during verification blocks the lift", routerCfg, true,
			[]Evidence{restarted(), ev(GeometryMismatched), ev(ReprobePassed), probe(ProbeReproduced, Completion), probe(ProbeReproduced, Chat)}, StateSuspended, []Cause{Restart, Geometry}},
		{"a restart replaces a geometry mismatch by its verification", routerCfg, true, []Evidence{ev(GeometryMismatched), restarted()}, StateVerifying, []Cause{Restart}},
		{"chat probe not reproduced", engineCfg, true, []Evidence{probe(ProbeNotReproduced, Chat)}, StateSuspended, []Cause{Probe}},
		{"chat probe: a completion probe does not lift it", engineCfg, true,
			[]Evidence{probe(ProbeNotReproduced, Chat), probe(ProbeReproduced, Completion)}, StateSuspended, []Cause{Probe}},
		{"chat probe: a parity watch does not lift it", engineCfg, true,
			[]Evidence{probe(ProbeNotReproduced, Chat), parity(100), ev(ReprobePassed)}, StateSuspended, []Cause{Probe}},
		{"chat probe: a later chat probe lifts it", engineCfg, true,
			[]Evidence{probe(ProbeNotReproduced, Chat), probe(ProbeReproduced, Chat)}, StateEligible, nil},
		{"both probes failed, one reproduced", engineCfg, true,
			[]Evidence{probe(ProbeNotReproduced, Chat), probe(ProbeNotReproduced, Completion), probe(ProbeReproduced, Chat)}, StateSuspended, []Cause{Probe}},
		{"chat drift after a restart holds both", engineCfg, true,
			[]Evidence{restarted(), parity(10), probe(ProbeReproduced, Completion), probe(ProbeNotReproduced, Chat)}, StateSuspended, []Cause{Restart, Probe}},
		{"a restart does not lift a failed probe", engineCfg, true, []Evidence{probe(ProbeNotReproduced, Chat), restarted()}, StateSuspended, []Cause{Restart, Probe}},

		{"re-probe fails", engineCfg, true, []Evidence{ev(ReprobeFailed)}, StateSuspended, []Cause{Reprobe}},
		{"re-probe passes again", engineCfg, true, []Evidence{ev(ReprobeFailed), ev(ReprobePassed)}, StateEligible, nil},
		{"re-probe is not lifted by probes", engineCfg, true, []Evidence{ev(ReprobeFailed), probe(ProbeReproduced, Chat)}, StateSuspended, []Cause{Reprobe}},

		{"shortfall", engineCfg, true, []Evidence{ev(ShortfallSeen)}, StateSuspended, []Cause{Shortfall}},
		{"shortfall survives a restart's verification", engineCfg, true,
			[]Evidence{ev(ShortfallSeen), restarted(), parity(10), probe(ProbeReproduced, Completion), probe(ProbeReproduced, Chat)}, StateSuspended, []Cause{Shortfall}},
		{"shortfall cleared by hand", engineCfg, true, []Evidence{ev(ShortfallSeen), cleared(Shortfall)}, StateEligible, nil},
		{"clearing token drift leaves a shortfall", engineCfg, true, []Evidence{ev(ShortfallSeen), ev(TokenDriftSeen), cleared(TokenDrift)}, StateSuspended, []Cause{Shortfall}},
		{"parity cannot be cleared by hand", engineCfg, true, []Evidence{ev(ParityMismatched), cleared(Parity)}, StateSuspended, []Cause{Parity}},
		{"restart cannot be cleared by hand", engineCfg, true, []Evidence{restarted(), cleared(Restart)}, StateVerifying, []Cause{Restart}},
		{"re-certification lifts everything", engineCfg, true,
			[]Evidence{ev(ShortfallSeen), ev(TokenDriftSeen), ev(ParityMismatched), probe(ProbeNotReproduced, Chat), ev(ReprobeFailed), ev(Certified)}, StateEligible, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := New(tc.cfg, tc.certified, "no certificate covers this endpoint")
			for _, e := range tc.steps {
				m.Apply(e)
			}
			if m.State() != tc.state || !slices.Equal(causes(m.Holds()), tc.holds) {
				t.Fatalf("state %s holds %v, want %s %v", m.State(), causes(m.Holds()), tc.state, tc.holds)
			}
			if m.Eligible(Chat) != (tc.state == StateEligible) || m.Eligible(Completion) != (tc.state == StateEligible) {
				t.Fatalf("eligible %v in state %s", m.Eligible(Chat), m.State())
			}
			if (m.FenceReason() == "") != (m.Certified() && len(tc.holds) == 0) && m.Certified() {
				t.Fatalf("fence reason %q with holds %v", m.FenceReason(), tc.holds)
			}
		})
	}
}

// TestReasonsSayWhatLifts: every hold's fence text carries its reason and what lifts it, and the
// restart names what verification it waits for.
func TestReasonsSayWhatLifts(t *testing.T) {
	m := New(engineCfg, true, "")
	m.Apply(restarted())
	m.Apply(probe(ProbeNotReproduced, Chat))
	m.Apply(ev(ShortfallSeen))
	f := m.FenceReason()
	for _, want := range []string{"the event sequence went backwards", "4 matching blocks", "a reproduced chat probe",
		"the chat probe was not reproduced: other blocks", "exact/clear?hold=realized_shortfall", "2026-01-02T03:04:05Z"} {
		if !strings.Contains(f, want) {
			t.Errorf("fence reason lacks %q: %s", want, f)
		}
	}
	for _, c := range Causes {
		if Lifts(c) == "" {
			t.Errorf("cause %s says nothing of what lifts it", c)
		}
	}
}

func TestTransitionReportsRaiseAndLift(t *testing.T) {
	m := New(routerCfg, true, "")
	tr := m.Apply(restarted())
	if tr.From != StateEligible || tr.To != StateVerifying || !slices.Equal(tr.Raised, []Cause{Restart}) {
		t.Fatalf("restart: %+v", tr)
	}
	if tr := m.Apply(restarted()); len(tr.Raised) != 0 || tr.From != StateVerifying || tr.To != StateVerifying {
		t.Fatalf("a second restart raised again: %+v", tr)
	}
	m.Apply(ev(ReprobePassed))
	m.Apply(probe(ProbeReproduced, Completion))
	tr = m.Apply(probe(ProbeReproduced, Chat))
	if tr.To != StateEligible || !slices.Equal(tr.Lifted, []Cause{Restart}) {
		t.Fatalf("verified: %+v", tr)
	}
	if v, ok := m.Verification(); ok {
		t.Fatalf("verification under way after the lift: %+v", v)
	}
}

// model is the fuzz test's independent account of what the evidence proved: for each request kind,
// whether its keys are verified now.
type model struct {
	cfg                   Config
	certified             bool
	restartPending        bool
	parityBlocks          int
	reprobeOK             bool
	reproduced            map[Kind]bool
	failed                map[Kind]bool
	parityBad, reprobeBad bool
	geometryBad           bool
	shortfall, drift      bool
}

func (o *model) verified(k Kind) bool {
	if !o.certified || o.parityBad || o.geometryBad || o.reprobeBad || o.shortfall || o.drift {
		return false
	}
	if o.failed[Completion] || o.failed[Chat] {
		return false // the router's fence is per endpoint: any kind's drift fences all
	}
	if !o.restartPending {
		return true
	}
	if o.cfg.ParityBlocks > 0 && o.parityBlocks < o.cfg.ParityBlocks || o.cfg.ParityBlocks == 0 && !o.reprobeOK {
		return false
	}
	for _, p := range o.cfg.Probes {
		if !o.reproduced[p] {
			return false
		}
	}
	return o.reproduced[k] || !slices.Contains(o.cfg.Probes, k)
}

func (o *model) apply(e Evidence) {
	if !o.certified && e.Type != Certified {
		return
	}
	switch e.Type {
	case Certified:
		*o = model{cfg: o.cfg, certified: true, reproduced: map[Kind]bool{}, failed: map[Kind]bool{}}
	case NotCertified:
		o.certified = false
	case Restarted:
		o.restartPending, o.parityBlocks, o.reprobeOK, o.parityBad, o.geometryBad = true, 0, false, false, false
		clear(o.reproduced)
	case ParityMatched:
		o.parityBlocks += e.Blocks
	case ParityMismatched:
		o.parityBad = true
	case GeometryMismatched:
		o.geometryBad = true
	case ReprobePassed:
		o.reprobeOK, o.reprobeBad = true, false
	case ReprobeFailed:
		o.reprobeOK, o.reprobeBad = false, true
	case ProbeReproduced:
		o.reproduced[e.Kind], o.failed[e.Kind] = true, false
	case ProbeNotReproduced:
		o.reproduced[e.Kind], o.failed[e.Kind] = false, true
	case ShortfallSeen:
		o.shortfall = true
	case TokenDriftSeen:
		o.drift = true
	case Cleared:
		switch e.Cause {
		case Shortfall:
			o.shortfall = false
		case TokenDrift:
			o.drift = false
		}
	}
	if o.restartPending && !o.parityBad && !o.geometryBad && !o.failed[Completion] && !o.failed[Chat] {
		// Lifting ends the restart's verification; the counts no longer matter.
		done := !(o.cfg.ParityBlocks > 0 && o.parityBlocks < o.cfg.ParityBlocks || o.cfg.ParityBlocks == 0 && !o.reprobeOK)
		for _, p := range o.cfg.Probes {
			done = done && o.reproduced[p]
		}
		if done {
			o.restartPending = false
		}
	}
}

// decode turns fuzz bytes into evidence: one byte picks the type, the next its argument.
func decode(b []byte) []Evidence {
	var out []Evidence
	kinds := []Kind{Completion, Chat}
	clearable := []Cause{Shortfall, TokenDrift, Parity, Restart, Probe, Reprobe}
	for i := 0; i+1 < len(b); i += 2 {
		e := Evidence{Type: EvidenceType(int(b[i])%int(Cleared) + 1), At: t0.Add(time.Duration(i) * time.Second), Detail: "x"}
		arg := int(b[i+1])
		e.Kind = kinds[arg%2]
		e.Blocks = arg % 8
		e.Cause = clearable[arg%len(clearable)]
		out = append(out, e)
	}
	return out
}

// FuzzEvidence: random interleavings of certificates, restarts, parity blocks and mismatches,
// re-probes, probes, shortfalls, drifts and clears never leave a KV-exact prediction possible on
// an endpoint whose keys are not verified for that request's kind; and when they are verified, the
// endpoint is eligible (nothing holds it without a cause).
func FuzzEvidence(f *testing.F) {
	f.Add([]byte{2, 0, 2, 1, 3, 5})
	f.Add([]byte{3, 0, 4, 7, 8, 0, 8, 1, 6, 0})
	f.Add([]byte{3, 0, 9, 1, 4, 7, 8, 0, 8, 1, 10, 0})
	f.Add([]byte{11, 0, 12, 0, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, cfg := range []Config{engineCfg, routerCfg, {ParityBlocks: 2, Probes: []Kind{Completion}}} {
			m := New(cfg, true, "")
			o := &model{cfg: cfg, certified: true, reproduced: map[Kind]bool{}, failed: map[Kind]bool{}}
			for i, e := range decode(b) {
				m.Apply(e)
				o.apply(e)
				for _, k := range []Kind{Completion, Chat} {
					if m.Eligible(k) && !o.verified(k) {
						t.Fatalf("cfg %+v step %d (%+v): eligible for %s, keys not verified (%+v); holds %v", cfg, i, e, k, o, causes(m.Holds()))
					}
					if !m.Eligible(k) && o.verified(k) {
						t.Fatalf("cfg %+v step %d (%+v): held for %s with keys verified (%+v); holds %v", cfg, i, e, k, o, causes(m.Holds()))
					}
				}
				if m.Certified() && (m.FenceReason() == "") != m.Eligible(Chat) {
					t.Fatalf("fence %q, eligible %v", m.FenceReason(), m.Eligible(Chat))
				}
			}
		}
	})
}

// TestStreamUnsynced: a lost or replaying event stream fences KV-exact until every rank follows
// the engine again; a second loss keeps the first one's moment; other evidence does not lift it,
// and an uncertified endpoint holds nothing.
func TestStreamUnsynced(t *testing.T) {
	m := New(engineCfg, true, "")
	if !m.Eligible(Completion) {
		t.Fatal("fresh certified machine not eligible")
	}
	tr := m.Apply(Evidence{Type: StreamUnsynced, Detail: "rank 0 disconnect", At: t0})
	if !slices.Equal(tr.Raised, []Cause{Unsynced}) || m.Eligible(Completion) || m.State() != StateSuspended {
		t.Fatalf("lost: %+v, state %s", tr, m.State())
	}
	tr = m.Apply(Evidence{Type: StreamUnsynced, Detail: "rank 0 replaying", At: t0.Add(time.Minute)})
	if tr.Changed() || !strings.Contains(m.FenceReason(), "rank 0 disconnect") {
		t.Fatalf("second loss changed the hold: %+v, %q", tr, m.FenceReason())
	}
	for _, e := range []Evidence{ev(ReprobePassed), parity(10), cleared(Unsynced)} {
		if m.Apply(e); !m.Held(Unsynced) {
			t.Fatalf("%+v lifted the stream hold", e)
		}
	}
	tr = m.Apply(Evidence{Type: StreamSynced, At: t0})
	if !slices.Equal(tr.Lifted, []Cause{Unsynced}) || !m.Eligible(Completion) {
		t.Fatalf("synced: %+v", tr)
	}
	u := New(engineCfg, false, "no certificate")
	if u.Apply(Evidence{Type: StreamUnsynced, At: t0}); u.Held(Unsynced) {
		t.Fatal("an uncertified endpoint holds the stream cause")
	}
}
