/*
 * AVX2 token-id encoders: four ids per step. Each id becomes one 64-bit lane holding its encoded
 * bytes (head or opcode first); a table lookup (pshufb) by the id's size class gives the shift and
 * head, and a byte-wise multiply turns the four lengths into store offsets. Compiled for AVX2 only
 * in this file; kvx_encode.c calls it only after CPUID/XGETBV say the CPU and OS support it.
 */
#include <string.h>

#include "kvx_encode.h"

#if defined(KVX_HAVE_AVX2_BUILD)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2")))

static inline void store64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* Size class of each 32-bit lane (0..3): how many of the thresholds t1 < t2 < t3 (unsigned) it
 * reaches. */
AVX2 static inline __m128i size_class(__m128i v, __m128i t1, __m128i t2, __m128i t3) {
	__m128i a = _mm_cmpeq_epi32(_mm_max_epu32(v, t1), v);
	__m128i b = _mm_cmpeq_epi32(_mm_max_epu32(v, t2), v);
	__m128i c = _mm_cmpeq_epi32(_mm_max_epu32(v, t3), v);
	return _mm_sub_epi32(_mm_setzero_si128(), _mm_add_epi32(_mm_add_epi32(a, b), c));
}

/* Stores four encoded lanes back to back given their lengths looked up from len_tbl by class. */
AVX2 static inline uint8_t *store4(uint8_t *p, __m256i w, __m128i cls, __m128i len_tbl) {
	const __m128i gather = _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
	uint32_t lens = (uint32_t)_mm_cvtsi128_si32(_mm_shuffle_epi8(len_tbl, _mm_shuffle_epi8(cls, gather)));
	uint32_t ends = lens * 0x01010101u; /* byte k = len0 + ... + lenk (each sum <= 28) */
	__m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
	store64(p, (uint64_t)_mm_cvtsi128_si64(lo));
	store64(p + (ends & 0xFF), (uint64_t)_mm_extract_epi64(lo, 1));
	store64(p + ((ends >> 8) & 0xFF), (uint64_t)_mm_cvtsi128_si64(hi));
	store64(p + ((ends >> 16) & 0xFF), (uint64_t)_mm_extract_epi64(hi, 1));
	return p + (ends >> 24);
}

/* pshufb index selecting table entry `class` into byte 0 of each 64-bit lane, zero elsewhere. */
AVX2 static inline __m256i lane_index(__m128i cls) {
	const __m256i high = _mm256_set1_epi64x((long long)0x8080808080808000ULL);
	return _mm256_or_si256(_mm256_cvtepu32_epi64(cls), high);
}

AVX2 uint8_t *kvx_cbor_tokens_avx2(uint8_t *p, const uint32_t *t, size_t n) {
	/* Lane bytes after bswap64 hold the id most significant first in bytes 4..7; shifting right by
	 * 56 - 8w keeps the w argument bytes at bytes 1..w (w = 0: byte 0 is the id, its own head). */
	const __m256i bswap = _mm256_setr_epi8(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8,
	                                       7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8);
	const __m256i shift = _mm256_setr_epi8(56, 48, 40, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	                                       56, 48, 40, 24, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
	const __m256i head = _mm256_setr_epi8(0, 0x18, 0x19, 0x1A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	                                      0, 0x18, 0x19, 0x1A, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
	const __m128i len = _mm_setr_epi8(1, 2, 3, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
	const __m128i t1 = _mm_set1_epi32(24), t2 = _mm_set1_epi32(256), t3 = _mm_set1_epi32(65536);
	for (; n >= 4; n -= 4, t += 4) {
		__m128i v = _mm_loadu_si128((const __m128i *)t);
		__m128i cls = size_class(v, t1, t2, t3);
		__m256i idx = lane_index(cls);
		__m256i w = _mm256_shuffle_epi8(_mm256_cvtepu32_epi64(v), bswap);
		w = _mm256_srlv_epi64(w, _mm256_shuffle_epi8(shift, idx));
		w = _mm256_or_si256(w, _mm256_shuffle_epi8(head, idx));
		p = store4(p, w, cls, len);
	}
	return kvx_cbor_tokens_portable(p, t, n);
}

AVX2 uint8_t *kvx_pickle_tokens_avx2(uint8_t *p, const uint32_t *t, size_t n) {
	/* Lane = opcode (LONG1 has two bytes: 0x8a 0x05) | id << 8 or 16, little-endian. The opcode
	 * table is indexed by class for byte 0 and by class + 4 for byte 1. */
	const __m256i op = _mm256_setr_epi8(0x4B, 0x4D, 0x4A, (char)0x8A, 0, 0, 0, 0x05, 0, 0, 0, 0, 0, 0, 0, 0,
	                                    0x4B, 0x4D, 0x4A, (char)0x8A, 0, 0, 0, 0x05, 0, 0, 0, 0, 0, 0, 0, 0);
	const __m256i shift = _mm256_setr_epi8(8, 8, 8, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	                                       8, 8, 8, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
	const __m256i plus4 = _mm256_set1_epi64x(0x0400);
	const __m128i len = _mm_setr_epi8(2, 3, 5, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
	const __m128i t1 = _mm_set1_epi32(256), t2 = _mm_set1_epi32(65536),
	              t3 = _mm_set1_epi32((int)0x80000000u);
	for (; n >= 4; n -= 4, t += 4) {
		__m128i v = _mm_loadu_si128((const __m128i *)t);
		__m128i cls = size_class(v, t1, t2, t3);
		__m256i idx = lane_index(cls);
		/* byte 1 of the opcode index: class + 4 (byte 1 of idx is 0x80 before: clear it first) */
		__m256i c64 = _mm256_cvtepu32_epi64(cls);
		__m256i opidx = _mm256_or_si256(
		        _mm256_and_si256(idx, _mm256_set1_epi64x((long long)0x80808080808000FFULL)),
		        _mm256_add_epi64(_mm256_slli_epi64(c64, 8), plus4));
		__m256i w = _mm256_sllv_epi64(_mm256_cvtepu32_epi64(v), _mm256_shuffle_epi8(shift, idx));
		w = _mm256_or_si256(w, _mm256_shuffle_epi8(op, opidx));
		p = store4(p, w, cls, len);
	}
	return kvx_pickle_tokens_portable(p, t, n);
}
#endif
