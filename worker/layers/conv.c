/* Convolution and pooling over per-sample [C, H, W] (torch.nn.Conv2d,
 * MaxPool2d, AvgPool2d), and flatten. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>

#include "worker/layers/decl.h"

/* x [C, H, W] f32 named `in` into *x; an error naming the layer if not. */
static int chw_input(hpu_builder *b, const char *name, const char *in, hpu_tensor *x)
{
	if (ld_input(b, name, in, HPU_F32, x) < 0)
		return HPU_ERROR;
	if (x->ndim != 3)
		return hpu_error(b, "layer %s: input %s has %d dimensions; it must be [C, H, W]",
				 ld_str(name), in, x->ndim);
	if (x->shape[0] > INT_MAX || x->shape[1] > INT_MAX || x->shape[2] > INT_MAX)
		return hpu_error(b, "layer %s: input %s is too large", ld_str(name), in);
	return HPU_OK;
}

/* ---- conv2d ---- */

typedef struct conv2d {
	hpu_conv2d_shape s; /* batch set per call */
	size_t in_numel;    /* C * H * W */
	int bias;
} conv2d;

static int conv2d_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			  hpu_tensor *out)
{
	const conv2d *st = hpu_layer_user(l);
	hpu_conv2d_shape s = st->s;
	(void)c;
	s.batch = in[0].batch;
	if (!ld_fits_int(s.batch, st->in_numel > out[0].sample_numel ? st->in_numel
								     : out[0].sample_numel))
		return hpu_layer_error(l, "layer %s: a micro-batch of %d is too large for the "
				       "conv2d op", hpu_layer_name(l), s.batch);
	hpu_conv2d_forward(&s, hpu_f32(&in[0]), hpu_param(l, 0), st->bias ? hpu_param(l, 1) : NULL,
			   hpu_f32(&out[0]), hpu_scratch(l));
	return 0;
}

static int conv2d_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const conv2d *st = hpu_layer_user(l);
	hpu_conv2d_shape s = st->s;
	(void)c, (void)out;
	s.batch = in[0].batch;
	hpu_conv2d_backward(&s, hpu_f32(&in[0]), hpu_param(l, 0), hpu_f32(&dout[0]),
			    hpu_f32(&din[0]), hpu_grad(l, 0), st->bias ? hpu_grad(l, 1) : NULL,
			    hpu_scratch(l));
	return 0;
}

static const hpu_layer_ops conv2d_ops = {
	.forward = conv2d_forward,
	.backward = conv2d_backward,
	.destroy = free,
};

static hpu_layer *conv2d_impl(hpu_builder *b, const char *name, const char *in, const char *out,
		      int out_ch, int kernel, int stride, int pad, int bias)
{
	hpu_tensor x;
	if (chw_input(b, name, in, &x) < 0)
		return NULL;
	hpu_conv2d_shape s = {1, (int)x.shape[0], (int)x.shape[1], (int)x.shape[2],
			      out_ch, kernel, stride, pad};
	if (out_ch < 1 || kernel < 1 || stride < 1 || pad < 0 ||
	    x.shape[1] + 2 * (int64_t)pad < kernel || x.shape[2] + 2 * (int64_t)pad < kernel) {
		hpu_error(b, "layer %s: out_ch %d, kernel %d, stride %d, pad %d do not fit input "
			  "%s [%lld, %lld, %lld] (out_ch, kernel, stride >= 1, pad >= 0, kernel "
			  "<= H + 2 pad and W + 2 pad)", ld_str(name), out_ch, kernel, stride, pad,
			  in, (long long)x.shape[0], (long long)x.shape[1], (long long)x.shape[2]);
		return NULL;
	}
	conv2d *st = malloc(sizeof *st);
	if (st)
		*st = (conv2d){s, x.sample_numel, bias != 0};
	int64_t shape[3] = {out_ch, hpu_conv2d_out_h(&s), hpu_conv2d_out_w(&s)};
	/* backward: the input (dw), not the output */
	hpu_layer *l = ld_reads(ld_declare(b, name, in, &conv2d_ops, st, out, HPU_F32, 3, shape), 1,
				0);
	if (!l)
		return NULL;
	hpu_layer_params_in_ops(l);
	hpu_layer_grads_in_ops(l); /* hpu_conv2d_backward's dw and db */
	/* the im2col buffer of one sample, whatever the batch */
	hpu_layer_memory(l, 0, 0, 0, hpu_conv2d_scratch(&s));
	int64_t wshape[4] = {out_ch, s.in_ch, kernel, kernel};
	if (hpu_param_add(l, "weight", 4, wshape, HPU_INIT(FAN_IN_UNIFORM)) < 0)
		return NULL;
	float bound = 1.0f / sqrtf((float)s.in_ch * (float)kernel * (float)kernel);
	int64_t bshape = out_ch;
	if (bias && hpu_param_add(l, "bias", 1, &bshape, HPU_INIT(UNIFORM, -bound, bound)) < 0)
		return NULL;
	return l;
}

/* ---- pooling ---- */

typedef struct pool {
	int ch, h, w, k, stride;
	size_t in_numel;
} pool;

static int pool_batch(hpu_layer *l, const pool *p, int batch)
{
	if (!ld_fits_int(batch, p->in_numel))
		return hpu_layer_error(l, "layer %s: a micro-batch of %d is too large for the "
				       "pooling op", hpu_layer_name(l), batch);
	return 0;
}

/* Saved: the arg-max of each output (its position in its plane), i32. */
static int maxpool_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   hpu_tensor *out)
{
	const pool *p = hpu_layer_user(l);
	(void)c;
	if (pool_batch(l, p, in[0].batch) < 0)
		return HPU_ERROR;
	hpu_maxpool2d_forward(hpu_f32(&in[0]), hpu_f32(&out[0]), hpu_saved(l), in[0].batch,
			      p->ch, p->h, p->w, p->k, p->stride);
	return 0;
}

static int maxpool_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			    const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const pool *p = hpu_layer_user(l);
	(void)c, (void)out;
	if (!din[0].data)
		return 0;
	hpu_maxpool2d_backward(hpu_f32(&dout[0]), hpu_saved(l), hpu_f32(&din[0]), in[0].batch,
			       p->ch, p->h, p->w, p->k, p->stride);
	return 0;
}

static int avgpool_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   hpu_tensor *out)
{
	const pool *p = hpu_layer_user(l);
	(void)c;
	if (pool_batch(l, p, in[0].batch) < 0)
		return HPU_ERROR;
	hpu_avgpool2d_forward(hpu_f32(&in[0]), hpu_f32(&out[0]), in[0].batch, p->ch, p->h, p->w,
			      p->k, p->stride);
	return 0;
}

static int avgpool_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			    const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const pool *p = hpu_layer_user(l);
	(void)c, (void)out;
	if (!din[0].data)
		return 0;
	hpu_avgpool2d_backward(hpu_f32(&dout[0]), hpu_f32(&din[0]), in[0].batch, p->ch, p->h,
			       p->w, p->k, p->stride);
	return 0;
}

static const hpu_layer_ops maxpool_ops = {
	.forward = maxpool_forward,
	.backward = maxpool_backward,
	.destroy = free,
};

static const hpu_layer_ops avgpool_ops = {
	.forward = avgpool_forward,
	.backward = avgpool_backward,
	.destroy = free,
};

static hpu_layer *pool_declare(hpu_builder *b, const char *name, const char *in,
			       const char *out, int kernel, int stride, const hpu_layer_ops *ops)
{
	hpu_tensor x;
	if (chw_input(b, name, in, &x) < 0)
		return NULL;
	if (kernel < 1 || stride < 1 || x.shape[1] < kernel || x.shape[2] < kernel) {
		hpu_error(b, "layer %s: kernel %d, stride %d do not fit input %s [%lld, %lld, "
			  "%lld] (kernel, stride >= 1, kernel <= H and W; no padding)",
			  ld_str(name), kernel, stride, in, (long long)x.shape[0],
			  (long long)x.shape[1], (long long)x.shape[2]);
		return NULL;
	}
	pool *p = malloc(sizeof *p);
	if (p)
		*p = (pool){(int)x.shape[0], (int)x.shape[1], (int)x.shape[2], kernel, stride,
			    x.sample_numel};
	int64_t shape[3] = {x.shape[0], (x.shape[1] - kernel) / stride + 1,
			    (x.shape[2] - kernel) / stride + 1};
	/* backward: dout and max's saved indices only */
	hpu_layer *l = ld_reads(ld_declare(b, name, in, ops, p, out, HPU_F32, 3, shape), 0, 0);
	if (l && ops == &maxpool_ops) /* one i32 index per output */
		hpu_layer_memory(l, (size_t)(shape[0] * shape[1] * shape[2]), 0, 0, 0);
	return l;
}

static hpu_layer *maxpool2d_impl(hpu_builder *b, const char *name, const char *in, const char *out,
			 int kernel, int stride)
{
	return pool_declare(b, name, in, out, kernel, stride, &maxpool_ops);
}

static hpu_layer *avgpool2d_impl(hpu_builder *b, const char *name, const char *in, const char *out,
			 int kernel, int stride)
{
	return pool_declare(b, name, in, out, kernel, stride, &avgpool_ops);
}

/* ---- flatten ---- */

/* The runtime gives every tensor its own memory, so the "view" is a copy
 * each way. */
static int flatten_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   hpu_tensor *out)
{
	(void)l, (void)c;
	if (hpu_copy(out[0].data, in[0].data, hpu_numel(&in[0]) * sizeof(float)) != HPU_OK)
		return hpu_layer_error(l, "layer %s: this device's kernel table has no copy",
				       hpu_layer_name(l));
	return 0;
}

static int flatten_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			    const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)l, (void)c, (void)in, (void)out;
	if (din[0].data &&
	    hpu_copy(din[0].data, dout[0].data, hpu_numel(&dout[0]) * sizeof(float)) != HPU_OK)
		return hpu_layer_error(l, "layer %s: this device's kernel table has no copy",
				       hpu_layer_name(l));
	return 0;
}

static const hpu_layer_ops flatten_ops = {
	.forward = flatten_forward,
	.backward = flatten_backward,
};

hpu_layer *hpu_flatten(hpu_builder *b, const char *name, const char *in, const char *out)
{
	hpu_tensor x;
	if (ld_input(b, name, in, HPU_F32, &x) < 0)
		return NULL;
	int64_t n = (int64_t)x.sample_numel;
	hpu_layer *l = hpu_layer_add(b, name, in, &flatten_ops, NULL);
	if (!l || hpu_layer_output(l, out, HPU_F32, 1, &n) < 0)
		return NULL;
	return ld_reads(l, 0, 0); /* backward copies dout */
}

/* ---- ABI 3's options structs, and ABI 2's positional forms (deprecated) ---- */

hpu_layer *hpu_conv2d_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_conv2d_opts o)
{
	int oc, k, s, p;
	if (ld_int(b, name, ".out", o.out, &oc) < 0 || ld_int(b, name, ".kernel", o.kernel, &k) < 0 ||
	    ld_int(b, name, ".stride", o.stride ? o.stride : 1, &s) < 0 ||
	    ld_int(b, name, ".pad", o.pad, &p) < 0)
		return NULL;
	return conv2d_impl(b, name, in, out, oc, k, s, p, o.bias);
}

hpu_layer *(hpu_conv2d)(hpu_builder *b, const char *name, const char *in, const char *out, int out_ch, int kernel, int stride, int pad, int bias)
{
	return conv2d_impl(b, name, in, out, out_ch, kernel, stride, pad, bias);
}

hpu_layer *hpu_maxpool2d_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_pool2d_opts o)
{
	int k, s;
	if (ld_int(b, name, ".kernel", o.kernel, &k) < 0 ||
	    ld_int(b, name, ".stride", o.stride ? o.stride : o.kernel, &s) < 0)
		return NULL;
	return maxpool2d_impl(b, name, in, out, k, s);
}

hpu_layer *(hpu_maxpool2d)(hpu_builder *b, const char *name, const char *in, const char *out, int kernel, int stride)
{
	return maxpool2d_impl(b, name, in, out, kernel, stride);
}

hpu_layer *hpu_avgpool2d_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_pool2d_opts o)
{
	int k, s;
	if (ld_int(b, name, ".kernel", o.kernel, &k) < 0 ||
	    ld_int(b, name, ".stride", o.stride ? o.stride : o.kernel, &s) < 0)
		return NULL;
	return avgpool2d_impl(b, name, in, out, k, s);
}

hpu_layer *(hpu_avgpool2d)(hpu_builder *b, const char *name, const char *in, const char *out, int kernel, int stride)
{
	return avgpool2d_impl(b, name, in, out, kernel, stride);
}
