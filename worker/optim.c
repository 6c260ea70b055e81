#include "optim.h"

#include <math.h>
#include <stdlib.h>

int hpu_optim_init(hpu_optim *o, const hpu_train_opts *opts, size_t n)
{
	*o = (hpu_optim){
		.kind = opts->optimizer,
		.lr = opts->lr,
		.momentum = opts->momentum,
		.weight_decay = hpu_opts_weight_decay(opts),
		.beta1 = opts->beta1,
		.beta2 = opts->beta2,
		.eps = opts->eps,
		.nesterov = opts->nesterov,
		.n = n,
	};
	o->m = calloc(n ? n : 1, sizeof(float));
	if (o->kind == HPU_OPTIM_ADAMW)
		o->v = calloc(n ? n : 1, sizeof(float));
	if (!o->m || (o->kind == HPU_OPTIM_ADAMW && !o->v)) {
		hpu_optim_free(o);
		return -1;
	}
	return 0;
}

/* torch.optim.SGD: g += wd*p; buf = mu*buf + g (buf = g at first);
 * p -= lr * (nesterov ? g + mu*buf : buf). */
static void sgd_step(hpu_optim *o, float *p, const float *g)
{
	const float lr = (float)o->lr, mu = (float)o->momentum,
		    wd = (float)o->weight_decay;
	float *buf = o->m;
	const int first = o->t == 1;
	for (size_t i = 0; i < o->n; i++) {
		float d = g[i] + wd * p[i];
		if (mu != 0) {
			buf[i] = first ? d : mu * buf[i] + d;
			d = o->nesterov ? d + mu * buf[i] : buf[i];
		}
		p[i] -= lr * d;
	}
}

/* torch.optim.AdamW: p *= 1 - lr*wd; m, v moments; p -= lr/bc1 * m /
 * (sqrt(v)/sqrt(bc2) + eps). */
static void adamw_step(hpu_optim *o, float *p, const float *g)
{
	/* 1 - beta in double, then rounded: (1 - (float)0.999) is off by 1e-5. */
	const float b1 = (float)o->beta1, b2 = (float)o->beta2;
	const float c1 = (float)(1.0 - o->beta1), c2 = (float)(1.0 - o->beta2);
	const float decay = (float)(1.0 - o->lr * o->weight_decay);
	const float step = (float)(o->lr / (1.0 - pow(o->beta1, (double)o->t)));
	const float inv_sqrt_bc2 =
		(float)(1.0 / sqrt(1.0 - pow(o->beta2, (double)o->t)));
	const float eps = (float)o->eps;
	float *m = o->m, *v = o->v;
	for (size_t i = 0; i < o->n; i++) {
		float gi = g[i];
		m[i] = b1 * m[i] + c1 * gi;
		v[i] = b2 * v[i] + c2 * gi * gi;
		p[i] = p[i] * decay - step * m[i] / (sqrtf(v[i]) * inv_sqrt_bc2 + eps);
	}
}

void hpu_optim_step(hpu_optim *o, float *p, const float *g)
{
	o->t++;
	if (o->kind == HPU_OPTIM_ADAMW)
		adamw_step(o, p, g);
	else
		sgd_step(o, p, g);
}

void hpu_optim_free(hpu_optim *o)
{
	free(o->m);
	free(o->v);
	o->m = o->v = NULL;
}
