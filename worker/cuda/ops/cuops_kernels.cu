/* cuops_kernels: the CUDA device's kernels of our own (cuops_kernels.h).
 *
 * Each follows its reference kernel (worker/ops/ops_ref.h, ops_nn.c,
 * ops.c) operation for operation; this file is built with --fmad=false,
 * as the CPU's sources are with -ffp-contract=off, so that elementwise
 * results differ from the CPU's only where the math library does (expf,
 * tanhf) and reductions only by their summation order. Pooling, dropout
 * and embedding add in the reference's order and agree bit for bit.
 */
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_elem.h"
#include "worker/cuda/cuda_grid.cuh"
#include "worker/cuda/ops/cuops_kernels.h"
#include "worker/ops/fp8_arith.h"

#define THREADS 256

static unsigned blocks_for(size_t n, unsigned threads)
{
	return hpu__cu_blocks(n, threads, 0x7fffffffu);
}

/* ---- conversions ---- */

static __global__ void k_bf16_to_f32(const uint16_t *x, float *y, size_t n)
{
	FOR_EACH(i, n)
	y[i] = __uint_as_float((uint32_t)x[i] << 16);
}

extern "C" cudaError_t hpu__cuk_bf16_to_f32(const uint16_t *x, float *y, size_t n,
					     cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_bf16_to_f32<<<blocks_for(n, THREADS), THREADS, 0, st>>>(x, y, n);
	return cudaGetLastError();
}

static __global__ void k_gemm_k0(float *c, const float *bias, size_t total, int m, int n,
			  size_t stride_c, int accumulate)
{
	FOR_EACH(i, total)
	{
		size_t mn = (size_t)m * n, p = i / mn, r = i % mn;
		float *ci = c + p * stride_c + r;
		float base = accumulate ? *ci : 0.0f;
		*ci = bias ? base + bias[r % n] : base;
	}
}

extern "C" cudaError_t hpu__cuk_gemm_k0(float *c, const float *bias, int count, int m, int n,
					 size_t stride_c, int accumulate, cudaStream_t st)
{
	size_t total = (size_t)count * m * n;
	if (total == 0 || (accumulate && !bias))
		return cudaSuccess;
	k_gemm_k0<<<blocks_for(total, THREADS), THREADS, 0, st>>>(c, bias, total, m, n,
								  stride_c, accumulate);
	return cudaGetLastError();
}

/* ---- pooling ---- */

static __global__ void k_maxpool_fwd(const float *x, float *y, int32_t *idx, size_t total, int h,
			      int w, int oh_n, int ow_n, int k, int stride)
{
	FOR_EACH(i, total)
	{
		size_t per = (size_t)oh_n * ow_n, p = i / per;
		int o = (int)(i % per), oh = o / ow_n, ow = o % ow_n;
		const float *xp = x + p * h * w;
		int32_t at = oh * stride * w + ow * stride;
		float best = xp[at];
		for (int ki = 0; ki < k; ki++)
			for (int kj = 0; kj < k; kj++) {
				int32_t pos = (oh * stride + ki) * w + ow * stride + kj;
				float v = xp[pos];
				if (v > best) { /* strictly larger: ties keep the first */
					best = v;
					at = pos;
				}
			}
		y[i] = best;
		idx[i] = at;
	}
}

/* The outputs whose windows cover position `pos` along one axis:
 * o*stride <= pos <= o*stride + k - 1, o in [0, n). */
__device__ static void covering(int pos, int k, int stride, int n, int *lo, int *hi)
{
	int a = pos - k + 1;
	*lo = a <= 0 ? 0 : (a + stride - 1) / stride;
	int b = pos / stride;
	*hi = b < n - 1 ? b : n - 1;
}

/* dx = 0, then dx[idx[o]] += dy[o] in order of o (the reference's). */
static __global__ void k_maxpool_bwd(const float *dy, const int32_t *idx, float *dx, size_t total,
			      int h, int w, int oh_n, int ow_n, int k, int stride)
{
	FOR_EACH(i, total)
	{
		size_t hw = (size_t)h * w, p = i / hw;
		int pos = (int)(i % hw), ih = pos / w, iw = pos % w;
		const float *dyp = dy + p * oh_n * ow_n;
		const int32_t *ip = idx + p * oh_n * ow_n;
		int oh_lo, oh_hi, ow_lo, ow_hi;
		covering(ih, k, stride, oh_n, &oh_lo, &oh_hi);
		covering(iw, k, stride, ow_n, &ow_lo, &ow_hi);
		float acc = 0.0f;
		for (int oh = oh_lo; oh <= oh_hi; oh++)
			for (int ow = ow_lo; ow <= ow_hi; ow++) {
				int o = oh * ow_n + ow;
				if (ip[o] == pos)
					acc += dyp[o];
			}
		dx[i] = acc;
	}
}

static __global__ void k_avgpool_fwd(const float *x, float *y, size_t total, int h, int w, int oh_n,
			      int ow_n, int k, int stride)
{
	const float area = (float)(k * k);
	FOR_EACH(i, total)
	{
		size_t per = (size_t)oh_n * ow_n, p = i / per;
		int o = (int)(i % per), oh = o / ow_n, ow = o % ow_n;
		const float *xp = x + p * h * w;
		float sum = 0.0f;
		for (int ki = 0; ki < k; ki++)
			for (int kj = 0; kj < k; kj++)
				sum += xp[(oh * stride + ki) * w + ow * stride + kj];
		y[i] = sum / area;
	}
}

/* The reference adds dy/area over oh, ki, kj, ow: for one input, oh
 * ascending and, within a row of windows, kj ascending (ow descending). */
static __global__ void k_avgpool_bwd(const float *dy, float *dx, size_t total, int h, int w,
			      int oh_n, int ow_n, int k, int stride)
{
	const float area = (float)(k * k);
	FOR_EACH(i, total)
	{
		size_t hw = (size_t)h * w, p = i / hw;
		int pos = (int)(i % hw), ih = pos / w, iw = pos % w;
		const float *dyp = dy + p * oh_n * ow_n;
		int oh_lo, oh_hi, ow_lo, ow_hi;
		covering(ih, k, stride, oh_n, &oh_lo, &oh_hi);
		covering(iw, k, stride, ow_n, &ow_lo, &ow_hi);
		float acc = 0.0f;
		for (int oh = oh_lo; oh <= oh_hi; oh++)
			for (int ow = ow_hi; ow >= ow_lo; ow--)
				acc += dyp[oh * ow_n + ow] / area;
		dx[i] = acc;
	}
}

static int pool_out(int size, int k, int stride)
{
	return (size - k) / stride + 1;
}

extern "C" cudaError_t hpu__cuk_maxpool_fwd(const float *x, float *y, int32_t *idx,
					     int planes, int h, int w, int k, int stride,
					     cudaStream_t st)
{
	int oh = pool_out(h, k, stride), ow = pool_out(w, k, stride);
	size_t total = (size_t)planes * oh * ow;
	if (total == 0)
		return cudaSuccess;
	k_maxpool_fwd<<<blocks_for(total, THREADS), THREADS, 0, st>>>(x, y, idx, total, h, w,
								      oh, ow, k, stride);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_maxpool_bwd(const float *dy, const int32_t *idx, float *dx,
					     int planes, int h, int w, int k, int stride,
					     cudaStream_t st)
{
	size_t total = (size_t)planes * h * w;
	if (total == 0)
		return cudaSuccess;
	k_maxpool_bwd<<<blocks_for(total, THREADS), THREADS, 0, st>>>(
		dy, idx, dx, total, h, w, pool_out(h, k, stride), pool_out(w, k, stride), k,
		stride);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_avgpool_fwd(const float *x, float *y, int planes, int h,
					     int w, int k, int stride, cudaStream_t st)
{
	int oh = pool_out(h, k, stride), ow = pool_out(w, k, stride);
	size_t total = (size_t)planes * oh * ow;
	if (total == 0)
		return cudaSuccess;
	k_avgpool_fwd<<<blocks_for(total, THREADS), THREADS, 0, st>>>(x, y, total, h, w, oh, ow,
								      k, stride);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_avgpool_bwd(const float *dy, float *dx, int planes, int h,
					     int w, int k, int stride, cudaStream_t st)
{
	size_t total = (size_t)planes * h * w;
	if (total == 0)
		return cudaSuccess;
	k_avgpool_bwd<<<blocks_for(total, THREADS), THREADS, 0, st>>>(
		dy, dx, total, h, w, pool_out(h, k, stride), pool_out(w, k, stride), k, stride);
	return cudaGetLastError();
}

/* ---- eltwise ---- */

#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

/* gelu(x) = x s, s = 1 / (1 + q), q = exp(-2u), u = c (x + a x^3)
 * (ops_nn.c's form; expf where the CPU has its polynomial). */
__device__ static float gelu_u(float v)
{
	return GELU_C * (v + GELU_A * v * v * v);
}

static __global__ void k_eltwise_fwd(int op, const float *x, float *y, size_t n)
{
	FOR_EACH(i, n)
	{
		float v = x[i];
		if (op == 0)
			y[i] = v > 0.0f ? v : 0.0f;
		else if (op == 1)
			y[i] = v / (1.0f + expf(-2.0f * gelu_u(v)));
		else
			y[i] = tanhf(v);
	}
}

/* at: x for GELU, y for relu and tanh; dx may alias dy. */
static __global__ void k_eltwise_bwd(int op, const float *at, const float *dy, float *dx, size_t n)
{
	FOR_EACH(i, n)
	{
		float v = at[i], d = dy[i];
		if (op == 0) {
			dx[i] = v > 0.0f ? d : 0.0f;
		} else if (op == 1) {
			float q = expf(-2.0f * gelu_u(v));
			float s = 1.0f / (1.0f + q);
			float du = GELU_C * (1.0f + 3.0f * GELU_A * v * v);
			dx[i] = d * (s * (1.0f + 2.0f * v * (q * s) * du));
		} else {
			dx[i] = d * (1.0f - v * v);
		}
	}
}

extern "C" cudaError_t hpu__cuk_eltwise_fwd(int op, const float *x, float *y, size_t n,
					     cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_eltwise_fwd<<<blocks_for(n, THREADS), THREADS, 0, st>>>(op, x, y, n);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_eltwise_bwd(int op, const float *at, const float *dy,
					     float *dx, size_t n, cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_eltwise_bwd<<<blocks_for(n, THREADS), THREADS, 0, st>>>(op, at, dy, dx, n);
	return cudaGetLastError();
}

/* ---- softmax: one block per row ---- */

static __global__ void k_softmax_fwd(const float *x, float *y, int cols)
{
	const float *xr = x + (size_t)blockIdx.x * cols;
	float *yr = y + (size_t)blockIdx.x * cols;
	float m = -INFINITY;
	for (int c = threadIdx.x; c < cols; c += blockDim.x)
		m = fmaxf(m, xr[c]);
	m = block_reduce<float, max_op<float> >(m);
	float s = 0.0f;
	for (int c = threadIdx.x; c < cols; c += blockDim.x) {
		float e = expf(xr[c] - m);
		yr[c] = e;
		s += e;
	}
	s = block_reduce<float, sum_op<float> >(s);
	float inv = 1.0f / s;
	for (int c = threadIdx.x; c < cols; c += blockDim.x)
		yr[c] *= inv;
}

/* dx = y (dy - <dy, y>); dx may alias dy (each thread reads its dy[c]
 * before writing dx[c], after the dot product is complete). */
static __global__ void k_softmax_bwd(const float *y, const float *dy, float *dx, int cols)
{
	size_t o = (size_t)blockIdx.x * cols;
	float dot = 0.0f;
	for (int c = threadIdx.x; c < cols; c += blockDim.x)
		dot += dy[o + c] * y[o + c];
	dot = block_reduce<float, sum_op<float> >(dot);
	for (int c = threadIdx.x; c < cols; c += blockDim.x)
		dx[o + c] = y[o + c] * (dy[o + c] - dot);
}

static unsigned row_threads(int cols)
{
	return hpu__cu_row_threads((size_t)cols);
}

extern "C" cudaError_t hpu__cuk_softmax_fwd(const float *x, float *y, int rows, int cols,
					     cudaStream_t st)
{
	if (rows <= 0 || cols <= 0)
		return cudaSuccess;
	k_softmax_fwd<<<rows, row_threads(cols), 0, st>>>(x, y, cols);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_softmax_bwd(const float *y, const float *dy, float *dx,
					     int rows, int cols, cudaStream_t st)
{
	if (rows <= 0 || cols <= 0)
		return cudaSuccess;
	k_softmax_bwd<<<rows, row_threads(cols), 0, st>>>(y, dy, dx, cols);
	return cudaGetLastError();
}

/* ---- layer norm ---- */

/* One block per row; two passes (mean, then the variance of x - mean). */
static __global__ void k_layernorm_fwd(const float *x, const float *gamma, const float *beta,
				float *y, float *mean, float *rstd, int cols, float eps)
{
	const float *xr = x + (size_t)blockIdx.x * cols;
	float *yr = y + (size_t)blockIdx.x * cols;
	float m = 0.0f;
	for (int c = threadIdx.x; c < cols; c += blockDim.x)
		m += xr[c];
	m = block_reduce<float, sum_op<float> >(m) / (float)cols;
	float v = 0.0f;
	for (int c = threadIdx.x; c < cols; c += blockDim.x) {
		float d = xr[c] - m;
		v += d * d;
	}
	v = block_reduce<float, sum_op<float> >(v) / (float)cols;
	float s = 1.0f / sqrtf(v + eps);
	for (int c = threadIdx.x; c < cols; c += blockDim.x)
		yr[c] = (xr[c] - m) * s * gamma[c] + beta[c];
	if (threadIdx.x == 0) {
		mean[blockIdx.x] = m;
		rstd[blockIdx.x] = s;
	}
}

/* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma; one block
 * per row; dx may alias dy. */
static __global__ void k_layernorm_bwd_dx(const float *x, const float *gamma, const float *mean,
				   const float *rstd, const float *dy, float *dx, int cols)
{
	size_t o = (size_t)blockIdx.x * cols;
	float m = mean[blockIdx.x], s = rstd[blockIdx.x];
	float gsum = 0.0f, gxsum = 0.0f;
	for (int c = threadIdx.x; c < cols; c += blockDim.x) {
		float xhat = (x[o + c] - m) * s;
		float g = dy[o + c] * gamma[c];
		gsum += g;
		gxsum += g * xhat;
	}
	gsum = block_reduce<float, sum_op<float> >(gsum) / (float)cols;
	gxsum = block_reduce<float, sum_op<float> >(gxsum) / (float)cols;
	for (int c = threadIdx.x; c < cols; c += blockDim.x) {
		float xhat = (x[o + c] - m) * s;
		dx[o + c] = s * (dy[o + c] * gamma[c] - gsum - xhat * gxsum);
	}
}

#define LN_CHUNK 32 /* rows per partial sum of dgamma, dbeta */

/* partial[chunk][c] = sum over the chunk's rows of dy xhat, and at
 * partial[chunks + chunk][c] of dy; grid (column blocks, up to
 * HPU_CU_GRID_Y chunks): block row y takes chunks y, y + gridDim.y, ...,
 * each written to its own slot, as with one block row per chunk. */
static __global__ void k_layernorm_bwd_partial(const float *x, const float *mean, const float *rstd,
					const float *dy, float *partial, int rows, int cols,
					int chunks)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= cols)
		return;
	for (int ch = blockIdx.y; ch < chunks; ch += gridDim.y) {
		float g = 0.0f, b = 0.0f;
		int r0 = ch * LN_CHUNK, r1 = rows - r0 < LN_CHUNK ? rows : r0 + LN_CHUNK;
		for (int r = r0; r < r1; r++) {
			size_t o = (size_t)r * cols + c;
			float xhat = (x[o] - mean[r]) * rstd[r];
			g += dy[o] * xhat;
			b += dy[o];
		}
		partial[(size_t)ch * cols + c] = g;
		partial[(size_t)(chunks + ch) * cols + c] = b;
	}
}

/* dgamma[c] += the partials in chunk order (deterministic). */
static __global__ void k_layernorm_bwd_sum(const float *partial, float *dgamma, float *dbeta,
				    int cols, int chunks)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= cols)
		return;
	float g = 0.0f, b = 0.0f;
	for (int ch = 0; ch < chunks; ch++) {
		g += partial[(size_t)ch * cols + c];
		b += partial[(size_t)(chunks + ch) * cols + c];
	}
	dgamma[c] += g;
	dbeta[c] += b;
}

extern "C" cudaError_t hpu__cuk_layernorm_fwd(const float *x, const float *gamma,
					       const float *beta, float *y, float *mean,
					       float *rstd, int rows, int cols, float eps,
					       cudaStream_t st)
{
	if (rows <= 0 || cols <= 0)
		return cudaSuccess;
	k_layernorm_fwd<<<rows, row_threads(cols), 0, st>>>(x, gamma, beta, y, mean, rstd, cols,
							   eps);
	return cudaGetLastError();
}

extern "C" size_t hpu__cuk_layernorm_partials(int rows, int cols)
{
	if (rows <= 0 || cols <= 0)
		return 0;
	return 2 * (size_t)((rows + LN_CHUNK - 1) / LN_CHUNK) * cols;
}

extern "C" cudaError_t hpu__cuk_layernorm_bwd(const float *x, const float *gamma,
					       const float *mean, const float *rstd,
					       const float *dy, float *dx, float *dgamma,
					       float *dbeta, int rows, int cols, float *partial,
					       cudaStream_t st)
{
	if (rows <= 0 || cols <= 0)
		return cudaSuccess;
	int chunks = (rows + LN_CHUNK - 1) / LN_CHUNK;
	unsigned cb = (unsigned)((cols + 127) / 128);
	/* the column sums read dy before dx (which may alias it) is written */
	k_layernorm_bwd_partial<<<dim3(cb, hpu__cu_grid_y(chunks)), 128, 0, st>>>(
		x, mean, rstd, dy, partial, rows, cols, chunks);
	k_layernorm_bwd_sum<<<cb, 128, 0, st>>>(partial, dgamma, dbeta, cols, chunks);
	k_layernorm_bwd_dx<<<rows, row_threads(cols), 0, st>>>(x, gamma, mean, rstd, dy, dx,
							      cols);
	return cudaGetLastError();
}

/* ---- dropout: backend.h's counter-based mask ---- */

__device__ static uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static __global__ void k_dropout_fwd(const float *x, float *y, uint8_t *mask, size_t n, uint64_t key,
			      uint32_t thresh, float scale, int drop_all)
{
	FOR_EACH(i, n)
	{
		uint8_t keep = 0;
		if (!drop_all) {
			uint64_t h = mix64(key + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull);
			keep = (uint32_t)(h >> 32) >= thresh;
		}
		mask[i] = keep;
		y[i] = keep ? x[i] * scale : 0.0f;
	}
}

static __global__ void k_dropout_bwd(const float *dy, const uint8_t *mask, float *dx, size_t n,
			      float scale)
{
	FOR_EACH(i, n)
	dx[i] = mask[i] ? dy[i] * scale : 0.0f;
}

extern "C" cudaError_t hpu__cuk_dropout_fwd(const float *x, float *y, uint8_t *mask, size_t n,
					     uint64_t key, uint32_t thresh, float scale,
					     int drop_all, cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_dropout_fwd<<<blocks_for(n, THREADS), THREADS, 0, st>>>(x, y, mask, n, key, thresh,
								  scale, drop_all);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_dropout_bwd(const float *dy, const uint8_t *mask, float *dx,
					     size_t n, float scale, cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_dropout_bwd<<<blocks_for(n, THREADS), THREADS, 0, st>>>(dy, mask, dx, n, scale);
	return cudaGetLastError();
}

/* ---- embedding ---- */

/* An id outside [0, vocab) is left alone (backend.h): a row of zeros,
 * nothing added backward, as the host's kernels (ops_nn.c). */
static __device__ __forceinline__ bool emb_skip(int id, int vocab)
{
	return id < 0 || id >= vocab;
}

static __global__ void k_embedding_fwd(const float *table, const int32_t *ids, float *y, size_t total,
				int vocab, int dim)
{
	FOR_EACH(i, total)
	{
		size_t r = i / dim;
		int c = (int)(i % dim), id = ids[r];
		y[i] = emb_skip(id, vocab) ? 0.0f : table[(size_t)id * dim + c];
	}
}

#define EMB_BUCKETS 64 /* table rows split by id % 64 among blocks */
#define EMB_COLS 128   /* columns per block */
#define EMB_TILE 1024  /* ids staged in shared memory at a time */

/* dtable[ids[i]] += dy[i] in order of i, without atomics: the block
 * (column group, bucket) owns the columns of its group in every table row
 * whose id % EMB_BUCKETS is its bucket, and walks all ids in order, so
 * each element of dtable receives its additions from one thread, in the
 * order of i: the reference's sums bit for bit. */
static __global__ void k_embedding_bwd(const int32_t *ids, const float *dy, float *dtable, int n,
				int vocab, int dim)
{
	__shared__ int32_t tile[EMB_TILE];
	const int c = blockIdx.x * EMB_COLS + threadIdx.x;
	const int bucket = blockIdx.y;
	for (int t0 = 0; t0 < n; t0 += EMB_TILE) {
		int len = n - t0 < EMB_TILE ? n - t0 : EMB_TILE;
		__syncthreads();
		for (int j = threadIdx.x; j < len; j += blockDim.x)
			tile[j] = ids[t0 + j];
		__syncthreads();
		if (c >= dim)
			continue;
		for (int j = 0; j < len; j++) {
			int id = tile[j];
			if (emb_skip(id, vocab) || id % EMB_BUCKETS != bucket)
				continue;
			dtable[(size_t)id * dim + c] += dy[(size_t)(t0 + j) * dim + c];
		}
	}
}

extern "C" cudaError_t hpu__cuk_embedding_fwd(const float *table, const int32_t *ids,
					       float *y, int n, int vocab, int dim,
					       cudaStream_t st)
{
	size_t total = (size_t)(n > 0 ? n : 0) * (dim > 0 ? dim : 0);
	if (total == 0)
		return cudaSuccess;
	k_embedding_fwd<<<blocks_for(total, THREADS), THREADS, 0, st>>>(table, ids, y, total,
									vocab, dim);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_embedding_bwd(const int32_t *ids, const float *dy,
					       float *dtable, int n, int vocab, int dim,
					       cudaStream_t st)
{
	if (n <= 0 || dim <= 0)
		return cudaSuccess;
	dim3 grid((unsigned)((dim + EMB_COLS - 1) / EMB_COLS), EMB_BUCKETS);
	k_embedding_bwd<<<grid, EMB_COLS, 0, st>>>(ids, dy, dtable, n, vocab, dim);
	return cudaGetLastError();
}

/* ---- softmax cross-entropy ---- */

/* One block per row: row_loss[r] = log(sum) - (z[label] - max), the sum
 * in double as the reference's; dlogits = softmax / B - onehot / B. A
 * label outside [0, classes) (its check deferred, the step runs on)
 * gives no loss and no gradient, as the host's. */
static __global__ void k_xent_rows(const float *logits, const int32_t *labels, float *dlogits,
			    int batch, int classes, double *row_loss)
{
	const int r = blockIdx.x;
	const float *z = logits + (size_t)r * classes;
	const int lab = labels[r];
	if (lab < 0 || lab >= classes) { /* the whole block alike */
		if (threadIdx.x == 0)
			row_loss[r] = 0.0;
		if (dlogits)
			for (int c = threadIdx.x; c < classes; c += blockDim.x)
				dlogits[(size_t)r * classes + c] = 0.0f;
		return;
	}
	/* read before the reductions' barriers: dlogits may be logits (as
	 * the host's kernel allows), and column lab is overwritten below */
	const float zlab = z[lab];
	float m = -INFINITY;
	for (int c = threadIdx.x; c < classes; c += blockDim.x)
		m = fmaxf(m, z[c]);
	m = block_reduce<float, max_op<float> >(m);
	double s = 0.0;
	for (int c = threadIdx.x; c < classes; c += blockDim.x)
		s += (double)expf(z[c] - m);
	s = block_reduce<double, sum_op<double> >(s);
	if (threadIdx.x == 0)
		row_loss[r] = log(s) - (double)(zlab - m);
	if (!dlogits)
		return;
	float *d = dlogits + (size_t)r * classes;
	float scale = (float)(1.0 / (s * batch)), inv_batch = 1.0f / (float)batch;
	for (int c = threadIdx.x; c < classes; c += blockDim.x) {
		float v = expf(z[c] - m) * scale;
		d[c] = c == lab ? v - inv_batch : v;
	}
}

/* *loss = (float)(sum of row_loss / batch); one block. */
static __global__ void k_xent_mean(const double *row_loss, int batch, float *loss)
{
	double s = 0.0;
	for (int r = threadIdx.x; r < batch; r += blockDim.x)
		s += row_loss[r];
	s = block_reduce<double, sum_op<double> >(s);
	if (threadIdx.x == 0)
		*loss = (float)(s / batch);
}

extern "C" cudaError_t hpu__cuk_softmax_xent(const float *logits, const int32_t *labels,
					      float *dlogits, int batch, int classes,
					      double *row_loss, float *loss_dev, cudaStream_t st)
{
	if (batch <= 0 || classes <= 0)
		return cudaErrorInvalidValue;
	k_xent_rows<<<batch, row_threads(classes), 0, st>>>(logits, labels, dlogits, batch,
							    classes, row_loss);
	k_xent_mean<<<1, 256, 0, st>>>(row_loss, batch, loss_dev);
	return cudaGetLastError();
}

/* ---- the ops' own passes ---- */

/* common/lowp.h's conversions, on the same bits: cuda_elem.h's, which
 * tests/unit/test_cuda_elem.c holds to lowp.h bit for bit. */
#define to_bf16 hpu__elem_to_bf16
#define from_bf16 hpu__elem_from_bf16
#define to_fp16 hpu__elem_to_fp16
#define from_fp16 hpu__elem_from_fp16

static __global__ void k_round(int fp16, const float *x, float *y, size_t n)
{
	FOR_EACH(i, n)
	y[i] = fp16 ? from_fp16(to_fp16(x[i])) : from_bf16(to_bf16(x[i]));
}

static __global__ void k_to_bf16(const float *x, uint16_t *y, size_t n)
{
	FOR_EACH(i, n)
	y[i] = to_bf16(x[i]);
}

static __global__ void k_from16(int fp16, const uint16_t *x, float *y, size_t n)
{
	FOR_EACH(i, n)
	y[i] = fp16 ? from_fp16(x[i]) : from_bf16(x[i]);
}

static __global__ void k_add(const float *x, float *y, size_t n)
{
	FOR_EACH(i, n)
	y[i] += x[i];
}

#define BG_CHUNK 64 /* rows per partial column sum */

/* partial[chunk][c] = the chunk's rows' sum of dy; grid (column blocks,
 * up to HPU_CU_GRID_Y chunks), block row y taking chunks y, y +
 * gridDim.y, ... (k_layernorm_bwd_partial's walk). */
static __global__ void k_bias_grad_partial(int bf16, const void *dy, float *partial, int rows,
					   int cols, int chunks)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= cols)
		return;
	for (int ch = blockIdx.y; ch < chunks; ch += gridDim.y) {
		int r0 = ch * BG_CHUNK, r1 = rows - r0 < BG_CHUNK ? rows : r0 + BG_CHUNK;
		float s = 0.0f;
		for (int r = r0; r < r1; r++) {
			size_t o = (size_t)r * cols + c;
			s += bf16 ? from_bf16(((const uint16_t *)dy)[o]) : ((const float *)dy)[o];
		}
		partial[(size_t)ch * cols + c] = s;
	}
}

/* db[c] += the chunks' sums, in chunk order */
static __global__ void k_bias_grad_sum(const float *partial, float *db, int cols, int chunks)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= cols)
		return;
	float s = 0.0f;
	for (int ch = 0; ch < chunks; ch++)
		s += partial[(size_t)ch * cols + c];
	db[c] += s;
}

extern "C" size_t hpu__cuk_bias_grad_partials(int rows, int cols)
{
	if (rows <= 0 || cols <= 0)
		return 0;
	return (size_t)((rows + BG_CHUNK - 1) / BG_CHUNK) * cols;
}

extern "C" cudaError_t hpu__cuk_bias_grad(int bf16, const void *dy, float *db, int rows,
					   int cols, float *partial, cudaStream_t st)
{
	if (rows <= 0 || cols <= 0)
		return cudaSuccess;
	int chunks = (rows + BG_CHUNK - 1) / BG_CHUNK;
	unsigned cb = (unsigned)((cols + 127) / 128);
	k_bias_grad_partial<<<dim3(cb, hpu__cu_grid_y(chunks)), 128, 0, st>>>(bf16, dy, partial,
										rows, cols, chunks);
	k_bias_grad_sum<<<cb, 128, 0, st>>>(partial, db, cols, chunks);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_round(int fp16, const float *x, float *y, size_t n,
				       cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_round<<<blocks_for(n, THREADS), THREADS, 0, st>>>(fp16, x, y, n);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_to_bf16(const float *x, uint16_t *y, size_t n,
					 cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_to_bf16<<<blocks_for(n, THREADS), THREADS, 0, st>>>(x, y, n);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_from16(int fp16, const uint16_t *x, float *y, size_t n,
					cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_from16<<<blocks_for(n, THREADS), THREADS, 0, st>>>(fp16, x, y, n);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_add(const float *x, float *y, size_t n, cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_add<<<blocks_for(n, THREADS), THREADS, 0, st>>>(x, y, n);
	return cudaGetLastError();
}

/* ---- fp8 ---- */

static __global__ void k_amax(const float *x, size_t n, uint32_t *out)
{
	float m = 0.0f;
	FOR_EACH(i, n)
	m = fmaxf(m, fabsf(x[i])); /* fmaxf drops a NaN operand */
	m = block_reduce<float, max_op<float> >(m);
	/* floats >= 0 order as their bits */
	if (threadIdx.x == 0 && m > 0.0f)
		atomicMax(out, __float_as_uint(m));
}

/* fp8.c's grid() and fake_quant, operation for operation. */
static __device__ __forceinline__ float fake_quant1(float x, float scale, float inv, float max,
						     float tiny, float magic, uint32_t keep,
						     int shift, int has_inf)
{
	float v = x * scale;
	float a = fabsf(v);
	float c = a < max ? a : max;
	uint32_t u = __float_as_uint(c);
	uint32_t r = (u + (keep >> 1) + ((u >> shift) & 1)) & ~keep;
	float sub = __fsub_rn(__fadd_rn(c, magic), magic);
	float q = c < tiny ? sub : __uint_as_float(r);
	q = copysignf(q, v) * inv;
	if (!(a <= INFINITY)) /* NaN */
		q = v;
	else if (a == INFINITY)
		q = has_inf ? v : NAN;
	return q;
}

static __global__ void k_fp8_fake_quant(const float *x, float *y, size_t n, float scale,
					float inv, float max, float tiny, float magic,
					uint32_t keep, int shift, int has_inf)
{
	FOR_EACH(i, n)
	y[i] = fake_quant1(x[i], scale, inv, max, tiny, magic, keep, shift, has_inf);
}

/* the scale read when the kernel runs (fp8's training state) */
static __global__ void k_fp8_quant_at(const float *x, float *y, size_t n, const float *scale,
				      float max, float tiny, float magic, uint32_t keep,
				      int shift, int has_inf)
{
	float s = *scale != 0.0f ? *scale : 1.0f;
	float inv = __fdiv_rn(1.0f, s);
	FOR_EACH(i, n)
	y[i] = fake_quant1(x[i], s, inv, max, tiny, magic, keep, shift, has_inf);
}

static __global__ void k_fp8_scale_set(float *step, float *sc, float max, int margin)
{
	float a = sc[1];
	if (a > step[0])
		step[0] = a;
	step[1] = 1.0f;
	if (sc[0] == 0.0f)
		sc[0] = hpu__fp8_scale_of(a, max, margin);
}

/* fp8.c's hpu__host_fp8_quant8: a value's byte on the grid of x * s */
#define Q8(v) hpu__fp8_byte(fake_quant1((v), s, 1.0f, max, tiny, magic, keep, shift, has_inf), \
			    mbits, emin, bias)

static __global__ void k_fp8_quant8(const float *x, uint8_t *q, size_t n, float *sc, float max,
				    float tiny, float magic, uint32_t keep, int shift,
				    int has_inf, int mbits, int emin, int bias)
{
	float s = sc[0] != 0.0f ? sc[0] : 1.0f;
	FOR_EACH(i, n)
	q[i] = Q8(x[i]);
	if (blockIdx.x == 0 && threadIdx.x == 0)
		sc[1] = __fdiv_rn(1.0f, s);
}

/* transposed: 32 x 32 tiles through shared memory, read and written
 * along rows */
static __global__ void k_fp8_quant8_t(const float *x, uint8_t *q, int rows, int cols,
				      float *sc, float max, float tiny, float magic,
				      uint32_t keep, int shift, int has_inf, int mbits, int emin,
				      int bias)
{
	__shared__ uint8_t tile[32][33];
	float s = sc[0] != 0.0f ? sc[0] : 1.0f;
	int c0 = (int)blockIdx.x * 32, r0 = (int)blockIdx.y * 32;
	for (int j = (int)threadIdx.y; j < 32; j += (int)blockDim.y) {
		int r = r0 + j, c = c0 + (int)threadIdx.x;
		if (r < rows && c < cols)
			tile[j][threadIdx.x] = Q8(x[(size_t)r * cols + c]);
	}
	__syncthreads();
	for (int j = (int)threadIdx.y; j < 32; j += (int)blockDim.y) {
		int c = c0 + j, r = r0 + (int)threadIdx.x;
		if (c < cols && r < rows)
			q[(size_t)c * rows + r] = tile[threadIdx.x][j];
	}
	if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0)
		sc[1] = __fdiv_rn(1.0f, s);
}
#undef Q8

/* fp8.c's hpu__host_fp8_roll, one thread an instance */
static __global__ void k_fp8_roll(float *step, float *scale, float *hist, size_t stride,
				  int count, int H, int use_max, int margin, float max4,
				  float max5)
{
	FOR_EACH(i, (size_t)count)
	hpu__fp8_roll_one(step + i * 6, scale + i * 6, hist + i * stride, H, use_max, margin, max4,
			  max5);
}

extern "C" cudaError_t hpu__cuk_amax(const float *x, size_t n, uint32_t *out,
				      cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	size_t b = (n + THREADS - 1) / THREADS;
	k_amax<<<(unsigned)(b < 1024 ? b : 1024), THREADS, 0, st>>>(x, n, out);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_fp8_fake_quant(const float *x, float *y, size_t n,
						float scale, float inv, float max, float tiny,
						float magic, uint32_t keep, int shift, int has_inf,
						cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_fp8_fake_quant<<<blocks_for(n, THREADS), THREADS, 0, st>>>(
		x, y, n, scale, inv, max, tiny, magic, keep, shift, has_inf);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_fp8_amax_scale(const float *x, size_t n, float *step,
						float *sc, float max, int margin,
						cudaStream_t st)
{
	cudaError_t e = cudaMemsetAsync(sc + 1, 0, sizeof *sc, st);
	if (e == cudaSuccess && n > 0)
		e = hpu__cuk_amax(x, n, (uint32_t *)(sc + 1), st);
	if (e != cudaSuccess)
		return e;
	k_fp8_scale_set<<<1, 1, 0, st>>>(step, sc, max, margin);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_fp8_quant_at(const float *x, float *y, size_t n,
					      const float *scale, float max, float tiny,
					      float magic, uint32_t keep, int shift, int has_inf,
					      cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_fp8_quant_at<<<blocks_for(n, THREADS), THREADS, 0, st>>>(x, y, n, scale, max, tiny,
								     magic, keep, shift, has_inf);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_fp8_quant8(const float *x, uint8_t *q, int rows, int cols,
					    int trans, float *sc, float max, float tiny,
					    float magic, uint32_t keep, int shift, int has_inf,
					    int mbits, int emin, int bias, cudaStream_t st)
{
	if (rows <= 0 || cols <= 0)
		return cudaSuccess;
	if (!trans) {
		size_t n = (size_t)rows * cols;
		k_fp8_quant8<<<blocks_for(n, THREADS), THREADS, 0, st>>>(
			x, q, n, sc, max, tiny, magic, keep, shift, has_inf, mbits, emin, bias);
	} else {
		dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32)), block(32, 8);
		if (grid.y > 65535u)
			return cudaErrorInvalidConfiguration;
		k_fp8_quant8_t<<<grid, block, 0, st>>>(x, q, rows, cols, sc, max, tiny, magic, keep,
						       shift, has_inf, mbits, emin, bias);
	}
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_fp8_roll(float *step, float *scale, float *hist, size_t stride,
					  int count, int history, int use_max, int margin,
					  float max_e4m3, float max_e5m2, cudaStream_t st)
{
	if (count <= 0)
		return cudaSuccess;
	k_fp8_roll<<<blocks_for((size_t)count, THREADS), THREADS, 0, st>>>(
		step, scale, hist, stride, count, history, use_max, margin, max_e4m3, max_e5m2);
	return cudaGetLastError();
}

/* ---- checks and counts the ops return to the host ---- */

static __global__ void k_ids_check(const int32_t *ids, int n, int limit, int *bad)
{
	FOR_EACH(i, (size_t)n)
	if (ids[i] < 0 || ids[i] >= limit)
		*bad = 1;
}

/* One block per row: the arg-max by the host's rule (block_argmax: a NaN
 * in column 0, else the first column holding the largest value, NaNs
 * aside). */
static __global__ void k_count_correct(const float *logits, const int32_t *labels, int classes,
				       int *correct)
{
	int first = block_argmax(logits + (size_t)blockIdx.x * classes, classes);
	if (threadIdx.x == 0 && first < classes && first == labels[blockIdx.x])
		atomicAdd(correct, 1);
}

extern "C" cudaError_t hpu__cuk_ids_check(const int32_t *ids, int n, int limit, int *bad,
					   cudaStream_t st)
{
	if (n <= 0)
		return cudaSuccess;
	k_ids_check<<<blocks_for((size_t)n, THREADS), THREADS, 0, st>>>(ids, n, limit, bad);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cuk_count_correct(const float *logits, const int32_t *labels,
					       int batch, int classes, int *correct,
					       cudaStream_t st)
{
	if (batch <= 0 || classes <= 0)
		return cudaSuccess;
	k_count_correct<<<batch, row_threads(classes), 0, st>>>(logits, labels, classes,
								  correct);
	return cudaGetLastError();
}
