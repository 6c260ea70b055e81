/* Layers for sequences and rectangular kernels: conv1d over [C, T]
 * (torch.nn.Conv1d), conv2d with a kernel, stride and padding per axis,
 * max / average pooling along one dimension. The convolutions run the
 * rectangular op (hpu_conv2d_rect_*), conv1d as its height-1 case. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>

#include "worker/layers/decl.h"

/* ---- convolution ---- */

typedef struct conv {
	hpu_conv2d_rect_shape s; /* batch set per call */
	size_t in_numel, out_numel;
	int bias;
} conv;

static int conv_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	const conv *st = hpu_layer_user(l);
	hpu_conv2d_rect_shape s = st->s;
	(void)c;
	s.batch = in[0].batch;
	if (!ld_fits_int(s.batch, st->in_numel > st->out_numel ? st->in_numel : st->out_numel))
		return hpu_layer_error(l, "layer %s: a micro-batch of %d is too large for the "
				       "convolution op", hpu_layer_name(l), s.batch);
	return ld_op(l,
		     hpu_conv2d_rect_forward(&s, hpu_f32(&in[0]), hpu_param(l, 0),
					     st->bias ? hpu_param(l, 1) : NULL, hpu_f32(&out[0]),
					     hpu_scratch(l)),
		     "convolution");
}

static int conv_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			 const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const conv *st = hpu_layer_user(l);
	hpu_conv2d_rect_shape s = st->s;
	(void)c, (void)out;
	s.batch = in[0].batch;
	return ld_op(l,
		     hpu_conv2d_rect_backward(&s, hpu_f32(&in[0]), hpu_param(l, 0),
					      hpu_f32(&dout[0]), hpu_f32(&din[0]), hpu_grad(l, 0),
					      st->bias ? hpu_grad(l, 1) : NULL, hpu_scratch(l)),
		     "convolution's backward");
}

static const hpu_layer_ops conv_ops = {
	.forward = conv_forward,
	.backward = conv_backward,
	.destroy = free,
};

/* Adds the convolution of shape s (checked by the caller) with its output
 * [out_ch, OH, OW] (or [out_ch, OT] when ndim is 2) and its parameters:
 * weight of wshape [wdim] and bias, U(+-1/sqrt(C*KH*KW)). */
static hpu_layer *conv_declare(hpu_builder *b, const char *name, const char *in,
			       const char *out, const hpu_conv2d_rect_shape *s, int ndim,
			       int wdim, const int64_t *wshape, int bias)
{
	int64_t shape[3] = {s->out_ch, hpu_conv2d_rect_out_h(s), hpu_conv2d_rect_out_w(s)};
	if (ndim == 2)
		shape[1] = shape[2];
	conv *st = malloc(sizeof *st);
	if (st)
		*st = (conv){*s, (size_t)s->in_ch * (size_t)s->height * (size_t)s->width,
			     (size_t)shape[0] * (size_t)hpu_conv2d_rect_out_h(s) *
				     (size_t)hpu_conv2d_rect_out_w(s),
			     bias != 0};
	/* backward: the input (dw), not the output */
	hpu_layer *l = ld_reads(ld_declare(b, name, in, &conv_ops, st, out, HPU_F32, ndim, shape), 1,
				0);
	if (!l)
		return NULL;
	hpu_layer_memory(l, 0, 0, 0, hpu_conv2d_rect_scratch(s));
	if (hpu_param_add(l, "weight", wdim, wshape, HPU_INIT(FAN_IN_UNIFORM)) < 0)
		return NULL;
	float bound = 1.0f / sqrtf((float)s->in_ch * (float)s->kernel_h * (float)s->kernel_w);
	int64_t bshape = s->out_ch;
	if (bias && hpu_param_add(l, "bias", 1, &bshape, HPU_INIT(UNIFORM, -bound, bound)) < 0)
		return NULL;
	return l;
}

/* Whether kernel, stride and padding fit a size n: an error naming the
 * layer and the axis if not. */
static int axis_ok(hpu_builder *b, const char *name, const char *in, const char *axis,
		   int64_t n, int k, int stride, int pad)
{
	if (k >= 1 && stride >= 1 && pad >= 0 && n <= INT_MAX && n + 2 * (int64_t)pad >= k)
		return HPU_OK;
	return hpu_error(b, "layer %s: along %s (size %lld of input %s) kernel %d, stride %d, "
			 "pad %d do not fit (kernel, stride >= 1, pad >= 0, kernel <= size + 2 "
			 "pad)", ld_str(name), axis, (long long)n, ld_str(in), k, stride, pad);
}

static int out_ch_ok(hpu_builder *b, const char *name, const hpu_tensor *x, int out_ch)
{
	if (out_ch >= 1 && x->shape[0] >= 1 && x->shape[0] <= INT_MAX)
		return HPU_OK;
	return hpu_error(b, "layer %s: out_ch %d (>= 1) or in channels %lld do not fit",
			 ld_str(name), out_ch, (long long)x->shape[0]);
}

static hpu_layer *conv1d_impl(hpu_builder *b, const char *name, const char *in, const char *out,
		      int out_ch, int kernel, int stride, int pad, int bias)
{
	hpu_tensor x;
	if (ld_input(b, name, in, HPU_F32, &x) < 0)
		return NULL;
	if (x.ndim != 2) {
		hpu_error(b, "layer %s: input %s has %d dimensions; conv1d needs [C, T]",
			  ld_str(name), in, x.ndim);
		return NULL;
	}
	if (out_ch_ok(b, name, &x, out_ch) < 0 ||
	    axis_ok(b, name, in, "T", x.shape[1], kernel, stride, pad) < 0)
		return NULL;
	hpu_conv2d_rect_shape s = {1, (int)x.shape[0], 1, (int)x.shape[1], out_ch, 1, kernel,
				   1, stride, 0, pad};
	int64_t wshape[3] = {out_ch, x.shape[0], kernel};
	return conv_declare(b, name, in, out, &s, 2, 3, wshape, bias);
}

static hpu_layer *conv2d_rect_impl(hpu_builder *b, const char *name, const char *in, const char *out,
			   int out_ch, const int kernel[2], const int stride[2],
			   const int pad[2], int bias)
{
	hpu_tensor x;
	if (ld_input(b, name, in, HPU_F32, &x) < 0)
		return NULL;
	if (x.ndim != 3 || !kernel || !stride || !pad) {
		hpu_error(b, "layer %s: input %s has %d dimensions; conv2d_rect needs [C, H, W] "
			  "(and kernel, stride, pad of 2 each)", ld_str(name), in, x.ndim);
		return NULL;
	}
	if (out_ch_ok(b, name, &x, out_ch) < 0 ||
	    axis_ok(b, name, in, "H", x.shape[1], kernel[0], stride[0], pad[0]) < 0 ||
	    axis_ok(b, name, in, "W", x.shape[2], kernel[1], stride[1], pad[1]) < 0)
		return NULL;
	hpu_conv2d_rect_shape s = {1, (int)x.shape[0], (int)x.shape[1], (int)x.shape[2], out_ch,
				   kernel[0], kernel[1], stride[0], stride[1], pad[0], pad[1]};
	int64_t wshape[4] = {out_ch, x.shape[0], kernel[0], kernel[1]};
	return conv_declare(b, name, in, out, &s, 3, 4, wshape, bias);
}

/* ---- pooling along one dimension ---- */

typedef struct pool1d {
	size_t outer, inner; /* per sample */
	int n, k, stride;
} pool1d;

static int maxpool1d_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			     hpu_tensor *out)
{
	const pool1d *p = hpu_layer_user(l);
	(void)c;
	return ld_op(l,
		     hpu_maxpool1d_forward(hpu_f32(&in[0]), hpu_f32(&out[0]), hpu_saved(l),
					   (size_t)in[0].batch * p->outer, p->n, p->inner, p->k,
					   p->stride),
		     "max pooling");
}

static int maxpool1d_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			      const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const pool1d *p = hpu_layer_user(l);
	(void)c, (void)out;
	if (!din[0].data)
		return 0;
	return ld_op(l,
		     hpu_maxpool1d_backward(hpu_f32(&dout[0]), hpu_saved(l), hpu_f32(&din[0]),
					    (size_t)in[0].batch * p->outer, p->n, p->inner, p->k,
					    p->stride),
		     "max pooling's backward");
}

static int avgpool1d_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			     hpu_tensor *out)
{
	const pool1d *p = hpu_layer_user(l);
	(void)c;
	return ld_op(l,
		     hpu_avgpool1d_forward(hpu_f32(&in[0]), hpu_f32(&out[0]),
					   (size_t)in[0].batch * p->outer, p->n, p->inner, p->k,
					   p->stride),
		     "average pooling");
}

static int avgpool1d_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			      const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const pool1d *p = hpu_layer_user(l);
	(void)c, (void)out;
	if (!din[0].data)
		return 0;
	return ld_op(l,
		     hpu_avgpool1d_backward(hpu_f32(&dout[0]), hpu_f32(&din[0]),
					    (size_t)in[0].batch * p->outer, p->n, p->inner, p->k,
					    p->stride),
		     "average pooling's backward");
}

static const hpu_layer_ops maxpool1d_ops = {
	.forward = maxpool1d_forward,
	.backward = maxpool1d_backward,
	.destroy = free,
};

static const hpu_layer_ops avgpool1d_ops = {
	.forward = avgpool1d_forward,
	.backward = avgpool1d_backward,
	.destroy = free,
};

static hpu_layer *pool1d_declare(hpu_builder *b, const char *name, const char *in,
				 const char *out, int dim, int kernel, int stride,
				 const hpu_layer_ops *ops)
{
	hpu_tensor x;
	int d = 0;
	if (ld_input(b, name, in, HPU_F32, &x) < 0 || ld_dim(b, name, in, &x, dim, &d) < 0)
		return NULL;
	if (kernel < 1 || stride < 1 || x.shape[d] < kernel || x.shape[d] > INT_MAX) {
		hpu_error(b, "layer %s: kernel %d, stride %d do not fit dimension %d (size %lld) "
			  "of input %s (kernel, stride >= 1, kernel <= size; no padding)",
			  ld_str(name), kernel, stride, d, (long long)x.shape[d], in);
		return NULL;
	}
	pool1d *p = malloc(sizeof *p);
	if (p)
		*p = (pool1d){ld_prod(&x, 0, d), ld_prod(&x, d + 1, x.ndim), (int)x.shape[d],
			      kernel, stride};
	int64_t shape[HPU_MAX_DIMS];
	memcpy(shape, x.shape, sizeof shape);
	shape[d] = (x.shape[d] - kernel) / stride + 1;
	/* backward: dout and max's saved indices only */
	hpu_layer *l = ld_reads(ld_declare(b, name, in, ops, p, out, HPU_F32, x.ndim, shape), 0, 0);
	if (l && ops == &maxpool1d_ops) /* one i32 index per output */
		hpu_layer_memory(l, x.sample_numel / (size_t)x.shape[d] * (size_t)shape[d], 0, 0,
				 0);
	return l;
}

static hpu_layer *maxpool1d_impl(hpu_builder *b, const char *name, const char *in, const char *out,
			 int dim, int kernel, int stride)
{
	return pool1d_declare(b, name, in, out, dim, kernel, stride, &maxpool1d_ops);
}

static hpu_layer *avgpool1d_impl(hpu_builder *b, const char *name, const char *in, const char *out,
			 int dim, int kernel, int stride)
{
	return pool1d_declare(b, name, in, out, dim, kernel, stride, &avgpool1d_ops);
}

/* ---- ABI 3's options structs, and ABI 2's positional forms (deprecated) ---- */

hpu_layer *hpu_conv1d_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_conv1d_opts o)
{
	int oc, k, s, p;
	if (ld_int(b, name, ".out", o.out, &oc) < 0 || ld_int(b, name, ".kernel", o.kernel, &k) < 0 ||
	    ld_int(b, name, ".stride", o.stride ? o.stride : 1, &s) < 0 ||
	    ld_int(b, name, ".pad", o.pad, &p) < 0)
		return NULL;
	return conv1d_impl(b, name, in, out, oc, k, s, p, o.bias);
}

hpu_layer *(hpu_conv1d)(hpu_builder *b, const char *name, const char *in, const char *out, int out_ch, int kernel, int stride, int pad, int bias)
{
	return conv1d_impl(b, name, in, out, out_ch, kernel, stride, pad, bias);
}

hpu_layer *hpu_conv2d_rect_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_conv2d_rect_opts o)
{
	int oc, k[2], s[2], p[2];
	if (ld_int(b, name, ".out", o.out, &oc) < 0)
		return NULL;
	for (int i = 0; i < 2; i++)
		if (ld_int(b, name, ".kernel", o.kernel[i], &k[i]) < 0 ||
		    ld_int(b, name, ".stride", o.stride[i] ? o.stride[i] : 1, &s[i]) < 0 ||
		    ld_int(b, name, ".pad", o.pad[i], &p[i]) < 0)
			return NULL;
	return conv2d_rect_impl(b, name, in, out, oc, k, s, p, o.bias);
}

hpu_layer *(hpu_conv2d_rect)(hpu_builder *b, const char *name, const char *in, const char *out, int out_ch, const int kernel[2], const int stride[2], const int pad[2], int bias)
{
	return conv2d_rect_impl(b, name, in, out, out_ch, kernel, stride, pad, bias);
}

hpu_layer *hpu_maxpool1d_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_pool1d_opts o)
{
	int k, s;
	if (ld_int(b, name, ".kernel", o.kernel, &k) < 0 ||
	    ld_int(b, name, ".stride", o.stride ? o.stride : o.kernel, &s) < 0)
		return NULL;
	return maxpool1d_impl(b, name, in, out, o.dim, k, s);
}

hpu_layer *(hpu_maxpool1d)(hpu_builder *b, const char *name, const char *in, const char *out, int dim, int kernel, int stride)
{
	return maxpool1d_impl(b, name, in, out, dim, kernel, stride);
}

hpu_layer *hpu_avgpool1d_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_pool1d_opts o)
{
	int k, s;
	if (ld_int(b, name, ".kernel", o.kernel, &k) < 0 ||
	    ld_int(b, name, ".stride", o.stride ? o.stride : o.kernel, &s) < 0)
		return NULL;
	return avgpool1d_impl(b, name, in, out, o.dim, k, s);
}

hpu_layer *(hpu_avgpool1d)(hpu_builder *b, const char *name, const char *in, const char *out, int dim, int kernel, int stride)
{
	return avgpool1d_impl(b, name, in, out, dim, kernel, stride);
}
