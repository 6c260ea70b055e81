/* The sigmoid and the binary cross-entropy losses: one f32 value per
 * sample (ndim 0), the mean over the sample's elements, as
 * torch.nn.BCEWithLogitsLoss and BCELoss (log clamped at -100) give per
 * element. Sums are in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>

#include "worker/layers/decl.h"

#define LOG_FLOOR (-100.0) /* torch's clamp of BCELoss's logs */
#define BCE_EPS 1e-12      /* torch's floor under p (1 - p) in its backward */

/* ---- sigmoid ---- */

static int sigmoid_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			   hpu_tensor *out)
{
	(void)l, (void)c;
	hpu_sigmoid_forward(hpu_f32(&in[0]), hpu_f32(&out[0]), hpu_numel(&in[0]));
	return 0;
}

static int sigmoid_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			    const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)l, (void)c, (void)in;
	if (din[0].data)
		hpu_sigmoid_backward(hpu_f32(&out[0]), hpu_f32(&dout[0]), hpu_f32(&din[0]),
				     hpu_numel(&out[0]));
	return 0;
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
	return l;
}

/* ---- binary cross-entropy with logits ---- */

static int bcel_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	(void)l, (void)c;
	size_t n = in[0].sample_numel;
	for (int r = 0; r < in[0].batch; r++) {
		ld_pair_row x = ld_pair_at(in, NULL, r);
		double s = 0;
		for (size_t i = 0; i < n; i++) {
			double xi = x.p[i];
			s += (xi > 0 ? xi : 0) - xi * (double)x.t[i] + log1p(exp(-fabs(xi)));
		}
		hpu_f32(&out[0])[r] = (float)(s / (double)n);
	}
	return 0;
}

/* dlogits = dloss (sigmoid(x) - t) / n; dtarget = -dloss x / n. */
static int bcel_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			 const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)l, (void)c, (void)out;
	size_t n = in[0].sample_numel;
	for (int r = 0; r < in[0].batch; r++) {
		ld_pair_row x = ld_pair_at(in, din, r);
		float g = hpu_f32(&dout[0])[r] / (float)n, sg;
		for (size_t i = 0; i < n; i++) {
			hpu_sigmoid_forward(&x.p[i], &sg, 1);
			if (x.dp)
				x.dp[i] = g * (sg - x.t[i]);
			if (x.dt)
				x.dt[i] = -g * x.p[i];
		}
	}
	return 0;
}

static const hpu_layer_ops bcel_ops = {.forward = bcel_forward, .backward = bcel_backward};

/* ---- binary cross-entropy of probabilities ---- */

static double clamped_log(double v)
{
	double lg = log(v);
	return lg < LOG_FLOOR ? LOG_FLOOR : lg;
}

static int bce_forward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in, hpu_tensor *out)
{
	size_t n = in[0].sample_numel;
	for (int r = 0; r < in[0].batch; r++) {
		ld_pair_row x = ld_pair_at(in, NULL, r);
		const float *p = x.p, *t = x.t;
		double s = 0;
		for (size_t i = 0; i < n; i++) {
			if (!(p[i] >= 0.0f && p[i] <= 1.0f))
				return hpu_layer_error(l, "layer %s: probability %g at row %d "
						       "(dataset sample %lu), element %zu is "
						       "outside [0, 1]", hpu_layer_name(l),
						       (double)p[i], r,
						       c->samples ? (unsigned long)c->samples[r]
								  : (unsigned long)r, i);
			s -= (double)t[i] * clamped_log(p[i]) +
			     (1.0 - (double)t[i]) * clamped_log(1.0 - (double)p[i]);
		}
		hpu_f32(&out[0])[r] = (float)(s / (double)n);
	}
	return 0;
}

/* dprob = dloss (p - t) / max(p (1 - p), 1e-12) / n (torch's);
 * dtarget = -dloss (log p - log(1 - p)) / n, the logs clamped. */
static int bce_backward(hpu_layer *l, const hpu_ctx *c, const hpu_tensor *in,
			const hpu_tensor *out, const hpu_tensor *dout, hpu_tensor *din)
{
	(void)l, (void)c, (void)out;
	size_t n = in[0].sample_numel;
	for (int r = 0; r < in[0].batch; r++) {
		ld_pair_row x = ld_pair_at(in, din, r);
		double g = (double)hpu_f32(&dout[0])[r] / (double)n;
		for (size_t i = 0; i < n; i++) {
			double pi = x.p[i], q = pi * (1.0 - pi);
			if (x.dp)
				x.dp[i] = (float)(g * (pi - (double)x.t[i]) /
						  (q > BCE_EPS ? q : BCE_EPS));
			if (x.dt)
				x.dt[i] = (float)(-g * (clamped_log(pi) - clamped_log(1.0 - pi)));
		}
	}
	return 0;
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
	return l;
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
