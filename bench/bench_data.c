#include "bench/bench_data.h"
#include "common/lowp.h" /* the rounding the collectives use */

#include <math.h>
#include <stdint.h>

double bench_get(const void *p, hpucoll_dtype t, size_t i)
{
	switch (t) {
	case HPUCOLL_F32:
		return ((const float *)p)[i];
	case HPUCOLL_F64:
		return ((const double *)p)[i];
	case HPUCOLL_F16:
		return hpu_from_fp16(((const uint16_t *)p)[i]);
	case HPUCOLL_BF16:
		return hpu_from_bf16(((const uint16_t *)p)[i]);
	case HPUCOLL_I32:
		return ((const int32_t *)p)[i];
	case HPUCOLL_I64:
		return (double)((const int64_t *)p)[i];
	default:
		return ((const uint8_t *)p)[i];
	}
}

void bench_set(void *p, hpucoll_dtype t, size_t i, double v)
{
	switch (t) {
	case HPUCOLL_F32:
		((float *)p)[i] = (float)v;
		break;
	case HPUCOLL_F64:
		((double *)p)[i] = v;
		break;
	case HPUCOLL_F16:
		((uint16_t *)p)[i] = hpu_to_fp16((float)v);
		break;
	case HPUCOLL_BF16:
		((uint16_t *)p)[i] = hpu_to_bf16((float)v);
		break;
	case HPUCOLL_I32:
		((int32_t *)p)[i] = (int32_t)v;
		break;
	case HPUCOLL_I64:
		((int64_t *)p)[i] = (int64_t)v;
		break;
	default:
		((uint8_t *)p)[i] = (uint8_t)v;
		break;
	}
}

#define FILL(T, CONV)                                                          \
	do {                                                                   \
		T enc[BENCH_PERIOD], *q = p;                                   \
		for (int j = 0; j < BENCH_PERIOD; j++)                         \
			enc[j] = CONV(vals[j]);                                \
		for (size_t k = 0, j = 0; k < n; k++) {                        \
			q[k] = enc[j];                                         \
			if (++j == BENCH_PERIOD)                               \
				j = 0;                                         \
		}                                                              \
	} while (0)

#define AS_F32(x) ((float)(x))
#define AS_F64(x) (x)
#define AS_F16(x) hpu_to_fp16((float)(x))
#define AS_BF16(x) hpu_to_bf16((float)(x))
#define AS_I32(x) ((int32_t)(x))
#define AS_I64(x) ((int64_t)(x))
#define AS_U8(x) ((uint8_t)(x))

void bench_fill(void *p, hpucoll_dtype t, size_t n, const double *vals)
{
	switch (t) {
	case HPUCOLL_F32:
		FILL(float, AS_F32);
		break;
	case HPUCOLL_F64:
		FILL(double, AS_F64);
		break;
	case HPUCOLL_F16:
		FILL(uint16_t, AS_F16);
		break;
	case HPUCOLL_BF16:
		FILL(uint16_t, AS_BF16);
		break;
	case HPUCOLL_I32:
		FILL(int32_t, AS_I32);
		break;
	case HPUCOLL_I64:
		FILL(int64_t, AS_I64);
		break;
	default:
		FILL(uint8_t, AS_U8);
		break;
	}
}

size_t bench_count_wrong(const void *p, hpucoll_dtype t, size_t n,
                         const double *want, const double *tol, size_t *first)
{
	size_t wrong = 0;
	*first = n;
	for (size_t k = 0, j = 0; k < n; k++) {
		if (!(fabs(bench_get(p, t, k) - want[j]) <= tol[j]) && !wrong++)
			*first = k;
		if (++j == BENCH_PERIOD)
			j = 0;
	}
	return wrong;
}

double bench_input(hpucoll_dtype t, size_t i, int r, int it)
{
	long v =
	    (long)((i * 7 + (size_t)r * 3 + (size_t)it * 5) % BENCH_PERIOD);
	return (double)(t == HPUCOLL_U8 ? v : v - 5);
}

/* The reduction over ranks of element i of the inputs. */
static double reduced(const struct bench_case *b, size_t i, int it)
{
	double acc = bench_input(b->dtype, i, 0, it);
	for (int r = 1; r < b->size; r++) {
		double v = bench_input(b->dtype, i, r, it);
		if (b->op == HPUCOLL_MAX)
			acc = v > acc ? v : acc;
		else if (b->op == HPUCOLL_MIN)
			acc = v < acc ? v : acc;
		else
			acc += v;
	}
	if (b->op != HPUCOLL_AVG)
		return b->dtype == HPUCOLL_U8 ? (double)((long)acc & 0xff)
		                              : acc;
	if (b->dtype == HPUCOLL_F32 || b->dtype == HPUCOLL_F64 ||
	    b->dtype == HPUCOLL_F16 || b->dtype == HPUCOLL_BF16)
		return acc / b->size;
	return (double)((long)acc / b->size); /* truncates toward zero */
}

double bench_expected(const struct bench_case *b, size_t k, int it)
{
	switch (b->coll) {
	case BENCH_ALL_REDUCE:
		return reduced(b, k, it);
	case BENCH_REDUCE_SCATTER:
		return reduced(b, (size_t)b->rank * b->count + k, it);
	case BENCH_ALL_GATHER:
		return bench_input(b->dtype, k % b->count, (int)(k / b->count),
		                   it);
	default:
		return bench_input(b->dtype, k, b->root, it);
	}
}

/* The rounding of the division, and of a sum/size computed as
 * sum * (1/size). */
double bench_tolerance(hpucoll_dtype t, hpucoll_op op, double want)
{
	if (op != HPUCOLL_AVG)
		return 0;
	double m = fabs(want) > 1 ? fabs(want) : 1;
	switch (t) {
	case HPUCOLL_F32:
		return m * 0x1p-22;
	case HPUCOLL_F64:
		return m * 0x1p-50;
	case HPUCOLL_F16:
		return m * 0x1p-9;
	case HPUCOLL_BF16:
		return m * 0x1p-6;
	default:
		return 0;
	}
}
