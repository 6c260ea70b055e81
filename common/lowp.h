/* lowp: 16-bit floating-point storage, converted with round to nearest
 * even. bf16 is the top half of an fp32; fp16 is IEEE binary16 (values
 * beyond 65504 round to infinity, small ones to subnormals or zero). NaN
 * stays NaN. Inline so that the conversion loops vectorize where they are
 * used. */
#ifndef HPU_LOWP_H
#define HPU_LOWP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t hpu_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t r = (x + 0x7fffu + ((x >> 16) & 1)) >> 16;
	uint32_t q = (x >> 16) | 0x40; /* a quiet NaN */
	return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
}

static inline float hpu_from_bf16(uint16_t h)
{
	uint32_t x = (uint32_t)h << 16;
	float f;
	memcpy(&f, &x, 4);
	return f;
}

static inline uint16_t hpu_to_fp16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
	if (ax > 0x7f800000u) /* NaN */
		return (uint16_t)(sign | 0x7e00u);
	if (ax >= 0x477ff000u) /* rounds to >= 65520: infinity */
		return (uint16_t)(sign | 0x7c00u);
	if (ax < 0x38800000u) { /* below 2^-14: subnormal or zero */
		if (ax < 0x33000000u) /* below half the smallest subnormal */
			return (uint16_t)sign;
		uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
		uint32_t shift = 126 - e; /* 14..24 */
		uint32_t half = m >> shift, rest = m & ((1u << shift) - 1);
		uint32_t mid = 1u << (shift - 1);
		if (rest > mid || (rest == mid && (half & 1)))
			half++;
		return (uint16_t)(sign | half);
	}
	uint32_t r = ax - 0x38000000u; /* rebias exponent 127 -> 15 */
	r = (r + 0xfffu + ((r >> 13) & 1)) >> 13;
	return (uint16_t)(sign | r);
}

static inline float hpu_from_fp16(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
	uint32_t x;
	if (e == 0x1f) {
		x = sign | 0x7f800000u | (m << 13);
	} else if (e) {
		x = sign | ((e + 112) << 23) | (m << 13);
	} else if (m) { /* subnormal: normalize */
		int s = 0;
		while (!(m & 0x400u)) {
			m <<= 1;
			s++;
		}
		x = sign | ((uint32_t)(113 - s) << 23) | ((m & 0x3ffu) << 13);
	} else {
		x = sign;
	}
	float f;
	memcpy(&f, &x, 4);
	return f;
}

/* ---- arrays, fp16 on the CPU's F16C instructions where it has them ----
 * vcvtps2ph with imm 0 rounds to nearest even like hpu_to_fp16 (also for
 * subnormals, overflow to infinity and NaN, which stays NaN), so the two
 * paths give the same bits. Call the F16C forms only where simd.h's
 * hpu_have_f16c() says the CPU has the instructions. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(HPU_NO_CLONES)
#include <immintrin.h>

__attribute__((target("avx2,f16c"))) static inline void
hpu__f16c_to_fp16(uint16_t *dst, const float *src, size_t n)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm_storeu_si128((__m128i *)(dst + i),
				 _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
	for (; i < n; i++)
		dst[i] = hpu_to_fp16(src[i]);
}

__attribute__((target("avx2,f16c"))) static inline void
hpu__f16c_from_fp16(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
		_mm256_storeu_ps(dst + i,
				 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
	for (; i < n; i++)
		dst[i] = hpu_from_fp16(src[i]);
}

/* dst[i] = fp16(src[i]) as float; dst may be src. */
__attribute__((target("avx2,f16c"))) static inline void
hpu__f16c_round_fp16(float *dst, const float *src, size_t n)
{
	size_t i = 0;
	for (; i + 8 <= n; i += 8)
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
