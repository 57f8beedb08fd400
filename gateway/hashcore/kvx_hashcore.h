/*
 * kvexact hash core: the block keys of a whole prompt in one call.
 *
 * One call (kvx_chain) takes a prompt's token ids, the digest block 0 chains on, and the per-block
 * extra keys in a compact typed form, serializes every full block's pre-image itself (canonical CBOR,
 * pickle protocol 5 exactly as CPython writes it, or raw little-endian bytes) into one reused
 * buffer, hashes it (SHA-256 with SHA-NI when the CPU has it, XXH3 from the vendored xxHash), and
 * writes every block's digest and 64-bit key. Nothing is allocated per block, nothing is read or
 * written outside the given buffers, and every problem is a status code, never a crash.
 *
 * The Go package github.com/kvexact/kvexact/gateway/hashcore is the only intended caller; see the
 * seam comment in hashcore.go for the Go side of this contract.
 */
#ifndef KVX_HASHCORE_H
#define KVX_HASHCORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Algorithms (stable numbers; the Go glue maps its Algorithm strings onto them). */
enum kvx_algo {
	KVX_VLLM_SHA256 = 1,      /* vLLM "sha256": pickle protocol 5 + SHA-256 (vLLM's default) */
	KVX_VLLM_SHA256_CBOR = 2, /* vLLM "sha256_cbor": canonical CBOR + SHA-256 */
	KVX_VLLM_XXHASH = 3,      /* vLLM "xxhash": pickle protocol 5 + XXH3-128 */
	KVX_VLLM_XXHASH_CBOR = 4, /* vLLM "xxhash_cbor": canonical CBOR + XXH3-128 */
	KVX_SGLANG_SHA256 = 5,    /* SGLang page hash: SHA-256(prior ‖ u32le tokens) */
	KVX_ROUTER_XXH3_V1 = 6,   /* kvexact-xxh3-v1: XXH3-64(le64 parent ‖ le32 tokens ‖ CBOR extras) */
	KVX_VLLM_SHA256_MSGPACK = 7, /* vLLM "sha256_msgpack": MessagePack (msgspec) + SHA-256 */
	KVX_VLLM_XXHASH_MSGPACK = 8, /* vLLM "xxhash_msgpack": MessagePack (msgspec) + XXH3-128 */
};

/* Status codes (kvx_status_text names each). */
enum kvx_status {
	KVX_OK = 0,
	KVX_E_ALGO = 1,       /* unknown algorithm number */
	KVX_E_BLOCK_SIZE = 2, /* block size 0 or above KVX_MAX_BLOCK_SIZE */
	KVX_E_BIGRAM = 3,     /* bigram asked for with an algorithm other than SGLang */
	KVX_E_PARENT = 4,     /* parent digest of a length the algorithm cannot chain on */
	KVX_E_TOKENS = 5,     /* fewer tokens than n_blocks full blocks need */
	KVX_E_OUTPUT = 6,     /* digests or keys buffer too small for n_blocks */
	KVX_E_EXTRAS = 7,     /* packed extras malformed (truncated, bad tag, too deep, trailing bytes) */
	KVX_E_UTF8 = 8,       /* a string is not valid UTF-8 (pickle needs a Python str) */
	KVX_E_TOO_LARGE = 9,  /* a size that would overflow the pre-image buffer arithmetic */
	KVX_E_NOMEM = 10,     /* malloc failed for a pre-image larger than the stack buffer */
	KVX_E_PRE0_SPACE = 11 /* everything computed, but pre0_cap < pre0_len: call again with more */
};

#define KVX_MAX_BLOCK_SIZE 4096
#define KVX_MAX_PARENT 64   /* longest parent digest accepted for the vLLM algorithms */
#define KVX_MAX_DEPTH 32    /* deepest tuple nesting accepted in packed extras */
#define KVX_MAX_ITEM (1u << 30) /* longest single string or bytes item in packed extras */

/*
 * Packed extras, one entry per block in order: u32le n (0 = none: vLLM None / CBOR null / pickle
 * NONE / msgpack nil; router: no extras bytes), then n items. An item is a tag byte and a payload:
 *   0x01 str    u32le len, UTF-8 bytes
 *   0x02 bytes  u32le len, bytes
 *   0x03 int    i64le
 *   0x04 tuple  u32le n, then n items
 * A NULL extras pointer means every block has none. SGLang takes none (its salt is in the parent).
 */
enum kvx_tag { KVX_TAG_STR = 1, KVX_TAG_BYTES = 2, KVX_TAG_INT = 3, KVX_TAG_TUPLE = 4 };

typedef struct {
	/* in */
	int32_t algo;          /* enum kvx_algo */
	uint32_t block_size;   /* 1..KVX_MAX_BLOCK_SIZE (SGLang bigram: units per page) */
	int32_t bigram;        /* SGLang EAGLE mode: unit j = (tokens[j], tokens[j+1]) */
	const uint8_t *parent; /* what block 0 chains on: vLLM root or digest (1..64 bytes), SGLang
	                          none (0) or 32 bytes, router le64 key (8 bytes) */
	size_t parent_len;
	const uint32_t *tokens; /* from block 0 of this call on */
	size_t n_tokens;
	size_t n_blocks;        /* full blocks to hash */
	const uint8_t *extras;  /* packed extras (see above) or NULL */
	size_t extras_len;
	/* out */
	uint8_t *digests;       /* n_blocks * kvx_digest_len(algo) bytes, or NULL for keys only */
	size_t digests_len;
	uint64_t *keys;         /* n_blocks keys */
	size_t keys_len;
	uint8_t *pre0;          /* optional: receives block 0's pre-image */
	size_t pre0_cap;
	size_t pre0_len;        /* set to block 0's pre-image length when n_blocks > 0 */
	size_t err_block;       /* on KVX_E_EXTRAS/KVX_E_UTF8/KVX_E_TOO_LARGE: the block */
	size_t err_offset;      /* ... and the byte offset into extras */
} kvx_chain_args;

/* Hashes a->n_blocks full blocks. Returns an enum kvx_status. */
int kvx_chain(kvx_chain_args *a);

/*
 * The root a chain starts from: for the vLLM algorithms H(serialize(str s)), i.e. NONE_HASH for
 * PYTHONHASHSEED = s; for SGLang the salt root SHA-256("sglang-cache-salt-v1\0" ‖ s). Writes
 * kvx_digest_len(algo) bytes to out (out_cap at least that) and sets *out_len.
 */
int kvx_root(int32_t algo, const uint8_t *s, size_t n, uint8_t *out, size_t out_cap, size_t *out_len);

/* Digest bytes per block: 32, 16, or 8 (router: le64 of the key); 0 for an unknown algorithm. */
size_t kvx_digest_len(int32_t algo);

/* A short English description of a status code. */
const char *kvx_status_text(int status);

/*
 * Hashes n pre-built pre-images (pre-image i is buf[ends[i-1]:ends[i]], ends[-1] = 0) with algo's
 * digest function, writing n digests to out: the benchmarks' floor, the same hashing work as
 * kvx_chain without the serialization. With chain_off < 0 the pre-images are independent and the
 * CPU may overlap consecutive digests. With chain_off >= 0 the pre-images must form a chain (bytes
 * [chain_off, chain_off + digest length) of pre-image i >= 1 equal digest i-1) and each digest waits
 * for the previous one as in kvx_chain: with SHA-NI those bytes are taken from the previous digest
 * exactly as kvx_chain does; elsewhere a false data dependency stands in for it. With SHA-NI, a
 * pre-image followed by at least 64 more bytes of buf is hashed by kvx_chain's register-assembled
 * code (give buf_len 64 bytes of slack past the last end for that). Returns an enum kvx_status.
 */
int kvx_digest_many(int32_t algo, const uint8_t *buf, size_t buf_len, const size_t *ends, size_t n,
                    uint8_t *out, size_t out_len, ptrdiff_t chain_off);

/*
 * Code paths chosen at run time: SHA-256 "sha-ni" or "portable", token encoders "avx2" or
 * "portable". kvx_force_portable(1) forces portable C everywhere (tests and benchmarks of the
 * fallback; not for use while other threads hash); kvx_cpu_has_* say what the CPU offers.
 */
const char *kvx_sha256_impl(void);
const char *kvx_encoder_impl(void);
void kvx_force_portable(int on);
int kvx_cpu_has_shani(void);
int kvx_cpu_has_avx2(void);

#ifdef __cplusplus
}
#endif

#endif
