/* hpu ops: 2-D convolution with a rectangular kernel and per-axis stride
 * and padding, NCHW fp32 (include/hpu/ops.h); a 1-D convolution is its
 * height-1 case. im2col + one OpenBLAS sgemm per sample, as the square
 * reference kernel of ops_conv.c: col[C*KH*KW, OH*OW], row (c, ki, kj),
 * column (oh, ow) holds x[c, oh*SH - PH + ki, ow*SW - PW + kj] (0 outside
 * the image), y[O, OH*OW] = w[O, C*KH*KW] * col. The op runs the kernel
 * table's entry (backend.h), else on the CPU's tables the loops here
 * (hpu__be_host's). */
#include <assert.h>
#include <stddef.h>
#include <string.h>

#include <cblas.h>

#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"

#include "hpu/hpu.h"
#include "hpu/ops.h"

static void check_shape(const hpu_conv2d_rect_shape *s)
{
	assert(s != NULL && s->batch >= 0 && s->in_ch > 0 && s->out_ch > 0);
	assert(s->height > 0 && s->width > 0 && s->kernel_h > 0 && s->kernel_w > 0);
	assert(s->stride_h > 0 && s->stride_w > 0 && s->pad_h >= 0 && s->pad_w >= 0);
	assert(s->height + 2 * s->pad_h >= s->kernel_h && s->width + 2 * s->pad_w >= s->kernel_w);
	(void)s;
}

int hpu_conv2d_rect_out_h(const hpu_conv2d_rect_shape *s)
{
	check_shape(s);
	return (s->height + 2 * s->pad_h - s->kernel_h) / s->stride_h + 1;
}

int hpu_conv2d_rect_out_w(const hpu_conv2d_rect_shape *s)
{
	check_shape(s);
	return (s->width + 2 * s->pad_w - s->kernel_w) / s->stride_w + 1;
}

size_t hpu_conv2d_rect_scratch(const hpu_conv2d_rect_shape *s)
{
	return (size_t)s->in_ch * (size_t)s->kernel_h * (size_t)s->kernel_w *
	       (size_t)hpu_conv2d_rect_out_h(s) * (size_t)hpu_conv2d_rect_out_w(s);
}

/* The input position of output (oh, ow) under kernel offset (ki, kj), or
 * -1 when it falls in the padding. */
static ptrdiff_t src_at(const hpu_conv2d_rect_shape *s, int oh, int ow, int ki, int kj)
{
	int ih = oh * s->stride_h - s->pad_h + ki, iw = ow * s->stride_w - s->pad_w + kj;
	if (ih < 0 || ih >= s->height || iw < 0 || iw >= s->width)
		return -1;
	return (ptrdiff_t)ih * s->width + iw;
}

/* col = unfold(x[C, H, W]) of one sample */
static void im2col(const hpu_conv2d_rect_shape *s, int oh_n, int ow_n, const float *x,
		   float *col)
{
	const size_t plane = (size_t)s->height * s->width;
	const int kk = s->kernel_h * s->kernel_w, rows = s->in_ch * kk;
	for (int row = 0; row < rows; row++) {
		int c = row / kk, ki = row % kk / s->kernel_w, kj = row % s->kernel_w;
		float *r = col + (size_t)row * oh_n * ow_n;
		for (int oh = 0; oh < oh_n; oh++)
			for (int ow = 0; ow < ow_n; ow++) {
				ptrdiff_t at = src_at(s, oh, ow, ki, kj);
				r[oh * ow_n + ow] = at < 0 ? 0.0f : x[c * plane + (size_t)at];
			}
	}
}

/* dx[C, H, W] = fold(dcol): zeroed, then each entry added where it came from */
static void col2im(const hpu_conv2d_rect_shape *s, int oh_n, int ow_n, const float *dcol,
		   float *dx)
{
	const size_t plane = (size_t)s->height * s->width;
	const int kk = s->kernel_h * s->kernel_w, rows = s->in_ch * kk;
	memset(dx, 0, (size_t)s->in_ch * plane * sizeof *dx);
	for (int row = 0; row < rows; row++) {
		int c = row / kk, ki = row % kk / s->kernel_w, kj = row % s->kernel_w;
		const float *r = dcol + (size_t)row * oh_n * ow_n;
		for (int oh = 0; oh < oh_n; oh++)
			for (int ow = 0; ow < ow_n; ow++) {
				ptrdiff_t at = src_at(s, oh, ow, ki, kj);
				if (at >= 0)
					dx[c * plane + (size_t)at] += r[oh * ow_n + ow];
			}
	}
}

int hpu__host_conv_rect_fwd(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			    const float *b, float *y, float *scratch)
{
	const int oh_n = hpu_conv2d_rect_out_h(s), ow_n = hpu_conv2d_rect_out_w(s);
	const int O = s->out_ch, ckk = s->in_ch * s->kernel_h * s->kernel_w, npix = oh_n * ow_n;
	const size_t xs = (size_t)s->in_ch * s->height * s->width, ys = (size_t)O * npix;
	for (int n = 0; n < s->batch; n++) {
		float *yn = y + n * ys;
		im2col(s, oh_n, ow_n, x + n * xs, scratch);
		for (int o = 0; o < O; o++)
			for (int p = 0; p < npix; p++)
				yn[(size_t)o * npix + p] = b ? b[o] : 0.0f;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, O, npix, ckk, 1.0f, w, ckk,
			    scratch, npix, 1.0f, yn, npix);
	}
	return HPU_BE_OK;
}

int hpu__host_conv_rect_bwd(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			    const float *dy, float *dx, float *dw, float *db, float *scratch)
{
	const int oh_n = hpu_conv2d_rect_out_h(s), ow_n = hpu_conv2d_rect_out_w(s);
	const int O = s->out_ch, ckk = s->in_ch * s->kernel_h * s->kernel_w, npix = oh_n * ow_n;
	const size_t xs = (size_t)s->in_ch * s->height * s->width, ys = (size_t)O * npix;
	for (int n = 0; n < s->batch; n++) {
		const float *dyn = dy + n * ys;
		if (dw) {
			im2col(s, oh_n, ow_n, x + n * xs, scratch);
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, O, ckk, npix, 1.0f,
				    dyn, npix, scratch, npix, 1.0f, dw, ckk);
		}
		if (db)
			for (int o = 0; o < O; o++) {
				float sum = 0.0f;
				for (int p = 0; p < npix; p++)
					sum += dyn[(size_t)o * npix + p];
				db[o] += sum;
			}
		if (!dx)
			continue;
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, npix, O, 1.0f, w, ckk,
			    dyn, npix, 0.0f, scratch, npix);
		col2im(s, oh_n, ow_n, scratch, dx + n * xs);
	}
	return HPU_BE_OK;
}

int hpu_conv2d_rect_forward(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			    const float *b, float *y, float *scratch)
{
	check_shape(s);
	assert(x != NULL && w != NULL && y != NULL && scratch != NULL);
	return HPU__BE_RUN(conv_rect_fwd, hpu__host_conv_rect_fwd, s, x, w, b, y, scratch) ==
			       HPU_BE_OK
		       ? HPU_OK
		       : HPU_ERROR;
}

int hpu_conv2d_rect_backward(const hpu_conv2d_rect_shape *s, const float *x, const float *w,
			     const float *dy, float *dx, float *dw, float *db, float *scratch)
{
	check_shape(s);
	assert(dy != NULL && scratch != NULL && (dw == NULL || x != NULL));
	assert(dx == NULL || w != NULL);
	return HPU__BE_RUN(conv_rect_bwd, hpu__host_conv_rect_bwd, s, x, w, dy, dx, dw, db,
			   scratch) == HPU_BE_OK
		       ? HPU_OK
		       : HPU_ERROR;
}
