//go:build cgo

package hashcore

// The cgo glue of the C core (kvx_*.c): it fills the cChain / cRoot seam of hashcore.go. Every size
// is checked here before the call and again in C; C status codes come back as errors naming the
// value at fault.

/*
#cgo CFLAGS: -O3 -std=gnu11 -Wall -Wextra -Wno-unused-function
#include <stdlib.h>
#include "kvx_hashcore.h"

typedef struct {
	int32_t rc;
	size_t pre0_len, err_block, err_offset;
} kvx_glue_result;

// Scalars in, a small struct out: the argument struct is built on the C side, so no Go memory
// holding Go pointers is ever passed to C.
static kvx_glue_result kvx_glue_chain(int32_t algo, uint32_t block_size, int32_t bigram,
		const uint8_t *parent, size_t parent_len, const uint32_t *tokens, size_t n_tokens,
		size_t n_blocks, const uint8_t *extras, size_t extras_len, uint8_t *digests,
		size_t digests_len, uint64_t *keys, size_t keys_len, uint8_t *pre0, size_t pre0_cap) {
	kvx_chain_args a = {
		.algo = algo, .block_size = block_size, .bigram = bigram,
		.parent = parent, .parent_len = parent_len, .tokens = tokens, .n_tokens = n_tokens,
		.n_blocks = n_blocks, .extras = extras, .extras_len = extras_len,
		.digests = digests, .digests_len = digests_len, .keys = keys, .keys_len = keys_len,
		.pre0 = pre0, .pre0_cap = pre0_cap,
	};
	kvx_glue_result r;
	r.rc = kvx_chain(&a);
	r.pre0_len = a.pre0_len;
	r.err_block = a.err_block;
	r.err_offset = a.err_offset;
	return r;
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// kvxMaxDepth is the deepest tuple nesting the C core accepts in packed extras.
const kvxMaxDepth = int(C.KVX_MAX_DEPTH)

func init() {
	cChain = cgoChain
	cRoot = cgoRoot
}

// cAlgo maps an Algorithm onto the C enum (0 = unknown).
func cAlgo(a Algorithm) C.int32_t {
	switch a {
	case VLLMSHA256:
		return C.KVX_VLLM_SHA256
	case VLLMSHA256CBOR:
		return C.KVX_VLLM_SHA256_CBOR
	case VLLMXXHash:
		return C.KVX_VLLM_XXHASH
	case VLLMXXHashCBOR:
		return C.KVX_VLLM_XXHASH_CBOR
	case VLLMSHA256MsgPack:
		return C.KVX_VLLM_SHA256_MSGPACK
	case VLLMXXHashMsgPack:
		return C.KVX_VLLM_XXHASH_MSGPACK
	case SGLangSHA256:
		return C.KVX_SGLANG_SHA256
	case RouterXXH3V1:
		return C.KVX_ROUTER_XXH3_V1
	}
	return 0
}

// cStatusError turns a C status into an error naming the request values involved.
func cStatusError(rc C.int32_t, req *chainRequest, block, off uint64) error {
	msg := C.GoString(C.kvx_status_text(C.int(rc)))
	switch rc {
	case C.KVX_E_EXTRAS, C.KVX_E_UTF8, C.KVX_E_TOO_LARGE:
		return fmt.Errorf("%s: %s (block %d, packed extras byte %d of %d)", req.Algo, msg, block, off, len(req.Extras))
	case C.KVX_E_PARENT:
		return fmt.Errorf("%s: %s (parent is %d bytes)", req.Algo, msg, len(req.Parent))
	case C.KVX_E_TOKENS:
		return fmt.Errorf("%s: %s (%d blocks of %d, %d tokens)", req.Algo, msg, req.NumBlocks, req.BlockSize, len(req.Tokens))
	}
	return fmt.Errorf("%s: %s (status %d)", req.Algo, msg, int(rc))
}

func cgoChain(req *chainRequest) error {
	algo := cAlgo(req.Algo)
	if algo == 0 {
		return req.Algo.Validate()
	}
	dl := req.Algo.DigestLen()
	n := req.NumBlocks
	if req.BlockSize < 1 || req.BlockSize > MaxBlockSize {
		return fmt.Errorf("%s: block size %d out of range 1..%d", req.Algo, req.BlockSize, MaxBlockSize)
	}
	if n < 0 {
		return fmt.Errorf("%s: negative block count %d", req.Algo, n)
	}
	if n == 0 {
		return nil
	}
	need := n * req.BlockSize
	if req.Bigram {
		need++
	}
	if len(req.Tokens) < need {
		return fmt.Errorf("%s: %d full blocks of %d need %d tokens, have %d", req.Algo, n, req.BlockSize, need, len(req.Tokens))
	}
	// Digests == nil asks for keys only (the C core then writes no digest bytes).
	if len(req.Keys) < n || (req.Digests != nil && len(req.Digests) < n*dl) {
		return fmt.Errorf("%s: output for %d blocks too small (keys %d, digest bytes %d)", req.Algo, n, len(req.Keys), len(req.Digests))
	}
	var bigram C.int32_t
	if req.Bigram {
		bigram = 1
	}
	var pre []byte
	if req.Preimage0 != nil {
		pre = make([]byte, 1024)
	}
	for {
		r := C.kvx_glue_chain(algo, C.uint32_t(req.BlockSize), bigram,
			(*C.uint8_t)(unsafe.SliceData(req.Parent)), C.size_t(len(req.Parent)),
			(*C.uint32_t)(unsafe.SliceData(req.Tokens)), C.size_t(len(req.Tokens)), C.size_t(n),
			(*C.uint8_t)(unsafe.SliceData(req.Extras)), C.size_t(len(req.Extras)),
			(*C.uint8_t)(unsafe.SliceData(req.Digests)), C.size_t(len(req.Digests)),
			(*C.uint64_t)(unsafe.SliceData(req.Keys)), C.size_t(len(req.Keys)),
			(*C.uint8_t)(unsafe.SliceData(pre)), C.size_t(len(pre)))
		switch r.rc {
		case C.KVX_OK:
			if req.Preimage0 != nil {
				*req.Preimage0 = pre[:r.pre0_len:r.pre0_len]
			}
			return nil
		case C.KVX_E_PRE0_SPACE:
			pre = make([]byte, int(r.pre0_len)) // rare (debug path): hash again with room
			continue
		}
		return cStatusError(r.rc, req, uint64(r.err_block), uint64(r.err_offset))
	}
}

func cgoRoot(a Algorithm, s string) ([]byte, error) {
	algo := cAlgo(a)
	if algo == 0 || a == RouterXXH3V1 {
		return nil, fmt.Errorf("hashcore: %s has no root digest", a)
	}
	out := make([]byte, a.DigestLen())
	var n C.size_t
	rc := C.kvx_root(algo, (*C.uint8_t)(unsafe.Pointer(unsafe.StringData(s))), C.size_t(len(s)),
		(*C.uint8_t)(unsafe.SliceData(out)), C.size_t(len(out)), &n)
	if rc != C.KVX_OK {
		return nil, fmt.Errorf("hashcore: %s root of %q: %s", a, s, C.GoString(C.kvx_status_text(rc)))
	}
	return out[:n], nil
}

// The debug and benchmark hooks below are for this package's tests.

func cBool(v bool) C.int {
	if v {
		return 1
	}
	return 0
}

// forcePortable makes the C core use (or stop forcing) its portable C code: SHA-256 without
// SHA-NI, token encoders without AVX2.
func forcePortable(on bool) { C.kvx_force_portable(cBool(on)) }

// cPaths names the code the C core uses now, e.g. "sha-ni+avx2" or "portable+portable".
func cPaths() string {
	return C.GoString(C.kvx_sha256_impl()) + "+" + C.GoString(C.kvx_encoder_impl())
}

// cpuHasSHANI reports whether the CPU offers the SHA extensions the fast path needs.
func cpuHasSHANI() bool { return C.kvx_cpu_has_shani() != 0 }

// cpuHasAVX2 reports whether the CPU and OS support the AVX2 token encoders.
func cpuHasAVX2() bool { return C.kvx_cpu_has_avx2() != 0 }

// cDigestMany hashes pre-built pre-images (pre-image i = buf[ends[i-1]:ends[i]]) in one C call: the
// benchmarks' floor, the digest work of a chain without its serialization.
// chainOff >= 0 makes each digest wait for the previous one as in a real chain, taking the parent
// bytes at that offset from it (see kvx_digest_many); -1 hashes the pre-images independently.
func cDigestMany(a Algorithm, buf []byte, ends []uint64, out []byte, chainOff int) error {
	if unsafe.Sizeof(C.size_t(0)) != unsafe.Sizeof(uint64(0)) {
		return fmt.Errorf("hashcore: digest many needs a 64-bit size_t")
	}
	rc := C.kvx_digest_many(cAlgo(a), (*C.uint8_t)(unsafe.SliceData(buf)), C.size_t(len(buf)),
		(*C.size_t)(unsafe.Pointer(unsafe.SliceData(ends))), C.size_t(len(ends)),
		(*C.uint8_t)(unsafe.SliceData(out)), C.size_t(len(out)), C.ptrdiff_t(chainOff))
	if rc != C.KVX_OK {
		return fmt.Errorf("hashcore: digest many: %s", C.GoString(C.kvx_status_text(rc)))
	}
	return nil
}
