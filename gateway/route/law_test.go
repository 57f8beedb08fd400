package route

import (
	"testing"

	"github.com/kvexact/kvexact/gateway/rules"
)

func sc(score, load int) Scored { return Scored{Score: score, Load: load, Capacity: 1} }

func withIndex(cs ...Scored) []Scored {
	for i := range cs {
		cs[i].Index = i
	}
	return cs
}

func TestLaws(t *testing.T) {
	hard := Law{Kind: LawHard, FactorPct: 175}
	hardRelief := Law{Kind: LawHard, FactorPct: 175, SpillRelief: true}
	for _, tc := range []struct {
		name  string
		law   Law
		cands []Scored
		q     int
		pos   int
		spill bool
	}{
		{"off: argmax", Law{Kind: LawOff}, withIndex(sc(1, 0), sc(5, 9), sc(3, 0)), 8, 1, false},
		{"off: tie → least load", Law{Kind: LawOff}, withIndex(sc(5, 3), sc(5, 1)), 8, 1, false},
		{"off: tie, tie → lowest index", Law{Kind: LawOff}, withIndex(sc(5, 1), sc(5, 1)), 8, 0, false},
		{"hard: idle pool = argmax", hard, withIndex(sc(2, 0), sc(7, 0), sc(0, 0)), 8, 1, false},
		// totalLoad 8 (and the request placed) over 4 equal endpoints: cap = ceil(1.75·9/4) = 4.
		// Endpoint 1 has load 4 → over.
		{"hard: hot winner over cap spills to next best under cap", hard, withIndex(sc(2, 2), sc(7, 4), sc(5, 1), sc(0, 1)), 8, 2, true},
		{"hard: under-cap best has score 0 → stay with least-loaded positive (no relief)", hard, withIndex(sc(7, 4), sc(0, 0), sc(0, 0), sc(6, 4)), 8, 0, false},
		{"hard: same with spill relief → least-loaded under cap", hardRelief, withIndex(sc(7, 4), sc(0, 0), sc(0, 0), sc(6, 4)), 8, 1, true},
		// All over cap: loads 5,5 total 10, cap = ceil(1.75·10/2) = 9 → both under. Use capacity skew.
		{"hard: capacity share shapes caps", hard, []Scored{{Index: 0, Score: 9, Load: 3, Capacity: 1}, {Index: 1, Score: 1, Load: 1, Capacity: 9}}, 8, 1, true},
		{"soft: no load = argmax", Law{Kind: LawSoft, Lambda: 32}, withIndex(sc(3, 0), sc(4, 0)), 8, 1, false},
		// cost0 = 5·1000 + 32·0 = 5000; cost1 = 4·1000 + 32·40 = 5280 → 0 wins.
		{"soft: load outweighs one block", Law{Kind: LawSoft, Lambda: 32}, withIndex(sc(3, 0), sc(4, 40)), 8, 0, true},
		// adaptive: total load 26 → factor 300 %. cap = ceil(3·26/2) = 39 → both under → argmax.
		{"adaptive: high total load widens the cap", Law{Kind: LawAdaptive}, withIndex(sc(7, 20), sc(1, 6)), 8, 0, false},
		// adaptive at low load is hard with 175: total 7, cap = ceil(1.75·8/2) = 7; endpoint 0 load 7 over.
		{"adaptive: low load behaves like hard", Law{Kind: LawAdaptive}, withIndex(sc(7, 7), sc(1, 0)), 8, 1, true},
	} {
		v := tc.law.Pick(tc.cands, tc.q)
		if v.Pos != tc.pos || v.Spill != tc.spill {
			t.Errorf("%s: got pos %d spill %v (caps %v), want pos %d spill %v", tc.name, v.Pos, v.Spill, v.Caps, tc.pos, tc.spill)
		}
	}
	if v := (Law{Kind: LawHard}).Pick(nil, 4); v.Pos != -1 {
		t.Errorf("empty candidates: %+v", v)
	}
}

func TestHardCapsFloorOne(t *testing.T) {
	v := Law{Kind: LawHard, FactorPct: 175}.Pick(withIndex(sc(1, 0), sc(2, 0)), 4)
	for i, c := range v.Caps {
		if c != 1 {
			t.Errorf("cap[%d] = %d with zero load, want floor 1", i, c)
		}
	}
}

// The cap floor: a holder of at least half the prompt below it is never over its cap; above it,
// and for shallower matches, the (1+ε)·mean cap rules unchanged. The prompt has 8 blocks.
func TestHardCapFloor(t *testing.T) {
	floor4 := Law{Kind: LawHard, FactorPct: 175, SpillRelief: true, CapFloor: 4}
	floor1 := Law{Kind: LawHard, FactorPct: 175, SpillRelief: true, CapFloor: 1}
	for _, tc := range []struct {
		name     string
		law      Law
		cands    []Scored
		pos      int
		spill    bool
		wantCaps []int
	}{
		// total 3 over 4: ceil(1.75·(3+1)/4) = 2, so the holder at 3 is over cap without a floor…
		{"floor 1: a holder at 3 in flight spills", floor1, withIndex(sc(6, 3), sc(0, 0), sc(0, 0), sc(0, 0)), 1, true, []int{2, 2, 2, 2}},
		// …and under the floor of 4 it keeps its request; non-holders keep the mean's cap.
		{"floor 4: a holder at 3 in flight keeps it", floor4, withIndex(sc(6, 3), sc(0, 0), sc(0, 0), sc(0, 0)), 0, false, []int{4, 2, 2, 2}},
		// Exactly half the prompt is a holder; one block less is not.
		{"floor 4: half the prompt is a holder", floor4, withIndex(sc(4, 3), sc(0, 0), sc(0, 0), sc(0, 0)), 0, false, []int{4, 2, 2, 2}},
		{"floor 4: less than half is no holder, it spills", floor4, withIndex(sc(3, 3), sc(0, 0), sc(0, 0), sc(0, 0)), 1, true, []int{2, 2, 2, 2}},
		// A shallow shared prefix (a RAG instruction) gets no floor: the request goes on to an idle
		// endpoint instead of piling onto the few that hold the instruction.
		// Total 2: ceil(1.75·3/4) = 2, so the shallow holder at 2 is over (a floor would keep it).
		{"floor 4: shallow matches stay under the mean's cap", floor4, withIndex(sc(1, 2), sc(0, 0), sc(0, 0), sc(0, 0)), 1, true, []int{2, 2, 2, 2}},
		// At the floor a holder is over: cap 4, load 4 is not under; spill relief → least loaded.
		{"floor 4: a holder at 4 spills to the least loaded", floor4, withIndex(sc(6, 4), sc(0, 1), sc(0, 0), sc(0, 0)), 2, true, []int{4, 3, 3, 3}},
		// Over the floor the multiplicative cap decides: total 33, ceil(1.75·34/4) = 15 > 4.
		{"floor 4: busy pool, the mean's cap rules", floor4, withIndex(sc(6, 15), sc(2, 6), sc(0, 6), sc(0, 6)), 1, true, []int{15, 15, 15, 15}},
		{"floor 4: busy pool, under the mean's cap keeps it", floor4, withIndex(sc(6, 14), sc(2, 7), sc(0, 6), sc(0, 6)), 0, false, []int{15, 15, 15, 15}},
		// Ties among holders under the floor: equal score, equal load → the lowest position.
		{"floor 4: ties go to the lowest position", floor4, withIndex(sc(0, 0), sc(5, 2), sc(5, 2), sc(0, 0)), 1, false, []int{3, 4, 4, 3}},
		// Capacity shares still shape caps above the floor.
		{"floor 4: a large share's cap exceeds the floor", floor4, []Scored{{Index: 0, Score: 9, Load: 12, Capacity: 3}, {Index: 1, Score: 1, Load: 0, Capacity: 1}}, 0, false, []int{18, 6}},
	} {
		v := tc.law.Pick(tc.cands, 8)
		if v.Pos != tc.pos || v.Spill != tc.spill || !equalInts(v.Caps, tc.wantCaps) {
			t.Errorf("%s: got pos %d spill %v caps %v, want pos %d spill %v caps %v", tc.name, v.Pos, v.Spill, v.Caps, tc.pos, tc.spill, tc.wantCaps)
		}
		if w := tc.law.Pick(tc.cands, 8); w.Pos != v.Pos || !equalInts(w.Caps, v.Caps) {
			t.Errorf("%s: not deterministic: %+v then %+v", tc.name, v, w)
		}
	}
	// The adaptive law is the hard law with a wider factor: the floor applies to it too.
	if v := (Law{Kind: LawAdaptive, CapFloor: 4}).Pick(withIndex(sc(6, 3), sc(0, 0)), 8); v.Pos != 0 || v.Caps[0] != 4 {
		t.Errorf("adaptive with floor 4: %+v, want pos 0 with cap 4", v)
	}
}

// The cap counts the request being placed (⌈(1+ε)·m/n⌉ of m requests including it). Without it,
// 2 in flight on 4 engines gave every engine a cap of ⌈1.75·2/4⌉ = 1: the engine running one
// request was over it, and a prompt whose 27 of 67 blocks it held (below the holders' floor) was
// recomputed on an idle engine. With it the cap is ⌈1.75·3/4⌉ = 2 and the holder keeps it; an
// endpoint at the new cap still spills.
func TestHardCapCountsThePlacedRequest(t *testing.T) {
	law := Law{Kind: LawHard, FactorPct: 175, SpillRelief: true, CapFloor: 8}
	v := law.Pick(withIndex(sc(0, 0), sc(27, 1), sc(0, 1), sc(0, 0)), 67)
	if v.Pos != 1 || v.Spill || !equalInts(v.Caps, []int{2, 2, 2, 2}) {
		t.Errorf("holder at 1 of 2 in flight: got pos %d spill %v caps %v, want pos 1 spill false caps [2 2 2 2]", v.Pos, v.Spill, v.Caps)
	}
	// 4 in flight: ⌈1.75·5/4⌉ = 3, the holder at 2 keeps its prefix (18 of 67 blocks).
	v = law.Pick(withIndex(sc(0, 2), sc(0, 0), sc(0, 0), sc(18, 2)), 67)
	if v.Pos != 3 || v.Spill || !equalInts(v.Caps, []int{3, 3, 3, 3}) {
		t.Errorf("holder at 2 of 4 in flight: got pos %d spill %v caps %v, want pos 3 spill false caps [3 3 3 3]", v.Pos, v.Spill, v.Caps)
	}
	// At its cap the holder spills to the least loaded (spill relief).
	v = law.Pick(withIndex(sc(0, 1), sc(27, 2), sc(0, 0), sc(0, 0)), 67)
	if v.Pos != 2 || !v.Spill {
		t.Errorf("holder at its cap: got pos %d spill %v caps %v, want pos 2 spill true", v.Pos, v.Spill, v.Caps)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// LawOf reads every field of a normalized loadLaw, so the router and the benchmark's oracle decide
// by the same law.
func TestLawOfRule(t *testing.T) {
	eps, floor, relief := 2.0, 6, true
	l := LawOf(rules.LoadLaw{Kind: "hard", Epsilon: &eps, CapFloor: &floor, Lambda: 40, SpillRelief: &relief})
	if l != (Law{Kind: LawHard, FactorPct: 300, CapFloor: 6, Lambda: 40, SpillRelief: true}) {
		t.Errorf("LawOf: %+v", l)
	}
	var def rules.LoadLaw
	l = LawOf(def)
	if l.FactorPct != 175 || l.CapFloor != 1 || l.SpillRelief {
		t.Errorf("LawOf(zero): %+v, want ε 0.75, floor 1, no relief", l)
	}
}
