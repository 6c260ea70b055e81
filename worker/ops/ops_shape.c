/* hpu ops: reductions over one dimension, row copies (slice, concat),
 * permutations, the sigmoid and pooling along one axis, fp32, plain C
 * (include/hpu/ops.h). A dimension is the middle axis of x[outer, n,
 * inner]. Sums are in double where they reduce. */
#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "hpu/ops.h"

/* ---- reduce ---- */

static void reduce_max(const float *x, float *y, int32_t *idx, size_t outer, size_t n,
		       size_t inner)
{
	for (size_t o = 0; o < outer; o++)
		for (size_t i = 0; i < inner; i++) {
			const float *xo = x + o * n * inner + i;
			float best = xo[0];
			int32_t at = 0;
			for (size_t k = 1; k < n; k++)
				if (xo[k * inner] > best) {
					best = xo[k * inner];
					at = (int32_t)k;
				}
			y[o * inner + i] = best;
			if (idx)
				idx[o * inner + i] = at;
		}
}

void hpu_reduce_forward(hpu_reduce_op op, const float *x, float *y, int32_t *idx,
			size_t outer, size_t n, size_t inner)
{
	assert(x != NULL && y != NULL && n >= 1);
	if (op == HPU_REDUCE_MAX) {
		reduce_max(x, y, idx, outer, n, inner);
		return;
	}
	for (size_t o = 0; o < outer; o++)
		for (size_t i = 0; i < inner; i++) {
			const float *xo = x + o * n * inner + i;
			double s = 0;
			for (size_t k = 0; k < n; k++)
				s += (double)xo[k * inner];
			y[o * inner + i] = (float)(op == HPU_REDUCE_MEAN ? s / (double)n : s);
		}
}

void hpu_reduce_backward(hpu_reduce_op op, const float *dy, const int32_t *idx, float *dx,
			 size_t outer, size_t n, size_t inner)
{
	assert(dy != NULL && dx != NULL && n >= 1);
	assert(op != HPU_REDUCE_MAX || idx != NULL);
	float scale = op == HPU_REDUCE_MEAN ? 1.0f / (float)n : 1.0f;
	for (size_t o = 0; o < outer; o++)
		for (size_t k = 0; k < n; k++) {
			float *d = dx + (o * n + k) * inner;
			const float *g = dy + o * inner;
			if (op != HPU_REDUCE_MAX) {
				for (size_t i = 0; i < inner; i++)
					d[i] = g[i] * scale;
				continue;
			}
			const int32_t *at = idx + o * inner;
			for (size_t i = 0; i < inner; i++)
				d[i] = at[i] == (int32_t)k ? g[i] : 0.0f;
		}
}

/* ---- row copies and permutations ---- */

void hpu_copy_rows(const float *x, float *y, size_t outer, size_t nx, size_t x0, size_t ny,
		   size_t y0, size_t len, size_t inner)
{
	assert(x0 + len <= nx && y0 + len <= ny);
	for (size_t o = 0; o < outer; o++)
		memcpy(y + (o * ny + y0) * inner, x + (o * nx + x0) * inner,
		       len * inner * sizeof *y);
}

enum { PERM_MAX = 8 };

void hpu_permute_forward(const float *x, float *y, int ndim, const int64_t *shape,
			 const int *perm)
{
	assert(ndim >= 1 && ndim <= PERM_MAX);
	size_t xstride[PERM_MAX], ystep[PERM_MAX], yshape[PERM_MAX], pos[PERM_MAX] = {0};
	size_t s = 1, total = 1;
	for (int d = ndim - 1; d >= 0; d--) {
		xstride[d] = s;
		s *= (size_t)shape[d];
	}
	for (int d = 0; d < ndim; d++) {
		assert(perm[d] >= 0 && perm[d] < ndim);
		yshape[d] = (size_t)shape[perm[d]];
		ystep[d] = xstride[perm[d]]; /* x's stride along y's dimension d */
		total *= yshape[d];
	}
	/* walk y in order, keeping the matching offset in x */
	size_t at = 0;
	for (size_t i = 0; i < total; i++) {
		y[i] = x[at];
		for (int d = ndim - 1; d >= 0; d--) {
			at += ystep[d];
			if (++pos[d] < yshape[d])
				break;
			at -= ystep[d] * yshape[d];
			pos[d] = 0;
		}
	}
}

/* ---- sigmoid ---- */

void hpu_sigmoid_forward(const float *x, float *y, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		/* exp of a non-positive number only: no overflow */
		float e = expf(-fabsf(x[i]));
		y[i] = x[i] >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
	}
}

void hpu_sigmoid_backward(const float *y, const float *dy, float *dx, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

/* ---- pooling along one axis ---- */

static int pool_out(int n, int k, int stride)
{
	assert(k >= 1 && stride >= 1 && n >= k);
	return (n - k) / stride + 1;
}

void hpu_maxpool1d_forward(const float *x, float *y, int32_t *idx, size_t outer, int n,
			   size_t inner, int k, int stride)
{
	const int on = pool_out(n, k, stride);
	for (size_t o = 0; o < outer; o++)
		for (int t = 0; t < on; t++)
			for (size_t i = 0; i < inner; i++) {
				const float *xo = x + o * (size_t)n * inner + i;
				int32_t at = t * stride;
				float best = xo[(size_t)at * inner];
				for (int j = 1; j < k; j++) {
					float v = xo[(size_t)(t * stride + j) * inner];
					if (v > best) {
						best = v;
						at = t * stride + j;
					}
				}
				size_t out = (o * (size_t)on + (size_t)t) * inner + i;
				y[out] = best;
				idx[out] = at;
			}
}

void hpu_maxpool1d_backward(const float *dy, const int32_t *idx, float *dx, size_t outer,
			    int n, size_t inner, int k, int stride)
{
	const int on = pool_out(n, k, stride);
	memset(dx, 0, outer * (size_t)n * inner * sizeof *dx);
	for (size_t o = 0; o < outer; o++)
		for (int t = 0; t < on; t++)
			for (size_t i = 0; i < inner; i++) {
				size_t out = (o * (size_t)on + (size_t)t) * inner + i;
				dx[(o * (size_t)n + (size_t)idx[out]) * inner + i] += dy[out];
			}
}

void hpu_avgpool1d_forward(const float *x, float *y, size_t outer, int n, size_t inner,
			   int k, int stride)
{
	const int on = pool_out(n, k, stride);
	for (size_t o = 0; o < outer; o++)
		for (int t = 0; t < on; t++)
			for (size_t i = 0; i < inner; i++) {
				const float *xo = x + o * (size_t)n * inner + i;
				float s = 0.0f;
				for (int j = 0; j < k; j++)
					s += xo[(size_t)(t * stride + j) * inner];
				y[(o * (size_t)on + (size_t)t) * inner + i] = s / (float)k;
			}
}

void hpu_avgpool1d_backward(const float *dy, float *dx, size_t outer, int n, size_t inner,
			    int k, int stride)
{
	const int on = pool_out(n, k, stride);
	memset(dx, 0, outer * (size_t)n * inner * sizeof *dx);
	for (size_t o = 0; o < outer; o++)
		for (int t = 0; t < on; t++)
			for (size_t i = 0; i < inner; i++) {
				float g = dy[(o * (size_t)on + (size_t)t) * inner + i] / (float)k;
				for (int j = 0; j < k; j++)
					dx[(o * (size_t)n + (size_t)(t * stride + j)) * inner + i] += g;
			}
}
