/* Dense layers: linear (torch.nn.Linear) and linear with the weight of an
 * earlier layer (a tied LM head). Inputs [..., in]: every leading
 * dimension is more rows of the one matrix product. */
#include <math.h>
#include <stdlib.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>

#include "worker/layers/decl.h"

typedef struct linear {
	int in, out;
	size_t rows; /* rows of `in` values per sample */
	int bias;    /* the bias is parameter 1 */
} linear;

static int linear_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			  hpu_tensor *out)
{
	const linear *s = hpu_layer_user(l);
	(void)c;
	int batch = in[0].batch;
	if (!ld_fits_int(batch, s->rows * (size_t)(s->in > s->out ? s->in : s->out)))
		return hpu_layer_error(l, "layer %s: a micro-batch of %d is too large for the "
				       "linear op", hpu_layer_name(l), batch);
	hpu_linear_forward(hpu_f32(&in[0]), hpu_param(l, 0), s->bias ? hpu_param(l, 1) : NULL,
			   hpu_f32(&out[0]), batch * (int)s->rows, s->in, s->out);
	return 0;
}

static int linear_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const linear *s = hpu_layer_user(l);
	(void)c, (void)out;
	hpu_linear_backward(hpu_f32(&in[0]), hpu_param(l, 0), hpu_f32(&dout[0]), hpu_f32(&din[0]),
			    hpu_grad(l, 0), s->bias ? hpu_grad(l, 1) : NULL,
			    in[0].batch * (int)s->rows, s->in, s->out);
	return 0;
}

static const hpu_layer_ops linear_ops = {
	.forward = linear_forward,
	.backward = linear_backward,
	.destroy = free,
};

/* Checks x [..., in] and out_features; the layer with output [...,
 * out_features] added, or NULL. */
static hpu_layer *declare(hpu_builder *b, const char *name, const char *in, const char *out,
			  int64_t out_features, int bias)
{
	hpu_tensor x;
	if (ld_input(b, name, in, HPU_F32, &x) < 0)
		return NULL;
	if (x.ndim < 1) {
		hpu_error(b, "layer %s: input %s has no dimensions; linear needs [..., in]",
			  ld_str(name), in);
		return NULL;
	}
	int64_t fan_in = x.shape[x.ndim - 1];
	if (out_features < 1 || out_features > INT_MAX || fan_in > INT_MAX) {
		hpu_error(b, "layer %s: out_features %lld and in %lld must be 1..%d",
			  ld_str(name), (long long)out_features, (long long)fan_in, INT_MAX);
		return NULL;
	}
	linear *s = malloc(sizeof *s);
	if (s)
		*s = (linear){(int)fan_in, (int)out_features, x.sample_numel / (size_t)fan_in,
			      bias != 0};
	int64_t shape[HPU_MAX_DIMS];
	for (int d = 0; d < x.ndim; d++)
		shape[d] = x.shape[d];
	shape[x.ndim - 1] = out_features;
	/* backward: the input (dw), not the output */
	hpu_layer *l = ld_reads(ld_declare(b, name, in, &linear_ops, s, out, HPU_F32, x.ndim, shape),
				1, 0);
	if (l) {
		hpu_layer_params_in_ops(l);
		hpu_layer_grads_in_ops(l); /* hpu_linear_backward's dw and db */
		hpu_layer_backward_reads_linear(l, 1u); /* its x, nothing else */
	}
	return l;
}

/* torch.nn.Linear's bias: U(+-1/sqrt(in)), the layer's fan-in. */
static int add_bias(hpu_layer *l, int64_t in, int64_t out)
{
	float bound = 1.0f / sqrtf((float)in);
	return hpu_param_add(l, "bias", 1, &out, HPU_INIT(UNIFORM, -bound, bound));
}

static hpu_layer *linear_impl(hpu_builder *b, const char *name, const char *in, const char *out,
		      int64_t out_features, int bias)
{
	hpu_layer *l = declare(b, name, in, out, out_features, bias);
	if (!l)
		return NULL;
	const linear *s = hpu_layer_user(l);
	int64_t wshape[2] = {out_features, s->in};
	/* torch's kaiming_uniform_(a = sqrt(5)) is U(+-1/sqrt(fan_in)) */
	if (hpu_param_add(l, "weight", 2, wshape, HPU_INIT(FAN_IN_UNIFORM)) < 0)
		return NULL;
	if (bias && add_bias(l, s->in, out_features) < 0)
		return NULL;
	return l;
}

static hpu_layer *linear_tied_impl(hpu_builder *b, const char *name, const char *in, const char *out,
			   const char *weight, int bias)
{
	int wdim;
	int64_t wshape[HPU_MAX_DIMS];
	if (!weight || !*weight) {
		hpu_error(b, "layer %s: hpu_linear_tied needs the tied weight's name "
			     "(opts.weight, \"layer.param\" of an earlier layer)",
			  ld_str(name));
		return NULL;
	}
	if (hpu_param_shape(b, weight, &wdim, wshape) != HPU_OK) {
		hpu_error(b, "layer %s: tied weight %s is not a parameter of an earlier layer",
			  ld_str(name), ld_str(weight));
		return NULL;
	}
	hpu_tensor x;
	if (ld_input(b, name, in, HPU_F32, &x) < 0)
		return NULL;
	int64_t fan_in = x.ndim ? x.shape[x.ndim - 1] : 1;
	if (wdim != 2) {
		hpu_error(b, "layer %s: tied weight %s has %d dimensions; it must be "
			  "[out_features, %lld]", ld_str(name), weight, wdim, (long long)fan_in);
		return NULL;
	}
	if (wshape[1] != fan_in) {
		hpu_error(b, "layer %s: tied weight %s has shape [%lld, %lld], but input %s has "
			  "%lld features: it must be [out_features, %lld]", ld_str(name), weight,
			  (long long)wshape[0], (long long)wshape[1], in, (long long)fan_in,
			  (long long)fan_in);
		return NULL;
	}
	int64_t out_features = wshape[0];
	hpu_layer *l = declare(b, name, in, out, out_features, bias);
	if (!l)
		return NULL;
	if (hpu_param_share(l, weight) < 0)
		return NULL;
	if (bias && add_bias(l, fan_in, out_features) < 0)
		return NULL;
	return l;
}

/* ---- ABI 3's options structs, and ABI 2's positional forms (deprecated) ---- */

hpu_layer *hpu_linear_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_linear_opts o)
{
	return linear_impl(b, name, in, out, o.out, o.bias);
}

hpu_layer *(hpu_linear)(hpu_builder *b, const char *name, const char *in, const char *out, int64_t out_features, int bias)
{
	return linear_impl(b, name, in, out, out_features, bias);
}

hpu_layer *hpu_linear_tied_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_linear_tied_opts o)
{
	return linear_tied_impl(b, name, in, out, o.weight, o.bias);
}

hpu_layer *(hpu_linear_tied)(hpu_builder *b, const char *name, const char *in, const char *out, const char *weight, int bias)
{
	return linear_tied_impl(b, name, in, out, weight, bias);
}
