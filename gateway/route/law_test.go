package route

import "testing"

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
		// totalLoad 8 over 4 equal endpoints: cap = ceil(1.75·8/4) = 4. Endpoint 1 has load 4 → over.
		{"hard: hot winner over cap spills to next best under cap", hard, withIndex(sc(2, 2), sc(7, 4), sc(5, 1), sc(0, 1)), 8, 2, true},
		{"hard: under-cap best has score 0 → stay with least-loaded positive (no relief)", hard, withIndex(sc(7, 4), sc(0, 0), sc(0, 0), sc(6, 4)), 8, 0, false},
		{"hard: same with spill relief → least-loaded under cap", hardRelief, withIndex(sc(7, 4), sc(0, 0), sc(0, 0), sc(6, 4)), 8, 1, true},
		// All over cap: loads 5,5 total 10, cap = ceil(1.75·10/2) = 9 → both under. Use capacity skew.
		{"hard: capacity share shapes caps", hard, []Scored{{0, 9, 3, 1}, {1, 1, 1, 9}}, 8, 1, true},
		{"soft: no load = argmax", Law{Kind: LawSoft, Lambda: 32}, withIndex(sc(3, 0), sc(4, 0)), 8, 1, false},
		// cost0 = 5·1000 + 32·0 = 5000; cost1 = 4·1000 + 32·40 = 5280 → 0 wins.
		{"soft: load outweighs one block", Law{Kind: LawSoft, Lambda: 32}, withIndex(sc(3, 0), sc(4, 40)), 8, 0, true},
		// adaptive: total load 26 → factor 300 %. cap = ceil(3·26/2) = 39 → both under → argmax.
		{"adaptive: high total load widens the cap", Law{Kind: LawAdaptive}, withIndex(sc(7, 20), sc(1, 6)), 8, 0, false},
		// adaptive at low load is hard with 175: total 4, cap = ceil(1.75·4/2)=4; endpoint 0 load 4 over.
		{"adaptive: low load behaves like hard", Law{Kind: LawAdaptive}, withIndex(sc(7, 4), sc(1, 0)), 8, 1, true},
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
