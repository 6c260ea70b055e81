/* strategy_state: the values of the model states -- a unit's initial
 * parameters (initializers, --load-params or the checkpoint resumed) and
 * the global norm of the gradients the optimizer is to use. Stands on
 * strategy_base.c and strategy_ckpt.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "worker/ops/autocast.h"
#include "worker/device/device.h"
#include "worker/strategy/strategy_impl.h"

#define fail hpu__strat_fail

/* Layer i's initial parameters into dst: from --load-params, or from the
 * initializers. */
static int init_layer(hpu_strat *s, int i, float *dst)
{
	if (s->load_fd < 0)
		return hpu__model_init_layer(s->b, i, s->o->seed, dst, s->err, s->errlen);
	if (hpu__model_read_layer(s->b, i, s->load_fd, dst) < 0)
		return fail(s, "--load-params %s: cannot read the parameters of layer %s: %s",
			    s->o->load_params, s->b->layers[i]->name, strerror(errno));
	return 0;
}

/* Unit j's floats [c0, c1) of its initial parameters into buf, the rest
 * zero (hpu__strat_fill_unit's sources, a span of whole layers). */
int hpu__strat_fill_span(hpu_strat *s, int j, size_t c0, size_t c1, float *buf)
{
	unit *u = &s->u[j];
	hpu_builder *b = s->b;
	memset(buf, 0, (c1 - c0) * sizeof *buf); /* the unit's padding */
	if (s->resume) {
		size_t lo = 0, hi = u->len;
		if (hpu__strat_params_sharded(s) && !u->persistent) {
			lo = (size_t)s->rank * u->piece;
			hi = lo + u->piece;
		}
		size_t a = c0 > lo ? c0 : lo, e = c1 < hi ? c1 : hi;
		return a < e ? hpu__strat_read_layout(s, 0, u->off + a, e - a, buf + (a - c0)) : 0;
	}
	for (int i = u->first; i <= u->last; i++) {
		const hpu_layer *l = b->layers[i];
		size_t r0 = l->off - u->off;
		if (l->plen && r0 >= c0 && r0 + l->plen <= c1 &&
		    init_layer(s, i, buf + (r0 - c0)) < 0)
			return -1;
	}
	return 0;
}

/* Unit j's initial parameters into full[0 .. len): from the initializers,
 * --load-params, or (--resume) the checkpoint's master weights; a ZeRO-3
 * unit not kept whole reads only this rank's piece of the checkpoint. */
int hpu__strat_fill_unit(hpu_strat *s, int j, float *full)
{
	unit *u = &s->u[j];
	hpu_builder *b = s->b;
	if (s->resume) {
		size_t lo = 0, n = u->len;
		if (hpu__strat_params_sharded(s) && !u->persistent) {
			lo = (size_t)s->rank * u->piece;
			n = u->piece;
		}
		return hpu__strat_read_layout(s, 0, u->off + lo, n, full + lo);
	}
	for (int i = u->first; i <= u->last; i++)
		if (b->layers[i]->plen && init_layer(s, i, full + (b->layers[i]->off - u->off)) < 0)
			return -1;
	return 0;
}

