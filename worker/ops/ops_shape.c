/* hpu ops: reductions over one dimension, row copies (slice, concat),
 * permutations, the sigmoid and pooling along one axis, fp32
 * (include/hpu/ops.h). A dimension is the middle axis of x[outer, n,
 * inner]. Sums are in double where they reduce. Each op runs the kernel
 * table's entry (backend.h), else on the CPU's tables the C loops here
 * (hpu__be_host's). */
#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"

#include "hpu/hpu.h"
#include "hpu/ops.h"

#define RC(call) ((call) == HPU_BE_OK ? HPU_OK : HPU_ERROR)

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

int hpu__host_reduce_fwd(int op, const float *x, float *y, int32_t *idx, size_t outer, size_t n,
			 size_t inner)
{
	if (op == HPU_REDUCE_MAX) {
		reduce_max(x, y, idx, outer, n, inner);
		return HPU_BE_OK;
	}
	for (size_t o = 0; o < outer; o++)
		for (size_t i = 0; i < inner; i++) {
			const float *xo = x + o * n * inner + i;
			double s = 0;
			for (size_t k = 0; k < n; k++)
				s += (double)xo[k * inner];
			y[o * inner + i] = (float)(op == HPU_REDUCE_MEAN ? s / (double)n : s);
		}
	return HPU_BE_OK;
}

int hpu_reduce_forward(hpu_reduce_op op, const float *x, float *y, int32_t *idx, size_t outer,
		       size_t n, size_t inner)
{
	assert(x != NULL && y != NULL && n >= 1);
	return RC(HPU__BE_RUN(reduce_fwd, hpu__host_reduce_fwd, (int)op, x, y, idx, outer, n,
			      inner));
}

int hpu__host_reduce_bwd(int op, const float *dy, const int32_t *idx, float *dx, size_t outer,
			 size_t n, size_t inner)
{
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
	return HPU_BE_OK;
}

int hpu_reduce_backward(hpu_reduce_op op, const float *dy, const int32_t *idx, float *dx,
			size_t outer, size_t n, size_t inner)
{
	assert(dy != NULL && dx != NULL && n >= 1);
	assert(op != HPU_REDUCE_MAX || idx != NULL);
	return RC(HPU__BE_RUN(reduce_bwd, hpu__host_reduce_bwd, (int)op, dy, idx, dx, outer, n,
			      inner));
}

/* ---- row copies and permutations ---- */

int hpu__host_copy_rows(const float *x, float *y, size_t outer, size_t nx, size_t x0,
			size_t ny, size_t y0, size_t len, size_t inner)
{
	for (size_t o = 0; len && inner && o < outer; o++)
		memcpy(y + (o * ny + y0) * inner, x + (o * nx + x0) * inner,
		       len * inner * sizeof *y);
	return HPU_BE_OK;
}

int hpu_copy_rows(const float *x, float *y, size_t outer, size_t nx, size_t x0, size_t ny,
		  size_t y0, size_t len, size_t inner)
{
	assert(x0 + len <= nx && y0 + len <= ny);
	return RC(HPU__BE_RUN(copy_rows, hpu__host_copy_rows, x, y, outer, nx, x0, ny, y0, len,
			      inner));
}

int hpu__host_zero(void *dst, size_t bytes)
{
	if (bytes)
		memset(dst, 0, bytes);
	return HPU_BE_OK;
}

int hpu_zero(void *dst, size_t bytes)
{
	return RC(HPU__BE_RUN(zero, hpu__host_zero, dst, bytes));
}

enum { PERM_MAX = 8 };

int hpu__host_permute(const float *x, float *y, int ndim, const int64_t *shape, const int *perm)
{
	size_t xstride[PERM_MAX], ystep[PERM_MAX], yshape[PERM_MAX], pos[PERM_MAX] = {0};
	size_t s = 1, total = 1;
	for (int d = ndim - 1; d >= 0; d--) {
		xstride[d] = s;
		s *= (size_t)shape[d];
	}
	for (int d = 0; d < ndim; d++) {
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
	return HPU_BE_OK;
}

int hpu_permute_forward(const float *x, float *y, int ndim, const int64_t *shape,
			const int *perm)
{
	assert(ndim >= 1 && ndim <= PERM_MAX);
	for (int d = 0; d < ndim; d++)
		assert(perm[d] >= 0 && perm[d] < ndim);
	return RC(HPU__BE_RUN(permute, hpu__host_permute, x, y, ndim, shape, perm));
}

/* ---- sigmoid ---- */

int hpu__host_sigmoid_fwd(const float *x, float *y, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		/* exp of a non-positive number only: no overflow */
		float e = expf(-fabsf(x[i]));
		y[i] = x[i] >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
	}
	return HPU_BE_OK;
}

int hpu__host_sigmoid_bwd(const float *y, const float *dy, float *dx, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dx[i] = dy[i] * y[i] * (1.0f - y[i]);
	return HPU_BE_OK;
}

int hpu_sigmoid_forward(const float *x, float *y, size_t n)
{
	return RC(HPU__BE_RUN(sigmoid_fwd, hpu__host_sigmoid_fwd, x, y, n));
}

int hpu_sigmoid_backward(const float *y, const float *dy, float *dx, size_t n)
{
	return RC(HPU__BE_RUN(sigmoid_bwd, hpu__host_sigmoid_bwd, y, dy, dx, n));
}

/* ---- pooling along one axis ---- */

static int pool_out(int n, int k, int stride)
{
	assert(k >= 1 && stride >= 1 && n >= k);
	return (n - k) / stride + 1;
}

static void maxpool1d_fwd(const float *x, float *y, int32_t *idx, size_t outer, int n,
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

static void maxpool1d_bwd(const float *dy, const int32_t *idx, float *dx, size_t outer,
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

static void avgpool1d_fwd(const float *x, float *y, size_t outer, int n, size_t inner,
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

static void avgpool1d_bwd(const float *dy, float *dx, size_t outer, int n, size_t inner,
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

int hpu__host_pool1d_fwd(int max, const float *x, float *y, int32_t *idx, size_t outer, int n,
			 size_t inner, int k, int stride)
{
	if (max)
		maxpool1d_fwd(x, y, idx, outer, n, inner, k, stride);
	else
		avgpool1d_fwd(x, y, outer, n, inner, k, stride);
	return HPU_BE_OK;
}

int hpu__host_pool1d_bwd(int max, const float *dy, const int32_t *idx, float *dx, size_t outer,
			 int n, size_t inner, int k, int stride)
{
	if (max)
		maxpool1d_bwd(dy, idx, dx, outer, n, inner, k, stride);
	else
		avgpool1d_bwd(dy, dx, outer, n, inner, k, stride);
	return HPU_BE_OK;
}

int hpu_maxpool1d_forward(const float *x, float *y, int32_t *idx, size_t outer, int n,
			  size_t inner, int k, int stride)
{
	pool_out(n, k, stride);
	return RC(HPU__BE_RUN(pool1d_fwd, hpu__host_pool1d_fwd, 1, x, y, idx, outer, n, inner, k,
			      stride));
}

int hpu_maxpool1d_backward(const float *dy, const int32_t *idx, float *dx, size_t outer, int n,
			   size_t inner, int k, int stride)
{
	pool_out(n, k, stride);
	return RC(HPU__BE_RUN(pool1d_bwd, hpu__host_pool1d_bwd, 1, dy, idx, dx, outer, n, inner, k,
			      stride));
}

int hpu_avgpool1d_forward(const float *x, float *y, size_t outer, int n, size_t inner, int k,
			  int stride)
{
	pool_out(n, k, stride);
	return RC(HPU__BE_RUN(pool1d_fwd, hpu__host_pool1d_fwd, 0, x, y, NULL, outer, n, inner, k,
			      stride));
}

int hpu_avgpool1d_backward(const float *dy, float *dx, size_t outer, int n, size_t inner, int k,
			   int stride)
{
	pool_out(n, k, stride);
	return RC(HPU__BE_RUN(pool1d_bwd, hpu__host_pool1d_bwd, 0, dy, NULL, dx, outer, n, inner, k,
			      stride));
}
