/* Run-time CPU feature choice of the kvexact hash core (internal). */
#ifndef KVX_CPU_H
#define KVX_CPU_H

/* 1 when the CPU offers SHA-NI with SSSE3 and SSE4.1. */
int kvx_cpu_has_shani(void);
/* 1 when the CPU offers AVX2 and the OS saves YMM state. */
int kvx_cpu_has_avx2(void);
/* 1 while kvx_force_portable(1) is in effect: every choice falls back to portable C. */
int kvx_portable_forced(void);

#endif
