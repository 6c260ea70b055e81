/* strategy_plan: the placement plan of a running strategy, shown --
 * printed for --verbose, written into checkpoint manifests -- and the
 * model states it predicts. The plan itself is worker/strategy/plan.c. */
#include <stdio.h>
#include <stdlib.h>

#include "worker/device/device.h"
#include "worker/strategy/strategy_impl.h"

uint64_t hpu__strat_plan_passing(const hpu_strat *s, int *exact);

uint64_t hpu__strat_plan_states(const hpu_strat *s)
{
	const hpu_plan *p = &s->plan;
	uint64_t n = hpu__plan_states_bytes(p, s->total, s->shard_total);
	const hpu_plan_entry *pe = &p->e[HPU_PLAN_PARAMS];
	for (int k = 0; pe->sharded && k < s->nunits; k++) /* zero3: kept whole */
		if (s->u[k].persistent)
			n += (uint64_t)s->u[k].len * hpu__plan_esize(pe);
	return n + (uint64_t)s->b->buffer_numel * 4; /* the buffers, whole */
}

void hpu__strat_plan_print(const hpu_strat *s, FILE *f)
{
	const hpu_plan *p = &s->plan;
	char line[256];
	fprintf(f, "placement plan: %s, %s, %d rank%s, %zu floats laid out (%zu per rank's shard)\n",
		hpu__strategy_name(p->kind), hpu__precision_name(p->precision), p->world,
		p->world == 1 ? "" : "s", s->total, s->shard_total);
	for (int k = 0; k < HPU_PLAN_NSTATES; k++) {
		hpu__plan_describe(p, (hpu_plan_state)k, line, sizeof line);
		fprintf(f, "  %s\n", line);
	}
	hpu__act_describe(s, f);
	double psi = s->b->psi ? (double)s->b->psi : 1.0;
	uint64_t kept = hpu__strat_plan_states(s);
	int exact;
	uint64_t passing = hpu__strat_plan_passing(s, &exact);
	fprintf(f, "  model states kept on the device: %llu bytes (%.2f per parameter)\n",
		(unsigned long long)kept, (double)kept / psi);
	fprintf(f, "  model states passing: %s %llu bytes (%.2f per parameter), peak %llu\n",
		exact ? "exactly" : "at most", (unsigned long long)passing,
		(double)passing / psi, (unsigned long long)(kept + passing));
	if (hpu__dc_direct(s) && s->o->collectives == HPU_COLL_NCCL)
		fprintf(f, "  gradients' all-reduce: on device %s, over NCCL between the %d ranks "
			   "(nothing staged)\n",
			hpu__dev_name(), p->world);
	else if (hpu__dc_direct(s))
		fprintf(f, "  gradients' all-reduce: on device %s, device to device between the %d "
			   "ranks of this node (nothing staged)\n",
			hpu__dev_name(), p->world);
	else if (!hpu__dev_host_can_read() && !hpu__dev_caps_get()->host_mem && p->world > 1 &&
		 (p->e[HPU_PLAN_GRADS].coll == HPU_PLAN_ALL_REDUCE ||
		  p->e[HPU_PLAN_GRADS].coll == HPU_PLAN_ALL_REDUCE_FLAT))
		fprintf(f, "  gradients' all-reduce: libhpucoll, staged through host memory (%s)\n",
			s->dc.why);
	hpu_plan_copies c;
	if (hpu__strat_plan_copies(s, &c) < 0)
		return;
	hpu__plan_copies_describe(&c, 0, line, sizeof line);
	fprintf(f, "  copied per step on device %s: %s\n", hpu__dev_name(), line);
	hpu__plan_copies_describe(&c, 1, line, sizeof line);
	fprintf(f, "  copied per step on device %s: %s\n", hpu__dev_name(), line);
}

/* The step as worker/strategy/copies.h counts it: the units (zero3's
 * gathered once per forward and backward call that uses them, the layer
 * kept from forward into its backward once), the
 * batch's fields, the losses, the buffers synchronized, the host-only
 * layers' staging. */
int hpu__strat_plan_copies(const hpu_strat *s, hpu_plan_copies *c)
{
	const hpu_builder *b = s->b;
	hpu_plan_unit *pu = calloc((size_t)s->nunits + 1, sizeof *pu);
	if (!pu)
		return -1;
	hpu_plan_step st = {.units = pu, .nunits = s->nunits, .micro = s->maxbatch,
			    .accum = s->o->grad_accum, .nloss = b->nloss,
			    .host_can_read = hpu__dev_host_can_read(),
			    .grads_direct = hpu__dc_direct(s),
			    .colls_in_place = hpu__dev_caps_get()->host_mem,
			    .regathers = s->o->activation_checkpointing,
			    .vars_bytes = sizeof(hpu__dev_stepvars),
			    .host_decides = hpu__vars_host_decides(s),
			    .eager = !s->vars.recordable,
			    .sharded = s->sharded,
			    .clip = s->o->clip_norm > 0,
			    .grads_host = hpu__strat_grads_host(s)};
	for (int k = 0; k < s->nunits; k++)
		pu[k] = (hpu_plan_unit){.len = s->u[k].len, .piece = s->u[k].piece,
					.persistent = s->u[k].persistent};
	for (int i = 0; i < s->nlayers; i++) {
		const hpu_layer *l = b->layers[i];
		int calls = i == s->z3.keep ? 1 : !!l->for_loss + !!l->backward;
		if (l->nparams && l->unit >= 0)
			pu[l->unit].gathers += calls;
		if (l->nuses || l->ckpt) /* shared parameters, recomputation */
			st.regathers = 1;
	}
	for (int t = 0; t < b->ntensors; t++)
		if (b->tensors[t].producer < 0)
			st.sample_bytes += b->tensors[t].sample_numel * 4;
	for (int i = 0; s->world > 1 && i < b->nbuffers; i++)
		if (b->buffers[i].sync != HPU_BUFFER_LOCAL)
			st.synced_buffers += b->buffers[i].numel;
	int guess = hpu__host_stage_plan(s, s->maxbatch, &st.staged_h2d, &st.staged_d2h);
	hpu__plan_copies(&s->plan, &st, c);
	if (guess)
		c->exact = 0;
	free(pu);
	return 0;
}

cJSON *hpu__strat_plan_json(const hpu_strat *s)
{
	const hpu_plan *p = &s->plan;
	cJSON *j = cJSON_CreateObject();
	for (int k = 0; k < HPU_PLAN_NSTATES; k++) {
		const hpu_plan_entry *e = &p->e[k];
		cJSON *o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "where", hpu__plan_where_name(e->where));
		cJSON_AddStringToObject(o, "dtype", hpu__plan_dtype_name(e->dtype));
		cJSON_AddBoolToObject(o, "sharded", e->sharded);
		cJSON_AddNumberToObject(o, "copies", e->copies);
		cJSON_AddStringToObject(o, "collective", hpu__plan_coll_name(e->coll));
		cJSON_AddItemToObject(j, hpu__plan_state_name((hpu_plan_state)k), o);
	}
	return j;
}

/* The largest run of three consecutive units: ZeRO-2/3's gradient
 * buckets alive at once in backward (the one being filled and two in
 * flight). */
static size_t three_units(const hpu_strat *s)
{
	size_t best = 0;
	for (int k = 0; k < s->nunits; k++) {
		size_t n = 0;
		for (int j = k; j < k + 3 && j < s->nunits; j++)
			n += s->u[j].len;
		best = n > best ? n : best;
	}
	return best;
}

uint64_t hpu__strat_plan_passing(const hpu_strat *s, int *exact)
{
	const hpu_plan *p = &s->plan;
	uint64_t n = 0;
	size_t largest = 0;
	for (int i = 0; i < s->nlayers; i++)
		largest = s->b->layers[i]->plen > largest ? s->b->layers[i]->plen : largest;
	*exact = 1;
	if (p->mixed) /* the running layer's fp32 compute copy and gradients */
		n += 8 * (uint64_t)largest;
	if (p->kind >= HPU_STRATEGY_ZERO2) {
		/* at most: how many buckets are still in flight when the next
		 * one is made depends on how fast the collectives complete */
		n += (uint64_t)three_units(s) * hpu__plan_esize(&p->e[HPU_PLAN_GRADS]);
		*exact = 0;
	}
	if (p->kind == HPU_STRATEGY_ZERO3) { /* the layer in use and those prefetched */
		size_t ahead = (size_t)s->o->prefetch_bucket, live = largest;
		if ((size_t)s->o->max_live_params < ahead)
			ahead = (size_t)s->o->max_live_params;
		live = largest + ahead < s->total ? largest + ahead : s->total;
		n += (uint64_t)live * hpu__plan_esize(&p->e[HPU_PLAN_PARAMS]);
		*exact = 0;
	}
	return n;
}
