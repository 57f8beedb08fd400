/*
 * Stand-alone timing of the kvexact C hash core, without Go, cgo or a garbage collector in the
 * way: the whole-prompt chain (kvx_chain) against the floor, the digest function alone over the
 * very same pre-image bytes (kvx_digest_many), independent and chained. Each figure is the minimum
 * over many runs of wall-clock time, which a preempting neighbour can only make larger, so it stays
 * meaningful on a busy machine. The chain's digests are checked against the floor's.
 *
 * Build and run from gateway/hashcore (see docs/benchmarks/hashcore.md):
 *   gcc -O3 -std=gnu11 -I. -o /tmp/kvx-cbench cbench/bench.c kvx_*.c && /tmp/kvx-cbench [reps]
 *
 * The prompt is 8192 pseudo-random ids below 128256 (a Llama 3 vocabulary) at block size 16, the
 * root an all-zero digest (the parent bytes do not change the cost), no extra keys.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvx_hashcore.h"

enum { N = 8192, BS = 16, BLOCKS = N / BS, MAXPRE = 7 * BS + 64 };

static double now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static uint32_t tokens[N];
static uint8_t digests[BLOCKS * 32], floor_digests[BLOCKS * 32];
static uint64_t keys[BLOCKS];
static uint8_t pre[BLOCKS * MAXPRE + 64];
static size_t ends[BLOCKS];

/* Parent offset in a pre-image of block >= 1 (see parentOffset in cgo_bench_test.go). */
static ptrdiff_t parent_offset(int algo) {
	switch (algo) {
	case KVX_VLLM_SHA256:
	case KVX_VLLM_XXHASH: return 13;
	case KVX_VLLM_SHA256_CBOR: return 3;
	case KVX_VLLM_XXHASH_CBOR: return 2;
	}
	return 0;
}

static int run(int algo, const char *name, int reps) {
	const size_t dl = kvx_digest_len(algo);
	uint8_t root[32] = {0};
	size_t root_len = algo == KVX_ROUTER_XXH3_V1 ? 8 : algo == KVX_SGLANG_SHA256 ? 0 : dl;
	/* Pre-images, block by block, from the chain itself (its block-0 output). */
	const uint8_t *parent = root;
	size_t parent_len = root_len, off = 0;
	for (size_t b = 0; b < BLOCKS; b++) {
		kvx_chain_args a = {.algo = algo, .block_size = BS, .parent = parent, .parent_len = parent_len,
		                    .tokens = tokens + b * BS, .n_tokens = BS, .n_blocks = 1,
		                    .digests = digests + b * dl, .digests_len = dl, .keys = keys + b, .keys_len = 1,
		                    .pre0 = pre + off, .pre0_cap = MAXPRE};
		int rc = kvx_chain(&a);
		if (rc != KVX_OK) {
			fprintf(stderr, "%s: block %zu: %s\n", name, b, kvx_status_text(rc));
			return 1;
		}
		off += a.pre0_len;
		ends[b] = off;
		parent = digests + b * dl;
		parent_len = dl;
	}
	double best[3] = {1e30, 1e30, 1e30};
	for (int r = 0; r < reps; r++) {
		kvx_chain_args a = {.algo = algo, .block_size = BS, .parent = root, .parent_len = root_len,
		                    .tokens = tokens, .n_tokens = N, .n_blocks = BLOCKS, .digests = digests,
		                    .digests_len = sizeof digests, .keys = keys, .keys_len = BLOCKS};
		double t0 = now_ns();
		int rc = kvx_chain(&a);
		double t1 = now_ns();
		rc |= kvx_digest_many(algo, pre, off + 64, ends, BLOCKS, floor_digests, sizeof floor_digests, -1);
		double t2 = now_ns();
		rc |= kvx_digest_many(algo, pre, off + 64, ends, BLOCKS, floor_digests, sizeof floor_digests,
		                      parent_offset(algo));
		double t3 = now_ns();
		if (rc != KVX_OK || memcmp(digests, floor_digests, BLOCKS * dl) != 0) {
			fprintf(stderr, "%s: chain and floor disagree (status %d)\n", name, rc);
			return 1;
		}
		if (t1 - t0 < best[0]) best[0] = t1 - t0;
		if (t2 - t1 < best[1]) best[1] = t2 - t1;
		if (t3 - t2 < best[2]) best[2] = t3 - t2;
	}
	printf("| `%s` | %s+%s | %.1f | %.1f | %.1f | %.2f× | %.2f× |\n", name, kvx_sha256_impl(), kvx_encoder_impl(),
	       best[0] / 1e3, best[1] / 1e3, best[2] / 1e3, best[0] / best[1], best[0] / best[2]);
	return 0;
}

int main(int argc, char **argv) {
	int reps = argc > 1 ? atoi(argv[1]) : 2000;
	uint32_t x = 42;
	for (int i = 0; i < N; i++) {
		x = x * 1664525u + 1013904223u;
		tokens[i] = (x >> 8) % 128256;
	}
	static const struct { int algo; const char *name; } algos[] = {
		{KVX_VLLM_SHA256, "sha256"}, {KVX_VLLM_SHA256_CBOR, "sha256_cbor"}, {KVX_VLLM_XXHASH, "xxhash"},
		{KVX_VLLM_XXHASH_CBOR, "xxhash_cbor"}, {KVX_SGLANG_SHA256, "sglang_sha256"},
		{KVX_ROUTER_XXH3_V1, "kvexact-xxh3-v1"},
	};
	printf("| binding | code | chain µs | floor µs | floor-chained µs | chain/floor | chain/floor-chained |\n");
	printf("|---|---|---|---|---|---|---|\n");
	for (int portable = 0; portable <= 1; portable++) {
		kvx_force_portable(portable);
		for (size_t i = 0; i < sizeof algos / sizeof algos[0]; i++)
			if (run(algos[i].algo, algos[i].name, reps)) return 1;
	}
	return 0;
}
