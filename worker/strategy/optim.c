#include "worker/strategy/optim.h"

#include <math.h>

#include "worker/device/device.h"

/* The optimizers' state and step counts stay here, on the host; the
 * update itself is the device's (hpu__dev_optim_update, whose CPU
 * implementation in worker/device/device_ops.c is the fused pass this
 * file used to hold): each call below is one device call, so the
 * parameters, gradients and state may be device memory the host cannot
 * read. */

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

/* The step's scalars as the device's update takes them. */
static hpu__dev_optim scalars(const hpu_optim *o, float gscale, double lr)
{
	hpu__dev_optkind kind = HPU__DEV_SGD;
	switch (o->kind) {
	case HPU_OPTIM_ADAM:
		kind = HPU__DEV_ADAM;
		break;
	case HPU_OPTIM_ADAMW:
		kind = HPU__DEV_ADAMW;
		break;
	case HPU_OPTIM_SGD:
		break;
	}
	return (hpu__dev_optim){
		.kind = kind,
		.momentum = o->momentum,
		.weight_decay = o->weight_decay,
		.beta1 = o->beta1,
		.beta2 = o->beta2,
		.eps = o->eps,
		.nesterov = o->nesterov,
		.t = o->t,
		.lr = lr,
		.gscale = gscale,
		.sv = o->sv,
	};
}

void hpu__optim_step(hpu_optim *o, float *p, const float *g, float gscale,
		     double lr)
{
	o->t++;
	hpu__optim_range(o, 0, o->n, p, g, gscale, lr);
}

void hpu__optim_begin(hpu_optim *o)
{
	o->t++;
}

void hpu__optim_range(hpu_optim *o, size_t from, size_t n, float *p, const float *g,
		      float gscale, double lr)
{
	hpu__dev_optim k = scalars(o, gscale, lr);
	hpu__dev_optim_update(&k, p, g, o->m ? o->m + from : NULL, o->v ? o->v + from : NULL, n);
}

void hpu__optim_range16(hpu_optim *o, size_t from, size_t n, float *p, const uint16_t *g16,
			uint16_t *p16, int fp16, float *scratch, size_t chunk, float gscale,
			double lr)
{
	hpu__dev_optim k = scalars(o, gscale, lr);
	hpu__dev_optim_update16(&k, fp16, p, g16, p16, o->m ? o->m + from : NULL,
				o->v ? o->v + from : NULL, n, scratch, chunk);
}

void hpu__optim_range_host(hpu_optim *o, size_t from, size_t n, float *p, const float *g,
			   float gscale, double lr)
{
	hpu__dev_optim k = scalars(o, gscale, lr);
	k.sv = NULL;
	hpu__dev_host_rt()->optim(&k, p, g, o->m ? o->m + from : NULL, o->v ? o->v + from : NULL,
				  n);
}

void hpu__optim_range16_host(hpu_optim *o, size_t from, size_t n, float *p,
			     const uint16_t *g16, uint16_t *p16, int fp16, float *scratch,
			     size_t chunk, float gscale, double lr)
{
	hpu__dev_optim k = scalars(o, gscale, lr);
	k.sv = NULL;
	hpu__dev_host_rt()->optim16(&k, fp16, p, g16, p16, o->m ? o->m + from : NULL,
				    o->v ? o->v + from : NULL, n, scratch, chunk);
}

double hpu__sumsq(const float *g, size_t n)
{
	return hpu__dev_sumsq(g, n);
}

/* torch 1.13 computes this on fp32 tensors: total_norm + 1e-6, then
 * max_norm / that as reciprocal() * max_norm, then clamp(max=1.0), which
 * keeps NaN (a NaN norm gives a NaN factor, as in torch). */
float hpu__clip_factor(double norm, double max_norm)
{
	return hpu__dev_clip_factor(norm, max_norm);
}
