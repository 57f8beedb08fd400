package ingest

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvexact/kvexact/engines"
)

func sampleSnapshot() *Snapshot {
	return &Snapshot{Rule: "r1", Endpoint: "ep0", Family: "vllm", Release: "v0.26.0", Binding: BindingRouter, BlockSize: 16,
		Ranks:      []RankSeq{{Seq: 41, Digest: 0xfeedface}},
		Groups:     []GroupIndexed{{Group: 0, Indexed: true}, {Group: 1, Indexed: false}},
		Keys:       []SnapshotKey{{Key: 9, Count: 2, Age: 2}, {Key: 3, Count: 1, Age: 0}, {Key: 1 << 63, Count: 1, Age: 1}},
		Presence:   []PresenceKey{{Key: 9, Groups: 1}, {Key: 3, Groups: 3}},
		Mapped:     []MappedEntry{{EngineID: 77, Key: 9, Refs: 2, GPU: true}, {EngineID: 5, Key: 3, Refs: 1}},
		Suppressed: []uint64{12, 4},
		Tiers: []TierSnapshot{
			{Tier: engines.TierDisk, Keys: []SnapshotKey{}, Mapped: []MappedEntry{}, Suppressed: []uint64{}},
			{Tier: engines.TierCPU, Keys: []SnapshotKey{{Key: 3, Count: 2, Age: 1}, {Key: 8, Count: 1, Age: 0}},
				Mapped: []MappedEntry{{EngineID: 0xc0ffee, Key: 8, Refs: 1}}, Suppressed: []uint64{6}},
		},
	}
}

func encoded(t testing.TB, s *Snapshot) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := s.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSnapshotRoundTrip(t *testing.T) {
	s := sampleSnapshot()
	got, err := DecodeSnapshot(encoded(t, s))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) { // Encode sorted s's columns in place
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, s)
	}
	empty := &Snapshot{Rule: "r", Endpoint: "e", Family: "sglang", Binding: BindingEngine, Ranks: []RankSeq{{}}}
	got, err = DecodeSnapshot(encoded(t, empty))
	if err != nil || len(got.Keys) != 0 || len(got.Ranks) != 1 {
		t.Fatalf("empty inventory: %+v, %v", got, err)
	}
}

// TestSnapshotTruncatedAtEveryByte: each prefix is refused with the field it stopped in and an
// offset inside the data, never a panic or a partial snapshot.
func TestSnapshotTruncatedAtEveryByte(t *testing.T) {
	data := encoded(t, sampleSnapshot())
	for n := range len(data) {
		s, err := DecodeSnapshot(data[:n])
		var se *SnapshotError
		if s != nil || !errors.As(err, &se) {
			t.Fatalf("prefix of %d bytes: %v, %v; want a *SnapshotError", n, s, err)
		}
		if se.Offset < 0 || se.Offset > n || se.Field == "" {
			t.Fatalf("prefix of %d bytes: field %q offset %d", n, se.Field, se.Offset)
		}
		if !errors.Is(err, ErrSnapshot) {
			t.Fatalf("prefix of %d bytes: %v does not wrap ErrSnapshot", n, err)
		}
	}
	_, err := DecodeSnapshot(data[:len(data)-1])
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "field checksum") {
		t.Errorf("cut in the checksum: %v", err)
	}
	if _, err := DecodeSnapshot(append(append([]byte(nil), data...), 0)); err == nil || !strings.Contains(err.Error(), "after the checksum") {
		t.Errorf("trailing byte: %v", err)
	}
}

// TestSnapshotCorruptNamesFieldAndOffset pins the errors of a flipped byte in each part.
func TestSnapshotCorruptNamesFieldAndOffset(t *testing.T) {
	s := sampleSnapshot()
	data := encoded(t, s)
	keysAt := bytes.Index(data, []byte{3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0})     // the first key record (3, count 1, age 0)
	tierKeysAt := bytes.Index(data, []byte{3, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0}) // the CPU tier's first (3, count 2, age 1)
	tierMappedAt := bytes.Index(data, []byte{0xee, 0xff, 0xc0, 0, 0, 0, 0, 0, 8})           // the CPU tier's mapped record
	magicAt := bytes.Index(data, []byte(snapshotMagic)) - 1                                 // its str header
	if keysAt < 0 || tierKeysAt < 0 || tierMappedAt < 0 || magicAt < 0 {
		t.Fatal("record not found")
	}
	cpuAt := bytes.LastIndex(data[:tierKeysAt], []byte{0x94, byte(engines.TierCPU)}) + 1 // [tier, keys, mapped, suppressed]
	for _, tc := range []struct {
		name string
		at   int
		val  byte
		want string
	}{
		{"magic", magicAt + 1, 'K', "field magic at byte " + itoa(magicAt)},
		{"count_zero", keysAt + 8, 0, "field keys[0].count at byte " + itoa(keysAt+8)},
		{"key_order", keysAt, 10, "field keys[1].key at byte " + itoa(keysAt+16)},
		{"age_twice", keysAt + 12, 2, "field keys[1].age at byte " + itoa(keysAt+16+12)}, // 3 takes 9's age 2
		{"age_past_end", keysAt + 12, 3, "field keys[0].age at byte " + itoa(keysAt+12)},
		{"key_bits", keysAt + 32, 1, "field checksum"},                                  // the last key, 1<<63, becomes 1<<63+1
		{"age_bits", keysAt + 28, 1, "field keys[2].age at byte " + itoa(keysAt+32+12)}, // 9 takes 1<<63's age 1
		{"tier_gpu", cpuAt, byte(engines.TierGPU), "field tiers[0].tier at byte " + itoa(cpuAt)},
		{"tier_unknown", cpuAt, 9, "field tiers[0].tier at byte " + itoa(cpuAt)},
		{"tier_order", cpuAt, byte(engines.TierShared), "field tiers[1].tier"}, // shared before disk
		{"tier_count_zero", tierKeysAt + 8, 0, "field tiers[0].keys[0].count at byte " + itoa(tierKeysAt+8)},
		{"tier_age_twice", tierKeysAt + 12, 0, "field tiers[0].keys[1].age at byte " + itoa(tierKeysAt+16+12)},
		{"tier_key_order", tierKeysAt, 9, "field tiers[0].keys[1].key at byte " + itoa(tierKeysAt+16)},
		{"tier_mapped_gpu", tierMappedAt + 20, 2, "field tiers[0].mapped[0].gpu at byte " + itoa(tierMappedAt+20)},
		{"tier_key_bits", tierKeysAt + 17, 1, "field checksum"}, // the CPU tier's key 8 becomes 264
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := append([]byte(nil), data...)
			bad[tc.at] = tc.val
			_, err := DecodeSnapshot(bad)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	huge := &Snapshot{Rule: strings.Repeat("r", maxSnapshotName+1), Ranks: []RankSeq{{}}}
	if _, err := DecodeSnapshot(encoded(t, huge)); err == nil || !strings.Contains(err.Error(), "field rule") {
		t.Errorf("over-long rule name: %v", err)
	}
	atLimit := &Snapshot{Rule: strings.Repeat("r", maxSnapshotName), Ranks: []RankSeq{{}}}
	if _, err := DecodeSnapshot(encoded(t, atLimit)); err != nil {
		t.Errorf("rule name at the limit: %v", err)
	}
	tooManyTiers := sampleSnapshot()
	tooManyTiers.Tiers = append(tooManyTiers.Tiers, TierSnapshot{Tier: engines.TierShared}, TierSnapshot{Tier: engines.TierShared})
	if _, err := DecodeSnapshot(encoded(t, tooManyTiers)); err == nil || !strings.Contains(err.Error(), "field tiers at byte") {
		t.Errorf("four lower tiers: %v", err)
	}
	noRank := &Snapshot{Rule: "r"}
	if _, err := DecodeSnapshot(encoded(t, noRank)); err == nil || !strings.Contains(err.Error(), "field ranks") {
		t.Errorf("no rank: %v", err)
	}
}

// TestSnapshotOldLayoutRefused: a snapshot in the first layout (no ages, no lower tiers; an array
// of 15) from a peer of an earlier release is refused at its version, naming the layout read.
func TestSnapshotOldLayoutRefused(t *testing.T) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	_ = e.EncodeArrayLen(15)
	_ = e.EncodeString(snapshotMagic)
	versionAt := buf.Len()
	_ = e.EncodeUint(1)
	for _, str := range []string{"r", "e", "vllm", "v0.26.0", "router"} {
		_ = e.EncodeString(str)
	}
	_, err := DecodeSnapshot(buf.Bytes())
	if want := "field version at byte " + itoa(versionAt) + ": 1, this release reads layout 2 only"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("version 1: %v, want %q", err, want)
	}
	data := encoded(t, sampleSnapshot())
	data[0], data[1], data[2] = 0xdc, 0, 15 // the current version in an array of 15
	if _, err := DecodeSnapshot(data); err == nil || !strings.Contains(err.Error(), "field snapshot at byte 0: array of 15 elements, want 16") {
		t.Errorf("array of 15: %v", err)
	}
}

// FuzzDecodeSnapshot: any input decodes or fails with a *SnapshotError, and what decodes survives
// an encode and a decode unchanged.
func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(encoded(f, sampleSnapshot()))
	f.Add(encoded(f, &Snapshot{Rule: "r", Ranks: []RankSeq{{}}}))
	f.Add([]byte{0xdc, 0, 16})
	f.Add(encoded(f, &Snapshot{Rule: "r", Ranks: []RankSeq{{}}, Tiers: []TierSnapshot{{Tier: engines.TierCPU, Keys: []SnapshotKey{{Key: 1, Count: 1}}}}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodeSnapshot(data)
		if err != nil {
			var se *SnapshotError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a *SnapshotError", err)
			}
			return
		}
		again, err := DecodeSnapshot(encoded(t, s))
		if err != nil {
			t.Fatalf("re-encoded snapshot refused: %v", err)
		}
		if !reflect.DeepEqual(again, s) {
			t.Fatalf("round trip differs:\n got %+v\nwant %+v", again, s)
		}
	})
}
