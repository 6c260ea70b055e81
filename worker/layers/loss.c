/* Losses and metrics: one f32 value per sample (ndim 0). Softmax
 * cross-entropy and accuracy read "logits,labels" (logits [..., C] f32,
 * labels i32 [...], -100 ignored as torch's ignore_index); MSE reads
 * "pred,target". Loops here rather than ops: the ops' softmax_xent is a
 * batch mean without ignore_index, and a per-sample mean over a variable
 * number of positions is none of theirs. Sums are in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>

#include "worker/layers/decl.h"

#define IGNORE_INDEX (-100)

enum { LABEL_IGNORED = -1, LABEL_BAD = -2 };

typedef struct xent {
	int classes;
	size_t positions; /* labels per sample */
} xent;

/* The label at position p of row r, checked: its class, LABEL_IGNORED,
 * or LABEL_BAD (the layer's error naming it) when out of range. */
static int label_at(hpu_layer *l, const hpu_ctx *c, const xent *s, const int32_t *labels,
		    int r, size_t p)
{
	int32_t y = labels[(size_t)r * s->positions + p];
	if (y == IGNORE_INDEX)
		return LABEL_IGNORED;
	if (y < 0 || y >= s->classes) {
		hpu_layer_error(l, "layer %s: label %d at row %d (dataset sample %lu), "
				       "position %zu is outside [0, %d) and not %d (ignored)",
				       hpu_layer_name(l), (int)y, r,
				       c->samples ? (unsigned long)c->samples[r] : (unsigned long)r,
				       p, s->classes, IGNORE_INDEX);
		return LABEL_BAD;
	}
	return y;
}

/* log(sum(exp(x[0 .. n)))), stable. */
static double logsumexp(const float *x, int n)
{
	float m = x[0];
	for (int j = 1; j < n; j++)
		if (x[j] > m)
			m = x[j];
	double s = 0;
	for (int j = 0; j < n; j++)
		s += exp((double)x[j] - (double)m);
	return (double)m + log(s);
}

/* ---- softmax cross-entropy ---- */

/* Saved: each position's log-sum-exp (f32), for backward's softmax. */
static int xent_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	const xent *s = hpu_layer_user(l);
	const float *logits = hpu_f32(&in[0]);
	const int32_t *labels = hpu_i32(&in[1]);
	float *lse = hpu_saved(l), *loss = hpu_f32(&out[0]);
	for (int r = 0; r < in[0].batch; r++) {
		double sum = 0;
		size_t n = 0;
		for (size_t p = 0; p < s->positions; p++) {
			size_t at = (size_t)r * s->positions + p;
			const float *x = logits + at * (size_t)s->classes;
			int y = label_at(l, c, s, labels, r, p);
			if (y == LABEL_BAD)
				return HPU_ERROR;
			if (y == LABEL_IGNORED) {
				lse[at] = 0;
				continue;
			}
			double z = logsumexp(x, s->classes);
			lse[at] = (float)z;
			sum += z - (double)x[y];
			n++;
		}
		loss[r] = n ? (float)(sum / (double)n) : 0.0f;
	}
	return 0;
}

/* dlogits = dloss / n * (softmax(x) - onehot(y)) at the n counted
 * positions, 0 at the ignored ones. */
static int xent_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			 const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	const xent *s = hpu_layer_user(l);
	const float *logits = hpu_f32(&in[0]), *lse = hpu_saved(l), *dloss = hpu_f32(&dout[0]);
	const int32_t *labels = hpu_i32(&in[1]);
	float *dx = hpu_f32(&din[0]);
	(void)c, (void)out;
	if (!dx)
		return 0;
	size_t C = (size_t)s->classes;
	for (int r = 0; r < in[0].batch; r++) {
		const int32_t *yr = labels + (size_t)r * s->positions;
		size_t n = 0;
		for (size_t p = 0; p < s->positions; p++)
			n += yr[p] != IGNORE_INDEX;
		float g = n ? dloss[r] / (float)n : 0.0f;
		for (size_t p = 0; p < s->positions; p++) {
			size_t at = (size_t)r * s->positions + p;
			const float *x = logits + at * C;
			float *d = dx + at * C;
			if (yr[p] == IGNORE_INDEX) {
				memset(d, 0, C * sizeof *d);
				continue;
			}
			for (size_t j = 0; j < C; j++)
				d[j] = g * expf(x[j] - lse[at]);
			d[yr[p]] -= g;
		}
	}
	return 0;
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
	return ld_declare(b, name, in, ops, s, out, HPU_F32, 0, NULL);
}

hpu_layer *hpu_cross_entropy(hpu_builder *b, const char *name, const char *in, const char *out)
{
	hpu_layer *l = logits_labels(b, name, in, out, &xent_ops);
	if (l) {
		const xent *s = hpu_layer_user(l);
		hpu_layer_memory(l, s->positions, 0, 0, 0);
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
	const float *logits = hpu_f32(&in[0]);
	const int32_t *labels = hpu_i32(&in[1]);
	float *acc = hpu_f32(&out[0]);
	for (int r = 0; r < in[0].batch; r++) {
		size_t n = 0, right = 0;
		for (size_t p = 0; p < s->positions; p++) {
			size_t at = (size_t)r * s->positions + p;
			const float *x = logits + at * (size_t)s->classes;
			int y = label_at(l, c, s, labels, r, p);
			if (y == LABEL_BAD)
				return HPU_ERROR;
			if (y == LABEL_IGNORED)
				continue;
			int best = 0;
			for (int j = 1; j < s->classes; j++)
				if (x[j] > x[best])
					best = j;
			right += best == y;
			n++;
		}
		acc[r] = n ? (float)((double)right / (double)n) : 0.0f;
	}
	return 0;
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
	(void)l, (void)c;
	size_t n = in[0].sample_numel;
	float *loss = hpu_f32(&out[0]);
	for (int r = 0; r < in[0].batch; r++) {
		ld_pair_row x = ld_pair_at(in, NULL, r);
		double s = 0;
		for (size_t i = 0; i < n; i++) {
			double d = (double)x.p[i] - (double)x.t[i];
			s += d * d;
		}
		loss[r] = (float)(s / (double)n);
	}
	return 0;
}

/* dpred = dloss * 2 (pred - target) / n; dtarget = -dpred. */
static int mse_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)l, (void)c, (void)out;
	size_t n = in[0].sample_numel;
	for (int r = 0; r < in[0].batch; r++) {
		ld_pair_row x = ld_pair_at(in, din, r);
		float g = 2.0f * hpu_f32(&dout[0])[r] / (float)n;
		for (size_t i = 0; i < n; i++) {
			float d = g * (x.p[i] - x.t[i]);
			if (x.dp)
				x.dp[i] = d;
			if (x.dt)
				x.dt[i] = -d;
		}
	}
	return 0;
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
		hpu_error(b, "layer %s: pred %s and target %s differ in shape (%zu and %zu values "
			  "a sample, %d and %d dimensions)", ld_str(name), pn, tn, p.sample_numel,
			  t.sample_numel, p.ndim, t.ndim);
		return NULL;
	}
	hpu_layer *l = hpu_layer_add(b, name, in, &mse_ops, NULL);
	if (!l || hpu_layer_output(l, out, HPU_F32, 0, NULL) < 0)
		return NULL;
	return l;
}
