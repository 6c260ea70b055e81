/* The sigmoid and the binary cross-entropy losses: one f32 value per
 * sample (ndim 0), the mean over the sample's elements, as
 * torch.nn.BCEWithLogitsLoss and BCELoss (log clamped at -100) give per
 * element, on the ops hpu_bce_forward/backward (sums in double). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>

#include "worker/layers/decl.h"

/* ---- sigmoid ---- */

static int sigmoid_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   hpu_tensor *out)
{
	(void)c;
	return ld_op(l, hpu_sigmoid_forward(hpu_f32(&in[0]), hpu_f32(&out[0]), hpu_numel(&in[0])),
		     "sigmoid");
}

static int sigmoid_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			    const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)c, (void)in;
	if (!din[0].data)
		return 0;
	return ld_op(l,
		     hpu_sigmoid_backward(hpu_f32(&out[0]), hpu_f32(&dout[0]), hpu_f32(&din[0]),
					  hpu_numel(&out[0])),
		     "sigmoid's backward");
}

static const hpu_layer_ops sigmoid_ops = {.forward = sigmoid_forward,
					  .backward = sigmoid_backward};

hpu_layer *hpu_sigmoid(hpu_builder *b, const char *name, const char *in, const char *out)
{
	hpu_tensor x;
	if (ld_input(b, name, in, HPU_F32, &x) < 0)
		return NULL;
	hpu_layer *l = hpu_layer_add(b, name, in, &sigmoid_ops, NULL);
	if (!l || hpu_layer_output(l, out, HPU_F32, x.ndim, x.shape) < 0)
		return NULL;
	return ld_reads(l, 0, 1); /* backward: y (1 - y) */
}

/* ---- binary cross-entropy, with logits and of probabilities ---- */

static int bce_any_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   hpu_tensor *out, int logits)
{
	size_t n = in[0].sample_numel;
	long bad = -1;
	float v = 0;
	int rc = hpu_bce_forward(logits, hpu_f32(&in[0]), hpu_f32(&in[1]), hpu_f32(&out[0]),
				 in[0].batch, n, &bad, &v);
	if (rc == HPU_ERANGE) {
		int r = (int)((size_t)bad / n);
		return hpu_layer_error(l, "layer %s: probability %g at row %d (dataset sample %lu), "
				       "element %zu is outside [0, 1]", hpu_layer_name(l),
				       (double)v, r,
				       c->samples ? (unsigned long)c->samples[r] : (unsigned long)r,
				       (size_t)bad % n);
	}
	return ld_op(l, rc, "binary cross-entropy");
}

static int bce_any_backward(hpu_layer *l, const hpu_tensor *in, const hpu_tensor *dout,
			    hpu_tensor *din, int logits)
{
	return ld_op(l,
		     hpu_bce_backward(logits, hpu_f32(&in[0]), hpu_f32(&in[1]), hpu_f32(&dout[0]),
				      din[0].data ? hpu_f32(&din[0]) : NULL,
				      din[1].data ? hpu_f32(&din[1]) : NULL, in[0].batch,
				      in[0].sample_numel),
		     "binary cross-entropy's backward");
}

static int bcel_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	return bce_any_forward(l, c, in, out, 1);
}

/* dlogits = dloss (sigmoid(x) - t) / n; dtarget = -dloss x / n. */
static int bcel_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			 const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)c, (void)out;
	return bce_any_backward(l, in, dout, din, 1);
}

static const hpu_layer_ops bcel_ops = {.forward = bcel_forward, .backward = bcel_backward};

static int bce_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	return bce_any_forward(l, c, in, out, 0);
}

/* dprob = dloss (p - t) / max(p (1 - p), 1e-12) / n (torch's);
 * dtarget = -dloss (log p - log(1 - p)) / n, the logs clamped. */
static int bce_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)c, (void)out;
	return bce_any_backward(l, in, dout, din, 0);
}

static const hpu_layer_ops bce_ops = {.forward = bce_forward, .backward = bce_backward};

/* Checks "a,b" (what: "logits,target") as two f32 tensors of one shape
 * and adds the layer with its per-sample output. */
static hpu_layer *pair_loss(hpu_builder *b, const char *name, const char *in, const char *out,
			    const char *what, const hpu_layer_ops *ops)
{
	char an[HPU_NAME_MAX], tn[HPU_NAME_MAX];
	hpu_tensor a, t;
	if (ld_split2(b, name, in, what, an, tn) < 0 || ld_input(b, name, an, HPU_F32, &a) < 0 ||
	    ld_input(b, name, tn, HPU_F32, &t) < 0)
		return NULL;
	if (a.ndim != t.ndim || memcmp(a.shape, t.shape, (size_t)a.ndim * sizeof *a.shape)) {
		hpu_error(b, "layer %s: inputs %s and %s differ in shape (%zu and %zu values a "
			  "sample, %d and %d dimensions); \"%s\" must have one shape",
			  ld_str(name), an, tn, a.sample_numel, t.sample_numel, a.ndim, t.ndim,
			  what);
		return NULL;
	}
	hpu_layer *l = hpu_layer_add(b, name, in, ops, NULL);
	if (!l || hpu_layer_output(l, out, HPU_F32, 0, NULL) < 0)
		return NULL;
	return ld_reads(l, 3, 0); /* backward: both inputs, not the loss */
}

hpu_layer *hpu_bce_with_logits(hpu_builder *b, const char *name, const char *in,
			       const char *out)
{
	return pair_loss(b, name, in, out, "logits,target", &bcel_ops);
}

hpu_layer *hpu_binary_cross_entropy(hpu_builder *b, const char *name, const char *in,
				    const char *out)
{
	return pair_loss(b, name, in, out, "prob,target", &bce_ops);
}
