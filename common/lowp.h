/* lowp: 16-bit floating-point storage, the one conversion every part of
 * the system uses (the collectives' f16/bf16 reductions, mixed precision,
 * autocast, the benchmarks), so that a value rounds to the same bits
 * wherever it is rounded.
 *
 * bf16 is the top half of an fp32; fp16 is IEEE binary16. Narrowing rounds
 * to nearest, ties to even: values beyond the largest finite one by half
 * an ulp or more (65520 for fp16) become infinity, small ones subnormals
 * or zero. A NaN stays a NaN with its sign, the top bits of its payload
 * and the quiet bit set, as the CPU's F16C conversion (vcvtps2ph) does.
 * Widening is exact; an fp16 NaN is quieted as F16C's vcvtph2ps does, a
 * bf16 one is the fp32 with the same top half.
 *
 * Inline and branch-free (every case computed, the answer selected), so
 * that the loops that call them vectorize, even on the x86-64 baseline.
 * The fp16 subnormal cases use one f32 addition or subtraction that is
 * exact or rounds as wanted in the default rounding mode (to nearest),
 * with normal operands and results only: flush-to-zero does not touch
 * them. */
#ifndef HPU_LOWP_H
#define HPU_LOWP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t hpu__f32_bits(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	return x;
}

static inline float hpu__bits_f32(uint32_t x)
{
	float f;
	memcpy(&f, &x, 4);
	return f;
}

static inline uint16_t hpu_to_bf16(float f)
{
	uint32_t x = hpu__f32_bits(f);
	uint32_t r = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;
	uint32_t q = (x >> 16) | 0x40; /* a quiet NaN */
	return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
}

static inline float hpu_from_bf16(uint16_t h)
{
	return hpu__bits_f32((uint32_t)h << 16);
}

/* a where c, else b, by masks: a ?: would let GCC sink the f32 operation
 * computing a into a branch (it may trap), and the loop would not
 * vectorize. */
static inline uint32_t hpu__select(int c, uint32_t a, uint32_t b)
{
	uint32_t m = -(uint32_t)c;
	return (a & m) | (b & ~m);
}

static inline uint16_t hpu_to_fp16(float f)
{
	uint32_t x = hpu__f32_bits(f), ax = x & 0x7fffffffu;
	uint32_t sign = (x >> 16) & 0x8000u;
	/* Normal: rebias the exponent (127 -> 15) and round off 13 bits; a
	 * carry out of the mantissa moves into the exponent, up to infinity
	 * from 65520 on. */
	uint32_t norm = (ax - (112u << 23) + 0xfffu + ((ax >> 13) & 1)) >> 13;
	/* Below 2^-14: in 0.5 + ax the f32 ulp is 2^-24, binary16's smallest
	 * subnormal, so the f32 addition rounds to the subnormal's bits. */
	uint32_t sub = hpu__f32_bits(hpu__bits_f32(ax) + 0.5f) - 0x3f000000u;
	uint32_t nan = 0x7e00u | ((ax >> 13) & 0x3ffu);
	uint32_t big = ax > 0x7f800000u ? nan : 0x7c00u;
	uint32_t r = hpu__select(ax < 0x38800000u, sub, ax < 0x47800000u ? norm : big);
	return (uint16_t)(sign | r);
}

static inline float hpu_from_fp16(uint16_t h)
{
	uint32_t u = (uint32_t)(h & 0x7fffu) << 13; /* in the f32 places */
	uint32_t e = u & 0x0f800000u;
	uint32_t norm = u + (112u << 23); /* rebias the exponent 15 -> 127 */
	uint32_t big = (norm + (112u << 23)) | (u > 0x0f800000u ? 0x400000u : 0);
	/* Zero and subnormals: 2^-14 + m 2^-24 is exact, and so is taking
	 * 2^-14 off again. */
	uint32_t sub = hpu__f32_bits(hpu__bits_f32(u + (113u << 23)) - 0x1p-14f);
	uint32_t r = hpu__select(e == 0, sub, e == 0x0f800000u ? big : norm);
	return hpu__bits_f32(r | (uint32_t)(h & 0x8000u) << 16);
}

/* ---- arrays, fp16 on the CPU's F16C instructions where it has them ----
 * vcvtps2ph with imm 0 rounds to nearest even like hpu_to_fp16 (also for
 * subnormals, overflow to infinity and NaN), and vcvtph2ps widens like
 * hpu_from_fp16, so the two paths give the same bits (test_lowp checks
 * every input). Call the F16C forms only where simd.h's
 * hpu_have_f16c() says the CPU has the instructions. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(HPU_NO_CLONES)
#include <immintrin.h>

__attribute__((target("avx2,f16c"))) static inline void
hpu__f16c_to_fp16(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0, m = n & ~(size_t)7; /* whole vectors of 8 */
	for (; i < m; i += 8)
		_mm_storeu_si128((__m128i *)(dst + i),
				 _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		dst[i] = hpu_to_fp16(src[i]);
}

__attribute__((target("avx2,f16c"))) static inline void
hpu__f16c_from_fp16(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0, m = n & ~(size_t)7; /* whole vectors of 8 */
	for (; i < m; i += 8)
		_mm256_storeu_ps(dst + i,
				 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
	for (; i < n; i++)
		dst[i] = hpu_from_fp16(src[i]);
}

/* dst[i] = fp16(src[i]) as float; dst may be src. */
__attribute__((target("avx2,f16c"))) static inline void
hpu__f16c_round_fp16(float *dst, const float *src, size_t n)
{
	size_t i = 0, m = n & ~(size_t)7; /* whole vectors of 8 */
	for (; i < m; i += 8)
		_mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_cvtps_ph(
						  _mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT)));
	for (; i < n; i++)
		dst[i] = hpu_from_fp16(hpu_to_fp16(src[i]));
}
#else
static inline void hpu__f16c_to_fp16(uint16_t *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = hpu_to_fp16(src[i]);
}
static inline void hpu__f16c_from_fp16(float *dst, const uint16_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = hpu_from_fp16(src[i]);
}
static inline void hpu__f16c_round_fp16(float *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = hpu_from_fp16(hpu_to_fp16(src[i]));
}
#endif

#endif
