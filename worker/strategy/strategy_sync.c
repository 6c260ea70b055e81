/* strategy_sync: the gradients' communication.
 *
 * DDP all-reduces a unit (a bucket) as soon as its backward is done on
 * the last micro-step (--overlap-comm), or every unit at the step;
 * fast_ddp all-reduces its one unit at the step; ZeRO-1 reduce-scatters
 * every unit at the step; ZeRO-2/3 reduce-scatter a unit's gradient
 * bucket every micro-step as soon as its backward is done and keep only
 * the piece the rank owns, in the gradient shard. The collectives are
 * asynchronous and complete in issue order: a FIFO of flights, landed
 * when done. Mixed precision sends the 16-bit gradients; fp32 runs send
 * fp32, or bf16 copies with --grad-comm-dtype bf16. */

#include <stdio.h>
#include <string.h>

#include "worker/ops/autocast.h"
#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "common/simd.h"
#include "worker/strategy/strategy_impl.h"

#define coll_fail hpu__strat_coll_fail
#define dalloc hpu__strat_dalloc

static void push(hpu_strat *s, int k, hpucoll_req *req)
{
	int cap = s->nunits + 1;
	s->q[(s->qhead + s->qn) % cap] = (flight){k, req};
	s->qn++;
}

/* zero2/3 with the gradient shard in the host tier: the reduced piece
 * src[n] (device) out into dst[n], added by the host after the step's
 * first micro-step. */
static void land_host(hpu_strat *s, void *dst, const void *src, size_t n)
{
	size_t esz = hpu__strat_esize(s, HPU_PLAN_GRADS);
	if (s->micro == 0) {
		hpu__dev_d2h(NULL, dst, src, n * esz);
		return;
	}
	void *h = s->stg.update;
	for (size_t i = 0; i < n; i += HPU__STRAT_CHUNK) {
		size_t c = hpu__strat_chunk(n, i);
		hpu__dev_d2h(NULL, h, (const char *)src + i * esz, c * esz);
		hpu__strat_gacc(s, 1, (char *)dst + i * esz, h, c);
	}
}

/* What a completed gradient collective leaves to do. */
static void land(hpu_strat *s, int k)
{
	unit *u = &s->u[k];
	if (u->cbuf) {
		hpu__dev_from16(0, (float *)s->G + u->off, u->cbuf, u->len); /* bf16 */
		hpu__dfree(u->cbuf);
		u->cbuf = NULL;
	}
	if (u->gbuf) { /* zero2/3: keep only the owned piece */
		void *src = hpu__strat_at(s, HPU_PLAN_GRADS, u->gbuf, (size_t)s->rank * u->piece);
		void *dst = hpu__strat_at(s, HPU_PLAN_GRADS, s->GS, u->shard_off);
		if (hpu__strat_grads_host(s))
			land_host(s, dst, src, u->piece);
		else if (s->micro == 0)
			hpu__dev_d2d(NULL, dst, src, u->piece * hpu__strat_esize(s, HPU_PLAN_GRADS));
		else
			hpu__strat_gacc(s, 0, dst, src, u->piece);
		hpu__dfree(u->gbuf);
		u->gbuf = NULL;
	}
}

/* Waits for the oldest gradient collective. */
static int wait_oldest(hpu_strat *s)
{
	flight f = s->q[s->qhead];
	s->qhead = (s->qhead + 1) % (s->nunits + 1);
	s->qn--;
	int rc = hpu__dc_wait(&f.req);
	if (rc)
		return coll_fail(s, "gradient collective", rc);
	land(s, f.unit);
	return 0;
}

int hpu__sync_drain(hpu_strat *s)
{
	while (s->qn)
		if (wait_oldest(s) < 0)
			return -1;
	return 0;
}

int hpu__sync_poll(hpu_strat *s)
{
	while (s->qn) {
		int done = 1; /* a staged collective is done */
		if (s->q[s->qhead].req)
			hpucoll_test(s->q[s->qhead].req, &done);
		if (!done)
			return 0;
		if (wait_oldest(s) < 0)
			return -1;
	}
	return 0;
}

static int start_all_reduce(hpu_strat *s, int k)
{
	unit *u = &s->u[k];
	hpucoll_req *req;
	int rc;
	if (s->plan.grad_comm16) {
		char what[128];
		snprintf(what, sizeof what, "bf16 gradients of %s", hpu__strat_unit_name(s, k));
		if (!(u->cbuf = dalloc(s, HPU_MEM_COMM, u->len * 2, what)))
			return -1;
		hpu__dev_to16(0, u->cbuf, (float *)s->G + u->off, u->len); /* bf16 */
		rc = hpu__dc_iall_reduce(s, u->cbuf, u->cbuf, u->len, HPUCOLL_BF16,
					 HPUCOLL_SUM, &req);
	} else {
		void *g = hpu__strat_at(s, HPU_PLAN_GRADS, s->G, u->off);
		rc = hpu__dc_iall_reduce(s, g, g, u->len, hpu__strat_cdt(s, HPU_PLAN_GRADS),
					 HPUCOLL_SUM, &req);
	}
	if (rc)
		return coll_fail(s, "gradient all-reduce", rc);
	push(s, k, req);
	return 0;
}

/* zero2/3: reduce-scatters the unit's gradient bucket in place; at most
 * two in flight, so that only a few buckets are ever alive. */
static int start_reduce_scatter(hpu_strat *s, int k)
{
	unit *u = &s->u[k];
	hpucoll_req *req;
	int rc = hpu__dc_ireduce_scatter(
		s, u->gbuf, hpu__strat_at(s, HPU_PLAN_GRADS, u->gbuf, (size_t)s->rank * u->piece),
		u->piece, hpu__strat_cdt(s, HPU_PLAN_GRADS), HPUCOLL_SUM, &req);
	if (rc)
		return coll_fail(s, "gradient reduce-scatter", rc);
	push(s, k, req);
	while (s->qn > (s->o->overlap_comm ? 2 : 0))
		if (wait_oldest(s) < 0)
			return -1;
	return 0;
}

int hpu__sync_unit_done(hpu_strat *s, int k, int final)
{
	switch (s->plan.e[HPU_PLAN_GRADS].coll) {
	case HPU_PLAN_ALL_REDUCE: /* ddp */
		if (final && s->o->overlap_comm)
			return start_all_reduce(s, k);
		return 0;
	case HPU_PLAN_REDUCE_SCATTER_BUCKETS: /* zero2/3 */
		return start_reduce_scatter(s, k);
	default:
		return 0;
	}
}

/* zero2/3: the unit's gradient bucket, made when its first layer's
 * backward comes. */
int hpu__sync_grads_for(hpu_strat *s, int k)
{
	unit *u = &s->u[k];
	if (!hpu__strat_grads_sharded(s) || u->gbuf)
		return 0;
	char what[128];
	snprintf(what, sizeof what, "gradient bucket of %s", hpu__strat_unit_name(s, k));
	if (!(u->gbuf = dalloc(s, HPU_MEM_GRADS, u->len * 4, what)))
		return -1;
	hpu__strat_point(s, k, NULL, u->gbuf);
	return 0;
}

int hpu__sync_reduce(hpu_strat *s)
{
	int rc;
	switch (s->plan.e[HPU_PLAN_GRADS].coll) {
	case HPU_PLAN_ALL_REDUCE: /* ddp */
		if (!s->o->overlap_comm)
			for (int k = s->nunits - 1; k >= 0; k--)
				if (start_all_reduce(s, k) < 0)
					return -1;
		return hpu__sync_drain(s);
	case HPU_PLAN_ALL_REDUCE_FLAT: /* fast_ddp */
		if (start_all_reduce(s, 0) < 0)
			return -1;
		return hpu__sync_drain(s);
	case HPU_PLAN_REDUCE_SCATTER: /* zero1 */
		for (int k = 0; k < s->nunits; k++) {
			unit *u = &s->u[k];
			hpucoll_req *req;
			size_t mine = (size_t)s->rank * u->piece;
			rc = hpu__dc_ireduce_scatter(
				s, hpu__strat_at(s, HPU_PLAN_GRADS, s->G, u->off),
				hpu__strat_at(s, HPU_PLAN_GRADS, s->G, u->off + mine), u->piece,
				hpu__strat_cdt(s, HPU_PLAN_GRADS), HPUCOLL_SUM, &req);
			if (rc)
				return coll_fail(s, "gradient reduce-scatter", rc);
			push(s, k, req);
		}
		return hpu__sync_drain(s);
	default:
		return hpu__sync_drain(s);
	}
}
