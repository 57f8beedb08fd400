/*
 * SHA-256 for the kvexact hash core: one streaming context over a compression function chosen once
 * at run time (SHA-NI on x86-64 CPUs that have it, else portable C). Internal to the hash core.
 */
#ifndef KVX_SHA256_H
#define KVX_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
	uint32_t h[8];
	uint64_t total;      /* bytes absorbed so far */
	uint8_t buf[64];     /* partial block */
	size_t buf_len;
} kvx_sha256_ctx;

/* A compression function: absorbs n_blocks consecutive 64-byte blocks into state. */
typedef void (*kvx_sha256_compress_fn)(uint32_t state[8], const uint8_t *blocks, size_t n_blocks);

void kvx_sha256_compress_portable(uint32_t state[8], const uint8_t *blocks, size_t n_blocks);
#if defined(__x86_64__) || defined(__i386__)
#define KVX_HAVE_SHANI_BUILD 1
void kvx_sha256_compress_shani(uint32_t state[8], const uint8_t *blocks, size_t n_blocks);
/* SHA-256 of msg[0:n] with bytes [off, off+32) taken from parent's digest when parent != NULL
 * (off <= 16); needs 64 readable bytes past msg[n-1]. Writes the final state words. */
void kvx_sha256_shani_digest(const uint8_t *msg, size_t n, const uint32_t *parent, size_t off,
                             uint32_t out[8]);
/* State words -> the 32 digest bytes. */
void kvx_sha256_shani_bytes(const uint32_t state[8], uint8_t out[32]);
#endif

/* The compression function in use (portable when forced or when the CPU lacks SHA-NI). */
kvx_sha256_compress_fn kvx_sha256_compressor(void);

void kvx_sha256_init(kvx_sha256_ctx *c);
void kvx_sha256_update(kvx_sha256_ctx *c, kvx_sha256_compress_fn f, const uint8_t *p, size_t n);
void kvx_sha256_final(kvx_sha256_ctx *c, kvx_sha256_compress_fn f, uint8_t out[32]);

/* One-shot digest of a contiguous buffer with the given compressor. */
void kvx_sha256_oneshot(kvx_sha256_compress_fn f, const uint8_t *p, size_t n, uint8_t out[32]);

#endif
