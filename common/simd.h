/* simd: HPU_CLONES makes GCC compile a hot loop for AVX-512 and AVX2 as
 * well as the x86-64 baseline, and pick one when the program loads
 * (target_clones, an ifunc), so that one binary runs anywhere and is fast
 * where it can be. Use it on loops whose result does not depend on the
 * vector width: elementwise passes, or reductions with explicit lanes. The
 * build is ISO C (-std=c11), where GCC does not fuse a*b+c into an FMA, so
 * every clone rounds exactly as the baseline does. */
#ifndef HPU_SIMD_H
#define HPU_SIMD_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
	!defined(HPU_NO_CLONES)
#define HPU_CLONES __attribute__((target_clones("default", "avx2", "avx512f")))
/* 1 when the CPU has AVX2 and F16C: lowp.h's fp16 array conversions
 * may run (target_clones cannot name F16C). */
static inline int hpu_have_f16c(void)
{
	static int have = -1;
	if (have < 0)
		have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
	return have;
}
#else
#define HPU_CLONES
static inline int hpu_have_f16c(void)
{
	return 0;
}
#endif

#endif
