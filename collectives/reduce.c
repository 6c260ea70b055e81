/* The element-wise reduction kernels: dst[i] = a[i] op b[i] for every
 * dtype and op, and the division that finishes AVG.
 *
 * They are plain loops for the compiler to vectorize (this file is built
 * with -O3, the kernels also for AVX2 and AVX-512). Operands may come
 * straight off the wire, so no pointer is assumed aligned. Three variants
 * per dtype and op keep the loops free of aliasing checks: dst distinct
 * from both operands, dst == a, dst == b. The operand order is kept
 * (a op b), so that callers that need the same bytes on every rank can
 * fix it; it matters only for NaNs. hpucoll__reduce2 writes the same
 * result into two places (the caller's output and a shared-memory slot).
 *
 * f16 and bf16 are widened to f32, combined in f32 and rounded back to
 * nearest-even once per step, by common/lowp.h, as the worker rounds.
 * Signed integers add as unsigned, so that overflow wraps instead of
 * being undefined.
 */
#include <stdint.h>

#include "collectives/comm_internal.h"
#include "common/lowp.h" /* the conversions the worker uses too: one rounding */
#include "common/simd.h"

typedef float f32u __attribute__((aligned(1)));
typedef double f64u __attribute__((aligned(1)));
typedef uint16_t u16u __attribute__((aligned(1)));
typedef int32_t i32u __attribute__((aligned(1)));
typedef int64_t i64u __attribute__((aligned(1)));
typedef uint8_t u8u;

/* ---- the combining expressions, on values p (from a) and q (from b) ---- */

#define SUM(p, q) ((p) + (q))
#define MAX(p, q) ((p) > (q) ? (p) : (q))
#define MIN(p, q) ((p) < (q) ? (p) : (q))
#define USUM32(p, q) ((int32_t)((uint32_t)(p) + (uint32_t)(q)))
#define USUM64(p, q) ((int64_t)((uint64_t)(p) + (uint64_t)(q)))
#define USUM8(p, q) ((uint8_t)((p) + (q)))
#define HALF(OP, p, q) hpu_to_fp16(OP(hpu_from_fp16(p), hpu_from_fp16(q)))
#define BF(OP, p, q) hpu_to_bf16(OP(hpu_from_bf16(p), hpu_from_bf16(q)))
#define HSUM(p, q) HALF(SUM, p, q)
#define HMAX(p, q) HALF(MAX, p, q)
#define HMIN(p, q) HALF(MIN, p, q)
#define BSUM(p, q) BF(SUM, p, q)
#define BMAX(p, q) BF(MAX, p, q)
#define BMIN(p, q) BF(MIN, p, q)

typedef void (*kernel)(void *dst, const void *a, const void *b, size_t n);

/* Defines name_3 (dst distinct), name_a (dst == a) and name_b (dst == b)
 * for element type T combined by EXPR, each also compiled for AVX2 and
 * AVX-512 (simd.h): element by element, so every width gives the same
 * bits. */
#define KERNELS(name, T, EXPR)                                               \
	HPU_CLONES static void name##_3(void *dst, const void *a,             \
					const void *b, size_t n)             \
	{                                                                    \
		T *restrict d = dst;                                         \
		const T *restrict x = a;                                     \
		const T *restrict y = b;                                     \
                                                                             \
		for (size_t i = 0; i < n; i++)                               \
			d[i] = EXPR(x[i], y[i]);                             \
	}                                                                    \
	HPU_CLONES static void name##_a(void *dst, const void *a,             \
					const void *b, size_t n)             \
	{                                                                    \
		T *restrict d = dst;                                         \
		const T *restrict y = b;                                     \
                                                                             \
		(void)a;                                                     \
		for (size_t i = 0; i < n; i++)                               \
			d[i] = EXPR(d[i], y[i]);                             \
	}                                                                    \
	HPU_CLONES static void name##_b(void *dst, const void *a,             \
					const void *b, size_t n)             \
	{                                                                    \
		T *restrict d = dst;                                         \
		const T *restrict x = a;                                     \
                                                                             \
		(void)b;                                                     \
		for (size_t i = 0; i < n; i++)                               \
			d[i] = EXPR(x[i], d[i]);                             \
	}

/* name_2 (dst distinct from a) and name_2a (dst == a): the result into
 * dst and dst2, which overlaps nothing. */
#define KERNELS2(name, T, EXPR)                                              \
	HPU_CLONES static void name##_2(void *dst, void *dst2, const void *a, \
					const void *b, size_t n)             \
	{                                                                    \
		T *restrict d = dst;                                         \
		T *restrict e = dst2;                                        \
		const T *restrict x = a;                                     \
		const T *restrict y = b;                                     \
                                                                             \
		for (size_t i = 0; i < n; i++)                               \
			d[i] = e[i] = EXPR(x[i], y[i]);                      \
	}                                                                    \
	HPU_CLONES static void name##_2a(void *dst, void *dst2,               \
					 const void *a, const void *b,       \
					 size_t n)                           \
	{                                                                    \
		T *restrict d = dst;                                         \
		T *restrict e = dst2;                                        \
		const T *restrict y = b;                                     \
                                                                             \
		(void)a;                                                     \
		for (size_t i = 0; i < n; i++)                               \
			d[i] = e[i] = EXPR(d[i], y[i]);                      \
	}

KERNELS(f32_sum, f32u, SUM)
KERNELS(f32_max, f32u, MAX)
KERNELS(f32_min, f32u, MIN)
KERNELS(f64_sum, f64u, SUM)
KERNELS(f64_max, f64u, MAX)
KERNELS(f64_min, f64u, MIN)
KERNELS(f16_sum, u16u, HSUM)
KERNELS(f16_max, u16u, HMAX)
KERNELS(f16_min, u16u, HMIN)
KERNELS(bf16_sum, u16u, BSUM)
KERNELS(bf16_max, u16u, BMAX)
KERNELS(bf16_min, u16u, BMIN)
KERNELS(i32_sum, i32u, USUM32)
KERNELS(i32_max, i32u, MAX)
KERNELS(i32_min, i32u, MIN)
KERNELS(i64_sum, i64u, USUM64)
KERNELS(i64_max, i64u, MAX)
KERNELS(i64_min, i64u, MIN)
KERNELS(u8_sum, u8u, USUM8)
KERNELS(u8_max, u8u, MAX)
KERNELS(u8_min, u8u, MIN)

KERNELS2(f32_sum, f32u, SUM)
KERNELS2(f32_max, f32u, MAX)
KERNELS2(f32_min, f32u, MIN)
KERNELS2(f64_sum, f64u, SUM)
KERNELS2(f64_max, f64u, MAX)
KERNELS2(f64_min, f64u, MIN)
KERNELS2(f16_sum, u16u, HSUM)
KERNELS2(f16_max, u16u, HMAX)
KERNELS2(f16_min, u16u, HMIN)
KERNELS2(bf16_sum, u16u, BSUM)
KERNELS2(bf16_max, u16u, BMAX)
KERNELS2(bf16_min, u16u, BMIN)
KERNELS2(i32_sum, i32u, USUM32)
KERNELS2(i32_max, i32u, MAX)
KERNELS2(i32_min, i32u, MIN)
KERNELS2(i64_sum, i64u, USUM64)
KERNELS2(i64_max, i64u, MAX)
KERNELS2(i64_min, i64u, MIN)
KERNELS2(u8_sum, u8u, USUM8)
KERNELS2(u8_max, u8u, MAX)
KERNELS2(u8_min, u8u, MIN)

#define ROW(t)                                                               \
	{                                                                    \
		{t##_sum_3, t##_sum_a, t##_sum_b},                           \
			{t##_sum_3, t##_sum_a, t##_sum_b},                   \
			{t##_max_3, t##_max_a, t##_max_b},                   \
			{t##_min_3, t##_min_a, t##_min_b},                   \
	}

/* [dtype][op][variant]; AVG adds. */
static const kernel kernels[HPUCOLL_NUM_DTYPES][HPUCOLL_NUM_OPS][3] = {
	[HPUCOLL_F32] = ROW(f32), [HPUCOLL_F64] = ROW(f64),
	[HPUCOLL_F16] = ROW(f16), [HPUCOLL_BF16] = ROW(bf16),
	[HPUCOLL_I32] = ROW(i32), [HPUCOLL_I64] = ROW(i64),
	[HPUCOLL_U8] = ROW(u8),
};

void hpucoll__reduce(hpucoll_dtype dtype, hpucoll_op op, void *dst,
		     const void *a, const void *b, size_t n)
{
	int v = dst == a ? 1 : dst == b ? 2 : 0;

	kernels[dtype][op][v](dst, a, b, n);
}

typedef void (*kernel2)(void *dst, void *dst2, const void *a, const void *b,
			size_t n);

#define ROW2(t)                                                              \
	{                                                                    \
		{t##_sum_2, t##_sum_2a}, {t##_sum_2, t##_sum_2a},            \
			{t##_max_2, t##_max_2a}, {t##_min_2, t##_min_2a},    \
	}

/* [dtype][op][dst == a]; AVG adds. */
static const kernel2 kernels2[HPUCOLL_NUM_DTYPES][HPUCOLL_NUM_OPS][2] = {
	[HPUCOLL_F32] = ROW2(f32), [HPUCOLL_F64] = ROW2(f64),
	[HPUCOLL_F16] = ROW2(f16), [HPUCOLL_BF16] = ROW2(bf16),
	[HPUCOLL_I32] = ROW2(i32), [HPUCOLL_I64] = ROW2(i64),
	[HPUCOLL_U8] = ROW2(u8),
};

void hpucoll__reduce2(hpucoll_dtype dtype, hpucoll_op op, void *dst,
		      void *dst2, const void *a, const void *b, size_t n)
{
	kernels2[dtype][op][dst == a](dst, dst2, a, b, n);
}

/* ---- AVG: the division by the number of ranks ---- */

#define DIVIDE(name, T, CALC)                                                \
	static void name(void *x, size_t n, int by)                          \
	{                                                                    \
		T *p = x;                                                    \
                                                                             \
		for (size_t i = 0; i < n; i++)                               \
			p[i] = CALC(p[i], by);                               \
	}

#define FDIV(v, by) ((v) / (float)(by))
#define DDIV(v, by) ((v) / (double)(by))
#define HDIV(v, by) hpu_to_fp16(hpu_from_fp16(v) / (float)(by))
#define BDIV(v, by) hpu_to_bf16(hpu_from_bf16(v) / (float)(by))
#define IDIV(v, by) ((v) / (by))
#define U8DIV(v, by) ((uint8_t)((v) / (unsigned)(by)))

DIVIDE(div_f32, f32u, FDIV)
DIVIDE(div_f64, f64u, DDIV)
DIVIDE(div_f16, u16u, HDIV)
DIVIDE(div_bf16, u16u, BDIV)
DIVIDE(div_i32, i32u, IDIV)
DIVIDE(div_i64, i64u, IDIV)
DIVIDE(div_u8, u8u, U8DIV)

void hpucoll__divide(hpucoll_dtype dtype, void *x, size_t n, int by)
{
	static void (*const fn[HPUCOLL_NUM_DTYPES])(void *, size_t, int) = {
		[HPUCOLL_F32] = div_f32, [HPUCOLL_F64] = div_f64,
		[HPUCOLL_F16] = div_f16, [HPUCOLL_BF16] = div_bf16,
		[HPUCOLL_I32] = div_i32, [HPUCOLL_I64] = div_i64,
		[HPUCOLL_U8] = div_u8,
	};

	fn[dtype](x, n, by);
}
