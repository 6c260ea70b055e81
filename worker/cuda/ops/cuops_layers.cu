/* cuops_layers: the CUDA kernels of the layers' own passes
 * (cuops_layers.h): the losses over positions, the attention layer's head
 * copies and score masking, the dropout layer's rows, batch norm.
 *
 * Each follows its host loop (worker/ops/ops_loss.c, ops_heads.c,
 * ops_move.c, ops_bnorm.c) operation for operation; built with
 * --fmad=false like the other kernels, so that copies, masks and dropout
 * agree with the CPU bit for bit and the rest differs only by the math
 * library (expf) and by summation order.
 */
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_elem.h"
#include "worker/cuda/cuda_grid.cuh"
#include "worker/cuda/ops/cuops_layers.h"

#define IGNORE_INDEX (-100)

static unsigned blocks_for(size_t n, unsigned threads)
{
	return hpu__cu_blocks(n, threads, 0x7fffffffu);
}

#define row_threads hpu__cu_row_threads

/* A bad label at position `at`: the smallest such position wins. */
__device__ static void note_bad(unsigned long long *bad, size_t at)
{
	atomicMin(bad, (unsigned long long)at);
}

/* ---- cross-entropy over positions ---- */

/* One block per position: lse[at] and term[at] = lse - x[label] (double),
 * or 0 and term NaN-free 0 at an ignored position. */
static __global__ void k_xent_pos(const float *logits, const int32_t *labels, float *lse,
				  double *term, int classes, unsigned long long *bad)
{
	const size_t at = blockIdx.x;
	const float *x = logits + at * (size_t)classes;
	const int32_t y = labels[at];
	if (y == IGNORE_INDEX || y < 0 || y >= classes) {
		if (threadIdx.x == 0) {
			lse[at] = 0.0f;
			term[at] = 0.0;
			if (y != IGNORE_INDEX)
				note_bad(bad, at);
		}
		return;
	}
	float m = -INFINITY;
	for (int j = threadIdx.x; j < classes; j += blockDim.x)
		m = fmaxf(m, x[j]);
	m = block_reduce<float, max_op<float> >(m);
	double s = 0.0;
	for (int j = threadIdx.x; j < classes; j += blockDim.x)
		s += exp((double)x[j] - (double)m);
	s = block_reduce<double, sum_op<double> >(s);
	if (threadIdx.x == 0) {
		double z = (double)m + log(s);
		lse[at] = (float)z;
		term[at] = z - (double)x[y];
	}
}

/* One block per row: loss[r] = the mean of its counted positions' terms
 * (a bad label counts as ignored, as the host's: its check is deferred
 * and the step runs on). */
static __global__ void k_xent_pos_rows(const int32_t *labels, const double *term, float *loss,
				       size_t positions, int classes)
{
	const size_t r = blockIdx.x;
	double sum = 0.0;
	unsigned long long n = 0;
	for (size_t p = threadIdx.x; p < positions; p += blockDim.x) {
		size_t at = r * positions + p;
		if (labels[at] >= 0 && labels[at] < classes) {
			sum += term[at];
			n++;
		}
	}
	sum = block_reduce<double, sum_op<double> >(sum);
	n = (unsigned long long)block_reduce<double, sum_op<double> >((double)n);
	if (threadIdx.x == 0)
		loss[r] = n ? (float)(sum / (double)n) : 0.0f;
}

extern "C" cudaError_t hpu__cuk_xent_pos_fwd(const float *logits, const int32_t *labels,
					      float *lse, float *loss, int rows,
					      size_t positions, int classes, double *term,
					      unsigned long long *bad, cudaStream_t st)
{
	size_t at = (size_t)rows * positions;
	if (at == 0)
		return cudaSuccess;
	if (at > 0x7fffffffu)
		return cudaErrorInvalidValue;
	k_xent_pos<<<(unsigned)at, row_threads((size_t)classes), 0, st>>>(logits, labels, lse,
									   term, classes, bad);
	k_xent_pos_rows<<<(unsigned)rows, row_threads(positions), 0, st>>>(labels, term, loss,
									    positions, classes);
	return cudaGetLastError();
}

/* One block per position: dx = g * exp(x - lse), minus g at the label;
 * g = dloss[r] / (the row's counted positions); zeros where ignored or
 * bad (a bad label's check is deferred), as the host's. */
static __global__ void k_xent_pos_bwd(const float *logits, const int32_t *labels,
				      const float *lse, const float *dloss, float *dx,
				      size_t positions, int classes)
{
	const size_t at = blockIdx.x, r = at / positions;
	const int32_t *yr = labels + r * positions;
	const int32_t y = labels[at];
	float *d = dx + at * (size_t)classes;
	if (y < 0 || y >= classes) {
		for (int j = threadIdx.x; j < classes; j += blockDim.x)
			d[j] = 0.0f;
		return;
	}
	double c = 0.0;
	for (size_t p = threadIdx.x; p < positions; p += blockDim.x)
		c += yr[p] >= 0 && yr[p] < classes;
	c = block_reduce<double, sum_op<double> >(c);
	size_t n = (size_t)c;
	float g = n ? dloss[r] / (float)n : 0.0f;
	const float *x = logits + at * (size_t)classes;
	const float l = lse[at];
	for (int j = threadIdx.x; j < classes; j += blockDim.x) {
		float v = g * expf(x[j] - l);
		d[j] = j == y ? v - g : v;
	}
}

extern "C" cudaError_t hpu__cuk_xent_pos_bwd(const float *logits, const int32_t *labels,
					      const float *lse, const float *dloss, float *dx,
					      int rows, size_t positions, int classes,
					      cudaStream_t st)
{
	size_t at = (size_t)rows * positions;
	if (at == 0)
		return cudaSuccess;
	if (at > 0x7fffffffu)
		return cudaErrorInvalidValue;
	k_xent_pos_bwd<<<(unsigned)at, row_threads((size_t)classes), 0, st>>>(
		logits, labels, lse, dloss, dx, positions, classes);
	return cudaGetLastError();
}

/* One block per position: hit[at] 1 when its arg-max (the host's rule,
 * block_argmax) is the label, 0 when not or ignored. */
static __global__ void k_accuracy_pos(const float *logits, const int32_t *labels, int *hit,
				      int classes, unsigned long long *bad)
{
	const size_t at = blockIdx.x;
	const int32_t y = labels[at];
	if (y == IGNORE_INDEX || y < 0 || y >= classes) {
		if (threadIdx.x == 0) {
			hit[at] = 0;
			if (y != IGNORE_INDEX)
				note_bad(bad, at);
		}
		return;
	}
	int first = block_argmax(logits + at * (size_t)classes, classes);
	if (threadIdx.x == 0)
		hit[at] = first == y;
}

static __global__ void k_accuracy_rows(const int32_t *labels, const int *hit, float *acc,
				       size_t positions)
{
	const size_t r = blockIdx.x;
	double n = 0.0, right = 0.0;
	for (size_t p = threadIdx.x; p < positions; p += blockDim.x) {
		size_t at = r * positions + p;
		n += labels[at] != IGNORE_INDEX;
		right += hit[at];
	}
	n = block_reduce<double, sum_op<double> >(n);
	right = block_reduce<double, sum_op<double> >(right);
	if (threadIdx.x == 0)
		acc[r] = n > 0 ? (float)(right / n) : 0.0f;
}

extern "C" cudaError_t hpu__cuk_accuracy_pos(const float *logits, const int32_t *labels,
					      float *acc, int rows, size_t positions,
					      int classes, int *hit, unsigned long long *bad,
					      cudaStream_t st)
{
	size_t at = (size_t)rows * positions;
	if (at == 0)
		return cudaSuccess;
	if (at > 0x7fffffffu)
		return cudaErrorInvalidValue;
	k_accuracy_pos<<<(unsigned)at, row_threads((size_t)classes), 0, st>>>(logits, labels, hit,
									       classes, bad);
	k_accuracy_rows<<<(unsigned)rows, row_threads(positions), 0, st>>>(labels, hit, acc,
									    positions);
	return cudaGetLastError();
}

/* ---- the attention layer's head copies and score masking ---- */

static __global__ void k_heads(int merge, const float *src, float *dst, size_t ld, int heads,
			       int t, int hd, float mul, size_t total)
{
	FOR_EACH(k, total)
	{
		size_t e = k % hd, row = k / hd; /* row = ((b * heads + h) * t + i) */
		size_t i = row % t, bh = row / t, h = bh % heads, b = bh / heads;
		size_t strided = (b * t + i) * ld + h * hd + e;
		if (merge)
			dst[strided] = src[k] * mul;
		else
			dst[k] = src[strided] * mul;
	}
}

extern "C" cudaError_t hpu__cuk_heads(int merge, const float *src, float *dst, size_t ld,
				       int batch, int heads, int t, int hd, float mul,
				       cudaStream_t st)
{
	size_t total = (size_t)batch * heads * t * hd;
	if (batch <= 0 || heads <= 0 || t <= 0 || hd <= 0)
		return cudaSuccess;
	k_heads<<<blocks_for(total, 256), 256, 0, st>>>(merge, src, dst, ld, heads, t, hd, mul,
							total);
	return cudaGetLastError();
}

__device__ static int allowed(int causal, const int32_t *mask, int i, int j)
{
	return (!causal || j <= i) && (!mask || mask[j]);
}

/* One block per score row (b, h, i). */
static __global__ void k_mask_scores(float *att, const int32_t *mask, int heads, int t,
				     int causal, int after)
{
	const size_t row = blockIdx.x;
	const int i = (int)(row % t);
	const int b = (int)(row / t / heads);
	const int32_t *m = mask ? mask + (size_t)b * t : NULL;
	float *r = att + row * t;
	double any = 0.0;
	for (int j = threadIdx.x; j < t; j += blockDim.x)
		any += allowed(causal, m, i, j);
	any = block_reduce<double, sum_op<double> >(any);
	for (int j = threadIdx.x; j < t; j += blockDim.x)
		if (any == 0.0)
			r[j] = 0.0f;
		else if (!allowed(causal, m, i, j))
			r[j] = after ? 0.0f : -INFINITY;
}

extern "C" cudaError_t hpu__cuk_mask_scores(float *att, const int32_t *mask, int batch,
					     int heads, int t, int causal, int after,
					     cudaStream_t st)
{
	size_t rows = (size_t)batch * heads * t;
	if (batch <= 0 || heads <= 0 || t <= 0)
		return cudaSuccess;
	if (rows > 0x7fffffffu)
		return cudaErrorInvalidValue;
	k_mask_scores<<<(unsigned)rows, row_threads((size_t)t), 0, st>>>(att, mask, heads, t,
									  causal, after);
	return cudaGetLastError();
}

/* ---- dropout by rows: common/rowkey.h's draws ---- */

static __global__ void k_dropout_rows(const float *x, float *y, const uint64_t *keys, size_t n,
				      uint32_t cut, float scale, size_t total)
{
	FOR_EACH(k, total)
	{
		size_t r = k / n, i = k % n;
		uint32_t u = hpu__rk_draw(keys[r], i);
		y[k] = u < cut ? 0.0f : x[k] * scale;
	}
}

/* The rows' keys (cuda_elem.h's, rand.c's): one thread a row. */
static __global__ void k_dropout_keys(uint64_t *keys, const uint32_t *samples,
				      const int64_t *step, uint64_t seed, int layer, int rows)
{
	FOR_EACH(r, (size_t)rows)
	{
		keys[r] = hpu__elem_row_key(seed, layer, step, samples, (int)r);
	}
}

extern "C" cudaError_t hpu__cuk_dropout_keys(uint64_t *keys, const uint32_t *samples,
					      const int64_t *step, uint64_t seed, int layer,
					      int rows, cudaStream_t st)
{
	if (rows <= 0)
		return cudaSuccess;
	k_dropout_keys<<<blocks_for((size_t)rows, 256), 256, 0, st>>>(keys, samples, step, seed,
								       layer, rows);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_dropout_rows(const float *x, float *y, const uint64_t *keys,
					      int rows, size_t n, uint32_t cut, float scale,
					      cudaStream_t st)
{
	size_t total = (size_t)(rows > 0 ? rows : 0) * n;
	if (total == 0)
		return cudaSuccess;
	k_dropout_rows<<<blocks_for(total, 256), 256, 0, st>>>(x, y, keys, n, cut, scale, total);
	return cudaGetLastError();
}

/* ---- batch norm: one block per channel, statistics in double ---- */

__device__ static const float *chan(const float *x, int nch, size_t spatial, int b, int c)
{
	return x + ((size_t)b * nch + c) * spatial;
}

/* y = (x - mean) * rstd * w + bias over channel c (the block's threads). */
__device__ static void bn_apply(const float *x, float *y, int batch, int nch, size_t spatial,
				int c, float mean, float rstd, float w, float bias)
{
	size_t total = (size_t)batch * spatial;
	for (size_t k = threadIdx.x; k < total; k += blockDim.x) {
		int b = (int)(k / spatial);
		size_t i = k % spatial;
		size_t o = ((size_t)b * nch + c) * spatial + i;
		y[o] = (x[o] - mean) * rstd * w + bias;
	}
}

static __global__ void k_bn_fwd(const float *x, float *y, const float *w, const float *bias,
				float *run_mean, float *run_var, float *saved, int batch,
				int nch, size_t spatial, float eps, float momentum, int train,
				int update)
{
	const int c = blockIdx.x;
	if (!train) {
		bn_apply(x, y, batch, nch, spatial, c, run_mean[c],
			 1.0f / sqrtf(run_var[c] + eps), w[c], bias[c]);
		return;
	}
	const size_t total = (size_t)batch * spatial;
	const double m = (double)total;
	double sum = 0.0;
	for (size_t k = threadIdx.x; k < total; k += blockDim.x)
		sum += chan(x, nch, spatial, (int)(k / spatial), c)[k % spatial];
	sum = block_reduce<double, sum_op<double> >(sum);
	const double mu = sum / m;
	double sq = 0.0;
	for (size_t k = threadIdx.x; k < total; k += blockDim.x) {
		double d = chan(x, nch, spatial, (int)(k / spatial), c)[k % spatial] - mu;
		sq += d * d;
	}
	sq = block_reduce<double, sum_op<double> >(sq);
	const double var = sq / m;
	const float rstd = (float)(1.0 / sqrt(var + eps));
	bn_apply(x, y, batch, nch, spatial, c, (float)mu, rstd, w[c], bias[c]);
	if (threadIdx.x != 0)
		return;
	if (saved) {
		saved[c] = (float)mu;
		saved[nch + c] = rstd;
	}
	if (update) {
		run_mean[c] = (1 - momentum) * run_mean[c] + momentum * (float)mu;
		run_var[c] = (1 - momentum) * run_var[c] + momentum * (float)(var * m / (m - 1));
	}
}

extern "C" cudaError_t hpu__cuk_batchnorm_fwd(const float *x, float *y, const float *w,
					       const float *bias, float *run_mean,
					       float *run_var, float *saved, int batch, int ch,
					       size_t spatial, float eps, float momentum,
					       int train, int update, cudaStream_t st)
{
	if (batch <= 0 || ch <= 0 || spatial == 0)
		return cudaSuccess;
	k_bn_fwd<<<(unsigned)ch, 512, 0, st>>>(x, y, w, bias, run_mean, run_var, saved, batch,
					       ch, spatial, eps, momentum, train, update);
	return cudaGetLastError();
}

static __global__ void k_bn_bwd(const float *x, const float *dy, const float *w,
				const float *saved, float *dw, float *dbias, float *dx,
				int batch, int nch, size_t spatial)
{
	const int c = blockIdx.x;
	const float mean = saved[c], rstd = saved[nch + c];
	const size_t total = (size_t)batch * spatial;
	const double m = (double)total;
	double sdy = 0.0, sdyx = 0.0;
	for (size_t k = threadIdx.x; k < total; k += blockDim.x) {
		size_t o = ((size_t)(k / spatial) * nch + c) * spatial + k % spatial;
		sdy += dy[o];
		sdyx += (double)dy[o] * ((x[o] - mean) * rstd);
	}
	sdy = block_reduce<double, sum_op<double> >(sdy);
	sdyx = block_reduce<double, sum_op<double> >(sdyx);
	if (threadIdx.x == 0) {
		dw[c] += (float)sdyx;
		dbias[c] += (float)sdy;
	}
	if (!dx)
		return;
	const float gm = (float)(sdy / m), gxm = (float)(sdyx / m), k = w[c] * rstd;
	for (size_t q = threadIdx.x; q < total; q += blockDim.x) {
		size_t o = ((size_t)(q / spatial) * nch + c) * spatial + q % spatial;
		dx[o] = k * (dy[o] - gm - (x[o] - mean) * rstd * gxm);
	}
}

extern "C" cudaError_t hpu__cuk_batchnorm_bwd(const float *x, const float *dy, const float *w,
					       const float *saved, float *dw, float *dbias,
					       float *dx, int batch, int ch, size_t spatial,
					       cudaStream_t st)
{
	if (batch <= 0 || ch <= 0 || spatial == 0)
		return cudaSuccess;
	k_bn_bwd<<<(unsigned)ch, 512, 0, st>>>(x, dy, w, saved, dw, dbias, dx, batch, ch,
					       spatial);
	return cudaGetLastError();
}
