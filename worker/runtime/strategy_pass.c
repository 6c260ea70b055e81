/* strategy_pass: the forward and backward passes over the model's layers,
 * with the strategy's hooks around each layer: its parameters made ready
 * before it runs and let go after (ZeRO-3 gathers, mixed precision's fp32
 * copies), its gradients' buffers, a unit's gradient collective started
 * once the unit's backward is done, and the outputs activation
 * checkpointing dropped recomputed before backward needs them. */

#include <math.h>
#include <stddef.h>

#include "fp8.h"
#include "prof.h"
#include "strategy_impl.h"

#define fail hpu__strat_fail

/* Makes layer i's parameters ready for it, prefetching what follows in
 * direction dir (up to layer `stop`). */
static int acquire(hpu_strat *s, int i, int dir, int stop)
{
	if (s->mp)
		return hpu__mp_acquire(s, i, dir, stop);
	return hpu__zero_acquire(s, i, dir, stop);
}

/* After layer i's forward or backward: its parameters may go. */
static int release_layer(hpu_strat *s, int i)
{
	hpu_layer *l = s->b->layers[i];
	if (l->unit < 0)
		return 0;
	if (!s->mp)
		return hpu__zero_release(s, l->unit);
	hpu__mp_release_layer(s, i);
	return 0;
}

/* Tells the ops which layer runs (fp8's call sites; the 16-bit working
 * copy of its parameters for bf16 products), or that none does (i < 0). */
static void op_layer(hpu_strat *s, int i, int backward)
{
	if (i < 0) {
		hpu__op_layer(-1, NULL, NULL, 0, 0);
		hpu__ac_param16(NULL, NULL, 0, 0);
		return;
	}
	hpu_layer *l = s->b->layers[i];
	hpu__op_layer(i, l->name, l->pbase, l->plen, backward);
	hpu__ac_param16(l->pbase, s->mp ? s->l16[i] : NULL, l->plen, s->fp16);
}

static const float *input_of(hpu_strat *s, int i)
{
	return i ? s->acts[i - 1] : s->x;
}

/* Layer i's forward into acts[i], with its parameters gathered for it. */
static int layer_forward(hpu_strat *s, int i, int n, int stop)
{
	hpu_layer *l = s->b->layers[i];
	if (hpu__act_ensure(s, i) < 0 || acquire(s, i, +1, stop) < 0)
		return -1;
	int64_t t0 = hpu__prof_t0();
	op_layer(s, i, 0);
	int rc = l->ops.forward(l, input_of(s, i), s->acts[i], n);
	op_layer(s, -1, 0);
	hpu__prof_span(hpu__prof_in_eval ? "eval" : "forward",
		       hpu__prof_in_eval ? "eval_forward" : "forward", l->name, t0, "\"layer\":%d", i);
	if (rc != 0)
		return fail(s, "layer %s: forward failed: %s", l->name,
			    l->err[0] ? l->err : "(no reason given)");
	if (release_layer(s, i) < 0)
		return -1;
	if (i > 0 && s->transient[i - 1])
		hpu__act_drop(s, i - 1);
	else if (i > 0 && hpu__act_compress(s, i - 1, n) < 0)
		return -1;
	return 0;
}

int hpu_strat_forward(hpu_strat *s, const float *x, int n, const float **out)
{
	s->x = x;
	for (int i = 0; i < s->nlayers; i++)
		if (layer_forward(s, i, n, s->nlayers) < 0)
			return -1;
	*out = s->acts[s->nlayers - 1];
	return 0;
}

/* Activation checkpointing: before layer i's backward, recomputes the
 * dropped outputs below it from the last one kept. */
static int recompute(hpu_strat *s, int i, int n)
{
	int a = i - 1;
	while (a > 0 && !hpu__act_kept(s, a - 1))
		a--;
	if (a > 0 && hpu__act_expand(s, a - 1, n) < 0)
		return -1;
	for (int j = a; j < i; j++) {
		hpu_layer *l = s->b->layers[j];
		if (hpu__act_ensure(s, j) < 0 || acquire(s, j, +1, i + 1) < 0)
			return -1;
		int64_t t0 = hpu__prof_t0();
		op_layer(s, j, 0);
		int rc = l->ops.forward(l, input_of(s, j), s->acts[j], n);
		op_layer(s, -1, 0);
		hpu__prof_span("forward", "recompute", l->name, t0, "\"layer\":%d", j);
		if (rc != 0)
			return fail(s, "layer %s: forward (recomputed) failed: %s", l->name,
				    l->err[0] ? l->err : "(no reason given)");
		if (release_layer(s, j) < 0)
			return -1;
	}
	return 0;
}

int hpu_strat_backward(hpu_strat *s, const int32_t *labels, int n,
		       float scale, int micro, int accum, float *loss_out)
{
	hpu_builder *b = s->b;
	int last = s->nlayers - 1, final = micro == accum - 1;
	s->micro = micro;
	float *dout = s->dbuf[0];
	float loss = b->loss.loss(b->loss.user, s->acts[last], labels, dout, n);
	if (!(loss >= 0) || isinf(loss)) /* NaN, Inf or negative */
		return fail(s, "the model's loss returned %s (bad labels?)",
			    isnan(loss)   ? "NaN"
			    : isinf(loss) ? (loss > 0 ? "+Inf" : "-Inf")
					  : "a negative value");
	if (s->mp) /* 16-mixed: the loss scale; bf16: 1 */
		scale = (float)(scale * s->scale);
	for (size_t i = 0, k = (size_t)n * b->layers[last]->out_size; i < k; i++)
		dout[i] *= scale;
	for (int k = 0; k < s->nunits; k++)
		s->u[k].pending = s->u[k].nparam_layers;
	for (int i = last; i >= 0; i--) {
		hpu_layer *l = b->layers[i];
		if (i > 0 && !hpu__act_kept(s, i - 1) && recompute(s, i, n) < 0)
			return -1;
		if (i > 0 && hpu__act_expand(s, i - 1, n) < 0)
			return -1;
		if (l->unit >= 0 &&
		    ((s->mp ? hpu__mp_grads_for(s, i) : hpu__sync_grads_for(s, l->unit)) < 0 ||
		     acquire(s, i, -1, -1) < 0))
			return -1;
		float *din = i ? s->dbuf[(last - i + 1) & 1] : NULL;
		int64_t t0 = hpu__prof_t0();
		op_layer(s, i, 1);
		int rc = l->ops.backward(l, input_of(s, i), s->acts[i], dout, din, n);
		op_layer(s, -1, 0);
		hpu__prof_span("backward", "backward", l->name, t0, "\"layer\":%d", i);
		if (rc != 0)
			return fail(s, "layer %s: backward failed: %s", l->name,
				    l->err[0] ? l->err : "(no reason given)");
		if (l->unit >= 0) {
			if (s->mp)
				hpu__mp_grads_done(s, i, final);
			if (release_layer(s, i) < 0)
				return -1;
			if (--s->u[l->unit].pending == 0 &&
			    hpu__sync_unit_done(s, l->unit, final) < 0)
				return -1;
		}
		if (s->transient[i])
			hpu__act_drop(s, i);
		else
			hpu__act_release(s, i);
		if (hpu__sync_poll(s) < 0)
			return -1;
		dout = din;
	}
	*loss_out = loss;
	/* zero2/3 land every micro-step's gradients in the shard. */
	if (s->sharded && s->kind != HPU_STRATEGY_ZERO1 && hpu__sync_drain(s) < 0)
		return -1;
	return hpu__zero_release_all(s);
}
