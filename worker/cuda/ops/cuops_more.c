/* cuops_more: the CUDA table's entries for the shape, sequence and loss
 * layers (cuops_more.h): reduce, row copies, zeroing, permute, sigmoid,
 * 1-D pooling, the rectangular convolution (im2col and cuBLASLt products
 * per sample, through hpu__cuops_gemm), MSE and BCE, the id check and
 * causal attention. As cuops.c's: a failing CUDA call ends the worker
 * with a line naming it (hpu__cuops_fatal). Results a caller reads on
 * the host (the first bad index) wait for the stream.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "worker/cuda/ops/cuops.h"
#include "worker/cuda/ops/cuops_more.h"

/* ---- shapes ---- */

int hpu__cuops_reduce_fwd(int op, const float *x, float *y, int32_t *idx, size_t outer,
			  size_t n, size_t inner)
{
	if (n < 1 || (unsigned)op > HPU_CUKM_REDUCE_MAX)
		return HPU_BE_UNSUPPORTED;
	CU_KERNEL("reduction", hpu__cukm_reduce_fwd(op, x, y, idx, outer, n, inner, st));
}

int hpu__cuops_reduce_bwd(int op, const float *dy, const int32_t *idx, float *dx, size_t outer,
			  size_t n, size_t inner)
{
	if (n < 1 || (unsigned)op > HPU_CUKM_REDUCE_MAX || (op == HPU_CUKM_REDUCE_MAX && !idx))
		return HPU_BE_UNSUPPORTED;
	CU_KERNEL("reduction backward",
		  hpu__cukm_reduce_bwd(op, dy, idx, dx, outer, n, inner, st));
}

/* A 2-D copy's pitch CUDA takes on every GPU (cudaDevAttrMaxPitch is
 * 2^31 - 1 bytes on current ones). */
#define PITCH_MAX ((size_t)0x7fffffff)

/* outer rows of `bytes`, the pitches apart: one 2-D copy, or a copy a
 * row where a pitch is past what a 2-D copy takes (a row of GPT-2's
 * logits is) or there is one row. */
static cudaError_t copy_rows(char *y, size_t ypitch, const char *x, size_t xpitch,
			     size_t bytes, size_t outer, cudaStream_t st)
{
	if (outer > 1 && xpitch <= PITCH_MAX && ypitch <= PITCH_MAX)
		return cudaMemcpy2DAsync(y, ypitch, x, xpitch, bytes, outer,
					 cudaMemcpyDeviceToDevice, st);
	for (size_t o = 0; o < outer; o++) {
		cudaError_t e = cudaMemcpyAsync(y + o * ypitch, x + o * xpitch, bytes,
						cudaMemcpyDeviceToDevice, st);
		if (e != cudaSuccess)
			return e;
	}
	return cudaSuccess;
}

/* One strided copy: outer rows of len * inner floats, nx and ny rows apart. */
int hpu__cuops_copy_rows(const float *x, float *y, size_t outer, size_t nx, size_t x0,
			 size_t ny, size_t y0, size_t len, size_t inner)
{
	const size_t f = sizeof(float);
	if (!outer || !len || !inner)
		return HPU_BE_OK;
	CU_KERNEL("row copies",
		  copy_rows((char *)(y + y0 * inner), ny * inner * f,
			    (const char *)(x + x0 * inner), nx * inner * f, len * inner * f,
			    outer, st));
}

int hpu__cuops_zero(void *dst, size_t bytes)
{
	if (!bytes)
		return HPU_BE_OK;
	CU_KERNEL("zeroing", cudaMemsetAsync(dst, 0, bytes, st));
}

/* The host's walk: y's dimension d steps x by x's stride along perm[d]. */
int hpu__cuops_permute(const float *x, float *y, int ndim, const int64_t *shape,
		       const int *perm)
{
	hpu__cukm_perm p;
	size_t xstride[HPU_CUKM_PERM_MAX], s = 1;
	if (ndim < 1 || ndim > HPU_CUKM_PERM_MAX)
		return HPU_BE_UNSUPPORTED;
	for (int d = ndim - 1; d >= 0; d--) {
		xstride[d] = s;
		s *= (size_t)shape[d];
	}
	p.ndim = ndim;
	for (int d = 0; d < ndim; d++) {
		if (perm[d] < 0 || perm[d] >= ndim)
			return HPU_BE_UNSUPPORTED;
		p.yshape[d] = (size_t)shape[perm[d]];
		p.ystep[d] = xstride[perm[d]];
	}
	CU_KERNEL("permutation", hpu__cukm_permute(x, y, &p, st));
}

int hpu__cuops_sigmoid_fwd(const float *x, float *y, size_t n)
{
	CU_KERNEL("sigmoid", hpu__cukm_sigmoid(0, x, NULL, y, n, st));
}

int hpu__cuops_sigmoid_bwd(const float *y, const float *dy, float *dx, size_t n)
{
	CU_KERNEL("sigmoid backward", hpu__cukm_sigmoid(1, y, dy, dx, n, st));
}

int hpu__cuops_pool1d_fwd(int max, const float *x, float *y, int32_t *idx, size_t outer, int n,
			  size_t inner, int k, int stride)
{
	if (k < 1 || stride < 1 || n < k || (max && !idx))
		return HPU_BE_UNSUPPORTED;
	CU_KERNEL("1-D pooling",
		  hpu__cukm_pool1d(0, max, x, y, NULL, idx, outer, n, inner, k, stride, st));
}

int hpu__cuops_pool1d_bwd(int max, const float *dy, const int32_t *idx, float *dx,
			  size_t outer, int n, size_t inner, int k, int stride)
{
	if (k < 1 || stride < 1 || n < k || (max && !idx))
		return HPU_BE_UNSUPPORTED;
	CU_KERNEL("1-D pooling backward",
		  hpu__cukm_pool1d(1, max, dy, dx, idx, NULL, outer, n, inner, k, stride, st));
}

/* ---- the rectangular convolution ---- */

static hpu__cukm_rect rect_of(const hpu_conv2d_rect_shape *s)
{
	hpu__cukm_rect r = {s->in_ch,	 s->height,  s->width,	s->kernel_h,
			    s->kernel_w, s->stride_h, s->stride_w, s->pad_h,
			    s->pad_w,	 0,	     0};
	r.oh = (s->height + 2 * s->pad_h - s->kernel_h) / s->stride_h + 1;
	r.ow = (s->width + 2 * s->pad_w - s->kernel_w) / s->stride_w + 1;
	return r;
}

static int rect_ok(const hpu_conv2d_rect_shape *s)
{
	return s->batch >= 0 && s->in_ch > 0 && s->out_ch > 0 && s->kernel_h > 0 &&
	       s->kernel_w > 0 && s->stride_h > 0 && s->stride_w > 0 && s->pad_h >= 0 &&
	       s->pad_w >= 0 && s->height + 2 * s->pad_h >= s->kernel_h &&
	       s->width + 2 * s->pad_w >= s->kernel_w;
}

#define UNFOLD(what, call)                                                             \
	do {                                                                           \
		hpu__cuops_ctx *c_ = hpu__cuops_enter();                               \
		if (!c_)                                                               \
			return HPU_BE_UNSUPPORTED;                                     \
		cudaStream_t st = hpu__cuops_stream();                                 \
		int bad_ = hpu__cuops_cuda((call), what);                              \
		hpu__cuops_leave(c_);                                                  \
		if (bad_)                                                              \
			return HPU_BE_UNSUPPORTED;                                     \
	} while (0)

/* c[m, n] (+)= a * b, fp32, one product. */
static int gemm1(int m, int n, int k, int ta, int tb, const float *a, const float *b, float *c,
		 int accumulate)
{
	hpu__gemm g;
	memset(&g, 0, sizeof g);
	g.dt = HPU_DT_F32;
	g.count = 1;
	g.m = m, g.n = n, g.k = k;
	g.trans_a = ta, g.trans_b = tb;
	g.a = a, g.b = b, g.c = c;
	g.accumulate = accumulate;
	return hpu__cuops_gemm(&g);
}

/* Per sample: y = b (or 0), col = im2col(x), y += w col. */
int hpu__cuops_conv_rect_fwd(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			     const float *b, float *y, float *scratch)
{
	if (!rect_ok(s))
		return HPU_BE_UNSUPPORTED;
	hpu__cukm_rect r = rect_of(s);
	const int O = s->out_ch, ckk = r.c * r.kh * r.kw, npix = r.oh * r.ow;
	const size_t xs = (size_t)r.c * r.h * r.w, ys = (size_t)O * npix;
	UNFOLD("convolution's bias",
	       hpu__cukm_rows_fill(y, b, (size_t)s->batch, (size_t)O, (size_t)npix, st));
	for (int n = 0; n < s->batch; n++) {
		UNFOLD("im2col", hpu__cukm_im2col(&r, x + n * xs, scratch, st));
		if (gemm1(O, npix, ckk, 0, 0, w, scratch, y + n * ys, 1) != HPU_BE_OK)
			return HPU_BE_UNSUPPORTED;
	}
	return HPU_BE_OK;
}

/* Per sample: dw += dy col^T; dcol = w^T dy, dx = col2im(dcol); then
 * db += the sums of dy's rows. */
int hpu__cuops_conv_rect_bwd(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			     const float *dy, float *dx, float *dw, float *db, float *scratch)
{
	if (!rect_ok(s))
		return HPU_BE_UNSUPPORTED;
	hpu__cukm_rect r = rect_of(s);
	const int O = s->out_ch, ckk = r.c * r.kh * r.kw, npix = r.oh * r.ow;
	const size_t xs = (size_t)r.c * r.h * r.w, ys = (size_t)O * npix;
	for (int n = 0; n < s->batch; n++) {
		const float *dyn = dy + n * ys;
		if (dw) {
			UNFOLD("im2col", hpu__cukm_im2col(&r, x + n * xs, scratch, st));
			if (gemm1(O, ckk, npix, 0, 1, dyn, scratch, dw, 1) != HPU_BE_OK)
				return HPU_BE_UNSUPPORTED;
		}
		if (!dx)
			continue;
		if (gemm1(ckk, npix, O, 1, 0, w, dyn, scratch, 0) != HPU_BE_OK)
			return HPU_BE_UNSUPPORTED;
		UNFOLD("col2im", hpu__cukm_col2im(&r, scratch, dx + n * xs, st));
	}
	if (db)
		UNFOLD("convolution's bias gradient",
		       hpu__cukm_rows_sum(dy, db, s->batch, O, (size_t)npix, st));
	return HPU_BE_OK;
}

/* ---- losses and the id check ---- */

/* The first bad index (a slot set to ~0 that the kernel lowers), back on
 * the host: -1 where none. Waits for the stream. */
#define FIRST_BAD(what, out, call)                                                     \
	do {                                                                           \
		hpu__cuops_slot s_;                                                    \
		unsigned long long h_ = 0;                                             \
		if (hpu__cuops_slot_begin(&s_, sizeof h_, 0xff, 0, what))              \
			return HPU_BE_UNSUPPORTED;                                     \
		unsigned long long *d = s_.d;                                          \
		cudaStream_t st = s_.st;                                               \
		if (hpu__cuops_slot_end(&s_, (call), &h_, what))                       \
			return HPU_BE_UNSUPPORTED;                                     \
		*(out) = h_ == ~0ull ? -1 : (long)h_;                                  \
	} while (0)

/* The same on the device (findings_dev, worker/ops/backend.h): `bad`
 * (a long in device memory: an hpu__check_slot's) set to all ones, -1,
 * on the stream, lowered by `call` as an unsigned long long (d), then
 * `finding` (given b_, the index as a long long) writes the bad value
 * beside it. No copy back, no wait: a recorded step holds it. */
_Static_assert(sizeof(long) == sizeof(unsigned long long), "a slot's bad is 64 bits");
#define FIRST_BAD_DEV(what, bad, call, finding)                                        \
	do {                                                                           \
		hpu__cuops_ctx *c_ = hpu__cuops_enter();                               \
		if (!c_)                                                               \
			return HPU_BE_UNSUPPORTED;                                     \
		cudaStream_t st = hpu__cuops_stream();                                 \
		unsigned long long *d = (unsigned long long *)(void *)(bad);           \
		const long long *b_ = (const long long *)(const void *)(bad);          \
		int rc_ = hpu__cuops_cuda(cudaMemsetAsync(d, 0xff, sizeof *d, st), what) || \
				  hpu__cuops_cuda((call), what) ||                     \
				  hpu__cuops_cuda((finding), what)                     \
			  ? HPU_BE_UNSUPPORTED                                         \
			  : HPU_BE_OK;                                                 \
		hpu__cuops_leave(c_);                                                  \
		return rc_;                                                            \
	} while (0)

int hpu__cuops_mse_fwd(const float *p, const float *t, float *loss, int rows, size_t n)
{
	CU_KERNEL("mean squared error", hpu__cukm_loss_fwd(0, p, t, loss, rows, n, NULL, st));
}

int hpu__cuops_mse_bwd(const float *p, const float *t, const float *dloss, float *dp, float *dt,
		       int rows, size_t n)
{
	CU_KERNEL("mean squared error backward",
		  hpu__cukm_loss_bwd(0, p, t, dloss, dp, dt, rows, n, st));
}

int hpu__cuops_bce_fwd(int logits, const float *x, const float *t, float *loss, int rows,
		       size_t n, long *bad, float *bad_value)
{
	if (!logits && hpu__cuda_on_device(bad))
		FIRST_BAD_DEV("binary cross-entropy", bad,
			      hpu__cukm_loss_fwd(2, x, t, loss, rows, n, d, st),
			      hpu__cukm_finding_f32(x, b_, bad_value, st));
	if (logits && hpu__cuda_on_device(bad)) /* nothing to find: -1 */
		CU_KERNEL("binary cross-entropy",
			  cudaMemsetAsync(bad, 0xff, sizeof *bad, st) == cudaSuccess
				  ? hpu__cukm_loss_fwd(1, x, t, loss, rows, n, NULL, st)
				  : cudaGetLastError());
	*bad = -1;
	if (logits)
		CU_KERNEL("binary cross-entropy",
			  hpu__cukm_loss_fwd(1, x, t, loss, rows, n, NULL, st));
	FIRST_BAD("binary cross-entropy", bad, hpu__cukm_loss_fwd(2, x, t, loss, rows, n, d, st));
	if (*bad >= 0)
		return hpu__cuops_fetch(bad_value, x + *bad, sizeof *bad_value,
					"binary cross-entropy");
	return HPU_BE_OK;
}

int hpu__cuops_bce_bwd(int logits, const float *x, const float *t, const float *dloss,
		       float *dx, float *dt, int rows, size_t n)
{
	CU_KERNEL("binary cross-entropy backward",
		  hpu__cukm_loss_bwd(logits ? 1 : 2, x, t, dloss, dx, dt, rows, n, st));
}

int hpu__cuops_ids_first_bad(const int32_t *ids, size_t n, int32_t limit, long *bad,
			     int32_t *bad_value)
{
	if (hpu__cuda_on_device(bad))
		FIRST_BAD_DEV("id check", bad, hpu__cukm_ids_first_bad(ids, n, limit, d, st),
			      hpu__cukm_finding_i32(ids, b_, bad_value, st));
	FIRST_BAD("id check", bad, hpu__cukm_ids_first_bad(ids, n, limit, d, st));
	if (*bad >= 0)
		return hpu__cuops_fetch(bad_value, ids + *bad, sizeof *bad_value, "id check");
	return HPU_BE_OK;
}

/* ---- causal attention ---- */

/* The attention kernels keep a score row in shared memory: t at most
 * HPU_CUOPS_ATTN_MAX_T (cuops_more.cu's attn_fits). */
#define HPU_CUOPS_ATTN_MAX_T 11264

static void attn_length(int t)
{
	if (t > HPU_CUOPS_ATTN_MAX_T)
		hpu__cuops_fatal("attention over %d positions: the CUDA attention kernels take at "
				 "most %d (a score row in a block's shared memory)",
				 t, HPU_CUOPS_ATTN_MAX_T);
}

int hpu__cuops_attention_fwd(const float *qkv, float *out, float *att, int batch, int t,
			     int heads, int hd)
{
	attn_length(t);
	CU_KERNEL("attention", hpu__cukm_attention_fwd(qkv, out, att, batch, t, heads, hd, st));
}

/* dS of every head in scratch: batch * heads * t * t floats. */
int hpu__cuops_attention_bwd(const float *qkv, const float *att, const float *dout,
			     float *dqkv, int batch, int t, int heads, int hd)
{
	if (batch <= 0 || t <= 0 || heads <= 0 || hd <= 0)
		return HPU_BE_OK;
	attn_length(t);
	hpu__cuops_ctx *c = hpu__cuops_enter();
	if (!c)
		return HPU_BE_UNSUPPORTED;
	float *ds = hpu__cuops_scratch(c, (size_t)batch * heads * t * t * sizeof(float));
	int rc = ds && !hpu__cuops_cuda(hpu__cukm_attention_bwd(qkv, att, dout, dqkv, ds, batch, t,
								heads, hd, hpu__cuops_stream()),
					"attention backward")
			 ? HPU_BE_OK
			 : HPU_BE_UNSUPPORTED;
	hpu__cuops_leave(c);
	return rc;
}

/* ---- fused attention (cuops_flash.cu) ---- */

int hpu__cuops_flash_fwd(const float *qkv, const int32_t *mask, float *ctx, float *lse,
			 int batch, int t, int heads, int hd, int causal)
{
	CU_KERNEL("fused attention",
		  hpu__cukm_flash_fwd(qkv, mask, ctx, lse, batch, t, heads, hd, causal, st));
}

/* The backward's kernels (tiles: cuops_flash16.cu's, else
 * cuops_flash.cu's), D of every query row in scratch: batch * heads * t
 * floats. The tiles' refusal (cudaErrorNotSupported) is said by nothing:
 * the ops then call flash_bwd. */
/* The tiles refused for this GPU's shared memory (cudaErrorNotSupported):
 * one warning a process, naming the call. */
static void tiles_refused(const char *which, int hd)
{
	static atomic_int said;
	if (atomic_exchange(&said, 1))
		return;
	fprintf(stderr,
		"hpu-worker: warning: fused attention's bf16 tiles (%s, head dim %d) need more "
		"shared memory a block than this GPU lets a kernel have: the fp32 kernel runs "
		"instead\n",
		which, hd);
}

static int flash_bwd_with(int tiles, const float *qkv, const int32_t *mask, const float *ctx,
			  const float *lse, const float *dctx, float *dqkv, int batch, int t,
			  int heads, int hd, int causal)
{
	size_t rows = hpu__cukm_flash_rows(batch, t, heads, hd);
	if (tiles && !hpu__cukm_flash16_ok(hd))
		return HPU_BE_UNSUPPORTED;
	if (!rows)
		return HPU_BE_OK;
	hpu__cuops_ctx *c = hpu__cuops_enter();
	if (!c)
		return HPU_BE_UNSUPPORTED;
	float *delta = hpu__cuops_scratch(c, rows * sizeof(float));
	cudaStream_t st = hpu__cuops_stream();
	cudaError_t e = !delta ? cudaErrorMemoryAllocation
			: tiles ? hpu__cukm_flash16_bwd(qkv, mask, ctx, lse, dctx, dqkv, delta,
							batch, t, heads, hd, causal, st)
				: hpu__cukm_flash_bwd(qkv, mask, ctx, lse, dctx, dqkv, delta, batch,
						      t, heads, hd, causal, st);
	if (tiles && e == cudaErrorNotSupported)
		tiles_refused("backward", hd);
	int rc = !delta || (tiles && e == cudaErrorNotSupported) ||
			 hpu__cuops_cuda(e, tiles ? "fused attention backward (bf16 tiles)"
						  : "fused attention backward")
		 ? HPU_BE_UNSUPPORTED
		 : HPU_BE_OK;
	hpu__cuops_leave(c);
	return rc;
}

int hpu__cuops_flash_bwd(const float *qkv, const int32_t *mask, const float *ctx,
			 const float *lse, const float *dctx, float *dqkv, int batch, int t,
			 int heads, int hd, int causal)
{
	return flash_bwd_with(0, qkv, mask, ctx, lse, dctx, dqkv, batch, t, heads, hd, causal);
}

/* ---- fused attention on tensor cores (cuops_flash16.cu) ----
 * HPU_BE_UNSUPPORTED, nothing run, where the tiles do not take hd (said
 * nowhere: the documented shapes) or this GPU's blocks cannot have their
 * shared memory (said once: the run is then slower than it should be):
 * the ops then call flash_fwd/flash_bwd. */

int hpu__cuops_flash16_fwd(const float *qkv, const int32_t *mask, float *ctx, float *lse,
			   int batch, int t, int heads, int hd, int causal)
{
	if (!hpu__cukm_flash16_ok(hd))
		return HPU_BE_UNSUPPORTED;
	hpu__cuops_ctx *c = hpu__cuops_enter();
	if (!c)
		return HPU_BE_UNSUPPORTED;
	cudaError_t e = hpu__cukm_flash16_fwd(qkv, mask, ctx, lse, batch, t, heads, hd, causal,
					      hpu__cuops_stream());
	if (e == cudaErrorNotSupported)
		tiles_refused("forward", hd);
	int rc = e == cudaErrorNotSupported || hpu__cuops_cuda(e, "fused attention (bf16 tiles)")
			 ? HPU_BE_UNSUPPORTED
			 : HPU_BE_OK;
	hpu__cuops_leave(c);
	return rc;
}

int hpu__cuops_flash16_bwd(const float *qkv, const int32_t *mask, const float *ctx,
			   const float *lse, const float *dctx, float *dqkv, int batch, int t,
			   int heads, int hd, int causal)
{
	return flash_bwd_with(1, qkv, mask, ctx, lse, dctx, dqkv, batch, t, heads, hd, causal);
}
