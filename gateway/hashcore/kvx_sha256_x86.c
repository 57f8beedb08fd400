/*
 * SHA-256 compression with the x86 SHA extensions (sha256rnds2 / sha256msg1 / sha256msg2). Compiled
 * for that target only in this file; kvx_sha256.c calls it only after CPUID says the CPU has SHA,
 * SSSE3 and SSE4.1.
 *
 * The SHA instructions keep the eight working variables as two vectors, ABEF and CDGH; each
 * sha256rnds2 does two rounds, so a group of four message words takes two of them.
 */
#include "kvx_sha256.h"

#if defined(KVX_HAVE_SHANI_BUILD)
#include <immintrin.h>

static const uint32_t K[64] __attribute__((aligned(16))) = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define SHANI __attribute__((target("sha,ssse3,sse4.1")))

/* Absorbs one 64-byte block given as four message registers (bytes in memory order) into the
 * ABEF/CDGH state. */
SHANI static inline void shani_block(__m128i *s0p, __m128i *s1p, __m128i b0, __m128i b1, __m128i b2, __m128i b3) {
	const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
	__m128i s0 = *s0p, s1 = *s1p;
	const __m128i save0 = s0, save1 = s1;
	__m128i m[4] = {_mm_shuffle_epi8(b0, bswap), _mm_shuffle_epi8(b1, bswap), _mm_shuffle_epi8(b2, bswap),
	                _mm_shuffle_epi8(b3, bswap)};
#pragma GCC unroll 16
	for (int i = 0; i < 16; i++) {
		__m128i msg = _mm_add_epi32(m[i & 3], _mm_load_si128((const __m128i *)&K[4 * i]));
		s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
		if (i < 12) {
			/* W[i+4] = msg2(msg1(W[i], W[i+1]) + W[4i+9 .. 4i+12], W[i+3]) */
			__m128i t = _mm_sha256msg1_epu32(m[i & 3], m[(i + 1) & 3]);
			t = _mm_add_epi32(t, _mm_alignr_epi8(m[(i + 3) & 3], m[(i + 2) & 3], 4));
			m[i & 3] = _mm_sha256msg2_epu32(t, m[(i + 3) & 3]);
		}
		msg = _mm_shuffle_epi32(msg, 0x0E);
		s0 = _mm_sha256rnds2_epu32(s0, s1, msg);
	}
	*s0p = _mm_add_epi32(s0, save0);
	*s1p = _mm_add_epi32(s1, save1);
}

/* state (A..H) <-> the ABEF, CDGH form of the SHA instructions */
SHANI static inline void shani_load(const uint32_t state[8], __m128i *s0, __m128i *s1) {
	__m128i abcd = _mm_loadu_si128((const __m128i *)&state[0]);
	__m128i efgh = _mm_loadu_si128((const __m128i *)&state[4]);
	__m128i cdab = _mm_shuffle_epi32(abcd, 0xB1);
	efgh = _mm_shuffle_epi32(efgh, 0x1B);
	*s0 = _mm_alignr_epi8(cdab, efgh, 8);    /* ABEF */
	*s1 = _mm_blend_epi16(efgh, cdab, 0xF0); /* CDGH */
}

SHANI static inline void shani_store(uint32_t state[8], __m128i s0, __m128i s1) {
	__m128i feba = _mm_shuffle_epi32(s0, 0x1B);
	__m128i dchg = _mm_shuffle_epi32(s1, 0xB1);
	_mm_storeu_si128((__m128i *)&state[0], _mm_blend_epi16(feba, dchg, 0xF0)); /* DCBA */
	_mm_storeu_si128((__m128i *)&state[4], _mm_alignr_epi8(dchg, feba, 8));    /* HGFE */
}

SHANI void kvx_sha256_compress_shani(uint32_t state[8], const uint8_t *blocks, size_t n_blocks) {
	__m128i s0, s1;
	shani_load(state, &s0, &s1);
	for (; n_blocks > 0; n_blocks--, blocks += 64) {
		shani_block(&s0, &s1, _mm_loadu_si128((const __m128i *)blocks),
		            _mm_loadu_si128((const __m128i *)(blocks + 16)),
		            _mm_loadu_si128((const __m128i *)(blocks + 32)),
		            _mm_loadu_si128((const __m128i *)(blocks + 48)));
	}
	shani_store(state, s0, s1);
}

/* Sliding windows for run-time byte shifts and masks: loading 16 bytes at win + 16 - o gives the
 * pshufb control that moves a register's bytes up by o (zeros below); at win + 16 + k, down by k. */
static const int8_t win_shift[48] = {
	-128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128,
	0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
	-128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128, -128};
static const int8_t win_mask[48] = {
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};

#define LOADW(t, at) _mm_loadu_si128((const __m128i *)((t) + (at)))

/*
 * SHA-256 of msg[0:n] in one go, the message blocks and the final padding assembled in registers:
 * no byte is stored and then re-read, so no load waits on a store it cannot be forwarded from.
 * When parent != NULL, bytes [off, off+32) of the message are taken from the big-endian form of the
 * state words parent[8] (the previous block's digest in a chain) instead of from msg; off <= 16.
 * The caller guarantees 64 readable bytes past msg[n-1] (they are loaded and masked off).
 */
SHANI void kvx_sha256_shani_digest(const uint8_t *msg, size_t n, const uint32_t *parent, size_t off,
                                   uint32_t out[8]) {
	static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
	                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	const __m128i be32 = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
	__m128i s0, s1;
	shani_load(iv, &s0, &s1);

	__m128i c0 = LOADW(msg, 0), c1 = LOADW(msg, 16), c2 = LOADW(msg, 32), c3 = LOADW(msg, 48);
	if (parent != NULL) {
		__m128i d0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)&parent[0]), be32);
		__m128i d1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)&parent[4]), be32);
		__m128i up = LOADW(win_shift, 16 - off), down = LOADW(win_shift, 32 - off);
		c0 = _mm_blendv_epi8(c0, _mm_shuffle_epi8(d0, up), LOADW(win_mask, 16 - off));
		c1 = _mm_or_si128(_mm_shuffle_epi8(d0, down), _mm_shuffle_epi8(d1, up));
		c2 = _mm_blendv_epi8(c2, _mm_shuffle_epi8(d1, down), LOADW(win_mask, 32 - off));
	}
	size_t full = n / 64, r = n % 64;
	for (size_t k = 0; k < full; k++) {
		if (k > 0) {
			const uint8_t *b = msg + 64 * k;
			c0 = LOADW(b, 0), c1 = LOADW(b, 16), c2 = LOADW(b, 32), c3 = LOADW(b, 48);
		}
		shani_block(&s0, &s1, c0, c1, c2, c3);
	}
	if (full > 0) {
		const uint8_t *b = msg + 64 * full;
		c0 = LOADW(b, 0), c1 = LOADW(b, 16), c2 = LOADW(b, 32), c3 = LOADW(b, 48);
	}
	/* The tail: r message bytes, 0x80, zeros, and the bit length in the last 8 bytes. */
	const __m128i rr = _mm_set1_epi8((char)r), pad = _mm_set1_epi8((char)0x80);
	__m128i idx = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
	const __m128i sixteen = _mm_set1_epi8(16);
	__m128i c[4] = {c0, c1, c2, c3};
	for (int j = 0; j < 4; j++, idx = _mm_add_epi8(idx, sixteen)) {
		__m128i keep = _mm_cmpgt_epi8(rr, idx); /* idx < r (all values < 64: signed is fine) */
		__m128i mark = _mm_and_si128(_mm_cmpeq_epi8(rr, idx), pad);
		c[j] = _mm_or_si128(_mm_and_si128(c[j], keep), mark);
	}
	__m128i len = _mm_set_epi64x((long long)__builtin_bswap64((uint64_t)n * 8), 0);
	if (r < 56) {
		shani_block(&s0, &s1, c[0], c[1], c[2], _mm_or_si128(c[3], len));
	} else {
		shani_block(&s0, &s1, c[0], c[1], c[2], c[3]);
		__m128i z = _mm_setzero_si128();
		shani_block(&s0, &s1, z, z, z, len);
	}
	shani_store(out, s0, s1);
}

/* The state words as the 32 digest bytes (big-endian words). */
SHANI void kvx_sha256_shani_bytes(const uint32_t state[8], uint8_t out[32]) {
	const __m128i be32 = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
	_mm_storeu_si128((__m128i *)out, _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)&state[0]), be32));
	_mm_storeu_si128((__m128i *)(out + 16), _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)&state[4]), be32));
}
#endif
