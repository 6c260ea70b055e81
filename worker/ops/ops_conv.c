/* hpu ops: 2-D convolution and pooling, NCHW fp32.
 *
 * The public ops (at the bottom) decide the autocast policy and run the
 * backend's kernels (backend.h: oneDNN's on CPUs); the kernels here are
 * the reference (ops_ref.h), which the ops fall back to when the backend
 * answers HPU_BE_UNSUPPORTED for a case.
 *
 * Reference convolution is im2col + one OpenBLAS sgemm per sample: the sample's input
 * x[C, H, W] is unfolded into col[C*K*K, OH*OW] (row (c, ki, kj), column
 * (oh, ow) holds x[c, oh*S - P + ki, ow*S - P + kj], zero outside the
 * image), so that y[O, OH*OW] = w[O, C*K*K] * col. The caller's scratch is
 * that col buffer (hpu_conv2d_scratch floats); backward reuses it for
 * dcol = w^T * dy, which col2im folds back into dx.
 *
 * Pooling is plain loops, one plane at a time: the loop along an output
 * row vectorizes, with the (short) window loops inside it unrolled (this
 * file is built -O3 -fno-math-errno). Pooling windows have no padding.
 */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cblas.h>

#include "worker/ops/autocast.h"
#include "worker/ops/backend.h"
#include "worker/ops/fp8.h"
#include "worker/ops/ops_ref.h"
#include "common/simd.h"

#include "hpu/ops.h"

/* ---- shapes ---- */

static void check_shape(const hpu_conv2d_shape *s)
{
	assert(s != NULL);
	assert(s->batch >= 0 && s->in_ch > 0 && s->out_ch > 0);
	assert(s->height > 0 && s->width > 0);
	assert(s->kernel > 0 && s->stride > 0 && s->pad >= 0);
	assert(s->height + 2 * s->pad >= s->kernel);
	assert(s->width + 2 * s->pad >= s->kernel);
	(void)s;
}

int hpu_conv2d_out_h(const hpu_conv2d_shape *s)
{
	check_shape(s);
	return (s->height + 2 * s->pad - s->kernel) / s->stride + 1;
}

int hpu_conv2d_out_w(const hpu_conv2d_shape *s)
{
	check_shape(s);
	return (s->width + 2 * s->pad - s->kernel) / s->stride + 1;
}

/* col[C*K*K, OH*OW] of one sample */
size_t hpu_conv2d_scratch(const hpu_conv2d_shape *s)
{
	size_t ckk = (size_t)s->in_ch * s->kernel * s->kernel;
	return ckk * (size_t)hpu_conv2d_out_h(s) * (size_t)hpu_conv2d_out_w(s);
}

/* A 1x1 kernel with stride 1 and no padding needs no unfolding: col is x. */
static int is_pointwise(const hpu_conv2d_shape *s)
{
	return s->kernel == 1 && s->stride == 1 && s->pad == 0;
}

/* The output columns ow whose input column ow*S - P + kj lies inside
 * [0, W): lo <= ow < hi (lo == hi when there are none). */
static void valid_cols(const hpu_conv2d_shape *s, int kj, int ow_n, int *lo, int *hi)
{
	int off = s->pad - kj; /* iw = ow*S - off */
	int l = off > 0 ? (off + s->stride - 1) / s->stride : 0;
	int last = s->width - 1 + off; /* iw <= W-1  <=>  ow*S <= last */
	int h = last >= 0 ? last / s->stride + 1 : 0;
	if (h > ow_n)
		h = ow_n;
	if (l > h)
		l = h;
	*lo = l;
	*hi = h;
}

/* ---- im2col / col2im, one sample ---- */

/* Row (c, ki, kj) of col[C*K*K, OH*OW], from channel xc[H, W] of x:
 * r[oh, ow] = xc[oh*S - P + ki, ow*S - P + kj], 0 outside the image. */
static void im2col_row(const hpu_conv2d_shape *s, int oh_n, int ow_n, int ki,
		       int kj, const float *restrict xc, float *restrict r)
{
	const int S = s->stride, iw0 = kj - s->pad;
	int lo, hi;
	valid_cols(s, kj, ow_n, &lo, &hi);
	for (int oh = 0; oh < oh_n; oh++, r += ow_n) {
		int ih = oh * S - s->pad + ki;
		if (ih < 0 || ih >= s->height) {
			memset(r, 0, (size_t)ow_n * sizeof *r);
			continue;
		}
		const float *xr = xc + (size_t)ih * s->width;
		for (int ow = 0; ow < lo; ow++)
			r[ow] = 0.0f;
		if (S == 1) /* contiguous: a plain copy */
			for (int ow = lo; ow < hi; ow++)
				r[ow] = xr[ow + iw0];
		else
			for (int ow = lo; ow < hi; ow++)
				r[ow] = xr[ow * S + iw0];
		for (int ow = hi; ow < ow_n; ow++)
			r[ow] = 0.0f;
	}
}

/* col[C*K*K, OH*OW] = unfold(x[C, H, W]) */
static void im2col(const hpu_conv2d_shape *s, int oh_n, int ow_n,
		   const float *restrict x, float *restrict col)
{
	const int K = s->kernel, rows = s->in_ch * K * K;
	const size_t plane = (size_t)s->height * s->width;
	for (int row = 0; row < rows; row++) {
		int c = row / (K * K), ki = row / K % K, kj = row % K;
		im2col_row(s, oh_n, ow_n, ki, kj, x + c * plane,
			   col + (size_t)row * oh_n * ow_n);
	}
}

/* The reverse of im2col_row: dxc[oh*S - P + ki, ow*S - P + kj] += r[oh, ow]
 * for the positions inside the image. */
static void col2im_row(const hpu_conv2d_shape *s, int oh_n, int ow_n, int ki,
		       int kj, const float *restrict r, float *restrict dxc)
{
	const int S = s->stride, iw0 = kj - s->pad;
	int lo, hi;
	valid_cols(s, kj, ow_n, &lo, &hi);
	for (int oh = 0; oh < oh_n; oh++, r += ow_n) {
		int ih = oh * S - s->pad + ki;
		if (ih < 0 || ih >= s->height)
			continue;
		float *xr = dxc + (size_t)ih * s->width;
		if (S == 1)
			for (int ow = lo; ow < hi; ow++)
				xr[ow + iw0] += r[ow];
		else
			for (int ow = lo; ow < hi; ow++)
				xr[ow * S + iw0] += r[ow];
	}
}

/* dx[C, H, W] = fold(dcol[C*K*K, OH*OW]): zeroed, then every column entry
 * added to the input pixel it came from (windows overlap when S < K). */
static void col2im(const hpu_conv2d_shape *s, int oh_n, int ow_n,
		   const float *restrict dcol, float *restrict dx)
{
	const int K = s->kernel, rows = s->in_ch * K * K;
	const size_t plane = (size_t)s->height * s->width;
	memset(dx, 0, (size_t)s->in_ch * plane * sizeof *dx);
	for (int row = 0; row < rows; row++) {
		int c = row / (K * K), ki = row / K % K, kj = row % K;
		col2im_row(s, oh_n, ow_n, ki, kj, dcol + (size_t)row * oh_n * ow_n,
			   dx + c * plane);
	}
}

/* ---- convolution ---- */

/* y[B, O, OH, OW] = conv(x[B, C, H, W], w[O, C, K, K]) + b[O]
 * per sample: y_n[O, OH*OW] = w[O, C*K*K] * col[C*K*K, OH*OW] (+ b) */
void hpu__ref_conv2d_forward(const hpu_conv2d_shape *s, const float *x, const float *w,
			     const float *b, float *y, float *scratch)
{
	check_shape(s);
	assert(x != NULL && w != NULL && y != NULL);
	const int oh_n = hpu_conv2d_out_h(s), ow_n = hpu_conv2d_out_w(s);
	const int O = s->out_ch, ckk = s->in_ch * s->kernel * s->kernel;
	const int npix = oh_n * ow_n;
	const size_t xs = (size_t)s->in_ch * s->height * s->width;
	const size_t ys = (size_t)O * npix;
	const int pointwise = is_pointwise(s);
	assert(pointwise || scratch != NULL);
	for (int n = 0; n < s->batch; n++) {
		const float *xn = x + n * xs;
		float *yn = y + n * ys;
		const float *col = xn;
		if (!pointwise) {
			im2col(s, oh_n, ow_n, xn, scratch);
			col = scratch;
		}
		float beta = 0.0f;
		if (b != NULL) {
			for (int o = 0; o < O; o++)
				for (int p = 0; p < npix; p++)
					yn[(size_t)o * npix + p] = b[o];
			beta = 1.0f;
		}
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, O, npix, ckk,
			    1.0f, w, ckk, col, npix, beta, yn, npix);
	}
}

/* Given dy[B, O, OH, OW], per sample:
 *   dw[O, C*K*K] += dy_n[O, OH*OW] * col[C*K*K, OH*OW]^T (dw may be NULL:
 *                   then neither dw nor db; x is then unused)
 *   db[O] += sum over pixels of dy_n (db may be NULL)
 *   dx_n[C, H, W] = col2im(w[O, C*K*K]^T * dy_n) (dx may be NULL) */
static void conv2d_backward(const hpu_conv2d_shape *s, const float *x, const float *w,
			    const float *dy, float *dx, float *dw, float *db,
			    float *scratch)
{
	check_shape(s);
	assert(dy != NULL && (dw == NULL || x != NULL) && (dx == NULL || w != NULL));
	if (dw == NULL && dx == NULL)
		return;
	const int oh_n = hpu_conv2d_out_h(s), ow_n = hpu_conv2d_out_w(s);
	const int O = s->out_ch, ckk = s->in_ch * s->kernel * s->kernel;
	const int npix = oh_n * ow_n;
	const size_t xs = (size_t)s->in_ch * s->height * s->width;
	const size_t ys = (size_t)O * npix;
	const int pointwise = is_pointwise(s);
	assert(pointwise || scratch != NULL);
	for (int n = 0; n < s->batch; n++) {
		const float *dyn = dy + n * ys;
		if (dw != NULL) {
			const float *col = x + n * xs;
			if (!pointwise) {
				im2col(s, oh_n, ow_n, col, scratch);
				col = scratch;
			}
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, O, ckk, npix,
				    1.0f, dyn, npix, col, npix, 1.0f, dw, ckk);
		}
		if (dw != NULL && db != NULL)
			for (int o = 0; o < O; o++) {
				const float *d = dyn + (size_t)o * npix;
				float sum = 0.0f;
				for (int p = 0; p < npix; p++)
					sum += d[p];
				db[o] += sum;
			}
		if (dx == NULL)
			continue;
		/* dcol[C*K*K, OH*OW] = w^T * dy_n, straight into dx when 1x1 */
		float *dcol = pointwise ? dx + n * xs : scratch;
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, npix, O,
			    1.0f, w, ckk, dyn, npix, 0.0f, dcol, npix);
		if (!pointwise)
			col2im(s, oh_n, ow_n, dcol, dx + n * xs);
	}
}

void hpu__ref_conv2d_backward(const hpu_conv2d_shape *s, const float *x, const float *w,
			      const float *dy, float *dx, float *dw, float *db,
			      float *scratch)
{
	assert(x != NULL && w != NULL && dw != NULL);
	conv2d_backward(s, x, w, dy, dx, dw, db, scratch);
}

/* ---- pooling ---- */

static int pool_out(int size, int k, int stride)
{
	assert(k > 0 && stride > 0 && size >= k);
	return (size - k) / stride + 1;
}

/* Max pooling of one plane x[h, w] into y[oh_n, ow_n], idx[oh_n, ow_n].
 * Each window is read in row-major order and only a strictly larger value
 * replaces the best, so ties go to the first maximum. The selects have no
 * branches, so the loop over ow vectorizes (the window loops unroll). */
static inline __attribute__((always_inline)) void
maxpool_plane(const float *restrict x, float *restrict y, int32_t *restrict idx,
	      int w, int oh_n, int ow_n, int k, int stride)
{
	for (int oh = 0; oh < oh_n; oh++) {
		float *yr = y + (size_t)oh * ow_n;
		int32_t *ir = idx + (size_t)oh * ow_n;
		for (int ow = 0; ow < ow_n; ow++) {
			int32_t at = oh * stride * w + ow * stride;
			float best = x[at];
			for (int ki = 0; ki < k; ki++)
				for (int kj = 0; kj < k; kj++) {
					int32_t pos = (oh * stride + ki) * w + ow * stride + kj;
					float v = x[pos];
					int more = v > best;
					best = more ? v : best;
					at = more ? pos : at;
				}
			yr[ow] = best;
			ir[ow] = at;
		}
	}
}

/* The window loops only unroll, and the row loop only vectorizes, when k
 * and stride are constants: the CNNs' 2x2 windows get their own copy. */
HPU_CLONES static void maxpool_plane_2x2(const float *restrict x, float *restrict y,
					 int32_t *restrict idx, int w, int oh_n, int ow_n)
{
	maxpool_plane(x, y, idx, w, oh_n, ow_n, 2, 2);
}

static void maxpool_plane_any(const float *restrict x, float *restrict y,
			      int32_t *restrict idx, int w, int oh_n, int ow_n, int k,
			      int stride)
{
	maxpool_plane(x, y, idx, w, oh_n, ow_n, k, stride);
}

/* y[B, C, OH, OW] = max over each k x k window of x[B, C, H, W];
 * idx[B, C, OH, OW] = the arg-max's position ih*W + iw in its plane. */
void hpu__ref_maxpool2d_forward(const float *x, float *y, int32_t *idx, int batch,
			      int ch, int h, int w, int k, int stride)
{
	assert(x != NULL && y != NULL && idx != NULL && batch >= 0 && ch >= 0);
	const int oh_n = pool_out(h, k, stride), ow_n = pool_out(w, k, stride);
	const size_t planes = (size_t)batch * ch, out = (size_t)oh_n * ow_n;
	for (size_t p = 0; p < planes; p++) {
		const float *xp = x + p * h * w;
		if (k == 2 && stride == 2)
			maxpool_plane_2x2(xp, y + p * out, idx + p * out, w, oh_n, ow_n);
		else
			maxpool_plane_any(xp, y + p * out, idx + p * out, w, oh_n, ow_n, k,
					  stride);
	}
}

/* dx[B, C, H, W] = 0, then dx[idx] += dy for every output of dy[B, C, OH, OW]
 * (overlapping windows can send several outputs to one input). */
void hpu__ref_maxpool2d_backward(const float *dy, const int32_t *idx, float *dx,
			       int batch, int ch, int h, int w, int k, int stride)
{
	assert(dy != NULL && idx != NULL && dx != NULL && batch >= 0 && ch >= 0);
	const int oh_n = pool_out(h, k, stride), ow_n = pool_out(w, k, stride);
	const size_t planes = (size_t)batch * ch, hw = (size_t)h * w;
	const size_t out = (size_t)oh_n * ow_n;
	memset(dx, 0, planes * hw * sizeof *dx);
	for (size_t p = 0; p < planes; p++) {
		float *dxp = dx + p * hw;
		const float *dyp = dy + p * out;
		const int32_t *ip = idx + p * out;
		for (size_t o = 0; o < out; o++) {
			assert(ip[o] >= 0 && (size_t)ip[o] < hw);
			dxp[ip[o]] += dyp[o];
		}
	}
}

/* Average pooling of one plane x[h, w] into y[oh_n, ow_n] (the window
 * summed in row-major order, then divided by k*k). */
static inline __attribute__((always_inline)) void
avgpool_plane(const float *restrict x, float *restrict y, int w, int oh_n, int ow_n,
	      int k, int stride)
{
	const float area = (float)(k * k);
	for (int oh = 0; oh < oh_n; oh++) {
		float *yr = y + (size_t)oh * ow_n;
		for (int ow = 0; ow < ow_n; ow++) {
			float sum = 0.0f;
			for (int ki = 0; ki < k; ki++)
				for (int kj = 0; kj < k; kj++)
					sum += x[(oh * stride + ki) * w + ow * stride + kj];
			yr[ow] = sum / area;
		}
	}
}

HPU_CLONES static void avgpool_plane_2x2(const float *restrict x, float *restrict y,
					 int w, int oh_n, int ow_n)
{
	avgpool_plane(x, y, w, oh_n, ow_n, 2, 2);
}

static void avgpool_plane_any(const float *restrict x, float *restrict y, int w,
			      int oh_n, int ow_n, int k, int stride)
{
	avgpool_plane(x, y, w, oh_n, ow_n, k, stride);
}

/* y[B, C, OH, OW] = mean over each k x k window of x[B, C, H, W] */
void hpu__ref_avgpool2d_forward(const float *x, float *y, int batch, int ch, int h,
			      int w, int k, int stride)
{
	assert(x != NULL && y != NULL && batch >= 0 && ch >= 0);
	const int oh_n = pool_out(h, k, stride), ow_n = pool_out(w, k, stride);
	const size_t planes = (size_t)batch * ch, out = (size_t)oh_n * ow_n;
	for (size_t p = 0; p < planes; p++) {
		const float *xp = x + p * h * w;
		if (k == 2 && stride == 2)
			avgpool_plane_2x2(xp, y + p * out, w, oh_n, ow_n);
		else
			avgpool_plane_any(xp, y + p * out, w, oh_n, ow_n, k, stride);
	}
}

/* dx[B, C, H, W] = 0, then every input of each window += dy / (k*k) */
void hpu__ref_avgpool2d_backward(const float *dy, float *dx, int batch, int ch, int h,
			       int w, int k, int stride)
{
	assert(dy != NULL && dx != NULL && batch >= 0 && ch >= 0);
	const int oh_n = pool_out(h, k, stride), ow_n = pool_out(w, k, stride);
	const size_t planes = (size_t)batch * ch, hw = (size_t)h * w;
	const float area = (float)(k * k);
	memset(dx, 0, planes * hw * sizeof *dx);
	for (size_t p = 0; p < planes; p++) {
		float *dxp = dx + p * hw;
		const float *dyp = dy + p * oh_n * ow_n;
		for (int oh = 0; oh < oh_n; oh++) {
			const float *dyr = dyp + (size_t)oh * ow_n;
			for (int ki = 0; ki < k; ki++) {
				float *xr = dxp + (size_t)(oh * stride + ki) * w;
				for (int kj = 0; kj < k; kj++)
					for (int ow = 0; ow < ow_n; ow++)
						xr[ow * stride + kj] += dyr[ow] / area;
			}
		}
	}
}

/* ---- the public ops: the autocast policy around the backend ---- */

static size_t conv_x_n(const hpu_conv2d_shape *s)
{
	return (size_t)s->batch * s->in_ch * s->height * s->width;
}

static size_t conv_w_n(const hpu_conv2d_shape *s)
{
	return (size_t)s->out_ch * s->in_ch * s->kernel * s->kernel;
}

static size_t conv_y_n(const hpu_conv2d_shape *s)
{
	return (size_t)s->batch * s->out_ch * hpu_conv2d_out_h(s) * hpu_conv2d_out_w(s);
}

/* Whether a call lowered to lp runs on bf16 products (the backend's bf16
 * kernels): bf16 autocast and fp8 (whose read-back values are exact in
 * bf16), on a backend with native bf16. fp16, and bf16 without native
 * products, round the inputs and run fp32 kernels. */
static int bf16_products(int lp)
{
	return (lp == HPU_AUTOCAST_BF16 || lp == HPU_AUTOCAST_FP8) && hpu__be()->bf16_native();
}

/* y = conv(x, w) + b in fp32 on the backend, else the reference. */
static void conv_fwd_f32(const hpu_conv2d_shape *s, const float *x, const float *w,
			 const float *b, float *y, float *scratch)
{
	if (hpu__be()->conv_fwd(s, HPU_DT_F32, x, w, b, y) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_conv2d_forward", "conv_fwd fp32, %d x %d x %dx%d, kernel %d",
			     s->batch, s->in_ch, s->height, s->width, s->kernel))
		hpu__ref_conv2d_forward(s, x, w, b, y, scratch);
}

/* Lowered: x and w rounded (bf16 products: converted to bf16), b rounded,
 * y rounded. fp8 (QUANTIZE): x and w are the E4M3 read-backs, exact in
 * bf16. */
void hpu_conv2d_forward(const hpu_conv2d_shape *s, const float *x, const float *w,
			const float *b, float *y, float *scratch)
{
	int lp = hpu__ac_enter(HPU_OP_CONV2D);
	check_shape(s);
	assert(x != NULL && w != NULL && y != NULL);
	/* the runtime's 16-bit parameters: fp32 values unless a bf16 product
	 * reads the weight's 16-bit copy (hpu__ac_weight_bf16) */
	if (lp != HPU_AUTOCAST_BF16)
		hpu__ac_param_f32(w, conv_w_n(s));
	hpu__ac_param_f32(b, b ? (size_t)s->out_ch : 0);
	hpu__fp8_call c;
	lp = hpu__fp8_begin(&c, HPU_OP_CONV2D, lp, x, conv_x_n(s), w, conv_w_n(s));
	const size_t nx = conv_x_n(s), nw = conv_w_n(s);
	if (!lp) {
		conv_fwd_f32(s, x, w, b, y, scratch);
		hpu__fp8_end(&c, y, conv_y_n(s));
		return;
	}
	/* float slots 0 and 1 hold fp8's read-backs; the bias takes slot 2 */
	const float *bl = hpu__ac_round(2, b, (size_t)s->out_ch, lp);
	const float *xl = c.on ? c.a : x, *wl = c.on ? c.b : w;
	int done = 0;
	if (bf16_products(lp)) {
		const uint16_t *x16 = hpu__ac_bf16(0, xl, nx);
		const uint16_t *w16 = c.on ? hpu__ac_bf16(1, wl, nw) : hpu__ac_weight_bf16(1, w, nw);
		done = hpu__be()->conv_fwd(s, HPU_DT_BF16, x16, w16, bl, y) == HPU_BE_OK;
	}
	if (!done) {
		if (!c.on) { /* fp8's read-backs are already rounded */
			xl = hpu__ac_round(0, x, nx, lp);
			wl = hpu__ac_weight_round(1, w, nw, lp);
		}
		conv_fwd_f32(s, xl, wl, bl, y, scratch);
	}
	hpu__ac_round_inplace(y, conv_y_n(s), lp);
	if (!c.on)
		hpu__fp8_end(&c, y, conv_y_n(s));
}

/* The backend's backward convolutions that are not done yet (*weights_done,
 * *data_done), in one call where the table has conv_bwd and both are due
 * (it shares dy's layout change between them), else one by one. */
static void conv_bwd_be(const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
			const void *w, const void *dy, float *dx, float *dw, float *db,
			int *weights_done, int *data_done)
{
	const hpu__backend *be = hpu__be();
	if (!*weights_done && !*data_done && be->conv_bwd) {
		int wd = 0;
		*data_done = be->conv_bwd(s, dt, x, w, dy, dx, dw, db, &wd) == HPU_BE_OK;
		*weights_done = wd;
	}
	if (!*weights_done)
		*weights_done = be->conv_bwd_weights(s, dt, x, dy, dw, db) == HPU_BE_OK;
	if (!*data_done)
		*data_done = be->conv_bwd_data(s, dt, w, dy, dx) == HPU_BE_OK;
}

/* Lowered: x, w and dy rounded (bf16 products: converted to bf16); dw, db
 * accumulated in fp32; dx rounded. dx and db may be NULL. */
void hpu_conv2d_backward(const hpu_conv2d_shape *s, const float *x, const float *w,
			 const float *dy, float *dx, float *dw, float *db,
			 float *scratch)
{
	int lp = hpu__ac_enter(HPU_OP_CONV2D);
	if (lp == HPU_AUTOCAST_FP8) { /* fp8 inference quantizes forwards only */
		hpu__ac_recount(HPU_OP_CONV2D, lp, hpu__ac_fallback(HPU_OP_CONV2D));
		lp = hpu__ac_fallback(HPU_OP_CONV2D);
	}
	check_shape(s);
	assert(x != NULL && w != NULL && dy != NULL && dw != NULL);
	const size_t nx = conv_x_n(s), nw = conv_w_n(s), ny = conv_y_n(s);
	/* gradients owed zeros (hpu__ac_fresh_claim): zeroed, then accumulated */
	if (hpu__ac_fresh_claim(dw, nw))
		hpu__ac_zero(dw, nw * sizeof *dw);
	if (hpu__ac_fresh_claim(db, (size_t)s->out_ch))
		hpu__ac_zero(db, (size_t)s->out_ch * sizeof *db);
	if (lp != HPU_AUTOCAST_BF16 && dx != NULL)
		hpu__ac_param_f32(w, nw);
	int data_done = dx == NULL, weights_done = 0;
	if (bf16_products(lp)) {
		const uint16_t *x16 = hpu__ac_bf16(0, x, nx);
		const uint16_t *w16 = dx ? hpu__ac_weight_bf16(1, w, nw) : NULL;
		const uint16_t *dy16 = hpu__ac_bf16(2, dy, ny);
		conv_bwd_be(s, HPU_DT_BF16, x16, w16, dy16, dx, dw, db, &weights_done,
			    &data_done);
	}
	if (!weights_done || !data_done) {
		const float *xl = x, *wl = w, *dyl = dy;
		if (lp) {
			xl = weights_done ? NULL : hpu__ac_round(0, x, nx, lp);
			wl = data_done ? NULL : hpu__ac_weight_round(1, w, nw, lp);
			dyl = hpu__ac_round(2, dy, ny, lp);
		}
		conv_bwd_be(s, HPU_DT_F32, xl, wl, dyl, dx, dw, db, &weights_done, &data_done);
		if ((!weights_done || !data_done) &&
		    !hpu__be_refused("hpu_conv2d_backward", "%s fp32, %d x %d x %dx%d, kernel %d",
				     weights_done ? "conv_bwd_data" : "conv_bwd_weights", s->batch,
				     s->in_ch, s->height, s->width, s->kernel))
			conv2d_backward(s, xl, wl, dyl, data_done ? NULL : dx,
					weights_done ? NULL : dw, weights_done ? NULL : db,
					scratch);
	}
	if (lp && dx != NULL)
		hpu__ac_round_inplace(dx, nx, lp);
}

/* Pooling on the backend, else the reference. The backend's max pooling
 * keeps idx as the reference does (the arg-max's position in its plane,
 * ops.h), so that a forward on one and a backward on the other agree.
 * Lowered pooling: the input rounded (the max of rounded values needs no
 * rounding; the mean is rounded). Backward: dy rounded, dx rounded. */
static void maxpool_fwd(const float *x, float *y, int32_t *idx, int batch, int ch, int h,
			int w, int k, int stride)
{
	if (hpu__be()->maxpool_fwd(x, y, idx, batch, ch, h, w, k, stride) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_maxpool2d_forward", "maxpool_fwd, %d x %d x %dx%d", batch, ch, h, w))
		hpu__ref_maxpool2d_forward(x, y, idx, batch, ch, h, w, k, stride);
}

static void maxpool_bwd(const float *dy, const int32_t *idx, float *dx, int batch, int ch,
			int h, int w, int k, int stride)
{
	if (hpu__be()->maxpool_bwd(dy, idx, dx, batch, ch, h, w, k, stride) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_maxpool2d_backward", "maxpool_bwd, %d x %d x %dx%d", batch, ch, h, w))
		hpu__ref_maxpool2d_backward(dy, idx, dx, batch, ch, h, w, k, stride);
}

static void avgpool_fwd(const float *x, float *y, int batch, int ch, int h, int w, int k,
			int stride)
{
	if (hpu__be()->avgpool_fwd(x, y, batch, ch, h, w, k, stride) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_avgpool2d_forward", "avgpool_fwd, %d x %d x %dx%d", batch, ch, h, w))
		hpu__ref_avgpool2d_forward(x, y, batch, ch, h, w, k, stride);
}

static void avgpool_bwd(const float *dy, float *dx, int batch, int ch, int h, int w, int k,
			int stride)
{
	if (hpu__be()->avgpool_bwd(dy, dx, batch, ch, h, w, k, stride) != HPU_BE_OK &&
	    !hpu__be_refused("hpu_avgpool2d_backward", "avgpool_bwd, %d x %d x %dx%d", batch, ch, h, w))
		hpu__ref_avgpool2d_backward(dy, dx, batch, ch, h, w, k, stride);
}

void hpu_maxpool2d_forward(const float *x, float *y, int32_t *idx, int batch,
			   int ch, int h, int w, int k, int stride)
{
	int lp = hpu__ac_enter(HPU_OP_MAXPOOL2D);
	size_t n = (size_t)batch * ch * h * w;
	maxpool_fwd(lp && batch > 0 ? hpu__ac_round(0, x, n, lp) : x, y, idx, batch, ch, h, w,
		    k, stride);
}

void hpu_maxpool2d_backward(const float *dy, const int32_t *idx, float *dx,
			    int batch, int ch, int h, int w, int k, int stride)
{
	int lp = hpu__ac_enter(HPU_OP_MAXPOOL2D);
	if (!lp || batch <= 0) {
		maxpool_bwd(dy, idx, dx, batch, ch, h, w, k, stride);
		return;
	}
	size_t ny = (size_t)batch * ch * pool_out(h, k, stride) * pool_out(w, k, stride);
	maxpool_bwd(hpu__ac_round(0, dy, ny, lp), idx, dx, batch, ch, h, w, k, stride);
	hpu__ac_round_inplace(dx, (size_t)batch * ch * h * w, lp);
}

void hpu_avgpool2d_forward(const float *x, float *y, int batch, int ch, int h,
			   int w, int k, int stride)
{
	int lp = hpu__ac_enter(HPU_OP_AVGPOOL2D);
	if (!lp || batch <= 0) {
		avgpool_fwd(x, y, batch, ch, h, w, k, stride);
		return;
	}
	avgpool_fwd(hpu__ac_round(0, x, (size_t)batch * ch * h * w, lp), y, batch, ch, h, w,
		    k, stride);
	hpu__ac_round_inplace(y, (size_t)batch * ch * pool_out(h, k, stride) *
				     pool_out(w, k, stride),
			      lp);
}

void hpu_avgpool2d_backward(const float *dy, float *dx, int batch, int ch, int h,
			    int w, int k, int stride)
{
	int lp = hpu__ac_enter(HPU_OP_AVGPOOL2D);
	if (!lp || batch <= 0) {
		avgpool_bwd(dy, dx, batch, ch, h, w, k, stride);
		return;
	}
	size_t ny = (size_t)batch * ch * pool_out(h, k, stride) * pool_out(w, k, stride);
	avgpool_bwd(hpu__ac_round(0, dy, ny, lp), dx, batch, ch, h, w, k, stride);
	hpu__ac_round_inplace(dx, (size_t)batch * ch * h * w, lp);
}
