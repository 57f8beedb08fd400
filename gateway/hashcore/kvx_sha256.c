/*
 * SHA-256 (FIPS 180-4): the portable compression function, the streaming layer, and the run-time
 * choice of compressor. The SHA-NI compressor lives in kvx_sha256_x86.c, compiled for its own target.
 */
#include <string.h>

#include "kvx_cpu.h"
#include "kvx_hashcore.h"
#include "kvx_sha256.h"

static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror32(uint32_t x, unsigned n) { return (x >> n) | (x << (32 - n)); }

static inline uint32_t load_be32(const uint8_t *p) {
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline void store_be32(uint8_t *p, uint32_t v) {
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

void kvx_sha256_compress_portable(uint32_t state[8], const uint8_t *blocks, size_t n_blocks) {
	uint32_t w[64];
	for (; n_blocks > 0; n_blocks--, blocks += 64) {
		for (int i = 0; i < 16; i++) w[i] = load_be32(blocks + 4 * i);
		for (int i = 16; i < 64; i++) {
			uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
			uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
			w[i] = w[i - 16] + s0 + w[i - 7] + s1;
		}
		uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
		uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
		for (int i = 0; i < 64; i++) {
			uint32_t S1 = ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25);
			uint32_t ch = (e & f) ^ (~e & g);
			uint32_t t1 = h + S1 + ch + K[i] + w[i];
			uint32_t S0 = ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22);
			uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
			uint32_t t2 = S0 + maj;
			h = g;
			g = f;
			f = e;
			e = d + t1;
			d = c;
			c = b;
			b = a;
			a = t1 + t2;
		}
		state[0] += a;
		state[1] += b;
		state[2] += c;
		state[3] += d;
		state[4] += e;
		state[5] += f;
		state[6] += g;
		state[7] += h;
	}
}

/* ---- run-time choice ---------------------------------------------------------------------- */

kvx_sha256_compress_fn kvx_sha256_compressor(void) {
#if defined(KVX_HAVE_SHANI_BUILD)
	if (!kvx_portable_forced() && kvx_cpu_has_shani()) return kvx_sha256_compress_shani;
#endif
	return kvx_sha256_compress_portable;
}

const char *kvx_sha256_impl(void) {
	return kvx_sha256_compressor() == kvx_sha256_compress_portable ? "portable" : "sha-ni";
}

/* ---- streaming -------------------------------------------------------------------------- */

static const uint32_t IV[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

void kvx_sha256_init(kvx_sha256_ctx *c) {
	memcpy(c->h, IV, sizeof IV);
	c->total = 0;
	c->buf_len = 0;
}

void kvx_sha256_update(kvx_sha256_ctx *c, kvx_sha256_compress_fn f, const uint8_t *p, size_t n) {
	c->total += n;
	if (n == 0) return;
	if (c->buf_len > 0) {
		size_t take = 64 - c->buf_len;
		if (take > n) take = n;
		memcpy(c->buf + c->buf_len, p, take);
		c->buf_len += take;
		p += take;
		n -= take;
		if (c->buf_len < 64) return;
		f(c->h, c->buf, 1);
		c->buf_len = 0;
	}
	if (n >= 64) {
		f(c->h, p, n / 64);
		p += n & ~(size_t)63;
		n &= 63;
	}
	if (n > 0) {
		memcpy(c->buf, p, n);
		c->buf_len = n;
	}
}

void kvx_sha256_final(kvx_sha256_ctx *c, kvx_sha256_compress_fn f, uint8_t out[32]) {
	uint64_t bits = c->total * 8;
	uint8_t pad[128];
	size_t n = c->buf_len;
	memcpy(pad, c->buf, n);
	pad[n++] = 0x80;
	size_t total = (n <= 56) ? 64 : 128;
	memset(pad + n, 0, total - 8 - n);
	for (int i = 0; i < 8; i++) pad[total - 1 - i] = (uint8_t)(bits >> (8 * i));
	f(c->h, pad, total / 64);
	for (int i = 0; i < 8; i++) store_be32(out + 4 * i, c->h[i]);
}

void kvx_sha256_oneshot(kvx_sha256_compress_fn f, const uint8_t *p, size_t n, uint8_t out[32]) {
	kvx_sha256_ctx c;
	kvx_sha256_init(&c);
	/* Whole blocks straight from the input; only the tail is copied (in final). */
	if (n >= 64) f(c.h, p, n / 64);
	size_t whole = n & ~(size_t)63;
	c.total = n;
	c.buf_len = n - whole;
	if (c.buf_len > 0) memcpy(c.buf, p + whole, c.buf_len);
	kvx_sha256_final(&c, f, out);
}
