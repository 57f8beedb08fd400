/*
 * Portable token-id encoders and the run-time choice between them and the AVX2 ones.
 */
#include <string.h>

#include "kvx_cpu.h"
#include "kvx_encode.h"
#include "kvx_hashcore.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KVX_LE 1
#else
#define KVX_LE 0
#endif

/* Canonical CBOR uint: head 0x00+v (v < 24), 0x18 + 1 byte, 0x19 + 2, 0x1a + 4, big-endian. */
uint8_t *kvx_msgpack_tokens(uint8_t *p, const uint32_t *t, size_t n) {
#if KVX_LE
	/* As the CBOR encoder: one 8-byte store of head ‖ big-endian argument, advanced by its length
	 * (positive fixint ≤ 0x7f is its own head; uint8 0xcc, uint16 0xcd, uint32 0xce). */
	static const uint8_t head[4] = {0x00, 0xCC, 0xCD, 0xCE};
	static const uint8_t shift[4] = {56, 48, 40, 24};
	static const uint8_t len[4] = {1, 2, 3, 5};
	for (size_t i = 0; i < n; i++) {
		uint32_t v = t[i];
		unsigned c = (v > 0x7F) + (v > 0xFF) + (v > 0xFFFF);
		uint64_t w = (__builtin_bswap64((uint64_t)v) >> shift[c]) | head[c];
		memcpy(p, &w, 8);
		p += len[c];
	}
#else
	for (size_t i = 0; i < n; i++) {
		uint32_t v = t[i];
		if (v <= 0x7F) {
			*p++ = (uint8_t)v;
		} else if (v <= 0xFF) {
			*p++ = 0xCC, *p++ = (uint8_t)v;
		} else if (v <= 0xFFFF) {
			*p++ = 0xCD, *p++ = (uint8_t)(v >> 8), *p++ = (uint8_t)v;
		} else {
			*p++ = 0xCE;
			for (int k = 3; k >= 0; k--) *p++ = (uint8_t)(v >> (8 * k));
		}
	}
#endif
	return p;
}

uint8_t *kvx_cbor_tokens_portable(uint8_t *p, const uint32_t *t, size_t n) {
#if KVX_LE
	/* Branch-free: one 8-byte store of head ‖ argument, advanced by its length. bswap64(v) holds
	 * v most significant first in bytes 4..7; shifting right by 56 - 8w keeps the w argument bytes
	 * at bytes 1..w (w = 0: byte 0 is v itself, its own head). */
	static const uint8_t head[4] = {0x00, 0x18, 0x19, 0x1A};
	static const uint8_t shift[4] = {56, 48, 40, 24};
	static const uint8_t len[4] = {1, 2, 3, 5};
	for (size_t i = 0; i < n; i++) {
		uint32_t v = t[i];
		unsigned c = (v > 23) + (v > 0xFF) + (v > 0xFFFF);
		uint64_t w = (__builtin_bswap64((uint64_t)v) >> shift[c]) | head[c];
		memcpy(p, &w, 8);
		p += len[c];
	}
#else
	for (size_t i = 0; i < n; i++) {
		uint32_t v = t[i];
		if (v < 24) {
			*p++ = (uint8_t)v;
		} else if (v <= 0xFF) {
			*p++ = 0x18, *p++ = (uint8_t)v;
		} else if (v <= 0xFFFF) {
			*p++ = 0x19, *p++ = (uint8_t)(v >> 8), *p++ = (uint8_t)v;
		} else {
			*p++ = 0x1A;
			for (int k = 3; k >= 0; k--) *p++ = (uint8_t)(v >> (8 * k));
		}
	}
#endif
	return p;
}

/* pickle save_long for a uint32: BININT1 (0..255), BININT2 (..65535), BININT (..2^31-1), else
 * LONG1 with 5 bytes (the top one 0x00 keeps the sign positive). */
uint8_t *kvx_pickle_tokens_portable(uint8_t *p, const uint32_t *t, size_t n) {
#if KVX_LE
	static const uint64_t op[4] = {0x4B, 0x4D, 0x4A, 0x058A};
	static const uint8_t shift[4] = {8, 8, 8, 16};
	static const uint8_t len[4] = {2, 3, 5, 7};
	for (size_t i = 0; i < n; i++) {
		uint32_t v = t[i];
		unsigned c = (v > 0xFF) + (v > 0xFFFF) + (v > 0x7FFFFFFF);
		uint64_t w = op[c] | ((uint64_t)v << shift[c]);
		memcpy(p, &w, 8);
		p += len[c];
	}
#else
	for (size_t i = 0; i < n; i++) {
		uint32_t v = t[i];
		int k;
		if (v <= 0xFF) *p++ = 'K', k = 1;
		else if (v <= 0xFFFF) *p++ = 'M', k = 2;
		else if (v <= 0x7FFFFFFF) *p++ = 'J', k = 4;
		else *p++ = 0x8A, *p++ = 5, k = 5;
		for (int j = 0; j < k; j++) *p++ = (uint8_t)(j < 4 ? v >> (8 * j) : 0);
	}
#endif
	return p;
}

kvx_encoders kvx_token_encoders(void) {
	kvx_encoders e = {kvx_cbor_tokens_portable, kvx_pickle_tokens_portable};
#if defined(KVX_HAVE_AVX2_BUILD)
	if (!kvx_portable_forced() && kvx_cpu_has_avx2()) {
		e.cbor = kvx_cbor_tokens_avx2;
		e.pickle = kvx_pickle_tokens_avx2;
	}
#endif
	return e;
}

const char *kvx_encoder_impl(void) {
	return kvx_token_encoders().cbor == kvx_cbor_tokens_portable ? "portable" : "avx2";
}
