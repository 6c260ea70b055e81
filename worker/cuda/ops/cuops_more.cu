/* cuops_more: the CUDA kernels of the shape, sequence and loss layers'
 * table entries (cuops_more.h; worker/ops/backend.h: reduce, permute,
 * sigmoid, 1-D pooling, the rectangular convolution's im2col and col2im,
 * MSE and BCE, the id check, causal attention).
 *
 * Each follows the host loop of its entry (worker/ops/ops_shape.c,
 * ops_conv_rect.c, ops_loss.c, ops_nn.c) operation for operation; built
 * with --fmad=false as cuops_kernels.cu. Where one thread computes one
 * output in the host loop's order (reduce, permute, pooling, im2col,
 * col2im, the elementwise backwards) the results are the CPU's bit for
 * bit; the losses' row sums and attention's dot products differ by
 * their summation order (and expf / log, the math library's).
 */
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "worker/cuda/cuda_grid.cuh"
#include "worker/cuda/ops/cuops_more.h"

#define THREADS 256
#define ROW_THREADS 128 /* a block per row: a power of two */

static unsigned blocks_for(size_t n, unsigned threads)
{
	return hpu__cu_blocks(n, threads, 0x7fffffffu);
}

/* The sum (max when max) of v over a block of ROW_THREADS, in every
 * thread; s is ROW_THREADS of shared memory. */
template <typename T> __device__ static T row_reduce(T v, T *s, int max)
{
	s[threadIdx.x] = v;
	__syncthreads();
	for (int o = ROW_THREADS / 2; o > 0; o >>= 1) {
		if ((int)threadIdx.x < o) {
			T a = s[threadIdx.x], b = s[threadIdx.x + o];
			s[threadIdx.x] = max ? (b > a ? b : a) : a + b;
		}
		__syncthreads();
	}
	T r = s[0];
	__syncthreads();
	return r;
}

/* ---- reduce ---- */

/* One thread per output, over n in order: the host's sums (double) and
 * first maxima. */
static __global__ void k_reduce_fwd(int op, const float *x, float *y, int32_t *idx, size_t total,
				    size_t n, size_t inner)
{
	FOR_EACH(j, total)
	{
		size_t o = j / inner, i = j % inner;
		const float *xo = x + o * n * inner + i;
		if (op == HPU_CUKM_REDUCE_MAX) {
			float best = xo[0];
			int32_t at = 0;
			for (size_t k = 1; k < n; k++)
				if (xo[k * inner] > best) {
					best = xo[k * inner];
					at = (int32_t)k;
				}
			y[j] = best;
			if (idx)
				idx[j] = at;
			continue;
		}
		double s = 0;
		for (size_t k = 0; k < n; k++)
			s += (double)xo[k * inner];
		y[j] = (float)(op == HPU_CUKM_REDUCE_MEAN ? s / (double)n : s);
	}
}

extern "C" cudaError_t hpu__cukm_reduce_fwd(int op, const float *x, float *y, int32_t *idx,
					     size_t outer, size_t n, size_t inner, cudaStream_t st)
{
	size_t total = outer * inner;
	if (total == 0)
		return cudaSuccess;
	k_reduce_fwd<<<blocks_for(total, THREADS), THREADS, 0, st>>>(op, x, y, idx, total, n,
								     inner);
	return cudaGetLastError();
}

static __global__ void k_reduce_bwd(int op, const float *dy, const int32_t *idx, float *dx,
				    size_t total, size_t n, size_t inner, float scale)
{
	FOR_EACH(j, total)
	{
		size_t i = j % inner, ok = j / inner, o = ok / n, k = ok % n;
		float g = dy[o * inner + i];
		if (op == HPU_CUKM_REDUCE_MAX)
			dx[j] = idx[o * inner + i] == (int32_t)k ? g : 0.0f;
		else
			dx[j] = g * scale;
	}
}

extern "C" cudaError_t hpu__cukm_reduce_bwd(int op, const float *dy, const int32_t *idx,
					     float *dx, size_t outer, size_t n, size_t inner,
					     cudaStream_t st)
{
	size_t total = outer * n * inner;
	if (total == 0)
		return cudaSuccess;
	float scale = op == HPU_CUKM_REDUCE_MEAN ? 1.0f / (float)n : 1.0f;
	k_reduce_bwd<<<blocks_for(total, THREADS), THREADS, 0, st>>>(op, dy, idx, dx, total, n,
								     inner, scale);
	return cudaGetLastError();
}

/* ---- permute ---- */

static __global__ void k_permute(const float *x, float *y, size_t total, hpu__cukm_perm p)
{
	FOR_EACH(j, total)
	{
		size_t rest = j, at = 0;
		for (int d = p.ndim - 1; d >= 0; d--) {
			at += rest % p.yshape[d] * p.ystep[d];
			rest /= p.yshape[d];
		}
		y[j] = x[at];
	}
}

extern "C" cudaError_t hpu__cukm_permute(const float *x, float *y, const hpu__cukm_perm *p,
					  cudaStream_t st)
{
	size_t total = 1;
	for (int d = 0; d < p->ndim; d++)
		total *= p->yshape[d];
	if (total == 0)
		return cudaSuccess;
	k_permute<<<blocks_for(total, THREADS), THREADS, 0, st>>>(x, y, total, *p);
	return cudaGetLastError();
}

/* ---- sigmoid ---- */

__device__ static float sigmoid1(float x)
{
	float e = expf(-fabsf(x)); /* exp of a non-positive number only */
	return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

static __global__ void k_sigmoid_fwd(const float *x, float *y, size_t n)
{
	FOR_EACH(i, n)
	y[i] = sigmoid1(x[i]);
}

static __global__ void k_sigmoid_bwd(const float *y, const float *dy, float *dx, size_t n)
{
	FOR_EACH(i, n)
	dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

extern "C" cudaError_t hpu__cukm_sigmoid(int bwd, const float *a, const float *dy, float *out,
					  size_t n, cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	if (bwd)
		k_sigmoid_bwd<<<blocks_for(n, THREADS), THREADS, 0, st>>>(a, dy, out, n);
	else
		k_sigmoid_fwd<<<blocks_for(n, THREADS), THREADS, 0, st>>>(a, out, n);
	return cudaGetLastError();
}

/* ---- pooling along one axis ---- */

static __global__ void k_pool1d_fwd(int max, const float *x, float *y, int32_t *idx,
				    size_t total, int n, int on, size_t inner, int k, int stride)
{
	FOR_EACH(j, total)
	{
		size_t i = j % inner, ot = j / inner, o = ot / (size_t)on;
		int t = (int)(ot % (size_t)on);
		const float *xo = x + o * (size_t)n * inner + i;
		if (max) {
			int32_t at = t * stride;
			float best = xo[(size_t)at * inner];
			for (int q = 1; q < k; q++) {
				float v = xo[(size_t)(t * stride + q) * inner];
				if (v > best) {
					best = v;
					at = t * stride + q;
				}
			}
			y[j] = best;
			idx[j] = at;
			continue;
		}
		float s = 0.0f;
		for (int q = 0; q < k; q++)
			s += xo[(size_t)(t * stride + q) * inner];
		y[j] = s / (float)k;
	}
}

/* Gathers: each input position adds its windows' gradients in the order
 * of t, as the host's scatter does, from 0. */
static __global__ void k_pool1d_bwd(int max, const float *dy, const int32_t *idx, float *dx,
				    size_t total, int n, int on, size_t inner, int k, int stride)
{
	FOR_EACH(j, total)
	{
		size_t i = j % inner, op = j / inner, o = op / (size_t)n;
		int pos = (int)(op % (size_t)n);
		int lo = pos < k ? 0 : (pos - k + stride) / stride, hi = pos / stride;
		if (hi > on - 1)
			hi = on - 1;
		float s = 0.0f;
		for (int t = lo; t <= hi; t++) {
			size_t out = (o * (size_t)on + (size_t)t) * inner + i;
			if (max) {
				if (idx[out] == pos)
					s += dy[out];
			} else {
				s += dy[out] / (float)k;
			}
		}
		dx[j] = s;
	}
}

extern "C" cudaError_t hpu__cukm_pool1d(int bwd, int max, const float *in, float *out,
					 const int32_t *idx_in, int32_t *idx_out, size_t outer,
					 int n, size_t inner, int k, int stride, cudaStream_t st)
{
	if (k < 1 || stride < 1 || n < k)
		return cudaErrorInvalidValue;
	int on = (n - k) / stride + 1;
	size_t total = outer * (size_t)(bwd ? n : on) * inner;
	if (total == 0)
		return cudaSuccess;
	if (bwd)
		k_pool1d_bwd<<<blocks_for(total, THREADS), THREADS, 0, st>>>(
			max, in, idx_in, out, total, n, on, inner, k, stride);
	else
		k_pool1d_fwd<<<blocks_for(total, THREADS), THREADS, 0, st>>>(
			max, in, out, idx_out, total, n, on, inner, k, stride);
	return cudaGetLastError();
}

/* ---- the rectangular convolution's im2col, col2im, bias ---- */

static __global__ void k_im2col(hpu__cukm_rect s, const float *x, float *col, size_t total)
{
	const size_t npix = (size_t)s.oh * s.ow, plane = (size_t)s.h * s.w;
	const int kk = s.kh * s.kw;
	FOR_EACH(j, total)
	{
		int row = (int)(j / npix), p = (int)(j % npix);
		int c = row / kk, ki = row % kk / s.kw, kj = row % s.kw;
		int ih = p / s.ow * s.sh - s.ph + ki, iw = p % s.ow * s.sw - s.pw + kj;
		col[j] = ih < 0 || ih >= s.h || iw < 0 || iw >= s.w
				 ? 0.0f
				 : x[c * plane + (size_t)ih * s.w + iw];
	}
}

extern "C" cudaError_t hpu__cukm_im2col(const hpu__cukm_rect *s, const float *x, float *col,
					 cudaStream_t st)
{
	size_t total = (size_t)s->c * s->kh * s->kw * s->oh * s->ow;
	if (total == 0)
		return cudaSuccess;
	k_im2col<<<blocks_for(total, THREADS), THREADS, 0, st>>>(*s, x, col, total);
	return cudaGetLastError();
}

/* dx[c, ih, iw] = the sum of its columns' entries in row order (ki, kj
 * ascending), as the host's fold adds them. */
static __global__ void k_col2im(hpu__cukm_rect s, const float *col, float *dx, size_t total)
{
	const size_t npix = (size_t)s.oh * s.ow, plane = (size_t)s.h * s.w;
	FOR_EACH(j, total)
	{
		int c = (int)(j / plane), at = (int)(j % plane), ih = at / s.w, iw = at % s.w;
		float sum = 0.0f;
		for (int ki = 0; ki < s.kh; ki++) {
			int hh = ih + s.ph - ki;
			if (hh < 0 || hh % s.sh || hh / s.sh >= s.oh)
				continue;
			for (int kj = 0; kj < s.kw; kj++) {
				int ww = iw + s.pw - kj;
				if (ww < 0 || ww % s.sw || ww / s.sw >= s.ow)
					continue;
				size_t row = ((size_t)c * s.kh + ki) * s.kw + kj;
				sum += col[row * npix + (size_t)(hh / s.sh) * s.ow + ww / s.sw];
			}
		}
		dx[j] = sum;
	}
}

extern "C" cudaError_t hpu__cukm_col2im(const hpu__cukm_rect *s, const float *col, float *dx,
					 cudaStream_t st)
{
	size_t total = (size_t)s->c * s->h * s->w;
	if (total == 0)
		return cudaSuccess;
	k_col2im<<<blocks_for(total, THREADS), THREADS, 0, st>>>(*s, col, dx, total);
	return cudaGetLastError();
}

static __global__ void k_rows_fill(float *y, const float *b, size_t total, size_t rows,
				   size_t npix)
{
	FOR_EACH(j, total)
	y[j] = b ? b[j / npix % rows] : 0.0f;
}

extern "C" cudaError_t hpu__cukm_rows_fill(float *y, const float *b, size_t count, size_t rows,
					    size_t npix, cudaStream_t st)
{
	size_t total = count * rows * npix;
	if (total == 0)
		return cudaSuccess;
	k_rows_fill<<<blocks_for(total, THREADS), THREADS, 0, st>>>(y, b, total, rows, npix);
	return cudaGetLastError();
}

/* One block per row o: db[o] += each sample's sum of dy[n, o, :] (fp32),
 * sample after sample as the host adds them. */
static __global__ void k_rows_sum(const float *dy, float *db, int count, int rows, size_t npix)
{
	__shared__ float s[ROW_THREADS];
	int o = blockIdx.x;
	float acc = db[o];
	for (int n = 0; n < count; n++) {
		const float *r = dy + ((size_t)n * rows + o) * npix;
		float v = 0.0f;
		for (size_t p = threadIdx.x; p < npix; p += ROW_THREADS)
			v += r[p];
		acc += row_reduce<float>(v, s, 0);
	}
	if (threadIdx.x == 0)
		db[o] = acc;
}

extern "C" cudaError_t hpu__cukm_rows_sum(const float *dy, float *db, int count, int rows,
					   size_t npix, cudaStream_t st)
{
	if (rows <= 0 || count <= 0)
		return cudaSuccess;
	k_rows_sum<<<rows, ROW_THREADS, 0, st>>>(dy, db, count, rows, npix);
	return cudaGetLastError();
}

/* ---- losses ---- */

#define LOG_FLOOR (-100.0)
#define BCE_EPS 1e-12

__device__ static double clamped_log(double v)
{
	double lg = log(v);
	return lg < LOG_FLOOR ? LOG_FLOOR : lg;
}

/* One block per row: loss[r] = the mean over the row (double sums).
 * kind: 0 mse, 1 bce with logits, 2 bce of probabilities (a value
 * outside [0, 1] lowers *bad to its index). */
static __global__ void k_loss_fwd(int kind, const float *x, const float *t, float *loss,
				  size_t n, unsigned long long *bad)
{
	__shared__ double s[ROW_THREADS];
	size_t off = (size_t)blockIdx.x * n;
	double v = 0, row_bad = 0;
	for (size_t i = threadIdx.x; i < n; i += ROW_THREADS) {
		double xi = x[off + i], ti = t[off + i];
		if (kind == 0) {
			double d = xi - ti;
			v += d * d;
		} else if (kind == 1) {
			v += (xi > 0 ? xi : 0) - xi * ti + log1p(exp(-fabs(xi)));
		} else if (!(x[off + i] >= 0.0f && x[off + i] <= 1.0f)) {
			atomicMin(bad, (unsigned long long)(off + i));
			row_bad = 1;
		} else {
			v -= ti * clamped_log(xi) + (1.0 - ti) * clamped_log(1.0 - xi);
		}
	}
	double sum = row_reduce<double>(v, s, 0);
	/* a row holding a bad probability has loss 0, as the host's (its
	 * check deferred, the step runs on) */
	if (kind == 2 && row_reduce<double>(row_bad, s, 0) > 0)
		sum = 0;
	if (threadIdx.x == 0)
		loss[blockIdx.x] = (float)(sum / (double)n);
}

extern "C" cudaError_t hpu__cukm_loss_fwd(int kind, const float *x, const float *t, float *loss,
					   int rows, size_t n, unsigned long long *bad,
					   cudaStream_t st)
{
	if (rows <= 0 || n == 0)
		return cudaSuccess;
	k_loss_fwd<<<rows, ROW_THREADS, 0, st>>>(kind, x, t, loss, n, bad);
	return cudaGetLastError();
}

static __global__ void k_loss_bwd(int kind, const float *x, const float *t, const float *dloss,
				  float *dx, float *dt, size_t total, size_t n)
{
	FOR_EACH(j, total)
	{
		size_t r = j / n;
		if (kind == 0) {
			float g = 2.0f * dloss[r] / (float)n;
			float d = g * (x[j] - t[j]);
			if (dx)
				dx[j] = d;
			if (dt)
				dt[j] = -d;
		} else if (kind == 1) {
			float g = dloss[r] / (float)n;
			if (dx)
				dx[j] = g * (sigmoid1(x[j]) - t[j]);
			if (dt)
				dt[j] = -g * x[j];
		} else {
			double g = (double)dloss[r] / (double)n;
			double pi = x[j], q = pi * (1.0 - pi);
			if (dx)
				dx[j] = (float)(g * (pi - (double)t[j]) / (q > BCE_EPS ? q : BCE_EPS));
			if (dt)
				dt[j] = (float)(-g * (clamped_log(pi) - clamped_log(1.0 - pi)));
		}
	}
}

extern "C" cudaError_t hpu__cukm_loss_bwd(int kind, const float *x, const float *t,
					   const float *dloss, float *dx, float *dt, int rows,
					   size_t n, cudaStream_t st)
{
	size_t total = (size_t)(rows > 0 ? rows : 0) * n;
	if (total == 0 || (!dx && !dt))
		return cudaSuccess;
	k_loss_bwd<<<blocks_for(total, THREADS), THREADS, 0, st>>>(kind, x, t, dloss, dx, dt,
								   total, n);
	return cudaGetLastError();
}

static __global__ void k_ids_first_bad(const int32_t *ids, size_t n, int32_t limit,
				       unsigned long long *bad)
{
	FOR_EACH(i, n)
	if (ids[i] < 0 || ids[i] >= limit)
		atomicMin(bad, (unsigned long long)i);
}

extern "C" cudaError_t hpu__cukm_ids_first_bad(const int32_t *ids, size_t n, int32_t limit,
						unsigned long long *bad, cudaStream_t st)
{
	if (n == 0)
		return cudaSuccess;
	k_ids_first_bad<<<blocks_for(n, THREADS), THREADS, 0, st>>>(ids, n, limit, bad);
	return cudaGetLastError();
}

/* ---- a check's finding, written on the device ---- */

template <typename T>
static __global__ void k_finding(const T *vals, const long long *bad, T *out)
{
	long long b = *bad;
	if (b >= 0)
		*out = vals[b];
}

extern "C" cudaError_t hpu__cukm_finding_i32(const int32_t *vals, const long long *bad,
					      int32_t *out, cudaStream_t st)
{
	k_finding<int32_t><<<1, 1, 0, st>>>(vals, bad, out);
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cukm_finding_f32(const float *vals, const long long *bad, float *out,
					      cudaStream_t st)
{
	k_finding<float><<<1, 1, 0, st>>>(vals, bad, out);
	return cudaGetLastError();
}

static __global__ void k_none_of(int *v)
{
	*v = *v == 0;
}

extern "C" cudaError_t hpu__cukm_none_of(int *v, cudaStream_t st)
{
	k_none_of<<<1, 1, 0, st>>>(v);
	return cudaGetLastError();
}

/* ---- causal attention over qkv[B, T, 3D] ----
 *
 * Blocks of ROW_THREADS; grid (B * heads, T): block (bh, i) is query
 * row i of head h of sample b. Row buffers of T floats in dynamic shared
 * memory. */

struct attn_dims {
	int t, heads, hd, d;
	float scale;
};

__device__ static const float *qkv_row(const float *qkv, attn_dims a, int bh, int i, int which)
{
	int b = bh / a.heads, h = bh % a.heads;
	return qkv + ((size_t)b * a.t + i) * 3 * a.d + (size_t)which * a.d + (size_t)h * a.hd;
}

__device__ static float dot(const float *u, const float *v, int n)
{
	float s = 0.0f;
	for (int e = 0; e < n; e++)
		s += u[e] * v[e];
	return s;
}

/* att[bh, i, :] = softmax over 0..i of scale q_i k_j (0 after i, as the
 * host's); out[b, i, h*hd + e] = sum_j att_ij v_j[e]. */
static __global__ void k_attn_fwd(const float *qkv, float *out, float *att, attn_dims a)
{
	extern __shared__ float row[];
	__shared__ float red[ROW_THREADS];
	int i = blockIdx.y, bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
	const float *q = qkv_row(qkv, a, bh, i, 0);
	float m = -INFINITY;
	for (int j = threadIdx.x; j <= i; j += ROW_THREADS) {
		row[j] = a.scale * dot(q, qkv_row(qkv, a, bh, j, 1), a.hd);
		m = row[j] > m ? row[j] : m;
	}
	m = row_reduce<float>(m, red, 1);
	float s = 0.0f;
	for (int j = threadIdx.x; j <= i; j += ROW_THREADS) {
		row[j] = expf(row[j] - m);
		s += row[j];
	}
	float inv = 1.0f / row_reduce<float>(s, red, 0);
	float *ar = att + ((size_t)bh * a.t + i) * a.t;
	for (int j = threadIdx.x; j < a.t; j += ROW_THREADS) {
		float p = j <= i ? row[j] * inv : 0.0f;
		if (j <= i)
			row[j] = p;
		ar[j] = p;
	}
	__syncthreads();
	float *o = out + ((size_t)b * a.t + i) * a.d + (size_t)h * a.hd;
	for (int e = threadIdx.x; e < a.hd; e += ROW_THREADS) {
		float acc = 0.0f;
		for (int j = 0; j <= i; j++)
			acc += row[j] * qkv_row(qkv, a, bh, j, 2)[e];
		o[e] = acc;
	}
}

/* dv[j, e] = sum_i P_ij dO_i[e] (block (bh, j)). */
static __global__ void k_attn_dv(const float *att, const float *dout, float *dqkv, attn_dims a)
{
	int j = blockIdx.y, bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
	float *dv = (float *)qkv_row(dqkv, a, bh, j, 2);
	for (int e = threadIdx.x; e < a.hd; e += ROW_THREADS) {
		float acc = 0.0f;
		for (int i = j; i < a.t; i++)
			acc += att[((size_t)bh * a.t + i) * a.t + j] *
			       dout[((size_t)b * a.t + i) * a.d + (size_t)h * a.hd + e];
		dv[e] = acc;
	}
}

/* Block (bh, i): dS_ij = P_ij (dP_ij - sum_k dP_ik P_ik) scale with dP_ij
 * = dO_i v_j (0 after i), into ds[bh, i, :]; dq_i = sum_j dS_ij k_j. */
static __global__ void k_attn_dq(const float *qkv, const float *att, const float *dout,
				 float *dqkv, float *ds, attn_dims a)
{
	extern __shared__ float row[];
	__shared__ float red[ROW_THREADS];
	int i = blockIdx.y, bh = blockIdx.x, b = bh / a.heads, h = bh % a.heads;
	const float *dO = dout + ((size_t)b * a.t + i) * a.d + (size_t)h * a.hd;
	const float *p = att + ((size_t)bh * a.t + i) * a.t;
	float part = 0.0f;
	for (int j = threadIdx.x; j <= i; j += ROW_THREADS) {
		row[j] = dot(dO, qkv_row(qkv, a, bh, j, 2), a.hd);
		part += row[j] * p[j];
	}
	float rs = row_reduce<float>(part, red, 0);
	float *dsr = ds + ((size_t)bh * a.t + i) * a.t;
	for (int j = threadIdx.x; j < a.t; j += ROW_THREADS) {
		float v = j <= i ? p[j] * (row[j] - rs) * a.scale : 0.0f;
		if (j <= i)
			row[j] = v;
		dsr[j] = v;
	}
	__syncthreads();
	float *dq = (float *)qkv_row(dqkv, a, bh, i, 0);
	for (int e = threadIdx.x; e < a.hd; e += ROW_THREADS) {
		float acc = 0.0f;
		for (int j = 0; j <= i; j++)
			acc += row[j] * qkv_row(qkv, a, bh, j, 1)[e];
		dq[e] = acc;
	}
}

/* dk_j = sum_i dS_ij q_i (block (bh, j)). */
static __global__ void k_attn_dk(const float *qkv, const float *ds, float *dqkv, attn_dims a)
{
	int j = blockIdx.y, bh = blockIdx.x;
	float *dk = (float *)qkv_row(dqkv, a, bh, j, 1);
	for (int e = threadIdx.x; e < a.hd; e += ROW_THREADS) {
		float acc = 0.0f;
		for (int i = j; i < a.t; i++)
			acc += ds[((size_t)bh * a.t + i) * a.t + j] * qkv_row(qkv, a, bh, i, 0)[e];
		dk[e] = acc;
	}
}

static attn_dims dims(int t, int heads, int hd)
{
	attn_dims a = {t, heads, hd, heads * hd, 1.0f / sqrtf((float)hd)};
	return a;
}

/* A grid of (bh, t) (t at most 65535), and t floats of shared memory
 * within the 48 KiB a block gets without opting in. */
static int attn_fits(int batch, int t, int heads, int hd)
{
	return batch > 0 && t > 0 && heads > 0 && hd > 0 && t <= 11264 &&
	       (long long)batch * heads <= 0x7fffffffLL;
}

extern "C" cudaError_t hpu__cukm_attention_fwd(const float *qkv, float *out, float *att,
						int batch, int t, int heads, int hd,
						cudaStream_t st)
{
	if (batch <= 0 || t <= 0 || heads <= 0 || hd <= 0)
		return cudaSuccess;
	if (!attn_fits(batch, t, heads, hd))
		return cudaErrorInvalidConfiguration;
	dim3 grid((unsigned)(batch * heads), (unsigned)t);
	k_attn_fwd<<<grid, ROW_THREADS, (size_t)t * sizeof(float), st>>>(qkv, out, att,
									   dims(t, heads, hd));
	return cudaGetLastError();
}

extern "C" cudaError_t hpu__cukm_attention_bwd(const float *qkv, const float *att,
						const float *dout, float *dqkv, float *ds,
						int batch, int t, int heads, int hd,
						cudaStream_t st)
{
	if (batch <= 0 || t <= 0 || heads <= 0 || hd <= 0)
		return cudaSuccess;
	if (!attn_fits(batch, t, heads, hd))
		return cudaErrorInvalidConfiguration;
	attn_dims a = dims(t, heads, hd);
	dim3 grid((unsigned)(batch * heads), (unsigned)t);
	k_attn_dv<<<grid, ROW_THREADS, 0, st>>>(att, dout, dqkv, a);
	k_attn_dq<<<grid, ROW_THREADS, (size_t)t * sizeof(float), st>>>(qkv, att, dout, dqkv, ds,
									   a);
	k_attn_dk<<<grid, ROW_THREADS, 0, st>>>(qkv, ds, dqkv, a);
	return cudaGetLastError();
}
