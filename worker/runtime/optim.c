#include "worker/runtime/optim.h"

#include <math.h>

#include "common/simd.h"

/* Every step is one pass over the n parameters, in fp32 the way torch does
 * it after clip_grad_norm_: the gradient is first scaled by gscale (rounded
 * to fp32, as g.mul_(clip_coef) leaves it), then weight decay, moments and
 * the update. Scalars that torch computes in Python (double) are computed in
 * double here and rounded once. This file is compiled -O3 -fno-math-errno:
 * keep the loops free of calls and branches that depend on i. */

int hpu__optim_state_floats(const hpu_train_opts *opts)
{
	switch (opts->optimizer) {
	case HPU_OPTIM_ADAM:
	case HPU_OPTIM_ADAMW:
		return 2;
	case HPU_OPTIM_SGD:
		break;
	}
	return opts->momentum != 0.0 ? 1 : 0;
}

void hpu__optim_init(hpu_optim *o, const hpu_train_opts *opts, size_t n,
		     float *state)
{
	int floats = hpu__optim_state_floats(opts);
	*o = (hpu_optim){
		.kind = opts->optimizer,
		.momentum = opts->momentum,
		.weight_decay = hpu__opts_weight_decay(opts),
		.beta1 = opts->beta1,
		.beta2 = opts->beta2,
		.eps = opts->eps,
		.nesterov = opts->nesterov,
		.n = n,
	};
	if (floats >= 1)
		o->m = state;
	if (floats >= 2)
		o->v = state + n;
}

/* torch.optim.SGD (dampening 0): d = g + wd*p; buf = d at the first step,
 * else mu*buf + d; d = nesterov ? d + mu*buf : buf; p -= lr*d. */
HPU_CLONES static void sgd_step(hpu_optim *o, float *p, const float *g, float gscale,
		     double lr_d)
{
	const float lr = (float)lr_d, mu = (float)o->momentum,
		    wd = (float)o->weight_decay;
	float *buf = o->m;
	const size_t n = o->n;
	if (mu == 0.0f) {
		for (size_t i = 0; i < n; i++) {
			float gi = gscale * g[i];
			p[i] -= lr * (gi + wd * p[i]);
		}
		return;
	}
	const int first = o->t == 1, nesterov = o->nesterov;
	for (size_t i = 0; i < n; i++) {
		float gi = gscale * g[i];
		float d = gi + wd * p[i];
		buf[i] = first ? d : mu * buf[i] + d;
		d = nesterov ? d + mu * buf[i] : buf[i];
		p[i] -= lr * d;
	}
}

/* The scalars of one Adam / AdamW step. */
typedef struct adam_k {
	float b1, b2, c1, c2; /* beta and 1 - beta (in double, then rounded:
			       * 1 - (float)0.999 is off by 1e-5) */
	float decay;          /* AdamW: 1 - lr*wd; Adam: 1 */
	float l2;             /* Adam: wd added to g as wd*p; AdamW: 0 */
	float step;           /* lr / (1 - beta1^t) */
	float inv_sqrt_bc2;   /* 1 / sqrt(1 - beta2^t) */
	float eps;
} adam_k;

/* m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
 * p = p*decay - step * m / (sqrt(v)/sqrt(bc2) + eps), with g = gscale*g
 * (+ wd*p for Adam). `l2` is a constant at each call site, so the compiler
 * makes one loop of each without the test inside. */
static inline void adam_pass(const adam_k *k, int l2, float *p, const float *g,
			     float *m, float *v, size_t n, float gscale)
{
	const float b1 = k->b1, b2 = k->b2, c1 = k->c1, c2 = k->c2;
	const float decay = k->decay, wd = k->l2, step = k->step,
		    inv_sqrt_bc2 = k->inv_sqrt_bc2, eps = k->eps;
	for (size_t i = 0; i < n; i++) {
		float gi = gscale * g[i];
		if (l2)
			gi = gi + wd * p[i];
		m[i] = b1 * m[i] + c1 * gi;
		v[i] = b2 * v[i] + c2 * gi * gi;
		float pi = l2 ? p[i] : p[i] * decay;
		p[i] = pi - step * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
	}
}

HPU_CLONES static void adam_l2(const adam_k *k, float *p, const float *g, float *m,
				float *v, size_t n, float gscale)
{
	adam_pass(k, 1, p, g, m, v, n, gscale);
}

HPU_CLONES static void adam_decoupled(const adam_k *k, float *p, const float *g,
				       float *m, float *v, size_t n, float gscale)
{
	adam_pass(k, 0, p, g, m, v, n, gscale);
}

/* torch.optim.Adam (L2: g += wd*p) and torch.optim.AdamW (decoupled:
 * p *= 1 - lr*wd), amsgrad off. */
static void adam_step(hpu_optim *o, float *p, const float *g, float gscale,
		      double lr)
{
	const int l2 = o->kind == HPU_OPTIM_ADAM;
	const double t = (double)o->t;
	const adam_k k = {
		.b1 = (float)o->beta1,
		.b2 = (float)o->beta2,
		.c1 = (float)(1.0 - o->beta1),
		.c2 = (float)(1.0 - o->beta2),
		.decay = l2 ? 1.0f : (float)(1.0 - lr * o->weight_decay),
		.l2 = l2 ? (float)o->weight_decay : 0.0f,
		.step = (float)(lr / (1.0 - pow(o->beta1, t))),
		.inv_sqrt_bc2 = (float)(1.0 / sqrt(1.0 - pow(o->beta2, t))),
		.eps = (float)o->eps,
	};
	if (l2)
		adam_l2(&k, p, g, o->m, o->v, o->n, gscale);
	else
		adam_decoupled(&k, p, g, o->m, o->v, o->n, gscale);
}

void hpu__optim_step(hpu_optim *o, float *p, const float *g, float gscale,
		     double lr)
{
	o->t++;
	switch (o->kind) {
	case HPU_OPTIM_ADAM:
	case HPU_OPTIM_ADAMW:
		adam_step(o, p, g, gscale, lr);
		return;
	case HPU_OPTIM_SGD:
		break;
	}
	sgd_step(o, p, g, gscale, lr);
}

void hpu__optim_begin(hpu_optim *o)
{
	o->t++;
}

void hpu__optim_range(hpu_optim *o, size_t from, size_t n, float *p, const float *g,
		      float gscale, double lr)
{
	hpu_optim view = *o;
	view.n = n;
	view.m = o->m ? o->m + from : NULL;
	view.v = o->v ? o->v + from : NULL;
	if (o->kind == HPU_OPTIM_SGD)
		sgd_step(&view, p, g, gscale, lr);
	else
		adam_step(&view, p, g, gscale, lr);
}

/* Squares summed in fp32 within blocks of SUMSQ_BLOCK elements, over
 * SUMSQ_LANES independent accumulators (so that the loop vectorizes and
 * each accumulator adds only SUMSQ_BLOCK / SUMSQ_LANES terms: relative
 * error below 2e-6, ~1e-9 typically), each block's sum then added in
 * double: 1.5x a double loop's speed in cache, the same from memory. A
 * block whose fp32 sum overflows (an |g| above ~1e19) is summed again in
 * double, so the result overflows only where a double would. Squares below
 * FLT_MIN (|g| < 1e-19) lose precision in fp32: the absolute error is at
 * most n * 1.2e-38, far below anything clipping (norm + 1e-6) can see. */
#define SUMSQ_LANES 16
#define SUMSQ_BLOCK 256

static double sumsq_double(const float *g, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++)
		s += (double)g[i] * (double)g[i];
	return s;
}

static inline float sumsq_block(const float *g)
{
	float acc[SUMSQ_LANES] = {0};
	for (size_t j = 0; j < SUMSQ_BLOCK; j += SUMSQ_LANES)
		for (size_t l = 0; l < SUMSQ_LANES; l++)
			acc[l] += g[j + l] * g[j + l];
	for (size_t w = SUMSQ_LANES / 2; w > 0; w /= 2) /* pairwise */
		for (size_t l = 0; l < w; l++)
			acc[l] += acc[l + w];
	return acc[0];
}

HPU_CLONES double hpu__sumsq(const float *g, size_t n)
{
	double total = 0.0;
	size_t i = 0;
	for (; i + SUMSQ_BLOCK <= n; i += SUMSQ_BLOCK) {
		float b = sumsq_block(g + i);
		/* inf or NaN: redo in double (NaN stays NaN) */
		total += isfinite(b) ? (double)b : sumsq_double(g + i, SUMSQ_BLOCK);
	}
	return total + sumsq_double(g + i, n - i);
}

/* torch 1.13 computes this on fp32 tensors: total_norm + 1e-6, then
 * max_norm / that as reciprocal() * max_norm, then clamp(max=1.0), which
 * keeps NaN (a NaN norm gives a NaN factor, as in torch). */
float hpu__clip_factor(double norm, double max_norm)
{
	float denom = (float)norm + (float)1e-6;
	float coef = (1.0f / denom) * (float)max_norm;
	return coef > 1.0f ? 1.0f : coef;
}
