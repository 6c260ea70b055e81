/* strategy_mp: mixed precision (bf16-mixed, 16-mixed, fp8).
 *
 * The working parameters and gradients are 16-bit, whole or ZeRO's
 * shards, where fp32 runs keep fp32 ones; the optimizer updates fp32
 * master weights in its own space (the range this rank updates) and
 * rounds them back into the working copy. A layer computes on an fp32
 * copy of its 16-bit parameters (ZeRO-3: of the gathered unit), held
 * from before its forward or backward until after it, whose values are
 * made as they are read: a bf16 product reads the 16-bit copy itself
 * (hpu__ac_param16_add). It accumulates into
 * fp32 gradients of its own that go into the 16-bit ones when its
 * backward ends. Under 16-mixed a dynamic loss scale keeps small
 * gradients representable; a gradient overflow on any rank skips the
 * step on every rank. */

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "worker/ops/autocast.h"
#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "common/lowp.h"
#include "worker/hpu/prof.h"
#include "common/simd.h"
#include "worker/strategy/strategy_impl.h"

#define fail hpu__strat_fail
#define dalloc hpu__strat_dalloc

/* ---- making ---- */

/* dst[n] (device memory or the host tier) = the 16-bit rounding of the
 * host's src[n]: rounded by the host, then copied. 0, or -1 (s->err). */
static int host_to16(hpu_strat *s, uint16_t *dst, const float *src, size_t n)
{
	uint16_t *h = hpu__dev_host_alloc(n * 2);
	if (!h)
		return fail(s, "out of host memory for the initial 16-bit parameters");
	hpu__dev_host_rt()->to16(s->plan.fp16, h, src, n);
	hpu__dev_copy(dst, h, n * 2);
	hpu__dev_host_free(h);
	return 0;
}

/* Unit j's initial values, made a layer at a time (then the unit's
 * padding), without the NVMe tiers: an fp32 copy of the whole unit (the
 * whole model under zero1's default unit, fast_ddp's and a whole-model
 * bucket's) made a transient of 4 bytes a parameter, counted against
 * --device-memory on the CPU. The values are the same: the rounding is
 * per element. */
static int init_unit_by_layers(hpu_strat *s, int j)
{
	unit *u = &s->u[j];
	hpu_builder *b = s->b;
	size_t mine = s->sharded ? (size_t)s->rank * u->piece : 0, c0 = 0;
	char what[160];
	if (!s->P && u->persistent) {
		snprintf(what, sizeof what, "parameters of %s (persistent)", hpu__strat_unit_name(s, j));
		if (!(u->full = dalloc(s, HPU_MEM_PARAMS, u->len * 2, what)))
			return -1;
	}
	for (int i = u->first; i <= u->last + 1; i++) {
		size_t c1;
		if (i <= u->last) {
			if (!b->layers[i]->plen)
				continue;
			c0 = b->layers[i]->off - u->off;
			c1 = c0 + b->layers[i]->plen;
			snprintf(what, sizeof what, "initial parameters of %s", b->layers[i]->name);
		} else {
			c1 = u->len; /* the padding after the last layer */
			if (c0 >= c1)
				break;
			snprintf(what, sizeof what, "initial padding of %s", hpu__strat_unit_name(s, j));
		}
		/* made by the host: host memory where the device's is not */
		float *buf = hpu__dev_hbuf_alloc(HPU_MEM_OTHER, (c1 - c0) * 4, what);
		if (!buf)
			return fail(s, "%s", hpu__devmem_error());
		int rc = hpu__strat_fill_span(s, j, c0, c1, buf);
		size_t a = c0 > mine ? c0 : mine, e = c1 < mine + u->opt.n ? c1 : mine + u->opt.n;
		if (rc == 0 && a < e)
			hpu__dev_copy(u->opt_p + (a - mine), buf + (a - c0), (e - a) * 4);
		if (rc == 0 && s->P) {
			rc = host_to16(s, (uint16_t *)s->P + u->off + c0, buf, c1 - c0);
		} else if (rc == 0) {
			e = c1 < mine + u->piece ? c1 : mine + u->piece;
			if (a < e)
				rc = host_to16(s, (uint16_t *)u->opt_w + (a - mine), buf + (a - c0), e - a);
			if (rc == 0 && u->persistent)
				rc = host_to16(s, (uint16_t *)u->full + c0, buf, c1 - c0);
		}
		hpu__dev_hbuf_free(buf);
		if (rc < 0)
			return -1;
		c0 = c1;
	}
	return 0;
}

/* The fp32 initial values become the master weights; the working copy is
 * their 16-bit rounding, on every rank alike. */
int hpu__mp_init_params(hpu_strat *s)
{
	for (int j = 0; j < s->nunits; j++) {
		unit *u = &s->u[j];
		char what[128];
		if (!s->nv && !s->nvp) {
			if (init_unit_by_layers(s, j) < 0)
				return -1;
			continue;
		}
		snprintf(what, sizeof what, "initial parameters of %s", hpu__strat_unit_name(s, j));
		/* made by the host: host memory where the device's is not */
		float *full = hpu__dev_hbuf_alloc(HPU_MEM_OTHER, u->len * 4, what);
		if (!full)
			return fail(s, "%s", hpu__devmem_error());
		if (hpu__strat_fill_unit(s, j, full) < 0) {
			hpu__dev_hbuf_free(full);
			return -1;
		}
		size_t mine = s->sharded ? (size_t)s->rank * u->piece : 0;
		if (s->nv) {
			if (hpu__nv_fill(s, j, full + mine) < 0) {
				hpu__dev_hbuf_free(full);
				return -1;
			}
		} else {
			hpu__dev_copy(u->opt_p, full + mine, u->opt.n * 4);
		}
		if (s->P) {
			if (host_to16(s, (uint16_t *)s->P + u->off, full, u->len) < 0) {
				hpu__dev_hbuf_free(full);
				return -1;
			}
		} else {
			if (s->nvp && !hpu__nvp_get(s, j, 0)) {
				hpu__dev_hbuf_free(full);
				return -1;
			}
			if (host_to16(s, u->opt_w, full + mine, u->piece) < 0 ||
			    (s->nvp && hpu__nvp_put(s, j) < 0)) {
				hpu__dev_hbuf_free(full);
				return -1;
			}
			if (u->persistent) {
				snprintf(what, sizeof what, "parameters of %s (persistent)",
					 hpu__strat_unit_name(s, j));
				if (!(u->full = dalloc(s, HPU_MEM_PARAMS, u->len * 2, what))) {
					hpu__dev_hbuf_free(full);
					return -1;
				}
				if (host_to16(s, u->full, full, u->len) < 0) {
					hpu__dev_hbuf_free(full);
					return -1;
				}
			}
		}
		hpu__dev_hbuf_free(full);
	}
	return s->nvp ? hpu__nvp_drop_all(s) : 0;
}

/* ---- the layers' fp32 parameters and gradients ---- */

/* Layer i computes on an fp32 copy of its 16-bit parameters (zero3:
 * gathered first, the 16-bit gather freed once copied), made before its
 * forward and its backward, freed after. */
int hpu__mp_acquire(hpu_strat *s, int i, int dir, int stop)
{
	hpu_layer *l = s->b->layers[i];
	int k = l->unit;
	if (k < 0)
		return 0;
	unit *u = &s->u[k];
	int gathered = hpu__strat_params_sharded(s) && !u->persistent;
	if (!s->lcp[i]) {
		if (gathered && hpu__zero_gather_wait(s, k) < 0)
			return -1;
		const uint16_t *src = s->P ? (uint16_t *)s->P + l->off
					   : (uint16_t *)u->full + (l->off - u->off);
		char what[128];
		snprintf(what, sizeof what, "fp32 compute copy of %s", l->name);
		if (!(s->lcp[i] = hpu__dalloc_uninit(HPU_MEM_PARAMS, l->plen * 4, what))) {
			fail(s, "%s", hpu__devmem_error());
			return -1;
		}
		/* the 16-bit source stays with the layer while it runs: bf16
		 * products read it, and the fp32 values are made as they are
		 * read (hpu_param, the ops) */
		if (hpu__ac_param16_add(s->lcp[i], src, l->plen, s->plan.fp16, 0) < 0) {
			hpu__dfree(s->lcp[i]);
			s->lcp[i] = NULL;
			fail(s, "out of host memory for the working parameters of %s", l->name);
			return -1;
		}
		if (gathered) {
			s->z3.own16[i] = u->full;
			u->full = NULL;
		}
	}
	l->pbase = s->lcp[i];
	return hpu__strat_params_sharded(s) ? hpu__zero_prefetch(s, i, dir, stop) : 0;
}

/* Where layer i's 16-bit gradients go when its backward ends (the
 * step's sum when they are whole, else zero2/3's bucket); NULL when
 * there is none yet. */
static uint16_t *grads16(hpu_strat *s, int i)
{
	hpu_layer *l = s->b->layers[i];
	unit *u = &s->u[l->unit];
	if (s->G)
		return (uint16_t *)s->G + l->off;
	return u->gbuf ? (uint16_t *)u->gbuf + (l->off - u->off) : NULL;
}

/* 1 when --inject-overflow-step writes an fp32 gradient of this rank in
 * this step (testing only). */
static int injecting(const hpu_strat *s)
{
	return !s->steps.injected && s->o->inject_overflow_step == s->steps.step_no + 1 &&
	       s->rank == 0;
}

/* Layer i's fp32 gradients, uninitialized, each parameter's (with its
 * padding) owed zeros until an op claims it or its backward ends (a
 * linear's weight gradient is then its product, not added to zeros).
 * Under bf16 where the 16-bit gradients are overwritten, not added to
 * (the step's first micro-step; zero2/3's bucket always), a bf16 product
 * may write its bf16 rounding there itself (hpu__ac_fresh_claim16). */
static int fresh_grads(hpu_strat *s, int i, const char *what)
{
	hpu_layer *l = s->b->layers[i];
	if (!(s->lgs[i] = hpu__dalloc_uninit(HPU_MEM_GRADS, l->plen * 4, what)))
		return fail(s, "%s", hpu__devmem_error());
	l->gbase = s->lgs[i];
	int direct = !s->plan.fp16 && !(s->G && s->micro != 0) && !injecting(s);
	if (hpu__strat_fresh_add(s, i, s->lgs[i], direct ? grads16(s, i) : NULL) < 0)
		hpu__dev_memset(NULL, s->lgs[i], 0, l->plen * 4);
	return 0;
}

/* Layer i accumulates into fp32 gradients of its own (and zero2/3's unit
 * gets its 16-bit bucket). */
int hpu__mp_grads_for(hpu_strat *s, int i)
{
	hpu_layer *l = s->b->layers[i];
	unit *u = &s->u[l->unit];
	char what[128];
	if (s->GS && !u->gbuf) {
		snprintf(what, sizeof what, "16-bit gradient bucket of %s",
			 hpu__strat_unit_name(s, l->unit));
		if (!(u->gbuf = dalloc(s, HPU_MEM_GRADS, u->len * 2, what)))
			return -1;
	}
	snprintf(what, sizeof what, "fp32 gradients of %s", l->name);
	/* kept until every backward using them ran (tied parameters) */
	if (!s->lgs[i] && hpu__strat_fresh_ok(s, i))
		return fresh_grads(s, i, what);
	if (!s->lgs[i] && !(s->lgs[i] = dalloc(s, HPU_MEM_GRADS, l->plen * 4, what)))
		return -1;
	l->gbase = s->lgs[i];
	return 0;
}

/* dst[n] = the 16-bit rounding of g[n], or += it when acc */
static void put16(hpu_strat *s, uint16_t *dst, const float *g, size_t n, int acc)
{
	if (n && acc)
		hpu__dev_acc16(s->plan.fp16, dst, g, n);
	else if (n)
		hpu__dev_to16(s->plan.fp16, dst, g, n);
}

/* Layer i's fp32 gradients go into the 16-bit ones (accumulating over
 * micro-steps where they are whole), but for the parameters whose bf16
 * gradients a product wrote there itself (hpu__ac_fresh_taken16). */
void hpu__mp_grads_done(hpu_strat *s, int i, int final)
{
	hpu_layer *l = s->b->layers[i];
	float *g = s->lgs[i];
	hpu__ac_fresh_flush(g, l->plen); /* what no op claimed: zeros */
	if (final && injecting(s)) {
		/* --inject-overflow-step: testing only */
		hpu__dev_h2d(NULL, g, &(float){INFINITY}, 4);
		s->steps.injected = 1;
	}
	uint16_t *dst = grads16(s, i);
	int acc = s->G && s->micro != 0; /* the step's first: no sum to add to */
	const hpu_param_info *ps = &s->b->params[l->first_param];
	size_t from = 0; /* g[from ..) not converted yet */
	for (int k = 0; k < l->nparams; k++) {
		size_t at = ps[k].rel, end = k + 1 < l->nparams ? ps[k + 1].rel : l->plen;
		if (!hpu__ac_fresh_taken16(g + at))
			continue;
		put16(s, dst + from, g + from, at - from, acc);
		from = end;
	}
	put16(s, dst + from, g + from, l->plen - from, acc);
	hpu__dfree(g);
	s->lgs[i] = NULL;
}

/* ---- the optimizer step and the loss scale ---- */

/* The optimizer runs on the master weights, HPU__STRAT_CHUNK floats at a
 * time: the 16-bit gradients converted (and unscaled), the result rounded
 * into the 16-bit working copy. */
int hpu__mp_step(hpu_strat *s)
{
	/* An overflow anywhere skips the step everywhere; the loss scale
	 * (DeepSpeed's DynamicLossScaler) moves on the device
	 * (strategy_vars.c), which also says the step was skipped. */
	if (hpu__vars_decide(s) < 0)
		return -1;
	const hpu__dev_stepvars *h = s->vars.svh;
	int skip = s->vars.known && h->skip; /* unknown: the update skips itself */
	if (!skip) {
		for (int k = 0; k < s->nunits && !s->nv; k++) {
			unit *u = &s->u[k];
			if (s->nvp && hpu__nvp_step_at(s, k) < 0)
				return -1;
			hpu__strat_update(s, &u->opt, 0, u->opt.n, u->opt_p, u->opt_g, u->opt_w,
					  h->gscale, h->lr);
		}
		if (s->nv && hpu__nv_step(s, h->gscale, h->lr) < 0)
			return -1;
		if (!s->nv && s->nvp && hpu__nvp_step_at(s, s->nunits) < 0)
			return -1;
	}
	/* 16-bit G needs no zeroing: each step's first micro-step overwrites it */
	hpu__vars_end(s);
	return skip ? 0 : hpu__zero_gather_params(s);
}
