/* strategy_pass: the forward and backward passes over the model's graph,
 * layer by layer in declaration order (a topological order: a layer reads
 * only tensors declared before it), with the strategy's hooks around each
 * layer: its parameters (and those it shares from other layers) made
 * ready before it runs and let go after (ZeRO-3 gathers, mixed
 * precision's fp32 copies), their gradients' buffers, a unit's gradient
 * collective started once every backward using its parameters is done,
 * the gradient of a tensor read by several layers summed, and the tensors
 * activation checkpointing dropped recomputed before backward needs them.
 */

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "worker/device/device.h"
#include "worker/ops/checks.h"
#include "worker/ops/fp8.h"
#include "worker/hpu/prof.h"
#include "worker/strategy/strategy_impl.h"

#define fail hpu__strat_fail

/* ---- parameters around a layer's call ---- */

/* Makes layer o's own parameters ready, prefetching what follows in
 * direction dir (up to layer `stop`). */
static int acquire_own(hpu_strat *s, int o, int dir, int stop)
{
	return s->hooks.acquire(s, o, dir, stop);
}

static int release_own(hpu_strat *s, int o)
{
	hpu_layer *l = s->b->layers[o];
	if (l->unit < 0)
		return 0;
	return s->hooks.release(s, o);
}

/* Layer i's parameters ready: its own and those it shares. */
static int acquire(hpu_strat *s, int i, int dir, int stop)
{
	hpu_layer *l = s->b->layers[i];
	/* a shared parameter's owner lies elsewhere: no prefetching from there */
	for (int k = 0; k < l->nuses; k++)
		if (acquire_own(s, l->uses[k], dir, l->uses[k] + dir) < 0)
			return -1;
	return l->nparams ? acquire_own(s, i, dir, stop) : 0;
}

static int release(hpu_strat *s, int i)
{
	hpu_layer *l = s->b->layers[i];
	for (int k = 0; k < l->nuses; k++)
		if (release_own(s, l->uses[k]) < 0)
			return -1;
	return l->nparams ? release_own(s, i) : 0;
}

/* Tells the ops which layer runs (fp8's call sites), or that none does
 * (i < 0). */
static void op_layer(hpu_strat *s, int i, int backward)
{
	if (i < 0) {
		hpu__op_layer(-1, NULL, NULL, 0, 0);
		return;
	}
	hpu_layer *l = s->b->layers[i];
	hpu__op_layer(i, l->name, l->pbase, l->plen, backward);
}

/* ---- views ---- */

static void view(const hpu_strat *s, int t, void *data, hpu_tensor *v)
{
	const hpu_tinfo *ti = &s->b->tensors[t];
	v->data = data;
	v->dtype = ti->dtype;
	v->batch = s->ctx.batch;
	v->ndim = ti->ndim;
	memcpy(v->shape, ti->shape, sizeof v->shape);
	v->sample_numel = ti->sample_numel;
	v->name = ti->name;
}

/* Tensor t as an fp32/i32 view of layer i (expanded from bf16 where kept
 * so), or with data NULL where i does not read it (`reads` 0: its
 * backward, hpu_layer_backward_reads). */
static int tensor_view(hpu_strat *s, int i, int t, int reads, hpu_tensor *v)
{
	if (!reads) {
		view(s, t, NULL, v);
		return 0;
	}
	if (hpu__act_expand(s, t, s->ctx.batch) < 0)
		return -1;
	if (!s->t_data[t])
		return fail(s, "layer %s: tensor %s is not there (an internal error)",
			    s->b->layers[i]->name, s->b->tensors[t].name);
	view(s, t, s->t_data[t], v);
	return 0;
}

/* Layer i's inputs as views: all of them for its forward, those its
 * backward reads for its backward. */
static int input_views(hpu_strat *s, int i, int backward, hpu_tensor *in)
{
	hpu_layer *l = s->b->layers[i];
	for (int k = 0; k < l->nin; k++)
		if (tensor_view(s, i, l->in[k], !backward || hpu__act_reads_in(l, k), &in[k]) < 0)
			return -1;
	return 0;
}

static int layer_failed(hpu_strat *s, hpu_layer *l, const char *what, int lrc)
{
	/* the layer's own message may name it already; a builder call made
	 * in the layer (hpu_loss_add after setup) says why in the builder's */
	char buf[160];
	const char *why = hpu__model_why(s->b, l->err, lrc, buf, sizeof buf);
	size_t n = strlen(l->name);
	if (!strncmp(why, "layer ", 6) && !strncmp(why + 6, l->name, n) && !strncmp(why + 6 + n, ": ", 2))
		why += 8 + n;
	int rc = fail(s, "layer %s: %s failed: %s", l->name, what, why);
	l->err[0] = s->b->err[0] = 0;
	return rc;
}

/* ---- forward ---- */

/* Layer i's forward into its outputs, its parameters gathered for it.
 * `stop`: where prefetching ends. */
static int layer_forward(hpu_strat *s, int i, int stop, int recompute)
{
	hpu_layer *l = s->b->layers[i];
	hpu_tensor in[HPU_MAX_IO], out[HPU_MAX_IO];
	for (int k = 0; k < l->nout; k++) {
		if (hpu__act_ensure(s, l->out[k]) < 0)
			return -1;
		view(s, l->out[k], s->t_data[l->out[k]], &out[k]);
	}
	if (hpu__act_saved(s, i) < 0 || input_views(s, i, 0, in) < 0 || acquire(s, i, +1, stop) < 0)
		return -1;
	l->saved = s->saved[i];
	l->scratch = s->scratch;
	hpu_ctx c = s->ctx;
	c.layer = i;
	c.recompute = recompute;
	int64_t t0 = hpu__prof_t0();
	op_layer(s, i, 0);
	int staged = hpu__host_staged(s, i);
	if (staged && hpu__host_stage_in(s, i, 0, in, out, NULL, NULL) < 0)
		return -1;
	hpu__dev_staged_layer(staged ? l->name : NULL);
	hpu__written_mark(s, i, 0, out, 0);
	hpu__dev_layer_enter(); /* the layer's forward: one device call */
	long late = s->b->late_calls;
	int rc = l->ops.forward(l, &c, in, out);
	if (rc == 0 && s->b->late_calls != late)
		rc = HPU_EINVAL; /* a declaration it made: l->err or b->err says */
	hpu__dev_layer_leave();
	hpu__dev_staged_layer(NULL);
	int unwritten = rc == 0 && hpu__written_check(s, i, 0, out, 0) < 0;
	if (staged)
		hpu__host_stage_out(s, i, 0, rc || unwritten);
	op_layer(s, -1, 0);
	if (unwritten)
		return -1;
	/* a hook's forward (gpt_lm's generation) is not an evaluation's */
	const char *ev = s->fwd_want >= 0 ? "hook_forward" : "eval_forward";
	hpu__prof_span(recompute ? "forward" : c.train ? "forward" : s->fwd_want >= 0 ? "hook" : "eval",
		       recompute ? "recompute" : c.train ? "forward" : ev, l->name, t0,
		       "\"layer\":%d", i);
	if (rc != 0)
		return layer_failed(s, l, recompute ? "forward (recomputed)" : "forward", rc);
	if (s->z3.keep_armed && i == s->z3.keep && !recompute)
		return 0; /* its backward comes next: released after it */
	return release(s, i);
}

/* After layer i's first forward: inputs it read last go (checkpointing,
 * and those no backward reads) or, in training, into bf16; so do its
 * outputs no one reads in this pass that no backward reads, and its saved
 * memory when checkpointing drops it. */
static int after_forward(hpu_strat *s, int i, const int *last, int want)
{
	hpu_layer *l = s->b->layers[i];
	for (int k = 0; k < l->nin; k++) {
		int t = l->in[k];
		if (last[t] != i || t == want)
			continue;
		if (s->transient[t] || s->unread[t])
			hpu__act_drop(s, t);
		else if (s->ctx.train && hpu__act_compress(s, t, s->ctx.batch) < 0)
			return -1;
	}
	for (int k = 0; k < l->nout; k++)
		if (last[l->out[k]] < 0 && s->unread[l->out[k]])
			hpu__act_drop(s, l->out[k]);
	if (s->saved_transient[i])
		hpu__act_saved_drop(s, i);
	return 0;
}

/* The layers tensor `want` depends on, into s->run_mask. */
static void mask_for(hpu_strat *s, int want)
{
	hpu_builder *b = s->b;
	char *need = s->run_mask; /* per layer; tensors via their producer */
	memset(need, 0, (size_t)s->nlayers);
	int p = b->tensors[want].producer;
	if (p >= 0)
		need[p] = 1;
	for (int i = p; i >= 0; i--) {
		if (!need[i])
			continue;
		hpu_layer *l = b->layers[i];
		for (int k = 0; k < l->nin; k++) {
			int q = b->tensors[l->in[k]].producer;
			if (q >= 0)
				need[q] = 1;
		}
	}
}

const hpu_ctx *hpu__strat_ctx(const hpu_strat *s)
{
	return &s->ctx;
}

void hpu__strat_set_pos(hpu_strat *s, int train, long step, long epoch)
{
	s->ctx.train = train;
	s->ctx.step = step;
	s->ctx.epoch = epoch;
	hpu__vars_step(s, train, step);
}

/* Dataset field t of the batch: read in place where the host may read
 * device memory, else copied into the device's buffer for it (the batch
 * in). */
/* Dataset field t of the batch (n samples at host) onto the device;
 * queued without a wait where the loop said the batch is held
 * (hpu__strat_batch_held). */
static int batch_in(hpu_strat *s, int t, void *host, int n, int queued)
{
	size_t numel = s->b->tensors[t].sample_numel;
	if (hpu__dev_host_can_read()) {
		s->t_data[t] = host;
		return 0;
	}
	if (!s->t_data[t]) {
		char what[160];
		snprintf(what, sizeof what, "the batch on the device (%s)", s->b->tensors[t].name);
		s->t_data[t] = hpu__dalloc_uninit(HPU_MEM_OTHER, (size_t)s->maxbatch * numel * 4, what);
		if (!s->t_data[t])
			return hpu__strat_fail(s, "%s", hpu__devmem_error());
	}
	if (queued)
		hpu__dev_copy_queued(s->t_data[t], host, (size_t)n * numel * 4);
	else
		hpu__dev_h2d(NULL, s->t_data[t], host, (size_t)n * numel * 4);
	return 0;
}

void hpu__strat_batch_held(hpu_strat *s, int held)
{
	s->batch_held = held != 0;
}

int hpu__strat_forward(hpu_strat *s, const hpu_batch *bt, int micro, int accum, int want)
{
	hpu_builder *b = s->b;
	s->ctx.batch = bt->n;
	s->ctx.micro = micro;
	s->ctx.accum = accum;
	s->ctx.samples = bt->idx;
	hpu__checks_batch(bt->idx, bt->n); /* the rows a deferred check names */
	hpu__vars_keys(s);
	/* a recordable training step's first forward, and a recordable
	 * evaluation's forwards (hpu__strat_eval_open), defer the checks */
	int defer = s->vars.recordable && want < 0 && (s->ctx.train ? micro == 0 : s->ev.on);
	if (!s->ctx.train && !defer)
		hpu__checks_disarm(); /* evaluation checks as before */
	else if (defer && hpu__vars_checks_arm(s) < 0)
		return -1;
	int queued = s->batch_held && s->ctx.train && want < 0;
	s->batch_held = 0; /* the next forward's own */
	for (int t = 0; t < b->ntensors; t++)
		if (b->tensors[t].producer < 0 &&
		    batch_in(s, t, bt->data[b->tensors[t].field], bt->n, queued) < 0)
			return -1;
	const int *last = s->ctx.train ? s->last_train : s->last_eval;
	if (want >= 0)
		mask_for(s, want);
	int stop = s->nlayers;
	s->fwd_want = want;
	s->z3.keep_armed = s->ctx.train && want < 0;
	for (int i = 0; i < s->nlayers; i++) {
		hpu_layer *l = b->layers[i];
		int run = want >= 0 ? s->run_mask[i] : s->ctx.train ? l->for_loss : l->for_eval;
		if (!run)
			continue;
		if (layer_forward(s, i, stop, 0) < 0 || (want < 0 && after_forward(s, i, last, -1) < 0)) {
			s->z3.keep_armed = 0;
			return -1;
		}
	}
	s->z3.keep_armed = 0;
	return 0;
}

const void *hpu__strat_tensor(hpu_strat *s, int t)
{
	if (hpu__act_expand(s, t, s->ctx.batch) < 0)
		return NULL;
	if (hpu__dev_host_can_read())
		return s->t_data[t];
	/* the host reads a copy (metrics, the hooks' forward) */
	size_t row = s->b->tensors[t].sample_numel * 4;
	if (!s->stg.t_host) {
		if (!(s->stg.t_host = calloc((size_t)s->b->ntensors, sizeof *s->stg.t_host)))
			return NULL;
	}
	if (!s->stg.t_host[t] && !(s->stg.t_host[t] = hpu__dev_host_alloc((size_t)s->maxbatch * row)))
		return NULL;
	hpu__dev_d2h(NULL, s->stg.t_host[t], s->t_data[t], (size_t)s->ctx.batch * row);
	return s->stg.t_host[t];
}

/* Each loss term's per-sample values summed on the device; only the
 * sums come out (where the host may not read them), a double per term. */
double hpu__strat_loss(hpu_strat *s)
{
	hpu_builder *b = s->b;
	size_t bytes = (size_t)b->nloss * sizeof(double);
	if (!s->lsum && !(s->lsum = hpu__dalloc(HPU_MEM_OTHER, bytes, "losses' sums")))
		return NAN;
	if (!s->lsum_host && !(s->lsum_host = hpu__dev_host_alloc(bytes)))
		return NAN;
	for (int k = 0; k < b->nloss; k++)
		hpu__dev_sum(s->lsum + k, s->t_data[b->loss[k].tensor], (size_t)s->ctx.batch);
	const double *m = s->lsum;
	if (!hpu__dev_host_can_read()) { /* the sums out */
		hpu__dev_d2h(NULL, s->lsum_host, s->lsum, bytes);
		m = s->lsum_host;
	}
	return hpu__vars_loss_of(s, m, s->ctx.batch);
}

/* ---- backward ---- */

/* After layer j's recomputation: the inputs checkpointing dropped that it
 * read last in forward and no backward reads go again (no layer after it
 * in the segment reads them; recompute() never needs them back). */
static void recomputed(hpu_strat *s, int j)
{
	hpu_layer *l = s->b->layers[j];
	for (int k = 0; k < l->nin; k++) {
		int t = l->in[k];
		if (s->transient[t] && s->nobwd[t] && s->last_train[t] == j)
			hpu__act_drop(s, t);
	}
}

/* Layer j's saved memory was dropped by checkpointing (a layer that
 * has none never misses it). */
static int saved_missing(const hpu_strat *s, int j)
{
	const hpu_layer *l = s->b->layers[j];
	return s->saved_transient[j] && !s->saved[j] && (l->saved_ps || l->saved_fixed);
}

/* Activation checkpointing: before layer i's backward, recomputes what
 * its segment dropped, from the segment's first layer to i. */
static int recompute(hpu_strat *s, int i)
{
	hpu_layer **ls = s->b->layers;
	int missing = 0;
	for (int k = 0; k < ls[i]->nin && !missing; k++)
		missing = hpu__act_reads_in(ls[i], k) && !hpu__act_kept(s, ls[i]->in[k]);
	for (int k = 0; k < ls[i]->nout && !missing; k++)
		missing = hpu__act_reads_out(ls[i], k) && !hpu__act_kept(s, ls[i]->out[k]);
	if (saved_missing(s, i))
		missing = 1;
	if (!missing)
		return 0;
	/* what checkpointing dropped (no backward reading it, a tensor is
	 * not recomputed for itself) */
	for (int j = s->seg_start[i]; j <= i; j++) {
		if (!ls[j]->for_loss)
			continue;
		int need = saved_missing(s, j);
		for (int k = 0; k < ls[j]->nout && !need; k++)
			need = s->transient[ls[j]->out[k]] && !hpu__act_kept(s, ls[j]->out[k]);
		if (need && layer_forward(s, j, i + 1, 1) < 0)
			return -1;
		if (need)
			recomputed(s, j);
	}
	return 0;
}

/* The layers whose parameters layer i's backward touches: its own (if
 * any) and those of the layers it shares from. Returns their count. */
static int owners(const hpu_layer *l, int *o)
{
	int n = 0;
	if (l->nparams)
		o[n++] = l->index;
	for (int k = 0; k < l->nuses; k++)
		o[n++] = l->uses[k];
	return n;
}

static int grads_for(hpu_strat *s, int o)
{
	return s->hooks.grads_for(s, o);
}

/* Every backward using layer o's parameters has run: its gradients are
 * complete, and its unit's when it was the unit's last. */
static int grads_done(hpu_strat *s, int o, int final)
{
	hpu_layer *l = s->b->layers[o];
	if (--s->gpend[o] > 0)
		return 0;
	if (s->hooks.grads_done)
		s->hooks.grads_done(s, o, final);
	if (--s->u[l->unit].pending == 0 && s->hooks.unit_done(s, l->unit, final) < 0)
		return -1;
	return 0;
}

/* The loss tensors' gradients: weight * scale / batch per sample (NaN for
 * a non-finite loss, so that every rank sees non-finite gradients and
 * skips the step), from the loss's sums on the device; scale times the
 * loss scale there. */
static int seed(hpu_strat *s, float scale)
{
	hpu_builder *b = s->b;
	int n = s->ctx.batch;
	const double *sums = hpu__vars_sums(s, s->ctx.micro);
	for (int k = 0; k < b->nloss; k++) {
		float *g = hpu__act_grad(s, b->loss[k].tensor, 1);
		if (!g)
			return -1;
		hpu__dev_loss_seed(g, (size_t)n, sums, b->nloss, b->loss[k].weight, scale, n,
				   s->vars.sv);
	}
	return 0;
}

/* din views of layer i: a tensor that needs a gradient gets its gradient
 * buffer when it is the first to write it (the tensor's own memory where
 * i writes it in place: hpu__act_grad_in_place), else a temporary one
 * (tmp[k]) that is added after the call. */
static int din_views(hpu_strat *s, int i, hpu_tensor *din, float **tmp)
{
	hpu_layer *l = s->b->layers[i];
	for (int k = 0; k < l->nin; k++) {
		int t = l->in[k];
		tmp[k] = NULL;
		view(s, t, NULL, &din[k]);
		if (!s->b->tensors[t].grad)
			continue;
		int taken = s->t_grad[t] != NULL;
		for (int q = 0; q < k && !taken; q++)
			taken = l->in[q] == t;
		if (!taken && s->inplace[i] >> k & 1u && s->t_data[t]) {
			din[k].data = hpu__act_grad_in_place(s, t); /* over in[k] */
			continue;
		}
		if (!taken) {
			if (!(din[k].data = hpu__act_grad(s, t, 0)))
				return -1;
			continue;
		}
		char what[128];
		snprintf(what, sizeof what, "gradient of %s (another reader's)",
			 s->b->tensors[t].name);
		size_t bytes = (size_t)s->maxbatch * s->b->tensors[t].sample_numel * 4;
		if (!(tmp[k] = hpu__dalloc_uninit(HPU_MEM_ACTS, bytes, what)))
			return fail(s, "%s", hpu__devmem_error());
		din[k].data = tmp[k];
	}
	return 0;
}

static void add_tmp(hpu_strat *s, int i, float **tmp)
{
	hpu_layer *l = s->b->layers[i];
	for (int k = 0; k < l->nin; k++) {
		if (!tmp[k])
			continue;
		int t = l->in[k];
		hpu__dev_add(s->t_grad[t], tmp[k], (size_t)s->ctx.batch * s->b->tensors[t].sample_numel);
		hpu__dfree(tmp[k]);
		tmp[k] = NULL;
	}
}

static int layer_backward(hpu_strat *s, int i, int final)
{
	hpu_layer *l = s->b->layers[i];
	hpu_tensor in[HPU_MAX_IO], out[HPU_MAX_IO], dout[HPU_MAX_IO], din[HPU_MAX_IO];
	float *tmp[HPU_MAX_IO] = {0};
	int own[HPU_MAX_IO + 1], no = owners(l, own);
	if (recompute(s, i) < 0 || input_views(s, i, 1, in) < 0)
		return -1;
	for (int k = 0; k < l->nout; k++) {
		int t = l->out[k];
		float *g = hpu__act_grad(s, t, 1); /* zeros if no reader wrote it */
		if (!g || tensor_view(s, i, t, hpu__act_reads_out(l, k), &out[k]) < 0)
			return -1;
		view(s, t, g, &dout[k]);
	}
	for (int k = 0; k < no; k++)
		if (grads_for(s, own[k]) < 0)
			return -1;
	if (acquire(s, i, -1, -1) < 0 || hpu__act_saved(s, i) < 0 || din_views(s, i, din, tmp) < 0)
		goto fail;
	/* the dins written over the input the backward reads (in place) are
	 * not marked: those alone (a din planned in place but given its own
	 * buffer is checked) */
	unsigned over_in = 0;
	for (int k = 0; k < l->nin; k++)
		if (din[k].data && din[k].data == in[k].data)
			over_in |= 1u << k;
	l->saved = s->saved[i];
	l->scratch = s->scratch;
	hpu_ctx c = s->ctx;
	c.layer = i;
	int64_t t0 = hpu__prof_t0();
	op_layer(s, i, 1);
	int staged = hpu__host_staged(s, i);
	if (staged && hpu__host_stage_in(s, i, 1, in, out, dout, din) < 0)
		goto fail;
	hpu__dev_staged_layer(staged ? l->name : NULL);
	hpu__written_mark(s, i, 1, din, over_in);
	hpu__dev_layer_enter(); /* the layer's backward: one device call */
	long late = s->b->late_calls;
	int rc = l->ops.backward(l, &c, in, out, dout, din);
	if (rc == 0 && s->b->late_calls != late)
		rc = HPU_EINVAL;
	hpu__dev_layer_leave();
	hpu__dev_staged_layer(NULL);
	int unwritten = rc == 0 && hpu__written_check(s, i, 1, din, over_in) < 0;
	if (staged)
		hpu__host_stage_out(s, i, 1, rc || unwritten);
	op_layer(s, -1, 0);
	if (unwritten)
		goto fail;
	hpu__prof_span("backward", "backward", l->name, t0, "\"layer\":%d", i);
	if (rc != 0) {
		layer_failed(s, l, "backward", rc);
		goto fail;
	}
	add_tmp(s, i, tmp);
	if (release(s, i) < 0)
		return -1;
	for (int k = 0; k < no; k++)
		if (grads_done(s, own[k], final) < 0)
			return -1;
	return 0;
fail:
	for (int k = 0; k < l->nin; k++)
		hpu__dfree(tmp[k]);
	return -1;
}

/* After layer i's backward (or in its place): its outputs and their
 * gradients are not needed again in this pass. */
static void after_backward(hpu_strat *s, int i)
{
	hpu_layer *l = s->b->layers[i];
	for (int k = 0; k < l->nout; k++) {
		int t = l->out[k];
		hpu__act_grad_drop(s, t);
		if (s->transient[t] || s->unread[t])
			hpu__act_drop(s, t);
		else
			hpu__act_release(s, t);
	}
	if (s->saved_transient[i])
		hpu__act_saved_drop(s, i);
}

/* ---- the first non-finite value (hpu_nonfinite) ---- */

/* Tensor t after this micro-step's forward: its non-finite values (an
 * i32 tensor holds none), or -1 when it is not there to look at (freed
 * after forward because no backward reads it, or dropped by activation
 * checkpointing). Its fp32 form, else its bf16 one (bf16-mixed, fp8). */
static long tensor_nonfinite(const hpu_strat *s, int t, size_t *numel)
{
	const hpu_tinfo *ti = &s->b->tensors[t];
	*numel = (size_t)s->ctx.batch * ti->sample_numel;
	if (ti->dtype != HPU_F32)
		return 0;
	if (s->t_data[t])
		return hpu__dev_count_nonfinite(s->t_data[t], *numel);
	if (s->a16 && s->a16[t])
		return hpu__dev_count_nonfinite16(s->a16[t], *numel);
	return -1;
}

/* Looks at tensor t: 1 when it holds a non-finite value (the finding
 * made, with the tensors before it that could not be looked at), else 0
 * (one more of those when it was not there). */
static int note_nonfinite(hpu_strat *s, int t, int *unchecked, long *nunchecked)
{
	size_t numel;
	long bad = tensor_nonfinite(s, t, &numel);
	if (bad < 0) {
		*unchecked = t;
		++*nunchecked;
	}
	if (bad <= 0)
		return 0;
	s->steps.first_bad = (hpu_nonfinite){.found = 1, .micro = s->ctx.micro, .tensor = t,
				       .count = bad, .numel = (long)numel, .unit = -1,
				       .unchecked = *unchecked, .nunchecked = *nunchecked};
	return 1;
}

/* A non-finite loss: the first tensor of the forward that holds an Inf or
 * NaN (the dataset's fields, then each layer's outputs in order), and the
 * last one before it that was not there to look at. Runs only then, so
 * it costs nothing otherwise. */
static void find_nonfinite(hpu_strat *s)
{
	hpu_builder *b = s->b;
	int unchecked = -1;
	long nunchecked = 0;
	if (s->steps.first_bad.found == 1)
		return; /* an earlier micro-step's came first */
	for (int t = 0; t < b->ntensors; t++)
		if (b->tensors[t].producer < 0 && note_nonfinite(s, t, &unchecked, &nunchecked))
			return;
	for (int i = 0; i < b->nlayers; i++) {
		const hpu_layer *l = b->layers[i];
		if (!l->for_loss)
			continue;
		for (int k = 0; k < l->nout; k++)
			if (note_nonfinite(s, l->out[k], &unchecked, &nunchecked))
				return;
	}
}

void hpu__strat_first_nonfinite(hpu_strat *s, hpu_nonfinite *out)
{
	*out = s->steps.first_bad;
	s->steps.first_bad = (hpu_nonfinite){.unit = -1, .unchecked = -1};
}

void hpu__strat_nonfinite_name(const hpu_strat *s, int tensor, int unit, char *out,
			       size_t outlen)
{
	const hpu_builder *b = s->b;
	int layer = tensor >= 0 && tensor < b->ntensors ? b->tensors[tensor].producer : -1;
	if (unit >= 0 && unit < s->nunits)
		snprintf(out, outlen, "the gradients of %s", hpu__strat_unit_name(s, unit));
	else if (tensor < 0 || tensor >= b->ntensors)
		snprintf(out, outlen, "an unknown tensor");
	else if (layer < 0 || layer >= b->nlayers)
		snprintf(out, outlen, "dataset field \"%s\"", b->tensors[tensor].name);
	else
		snprintf(out, outlen, "output \"%s\" of layer \"%s\"", b->tensors[tensor].name,
			 b->layers[layer]->name);
}

int hpu__strat_backward(hpu_strat *s, float scale)
{
	hpu_builder *b = s->b;
	int final = s->ctx.micro == s->ctx.accum - 1;
	s->micro = s->ctx.micro;
	if (s->ctx.micro == 0)
		s->steps.first_bad = (hpu_nonfinite){.unit = -1, .unchecked = -1};
	if (hpu__vars_loss(s) < 0)
		return -1;
	/* eager: the loss read now, to name the first non-finite tensor */
	if (!s->vars.recordable && !isfinite(hpu__vars_micro_loss(s, s->ctx.micro)))
		find_nonfinite(s);
	if (seed(s, scale) < 0)
		return -1;
	for (int k = 0; k < s->nunits; k++)
		s->u[k].pending = s->u[k].nparam_layers;
	memcpy(s->gpend, s->gusers, (size_t)s->nlayers * sizeof *s->gpend);
	for (int i = s->nlayers - 1; i >= 0; i--) {
		if (b->layers[i]->backward && layer_backward(s, i, final) < 0)
			return -1;
		after_backward(s, i);
		if (hpu__sync_poll(s) < 0)
			return -1;
	}
	for (int t = 0; t < b->ntensors; t++) /* dataset fields' (none wanted) */
		hpu__act_grad_drop(s, t);
	/* zero2/3 land every micro-step's gradients in the shard. */
	if (hpu__strat_grads_sharded(s) && hpu__sync_drain(s) < 0)
		return -1;
	return hpu__zero_release_all(s);
}
