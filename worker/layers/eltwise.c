/* Elementwise layers: relu, gelu (tanh approximation), tanh, dropout, the
 * residual add, and softmax over the last dimension. The output has the
 * input's shape. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>

#include "worker/layers/decl.h"

/* Adds a one-input layer without state whose f32 output is shaped as its
 * input, its backward reading the input (`reads_in`) or the output. */
static hpu_layer *same_shape(hpu_builder *b, const char *name, const char *in, const char *out,
			     const hpu_layer_ops *ops, int reads_in)
{
	hpu_tensor x;
	if (ld_input(b, name, in, HPU_F32, &x) < 0)
		return NULL;
	hpu_layer *l = hpu_layer_add(b, name, in, ops, NULL);
	if (!l || hpu_layer_output(l, out, HPU_F32, x.ndim, x.shape) < 0)
		return NULL;
	return ld_reads(l, reads_in ? 1 : 0, reads_in ? 0 : 1);
}

/* ---- relu, gelu, tanh ---- */

static int relu_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	(void)l, (void)c;
	hpu_relu_forward(hpu_f32(&in[0]), hpu_f32(&out[0]), hpu_numel(&in[0]));
	return 0;
}

/* From the output: y > 0 where x > 0. */
static int relu_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			 const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)l, (void)c, (void)in;
	if (din[0].data)
		hpu_relu_backward(hpu_f32(&out[0]), hpu_f32(&dout[0]), hpu_f32(&din[0]),
				  hpu_numel(&out[0]));
	return 0;
}

static int gelu_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	(void)l, (void)c;
	hpu_gelu_forward(hpu_f32(&in[0]), hpu_f32(&out[0]), hpu_numel(&in[0]));
	return 0;
}

static int gelu_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			 const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)l, (void)c, (void)out;
	if (din[0].data)
		hpu_gelu_backward(hpu_f32(&in[0]), hpu_f32(&dout[0]), hpu_f32(&din[0]),
				  hpu_numel(&in[0]));
	return 0;
}

static int tanh_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	(void)l, (void)c;
	hpu_tanh_forward(hpu_f32(&in[0]), hpu_f32(&out[0]), hpu_numel(&in[0]));
	return 0;
}

static int tanh_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			 const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)l, (void)c, (void)in;
	if (din[0].data)
		hpu_tanh_backward(hpu_f32(&out[0]), hpu_f32(&dout[0]), hpu_f32(&din[0]),
				  hpu_numel(&out[0]));
	return 0;
}

static const hpu_layer_ops relu_ops = {.forward = relu_forward, .backward = relu_backward};
static const hpu_layer_ops gelu_ops = {.forward = gelu_forward, .backward = gelu_backward};
static const hpu_layer_ops tanh_ops = {.forward = tanh_forward, .backward = tanh_backward};

hpu_layer *hpu_relu(hpu_builder *b, const char *name, const char *in, const char *out)
{
	return same_shape(b, name, in, out, &relu_ops, 0); /* y > 0 */
}

hpu_layer *hpu_gelu(hpu_builder *b, const char *name, const char *in, const char *out)
{
	return same_shape(b, name, in, out, &gelu_ops, 1); /* gelu'(x) */
}

hpu_layer *hpu_tanh(hpu_builder *b, const char *name, const char *in, const char *out)
{
	return same_shape(b, name, in, out, &tanh_ops, 0); /* 1 - y^2 */
}

/* ---- dropout ----
 *
 * Element i of row r is dropped when hpu_rand_u32(c, r, i) < p * 2^32: a
 * pure function of (seed, layer, step, the row's sample, i). Backward
 * draws the same numbers again instead of keeping a mask in saved memory
 * (4 bytes an element, as much as the activation): the ctx it gets is the
 * forward's, so the mask is the forward's, under recompute too. */

typedef struct dropout {
	float p;
	uint32_t cut;   /* drop below this */
	float scale;    /* 1 / (1 - p) */
} dropout;

/* y = x * keep / (1 - p) over `batch` rows of n values (the op
 * hpu_dropout_ctx, from the rows' keys); y = x where nothing drops. */
static int dropout_apply(hpu_layer *l, const dropout *d, const hpu_ctx *c, const float *x,
			 float *y, int batch, size_t n)
{
	int rc;
	if (!c->train || d->cut == 0)
		rc = hpu_copy(y, x, (size_t)batch * n * sizeof(float));
	else /* the keys on the device where the step may be recorded */
		rc = hpu_dropout_ctx(c, x, y, batch, n, d->cut, d->scale);
	if (rc != HPU_OK)
		return hpu_layer_error(l, "layer %s: this device's kernel table has no dropout",
				       hpu_layer_name(l));
	return 0;
}

static int dropout_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   hpu_tensor *out)
{
	const dropout *d = hpu_layer_user(l);
	return dropout_apply(l, d, c, hpu_f32(&in[0]), hpu_f32(&out[0]), in[0].batch,
			     in[0].sample_numel);
}

/* The derivative of y = x * mask * scale is mask * scale: the same
 * function applied to dout. */
static int dropout_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			    const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const dropout *d = hpu_layer_user(l);
	(void)in, (void)out;
	if (!din[0].data)
		return 0;
	return dropout_apply(l, d, c, hpu_f32(&dout[0]), hpu_f32(&din[0]), dout[0].batch,
			     dout[0].sample_numel);
}

static const hpu_layer_ops dropout_ops = {
	.forward = dropout_forward,
	.backward = dropout_backward,
	.destroy = free,
};

static hpu_layer *dropout_impl(hpu_builder *b, const char *name, const char *in, const char *out,
		       float p)
{
	if (!(p >= 0.0f && p < 1.0f)) {
		hpu_error(b, "layer %s: dropout probability %g must be in [0, 1)", ld_str(name),
			  (double)p);
		return NULL;
	}
	hpu_tensor x;
	if (ld_input(b, name, in, HPU_F32, &x) < 0)
		return NULL;
	dropout *d = malloc(sizeof *d);
	if (d) {
		double cut = ldexp((double)p, 32); /* < 2^32 as p < 1 */
		d->p = p;
		d->cut = cut >= 4294967295.0 ? UINT32_MAX : (uint32_t)cut;
		d->scale = (float)(1.0 / (1.0 - (double)p));
	}
	/* backward draws the mask again: reads neither */
	return ld_reads(ld_declare(b, name, in, &dropout_ops, d, out, HPU_F32, x.ndim, x.shape), 0,
			0);
}

/* ---- add ---- */

static int add_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	(void)c;
	if (hpu_add_forward(hpu_f32(&in[0]), hpu_f32(&in[1]), hpu_f32(&out[0]),
			    hpu_numel(&in[0])) != HPU_OK)
		return hpu_layer_error(l, "layer %s: this device's kernel table has no add",
				       hpu_layer_name(l));
	return 0;
}

static int add_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)c, (void)in, (void)out;
	for (int k = 0; k < 2; k++)
		if (din[k].data &&
		    hpu_copy(din[k].data, dout[0].data, hpu_numel(&dout[0]) * sizeof(float)) != HPU_OK)
			return hpu_layer_error(l, "layer %s: this device's kernel table has no copy",
					       hpu_layer_name(l));
	return 0;
}

static const hpu_layer_ops add_ops = {.forward = add_forward, .backward = add_backward};

hpu_layer *hpu_add(hpu_builder *b, const char *name, const char *in, const char *out)
{
	char an[HPU_NAME_MAX], bn[HPU_NAME_MAX];
	hpu_tensor ta, tb;
	if (ld_split2(b, name, in, "a,b", an, bn) < 0 || ld_input(b, name, an, HPU_F32, &ta) < 0 ||
	    ld_input(b, name, bn, HPU_F32, &tb) < 0)
		return NULL;
	if (ta.ndim != tb.ndim || memcmp(ta.shape, tb.shape, (size_t)ta.ndim * sizeof *ta.shape)) {
		hpu_error(b, "layer %s: inputs %s and %s differ in shape (%zu and %zu values a "
			  "sample, %d and %d dimensions); add needs the same shape",
			  ld_str(name), an, bn, ta.sample_numel, tb.sample_numel, ta.ndim, tb.ndim);
		return NULL;
	}
	hpu_layer *l = hpu_layer_add(b, name, in, &add_ops, NULL);
	if (!l || hpu_layer_output(l, out, HPU_F32, ta.ndim, ta.shape) < 0)
		return NULL;
	return ld_reads(l, 0, 0); /* backward copies dout */
}

/* ---- softmax ---- */

typedef struct softmax {
	size_t rows; /* rows of `cols` per sample */
	int cols;
} softmax;

static int softmax_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   hpu_tensor *out)
{
	const softmax *s = hpu_layer_user(l);
	(void)c;
	if (!ld_fits_int(in[0].batch, s->rows))
		return hpu_layer_error(l, "layer %s: a micro-batch of %d is too large for the "
				       "softmax op", hpu_layer_name(l), in[0].batch);
	hpu_softmax_forward(hpu_f32(&in[0]), hpu_f32(&out[0]), in[0].batch * (int)s->rows,
			    s->cols);
	return 0;
}

static int softmax_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			    const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const softmax *s = hpu_layer_user(l);
	(void)c, (void)in;
	if (din[0].data)
		hpu_softmax_backward(hpu_f32(&out[0]), hpu_f32(&dout[0]), hpu_f32(&din[0]),
				     out[0].batch * (int)s->rows, s->cols);
	return 0;
}

static const hpu_layer_ops softmax_ops = {
	.forward = softmax_forward,
	.backward = softmax_backward,
	.destroy = free,
};

hpu_layer *hpu_softmax(hpu_builder *b, const char *name, const char *in, const char *out)
{
	hpu_tensor x;
	if (ld_input(b, name, in, HPU_F32, &x) < 0)
		return NULL;
	if (x.ndim < 1 || x.shape[x.ndim - 1] > INT_MAX) {
		hpu_error(b, "layer %s: input %s needs a last dimension (of at most %d) to take "
			  "the softmax over", ld_str(name), in, INT_MAX);
		return NULL;
	}
	softmax *s = malloc(sizeof *s);
	if (s)
		*s = (softmax){x.sample_numel / (size_t)x.shape[x.ndim - 1],
			       (int)x.shape[x.ndim - 1]};
	/* backward: the output */
	return ld_reads(ld_declare(b, name, in, &softmax_ops, s, out, HPU_F32, x.ndim, x.shape), 0,
			1);
}

/* ---- ABI 3's options structs, and ABI 2's positional forms (deprecated) ---- */

hpu_layer *hpu_dropout_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_dropout_opts o)
{
	return dropout_impl(b, name, in, out, o.p);
}

hpu_layer *(hpu_dropout)(hpu_builder *b, const char *name, const char *in, const char *out, float p)
{
	return dropout_impl(b, name, in, out, p);
}
