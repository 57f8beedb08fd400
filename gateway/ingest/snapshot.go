package ingest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/zeebo/xxh3"

	"github.com/kvexact/kvexact/engines"
)

// A Snapshot is one endpoint's event state as a replica holds it at one instant: the inventory's
// keys with their copy counts and age order, the binder's state that later events are read against
// (the KV-cache groups learned, the presence rule's groups per key, the router binding's engine-id
// map), each indexed lower tier's residency with its own engine-id map, and, per rank, the
// sequence of the last message applied with a digest of its payload. A replica starting may load a
// peer's snapshot instead of replaying from 0, but only once the engine's own replay shows that its
// stream continues from those sequences (seed.go): the snapshot is a speed-up, never the source of
// truth.
type Snapshot struct {
	Rule, Endpoint string
	Family         string
	Release        string
	Binding        Binding
	BlockSize      int
	Ranks          []RankSeq
	Groups         []GroupIndexed
	Keys           []SnapshotKey // strictly increasing Key; the Ages are 0..len-1
	Presence       []PresenceKey // rank 0's presence rule state; strictly increasing Key
	Mapped         []MappedEntry // router binding, rank 0; strictly increasing EngineID
	Suppressed     []uint64      // router binding, rank 0: engine ids not indexed; strictly increasing
	// Tiers holds every lower tier where the rule indexes them (Config.Tiers), none otherwise;
	// strictly increasing Tier.
	Tiers []TierSnapshot
}

// TierSnapshot is one lower tier's residency: its keys (as Snapshot.Keys) and, under the router
// binding, its own engine-id map (a tier's copy of a block has its own lifetime).
type TierSnapshot struct {
	Tier       engines.Tier
	Keys       []SnapshotKey
	Mapped     []MappedEntry
	Suppressed []uint64
}

// RankSeq is the last message a rank applied: its sequence and the xxh3 of its payload. The digest
// names the publisher's epoch: a restarted publisher reusing the sequence sends another payload.
type RankSeq struct {
	Seq    uint64
	Digest uint64
}

// GroupIndexed is one KV-cache group the binder has seen stored, and whether it is indexed.
type GroupIndexed struct {
	Group   int
	Indexed bool
}

// SnapshotKey is one resident key, its stored-copy count (at least 1) and its age: its place in
// the order the capacity cap retires keys (0 the oldest; inventory.Index.Aged), so a seeded replica
// retires the same keys as its peer.
type SnapshotKey struct {
	Key   uint64
	Count uint32
	Age   uint32
}

// PresenceKey is one key under the presence rule and the bit set of the groups holding it (not 0).
type PresenceKey struct {
	Key    uint64
	Groups uint64
}

// MappedEntry is one engine block the router binding knows.
type MappedEntry struct {
	EngineID, Key uint64
	Refs          uint32
	GPU           bool
}

// snapshotMagic opens every encoded snapshot; snapshotVersion is the layout below. Version 1
// carried neither the keys' ages nor the lower tiers; it is refused (the replica rebuilds from
// replay).
const (
	snapshotMagic   = "kvexact-inventory-snapshot"
	snapshotVersion = 2
	// Bounds on the decoded counts (the byte size is bounded by the caller: SnapshotLimits).
	maxSnapshotRanks  = 1024
	maxSnapshotGroups = 4096
	maxSnapshotName   = 1024
	maxSnapshotCount  = 1 << 16 // copies of one key: far above groups × ranks of any engine
)

// Record sizes of the snapshot's binary columns (little-endian).
const (
	keyRecord      = 16 // key u64, count u32, age u32
	presenceRecord = 16 // key u64, groups u64
	mappedRecord   = 21 // engine id u64, key u64, refs u32, gpu u8
	idRecord       = 8  // engine id u64
)

// The encoded layout is one MessagePack array of 16 elements (the encoding the engines' own events
// use, so no new format): magic, version, rule, endpoint, family, release, binding, block size,
// ranks [[seq, digest]…], groups [[group, indexed]…], four bin columns of fixed-size records
// (keys, presence, mapped, suppressed), tiers [[tier, keys, mapped, suppressed]…] with the same
// columns per lower tier, and last the xxh3 of every byte before it, so a corrupt column is
// refused as a whole rather than loaded as wrong keys.
var snapshotFields = [...]string{"magic", "version", "rule", "endpoint", "family", "release", "binding",
	"block_size", "ranks", "groups", "keys", "presence", "mapped", "suppressed", "tiers", "checksum"}

// hashWriter passes bytes on and hashes them: the checksum of a streamed snapshot.
type hashWriter struct {
	w io.Writer
	h *xxh3.Hasher
}

func (hw hashWriter) Write(b []byte) (int, error) {
	hw.h.Write(b)
	return hw.w.Write(b)
}

// Encode writes s in the snapshot layout, streaming: it holds 64 KiB of the encoding at a time,
// never the whole. The columns are sorted here, so the decoder can refuse a duplicate with one
// comparison per record.
func (s *Snapshot) Encode(w io.Writer) error {
	sortColumns(s.Keys, s.Mapped, s.Suppressed)
	slices.SortFunc(s.Presence, func(a, b PresenceKey) int { return cmpU64(a.Key, b.Key) })
	slices.SortFunc(s.Tiers, func(a, b TierSnapshot) int { return int(a.Tier) - int(b.Tier) })
	for _, t := range s.Tiers {
		sortColumns(t.Keys, t.Mapped, t.Suppressed)
	}
	hw := hashWriter{w: w, h: xxh3.New()}
	bw := bufio.NewWriterSize(hw, 64<<10)
	// The encoder writes into bw, which keeps its first error and drops what follows: checked once
	// at the flush.
	e := msgpack.NewEncoder(bw)
	_ = e.EncodeArrayLen(len(snapshotFields))
	_ = e.EncodeString(snapshotMagic)
	_ = e.EncodeUint(snapshotVersion)
	for _, str := range []string{s.Rule, s.Endpoint, s.Family, s.Release, string(s.Binding)} {
		_ = e.EncodeString(str)
	}
	_ = e.EncodeInt(int64(s.BlockSize))
	_ = e.EncodeArrayLen(len(s.Ranks))
	for _, r := range s.Ranks {
		_ = e.EncodeArrayLen(2)
		_ = e.EncodeUint(r.Seq)
		_ = e.EncodeUint(r.Digest)
	}
	_ = e.EncodeArrayLen(len(s.Groups))
	for _, g := range s.Groups {
		_ = e.EncodeArrayLen(2)
		_ = e.EncodeInt(int64(g.Group))
		_ = e.EncodeBool(g.Indexed)
	}
	var rec [mappedRecord]byte
	writeKeys(e, bw, s.Keys)
	_ = e.EncodeBytesLen(len(s.Presence) * presenceRecord)
	for _, p := range s.Presence {
		binary.LittleEndian.PutUint64(rec[:], p.Key)
		binary.LittleEndian.PutUint64(rec[8:], p.Groups)
		bw.Write(rec[:presenceRecord])
	}
	writeMapped(e, bw, s.Mapped, s.Suppressed)
	_ = e.EncodeArrayLen(len(s.Tiers))
	for _, t := range s.Tiers {
		_ = e.EncodeArrayLen(4)
		_ = e.EncodeUint(uint64(t.Tier))
		writeKeys(e, bw, t.Keys)
		writeMapped(e, bw, t.Mapped, t.Suppressed)
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return msgpack.NewEncoder(w).EncodeUint(hw.h.Sum64())
}

func sortColumns(keys []SnapshotKey, mapped []MappedEntry, suppressed []uint64) {
	slices.SortFunc(keys, func(a, b SnapshotKey) int { return cmpU64(a.Key, b.Key) })
	slices.SortFunc(mapped, func(a, b MappedEntry) int { return cmpU64(a.EngineID, b.EngineID) })
	slices.Sort(suppressed)
}

func writeKeys(e *msgpack.Encoder, bw *bufio.Writer, keys []SnapshotKey) {
	var rec [keyRecord]byte
	_ = e.EncodeBytesLen(len(keys) * keyRecord)
	for _, k := range keys {
		binary.LittleEndian.PutUint64(rec[:], k.Key)
		binary.LittleEndian.PutUint32(rec[8:], k.Count)
		binary.LittleEndian.PutUint32(rec[12:], k.Age)
		bw.Write(rec[:])
	}
}

func writeMapped(e *msgpack.Encoder, bw *bufio.Writer, mapped []MappedEntry, suppressed []uint64) {
	var rec [mappedRecord]byte
	_ = e.EncodeBytesLen(len(mapped) * mappedRecord)
	for _, m := range mapped {
		binary.LittleEndian.PutUint64(rec[:], m.EngineID)
		binary.LittleEndian.PutUint64(rec[8:], m.Key)
		binary.LittleEndian.PutUint32(rec[16:], m.Refs)
		rec[20] = 0
		if m.GPU {
			rec[20] = 1
		}
		bw.Write(rec[:])
	}
	_ = e.EncodeBytesLen(len(suppressed) * idRecord)
	for _, id := range suppressed {
		binary.LittleEndian.PutUint64(rec[:], id)
		bw.Write(rec[:idRecord])
	}
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ErrSnapshot wraps every decoding error; the message names the field and the byte offset.
var ErrSnapshot = errors.New("ingest: bad snapshot")

// SnapshotError is a decoding error: the field being read and the byte offset where it starts
// (or, in a column, where the offending record starts).
type SnapshotError struct {
	Field  string
	Offset int
	Err    error
}

func (e *SnapshotError) Error() string {
	return fmt.Sprintf("%v: field %s at byte %d: %v", ErrSnapshot, e.Field, e.Offset, e.Err)
}
func (e *SnapshotError) Unwrap() []error { return []error{ErrSnapshot, e.Err} }

// snapReader reads the layout from a bytes.Reader, which msgpack reads without buffering, so the
// offset of every field is exact.
type snapReader struct {
	data  []byte
	r     *bytes.Reader
	d     *msgpack.Decoder
	field string
	at    int
}

func (sr *snapReader) off() int { return len(sr.data) - sr.r.Len() }

func (sr *snapReader) begin(field string) { sr.field, sr.at = field, sr.off() }

func (sr *snapReader) fail(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return &SnapshotError{Field: sr.field, Offset: sr.at, Err: err}
}

func (sr *snapReader) failAt(field string, off int, format string, args ...any) error {
	return &SnapshotError{Field: field, Offset: off, Err: fmt.Errorf(format, args...)}
}

func (sr *snapReader) str(field string) (string, error) {
	sr.begin(field)
	n, err := sr.d.DecodeBytesLen()
	if err != nil {
		return "", sr.fail(err)
	}
	if n < 0 || n > maxSnapshotName {
		return "", sr.fail(fmt.Errorf("string of %d bytes, want at most %d", n, maxSnapshotName))
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(sr.r, b); err != nil {
		return "", sr.fail(err)
	}
	return string(b), nil
}

func (sr *snapReader) uint(field string) (uint64, error) {
	sr.begin(field)
	v, err := sr.d.DecodeUint64()
	if err != nil {
		return 0, sr.fail(err)
	}
	return v, nil
}

func (sr *snapReader) arrayLen(field string, limit int) (int, error) {
	sr.begin(field)
	n, err := sr.d.DecodeArrayLen()
	if err != nil {
		return 0, sr.fail(err)
	}
	if n < 0 || n > limit {
		return 0, sr.fail(fmt.Errorf("%d elements, want at most %d", n, limit))
	}
	return n, nil
}

// column reads a bin column of records of size rec without copying it, and returns it with the
// offset of its first byte.
func (sr *snapReader) column(field string, rec int) ([]byte, int, error) {
	sr.begin(field)
	n, err := sr.d.DecodeBytesLen()
	if err != nil {
		return nil, 0, sr.fail(err)
	}
	if n < 0 || n > sr.r.Len() {
		return nil, 0, sr.fail(fmt.Errorf("announces %d bytes, %d remain: truncated", n, sr.r.Len()))
	}
	if n%rec != 0 {
		return nil, 0, sr.fail(fmt.Errorf("%d bytes is not a whole number of %d-byte records", n, rec))
	}
	start := sr.off()
	col := sr.data[start : start+n]
	if _, err := sr.r.Seek(int64(n), io.SeekCurrent); err != nil {
		return nil, 0, sr.fail(err)
	}
	return col, start, nil
}

// keys reads a keys column: counts 1..maxSnapshotCount, keys strictly increasing, ages a
// permutation of 0..n-1.
func (sr *snapReader) keys(field string) ([]SnapshotKey, error) {
	col, at, err := sr.column(field, keyRecord)
	if err != nil {
		return nil, err
	}
	keys := make([]SnapshotKey, len(col)/keyRecord)
	aged := make([]uint64, (len(keys)+63)/64) // bit set of the ages seen
	for i := range keys {
		r := col[i*keyRecord:]
		k := SnapshotKey{Key: binary.LittleEndian.Uint64(r), Count: binary.LittleEndian.Uint32(r[8:]), Age: binary.LittleEndian.Uint32(r[12:])}
		off := at + i*keyRecord
		if k.Count == 0 || k.Count > maxSnapshotCount {
			return nil, sr.failAt(fmt.Sprintf("%s[%d].count", field, i), off+8, "%d, want 1..%d", k.Count, maxSnapshotCount)
		}
		if i > 0 && k.Key <= keys[i-1].Key {
			return nil, sr.failAt(fmt.Sprintf("%s[%d].key", field, i), off, "%d after %d: keys must strictly increase", k.Key, keys[i-1].Key)
		}
		if int64(k.Age) >= int64(len(keys)) || aged[k.Age/64]&(1<<(k.Age%64)) != 0 {
			return nil, sr.failAt(fmt.Sprintf("%s[%d].age", field, i), off+12, "%d: want each of 0..%d once", k.Age, len(keys)-1)
		}
		aged[k.Age/64] |= 1 << (k.Age % 64)
		keys[i] = k
	}
	return keys, nil
}

// mapped reads a router binding's mapped and suppressed columns; prefix names their owner.
func (sr *snapReader) mapped(prefix string) ([]MappedEntry, []uint64, error) {
	field := prefix + "mapped"
	col, at, err := sr.column(field, mappedRecord)
	if err != nil {
		return nil, nil, err
	}
	mapped := make([]MappedEntry, len(col)/mappedRecord)
	for i := range mapped {
		r := col[i*mappedRecord:]
		m := MappedEntry{EngineID: binary.LittleEndian.Uint64(r), Key: binary.LittleEndian.Uint64(r[8:]),
			Refs: binary.LittleEndian.Uint32(r[16:])}
		off := at + i*mappedRecord
		switch r[20] {
		case 0:
		case 1:
			m.GPU = true
		default:
			return nil, nil, sr.failAt(fmt.Sprintf("%s[%d].gpu", field, i), off+20, "%d, want 0 or 1", r[20])
		}
		if i > 0 && m.EngineID <= mapped[i-1].EngineID {
			return nil, nil, sr.failAt(fmt.Sprintf("%s[%d].engine_id", field, i), off, "%d after %d: ids must strictly increase", m.EngineID, mapped[i-1].EngineID)
		}
		mapped[i] = m
	}
	field = prefix + "suppressed"
	if col, at, err = sr.column(field, idRecord); err != nil {
		return nil, nil, err
	}
	suppressed := make([]uint64, len(col)/idRecord)
	for i := range suppressed {
		id := binary.LittleEndian.Uint64(col[i*idRecord:])
		if i > 0 && id <= suppressed[i-1] {
			return nil, nil, sr.failAt(fmt.Sprintf("%s[%d]", field, i), at+i*idRecord, "%d after %d: ids must strictly increase", id, suppressed[i-1])
		}
		suppressed[i] = id
	}
	return mapped, suppressed, nil
}

// DecodeSnapshot reads one snapshot. Any flaw (another layout version, truncation, a wrong type,
// a count over its bound, a zero count, a duplicate or unsorted record, ages that are not each of
// 0..n-1 once, a tier that is not a lower tier or out of order, trailing bytes, a checksum that
// does not match) is an error naming the field and the byte offset; nothing of a flawed snapshot
// is returned.
func DecodeSnapshot(data []byte) (*Snapshot, error) {
	sr := &snapReader{data: data, r: bytes.NewReader(data)}
	sr.d = msgpack.NewDecoder(sr.r)
	n, err := sr.arrayLen("snapshot", 64)
	if err != nil {
		return nil, err
	}
	magic, err := sr.str("magic")
	if err != nil {
		return nil, err
	}
	if magic != snapshotMagic {
		return nil, sr.fail(fmt.Errorf("%q, want %q", magic, snapshotMagic))
	}
	v, err := sr.uint("version")
	if err != nil {
		return nil, err
	}
	if v != snapshotVersion {
		return nil, sr.fail(fmt.Errorf("%d, this release reads layout %d only (a peer of another release: rebuild from replay)", v, snapshotVersion))
	}
	if n != len(snapshotFields) {
		return nil, sr.failAt("snapshot", 0, "array of %d elements, want %d", n, len(snapshotFields))
	}
	s := &Snapshot{}
	names := []*string{&s.Rule, &s.Endpoint, &s.Family, &s.Release, nil}
	for i, p := range names {
		str, err := sr.str(snapshotFields[2+i])
		if err != nil {
			return nil, err
		}
		if p == nil {
			s.Binding = Binding(str)
		} else {
			*p = str
		}
	}
	sr.begin("block_size")
	bs, err := sr.d.DecodeInt64()
	if err != nil {
		return nil, sr.fail(err)
	}
	if bs < 0 || bs > 1<<20 {
		return nil, sr.fail(fmt.Errorf("%d, want 0..%d", bs, 1<<20))
	}
	s.BlockSize = int(bs)
	nr, err := sr.arrayLen("ranks", maxSnapshotRanks)
	if err != nil {
		return nil, err
	}
	if nr == 0 {
		return nil, sr.fail(errors.New("no rank"))
	}
	for i := range nr {
		f := fmt.Sprintf("ranks[%d]", i)
		if m, err := sr.arrayLen(f, 2); err != nil {
			return nil, err
		} else if m != 2 {
			return nil, sr.fail(fmt.Errorf("%d elements, want 2 [seq, digest]", m))
		}
		seq, err := sr.uint(f + ".seq")
		if err != nil {
			return nil, err
		}
		dg, err := sr.uint(f + ".digest")
		if err != nil {
			return nil, err
		}
		s.Ranks = append(s.Ranks, RankSeq{Seq: seq, Digest: dg})
	}
	ng, err := sr.arrayLen("groups", maxSnapshotGroups)
	if err != nil {
		return nil, err
	}
	for i := range ng {
		f := fmt.Sprintf("groups[%d]", i)
		if m, err := sr.arrayLen(f, 2); err != nil {
			return nil, err
		} else if m != 2 {
			return nil, sr.fail(fmt.Errorf("%d elements, want 2 [group, indexed]", m))
		}
		sr.begin(f + ".group")
		g, err := sr.d.DecodeInt64()
		if err != nil {
			return nil, sr.fail(err)
		}
		if g < 0 || g > 1<<20 {
			return nil, sr.fail(fmt.Errorf("%d, want 0..%d", g, 1<<20))
		}
		sr.begin(f + ".indexed")
		ix, err := sr.d.DecodeBool()
		if err != nil {
			return nil, sr.fail(err)
		}
		s.Groups = append(s.Groups, GroupIndexed{Group: int(g), Indexed: ix})
	}
	if s.Keys, err = sr.keys("keys"); err != nil {
		return nil, err
	}
	col, at, err := sr.column("presence", presenceRecord)
	if err != nil {
		return nil, err
	}
	s.Presence = make([]PresenceKey, len(col)/presenceRecord)
	for i := range s.Presence {
		r := col[i*presenceRecord:]
		p := PresenceKey{Key: binary.LittleEndian.Uint64(r), Groups: binary.LittleEndian.Uint64(r[8:])}
		off := at + i*presenceRecord
		if p.Groups == 0 {
			return nil, sr.failAt(fmt.Sprintf("presence[%d].groups", i), off+8, "0, want at least one group")
		}
		if i > 0 && p.Key <= s.Presence[i-1].Key {
			return nil, sr.failAt(fmt.Sprintf("presence[%d].key", i), off, "%d after %d: keys must strictly increase", p.Key, s.Presence[i-1].Key)
		}
		s.Presence[i] = p
	}
	if s.Mapped, s.Suppressed, err = sr.mapped(""); err != nil {
		return nil, err
	}
	nt, err := sr.arrayLen("tiers", len(engines.LowerTiers))
	if err != nil {
		return nil, err
	}
	for i := range nt {
		f := fmt.Sprintf("tiers[%d]", i)
		if m, err := sr.arrayLen(f, 4); err != nil {
			return nil, err
		} else if m != 4 {
			return nil, sr.fail(fmt.Errorf("%d elements, want 4 [tier, keys, mapped, suppressed]", m))
		}
		tv, err := sr.uint(f + ".tier")
		if err != nil {
			return nil, err
		}
		if !slices.Contains(engines.LowerTiers, engines.Tier(min(tv, 255))) {
			return nil, sr.fail(fmt.Errorf("%d is not a lower tier", tv))
		}
		t := TierSnapshot{Tier: engines.Tier(tv)}
		if i > 0 && t.Tier <= s.Tiers[i-1].Tier {
			return nil, sr.fail(fmt.Errorf("%s after %s: tiers must strictly increase", t.Tier, s.Tiers[i-1].Tier))
		}
		if t.Keys, err = sr.keys(f + ".keys"); err != nil {
			return nil, err
		}
		if t.Mapped, t.Suppressed, err = sr.mapped(f + "."); err != nil {
			return nil, err
		}
		s.Tiers = append(s.Tiers, t)
	}
	body := sr.off()
	sum, err := sr.uint("checksum")
	if err != nil {
		return nil, err
	}
	if want := xxh3.Hash(data[:body]); sum != want {
		return nil, sr.failAt("checksum", body, "%#x, the %d bytes before it hash to %#x: corrupt", sum, body, want)
	}
	if sr.r.Len() != 0 {
		return nil, sr.failAt("snapshot", sr.off(), "%d bytes after the checksum", sr.r.Len())
	}
	return s, nil
}
