package vectors

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"reflect"
	"strings"

	"github.com/google/go-cmp/cmp"
	"github.com/kvexact/kvexact/gateway/hashcore"
)

// This file is the one checking mechanism behind both `go test ./parity` and `ctk vectors verify`.

// Failure is one expected value an implementation did not reproduce.
type Failure struct {
	File  string
	Case  string
	Impl  string // "go" or "c"
	Field string // the file's name for the field, e.g. "keys" (project schema) or "block_hashes_u64"
	Block int    // block index, -1 when the field is not per block
	// Expected and Got are short renderings of the two values.
	Expected, Got string
	// Detail is an optional multi-line explanation (a go-cmp diff of pre-image bytes, extra keys).
	Detail string
}

// String renders the failure on one line: file, case, field, block, implementation, expected, got.
func (f Failure) String() string {
	field := f.Field
	if f.Block >= 0 {
		field = fmt.Sprintf("%s[%d]", f.Field, f.Block)
	}
	return fmt.Sprintf("%s: %s: %s: impl %s: expected %s, got %s", f.File, f.Case, field, f.Impl, f.Expected, f.Got)
}

// CaseResult is the outcome of one case over the implementations checked.
type CaseResult struct {
	Case *Case
	// SkipReason is non-empty when the case is not reproducible and was not checked.
	SkipReason string
	Failures   []Failure
}

// Passed reports whether the case was checked and every implementation reproduced every field.
func (r CaseResult) Passed() bool { return r.SkipReason == "" && len(r.Failures) == 0 }

// Report is the outcome of one file.
type Report struct {
	File  *File
	Cases []CaseResult
}

// Counts returns the number of passed, failed and skipped cases.
func (r *Report) Counts() (passed, failed, skipped int) {
	for _, c := range r.Cases {
		switch {
		case c.SkipReason != "":
			skipped++
		case len(c.Failures) == 0:
			passed++
		default:
			failed++
		}
	}
	return
}

// VerifyFile checks every case of f against every implementation in impls. A case passes only when
// all of them reproduce every expected field.
func VerifyFile(f *File, impls []hashcore.Impl) *Report {
	r := &Report{File: f, Cases: make([]CaseResult, len(f.Cases))}
	for i := range f.Cases {
		c := &f.Cases[i]
		res := CaseResult{Case: c, SkipReason: SkipReason(c)}
		if res.SkipReason == "" {
			for _, impl := range impls {
				res.Failures = append(res.Failures, VerifyCase(f, c, impl)...)
			}
		}
		r.Cases[i] = res
	}
	return r
}

// SkipReason is why a case cannot be checked ("" when it can).
func SkipReason(c *Case) string {
	if c.Reproducible {
		return ""
	}
	if c.Comment != "" {
		return "not reproducible: " + c.Comment
	}
	return "not reproducible (marked reproducible: false)"
}

// Extras builds the hash core's request extras from a case's request.
func (c *Case) Extras() *hashcore.Extras {
	r := c.Request
	ex := &hashcore.Extras{LoRAName: r.LoRAName, CacheSalt: r.CacheSalt, PromptEmbeds: r.PromptEmbedsRows,
		Tagged: c.TaggedExtras, LoRAPath: r.LoRAPath}
	for _, m := range r.MM {
		ex.MM = append(ex.MM, hashcore.MMFeature{Identifier: m.Identifier, Offset: m.Offset, Length: m.Length})
	}
	return ex
}

// Binding is the hash binding a case pins: its seed, or with none the seed the engine resolved.
func (c *Case) Binding() hashcore.Binding {
	b := hashcore.Binding{Algorithm: hashcore.Algorithm(c.Algo), BlockSize: c.BlockSize, Bigram: c.Bigram, Seed: c.Seed}
	if b.Seed == nil {
		b.Seed = c.RootSeed
	}
	return b
}

// checker accumulates the failures of one case under one implementation.
type checker struct {
	f     *File
	c     *Case
	impl  hashcore.Impl
	fails []Failure
}

func (k *checker) fail(field string, block int, exp, got, detail string) {
	k.fails = append(k.fails, Failure{File: k.f.Path, Case: k.c.Name, Impl: k.impl.String(), Field: field, Block: block, Expected: exp, Got: got, Detail: detail})
}

// VerifyCase checks one reproducible case against one implementation and returns its failures.
func VerifyCase(f *File, c *Case, impl hashcore.Impl) []Failure {
	k := &checker{f: f, c: c, impl: impl}
	h, err := hashcore.New(c.Binding(), impl)
	if err != nil {
		k.fail("binding", -1, "a usable binding", "error", err.Error())
		k.fails[len(k.fails)-1].Got = "error: " + err.Error()
		return k.fails
	}
	ex := c.Extras()

	// Root: block 0's prior (a seeded root, le64(0) for router keys, a salt root), or none.
	rootField := f.Field(qRoot)
	root, err := h.RootFor(ex)
	switch {
	case err != nil:
		k.fail(rootField, -1, hexOrNone(c.Expected.Root), "error: "+err.Error(), "")
	case c.Expected.Root != nil && !bytes.Equal(root, c.Expected.Root):
		k.fail(rootField, -1, hexOrNone(c.Expected.Root), hexOrNone(root), "")
	case c.Expected.Root == nil && root != nil:
		k.fail(rootField, -1, "no prior (unsalted)", hexOrNone(root), "")
	}

	// Digests and keys: one shot, or through the incremental (decode) path.
	var digests [][]byte
	var keys []uint64
	var usedExtras [][]any
	if c.PromptLen > 0 {
		seq := h.NewSequence(ex)
		_, err = seq.Append(c.Tokens[:c.PromptLen]...)
		for i := c.PromptLen; err == nil && i < len(c.Tokens); i++ {
			_, err = seq.Append(c.Tokens[i])
		}
		digests, keys, usedExtras = seq.Digests(), seq.Keys(), seq.ExtraKeys()
	} else {
		digests, keys, err = h.Digests(c.Tokens, ex)
	}
	if err != nil {
		k.fail(f.Field(qDigests), -1, fmt.Sprintf("%d blocks", c.Expected.NumFullBlocks), "error: "+err.Error(), "")
		return k.fails
	}
	if len(keys) != c.Expected.NumFullBlocks {
		k.fail(f.Field(qNumFullBlocks), -1, fmt.Sprint(c.Expected.NumFullBlocks), fmt.Sprint(len(keys)), "")
	}
	var preDetail string
	if len(c.Tokens) > 0 && h.NumBlocks(len(c.Tokens)) > 0 {
		if pre, err := h.FirstPreimage(c.Tokens, ex); err != nil {
			k.fail(f.Field(qFirstBlockPreimage), -1, hexOrNone(c.Expected.FirstPreimage), "error: "+err.Error(), "")
		} else {
			if c.Expected.FirstPreimage != nil && !bytes.Equal(pre, c.Expected.FirstPreimage) {
				k.fail(f.Field(qFirstBlockPreimage), -1, short(c.Expected.FirstPreimage), short(pre),
					"pre-image of block 0 (-expected +got):\n"+cmp.Diff(hexLines(c.Expected.FirstPreimage), hexLines(pre)))
			}
			preDetail = "pre-image of block 0 (" + impl.String() + "):\n" + strings.Join(hexLines(pre), "\n")
		}
	}
	k.digests(f.Field(qDigests), c.Expected.Digests, digests, preDetail)
	k.keys(f.Field(qKeys), c.Expected.Keys, keys)

	// Extra keys rebuilt from the request (cases that pin them).
	if c.HasExtraKeys {
		oneShot, err := hashcore.ExtraKeys(ex, len(c.Tokens), c.BlockSize)
		if err != nil {
			k.fail(f.Field(qExtraKeys), -1, "extra keys", "error: "+err.Error(), "")
		} else {
			used := oneShot
			if c.PromptLen > 0 {
				used = usedExtras
			}
			k.extras(f.Field(qExtraKeys), c.ExtraKeys, used)
			if c.ExtraKeysOneShot != nil {
				k.extras(f.Field(qExtraKeysOneShot), c.ExtraKeysOneShot, oneShot)
			}
		}
	}

	// Coarse KV-cache groups.
	if c.GroupBlockSize > 0 {
		gd, err := hashcore.GroupDigests(digests, c.GroupBlockSize, c.BlockSize)
		if err != nil {
			k.fail(f.Field(qGroupDigests), -1, "group hashes", "error: "+err.Error(), "")
		} else {
			gk, _ := hashcore.GroupKeys(keys, c.GroupBlockSize, c.BlockSize)
			k.digests(f.Field(qGroupDigests), c.Expected.GroupDigests, gd, "")
			k.keys(f.Field(qGroupKeys), c.Expected.GroupKeys, gk)
		}
	}

	// The engine's internal unsalted hashes of salted cases.
	if c.Expected.UnsaltedDigests != nil {
		ud, _, err := h.Digests(c.Tokens, nil)
		if err != nil {
			k.fail(f.Field(qUnsaltedDigests), -1, "digests", "error: "+err.Error(), "")
		} else {
			k.digests(f.Field(qUnsaltedDigests), c.Expected.UnsaltedDigests, ud, "")
		}
	}
	return k.fails
}

// digests reports the first block whose digest differs, and a length mismatch.
func (k *checker) digests(field string, exp, got [][]byte, preDetail string) {
	for i := 0; i < len(exp) && i < len(got); i++ {
		if !bytes.Equal(exp[i], got[i]) {
			detail := ""
			if i == 0 {
				detail = preDetail
			}
			k.fail(field, i, hex.EncodeToString(exp[i]), hex.EncodeToString(got[i]), detail)
			break
		}
	}
	if len(exp) != len(got) {
		k.fail(field, -1, fmt.Sprintf("%d digests", len(exp)), fmt.Sprintf("%d digests", len(got)), "")
	}
}

func (k *checker) keys(field string, exp, got []uint64) {
	for i := 0; i < len(exp) && i < len(got); i++ {
		if exp[i] != got[i] {
			e, g := fmt.Sprint(exp[i]), fmt.Sprint(got[i])
			if k.f.Header.KeyType == KeyInt64 {
				e, g = fmt.Sprint(int64(exp[i])), fmt.Sprint(int64(got[i]))
			}
			k.fail(field, i, e, g, "")
			break
		}
	}
	if len(exp) != len(got) {
		k.fail(field, -1, fmt.Sprintf("%d keys", len(exp)), fmt.Sprintf("%d keys", len(got)), "")
	}
}

func (k *checker) extras(field string, exp, got [][]any) {
	for i := 0; i < len(exp) && i < len(got); i++ {
		if !reflect.DeepEqual(exp[i], got[i]) {
			k.fail(field, i, renderExtras(exp[i]), renderExtras(got[i]), cmp.Diff(exp[i], got[i]))
			return
		}
	}
	if len(exp) != len(got) {
		k.fail(field, -1, fmt.Sprintf("%d blocks", len(exp)), fmt.Sprintf("%d blocks", len(got)), "")
	}
}

func hexOrNone(b []byte) string {
	if b == nil {
		return "none"
	}
	return hex.EncodeToString(b)
}

// short renders long byte strings by their length and head.
func short(b []byte) string {
	if b == nil {
		return "none"
	}
	if len(b) <= 24 {
		return hex.EncodeToString(b)
	}
	return fmt.Sprintf("%d bytes %s…", len(b), hex.EncodeToString(b[:24]))
}

// hexLines renders bytes as offset-prefixed 16-byte hex lines, so a go-cmp diff points at the bytes
// that differ.
func hexLines(b []byte) []string {
	var out []string
	for i := 0; i < len(b); i += 16 {
		out = append(out, fmt.Sprintf("%04x: % x", i, b[i:min(i+16, len(b))]))
	}
	return out
}

// renderExtras renders one block's extra keys in the vectors' JSON notation.
func renderExtras(v []any) string {
	if v == nil {
		return "null"
	}
	var sb strings.Builder
	renderValue(&sb, v)
	return sb.String()
}

func renderValue(sb *strings.Builder, v any) {
	switch x := v.(type) {
	case []any:
		sb.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				sb.WriteByte(',')
			}
			renderValue(sb, e)
		}
		sb.WriteByte(']')
	case string:
		fmt.Fprintf(sb, "%q", x)
	case []byte:
		fmt.Fprintf(sb, `{"$bytes":"%x"}`, x)
	default:
		fmt.Fprint(sb, x)
	}
}
