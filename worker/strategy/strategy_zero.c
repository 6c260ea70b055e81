/* strategy_zero: ZeRO's parameters.
 *
 * Under ZeRO-3 a rank keeps only its piece of every unit (one layer)
 * that is not persistent; the unit is gathered before the layer's
 * forward and its backward, the next units prefetched within
 * --prefetch-bucket-size and --max-live-parameters, and freed after.
 * After the optimizer step ZeRO-1/2 gather every unit's updated pieces
 * in place, ZeRO-3 its persistent units. Mixed precision gathers the
 * 16-bit parameters; strategy_mp.c makes the fp32 copies a layer
 * computes on and frees them. With --offload-param nvme a unit's piece is
 * read from its swap file (strategy_nvme.c) by one prefetch, as many as
 * there are buffers free, and gathered by the next one (a unit not read
 * ahead is read when its gather starts); it leaves memory when the
 * gather is done. */

#include <stdio.h>
#include <stdlib.h>

#include "worker/ops/autocast.h"
#include "worker/hpu/devmem.h"
#include "worker/hpu/prof.h"
#include "worker/strategy/strategy_impl.h"

#define fail hpu__strat_fail
#define coll_fail hpu__strat_coll_fail
#define dalloc hpu__strat_dalloc

static int gather_start(hpu_strat *s, int k)
{
	unit *u = &s->u[k];
	/* held gathered, or (mixed) as its first layer's fp32 copy */
	if (u->persistent || u->full || s->lcp[u->first])
		return 0;
	if (s->nvp && !hpu__nvp_get(s, k, 1))
		return -1;
	char what[128];
	snprintf(what, sizeof what, "gathered parameters of %s", hpu__strat_unit_name(s, k));
	if (!(u->full = dalloc(s, HPU_MEM_PARAMS, u->len * hpu__strat_esize(s, HPU_PLAN_PARAMS),
			       what)))
		return -1;
	int rc = hpu__dc_iall_gather(s, u->opt_w, u->full, u->piece,
				     hpu__strat_cdt(s, HPU_PLAN_PARAMS), &u->gather);
	if (rc)
		return coll_fail(s, "parameter all-gather", rc);
	s->z3.live += u->len;
	return 0;
}

/* --offload-param nvme: unit k's piece read ahead, if a buffer is free. */
static int fetch(hpu_strat *s, int k, int within)
{
	(void)within;
	return hpu__nvp_fetch(s, k);
}

/* The units to gather now (within: 1); --offload-param nvme: only while
 * their pieces are in memory or on their way (read ahead by an earlier
 * prefetch): 1 at the first that is not, to stop. */
static int gather(hpu_strat *s, int k, int within)
{
	if (!within)
		return 0;
	if (s->nvp && !hpu__nvp_fetched(s, k))
		return 1;
	return gather_start(s, k);
}

/* fn(s, k, within) on the units after layer i in direction dir (before
 * layer `stop`) not gathered yet: those the prefetch and live-parameter
 * budgets allow now, then the first they do not; fn returns 0 to go on,
 * 1 to stop, -1 on failure. */
static int walk_ahead(hpu_strat *s, int i, int dir, int stop,
		      int (*fn)(hpu_strat *s, int k, int within))
{
	size_t ahead = 0, live = s->z3.live; /* fn may gather: counted here */
	for (int j = i + dir; j != stop; j += dir) {
		int k = s->b->layers[j]->unit;
		if (k < 0 || s->u[k].persistent)
			continue;
		unit *u = &s->u[k];
		if (u->full || s->lcp[u->first]) {
			ahead += u->len;
			continue;
		}
		if (ahead + u->len > (size_t)s->o->prefetch_bucket ||
		    live + u->len > (size_t)s->o->max_live_params)
			return fn(s, k, 0) < 0 ? -1 : 0;
		int rc = fn(s, k, 1);
		if (rc)
			return rc < 0 ? -1 : 0;
		ahead += u->len;
		live += u->len;
	}
	return 0;
}

int hpu__zero_prefetch(hpu_strat *s, int i, int dir, int stop)
{
	if (walk_ahead(s, i, dir, stop, gather) < 0)
		return -1;
	/* --offload-param nvme: the reads of the pieces to gather next start
	 * now, into the buffers free, and have this layer's compute to land */
	return s->nvp ? walk_ahead(s, i, dir, stop, fetch) : 0;
}

int hpu__zero_gather_wait(hpu_strat *s, int k)
{
	unit *u = &s->u[k];
	int64_t t0 = hpu__prof_t0();
	int ahead = u->full != NULL;
	if (!ahead && gather_start(s, k) < 0)
		return -1;
	if (u->gather) {
		int rc = hpucoll_wait(&u->gather);
		if (rc)
			return coll_fail(s, "parameter all-gather", rc);
	}
	if (s->nvp && hpu__nvp_drop(s, k) < 0)
		return -1;
	hpu__prof_span("zero3", "gather_params", NULL, t0,
		       "\"unit\":%d,\"bytes\":%zu,\"prefetched\":%d", k,
		       u->len * hpu__plan_esize(&s->plan.e[HPU_PLAN_PARAMS]), ahead);
	return 0;
}

int hpu__zero_acquire(hpu_strat *s, int i, int dir, int stop)
{
	int k = s->b->layers[i]->unit;
	if (!hpu__strat_params_sharded(s) || k < 0 || s->u[k].persistent)
		return 0;
	if (hpu__zero_gather_wait(s, k) < 0)
		return -1;
	hpu__strat_point(s, k, s->u[k].full, NULL);
	return hpu__zero_prefetch(s, i, dir, stop);
}

int hpu__zero_release(hpu_strat *s, int k)
{
	unit *u = &s->u[k];
	if (!hpu__strat_params_sharded(s) || u->persistent || !u->full)
		return 0;
	int64_t t0 = hpu__prof_t0();
	if (u->gather) {
		int rc = hpucoll_wait(&u->gather);
		if (rc)
			return coll_fail(s, "parameter all-gather", rc);
	}
	if (s->nvp && hpu__nvp_drop(s, k) < 0)
		return -1;
	hpu__dfree(u->full);
	u->full = NULL;
	s->z3.live -= u->len;
	hpu__prof_span("zero3", "release_params", NULL, t0, "\"unit\":%d,\"bytes\":%zu", k,
		       u->len * hpu__strat_esize(s, HPU_PLAN_PARAMS));
	return 0;
}

int hpu__zero_release_all(hpu_strat *s)
{
	for (int k = 0; k < s->nunits; k++) {
		unit *u = &s->u[k];
		if (s->plan.mixed && u->full && !u->persistent) { /* prefetched, unused */
			if (u->gather) {
				int rc = hpucoll_wait(&u->gather);
				if (rc)
					return coll_fail(s, "parameter all-gather", rc);
			}
			hpu__dfree(u->full);
			u->full = NULL;
			s->z3.live -= u->len;
		}
		if (!s->plan.mixed && hpu__zero_release(s, k) < 0)
			return -1;
	}
	for (int i = 0; i < s->nlayers; i++) /* mixed: the fp32 copies left */
		if (s->b->layers[i]->unit >= 0)
			hpu__mp_release_layer(s, i);
	return s->nvp ? hpu__nvp_drop_all(s) : 0; /* and the pieces read ahead */
}

int hpu__zero_gather_params(hpu_strat *s)
{
	if (!s->sharded)
		return 0;
	hpucoll_req **reqs = calloc((size_t)s->nunits, sizeof *reqs);
	if (!reqs)
		return fail(s, "out of memory");
	int rc = 0, k;
	for (k = 0; k < s->nunits && !rc; k++) {
		unit *u = &s->u[k];
		hpucoll_dtype dt = hpu__strat_cdt(s, HPU_PLAN_PARAMS);
		if (!hpu__strat_params_sharded(s))
			rc = hpu__dc_iall_gather(
				s, hpu__strat_at(s, HPU_PLAN_PARAMS, s->P,
						 u->off + (size_t)s->rank * u->piece),
				hpu__strat_at(s, HPU_PLAN_PARAMS, s->P, u->off), u->piece, dt, &reqs[k]);
		else if (u->persistent) /* zero3: the rest gathered per layer */
			rc = hpu__dc_iall_gather(s, u->opt_w, u->full, u->piece, dt, &reqs[k]);
	}
	for (int j = 0; j < s->nunits; j++) {
		int r = reqs[j] ? hpucoll_wait(&reqs[j]) : 0;
		if (!rc)
			rc = r;
	}
	free(reqs);
	return rc ? coll_fail(s, "parameter all-gather", rc) : 0;
}

/* After layer i's forward or backward: its fp32 copy goes, and with it
 * the gathered 16-bit unit it was made from (zero3). */
void hpu__mp_release_layer(hpu_strat *s, int i)
{
	hpu_layer *l = s->b->layers[i];
	unit *u = &s->u[l->unit];
	if (!s->lcp[i])
		return;
	int64_t t0 = hpu__prof_t0();
	hpu__ac_param16_remove(s->lcp[i]);
	hpu__dfree(s->lcp[i]);
	s->lcp[i] = NULL;
	hpu__dfree(s->z3.own16[i]);
	s->z3.own16[i] = NULL;
	if (hpu__strat_params_sharded(s) && !u->persistent) {
		s->z3.live -= u->len;
		hpu__prof_span("zero3", "release_params", NULL, t0, "\"unit\":%d,\"bytes\":%zu",
			       l->unit, u->len * 2);
	}
}
