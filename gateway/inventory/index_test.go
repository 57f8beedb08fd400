package inventory

import (
	"errors"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// op is one step of a residency scenario.
type op struct {
	kind string // store, remove, clear
	ep   int
	keys []uint64
}

func TestResidencyRules(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		ops      []op
		want     map[int][]KeyCount // per endpoint, sorted
		retired  uint64
		unknown  uint64
	}{
		{
			name: "duplicate stores count copies",
			ops:  []op{{"store", 0, []uint64{1, 1, 2}}, {"store", 0, []uint64{1}}},
			want: map[int][]KeyCount{0: {{1, 3}, {2, 1}}},
		},
		{
			name: "one remove per copy",
			ops:  []op{{"store", 0, []uint64{1, 1, 1}}, {"remove", 0, []uint64{1, 1}}},
			want: map[int][]KeyCount{0: {{1, 1}}},
		},
		{
			name: "last copy removed ends residency",
			ops:  []op{{"store", 0, []uint64{1, 1}}, {"remove", 0, []uint64{1, 1}}},
			want: map[int][]KeyCount{0: {}},
		},
		{
			name: "kv-cache groups store the same key once each",
			ops: []op{
				{"store", 0, []uint64{7, 8}}, // group 0
				{"store", 0, []uint64{7, 8}}, // group 1
				{"remove", 0, []uint64{7}},   // group 0 evicts block 7
			},
			want: map[int][]KeyCount{0: {{7, 1}, {8, 2}}},
		},
		{
			name:    "remove of an unknown key is counted, never below zero",
			ops:     []op{{"remove", 0, []uint64{5}}, {"store", 0, []uint64{5}}, {"remove", 0, []uint64{5, 5}}},
			want:    map[int][]KeyCount{0: {}},
			unknown: 2,
		},
		{
			name:    "remove on another endpoint is unknown there",
			ops:     []op{{"store", 0, []uint64{5}}, {"remove", 1, []uint64{5}}},
			want:    map[int][]KeyCount{0: {{5, 1}}, 1: {}},
			unknown: 1,
		},
		{
			name: "endpoints are independent",
			ops:  []op{{"store", 0, []uint64{1, 2}}, {"store", 1, []uint64{2, 3}}, {"store", 2, []uint64{2}}, {"remove", 1, []uint64{2}}},
			want: map[int][]KeyCount{0: {{1, 1}, {2, 1}}, 1: {{3, 1}}, 2: {{2, 1}}},
		},
		{
			name: "clear resets counts of one endpoint only",
			ops:  []op{{"store", 0, []uint64{1, 1, 2}}, {"store", 1, []uint64{1}}, {"clear", 0, nil}, {"store", 0, []uint64{2}}},
			want: map[int][]KeyCount{0: {{2, 1}}, 1: {{1, 1}}},
		},
		{
			name:     "cap retires the oldest resident key",
			capacity: 3,
			ops:      []op{{"store", 0, []uint64{1, 2, 3, 4}}},
			want:     map[int][]KeyCount{0: {{2, 1}, {3, 1}, {4, 1}}},
			retired:  1,
		},
		{
			name:     "re-storing a resident key keeps its age",
			capacity: 2,
			ops:      []op{{"store", 0, []uint64{1, 2, 1, 3}}},
			want:     map[int][]KeyCount{0: {{2, 1}, {3, 1}}},
			retired:  1,
		},
		{
			name:     "keys removed before retirement are skipped",
			capacity: 2,
			ops:      []op{{"store", 0, []uint64{1, 2}}, {"remove", 0, []uint64{1}}, {"store", 0, []uint64{3, 4}}},
			want:     map[int][]KeyCount{0: {{3, 1}, {4, 1}}},
			retired:  1, // key 2
		},
		{
			name:     "a key removed and stored again is young again",
			capacity: 2,
			ops:      []op{{"store", 0, []uint64{1, 2}}, {"remove", 0, []uint64{1}}, {"store", 0, []uint64{1, 3}}},
			want:     map[int][]KeyCount{0: {{1, 1}, {3, 1}}},
			retired:  1, // key 2, not the new copy of 1
		},
		{
			name:     "retirement drops all copies",
			capacity: 1,
			ops:      []op{{"store", 0, []uint64{1, 1, 1, 2}}, {"remove", 0, []uint64{1}}},
			want:     map[int][]KeyCount{0: {{2, 1}}},
			retired:  1,
			unknown:  1,
		},
		{
			name:     "cap is per endpoint",
			capacity: 1,
			ops:      []op{{"store", 0, []uint64{1}}, {"store", 1, []uint64{1}}, {"store", 1, []uint64{2}}},
			want:     map[int][]KeyCount{0: {{1, 1}}, 1: {{2, 1}}},
			retired:  1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix := New(Config{CapacityPerEndpoint: tc.capacity})
			ids := addEndpoints(t, ix, 3)
			for i, o := range tc.ops {
				var err error
				switch o.kind {
				case "store":
					err = ix.Store(ids[o.ep], o.keys)
				case "remove":
					err = ix.Remove(ids[o.ep], o.keys)
				case "clear":
					err = ix.Clear(ids[o.ep])
				}
				if err != nil {
					t.Fatalf("op %d: %v", i, err)
				}
			}
			for ep, want := range tc.want {
				got := ix.Snapshot(ids[ep])
				if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("endpoint %d snapshot (-want +got):\n%s", ep, diff)
				}
				if ix.Resident(ids[ep]) != len(want) {
					t.Errorf("endpoint %d resident = %d, want %d", ep, ix.Resident(ids[ep]), len(want))
				}
			}
			st := ix.Stats()
			if st.Retirements != tc.retired || st.UnknownRemoves != tc.unknown {
				t.Errorf("retirements %d unknown %d, want %d %d", st.Retirements, st.UnknownRemoves, tc.retired, tc.unknown)
			}
		})
	}
}

func addEndpoints(t testing.TB, ix *Index, n int) []EndpointID {
	t.Helper()
	ids := make([]EndpointID, n)
	for i := range ids {
		id, err := ix.AddEndpoint(string(rune('a'+i%26)) + string(rune('0'+i/26%10)) + string(rune('0'+i/260)))
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	return ids
}

func TestScore(t *testing.T) {
	ix := New(Config{})
	ids := addEndpoints(t, ix, 4)
	prompt := []uint64{10, 11, 12, 13, 14}
	must(t, ix.Store(ids[0], []uint64{10, 11, 12, 13, 14})) // full prefix
	must(t, ix.Store(ids[1], []uint64{10, 11, 13, 14}))     // gap at 12
	must(t, ix.Store(ids[2], []uint64{11, 12, 13, 14}))     // no first block
	must(t, ix.Store(ids[3], []uint64{99}))
	mask := MaskOf(ids[0], ids[1], ids[2], 200) // 200: no such endpoint, scores zero
	got := ix.Score(prompt, mask, nil)
	want := []Score{{ids[0], 5, 5}, {ids[1], 4, 2}, {ids[2], 4, 0}, {200, 0, 0}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("score (-want +got):\n%s", diff)
	}
	// Candidates outside the mask are not reported even when they hold keys.
	got = ix.Score(prompt, MaskOf(ids[3]), got)
	if diff := cmp.Diff([]Score{{ids[3], 0, 0}}, got); diff != "" {
		t.Errorf("score (-want +got):\n%s", diff)
	}
	if got := ix.Score(nil, Mask{}, nil); len(got) != 0 {
		t.Errorf("empty mask scored %v", got)
	}
}

func TestEndpoints(t *testing.T) {
	ix := New(Config{})
	a, err := ix.AddEndpoint("a")
	must(t, err)
	b, err := ix.AddEndpoint("b")
	must(t, err)
	if _, err := ix.AddEndpoint("a"); !errors.Is(err, ErrDuplicateName) {
		t.Errorf("duplicate name: %v", err)
	}
	if _, err := ix.AddEndpoint(""); err == nil {
		t.Error("empty name accepted")
	}
	must(t, ix.Store(a, []uint64{1, 2}))
	must(t, ix.Store(b, []uint64{2}))
	must(t, ix.RemoveEndpoint(a))
	for name, err := range map[string]error{
		"store":  ix.Store(a, []uint64{1}),
		"remove": ix.Remove(a, []uint64{1}),
		"clear":  ix.Clear(a),
		"again":  ix.RemoveEndpoint(a),
		"range":  ix.Store(MaxEndpoints+5, []uint64{1}),
	} {
		if !errors.Is(err, ErrUnknownEndpoint) {
			t.Errorf("%s on a removed endpoint: %v", name, err)
		}
	}
	if ix.Snapshot(a) != nil || ix.Resident(a) != 0 || ix.Resident(9999) != 0 {
		t.Error("removed endpoint still reports keys")
	}
	// The id is reused and starts empty; the other endpoint kept its keys.
	c, err := ix.AddEndpoint("c")
	must(t, err)
	if c != a {
		t.Errorf("new endpoint got id %d, want reused %d", c, a)
	}
	if got := ix.Score([]uint64{1, 2}, MaskOf(b, c), nil); !cmp.Equal(got, []Score{{c, 0, 0}, {b, 1, 0}}) {
		t.Errorf("after reuse: %v", got)
	}
	if id, ok := ix.Lookup("c"); !ok || id != c {
		t.Errorf("lookup c = %d %v", id, ok)
	}
	if _, ok := ix.Lookup("a"); ok {
		t.Error("lookup of removed name succeeded")
	}
	for i := 2; i < MaxEndpoints; i++ {
		if _, err := ix.AddEndpoint(string(rune(0x4e00 + i))); err != nil {
			t.Fatalf("endpoint %d: %v", i, err)
		}
	}
	if _, err := ix.AddEndpoint("overflow"); !errors.Is(err, ErrFull) {
		t.Errorf("257th endpoint: %v", err)
	}
	st := ix.Stats()
	if st.Endpoints != MaxEndpoints || st.Resident != 1 || st.Keys != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestWideEntries drives the overflow forms: a key on every endpoint, counts and pending FIFO
// entries beyond what a slot holds inline, and the way back.
func TestWideEntries(t *testing.T) {
	ix := New(Config{CapacityPerEndpoint: 10})
	ids := addEndpoints(t, ix, 40)
	for _, id := range ids {
		must(t, ix.Store(id, []uint64{42}))
	}
	all := MaskOf(ids...)
	for _, s := range ix.Score([]uint64{42}, all, nil) {
		if s.Overlap != 1 || s.Prefix != 1 {
			t.Fatalf("shared key: %+v", s)
		}
	}
	if n := ix.Stats().OverflowNodes; n != 7 { // 40 entries: 3 in the head node, 7 in each other
		t.Errorf("overflow nodes = %d, want 7", n)
	}
	for _, id := range ids[1:] {
		must(t, ix.Remove(id, []uint64{42}))
	}
	if got := ix.Score([]uint64{42}, all, nil); got[0].Overlap != 1 || got[1].Overlap != 0 || got[39].Overlap != 0 {
		t.Errorf("after removes: %v", got)
	}
	// The removed entries linger (their FIFO entries are still queued) until a clear or a compaction.
	for _, id := range ids[1:] {
		must(t, ix.Clear(id))
	}
	if n := ix.Stats().OverflowNodes; n != 0 {
		t.Errorf("overflow nodes after clears = %d, want 0 (back inline)", n)
	}

	// A count beyond 16 bits.
	many := make([]uint64, 70000)
	for i := range many {
		many[i] = 43
	}
	must(t, ix.Store(ids[0], many))
	if got := ix.Snapshot(ids[0]); !cmp.Equal(got, []KeyCount{{42, 1}, {43, 70000}}) {
		t.Errorf("snapshot = %v", got)
	}
	must(t, ix.Remove(ids[0], many[:69999]))
	if got := ix.Snapshot(ids[0]); !cmp.Equal(got, []KeyCount{{42, 1}, {43, 1}}) {
		t.Errorf("snapshot = %v", got)
	}

	// 300 remove/store cycles of one key pile up pending FIFO entries (beyond 7 bits); FIFO order
	// must still see the key as the youngest.
	for range 300 {
		must(t, ix.Remove(ids[1], []uint64{42, 42}))
		must(t, ix.Store(ids[1], []uint64{42}))
	}
	must(t, ix.Store(ids[1], []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9}))
	if got := ix.Snapshot(ids[1]); len(got) != 10 || got[9].Key != 42 {
		t.Fatalf("snapshot = %v", got)
	}
	must(t, ix.Store(ids[1], []uint64{100}))
	if got := ix.Snapshot(ids[1]); len(got) != 10 || got[9].Key != 100 || got[0].Key != 1 {
		t.Errorf("after retiring the oldest: %v", got)
	}
	must(t, ix.Store(ids[1], []uint64{101, 102, 103, 104, 105, 106, 107, 108, 109}))
	for _, kc := range ix.Snapshot(ids[1]) {
		if kc.Key < 100 {
			t.Errorf("key %d survived 10 younger stores", kc.Key)
		}
	}
}

func TestMask(t *testing.T) {
	m := MaskOf(0, 63, 64, 255, 256, 1000)
	if m.Len() != 4 || !m.Has(255) || m.Has(256) || m.Has(1) {
		t.Errorf("mask %v", m)
	}
	m.Clear(63)
	m.Clear(999)
	if got := m.IDs(nil); !cmp.Equal(got, []EndpointID{0, 64, 255}) {
		t.Errorf("ids %v", got)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestAgedIsRetirementOrder: Aged lists each resident key once, oldest first, a re-stored key at
// its newest store, which is the order the capacity cap retires keys in.
func TestAgedIsRetirementOrder(t *testing.T) {
	ix := New(Config{CapacityPerEndpoint: 4})
	ep, _ := ix.AddEndpoint("a")
	_ = ix.Store(ep, []uint64{1, 2, 3})
	_ = ix.Remove(ep, []uint64{2}) // not the head: its FIFO entry stays, dead
	_ = ix.Store(ep, []uint64{2, 4, 4})
	keys := func() []uint64 {
		var out []uint64
		for _, kc := range ix.Aged(ep) {
			out = append(out, kc.Key)
		}
		return out
	}
	if got := keys(); !slices.Equal(got, []uint64{1, 3, 2, 4}) {
		t.Fatalf("aged %v, want [1 3 2 4]", got)
	}
	if got := ix.Aged(ep); got[3].Count != 2 {
		t.Errorf("key 4 count %d, want 2", got[3].Count)
	}
	_ = ix.Store(ep, []uint64{5, 6}) // over the cap: 1 then 3 retire
	if got := keys(); !slices.Equal(got, []uint64{2, 4, 5, 6}) {
		t.Fatalf("aged after two retirements %v, want [2 4 5 6]", got)
	}
	if ix.Aged(999) != nil {
		t.Error("unknown endpoint: want nil")
	}
}
