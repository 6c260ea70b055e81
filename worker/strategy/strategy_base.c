/* strategy_base: what every strategy file uses -- errors, allocating
 * device and offloadable memory, the units' names, pointing layers at
 * their parameters, the optimizer's update on the side the plan runs it.
 * Calls no other strategy file. */
#include <stdarg.h>
#include <stdio.h>

#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "worker/ops/autocast.h"
#include "worker/strategy/strategy_impl.h"

#define fail hpu__strat_fail

int hpu__strat_fail(hpu_strat *s, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->err, s->errlen, fmt, ap);
	va_end(ap);
	return -1;
}

int hpu__strat_coll_fail(hpu_strat *s, const char *what, int rc)
{
	return fail(s, "%s failed: %s", what, hpucoll_comm_why(s->comm, rc));
}

void *hpu__strat_dalloc(hpu_strat *s, hpu_mem_kind kind, size_t bytes, const char *what)
{
	void *p = hpu__dalloc(kind, bytes, what);
	if (!p)
		fail(s, "%s", hpu__devmem_error());
	return p;
}

/* A model state that ZeRO-Offload may keep outside the device: in the
 * host tier when `where` says so (cpu; nvme keeps its in-memory
 * buffers there too), else device memory. */
void *hpu__strat_salloc(hpu_strat *s, hpu_offload where, hpu_mem_kind kind, size_t bytes,
			const char *what)
{
	void *p = where ? hpu__halloc(kind, bytes, what) : hpu__dalloc(kind, bytes, what);
	if (!p)
		fail(s, "%s", hpu__devmem_error());
	return p;
}

void hpu__strat_point(hpu_strat *s, int k, float *p, float *g)
{
	unit *u = &s->u[k];
	for (int i = u->first; i <= u->last; i++) {
		hpu_layer *l = s->b->layers[i];
		if (p)
			l->pbase = p + (l->off - u->off);
		if (g)
			l->gbase = g + (l->off - u->off);
	}
}

const char *hpu__strat_unit_name(const hpu_strat *s, int k)
{
	return s->b->layers[s->u[k].first]->name;
}

/* ---- gradients owed zeros (issue 38) ---- */

int hpu__strat_fresh_ok(const hpu_strat *s, int i)
{
	const hpu_layer *l = s->b->layers[i];
	return l->grads_in_ops && l->plen && s->gusers[i] == 1 && hpu__dev_ops_fill();
}

int hpu__strat_fresh_add(hpu_strat *s, int i, float *g, uint16_t *g16)
{
	hpu_layer *l = s->b->layers[i];
	const hpu_param_info *ps = &s->b->params[l->first_param];
	for (int k = 0; k < l->nparams; k++) {
		size_t at = ps[k].rel, end = k + 1 < l->nparams ? ps[k + 1].rel : l->plen;
		int rc = g16 ? hpu__ac_fresh_add16(g + at, end - at, g16 + at)
			     : hpu__ac_fresh_add(g + at, end - at);
		if (rc < 0) {
			hpu__ac_fresh_flush(g, l->plen);
			return -1;
		}
	}
	return 0;
}


/* ---- the optimizer's update, where the plan runs it ----
 *
 * Under --offload-optimizer (cpu, nvme) the update runs on the host over
 * host memory (hpu__dev_host_rt, as ZeRO-Offload's CPU Adam), else on
 * the device; no device op reads host memory and no host loop device
 * memory. What is kept on the other side crosses by explicit, counted
 * copies, a chunk at a time through s->stg.update (on the update's side):
 * zero1's gradients, kept whole on the device, out to the host; the
 * parameters where the update is not (fp32: there and back; mixed
 * precision: only the 16-bit rounding back, the master weights being on
 * the update's side). worker/strategy/copies.c predicts these bytes. */

static int state_host(const hpu_strat *s, hpu_plan_state st)
{
	return hpu__plan_on_host(s->plan.e[st].where);
}

int hpu__strat_update_host(const hpu_strat *s)
{
	return hpu__plan_on_host(s->plan.update);
}

int hpu__strat_grads_host(const hpu_strat *s)
{
	return state_host(s, HPU_PLAN_GRADS);
}

int hpu__strat_params_host(const hpu_strat *s)
{
	return state_host(s, HPU_PLAN_PARAMS);
}

/* s->stg.update: a chunk of gradients, of fp32 parameters and of 16-bit ones. */
#define USTAGE_BYTES ((size_t)HPU__STRAT_CHUNK * (4 + 4 + 2))

int hpu__strat_ustage_open(hpu_strat *s)
{
	int host = hpu__strat_update_host(s);
	if (!host && !state_host(s, HPU_PLAN_PARAMS))
		return 0; /* everything on the device: nothing crosses */
	s->stg.update = host ? hpu__dev_host_alloc(USTAGE_BYTES)
			 : hpu__dalloc(HPU_MEM_OTHER, USTAGE_BYTES, "optimizer's staging");
	if (!s->stg.update)
		return fail(s, "out of %s memory for the optimizer's staging (%zu bytes)",
			    host ? "host" : "device", USTAGE_BYTES);
	return 0;
}

void hpu__strat_ustage_close(hpu_strat *s)
{
	if (s->stg.update && hpu__strat_update_host(s))
		hpu__dev_host_free(s->stg.update);
	else
		hpu__dfree(s->stg.update);
	s->stg.update = NULL;
}

/* n bytes to the update's side (back 0) or back from it. */
static void cross(const hpu_strat *s, int back, void *dst, const void *src, size_t n)
{
	if (hpu__strat_update_host(s) != back)
		hpu__dev_d2h(NULL, dst, src, n);
	else
		hpu__dev_h2d(NULL, dst, src, n);
}

static void update_range(hpu_strat *s, int host, hpu_optim *o, size_t from, size_t n, float *p,
			 const void *g, uint16_t *p16, float gscale, double lr)
{
	if (s->plan.mixed)
		(host ? hpu__optim_range16_host : hpu__optim_range16)(
			o, from, n, p, g, p16, s->plan.fp16, s->chunk, HPU__STRAT_CHUNK, gscale, lr);
	else
		(host ? hpu__optim_range_host : hpu__optim_range)(o, from, n, p, g, gscale, lr);
}

void hpu__strat_update(hpu_strat *s, hpu_optim *o, size_t from, size_t n, float *p,
		       const void *g, void *w, float gscale, double lr)
{
	uint16_t *p16 = s->plan.mixed ? w : NULL; /* else w is p */
	int host = hpu__strat_update_host(s);
	int gx = state_host(s, HPU_PLAN_GRADS) != host, px = state_host(s, HPU_PLAN_PARAMS) != host;
	if (!gx && !px) { /* every operand on the update's side */
		update_range(s, host, o, from, n, p, g, p16, gscale, lr);
		return;
	}
	size_t gsz = hpu__strat_esize(s, HPU_PLAN_GRADS);
	float *sg = s->stg.update, *sp = sg + HPU__STRAT_CHUNK;
	uint16_t *sp16 = (uint16_t *)(sp + HPU__STRAT_CHUNK);
	for (size_t i = 0; i < n; i += HPU__STRAT_CHUNK) {
		size_t c = hpu__strat_chunk(n, i);
		const void *gi = (const char *)g + i * gsz;
		float *pi = p + i;
		uint16_t *p16i = p16 ? p16 + i : NULL;
		if (gx) {
			cross(s, 0, sg, gi, c * gsz);
			gi = sg;
		}
		if (px && !s->plan.mixed) {
			cross(s, 0, sp, pi, c * 4);
			pi = sp;
		}
		if (px && s->plan.mixed)
			p16i = sp16;
		update_range(s, host, o, from + i, c, pi, gi, p16i, gscale, lr);
		if (px && !s->plan.mixed)
			cross(s, 1, p + i, sp, c * 4);
		if (px && s->plan.mixed)
			cross(s, 1, p16 + i, sp16, c * 2);
	}
}

int hpu__strat_nonfinite(const hpu_strat *s, const void *g, size_t n)
{
	const hpu__dev_rtops *rt = hpu__dev_host_rt();
	if (hpu__strat_grads_host(s))
		return s->plan.mixed ? rt->nonfinite16(s->plan.fp16, g, n) : rt->nonfinite(g, n);
	return s->plan.mixed ? hpu__dev_nonfinite16(s->plan.fp16, g, n) : hpu__dev_nonfinite(g, n);
}

void hpu__strat_sumsq_host(hpu_strat *s, double *acc, const void *g, size_t n)
{
	const hpu__dev_rtops *rt = hpu__dev_host_rt();
	if (s->plan.mixed)
		*acc = rt->sumsq16(*acc, s->plan.fp16, g, n, s->chunk, HPU__STRAT_CHUNK);
	else
		*acc += rt->sumsq(g, n);
}

void hpu__strat_gacc(hpu_strat *s, int host, void *dst, const void *src, size_t n)
{
	const hpu__dev_rtops *rt = hpu__dev_host_rt();
	if (!s->plan.mixed) {
		if (host)
			rt->add(dst, src, n);
		else
			hpu__dev_add(dst, src, n);
		return;
	}
	/* 16-bit: widened a chunk at a time, summed in fp32, rounded back */
	for (size_t i = 0; i < n; i += HPU__STRAT_CHUNK) {
		size_t c = hpu__strat_chunk(n, i);
		const uint16_t *si = (const uint16_t *)src + i;
		uint16_t *di = (uint16_t *)dst + i;
		if (host) {
			rt->from16(s->plan.fp16, s->chunk, si, c);
			rt->acc16(s->plan.fp16, di, s->chunk, c);
		} else {
			hpu__dev_from16(s->plan.fp16, s->chunk, si, c);
			hpu__dev_acc16(s->plan.fp16, di, s->chunk, c);
		}
	}
}
