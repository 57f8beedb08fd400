package ingest

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func sampleSnapshot() *Snapshot {
	return &Snapshot{Rule: "r1", Endpoint: "ep0", Family: "vllm", Release: "v0.26.0", Binding: BindingRouter, BlockSize: 16,
		Ranks:      []RankSeq{{Seq: 41, Digest: 0xfeedface}},
		Groups:     []GroupIndexed{{Group: 0, Indexed: true}, {Group: 1, Indexed: false}},
		Keys:       []SnapshotKey{{Key: 9, Count: 2}, {Key: 3, Count: 1}, {Key: 1 << 63, Count: 1}},
		Presence:   []PresenceKey{{Key: 9, Groups: 1}, {Key: 3, Groups: 3}},
		Mapped:     []MappedEntry{{EngineID: 77, Key: 9, Refs: 2, GPU: true}, {EngineID: 5, Key: 3, Refs: 1}},
		Suppressed: []uint64{12, 4},
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
	keysAt := bytes.Index(data, []byte{3, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}) // the first key record (3, count 1)
	if keysAt < 0 {
		t.Fatal("key record not found")
	}
	for _, tc := range []struct {
		name string
		at   int
		val  byte
		want string
	}{
		{"magic", 1, 'K', "field magic at byte 1"},
		{"count_zero", keysAt + 8, 0, "field keys[0].count at byte " + itoa(keysAt+8)},
		{"key_order", keysAt, 10, "field keys[1].key at byte " + itoa(keysAt+12)},
		{"key_bits", keysAt + 24, 1, "field checksum"}, // the last key, 1<<63, becomes 1<<63+1
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
	noRank := &Snapshot{Rule: "r"}
	if _, err := DecodeSnapshot(encoded(t, noRank)); err == nil || !strings.Contains(err.Error(), "field ranks") {
		t.Errorf("no rank: %v", err)
	}
}

// FuzzDecodeSnapshot: any input decodes or fails with a *SnapshotError, and what decodes survives
// an encode and a decode unchanged.
func FuzzDecodeSnapshot(f *testing.F) {
	f.Add(encoded(f, sampleSnapshot()))
	f.Add(encoded(f, &Snapshot{Rule: "r", Ranks: []RankSeq{{}}}))
	f.Add([]byte{0x9f})
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
