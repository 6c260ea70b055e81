/* Losses and metrics: one f32 value per sample (ndim 0). Softmax
 * cross-entropy and accuracy read "logits,labels" (logits [..., C] f32,
 * labels i32 [...], -100 ignored as torch's ignore_index); MSE reads
 * "pred,target". Cross-entropy and accuracy run the ops of
 * worker/ops/ops_loss.c (per-sample means over positions, -100 ignored,
 * sums in double) on the device's kernels; MSE is a loop here. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>

#include "worker/layers/decl.h"

#define IGNORE_INDEX (-100)

typedef struct xent {
	int classes;
	size_t positions; /* labels per sample */
} xent;

/* The op's answer: 0, or the layer's error naming the bad label at flat
 * position `at` (or that the device has no kernel). */
static int label_check(hpu_layer *l, const hpu_ctx *c, const xent *s, int rc, long at,
		       int32_t y)
{
	if (rc == HPU_OK)
		return 0;
	if (rc != HPU_ERANGE) {
		hpu_layer_error(l, "layer %s: this device's kernel table has no kernel for it",
				hpu_layer_name(l));
		return HPU_ERROR;
	}
	int r = (int)((size_t)at / s->positions);
	size_t p = (size_t)at % s->positions;
	hpu_layer_error(l, "layer %s: label %d at row %d (dataset sample %lu), "
			       "position %zu is outside [0, %d) and not %d (ignored)",
			       hpu_layer_name(l), (int)y, r,
			       c->samples ? (unsigned long)c->samples[r] : (unsigned long)r,
			       p, s->classes, IGNORE_INDEX);
	return HPU_ERROR;
}

/* ---- softmax cross-entropy ---- */

/* Saved: each position's log-sum-exp (f32), for backward's softmax. */
static int xent_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	const xent *s = hpu_layer_user(l);
	long bad;
	int32_t y;
	int rc = hpu_cross_entropy_positions_forward(hpu_f32(&in[0]), hpu_i32(&in[1]),
						     hpu_saved(l), hpu_f32(&out[0]), in[0].batch,
						     s->positions, s->classes, &bad, &y);
	return label_check(l, c, s, rc, bad, y);
}

/* dlogits = dloss / n * (softmax(x) - onehot(y)) at the n counted
 * positions, 0 at the ignored ones. */
static int xent_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			 const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const xent *s = hpu_layer_user(l);
	float *dx = hpu_f32(&din[0]);
	(void)out;
	if (!dx)
		return 0;
	int rc = hpu_cross_entropy_positions_backward(hpu_f32(&in[0]), hpu_i32(&in[1]),
						      hpu_saved(l), hpu_f32(&dout[0]), dx,
						      in[0].batch, s->positions, s->classes);
	return label_check(l, c, s, rc, 0, 0);
}

static const hpu_layer_ops xent_ops = {
	.forward = xent_forward,
	.backward = xent_backward,
	.destroy = free,
};

/* Checks "logits,labels" (logits [..., C] f32, labels i32 of the leading
 * shape; for logits [C], labels [] or [1]) and adds the layer with its
 * per-sample output. */
static hpu_layer *logits_labels(hpu_builder *b, const char *name, const char *in,
				const char *out, const hpu_layer_ops *ops)
{
	char ln[HPU_NAME_MAX], yn[HPU_NAME_MAX];
	hpu_tensor x, y;
	if (ld_split2(b, name, in, "logits,labels", ln, yn) < 0 ||
	    ld_input(b, name, ln, HPU_F32, &x) < 0 || ld_input(b, name, yn, HPU_I32, &y) < 0)
		return NULL;
	if (x.ndim < 1 || x.shape[x.ndim - 1] > INT_MAX) {
		hpu_error(b, "layer %s: logits %s need a class dimension (of at most %d): [..., C]",
			  ld_str(name), ln, INT_MAX);
		return NULL;
	}
	int lead = x.ndim - 1, ok = y.ndim == lead;
	for (int d = 0; ok && d < lead; d++)
		ok = y.shape[d] == x.shape[d];
	if (!lead && y.ndim == 1 && y.shape[0] == 1)
		ok = 1;
	if (!ok) {
		hpu_error(b, "layer %s: labels %s (%d dimensions, %zu values a sample) must have "
			  "the shape of logits %s without its class dimension (%d dimensions, %zu "
			  "values)", ld_str(name), yn, y.ndim, y.sample_numel, ln, lead,
			  x.sample_numel / (size_t)x.shape[lead]);
		return NULL;
	}
	xent *s = malloc(sizeof *s);
	if (s)
		*s = (xent){(int)x.shape[lead], y.sample_numel};
	/* cross-entropy's backward: logits and labels, not the loss */
	return ld_reads(ld_declare(b, name, in, ops, s, out, HPU_F32, 0, NULL), 3, 0);
}

hpu_layer *hpu_cross_entropy(hpu_builder *b, const char *name, const char *in, const char *out)
{
	hpu_layer *l = logits_labels(b, name, in, out, &xent_ops);
	if (l) {
		const xent *s = hpu_layer_user(l);
		hpu_layer_memory(l, s->positions, 0, 0, 0);
		/* its gradient is elementwise: written over the logits where
		 * nothing reads them after it (a language model's head: one
		 * [batch, positions, classes] buffer fewer) */
		hpu_layer_backward_in_place(l, 1u);
	}
	return l;
}

/* ---- accuracy ---- */

/* The fraction of a sample's counted positions whose first arg-max is the
 * label (0 when all are ignored). */
static int accuracy_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			    hpu_tensor *out)
{
	const xent *s = hpu_layer_user(l);
	long bad;
	int32_t y;
	int rc = hpu_accuracy_positions_forward(hpu_f32(&in[0]), hpu_i32(&in[1]),
						hpu_f32(&out[0]), in[0].batch, s->positions,
						s->classes, &bad, &y);
	return label_check(l, c, s, rc, bad, y);
}

/* No backward: a metric. The builder then refuses a loss that depends on
 * it at setup ("no backward function"), rather than a step failing. */
static const hpu_layer_ops accuracy_ops = {
	.forward = accuracy_forward,
	.destroy = free,
};

hpu_layer *hpu_accuracy(hpu_builder *b, const char *name, const char *in, const char *out)
{
	return logits_labels(b, name, in, out, &accuracy_ops);
}

/* ---- mean squared error ---- */

static int mse_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	(void)c;
	return ld_op(l,
		     hpu_mse_forward(hpu_f32(&in[0]), hpu_f32(&in[1]), hpu_f32(&out[0]),
				     in[0].batch, in[0].sample_numel),
		     "mean squared error");
}

/* dpred = dloss * 2 (pred - target) / n; dtarget = -dpred. */
static int mse_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)c, (void)out;
	return ld_op(l,
		     hpu_mse_backward(hpu_f32(&in[0]), hpu_f32(&in[1]), hpu_f32(&dout[0]),
				      din[0].data ? hpu_f32(&din[0]) : NULL,
				      din[1].data ? hpu_f32(&din[1]) : NULL, in[0].batch,
				      in[0].sample_numel),
		     "mean squared error's backward");
}

static const hpu_layer_ops mse_ops = {.forward = mse_forward, .backward = mse_backward};

hpu_layer *hpu_mse(hpu_builder *b, const char *name, const char *in, const char *out)
{
	char pn[HPU_NAME_MAX], tn[HPU_NAME_MAX];
	hpu_tensor p, t;
	if (ld_split2(b, name, in, "pred,target", pn, tn) < 0 ||
	    ld_input(b, name, pn, HPU_F32, &p) < 0 || ld_input(b, name, tn, HPU_F32, &t) < 0)
		return NULL;
	if (p.ndim != t.ndim || memcmp(p.shape, t.shape, (size_t)p.ndim * sizeof *p.shape)) {
		hpu_error(b, "layer %s: its prediction %s and target %s differ in shape (%zu and %zu values "
			  "a sample, %d and %d dimensions)", ld_str(name), pn, tn, p.sample_numel,
			  t.sample_numel, p.ndim, t.ndim);
		return NULL;
	}
	hpu_layer *l = hpu_layer_add(b, name, in, &mse_ops, NULL);
	if (!l || hpu_layer_output(l, out, HPU_F32, 0, NULL) < 0)
		return NULL;
	return ld_reads(l, 3, 0); /* backward: both inputs, not the loss */
}
