/* strategy: making the strategy, its layout, and the optimizer step.
 * hpu__strat_new groups the layers with parameters into units, lays them
 * out (padded; under ZeRO each rank owns a piece of every unit),
 * allocates the parameters, gradients and optimizer state where the
 * strategy keeps them and initializes them. hpu__strat_step reduces the
 * gradients (strategy_sync.c), clips and steps the optimizer (mixed
 * precision: strategy_mp.c) and gathers the updated parameters
 * (strategy_zero.c). The forward and backward passes are in
 * strategy_pass.c, the layers' outputs in strategy_act.c, checkpoints and
 * --save-params in strategy_ckpt.c. */
#include "worker/strategy/strategy.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/ops/autocast.h"
#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "common/simd.h"
#include "worker/strategy/strategy_impl.h"

#define fail hpu__strat_fail

#define dalloc hpu__strat_dalloc

/* ---- layout ---- */

static size_t round_up(size_t x, size_t m)
{
	return (x + m - 1) / m * m;
}

static int add_unit(hpu_strat *s, int first, int last)
{
	unit *u = &s->u[s->nunits++];
	memset(u, 0, sizeof *u);
	u->first = first;
	u->last = last;
	return 0;
}

/* Groups the layers with parameters into units of at most `cap` floats
 * (a larger layer is a unit of its own; cap 0: one unit), from the last layer backwards
 * when `reverse` (DDP buckets follow backward's order), and stores them in
 * forward order. */
static void group(hpu_strat *s, long cap, int reverse)
{
	hpu_builder *b = s->b;
	int L = b->nlayers, n0 = s->nunits;
	int start = -1, end = -1;
	size_t size = 0;
	for (int k = 0; k < L; k++) {
		int i = reverse ? L - 1 - k : k;
		size_t len = b->layers[i]->plen;
		if (!len)
			continue;
		if (start >= 0 && cap > 0 && size + len > (size_t)cap) {
			add_unit(s, reverse ? end : start, reverse ? start : end);
			start = -1;
		}
		if (start < 0) {
			start = i;
			size = 0;
		}
		end = i;
		size += len;
	}
	if (start >= 0)
		add_unit(s, reverse ? end : start, reverse ? start : end);
	if (reverse) /* made last-first: put them in forward order */
		for (int a = n0, z = s->nunits - 1; a < z; a++, z--) {
			unit t = s->u[a];
			s->u[a] = s->u[z];
			s->u[z] = t;
		}
}

static void build_units(hpu_strat *s)
{
	const hpu_train_opts *o = s->o;
	switch (s->kind) {
	case HPU_STRATEGY_FAST_DDP:
		group(s, 0, 0);
		break;
	case HPU_STRATEGY_DDP:
	case HPU_STRATEGY_ZERO2:
		/* DeepSpeed's reduce_bucket_size 0: every tensor alone */
		group(s, o->reduce_bucket ? o->reduce_bucket : 1, 1);
		break;
	case HPU_STRATEGY_ZERO1:
		group(s, o->allgather_bucket, 0);
		break;
	case HPU_STRATEGY_ZERO3:
		group(s, 1, 0); /* one layer each */
		break;
	}
	/* Offsets: units in forward order, each padded. */
	size_t pad = s->sharded ? 16 * (size_t)s->world : 16, at = 0, shard_at = 0;
	for (int k = 0; k < s->nunits; k++) {
		unit *u = &s->u[k];
		u->off = at;
		size_t nparams = 0; /* the unit's parameters, unpadded */
		for (int i = u->first; i <= u->last; i++) {
			hpu_layer *l = s->b->layers[i];
			l->off = at;
			if (!l->plen)
				continue;
			l->unit = k;
			u->nparam_layers++;
			at += l->plen;
			for (int p = 0; p < l->nparams; p++)
				nparams += s->b->params[l->first_param + p].numel;
		}
		u->len = round_up(at - u->off, pad);
		at = u->off + u->len;
		if (s->sharded) {
			u->piece = u->len / (size_t)s->world;
			u->shard_off = shard_at;
			shard_at += u->piece;
		}
		/* by its parameters, as documented (the length padded per
		 * tensor and per unit kept a 5130-parameter layer sharded
		 * under a threshold of 5140) */
		u->persistent = hpu__strat_params_sharded(s) &&
				(long)nparams < s->o->persistence_threshold;
	}
	s->total = at;
	s->shard_total = shard_at;
}

/* ---- parameters, gradients, optimizer state ---- */

int hpu__strat_alloc_optim(hpu_strat *s)
{
	const hpu_train_opts *o = s->o;
	char what[160];
	int k = hpu__optim_state_floats(o);
	size_t n = s->sharded ? s->shard_total : s->total;
	if (o->offload_optimizer == HPU_OFFLOAD_NVME)
		return hpu__nv_open(s);
	snprintf(what, sizeof what, "optimizer state (%s, %d floats per parameter)",
		 hpu__optim_name(o->optimizer), k);
	if (k && !(s->state = hpu__strat_salloc(s, o->offload_optimizer, HPU_MEM_OPTIM,
						   (size_t)k * n * 4, what)))
		return -1;
	return 0;
}

void hpu__strat_optim_init(hpu_strat *s, int j)
{
	unit *u = &s->u[j];
	int k = hpu__optim_state_floats(s->o);
	size_t n_opt = s->sharded ? u->piece : u->len;
	size_t at = s->sharded ? u->shard_off : u->off;
	hpu__optim_init(&u->opt, s->o, n_opt, s->state ? s->state + (size_t)k * at : NULL);
}

/* One model state of the plan: `n` floats' worth in the plan's dtype and
 * copies, where the plan keeps it (the device, or the host tier for
 * either offload; NVMe's in-memory buffers are host memory too). */
static void *state_alloc(hpu_strat *s, hpu_plan_state st, size_t n, hpu_mem_kind kind,
			 const char *what)
{
	const hpu_plan_entry *e = &s->plan.e[st];
	size_t bytes = n * (size_t)e->copies * hpu__plan_esize(e);
	if (e->where == HPU_PLAN_DEVICE)
		return dalloc(s, kind, bytes, what);
	return hpu__strat_salloc(s, HPU_OFFLOAD_CPU, kind, bytes, what);
}

/* The parameters' or gradients' memory refused: the message names the
 * model's largest parameter, the one a model declared too large as a
 * rule. Returns -1. */
static int states_refused(hpu_strat *s)
{
	const hpu_param_info *top = NULL;
	size_t psi = 0; /* the model's (s->total is padded for the shards) */
	for (int i = 0; i < s->b->nparams; i++) {
		psi += s->b->params[i].numel;
		if (!top || s->b->params[i].numel > top->numel)
			top = &s->b->params[i];
	}
	size_t n = strlen(s->err);
	if (top && n + 1 < s->errlen)
		snprintf(s->err + n, s->errlen - n, "; the model has %zu parameter elements, %zu of them "
			 "in %s, its largest parameter", psi, top->numel, top->name);
	return -1;
}

/* The layout of the model states, for every precision, as the plan says:
 * working parameters (whole, or zero3's shard; in the working dtype),
 * gradients (whole, or zero2/3's shard; in the working dtype), mixed
 * precision's fp32 master weights and the optimizer state over the range
 * this rank updates (whole, or its shard), then each unit's optimizer
 * pointed at its range. Under mixed precision the layers compute on fp32
 * copies made per layer when they need them (strategy_mp.c). */
static int alloc_states(hpu_strat *s)
{
	const hpu_plan *p = &s->plan;
	const hpu_plan_entry *pe = &p->e[HPU_PLAN_PARAMS], *ge = &p->e[HPU_PLAN_GRADS];
	const char *w16 = !p->mixed ? "" : p->fp16 ? "fp16 " : "bf16 ";
	size_t es = hpu__plan_esize(pe);
	char what[160];
	char *P = NULL, *PS = NULL, *G = NULL, *GS = NULL;
	snprintf(what, sizeof what, "%sparameters", w16);
	if (!pe->sharded && !(P = state_alloc(s, HPU_PLAN_PARAMS, s->total, HPU_MEM_PARAMS, what)))
		return states_refused(s);
	snprintf(what, sizeof what, "%sparameter shard", w16);
	if (pe->sharded && pe->where != HPU_PLAN_NVME && /* nvme: hpu__nvp_open */
	    !(PS = state_alloc(s, HPU_PLAN_PARAMS, s->shard_total, HPU_MEM_PARAMS, what)))
		return states_refused(s);
	snprintf(what, sizeof what, "%s%s", w16,
		 ge->sharded && !p->mixed ? "gradient shard" : "gradients");
	if (!ge->sharded && !(G = state_alloc(s, HPU_PLAN_GRADS, s->total, HPU_MEM_GRADS, what)))
		return states_refused(s);
	if (ge->sharded &&
	    !(GS = state_alloc(s, HPU_PLAN_GRADS, s->shard_total, HPU_MEM_GRADS, what)))
		return states_refused(s);
	size_t n = s->sharded ? s->shard_total : s->total;
	const hpu_plan_entry *me = &p->e[HPU_PLAN_MASTER];
	if (me->where != HPU_PLAN_NOWHERE &&
	    me->where != HPU_PLAN_NVME && /* nvme: in the swap file with the moments */
	    !(s->M = state_alloc(s, HPU_PLAN_MASTER, n, HPU_MEM_OPTIM, "fp32 master weights")))
		return -1;
	s->G = G;
	s->GS = GS;
	s->P = P;
	s->PS = PS;
	if (hpu__strat_alloc_optim(s) < 0)
		return -1;
	if (p->mixed &&
	    !(s->chunk = hpu__strat_salloc(s, s->o->offload_optimizer, HPU_MEM_OTHER,
					   HPU__STRAT_CHUNK * 4, "optimizer conversion buffer")))
		return -1;
	if (hpu__strat_ustage_open(s) < 0)
		return -1;
	for (int j = 0; j < s->nunits; j++) {
		unit *u = &s->u[j];
		size_t mine = s->sharded ? (size_t)s->rank * u->piece : 0;
		void *wp = P ? P + (u->off + mine) * es : PS ? PS + u->shard_off * es : NULL;
		void *wg = G ? G + (u->off + mine) * es : GS + u->shard_off * es;
		u->opt_w = wp; /* nvme: hpu__nvp_get gives it */
		if (hpu__strat_has_master(s))
			u->opt_p = s->M ? s->M + (s->sharded ? u->shard_off : u->off) : NULL;
		else
			u->opt_p = wp;
		u->opt_g = wg;
		hpu__strat_optim_init(s, j);
		if (s->P && hpu__strat_direct(s))
			hpu__strat_point(s, j, (float *)s->P + u->off, NULL);
		if (s->G && hpu__strat_direct(s))
			hpu__strat_point(s, j, NULL, (float *)s->G + u->off);
	}
	return pe->where == HPU_PLAN_NVME ? hpu__nvp_open(s) : 0;
}

/* Every rank computes the same initial values; ZeRO-3 keeps its pieces
 * (and the whole of persistent units). */
/* A unit's initial values into dst: made in place where the host may
 * write device memory, else in a host buffer and copied in. */
static int fill_unit_into(hpu_strat *s, int j, float *dst)
{
	size_t n = s->u[j].len;
	if (!hpu__dev_owns(dst))
		return hpu__strat_fill_unit(s, j, dst);
	float *host = hpu__dev_host_alloc(n * 4);
	if (!host)
		return fail(s, "out of host memory for the initial parameters of %s",
			    hpu__strat_unit_name(s, j));
	int rc = hpu__strat_fill_unit(s, j, host);
	if (rc == 0)
		hpu__dev_h2d(NULL, dst, host, n * 4);
	hpu__dev_host_free(host);
	return rc;
}

static int init_params(hpu_strat *s)
{
	for (int j = 0; j < s->nunits; j++) {
		unit *u = &s->u[j];
		float *dst = s->P ? (float *)s->P + u->off : NULL;
		if (!dst) {
			char what[128];
			snprintf(what, sizeof what, "initial parameters of %s",
				 hpu__strat_unit_name(s, j));
			if (!(dst = dalloc(s, HPU_MEM_PARAMS, u->len * 4, what)))
				return -1;
		}
		if (fill_unit_into(s, j, dst) < 0) {
			if (!s->P)
				hpu__dfree(dst);
			return -1;
		}
		if (s->P)
			continue;
		float *piece = s->nvp ? hpu__nvp_get(s, j, 0) : u->opt_p;
		if (piece)
			hpu__dev_copy(piece, dst + (size_t)s->rank * u->piece, u->piece * 4);
		if (!piece || (s->nvp && hpu__nvp_put(s, j) < 0)) {
			hpu__dfree(dst);
			return -1;
		}
		if (u->persistent) {
			u->full = dst;
			hpu__strat_point(s, j, dst, NULL);
		} else {
			hpu__dfree(dst);
		}
	}
	return s->nvp ? hpu__nvp_drop_all(s) : 0;
}

/* ---- the optimizer step ---- */

/* fp32, after a step: the next step's gradients start at zero. Those of
 * the layers whose gradients may be owed zeros (hpu__strat_fresh_ok),
 * where they lie whole in G, are owed zeros instead: the ops claim them,
 * the rest is zeroed when the layer's backward ends (fp32_grads_done) or
 * at the next step (hpu__strat_step). */
static void zero_grads(hpu_strat *s)
{
	int fresh = !hpu__strat_grads_sharded(s) && hpu__strat_direct(s);
	float *G = s->G;
	size_t at = 0; /* G[0 .. at) is done */
	for (int i = 0; fresh && i < s->nlayers; i++) {
		hpu_layer *l = s->b->layers[i];
		if (!hpu__strat_fresh_ok(s, i) || l->gbase != G + l->off || l->off < at)
			continue;
		if (hpu__strat_fresh_add(s, i, l->gbase, NULL) < 0)
			break;
		if (l->off > at) /* the gap before it */
			hpu__dev_memset(NULL, G + at, 0, (l->off - at) * 4);
		at = l->off + l->plen;
	}
	if (s->total > at)
		hpu__dev_memset(NULL, G + at, 0, (s->total - at) * 4);
}

/* fp32: layer o's gradients are complete; what no op claimed is zero. */
static void fp32_grads_done(hpu_strat *s, int o, int final)
{
	(void)final;
	hpu_layer *l = s->b->layers[o];
	hpu__ac_fresh_flush(l->gbase, l->plen);
}

/* fp32: an Inf or NaN gradient anywhere (a non-finite loss makes them
 * NaN) skips the step everywhere; else clip and step. Decided on the
 * device (strategy_vars.c): the host knows the outcome here only where
 * it takes part (vars.known). */
static int fp32_step(hpu_strat *s)
{
	if (hpu__vars_decide(s) < 0)
		return -1;
	const hpu__dev_stepvars *h = s->vars.svh;
	int known = s->vars.known, skip = known && h->skip;
	if (known && h->bad > 0 && !s->steps.first_bad.found) /* the losses were finite: name the unit */
		for (int k = 0; k < s->nunits && !s->steps.first_bad.found; k++)
			if (hpu__strat_nonfinite(s, s->u[k].opt_g, s->u[k].opt.n))
				s->steps.first_bad = (hpu_nonfinite){.found = 2, .unit = k, .tensor = -1,
							       .unchecked = -1};
	if (!skip) { /* unknown: the device's update skips itself */
		if (s->nv) {
			if (hpu__nv_step(s, h->gscale, h->lr) < 0)
				return -1;
		} else {
			for (int k = 0; k < s->nunits; k++) {
				if (s->nvp && hpu__nvp_step_at(s, k) < 0)
					return -1;
				hpu__strat_update(s, &s->u[k].opt, 0, s->u[k].opt.n,
						  s->u[k].opt_p, s->u[k].opt_g, NULL, h->gscale, h->lr);
			}
			if (s->nvp && hpu__nvp_step_at(s, s->nunits) < 0)
				return -1;
		}
	}
	hpu__vars_end(s);
	if (s->G)
		zero_grads(s);
	return skip ? 0 : hpu__zero_gather_params(s);
}

/* The buffers in step across ranks, as each declares: rank 0's, or the
 * mean. One collective per kind, over the buffers packed together;
 * libhpucoll's code. */
static int sync_now(hpu_strat *s)
{
	hpu_builder *b = s->b;
	for (int kind = HPU_BUFFER_BROADCAST; kind <= HPU_BUFFER_MEAN; kind++) {
		size_t n = 0;
		for (int i = 0; i < b->nbuffers; i++)
			if ((int)b->buffers[i].sync == kind) {
				hpu__dev_copy(s->stg.bsync + n, s->B + b->buffers[i].offset,
					      b->buffers[i].numel * 4);
				n += b->buffers[i].numel;
			}
		if (!n)
			continue;
		int rc = kind == HPU_BUFFER_MEAN
				 ? hpucoll_all_reduce(s->comm, s->stg.bsync, s->stg.bsync, n, HPUCOLL_F32,
						      HPUCOLL_SUM)
				 : hpucoll_broadcast(s->comm, s->stg.bsync, s->stg.bsync, n, HPUCOLL_F32, 0);
		if (rc)
			return rc;
		if (kind == HPU_BUFFER_MEAN)
			for (size_t j = 0; j < n; j++)
				s->stg.bsync[j] /= (float)s->world;
		n = 0;
		for (int i = 0; i < b->nbuffers; i++)
			if ((int)b->buffers[i].sync == kind) {
				hpu__dev_copy(s->B + b->buffers[i].offset, s->stg.bsync + n,
					      b->buffers[i].numel * 4);
				n += b->buffers[i].numel;
			}
	}
	return HPUCOLL_OK;
}

/* A recorded step's buffer synchronization at each launch (a host node
 * of the CPU's list, as strategy_dcoll.c's collectives). */
static int sync_replay(const void *arg, char *err, size_t errlen)
{
	hpu_strat *s = *(hpu_strat *const *)arg;
	int rc = sync_now(s);
	if (rc == HPUCOLL_OK)
		return 0;
	snprintf(err, errlen,
		 "buffer synchronization between the %d workers (a recording's, replayed) "
		 "failed: %s",
		 s->world, hpucoll_comm_why(s->comm, rc));
	return -1;
}

static int sync_buffers(hpu_strat *s)
{
	if (s->world == 1 || !s->b->nbuffers)
		return 0;
	if (hpu__dev_capturing()) { /* at each launch; refused where it cannot be */
		if (hpu__dev_rec_host("hpucoll_buffer_sync", sync_replay, &s, sizeof s) < 0)
			hpu__dev_capture_refuse("the buffers' synchronization between the %d workers "
						"runs on the host (libhpucoll)",
						s->world);
		return 0;
	}
	int rc = sync_now(s);
	return rc ? hpu__strat_coll_fail(s, "buffer synchronization", rc) : 0;
}

int hpu__strat_step(hpu_strat *s, double lr)
{
	if (s->G && !s->plan.mixed) /* owed zeros nobody claimed (zero_grads) */
		hpu__ac_fresh_flush(s->G, s->total);
	hpu__vars_lr(s, lr);
	int rc = s->hooks.reduce(s) < 0 || s->hooks.step(s) < 0 ? -1 : sync_buffers(s);
	hpu__vars_checks_end(s);
	return rc;
}

int hpu__strat_step_result(hpu_strat *s, float *loss, double *grad_norm)
{
	int skipped;
	/* the scale the step ran at (the result brings the next one) */
	double ran_at = s->steps.scale;
	int rc = hpu__vars_result(s, loss, grad_norm, &skipped);
	/* The fp16 scaler's overflows are how it finds its scale: they count
	 * only once it cannot lower the scale any more, by the scale the
	 * step ran at (DeepSpeed's raise_error_at_min_scale). The overflow
	 * that brought the scale down to --min-loss-scale counted too. */
	int scaler = s->plan.fp16 && s->o->loss_scale <= 0 && ran_at > s->o->min_loss_scale;
	if (skipped && !scaler) {
		s->steps.bad_run++;
		s->steps.bad_total++;
	} else if (!skipped) {
		s->steps.bad_run = 0;
	}
	return rc;
}

void hpu__strat_set_recordable(hpu_strat *s, int on)
{
	s->vars.recordable = on;
}

int hpu__strat_recordable(const hpu_strat *s)
{
	return s->vars.recordable;
}

int hpu__strat_forward_meets(const hpu_strat *s)
{
	if (s->world == 1 || !hpu__strat_params_sharded(s))
		return 0;
	for (int k = 0; k < s->nunits; k++)
		if (!s->u[k].persistent)
			return 1;
	return 0;
}

const char *hpu__strat_forward_host_part(const hpu_strat *s)
{
	const char *staged = hpu__host_stage_unrecordable(s, 1);
	if (staged)
		return staged;
	if (s->nvp)
		return "the NVMe tier reads the parameters' pieces from their files for the "
		       "forward's gathers (--offload-param nvme)";
	/* one worker: a unit not kept whole is copied from host memory for
	 * the forward (between workers the gathers stage it) */
	for (int k = 0; s->world == 1 && hpu__strat_params_host(s) && k < s->nunits; k++)
		if (!s->u[k].persistent)
			return "the parameters are kept in host memory (--offload-param cpu) and "
			       "copied from there for the forward";
	return NULL;
}

const char *hpu__strat_host_part(const hpu_strat *s)
{
	const char *staged = hpu__host_stage_unrecordable(s, 0);
	if (staged)
		return staged;
	if (s->nv || s->nvp)
		return "the NVMe tier (--offload-optimizer nvme or --offload-param nvme) reads and "
		       "writes its files in the step";
	if (hpu__strat_update_host(s))
		return "the optimizer's update runs on the host (--offload-optimizer cpu)";
	if (hpu__strat_params_host(s))
		return "the parameters are kept in host memory (--offload-param cpu)";
	if (hpu__strat_grads_host(s))
		return "the gradients are kept in host memory";
	return NULL;
}

int hpu__strat_bad_run(const hpu_strat *s)
{
	return s->steps.bad_run;
}

long hpu__strat_bad_total(const hpu_strat *s)
{
	return s->steps.bad_total;
}

const float *hpu__strat_buffers(const hpu_strat *s)
{
	if (s->B && hpu__dev_owns(s->B)) { /* the host reads a copy */
		hpu__dev_d2h(NULL, s->stg.bsync, s->B, s->b->buffer_numel * 4);
		return s->stg.bsync;
	}
	return s->B;
}

/* ---- for logs and metrics ---- */

int hpu__strat_units(const hpu_strat *s)
{
	return s->nunits;
}

double hpu__strat_loss_scale(const hpu_strat *s)
{
	return s->steps.scale;
}

long hpu__strat_skipped(const hpu_strat *s)
{
	return s->steps.skipped;
}

/* ---- making and freeing ---- */

/* Per tensor, its last reader in training's and evaluation's forward;
 * per layer, the backward calls that use its parameters. */
static void plan_graph(hpu_strat *s)
{
	hpu_builder *b = s->b;
	for (int t = 0; t < b->ntensors; t++)
		s->last_train[t] = s->last_eval[t] = -1;
	for (int i = 0; i < b->nlayers; i++) {
		hpu_layer *l = b->layers[i];
		s->seg_start[i] = i; /* not checkpointed: nothing to recompute */
		for (int k = 0; k < l->nin; k++) {
			if (l->for_loss)
				s->last_train[l->in[k]] = i;
			if (l->for_eval)
				s->last_eval[l->in[k]] = i;
		}
		if (!l->backward)
			continue;
		if (l->nparams)
			s->gusers[i]++;
		for (int k = 0; k < l->nuses; k++)
			s->gusers[l->uses[k]]++;
	}
}

/* zero3: the last layer whose parameters training's forward gathers
 * (its own, not persistent), kept gathered into its backward: the layers
 * between gather nothing. -1 when it has no backward, or where it or a
 * layer that runs after it shares parameters (the minimal form). */
static int keep_layer(const hpu_strat *s)
{
	if (!hpu__strat_params_sharded(s))
		return -1;
	for (int i = s->nlayers - 1; i >= 0; i--) {
		const hpu_layer *l = s->b->layers[i];
		if (!l->for_loss)
			continue;
		if (l->nuses)
			return -1;
		if (!l->nparams || l->unit < 0 || s->u[l->unit].persistent)
			continue;
		return l->backward ? i : -1;
	}
	return -1;
}

/* Whether maxbatch * per + fixed floats, their bytes and the staging's
 * rounding up fit a size (hpu__strat_saved_floats and _scratch_floats
 * count them unchecked after this); else the layer is refused, naming
 * what hpu_layer_memory was given (the sums wrapped: a 0-byte block). */
static int memory_fits(hpu_strat *s, const hpu_layer *l, const char *what, size_t per, size_t fixed)
{
	size_t n;
	if (__builtin_mul_overflow((size_t)s->maxbatch, per, &n) ||
	    __builtin_add_overflow(n, fixed, &n) || n > SIZE_MAX / 8)
		return fail(s, "layer %s: its %s memory (hpu_layer_memory: %zu floats a sample "
			       "at a batch of up to %d, and %zu more) is more than a size can hold",
			    l->name, what, per, s->maxbatch, fixed);
	return 0;
}

/* The layers' shared scratch, and the buffers (initialized, or from the
 * checkpoint being resumed, and in step across ranks from the start). */
static int alloc_scratch_buffers(hpu_strat *s)
{
	hpu_builder *b = s->b;
	size_t scratch = 0;
	for (int i = 0; i < b->nlayers; i++) {
		hpu_layer *l = b->layers[i];
		if (memory_fits(s, l, "saved", l->saved_ps, l->saved_fixed) < 0 ||
		    memory_fits(s, l, "scratch", l->scratch_ps, l->scratch_fixed) < 0)
			return -1;
		if (hpu__strat_scratch_floats(s, l) > scratch)
			scratch = hpu__strat_scratch_floats(s, l);
	}
	if (scratch && !(s->scratch = dalloc(s, HPU_MEM_ACTS, scratch * 4, "layers' scratch")))
		return -1;
	if (!b->nbuffers)
		return 0;
	if (!(s->B = dalloc(s, HPU_MEM_PARAMS, b->buffer_numel * 4, "buffers")))
		return -1;
	if (!(s->stg.bsync = hpu__dev_hbuf_alloc(HPU_MEM_OTHER, b->buffer_numel * 4, "buffers' staging")))
		return fail(s, "%s", hpu__devmem_error());
	/* made by the host: in place, or in the staging and copied in */
	int direct = !hpu__dev_owns(s->B);
	float *dst = direct ? s->B : s->stg.bsync;
	if (s->resume ? hpu__strat_resume_buffers(s, dst) < 0
		      : hpu__model_init_buffers(b, s->o->seed, dst, s->err, s->errlen) < 0)
		return -1;
	for (int i = 0; i < b->nlayers; i++) {
		hpu_layer *l = b->layers[i];
		if (l->nbuffers)
			l->bbase = s->B + b->buffers[l->first_buffer].offset;
	}
	if (s->world > 1) {
		int rc = hpucoll_broadcast(s->comm, dst, dst, b->buffer_numel, HPUCOLL_F32, 0);
		if (rc)
			return hpu__strat_coll_fail(s, "buffer broadcast", rc);
	}
	if (!direct)
		hpu__dev_h2d(NULL, s->B, dst, b->buffer_numel * 4);
	return 0;
}


/* ---- the strategy's hooks ---- */

/* fp32: a layer computes on the strategy's parameters and gradients
 * (zero3: its gathered unit, zero2/3: its unit's bucket). */
static int fp32_release(hpu_strat *s, int i)
{
	return hpu__zero_release(s, s->b->layers[i]->unit);
}

static int fp32_grads_for(hpu_strat *s, int i)
{
	return hpu__sync_grads_for(s, s->b->layers[i]->unit);
}

/* Mixed precision: on fp32 copies of its 16-bit parameters and fp32
 * gradients of its own (strategy_mp.c). */
static int mp_release(hpu_strat *s, int i)
{
	hpu__mp_release_layer(s, i);
	return 0;
}

/* The hooks the plan calls for: the precision picks how a layer gets its
 * parameters and gradients and how the step updates; the gradients'
 * collective (strategy_sync.c switches on the plan's) when they move. */
static void choose_hooks(hpu_strat *s)
{
	hpu__strat_hooks *h = &s->hooks;
	h->unit_done = hpu__sync_unit_done;
	h->reduce = hpu__sync_reduce;
	if (s->plan.mixed) {
		h->init_params = hpu__mp_init_params;
		h->acquire = hpu__mp_acquire;
		h->release = mp_release;
		h->grads_for = hpu__mp_grads_for;
		h->grads_done = hpu__mp_grads_done;
		h->step = hpu__mp_step;
	} else {
		h->init_params = init_params;
		h->acquire = hpu__zero_acquire;
		h->release = fp32_release;
		h->grads_for = fp32_grads_for;
		h->grads_done = fp32_grads_done;
		h->step = fp32_step;
	}
}

int hpu__strat_new(hpu_strat **out, hpu_builder *b, hpucoll_comm *comm,
		   const hpu_train_opts *o, int maxbatch, hpu_ckpt *resume, char *err,
		   size_t errlen)
{
	*out = NULL;
	hpu_strat *s = calloc(1, sizeof *s);
	if (!s) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	s->b = b;
	s->comm = comm;
	s->o = o;
	s->kind = o->strategy;
	s->rank = hpucoll_comm_rank(comm);
	s->world = hpucoll_comm_size(comm);
	s->sharded = s->kind >= HPU_STRATEGY_ZERO1;
	s->nlayers = b->nlayers;
	s->maxbatch = maxbatch;
	s->err = err;
	s->errlen = errlen;
	s->load_fd = -1;
	s->resume = resume;
	*out = s;
	int L = b->nlayers, T = b->ntensors;
	s->u = calloc((size_t)L + 1, sizeof *s->u);
	s->q = calloc((size_t)L + 2, sizeof *s->q);
	s->t_data = calloc((size_t)T, sizeof *s->t_data);
	s->t_grad = calloc((size_t)T, sizeof *s->t_grad);
	s->transient = calloc((size_t)T, 1);
	s->unread = calloc((size_t)T, 1);
	s->nobwd = calloc((size_t)T, 1);
	s->keep32 = calloc((size_t)T, 1);
	s->inplace = calloc((size_t)L, sizeof *s->inplace);
	s->round16 = calloc((size_t)T, 1);
	s->round_ok = o->precision == HPU_PREC_BF16_MIXED;
	s->last_train = calloc((size_t)T, sizeof *s->last_train);
	s->last_eval = calloc((size_t)T, sizeof *s->last_eval);
	s->saved = calloc((size_t)L, sizeof *s->saved);
	s->saved_transient = calloc((size_t)L, 1);
	s->seg_start = calloc((size_t)L, sizeof *s->seg_start);
	s->run_mask = calloc((size_t)L, 1);
	s->gusers = calloc((size_t)L, sizeof *s->gusers);
	s->gpend = calloc((size_t)L, sizeof *s->gpend);
	s->lcp = calloc((size_t)L, sizeof *s->lcp);
	s->lgs = calloc((size_t)L, sizeof *s->lgs);
	s->z3.own16 = calloc((size_t)L, sizeof *s->z3.own16);
	s->act16 = o->precision == HPU_PREC_BF16_MIXED || o->precision == HPU_PREC_FP8;
	if (s->act16 && !(s->a16 = calloc((size_t)T, sizeof *s->a16)))
		return fail(s, "out of memory");
	if (!s->u || !s->q || !s->t_data || !s->t_grad || !s->transient || !s->unread || !s->nobwd ||
	    !s->keep32 || !s->inplace || !s->round16 ||
	    !s->last_train ||
	    !s->last_eval || !s->saved || !s->saved_transient || !s->seg_start || !s->run_mask ||
	    !s->gusers || !s->gpend || !s->lcp || !s->lgs || !s->z3.own16)
		return fail(s, "out of memory");
	s->ctx = (hpu_ctx){.train = 1, .accum = 1, .rank = s->rank, .world = s->world,
			   .seed = o->seed};
	plan_graph(s);
	hpu__plan_make(&s->plan, o, s->world, hpu__optim_state_floats(o));
	s->steps.scale = !s->plan.fp16 ? 1.0 : o->loss_scale > 0 ? o->loss_scale
				   : ldexp(1.0, o->initial_scale_power);
	s->steps.hyst_left = o->hysteresis;
	s->steps.last_overflow = -1;
	choose_hooks(s);
	build_units(s);
	s->z3.keep = keep_layer(s);
	for (int i = 0; i + 1 < L; i++)
		if (o->activation_checkpointing)
			b->layers[i]->ckpt = 1;
	hpu__act_plan(s);
	if (o->load_params[0] &&
	    (s->load_fd = hpu__params_open(b, o->load_params, err, errlen)) < 0)
		return -1;
	int rc = alloc_states(s) < 0 ||
		 s->hooks.init_params(s) < 0;
	if (s->load_fd >= 0)
		close(s->load_fd);
	s->load_fd = -1;
	if (rc || (resume && hpu__strat_resume_state(s) < 0) || alloc_scratch_buffers(s) < 0 ||
	    hpu__vars_open(s) < 0)
		return -1;
	/* the first step's gradients owed zeros as every later step's (fp32's
	 * step leaves them so): a first step recorded under --graphs then
	 * makes the claims its replays find (its products added to the zeros
	 * of the allocation were added to the previous step's gradients) */
	if (s->G && !s->plan.mixed)
		zero_grads(s);
	return hpu__dc_open(s); /* every rank at once */
}

void hpu__strat_free(hpu_strat **ps)
{
	hpu_strat *s = *ps;
	if (!s)
		return;
	while (s->qn) { /* after an error: let the collectives end first */
		hpu__dc_wait(&s->q[s->qhead].req);
		s->qhead = (s->qhead + 1) % (s->nunits + 1);
		s->qn--;
	}
	for (int k = 0; s->u && k < s->nunits; k++) {
		unit *u = &s->u[k];
		if (u->gather)
			hpucoll_wait(&u->gather);
		hpu__dfree(u->full);
		hpu__dfree(u->gbuf);
		hpu__dfree(u->cbuf);
	}
	for (int t = 0; s->t_data && t < s->b->ntensors; t++) {
		hpu__ac_twin_remove(s->t_data[t]);
		if (s->b->tensors[t].producer >= 0 || hpu__dev_owns(s->t_data[t]))
			hpu__dfree(s->t_data[t]); /* a field's: its copy on the device */
		hpu__dfree(s->t_grad[t]);
		if (s->a16)
			hpu__dfree(s->a16[t]);
	}
	for (int i = 0; s->lcp && i < s->nlayers; i++) {
		hpu__ac_param16_remove(s->lcp[i]);
		hpu__dfree(s->lcp[i]);
		hpu__ac_fresh_forget(s->lgs[i], s->b->layers[i]->plen);
		hpu__dfree(s->lgs[i]);
		hpu__dfree(s->z3.own16[i]);
		if (s->saved)
			hpu__dfree(s->saved[i]);
	}
	hpu__dc_free(s);
	hpu__strat_ustage_close(s);
	hpu__dfree(s->lsum);
	hpu__dev_host_free(s->lsum_host);
	hpu__dfree(s->ev.acc);
	hpu__dfree(s->ev.lsum);
	hpu__dfree(s->ev.w);
	hpu__dfree(s->ev.rows);
	hpu__dev_host_free(s->ev.acc_host);
	hpu__dev_host_free(s->ev.rows_host);
	for (int t = 0; s->stg.t_host && t < s->b->ntensors; t++)
		hpu__dev_host_free(s->stg.t_host[t]);
	free(s->stg.t_host);
	hpu__host_stage_free(s);
	hpu__dfree(s->scratch);
	hpu__dfree(s->B);
	hpu__dev_hbuf_free(s->stg.bsync);
	hpu__dfree(s->P);
	if (s->G && !s->plan.mixed)
		hpu__ac_fresh_forget(s->G, s->total);
	hpu__dfree(s->G);
	hpu__dfree(s->PS);
	hpu__dfree(s->GS);
	hpu__dfree(s->state);
	hpu__dfree(s->M);
	hpu__dfree(s->chunk);
	hpu__nv_close(s);
	hpu__nvp_close(s);
	hpu__vars_close(s);
	free(s->lcp);
	free(s->lgs);
	free(s->z3.own16);
	free(s->a16);
	free(s->u);
	free(s->q);
	free(s->t_data);
	free(s->t_grad);
	free(s->transient);
	free(s->unread);
	free(s->nobwd);
	free(s->keep32);
	free(s->inplace);
	free(s->round16);
	free(s->last_train);
	free(s->last_eval);
	free(s->saved);
	free(s->saved_transient);
	free(s->seg_start);
	free(s->run_mask);
	free(s->gusers);
	free(s->gpend);
	free(s->canon);
	free(s);
	*ps = NULL;
}
