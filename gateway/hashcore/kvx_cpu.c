/*
 * CPU features, probed once (CPUID, XGETBV), and the debug switch that forces the portable code.
 * Racing first callers probe the same answer and store the same value, so no lock is needed.
 */
#include "kvx_cpu.h"
#include "kvx_hashcore.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define KVX_X86 1
#endif

enum { F_SHANI = 1, F_AVX2 = 2, F_PROBED = 0x100 };

static int features = 0;
static int force_portable = 0;

static int probe(void) {
	int f = F_PROBED;
#if defined(KVX_X86)
	unsigned a, b, c, d;
	if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
	int ssse3 = (c >> 9) & 1, sse41 = (c >> 19) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
	unsigned b7 = 0;
	if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) b7 = b;
	if (ssse3 && sse41 && ((b7 >> 29) & 1)) f |= F_SHANI;
	if (osxsave && avx && ((b7 >> 5) & 1)) {
		unsigned lo, hi;
		__asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
		if ((lo & 6) == 6) f |= F_AVX2; /* XMM and YMM state saved by the OS */
	}
#endif
	return f;
}

static int cpu(void) {
	int f = __atomic_load_n(&features, __ATOMIC_RELAXED);
	if (!(f & F_PROBED)) {
		f = probe();
		__atomic_store_n(&features, f, __ATOMIC_RELAXED);
	}
	return f;
}

int kvx_cpu_has_shani(void) { return (cpu() & F_SHANI) != 0; }
int kvx_cpu_has_avx2(void) { return (cpu() & F_AVX2) != 0; }

void kvx_force_portable(int on) { __atomic_store_n(&force_portable, on ? 1 : 0, __ATOMIC_RELAXED); }
int kvx_portable_forced(void) { return __atomic_load_n(&force_portable, __ATOMIC_RELAXED); }
