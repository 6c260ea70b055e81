/* Normalization layers: layer norm (over the last dimension) and batch
 * norm (per channel, with running statistics in buffers).
 *
 * Layer norm runs on the layernorm op. Batch norm is plain loops here:
 * its statistics cross the batch, which no op of <hpu/ops.h> covers; it
 * sums in double so a large batch * H * W loses nothing to fp32.
 */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>

#include "worker/layers/decl.h"

/* ---- layer norm ---- */

typedef struct layernorm {
	int cols;   /* the last dimension */
	size_t rows; /* rows of `cols` per sample */
	float eps;
} layernorm;

/* Saved: mean[rows], then rstd[rows] of the micro-batch. In evaluation
 * (nothing saved, or no saved memory given) they go to scratch. */
static int layernorm_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			     hpu_tensor *out)
{
	const layernorm *s = hpu_layer_user(l);
	if (!ld_fits_int(c->batch, s->rows * s->cols))
		return hpu_layer_error(l, "a micro-batch of %d is too large for the layernorm op",
				       c->batch);
	int rows = c->batch * (int)s->rows;
	float *stats = hpu_saved(l);
	if (!stats)
		stats = hpu_scratch(l);
	hpu_layernorm_forward(hpu_f32(&in[0]), hpu_param(l, 0), hpu_param(l, 1), hpu_f32(&out[0]),
			      stats, stats + rows, rows, s->cols, s->eps);
	return HPU_OK;
}

static int layernorm_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			      const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)out;
	const layernorm *s = hpu_layer_user(l);
	int rows = c->batch * (int)s->rows;
	const float *stats = hpu_saved(l);
	/* the op always writes dx: scratch takes it when nobody wants it */
	float *dx = din[0].data ? hpu_f32(&din[0]) : hpu_scratch(l);
	hpu_layernorm_backward(hpu_f32(&in[0]), hpu_param(l, 0), stats, stats + rows,
			       hpu_f32(&dout[0]), dx, hpu_grad(l, 0), hpu_grad(l, 1), rows,
			       s->cols);
	return HPU_OK;
}

static const hpu_layer_ops layernorm_ops = {
	.forward = layernorm_forward,
	.backward = layernorm_backward,
	.destroy = free,
};

static hpu_layer *layernorm_impl(hpu_builder *b, const char *name, const char *in, const char *out,
			 float eps)
{
	hpu_tensor t;
	if (ld_input(b, name, in, HPU_F32, &t) < 0)
		return NULL;
	if (t.ndim < 1) {
		hpu_error(b, "layer %s: input %s has one value per sample; layer norm needs a "
			  "last dimension to normalize over", ld_str(name), in);
		return NULL;
	}
	if (!isfinite(eps) || eps < 0) {
		hpu_error(b, "layer %s: eps %g must be finite and >= 0 (0: the default, 1e-5)", ld_str(name), eps);
		return NULL;
	}
	int64_t n = t.shape[t.ndim - 1];
	if (!ld_fits_int(hpu_max_batch(b) > 0 ? hpu_max_batch(b) : 0, t.sample_numel)) {
		hpu_error(b, "layer %s: %zu values per sample times the largest micro-batch (%d) "
			  "exceed the layernorm op's int sizes", ld_str(name), t.sample_numel,
			  hpu_max_batch(b));
		return NULL;
	}
	layernorm *s = malloc(sizeof *s);
	if (s)
		*s = (layernorm){.cols = (int)n, .rows = t.sample_numel / (size_t)n, .eps = eps};
	/* backward: the input and the saved statistics */
	hpu_layer *l = ld_reads(
		ld_declare(b, name, in, &layernorm_ops, s, out, HPU_F32, t.ndim, t.shape), 1, 0);
	if (!l)
		return NULL;
	if (hpu_param_add(l, "weight", 1, &n, HPU_INIT(ONES)) < 0 ||
	    hpu_param_add(l, "bias", 1, &n, HPU_INIT(ZEROS)) < 0)
		return NULL;
	/* scratch: dx nobody wants in backward, or the statistics of a
	 * forward without saved memory */
	size_t scratch = t.sample_numel > 2 * s->rows ? t.sample_numel : 2 * s->rows;
	hpu_layer_memory(l, 2 * s->rows, 0, scratch, 0);
	return l;
}

/* ---- batch norm ---- */

typedef struct batchnorm {
	int ch;         /* C */
	size_t spatial; /* values per channel per sample: H * W (1 for [C]) */
	float eps, momentum;
} batchnorm;

#define NO_KERNEL(l)                                                                         \
	hpu_layer_error(l, "layer %s: this device's kernel table has no batch norm kernel",  \
			hpu_layer_name(l))

/* Training: the batch's statistics (mean and rstd saved for backward),
 * and the running statistics updated as torch does -- running = (1 -
 * momentum) * running + momentum * stat, the variance unbiased (m / (m -
 * 1)) -- except in a recomputed forward (activation checkpointing): the
 * first forward of the micro-batch updated them already, and a second
 * update would count the batch twice. Evaluation: the running
 * statistics, nothing saved. */
static int batchnorm_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			     hpu_tensor *out)
{
	const batchnorm *s = hpu_layer_user(l);
	const float *x = hpu_f32(&in[0]), *w = hpu_param(l, 0), *bias = hpu_param(l, 1);
	float *y = hpu_f32(&out[0]), *run_mean = hpu_buffer(l, 0), *run_var = hpu_buffer(l, 1);
	if (c->train && (double)c->batch * s->spatial < 2)
		return hpu_layer_error(l, "training needs more than one value per channel to "
				       "normalize with (a micro-batch of %d, %zu per channel per "
				       "sample), as torch's BatchNorm does", c->batch, s->spatial);
	if (hpu_batchnorm_forward(x, y, w, bias, run_mean, run_var, hpu_saved(l), c->batch, s->ch,
				  s->spatial, s->eps, s->momentum, c->train, !c->recompute))
		return NO_KERNEL(l);
	return HPU_OK;
}

/* Through the batch statistics, with xhat = (x - mean) * rstd over the m
 * = batch * spatial values of a channel:
 *   dbias += sum dy, dweight += sum dy * xhat,
 *   dx = weight * rstd * (dy - sum(dy) / m - xhat * sum(dy * xhat) / m). */
static int batchnorm_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			      const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)out;
	const batchnorm *s = hpu_layer_user(l);
	if (hpu_batchnorm_backward(hpu_f32(&in[0]), hpu_f32(&dout[0]), hpu_param(l, 0),
				   hpu_saved(l), hpu_grad(l, 0), hpu_grad(l, 1), hpu_f32(&din[0]),
				   c->batch, s->ch, s->spatial))
		return NO_KERNEL(l);
	return HPU_OK;
}

static const hpu_layer_ops batchnorm_ops = {
	.forward = batchnorm_forward,
	.backward = batchnorm_backward,
	.destroy = free,
};

static hpu_layer *batchnorm_impl(hpu_builder *b, const char *name, const char *in, const char *out,
			 float eps, float momentum, hpu_buffer_sync sync)
{
	hpu_tensor t;
	if (ld_input(b, name, in, HPU_F32, &t) < 0)
		return NULL;
	if (t.ndim < 1 || t.ndim > 3) {
		hpu_error(b, "layer %s: input %s has %d dimensions per sample; batch norm takes "
			  "[C], [C, L] or [C, H, W]", ld_str(name), in, t.ndim);
		return NULL;
	}
	if (!isfinite(eps) || eps < 0) {
		hpu_error(b, "layer %s: eps %g must be finite and >= 0 (0: the default, 1e-5)", ld_str(name), eps);
		return NULL;
	}
	if (!(momentum >= 0 && momentum <= 1)) {
		hpu_error(b, "layer %s: momentum %g must be in [0, 1] (0: the default, 0.1)", ld_str(name), momentum);
		return NULL;
	}
	if (sync != HPU_BUFFER_BROADCAST && sync != HPU_BUFFER_MEAN && sync != HPU_BUFFER_LOCAL) {
		hpu_error(b, "layer %s: buffer sync %d is not an hpu_buffer_sync", ld_str(name),
			  (int)sync);
		return NULL;
	}
	if (t.shape[0] > INT_MAX) {
		hpu_error(b, "layer %s: %lld channels are too many", ld_str(name),
			  (long long)t.shape[0]);
		return NULL;
	}
	int64_t ch = t.shape[0];
	batchnorm *s = malloc(sizeof *s);
	if (s)
		*s = (batchnorm){.ch = (int)ch, .spatial = t.sample_numel / (size_t)ch, .eps = eps,
				 .momentum = momentum};
	/* backward: the input and the saved statistics */
	hpu_layer *l = ld_reads(
		ld_declare(b, name, in, &batchnorm_ops, s, out, HPU_F32, t.ndim, t.shape), 1, 0);
	if (!l)
		return NULL;
	if (hpu_param_add(l, "weight", 1, &ch, HPU_INIT(ONES)) < 0 ||
	    hpu_param_add(l, "bias", 1, &ch, HPU_INIT(ZEROS)) < 0 ||
	    hpu_buffer_add(l, "running_mean", 1, &ch, HPU_INIT(ZEROS), sync) < 0 ||
	    hpu_buffer_add(l, "running_var", 1, &ch, HPU_INIT(ONES), sync) < 0)
		return NULL;
	hpu_layer_memory(l, 0, 2 * (size_t)ch, 0, 0); /* the batch's mean, rstd */
	return l;
}

/* ---- ABI 3's options structs, and ABI 2's positional forms (deprecated) ---- */

hpu_layer *hpu_layernorm_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_layernorm_opts o)
{
	return layernorm_impl(b, name, in, out, o.eps != 0 ? o.eps : 1e-5f);
}

hpu_layer *(hpu_layernorm)(hpu_builder *b, const char *name, const char *in, const char *out, float eps)
{
	return layernorm_impl(b, name, in, out, eps);
}

hpu_layer *hpu_batchnorm_v3(hpu_builder *b, const char *name, const char *in, const char *out, hpu_batchnorm_opts o)
{
	return batchnorm_impl(b, name, in, out, o.eps != 0 ? o.eps : 1e-5f,
			      o.momentum != 0 ? o.momentum : 0.1f, o.sync);
}

hpu_layer *(hpu_batchnorm)(hpu_builder *b, const char *name, const char *in, const char *out, float eps, float momentum, hpu_buffer_sync sync)
{
	return batchnorm_impl(b, name, in, out, eps, momentum, sync);
}
