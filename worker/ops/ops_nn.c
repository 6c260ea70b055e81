/* hpu ops for transformers: matmul and bmm (OpenBLAS sgemm), GELU, tanh,
 * row softmax, layer norm, embedding, counter-based dropout and causal
 * multi-head self-attention.
 *
 * Row-major fp32 throughout; shapes as [rows, cols]. Backward functions
 * accumulate into parameter gradients and overwrite input gradients, as
 * include/hpu/ops.h says.
 */
#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "worker/ops/autocast.h"
#include "worker/ops/backend.h"
#include "worker/ops/ops_ref.h"
#include "worker/ops/backend_host.h"
#include "worker/ops/checks.h"
#include "worker/ops/fp8.h"
#include "common/simd.h"

#include "hpu/ops.h"

/* ---- matrix products ---- */

void hpu__ref_matmul(const float *a, const float *b, float *c, int m, int n, int k,
		     int trans_a, int trans_b, int accumulate)
{
	assert(a != NULL && b != NULL && c != NULL);
	assert(m >= 0 && n >= 0 && k >= 0);
	if (m == 0 || n == 0)
		return;
	if (k == 0) { /* an empty sum: c = 0, or c unchanged */
		if (!accumulate)
			memset(c, 0, (size_t)m * n * sizeof *c);
		return;
	}
	/* a is [M,K] (lda K) or stored [K,M] (lda M); b is [K,N] (ldb N) or
	 * stored [N,K] (ldb K); c is [M,N]. */
	cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
		    trans_b ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a,
		    trans_a ? m : k, b, trans_b ? k : n, accumulate ? 1.0f : 0.0f,
		    c, n);
}

/* c = a b (+ c) for `count` products on the backend: in bf16 when a16
 * and b16 are given (and it multiplies bf16 natively), else in fp32 on a
 * and b; the reference serves when the backend refuses. */
static void products(const float *a, const float *b, const uint16_t *a16,
		     const uint16_t *b16, float *c, int count, int m, int n, int k,
		     int trans_a, int trans_b, int accumulate, size_t stride_a,
		     size_t stride_b, size_t stride_c)
{
	assert(count >= 0);
	hpu__gemm g = {.count = count, .m = m, .n = n, .k = k, .trans_a = trans_a,
		       .trans_b = trans_b, .c = c, .stride_a = stride_a,
		       .stride_b = stride_b, .stride_c = stride_c, .accumulate = accumulate};
	if (a16 && b16) {
		g.dt = HPU_DT_BF16;
		g.a = a16;
		g.b = b16;
		if (hpu__be()->gemm(&g) == HPU_BE_OK)
			return;
	}
	g.dt = HPU_DT_F32;
	g.a = a;
	g.b = b;
	if (hpu__be()->gemm(&g) == HPU_BE_OK ||
	    hpu__be_refused("hpu_matmul/hpu_bmm", "gemm fp32, %d product(s) of %dx%dx%d",
			    count, m, n, k))
		return;
	for (int i = 0; i < count; i++)
		hpu__ref_matmul(a + i * stride_a, b + i * stride_b, c + i * stride_c, m, n, k,
				trans_a, trans_b, accumulate);
}

/* ---- GELU and tanh ---- */

#define GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

/* exp(x) in plain arithmetic, so that GCC vectorizes the GELU loops
 * (glibc's expf and tanhf are calls it cannot vectorize): x = k ln2 + r
 * with |r| <= ln2 / 2, e^r by its degree-7 Taylor polynomial (relative
 * error < 1e-8 before rounding), 2^k built in the exponent bits. x is
 * clamped to [-87, 88], where 2^k stays a normal float. */
static inline float exp_poly(float x)
{
	x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
	/* round x / ln2 to an integer: adding 1.5 * 2^23 leaves no fraction
	 * bits (the build does not reassociate, so this is not folded) */
	float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
	float r = (x - k * 0.693145752f) - k * 1.42860677e-6f; /* ln2 hi + lo */
	float p = 1.0f / 5040;
	p = p * r + 1.0f / 720;
	p = p * r + 1.0f / 120;
	p = p * r + 1.0f / 24;
	p = p * r + 1.0f / 6;
	p = p * r + 0.5f;
	p = p * r + 1.0f;
	p = p * r + 1.0f;
	/* unsigned: a NaN x gives k + 127 < 0 (its product is NaN anyway),
	 * whose shift would be undefined in int */
	union {
		uint32_t u;
		float f;
	} two_k = {.u = (uint32_t)((int32_t)k + 127) << 23};
	return p * two_k.f;
}

/* The tanh form is x * sigmoid(2u), u = c (x + a x^3), since
 * (1 + tanh u) / 2 = sigmoid(2u). With q = exp(-2u) and s = 1 / (1 + q):
 *   gelu(x)  = x s
 *   gelu'(x) = s + 2 x s (1 - s) du/dx = s (1 + 2 x (q s) c (1 + 3a x^2)),
 * 1 - s = q s having no cancellation, so both are good to a few ulp
 * relative, tails included (q s <= 1: no overflow). */
static inline float gelu_u(float v)
{
	return GELU_C * (v + GELU_A * v * v * v);
}

HPU_CLONES void hpu__ref_gelu_forward(const float *restrict x, float *restrict y,
				       size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float v = x[i];
		y[i] = v / (1.0f + exp_poly(-2.0f * gelu_u(v)));
	}
}

/* Not restrict: dx may alias dy. */
HPU_CLONES void hpu__ref_gelu_backward(const float *x, const float *dy, float *dx,
					size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float v = x[i], q = exp_poly(-2.0f * gelu_u(v));
		float s = 1.0f / (1.0f + q);
		float du = GELU_C * (1.0f + 3.0f * GELU_A * v * v);
		dx[i] = dy[i] * (s * (1.0f + 2.0f * v * (q * s) * du));
	}
}

void hpu__ref_tanh_forward(const float *x, float *y, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] = tanhf(x[i]);
}

/* Not restrict: dx may alias dy. */
HPU_CLONES void hpu__ref_tanh_backward(const float *y, const float *dy, float *dx,
					size_t n)
{
	for (size_t i = 0; i < n; i++)
		dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

/* ---- softmax ---- */

/* y[cols] = exp(x - max) / sum, one row. */
static void softmax_row(const float *x, float *y, int cols)
{
	float maxv = x[0];
	for (int c = 1; c < cols; c++)
		if (x[c] > maxv)
			maxv = x[c];
	float sum = 0.0f;
	for (int c = 0; c < cols; c++) {
		y[c] = expf(x[c] - maxv);
		sum += y[c];
	}
	float inv = 1.0f / sum;
	for (int c = 0; c < cols; c++)
		y[c] *= inv;
}

void hpu__ref_softmax_forward(const float *x, float *y, int rows, int cols)
{
	assert(x != NULL && y != NULL);
	if (cols <= 0)
		return;
	for (int r = 0; r < rows; r++)
		softmax_row(x + (size_t)r * cols, y + (size_t)r * cols, cols);
}

/* dx = y * (dy - <dy, y>), one row; dx may alias dy. */
static void softmax_row_backward(const float *y, const float *dy, float *dx,
				 int cols)
{
	float dot = 0.0f;
	for (int c = 0; c < cols; c++)
		dot += dy[c] * y[c];
	for (int c = 0; c < cols; c++)
		dx[c] = y[c] * (dy[c] - dot);
}

void hpu__ref_softmax_backward(const float *y, const float *dy, float *dx, int rows,
			       int cols)
{
	assert(y != NULL && dy != NULL && dx != NULL);
	for (int r = 0; r < rows; r++) {
		size_t o = (size_t)r * cols;
		softmax_row_backward(y + o, dy + o, dx + o, cols);
	}
}

/* ---- layer norm ---- */

void hpu__ref_layernorm_forward(const float *x, const float *gamma, const float *beta,
				float *y, float *mean, float *rstd, int rows, int cols,
				float eps)
{
	assert(x != NULL && gamma != NULL && beta != NULL && y != NULL);
	assert(mean != NULL && rstd != NULL && cols > 0);
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)r * cols;
		float *yr = y + (size_t)r * cols;
		/* two passes: the variance of (x - mean) loses nothing to a
		 * large mean */
		float m = 0.0f;
		for (int c = 0; c < cols; c++)
			m += xr[c];
		m /= (float)cols;
		float v = 0.0f;
		for (int c = 0; c < cols; c++) {
			float d = xr[c] - m;
			v += d * d;
		}
		v /= (float)cols;
		float s = 1.0f / sqrtf(v + eps);
		for (int c = 0; c < cols; c++)
			yr[c] = (xr[c] - m) * s * gamma[c] + beta[c];
		mean[r] = m;
		rstd[r] = s;
	}
}

/* With xhat = (x - mean) * rstd and g = dy * gamma:
 *   dgamma += dy * xhat, dbeta += dy,
 *   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
void hpu__ref_layernorm_backward(const float *x, const float *gamma, const float *mean,
				 const float *rstd, const float *dy, float *dx,
				 float *dgamma, float *dbeta, int rows, int cols)
{
	assert(x != NULL && gamma != NULL && mean != NULL && rstd != NULL);
	assert(dy != NULL && dx != NULL && dgamma != NULL && dbeta != NULL);
	assert(cols > 0);
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)r * cols, *dyr = dy + (size_t)r * cols;
		float *dxr = dx + (size_t)r * cols;
		float m = mean[r], s = rstd[r];
		float gsum = 0.0f, gxsum = 0.0f;
		for (int c = 0; c < cols; c++) {
			float xhat = (xr[c] - m) * s;
			float g = dyr[c] * gamma[c];
			gsum += g;
			gxsum += g * xhat;
			dgamma[c] += dyr[c] * xhat;
			dbeta[c] += dyr[c];
		}
		gsum /= (float)cols;
		gxsum /= (float)cols;
		for (int c = 0; c < cols; c++) {
			float xhat = (xr[c] - m) * s;
			dxr[c] = s * (dyr[c] * gamma[c] - gsum - xhat * gxsum);
		}
	}
}

/* ---- embedding ---- */

/* An id outside the table, which the kernels leave alone (backend.h):
 * never one the op checked. Where the op's check is deferred (checks.h)
 * the kernels read ids nothing has checked yet. */
static inline int emb_skip(int32_t id, int vocab)
{
	return id < 0 || id >= vocab;
}

static int embedding_forward(const float *table, const int32_t *ids, float *y,
			     int n, int vocab, int dim)
{
	assert(table != NULL && ids != NULL && y != NULL);
	/* ids come from data: check them all before writing anything (or,
	 * deferred, with the kernel: checks.h) */
	const hpu__backend *be = hpu__be();
	hpu__check_slot *k = n > 0 ? hpu__checks_take(HPU__CHECK_EMBEDDING, ids, vocab, 0,
						       (size_t)n)
				   : NULL;
	int ok = 1;
	if (k && HPU__BE_RUN(ids_first_bad, hpu__host_ids_first_bad, ids, (size_t)n, vocab,
			     &k->bad, &k->bad_id) != HPU_BE_OK)
		return HPU_ERROR;
	if (!k && n > 0 &&
	    (!be->ids_in_range || be->ids_in_range(ids, n, vocab, &ok) != HPU_BE_OK)) {
		if (hpu__be_refused("hpu_embedding_forward", "ids_in_range"))
			return HPU_OK;
		hpu__host_ids_in_range(ids, n, vocab, &ok);
	}
	if (!ok)
		return HPU_ERANGE;
	if ((!be->embedding_fwd ||
	     be->embedding_fwd(table, ids, y, n, vocab, dim) != HPU_BE_OK) &&
	    !hpu__be_refused("hpu_embedding_forward", "embedding_fwd"))
		hpu__host_embedding_fwd(table, ids, y, n, vocab, dim);
	return HPU_OK;
}

/* The CPU's embedding_fwd (hpu__be_host). */
int hpu__host_embedding_fwd(const float *table, const int32_t *ids, float *y, int n, int vocab,
			    int dim)
{
	for (int i = 0; i < n; i++) {
		float *yr = y + (size_t)i * dim;
		if (emb_skip(ids[i], vocab))
			memset(yr, 0, (size_t)dim * sizeof *y);
		else
			memcpy(yr, table + (size_t)ids[i] * dim, (size_t)dim * sizeof *y);
	}
	return HPU_BE_OK;
}

static void embedding_backward(const int32_t *ids, const float *dy, float *dtable,
			       int n, int dim)
{
	assert(ids != NULL && dy != NULL && dtable != NULL);
	const hpu__backend *be = hpu__be();
	/* the vocabulary where the forward's check was deferred; else the
	 * forward checked the ids, and only a negative one is skipped */
	long limit = hpu__checks_limit(ids);
	int vocab = limit >= 0 && limit <= INT_MAX ? (int)limit : INT_MAX;
	if ((!be->embedding_bwd || be->embedding_bwd(ids, dy, dtable, n, vocab, dim) != HPU_BE_OK) &&
	    !hpu__be_refused("hpu_embedding_backward", "embedding_bwd"))
		hpu__host_embedding_bwd(ids, dy, dtable, n, vocab, dim);
}

/* The CPU's embedding_bwd (hpu__be_host). */
int hpu__host_embedding_bwd(const int32_t *ids, const float *dy, float *dtable, int n,
			    int vocab, int dim)
{
	for (int i = 0; i < n; i++) {
		if (emb_skip(ids[i], vocab)) /* the forward checked them, or deferred */
			continue;
		float *row = dtable + (size_t)ids[i] * dim;
		const float *d = dy + (size_t)i * dim;
		for (int c = 0; c < dim; c++)
			row[c] += d[c];
	}
	return HPU_BE_OK;
}

/* ---- dropout ---- */

/* The splitmix64 / murmur3 finalizer: a bijection of 64-bit words whose
 * output bits each depend on every input bit. */
static inline uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Element i is kept when the top 32 bits of mix64(key + (i + 1) * golden)
 * reach p * 2^32, key mixing seed and stream: a counter-based generator
 * (splitmix64 addressed by i), so the mask is a pure function of
 * (seed, stream, i). */
static uint64_t dropout_key(uint64_t seed, uint64_t stream)
{
	return mix64(seed ^ mix64(stream ^ 0x6a09e667f3bcc909ull));
}

static void dropout_forward(const float *x, float *y, uint8_t *mask, size_t n,
			    float p, uint64_t seed, uint64_t stream)
{
	assert(x != NULL && y != NULL && mask != NULL);
	assert(p >= 0.0f && p <= 1.0f);
	const hpu__backend *be = hpu__be();
	if ((be->dropout_fwd && be->dropout_fwd(x, y, mask, n, p, seed, stream) == HPU_BE_OK) ||
	    hpu__be_refused("hpu_dropout_forward", "dropout_fwd"))
		return;
	hpu__host_dropout_fwd(x, y, mask, n, p, seed, stream);
}

/* The CPU's dropout_fwd (hpu__be_host). */
int hpu__host_dropout_fwd(const float *x, float *y, uint8_t *mask, size_t n, float p,
			  uint64_t seed, uint64_t stream)
{
	if (p >= 1.0f) { /* everything dropped; no 1 / 0 */
		memset(mask, 0, n);
		for (size_t i = 0; i < n; i++)
			y[i] = 0.0f;
		return HPU_BE_OK;
	}
	const uint64_t key = dropout_key(seed, stream);
	const uint32_t thresh = (uint32_t)((double)p * 4294967296.0);
	const float scale = 1.0f / (1.0f - p);
	for (size_t i = 0; i < n; i++) {
		uint64_t h = mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
		uint8_t keep = (uint32_t)(h >> 32) >= thresh;
		mask[i] = keep;
		y[i] = keep ? x[i] * scale : 0.0f;
	}
	return HPU_BE_OK;
}

HPU_CLONES static void dropout_backward_c(const float *dy, const uint8_t *mask,
					  float *dx, size_t n, float p)
{
	const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
	for (size_t i = 0; i < n; i++)
		dx[i] = mask[i] ? dy[i] * scale : 0.0f;
}

/* The CPU's dropout_bwd (hpu__be_host). */
int hpu__host_dropout_bwd(const float *dy, const uint8_t *mask, float *dx, size_t n, float p)
{
	dropout_backward_c(dy, mask, dx, n, p);
	return HPU_BE_OK;
}

static void dropout_backward(const float *dy, const uint8_t *mask, float *dx, size_t n,
			     float p)
{
	const hpu__backend *be = hpu__be();
	if ((!be->dropout_bwd || be->dropout_bwd(dy, mask, dx, n, p) != HPU_BE_OK) &&
	    !hpu__be_refused("hpu_dropout_backward", "dropout_bwd"))
		dropout_backward_c(dy, mask, dx, n, p);
}

/* ---- causal multi-head self-attention ----
 *
 * For batch b and head h, with row stride 3D in qkv:
 *   q = qkv[b, :, h*hd ...], k = the same at + D, v at + 2D     [T, hd]
 *   att = softmax_causal(q k^T / sqrt(hd))                       [T, T]
 *   out[b, :, h*hd ...] = att v                 (row stride D)   [T, hd]
 * The products run on strided views through sgemm's leading dimensions.
 */

int hpu__host_attention_fwd(const float *qkv, float *out, float *att, int batch, int t,
			    int heads, int head_dim)
{
	const int d = heads * head_dim, ld = 3 * d;
	const float scale = 1.0f / sqrtf((float)head_dim);
	if (t <= 0 || d <= 0)
		return HPU_BE_OK;
	for (int b = 0; b < batch; b++) {
		const float *base = qkv + (size_t)b * t * ld;
		for (int h = 0; h < heads; h++) {
			const float *q = base + h * head_dim;
			const float *k = q + d, *v = q + 2 * d;
			float *a = att + ((size_t)b * heads + h) * t * t;
			float *o = out + (size_t)b * t * d + h * head_dim;
			/* a[T,T] = scale * q[T,hd] k[T,hd]^T */
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t,
				    head_dim, scale, q, ld, k, ld, 0.0f, a, t);
			/* row i sees 0..i; the future gets probability 0 */
			for (int i = 0; i < t; i++) {
				float *row = a + (size_t)i * t;
				softmax_row(row, row, i + 1);
				for (int j = i + 1; j < t; j++)
					row[j] = 0.0f;
			}
			/* o[T,hd] = a[T,T] v[T,hd] */
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t,
				    head_dim, t, 1.0f, a, t, v, ld, 0.0f, o, d);
		}
	}
	return HPU_BE_OK;
}

/* With do = dout's head slice [T, hd] and P = att [T, T]:
 *   dv = P^T do,  dP = do v^T,  dS = P * (dP - rowsum(dP * P)) * scale,
 *   dq = dS k,    dk = dS^T q.
 * Future entries of P are 0, so dS is 0 there and no mask is needed. */
int hpu__host_attention_bwd(const float *qkv, const float *att, const float *dout, float *dqkv,
			    int batch, int t, int heads, int head_dim)
{
	const int d = heads * head_dim, ld = 3 * d;
	const float scale = 1.0f / sqrtf((float)head_dim);
	if (t <= 0 || d <= 0)
		return HPU_BE_OK;
	/* dP, then dS, of one head; the signature has no scratch and the
	 * op cannot fail, so running out of memory here aborts. */
	float *ds = malloc((size_t)t * t * sizeof *ds);
	if (ds == NULL)
		abort();
	for (int b = 0; b < batch; b++) {
		const float *base = qkv + (size_t)b * t * ld;
		float *dbase = dqkv + (size_t)b * t * ld;
		for (int h = 0; h < heads; h++) {
			const float *q = base + h * head_dim;
			const float *k = q + d, *v = q + 2 * d;
			float *dq = dbase + h * head_dim;
			float *dk = dq + d, *dv = dq + 2 * d;
			const float *p = att + ((size_t)b * heads + h) * t * t;
			const float *dO = dout + (size_t)b * t * d + h * head_dim;
			/* dv[T,hd] = p[T,T]^T dO[T,hd] */
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t,
				    head_dim, t, 1.0f, p, t, dO, d, 0.0f, dv, ld);
			/* ds[T,T] = dO[T,hd] v[T,hd]^T */
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, t, t,
				    head_dim, 1.0f, dO, d, v, ld, 0.0f, ds, t);
			/* through the softmax of each row (0..i), scaled */
			for (int i = 0; i < t; i++) {
				float *row = ds + (size_t)i * t;
				softmax_row_backward(p + (size_t)i * t, row, row, i + 1);
				for (int j = 0; j <= i; j++)
					row[j] *= scale;
				for (int j = i + 1; j < t; j++)
					row[j] = 0.0f;
			}
			/* dq[T,hd] = ds[T,T] k[T,hd]; dk[T,hd] = ds^T q */
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, t,
				    head_dim, t, 1.0f, ds, t, k, ld, 0.0f, dq, ld);
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, t,
				    head_dim, t, 1.0f, ds, t, q, ld, 0.0f, dk, ld);
		}
	}
	free(ds);
	return HPU_BE_OK;
}

static int attention_forward(const float *qkv, float *out, float *att, int batch, int t,
			     int heads, int head_dim)
{
	assert(qkv != NULL && out != NULL && att != NULL);
	return HPU__BE_RUN(attention_fwd, hpu__host_attention_fwd, qkv, out, att, batch, t, heads,
			   head_dim) == HPU_BE_OK
		       ? HPU_OK
		       : HPU_ERROR;
}

static int attention_backward(const float *qkv, const float *att, const float *dout,
			      float *dqkv, int batch, int t, int heads, int head_dim)
{
	assert(qkv != NULL && att != NULL && dout != NULL && dqkv != NULL);
	return HPU__BE_RUN(attention_bwd, hpu__host_attention_bwd, qkv, att, dout, dqkv, batch,
			   t, heads, head_dim) == HPU_BE_OK
		       ? HPU_OK
		       : HPU_ERROR;
}

/* ---- the public ops: the autocast policy around the kernels ---- */

/* The size of a or b as stored: rows * cols either way round. */
static size_t mat_n(int r, int c)
{
	return (size_t)r * (size_t)c;
}

/* The floats a strided batch spans: count matrices of n, stride apart. */
static size_t span(int count, size_t stride, size_t n)
{
	return count > 0 ? (size_t)(count - 1) * stride + n : 0;
}

/* c = round(a b) to lowp (+ c in fp32 under accumulate: the rounded
 * product goes through scratch slot 2 then). a and b are already in the
 * low type: bf16-exact when a16/b16 (their bf16 form) are given. */
static void products_rounded(const float *a, const float *b, const uint16_t *a16,
			     const uint16_t *b16, float *c, int count, int m, int n, int k,
			     int trans_a, int trans_b, int accumulate, size_t stride_a,
			     size_t stride_b, size_t stride_c, int lp)
{
	size_t nc = span(count, stride_c, mat_n(m, n));
	float *p = accumulate ? hpu__ac_scratch(2, nc) : c;
	products(a, b, a16, b16, p, count, m, n, k, trans_a, trans_b, 0, stride_a, stride_b,
		 stride_c);
	/* products that follow each other (attention's heads) are rounded
	 * and added in one call: a call per product was 192 kernel launches
	 * for each of GPT-2's batched products at batch 16 */
	size_t mn = mat_n(m, n);
	int calls = count == 1 || stride_c == mn ? 1 : count;
	size_t len = calls == 1 ? (size_t)count * mn : mn;
	if (!accumulate) {
		for (int i = 0; i < calls; i++)
			hpu__ac_round_inplace(c + i * stride_c, len, lp);
		return;
	}
	const hpu__backend *be = hpu__be();
	for (int i = 0; i < calls; i++) {
		float *pi = p + i * stride_c, *ci = c + i * stride_c;
		hpu__ac_round_inplace(pi, len, lp);
		if ((!be->add || be->add(pi, ci, len) != HPU_BE_OK) &&
		    !hpu__be_refused("hpu_matmul/hpu_bmm", "add"))
			hpu__host_add(pi, ci, len);
	}
}

/* The CPU's add (hpu__be_host). */
int hpu__host_add(const float *x, float *y, size_t n)
{
	for (size_t j = 0; j < n; j++)
		y[j] += x[j];
	return HPU_BE_OK;
}

/* bf16 products run natively here */
static int bf16_ok(int lp)
{
	return (lp == HPU_AUTOCAST_BF16 || lp == HPU_AUTOCAST_FP8) && hpu__be()->bf16_native();
}

/* The lowered product of fp32 a and b: rounded to lowp (bf16 forms made
 * for the bf16 kernel), multiplied, the product rounded. fp8's q.a, q.b
 * are exact in bf16 and take the same way. */
static void products_low(const float *a, const float *b, float *c, int count, int m,
			 int n, int k, int trans_a, int trans_b, int accumulate,
			 size_t stride_a, size_t stride_b, size_t stride_c, int lp)
{
	size_t na = span(count, stride_a, mat_n(m, k)), nb = span(count, stride_b, mat_n(k, n));
	if (bf16_ok(lp)) {
		const uint16_t *a16 = hpu__ac_bf16(0, a, na), *b16 = hpu__ac_weight_bf16(1, b, nb);
		products_rounded(a, b, a16, b16, c, count, m, n, k, trans_a, trans_b, accumulate,
				 stride_a, stride_b, stride_c, lp);
		return;
	}
	if (lp != HPU_AUTOCAST_FP8) { /* fp8's operands are exact already */
		a = hpu__ac_round(0, a, na, lp);
		b = hpu__ac_weight_round(1, b, nb, lp);
	}
	products_rounded(a, b, NULL, NULL, c, count, m, n, k, trans_a, trans_b, accumulate,
			 stride_a, stride_b, stride_c, lp);
}

void hpu_matmul(const float *a, const float *b, float *c, int m, int n, int k,
		int trans_a, int trans_b, int accumulate)
{
	int lp = hpu__ac_enter(HPU_OP_MATMUL);
	hpu__fp8_call q;
	lp = hpu__fp8_begin(&q, HPU_OP_MATMUL, lp, a, mat_n(m, k), b, mat_n(k, n));
	if (q.on) {
		if (m > 0 && n > 0)
			products_low(q.a, q.b, c, 1, m, n, k, trans_a, trans_b, accumulate, 0, 0,
				     0, lp);
		return;
	}
	if (!lp || m <= 0 || n <= 0)
		products(a, b, NULL, NULL, c, 1, m, n, k, trans_a, trans_b, accumulate, 0, 0, 0);
	else
		products_low(a, b, c, 1, m, n, k, trans_a, trans_b, accumulate, 0, 0, 0, lp);
	hpu__fp8_end(&q, c, mat_n(m, n));
}

void hpu_bmm(const float *a, const float *b, float *c, int count, int m, int n,
	     int k, int trans_a, int trans_b, int accumulate, size_t stride_a,
	     size_t stride_b, size_t stride_c)
{
	int lp = hpu__ac_enter(HPU_OP_BMM);
	hpu__fp8_call q;
	lp = hpu__fp8_begin(&q, HPU_OP_BMM, lp, a, span(count, stride_a, mat_n(m, k)), b,
		       span(count, stride_b, mat_n(k, n)));
	if (q.on) { /* one scale for each operand's whole batch */
		if (count > 0 && m > 0 && n > 0)
			products_low(q.a, q.b, c, count, m, n, k, trans_a, trans_b, accumulate,
				     stride_a, stride_b, stride_c, lp);
		return;
	}
	if (!lp || m <= 0 || n <= 0 || count <= 0)
		products(a, b, NULL, NULL, c, count, m, n, k, trans_a, trans_b, accumulate,
			 stride_a, stride_b, stride_c);
	else
		products_low(a, b, c, count, m, n, k, trans_a, trans_b, accumulate, stride_a,
			     stride_b, stride_c, lp);
	/* the output's max |x| over the batch: c's span */
	hpu__fp8_end(&q, c, span(count, stride_c, mat_n(m, n)));
}

/* The kernels of the ops below: the backend's, or the reference when it
 * answers HPU_BE_UNSUPPORTED. */
static void gelu_fwd(const float *x, float *y, size_t n)
{
	if (hpu__be()->eltwise_fwd(HPU_ELT_GELU_TANH, x, y, n) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_gelu_forward", "eltwise_fwd GELU, %zu values", n))
		hpu__ref_gelu_forward(x, y, n);
}

static void gelu_bwd(const float *x, const float *dy, float *dx, size_t n)
{
	if (hpu__be()->eltwise_bwd(HPU_ELT_GELU_TANH, x, dy, dx, n) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_gelu_backward", "eltwise_bwd GELU, %zu values", n))
		hpu__ref_gelu_backward(x, dy, dx, n);
}

static void tanh_fwd(const float *x, float *y, size_t n)
{
	if (hpu__be()->eltwise_fwd(HPU_ELT_TANH, x, y, n) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_tanh_forward", "eltwise_fwd tanh, %zu values", n))
		hpu__ref_tanh_forward(x, y, n);
}

static void tanh_bwd(const float *y, const float *dy, float *dx, size_t n)
{
	if (hpu__be()->eltwise_bwd(HPU_ELT_TANH, y, dy, dx, n) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_tanh_backward", "eltwise_bwd tanh, %zu values", n))
		hpu__ref_tanh_backward(y, dy, dx, n);
}

static void softmax_fwd(const float *x, float *y, int rows, int cols)
{
	if (hpu__be()->softmax_fwd(x, y, rows, cols) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_softmax_forward", "softmax_fwd, %d x %d", rows, cols))
		hpu__ref_softmax_forward(x, y, rows, cols);
}

static void softmax_bwd(const float *y, const float *dy, float *dx, int rows, int cols)
{
	if (hpu__be()->softmax_bwd(y, dy, dx, rows, cols) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_softmax_backward", "softmax_bwd, %d x %d", rows, cols))
		hpu__ref_softmax_backward(y, dy, dx, rows, cols);
}

static void layernorm_fwd(const float *x, const float *gamma, const float *beta, float *y,
			  float *mean, float *rstd, int rows, int cols, float eps)
{
	if (hpu__be()->layernorm_fwd(x, gamma, beta, y, mean, rstd, rows, cols, eps) !=
		    HPU_BE_OK &&
	    !hpu__be_refused("hpu_layernorm_forward", "layernorm_fwd, %d x %d", rows, cols))
		hpu__ref_layernorm_forward(x, gamma, beta, y, mean, rstd, rows, cols, eps);
}

static void layernorm_bwd(const float *x, const float *gamma, const float *mean,
			  const float *rstd, const float *dy, float *dx, float *dgamma,
			  float *dbeta, int rows, int cols)
{
	if (hpu__be()->layernorm_bwd(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows,
				     cols) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_layernorm_backward", "layernorm_bwd, %d x %d", rows, cols))
		hpu__ref_layernorm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows,
					    cols);
}

/* Elementwise ops lowered: the input(s) rounded, the output rounded. */
void hpu_gelu_forward(const float *x, float *y, size_t n)
{
	int lp = hpu__ac_enter(HPU_OP_GELU);
	gelu_fwd(lp ? hpu__ac_round(0, x, n, lp) : x, y, n);
	if (lp)
		hpu__ac_round_inplace(y, n, lp);
}

void hpu_gelu_backward(const float *x, const float *dy, float *dx, size_t n)
{
	int lp = hpu__ac_enter(HPU_OP_GELU);
	if (!lp) {
		gelu_bwd(x, dy, dx, n);
		return;
	}
	gelu_bwd(hpu__ac_round(0, x, n, lp), hpu__ac_round(1, dy, n, lp), dx, n);
	hpu__ac_round_inplace(dx, n, lp);
}

void hpu_tanh_forward(const float *x, float *y, size_t n)
{
	int lp = hpu__ac_enter(HPU_OP_TANH);
	tanh_fwd(lp ? hpu__ac_round(0, x, n, lp) : x, y, n);
	if (lp)
		hpu__ac_round_inplace(y, n, lp);
}

void hpu_tanh_backward(const float *y, const float *dy, float *dx, size_t n)
{
	int lp = hpu__ac_enter(HPU_OP_TANH);
	if (!lp) {
		tanh_bwd(y, dy, dx, n);
		return;
	}
	tanh_bwd(hpu__ac_round(0, y, n, lp), hpu__ac_round(1, dy, n, lp), dx, n);
	hpu__ac_round_inplace(dx, n, lp);
}

void hpu_softmax_forward(const float *x, float *y, int rows, int cols)
{
	int lp = hpu__ac_enter(HPU_OP_SOFTMAX);
	size_t n = rows > 0 && cols > 0 ? mat_n(rows, cols) : 0;
	softmax_fwd(lp && n ? hpu__ac_round(0, x, n, lp) : x, y, rows, cols);
	if (lp)
		hpu__ac_round_inplace(y, n, lp);
}

void hpu_softmax_backward(const float *y, const float *dy, float *dx, int rows,
			  int cols)
{
	int lp = hpu__ac_enter(HPU_OP_SOFTMAX);
	size_t n = rows > 0 && cols > 0 ? mat_n(rows, cols) : 0;
	if (!lp || !n) {
		softmax_bwd(y, dy, dx, rows, cols);
		return;
	}
	softmax_bwd(hpu__ac_round(0, y, n, lp), hpu__ac_round(1, dy, n, lp), dx, rows, cols);
	hpu__ac_round_inplace(dx, n, lp);
}

/* Lowered: x, gamma, beta (and dy) rounded; mean and rstd stay fp32;
 * y and dx rounded; dgamma, dbeta accumulated in fp32. */
void hpu_layernorm_forward(const float *x, const float *gamma, const float *beta,
			   float *y, float *mean, float *rstd, int rows, int cols,
			   float eps)
{
	int lp = hpu__ac_enter(HPU_OP_LAYERNORM);
	if (!lp || rows <= 0) {
		layernorm_fwd(x, gamma, beta, y, mean, rstd, rows, cols, eps);
		return;
	}
	size_t n = mat_n(rows, cols);
	layernorm_fwd(hpu__ac_round(0, x, n, lp), hpu__ac_round(1, gamma, (size_t)cols, lp),
		      hpu__ac_round(2, beta, (size_t)cols, lp), y, mean, rstd, rows, cols, eps);
	hpu__ac_round_inplace(y, n, lp);
}

void hpu_layernorm_backward(const float *x, const float *gamma, const float *mean,
			    const float *rstd, const float *dy, float *dx,
			    float *dgamma, float *dbeta, int rows, int cols)
{
	int lp = hpu__ac_enter(HPU_OP_LAYERNORM);
	if (!lp || rows <= 0) {
		layernorm_bwd(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, cols);
		return;
	}
	size_t n = mat_n(rows, cols);
	layernorm_bwd(hpu__ac_round(0, x, n, lp), hpu__ac_round(1, gamma, (size_t)cols, lp),
		      mean, rstd, hpu__ac_round(2, dy, n, lp), dx, dgamma, dbeta, rows, cols);
	hpu__ac_round_inplace(dx, n, lp);
}

/* Lowered: the gathered rows rounded (the same as gathering from a rounded
 * table); backward adds the rounded dy in fp32. */
int hpu_embedding_forward(const float *table, const int32_t *ids, float *y,
			  int n, int vocab, int dim)
{
	int lp = hpu__ac_enter(HPU_OP_EMBEDDING);
	int rc = embedding_forward(table, ids, y, n, vocab, dim);
	if (lp && rc == 0 && n > 0 && dim > 0)
		hpu__ac_round_inplace(y, mat_n(n, dim), lp);
	return rc;
}

void hpu_embedding_backward(const int32_t *ids, const float *dy, float *dtable,
			    int n, int dim)
{
	int lp = hpu__ac_enter(HPU_OP_EMBEDDING);
	embedding_backward(ids, lp && n > 0 && dim > 0 ? hpu__ac_round(0, dy, mat_n(n, dim), lp) : dy,
			   dtable, n, dim);
}

void hpu_dropout_forward(const float *x, float *y, uint8_t *mask, size_t n,
			 float p, uint64_t seed, uint64_t stream)
{
	int lp = hpu__ac_enter(HPU_OP_DROPOUT);
	dropout_forward(lp ? hpu__ac_round(0, x, n, lp) : x, y, mask, n, p, seed, stream);
	if (lp)
		hpu__ac_round_inplace(y, n, lp);
}

void hpu_dropout_backward(const float *dy, const uint8_t *mask, float *dx,
			  size_t n, float p)
{
	int lp = hpu__ac_enter(HPU_OP_DROPOUT);
	dropout_backward(lp ? hpu__ac_round(0, dy, n, lp) : dy, mask, dx, n, p);
	if (lp)
		hpu__ac_round_inplace(dx, n, lp);
}

/* Lowered: qkv (and dout) rounded; the scores, the softmax probabilities
 * (att) and the products inside stay fp32, as fused attention kernels
 * keep them; out and dqkv rounded. */
int hpu_attention_forward(const float *qkv, float *out, float *att, int batch, int t,
			  int heads, int head_dim)
{
	int lp = hpu__ac_enter(HPU_OP_ATTENTION);
	size_t d = (size_t)heads * head_dim;
	if (!lp || batch <= 0 || t <= 0 || d == 0)
		return attention_forward(qkv, out, att, batch, t, heads, head_dim);
	size_t bt = (size_t)batch * t;
	int rc = attention_forward(hpu__ac_round(0, qkv, bt * 3 * d, lp), out, att, batch, t,
				   heads, head_dim);
	if (rc == HPU_OK)
		hpu__ac_round_inplace(out, bt * d, lp);
	return rc;
}

int hpu_attention_backward(const float *qkv, const float *att, const float *dout, float *dqkv,
			   int batch, int t, int heads, int head_dim)
{
	int lp = hpu__ac_enter(HPU_OP_ATTENTION);
	size_t d = (size_t)heads * head_dim;
	if (!lp || batch <= 0 || t <= 0 || d == 0)
		return attention_backward(qkv, att, dout, dqkv, batch, t, heads, head_dim);
	size_t bt = (size_t)batch * t;
	int rc = attention_backward(hpu__ac_round(0, qkv, bt * 3 * d, lp), att,
				    hpu__ac_round(1, dout, bt * d, lp), dqkv, batch, t, heads,
				    head_dim);
	if (rc == HPU_OK)
		hpu__ac_round_inplace(dqkv, bt * 3 * d, lp);
	return rc;
}
