// Package hashcore turns a prompt's token ids into the 64-bit block keys an engine (or the gateway's
// own router binding) publishes, bit for bit. It has two implementations behind one API: the C core
// (cgo, one call per prompt) and the Go reference (clear, the oracle the C core is fuzzed against).
package hashcore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Algorithm names a hash binding: how a block's pre-image is serialized and digested.
type Algorithm string

// The algorithms the hash core implements.
const (
	// VLLMSHA256 is pickle protocol 5 + SHA-256, vLLM's default --prefix-caching-hash-algo.
	VLLMSHA256 Algorithm = "sha256"
	// VLLMSHA256CBOR is canonical CBOR + SHA-256.
	VLLMSHA256CBOR Algorithm = "sha256_cbor"
	// VLLMXXHash is pickle protocol 5 + XXH3-128.
	VLLMXXHash Algorithm = "xxhash"
	// VLLMXXHashCBOR is canonical CBOR + XXH3-128.
	VLLMXXHashCBOR Algorithm = "xxhash_cbor"
	// VLLMSHA256MsgPack is MessagePack (msgspec's encoding: shortest heads, bin for bytes, one array
	// type for tuples and lists) + SHA-256.
	VLLMSHA256MsgPack Algorithm = "sha256_msgpack"
	// VLLMXXHashMsgPack is MessagePack + XXH3-128.
	VLLMXXHashMsgPack Algorithm = "xxhash_msgpack"
	// SGLangSHA256 is SGLang's page hash: SHA-256(prior digest ‖ u32le tokens), first 8 bytes as int64.
	SGLangSHA256 Algorithm = "sglang_sha256"
	// RouterXXH3V1 is the gateway's own router key (DESIGN.md Decisions):
	// key_i = XXH3-64(le64(key_{i-1}) ‖ le32(token)… ‖ canonical CBOR(extras)), key_{-1} = 0.
	RouterXXH3V1 Algorithm = "kvexact-xxh3-v1"
)

// Algorithms lists every algorithm in a stable order (for flags, docs and tests).
var Algorithms = []Algorithm{VLLMSHA256, VLLMSHA256CBOR, VLLMXXHash, VLLMXXHashCBOR, VLLMSHA256MsgPack, VLLMXXHashMsgPack, SGLangSHA256, RouterXXH3V1}

// MaxBlockSize is the largest block size the hash core accepts.
const MaxBlockSize = 4096

// IsVLLM reports whether a is one of vLLM's algorithms (they need a seed).
func (a Algorithm) IsVLLM() bool {
	switch a {
	case VLLMSHA256, VLLMSHA256CBOR, VLLMXXHash, VLLMXXHashCBOR, VLLMSHA256MsgPack, VLLMXXHashMsgPack:
		return true
	}
	return false
}

// SaltedRoot reports whether a roots a salted request's chain at its cache_salt (RootFor) instead of
// carrying the salt in block 0's extra keys.
func (a Algorithm) SaltedRoot() bool { return a == SGLangSHA256 }

// pickle reports whether a serializes with pickle protocol 5 (else CBOR or raw bytes).
func (a Algorithm) pickle() bool { return a == VLLMSHA256 || a == VLLMXXHash }

// msgpack reports whether a serializes with MessagePack.
func (a Algorithm) msgpack() bool { return a == VLLMSHA256MsgPack || a == VLLMXXHashMsgPack }

// DigestLen is the length of one block digest in bytes: 32 for SHA-256, 16 for XXH3-128, 8 for the
// router key (le64 of the key), 0 for an unknown algorithm.
func (a Algorithm) DigestLen() int {
	switch a {
	case VLLMSHA256, VLLMSHA256CBOR, VLLMSHA256MsgPack, SGLangSHA256:
		return 32
	case VLLMXXHash, VLLMXXHashCBOR, VLLMXXHashMsgPack:
		return 16
	case RouterXXH3V1:
		return 8
	}
	return 0
}

// Validate returns an error naming a when it is not a known algorithm.
func (a Algorithm) Validate() error {
	if a.DigestLen() == 0 {
		return fmt.Errorf("hashcore: unknown algorithm %q (want one of sha256, sha256_cbor, xxhash, xxhash_cbor, sha256_msgpack, xxhash_msgpack, sglang_sha256, kvexact-xxh3-v1)", string(a))
	}
	return nil
}

// KeyOf is the 64-bit key published for a full digest: vLLM the last 8 bytes big-endian, SGLang the
// first 8 bytes big-endian (the bit pattern of its signed int64), router the little-endian key.
func (a Algorithm) KeyOf(digest []byte) uint64 {
	switch a {
	case SGLangSHA256:
		return binary.BigEndian.Uint64(digest[:8])
	case RouterXXH3V1:
		return binary.LittleEndian.Uint64(digest)
	}
	return binary.BigEndian.Uint64(digest[len(digest)-8:])
}

// SGLangInt64 converts a key to the signed int64 SGLang publishes in its events.
func SGLangInt64(key uint64) int64 { return int64(key) }

// KeyFromInt64 converts an SGLang-published int64 to the key bit pattern Keys returns.
func KeyFromInt64(v int64) uint64 { return uint64(v) }

// ErrNoSeed is returned for a vLLM binding without a PYTHONHASHSEED.
var ErrNoSeed = errors.New("vLLM hashes are random per process without PYTHONHASHSEED: set the binding's seed to the engine's PYTHONHASHSEED string")

// Binding says how a prompt's tokens become keys.
type Binding struct {
	// Algorithm is the hash binding.
	Algorithm Algorithm
	// BlockSize is the (hash) block size in tokens, 1..4096. For SGLang it is the page size; for
	// bigram mode it counts bigram units.
	BlockSize int
	// Seed is vLLM's PYTHONHASHSEED string, used verbatim ("042" ≠ "42"; "" is valid). nil is an
	// error for vLLM (the engine's root would be random). SGLang and router bindings take no seed:
	// a non-nil Seed is an error there, so a misconfigured rule is caught rather than ignored.
	Seed *string
	// Bigram selects SGLang's EAGLE bigram pages (unit j = t[j], t[j+1]). SGLang only.
	Bigram bool
	// TaggedExtraKeys is vLLM's extra-key layout of the released v0.31.0 package: every extra key a
	// tuple led by its kind (("cache_salt", salt), ("mm", id, offset), ("prompt_embeds", digest),
	// ("lora", name, path)) instead of the bare values earlier releases hash. The release's contract
	// says which (contracts.Contract.ExtraKeyTags).
	TaggedExtraKeys bool
}

// Validate returns an error naming the offending field and value.
func (b Binding) Validate() error {
	if err := b.Algorithm.Validate(); err != nil {
		return err
	}
	if b.BlockSize < 1 || b.BlockSize > MaxBlockSize {
		return fmt.Errorf("hashcore: block size %d out of range 1..%d", b.BlockSize, MaxBlockSize)
	}
	if b.Algorithm.IsVLLM() {
		if b.Seed == nil {
			return fmt.Errorf("hashcore: %s: %w", b.Algorithm, ErrNoSeed)
		}
		if !utf8.ValidString(*b.Seed) {
			return fmt.Errorf("hashcore: seed %q is not valid UTF-8 (PYTHONHASHSEED is a Python str)", *b.Seed)
		}
	} else if b.Seed != nil {
		return fmt.Errorf("hashcore: %s takes no seed (got %q); only vLLM bindings are seeded", b.Algorithm, *b.Seed)
	}
	if b.Bigram && b.Algorithm != SGLangSHA256 {
		return fmt.Errorf("hashcore: bigram pages are an SGLang mode, not valid with %s", b.Algorithm)
	}
	return nil
}

// Extras are the request fields that enter vLLM's per-block extra keys, SGLang's cache_salt root and
// the router key's extras. A nil *Extras means none.
type Extras struct {
	// LoRAName is the served adapter name ("" = no LoRA). vLLM hashes it in every block; SGLang does
	// not hash it at all.
	LoRAName string
	// CacheSalt is the request's cache_salt ("" = none). vLLM: block 0's extra keys; SGLang: the
	// page-0 prior SHA-256("sglang-cache-salt-v1\x00" ‖ salt).
	CacheSalt string
	// MM are the multimodal items, sorted by Offset (vLLM assumes so). vLLM only; SGLang sees images
	// as pad token ids in the tokens, so MM with SGLang is an error.
	MM []MMFeature
	// PromptEmbeds holds the raw bytes of each prompt-embedding row, one per prompt token; nil means
	// the request had no prompt_embeds. vLLM hashes SHA-256 of the block's concatenated rows.
	PromptEmbeds [][]byte
}

// MMFeature is one multimodal item: its identifier (the processor mm hash or user uuid) and its
// placeholder span in the prompt.
type MMFeature struct {
	Identifier string
	Offset     int
	Length     int
}

// Impl selects an implementation.
type Impl int

// The implementations.
const (
	// ImplGo is the Go reference.
	ImplGo Impl = iota + 1
	// ImplC is the C core; it exists only in builds with cgo.
	ImplC
)

// String names the implementation ("go", "c").
func (i Impl) String() string {
	switch i {
	case ImplGo:
		return "go"
	case ImplC:
		return "c"
	}
	return fmt.Sprintf("Impl(%d)", int(i))
}

// ErrNoC is returned when ImplC is asked for in a build without the C core.
var ErrNoC = errors.New("hashcore: C core not built (built without cgo)")

// Available reports whether the implementation is present in this build.
func (i Impl) Available() bool {
	switch i {
	case ImplGo:
		return true
	case ImplC:
		return cChain != nil && cRoot != nil
	}
	return false
}

// Default is the C core when the build has it, else the Go reference.
func Default() Impl {
	if ImplC.Available() {
		return ImplC
	}
	return ImplGo
}

// ---------------------------------------------------------------------------------------------
// The seam between this file's Go wrapper and the C core (filled in by the cgo-tagged file).
//
// The wrapper validates everything, builds each block's extra-key VALUES (ExtraKeys, or the decode
// variant for Sequence), and packs them with packExtras into the compact typed encoding below. The C
// side serializes them itself (CBOR or pickle, independently of the Go reference, so the
// differential fuzz is meaningful), hashes, and fills Digests and Keys for all NumBlocks blocks in ONE
// cgo call. It never allocates Go memory; it may keep a per-thread buffer.
//
// chainRequest fields, as the C side must read them:
//   Algo       one of the six Algorithm values.
//   BlockSize  1..4096 (already validated).
//   Bigram     SGLang EAGLE mode: unit j = (Tokens[j], Tokens[j+1]), 8 bytes per unit; block b uses
//              units b*BlockSize .. b*BlockSize+BlockSize-1.
//   Parent     the digest block 0 of THIS call chains on: vLLM NONE_HASH or the previous block's full
//              digest (32 or 16 bytes); SGLang nil (no prior) or 32 bytes (salt root / previous page);
//              router the 8-byte le64 of the parent key (8 zero bytes at the root). Never the u64 form.
//   Tokens     token ids starting at block 0 of this call (may hold a trailing partial block, and for
//              bigram one extra token).
//   NumBlocks  number of full blocks to hash (the wrapper computes it; C must not hash more).
//   Extras     nil: every block's extra keys are None/absent. Else, for each of the NumBlocks blocks
//              in order: u32le n (0 = None, vLLM CBOR null / pickle NONE; router: no extras bytes),
//              then n items; an item is one tag byte and a payload:
//                0x01 str    u32le len, UTF-8 bytes
//                0x02 bytes  u32le len, bytes
//                0x03 int    i64le (may be negative: mm offsets)
//                0x04 tuple  u32le n, then n items
//              SGLang never has extras (the salt is already in Parent).
//   Digests    out, len NumBlocks*Algo.DigestLen(): block digests (router: le64(key)); nil asks for
//              keys only.
//   Keys       out, len NumBlocks: Algo.KeyOf(digest) for each block.
//   Preimage0  out, optional: when non-nil and NumBlocks > 0, C sets *Preimage0 to a Go-owned copy of
//              block 0's exact pre-image bytes (debugging and parity: first_block_preimage_hex).
//
// cRoot(algo, s) returns, for vLLM algorithms, H(serialize(str s)) — NONE_HASH for PYTHONHASHSEED s
// (CBOR text string or pickled str); for SGLangSHA256, SHA-256("sglang-cache-salt-v1\x00" ‖ s).
// It is never called for the router algorithm or for an unsalted SGLang request.
//
// Both return an error (never panic) on anything they cannot do.
// ---------------------------------------------------------------------------------------------

type chainRequest struct {
	Algo      Algorithm
	BlockSize int
	Bigram    bool
	Parent    []byte
	Tokens    []uint32
	NumBlocks int
	Extras    []byte
	Digests   []byte
	Keys      []uint64
	Preimage0 *[]byte
}

// cChain and cRoot are set by the cgo file's init; nil in builds without cgo.
var (
	cChain func(req *chainRequest) error
	cRoot  func(algo Algorithm, s string) ([]byte, error)
)

// Hasher computes the keys of one binding. It is built once per binding (the vLLM root digest is
// computed at construction) and is safe for concurrent use.
type Hasher struct {
	b    Binding
	impl Impl
	root []byte // vLLM NONE_HASH; nil for SGLang (unsalted); le64(0) for the router
}

// New validates b and builds a Hasher for it with the chosen implementation.
func New(b Binding, impl Impl) (*Hasher, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	if !impl.Available() {
		if impl == ImplC {
			return nil, ErrNoC
		}
		return nil, fmt.Errorf("hashcore: unknown implementation %d", int(impl))
	}
	h := &Hasher{b: b, impl: impl}
	switch {
	case b.Algorithm.IsVLLM():
		r, err := h.rootDigest(*b.Seed)
		if err != nil {
			return nil, err
		}
		h.root = r
	case b.Algorithm == RouterXXH3V1:
		h.root = make([]byte, 8)
	}
	return h, nil
}

// Binding returns the binding the Hasher was built for.
func (h *Hasher) Binding() Binding { return h.b }

// Impl returns the implementation the Hasher uses.
func (h *Hasher) Impl() Impl { return h.impl }

// Root returns the digest block 0 chains on for a request without extras: vLLM's NONE_HASH, nil for
// SGLang (no prior), le64(0) for the router. The caller must not modify it.
func (h *Hasher) Root() []byte { return h.root }

// RootFor returns the digest block 0 chains on for a request with ex: as Root, except that an SGLang
// request with a cache_salt chains on the salt root.
func (h *Hasher) RootFor(ex *Extras) ([]byte, error) {
	if h.b.Algorithm == SGLangSHA256 && ex != nil && ex.CacheSalt != "" {
		return h.rootDigest(ex.CacheSalt)
	}
	return h.root, nil
}

func (h *Hasher) rootDigest(s string) ([]byte, error) {
	if h.impl == ImplC {
		return cRoot(h.b.Algorithm, s)
	}
	return goRoot(h.b.Algorithm, s)
}

// numBlocks is the number of full blocks n tokens make under b.
func (b Binding) numBlocks(n int) int {
	if b.Bigram {
		if n < 1 {
			return 0
		}
		return (n - 1) / b.BlockSize
	}
	return n / b.BlockSize
}

// NumBlocks is the number of full blocks a prompt of n tokens has (bigram: (n-1)/BlockSize).
func (h *Hasher) NumBlocks(n int) int { return h.b.numBlocks(n) }

// checkExtras rejects extras the algorithm cannot represent.
func (h *Hasher) checkExtras(ex *Extras) error {
	if err := ex.validate(); err != nil {
		return err
	}
	if ex != nil && h.b.TaggedExtraKeys && ex.LoRAName != "" {
		return fmt.Errorf("hashcore: LoRA %q: this release hashes the adapter's path with its name, which the request does not carry", ex.LoRAName)
	}
	if ex == nil || h.b.Algorithm != SGLangSHA256 {
		return nil
	}
	if len(ex.MM) > 0 {
		return fmt.Errorf("hashcore: sglang_sha256: multimodal items (%d) are not hashed by SGLang as extra keys; put the pad token ids in the tokens instead", len(ex.MM))
	}
	if ex.PromptEmbeds != nil {
		return errors.New("hashcore: sglang_sha256: prompt embeds are not supported by SGLang page hashes")
	}
	return nil
}

// blockExtras returns the per-block extra-key values for blocks [first, first+n) of a prompt of
// numTokens tokens, one-shot (prompt) semantics.
func (h *Hasher) blockExtras(ex *Extras, numTokens int) ([][]any, error) {
	if h.b.Algorithm == SGLangSHA256 || ex.none() {
		return nil, nil // not a nil entry per block: 24 bytes each, 150 KB for a 100k-token prompt
	}
	if err := ex.validate(); err != nil {
		return nil, err
	}
	return ex.blockRange(0, numTokens/h.b.BlockSize, h.b.BlockSize, h.b.TaggedExtraKeys), nil
}

// Keys returns the keys of all full blocks of a prompt, appended to dst[:0].
func (h *Hasher) Keys(tokens []uint32, ex *Extras, dst []uint64) ([]uint64, error) {
	_, keys, err := h.run(tokens, ex, dst, false, nil)
	return keys, err
}

// Digests returns the full digests and the keys of all full blocks of a prompt.
func (h *Hasher) Digests(tokens []uint32, ex *Extras) (digests [][]byte, keys []uint64, err error) {
	flat, keys, err := h.run(tokens, ex, nil, true, nil)
	if err != nil {
		return nil, nil, err
	}
	return splitDigests(flat, h.b.Algorithm.DigestLen()), keys, nil
}

// FirstPreimage returns the exact bytes hashed for block 0 of a prompt (the vectors'
// first_block_preimage_hex); an error when the prompt has no full block.
func (h *Hasher) FirstPreimage(tokens []uint32, ex *Extras) ([]byte, error) {
	if h.b.numBlocks(len(tokens)) == 0 {
		return nil, fmt.Errorf("hashcore: no full block in %d tokens (block size %d)", len(tokens), h.b.BlockSize)
	}
	var pre []byte
	if _, _, err := h.run(tokens, ex, nil, false, &pre); err != nil {
		return nil, err
	}
	return pre, nil
}

func (h *Hasher) run(tokens []uint32, ex *Extras, dst []uint64, wantDigests bool, pre *[]byte) ([]byte, []uint64, error) {
	if err := h.checkExtras(ex); err != nil {
		return nil, nil, err
	}
	parent, err := h.RootFor(ex)
	if err != nil {
		return nil, nil, err
	}
	extras, err := h.blockExtras(ex, len(tokens))
	if err != nil {
		return nil, nil, err
	}
	n := h.b.numBlocks(len(tokens))
	if pre != nil {
		n = min(n, 1)
	}
	var digests []byte
	if wantDigests {
		digests = make([]byte, n*h.b.Algorithm.DigestLen())
	}
	return h.chainInto(parent, tokens, n, extras, dst, digests, pre)
}

// KeysFrom returns the keys of blocks [from, n) of a prompt (n = NumBlocks(len(tokens))),
// appended to dst[:0]: bit for bit Keys' last n-from keys, with ex's one-shot extra keys. parent is
// the full digest of block from-1 (as Digests or an earlier KeysFrom gave it); from 0 chains on
// RootFor(ex) and ignores parent. digests, when non-nil, receives the (n-from)·DigestLen bytes of
// those blocks' digests. It is how a caller that kept a prompt's digests hashes only the blocks of a
// prompt that come after an exactly equal id prefix: a block's digest depends on the ids up to it
// and on its extras alone.
func (h *Hasher) KeysFrom(tokens []uint32, ex *Extras, from int, parent []byte, dst []uint64, digests []byte) ([]uint64, error) {
	if err := h.checkExtras(ex); err != nil {
		return nil, err
	}
	n := h.b.numBlocks(len(tokens))
	if from < 0 || from > n {
		return nil, fmt.Errorf("hashcore: first block %d outside 0..%d (%d tokens, block size %d)", from, n, len(tokens), h.b.BlockSize)
	}
	dl := h.b.Algorithm.DigestLen()
	if digests != nil && len(digests) < (n-from)*dl {
		return nil, fmt.Errorf("hashcore: digest buffer of %d bytes for %d blocks of %d", len(digests), n-from, dl)
	}
	if from == 0 {
		var err error
		if parent, err = h.RootFor(ex); err != nil {
			return nil, err
		}
	} else if len(parent) != dl {
		return nil, fmt.Errorf("hashcore: parent digest of %d bytes, %s chains on %d", len(parent), h.b.Algorithm, dl)
	}
	extras, err := h.blockExtras(ex, len(tokens))
	if err != nil {
		return nil, err
	}
	extras = extras[min(from, len(extras)):]
	if digests != nil {
		digests = digests[:(n-from)*dl]
	}
	_, keys, err := h.chainInto(parent, tokens[from*h.b.BlockSize:], n-from, extras, dst, digests, nil)
	return keys, err
}

// chain hashes n full blocks of tokens chaining from parent with the given per-block extras.
func (h *Hasher) chain(parent []byte, tokens []uint32, n int, extras [][]any, dst []uint64, pre *[]byte) ([]byte, []uint64, error) {
	return h.chainInto(parent, tokens, n, extras, dst, make([]byte, n*h.b.Algorithm.DigestLen()), pre)
}

// chainInto is chain writing the digests to digests (n·DigestLen bytes), or none when it is nil:
// Keys needs no digest, and 32 bytes per block of a 100k-token prompt is a 200 KB allocation.
func (h *Hasher) chainInto(parent []byte, tokens []uint32, n int, extras [][]any, dst []uint64, digests []byte, pre *[]byte) ([]byte, []uint64, error) {
	if len(extras) > n {
		extras = extras[:n]
	}
	req := &chainRequest{
		Algo: h.b.Algorithm, BlockSize: h.b.BlockSize, Bigram: h.b.Bigram,
		Parent: parent, Tokens: tokens, NumBlocks: n,
		Digests:   digests,
		Keys:      growKeys(dst, n),
		Preimage0: pre,
	}
	if h.impl == ImplC {
		packed, err := packExtras(extras, n)
		if err != nil {
			return nil, nil, err
		}
		req.Extras = packed
		if err := cChain(req); err != nil {
			return nil, nil, fmt.Errorf("hashcore: C core: %w", err)
		}
	} else if err := goChain(req, extras); err != nil {
		return nil, nil, err
	}
	return req.Digests, req.Keys, nil
}

func growKeys(dst []uint64, n int) []uint64 {
	if cap(dst) >= n {
		return dst[:n]
	}
	return make([]uint64, n)
}

func splitDigests(flat []byte, l int) [][]byte {
	out := make([][]byte, len(flat)/l)
	for i := range out {
		out[i] = flat[i*l : (i+1)*l : (i+1)*l]
	}
	return out
}

// GroupKeys returns a coarser KV-cache group's keys from the fine (hash-block) keys: group block j is
// fine key (j+1)*k-1 with k = groupBlockSize/blockSize (vLLM BlockHashListWithBlockSize).
func GroupKeys(fine []uint64, groupBlockSize, blockSize int) ([]uint64, error) {
	k, err := groupFactor(groupBlockSize, blockSize)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, 0, len(fine)/k)
	for j := 0; (j+1)*k-1 < len(fine); j++ {
		out = append(out, fine[(j+1)*k-1])
	}
	return out, nil
}

// GroupDigests is GroupKeys for full digests.
func GroupDigests(fine [][]byte, groupBlockSize, blockSize int) ([][]byte, error) {
	k, err := groupFactor(groupBlockSize, blockSize)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, 0, len(fine)/k)
	for j := 0; (j+1)*k-1 < len(fine); j++ {
		out = append(out, fine[(j+1)*k-1])
	}
	return out, nil
}

func groupFactor(groupBlockSize, blockSize int) (int, error) {
	if blockSize < 1 || blockSize > MaxBlockSize {
		return 0, fmt.Errorf("hashcore: block size %d out of range 1..%d", blockSize, MaxBlockSize)
	}
	if groupBlockSize < blockSize || groupBlockSize%blockSize != 0 {
		return 0, fmt.Errorf("hashcore: group block size %d is not a positive multiple of block size %d", groupBlockSize, blockSize)
	}
	return groupBlockSize / blockSize, nil
}

// TokenIDs converts token ids that arrived as wider integers (JSON, msgpack) to uint32, with an
// error naming the index and value of the first one outside 0..2^32-1.
func TokenIDs(ids []int64) ([]uint32, error) {
	out := make([]uint32, len(ids))
	for i, v := range ids {
		if v < 0 || v > 0xFFFFFFFF {
			return nil, fmt.Errorf("hashcore: token id [%d] = %d outside 0..4294967295", i, v)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

// RouterKeys computes router keys (kvexact-xxh3-v1) for the full blocks of event tokens, chaining
// from parent (0 at the root), with optional per-block extra keys (nil or an empty entry = none), and
// appends them to dst[:0]. It uses Default().
func RouterKeys(parent uint64, tokens []uint32, blockSize int, extras [][]any, dst []uint64) ([]uint64, error) {
	return RouterKeysWith(Default(), parent, tokens, blockSize, extras, dst)
}

// RouterKeysWith is RouterKeys with a chosen implementation.
func RouterKeysWith(impl Impl, parent uint64, tokens []uint32, blockSize int, extras [][]any, dst []uint64) ([]uint64, error) {
	h, err := New(Binding{Algorithm: RouterXXH3V1, BlockSize: blockSize}, impl)
	if err != nil {
		return nil, err
	}
	n := len(tokens) / blockSize
	if len(extras) > n {
		return nil, fmt.Errorf("hashcore: %d extra-key entries for %d full blocks", len(extras), n)
	}
	p := binary.LittleEndian.AppendUint64(nil, parent)
	_, keys, err := h.chainInto(p, tokens, n, extras, dst, nil, nil)
	return keys, err
}
