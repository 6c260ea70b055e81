#include "strategy.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "devmem.h"
#include "strategy_impl.h"
#include "simd.h"
#include "lowp.h"
#include "fp8.h"
#include "prof.h"
#include "outpath.h"

#define fail hpu__strat_fail

int hpu__strat_fail(hpu_strat *s, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->err, s->errlen, fmt, ap);
	va_end(ap);
	return -1;
}

static int coll_fail(hpu_strat *s, const char *what, int rc)
{
	const char *msg = hpucoll_comm_errmsg(s->comm);
	return fail(s, "%s failed: %s", what, msg && *msg ? msg : hpucoll_strerror(rc));
}

/* Device memory for `what`, or NULL with the allocator's sentence in err. */
static void *dalloc(hpu_strat *s, hpu_mem_kind kind, size_t bytes,
		    const char *what)
{
	void *p = hpu__dalloc(kind, bytes, what);
	if (!p)
		fail(s, "%s", hpu__devmem_error());
	return p;
}

HPU_CLONES static void add_into(float *restrict dst, const float *restrict src,
				 size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] += src[i];
}

/* 16-bit <-> fp32 for mixed precision (bf16 or fp16 by s->fp16), round
 * to nearest even. fp16 uses the CPU's F16C conversions where it has them
 * (the same rounding as common/lowp.h's, which serves elsewhere). */
HPU_CLONES static void to16_plain(int fp16, uint16_t *restrict dst,
				  const float *restrict src, size_t n)
{
	if (fp16)
		for (size_t i = 0; i < n; i++)
			dst[i] = hpu_to_fp16(src[i]);
	else
		for (size_t i = 0; i < n; i++)
			dst[i] = hpu_to_bf16(src[i]);
}

HPU_CLONES static void from16_plain(int fp16, float *restrict dst,
				    const uint16_t *restrict src, size_t n)
{
	if (fp16)
		for (size_t i = 0; i < n; i++)
			dst[i] = hpu_from_fp16(src[i]);
	else
		for (size_t i = 0; i < n; i++)
			dst[i] = hpu_from_bf16(src[i]);
}

static void to16(const hpu_strat *s, uint16_t *dst, const float *src, size_t n)
{
	if (s->fp16 && hpu_have_f16c())
		hpu__f16c_to_fp16(dst, src, n);
	else
		to16_plain(s->fp16, dst, src, n);
}

static void from16(const hpu_strat *s, float *dst, const uint16_t *src, size_t n)
{
	if (s->fp16 && hpu_have_f16c())
		hpu__f16c_from_fp16(dst, src, n);
	else
		from16_plain(s->fp16, dst, src, n);
}

/* dst16 = 16-bit(from16(dst16) + src): accumulating micro-steps. */
static void acc16(const hpu_strat *s, uint16_t *dst, const float *src, size_t n)
{
	float tmp[1024];
	for (size_t i = 0; i < n; i += 1024) {
		size_t c = n - i < 1024 ? n - i : 1024;
		from16(s, tmp, dst + i, c);
		add_into(tmp, src + i, c);
		to16(s, dst + i, tmp, c);
	}
}

static int nonfinite16(const hpu_strat *s, const uint16_t *h, size_t n)
{
	const uint16_t mask = s->fp16 ? 0x7c00 : 0x7f80;
	int bad = 0;
	for (size_t i = 0; i < n; i++)
		bad |= (h[i] & mask) == mask;
	return bad;
}

#define CHUNK 16384 /* floats converted at a time for the optimizer */

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
		group(s, o->reduce_bucket, 1);
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
		for (int i = u->first; i <= u->last; i++) {
			hpu_layer *l = s->b->layers[i];
			l->off = at;
			if (!l->plen)
				continue;
			l->unit = k;
			u->nparam_layers++;
			at += l->plen;
		}
		u->len = round_up(at - u->off, pad);
		at = u->off + u->len;
		if (s->sharded) {
			u->piece = u->len / (size_t)s->world;
			u->shard_off = shard_at;
			shard_at += u->piece;
		}
		u->persistent = s->kind == HPU_STRATEGY_ZERO3 &&
				(long)(at - u->off) < s->o->persistence_threshold;
	}
	s->total = at;
	s->shard_total = shard_at;
}

/* Points the layers of unit k at parameters starting at `p` (the unit's
 * first float) or gradients at `g` (NULL: leave as is). */
static void point(hpu_strat *s, int k, float *p, float *g)
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

static const char *layer_name(hpu_strat *s, int k)
{
	return s->b->layers[s->u[k].first]->name;
}

static int alloc_states(hpu_strat *s)
{
	const hpu_train_opts *o = s->o;
	char what[160];
	if (s->kind != HPU_STRATEGY_ZERO3 &&
	    !(s->P = dalloc(s, HPU_MEM_PARAMS, s->total * 4, "parameters")))
		return -1;
	if (!s->sharded || s->kind == HPU_STRATEGY_ZERO1) {
		if (!(s->G = dalloc(s, HPU_MEM_GRADS, s->total * 4, "gradients")))
			return -1;
	} else if (!(s->GS = dalloc(s, HPU_MEM_GRADS, s->shard_total * 4,
				    "gradient shard"))) {
		return -1;
	}
	if (s->kind == HPU_STRATEGY_ZERO3 &&
	    !(s->PS = dalloc(s, HPU_MEM_PARAMS, s->shard_total * 4, "parameter shard")))
		return -1;
	int k = hpu_optim_state_floats(o);
	size_t n = s->sharded ? s->shard_total : s->total;
	snprintf(what, sizeof what, "optimizer state (%s, %d floats per parameter)",
		 hpu_optim_name(o->optimizer), k);
	if (k && !(s->state = dalloc(s, HPU_MEM_OPTIM, (size_t)k * n * 4, what)))
		return -1;
	for (int j = 0; j < s->nunits; j++) {
		unit *u = &s->u[j];
		size_t mine = s->sharded ? (size_t)s->rank * u->piece : 0;
		size_t n_opt = s->sharded ? u->piece : u->len;
		size_t at = s->sharded ? u->shard_off : u->off;
		switch (s->kind) {
		case HPU_STRATEGY_FAST_DDP:
		case HPU_STRATEGY_DDP:
		case HPU_STRATEGY_ZERO1:
			u->opt_p = s->P + u->off + mine;
			u->opt_g = s->G + u->off + mine;
			break;
		case HPU_STRATEGY_ZERO2:
			u->opt_p = s->P + u->off + mine;
			u->opt_g = s->GS + u->shard_off;
			break;
		case HPU_STRATEGY_ZERO3:
			u->opt_p = s->PS + u->shard_off;
			u->opt_g = s->GS + u->shard_off;
			break;
		}
		hpu_optim_init(&u->opt, o, n_opt, s->state ? s->state + (size_t)k * at : NULL);
		if (s->P)
			point(s, j, s->P + u->off, NULL);
		if (s->G)
			point(s, j, NULL, s->G + u->off);
	}
	return 0;
}

/* Mixed precision: 16-bit working parameters (whole, or zero3's shard),
 * 16-bit gradients (whole, or zero2/3's shard), fp32 master weights and
 * the optimizer state in the optimizer's space (whole or the shard). The
 * layers compute on fp32 copies made per unit when they need them. */
static int alloc_states_mp(hpu_strat *s)
{
	const hpu_train_opts *o = s->o;
	char what[160];
	const char *w16 = s->fp16 ? "fp16" : "bf16";
	snprintf(what, sizeof what, "%s parameters", w16);
	if (s->kind != HPU_STRATEGY_ZERO3 &&
	    !(s->P16 = dalloc(s, HPU_MEM_PARAMS, s->total * 2, what)))
		return -1;
	snprintf(what, sizeof what, "%s parameter shard", w16);
	if (s->kind == HPU_STRATEGY_ZERO3 &&
	    !(s->PS16 = dalloc(s, HPU_MEM_PARAMS, s->shard_total * 2, what)))
		return -1;
	snprintf(what, sizeof what, "%s gradients", w16);
	if (!s->sharded || s->kind == HPU_STRATEGY_ZERO1) {
		if (!(s->G16 = dalloc(s, HPU_MEM_GRADS, s->total * 2, what)))
			return -1;
	} else if (!(s->GS16 = dalloc(s, HPU_MEM_GRADS, s->shard_total * 2, what))) {
		return -1;
	}
	int k = hpu_optim_state_floats(o);
	size_t n = s->sharded ? s->shard_total : s->total;
	if (!(s->M = dalloc(s, HPU_MEM_OPTIM, n * 4, "fp32 master weights")))
		return -1;
	snprintf(what, sizeof what, "optimizer state (%s, %d floats per parameter)",
		 hpu_optim_name(o->optimizer), k);
	if (k && !(s->state = dalloc(s, HPU_MEM_OPTIM, (size_t)k * n * 4, what)))
		return -1;
	if (!(s->chunk = dalloc(s, HPU_MEM_OTHER, CHUNK * 4, "optimizer conversion buffer")))
		return -1;
	for (int j = 0; j < s->nunits; j++) {
		unit *u = &s->u[j];
		size_t mine = s->sharded ? (size_t)s->rank * u->piece : 0;
		size_t n_opt = s->sharded ? u->piece : u->len;
		size_t at = s->sharded ? u->shard_off : u->off;
		u->opt_p = s->M + at;
		u->opt_p16 = s->kind == HPU_STRATEGY_ZERO3 ? s->PS16 + u->shard_off
							   : s->P16 + u->off + mine;
		u->opt_g16 = s->G16 ? s->G16 + u->off + mine : s->GS16 + u->shard_off;
		hpu_optim_init(&u->opt, o, n_opt, s->state ? s->state + (size_t)k * at : NULL);
	}
	return 0;
}

/* Layer i's initial parameters into dst: from --load-params, or from the
 * initializers. */
static int init_layer(hpu_strat *s, int i, float *dst)
{
	if (s->load_fd < 0) {
		hpu__model_init_layer(s->b, i, s->o->seed, dst);
		return 0;
	}
	if (hpu__model_read_layer(s->b, i, s->load_fd, dst) < 0)
		return fail(s, "--load-params %s: cannot read the parameters of layer %s: %s",
			    s->o->load_params, s->b->layers[i]->name, strerror(errno));
	return 0;
}

/* Unit j's initial parameters into full[0 .. len): from the initializers,
 * --load-params, or (--resume) the checkpoint's master weights; a ZeRO-3
 * unit not kept whole reads only this rank's piece of the checkpoint. */
static int fill_unit(hpu_strat *s, int j, float *full)
{
	unit *u = &s->u[j];
	hpu_builder *b = s->b;
	if (s->resume) {
		size_t lo = 0, n = u->len;
		if (s->kind == HPU_STRATEGY_ZERO3 && !u->persistent) {
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

/* Mixed precision: the fp32 initial values become the master weights; the
 * working copy is their 16-bit rounding, on every rank alike. */
static int init_params_mp(hpu_strat *s)
{
	for (int j = 0; j < s->nunits; j++) {
		unit *u = &s->u[j];
		char what[128];
		snprintf(what, sizeof what, "initial parameters of %s", layer_name(s, j));
		float *full = dalloc(s, HPU_MEM_OTHER, u->len * 4, what);
		if (!full)
			return -1;
		if (fill_unit(s, j, full) < 0) {
			hpu__dfree(full);
			return -1;
		}
		size_t mine = s->sharded ? (size_t)s->rank * u->piece : 0;
		memcpy(u->opt_p, full + mine, u->opt.n * 4);
		if (s->P16) {
			to16(s, s->P16 + u->off, full, u->len);
		} else {
			to16(s, u->opt_p16, full + mine, u->piece);
			if (u->persistent) {
				snprintf(what, sizeof what, "parameters of %s (persistent)",
					 layer_name(s, j));
				if (!(u->full16 = dalloc(s, HPU_MEM_PARAMS, u->len * 2, what))) {
					hpu__dfree(full);
					return -1;
				}
				to16(s, u->full16, full, u->len);
			}
		}
		hpu__dfree(full);
	}
	return 0;
}

/* Every rank computes the same initial values; ZeRO-3 keeps its pieces
 * (and the whole of persistent units). */
static int init_params(hpu_strat *s)
{
	for (int j = 0; j < s->nunits; j++) {
		unit *u = &s->u[j];
		float *dst = s->P ? s->P + u->off : NULL;
		if (!dst) {
			char what[128];
			snprintf(what, sizeof what, "initial parameters of %s", layer_name(s, j));
			if (!(dst = dalloc(s, HPU_MEM_PARAMS, u->len * 4, what)))
				return -1;
		}
		if (fill_unit(s, j, dst) < 0) {
			if (!s->P)
				hpu__dfree(dst);
			return -1;
		}
		if (s->P)
			continue;
		memcpy(s->PS + u->shard_off, dst + (size_t)s->rank * u->piece, u->piece * 4);
		if (u->persistent) {
			u->full = dst;
			point(s, j, dst, NULL);
		} else {
			hpu__dfree(dst);
		}
	}
	return 0;
}

/* ---- gradient collectives ---- */

static void push(hpu_strat *s, int k, hpucoll_req *req)
{
	int cap = s->nunits + 1;
	s->q[(s->qhead + s->qn) % cap] = (flight){k, req};
	s->qn++;
}

/* What a completed gradient collective leaves to do. */
static void land(hpu_strat *s, int k)
{
	unit *u = &s->u[k];
	if (u->cbuf) {
		from16_plain(0, s->G + u->off, u->cbuf, u->len);
		hpu__dfree(u->cbuf);
		u->cbuf = NULL;
	}
	if (u->gbuf16) { /* mixed zero2/3: keep only the owned piece */
		uint16_t *src = u->gbuf16 + (size_t)s->rank * u->piece,
			 *dst = s->GS16 + u->shard_off;
		if (s->micro == 0) {
			memcpy(dst, src, u->piece * 2);
		} else {
			for (size_t i = 0; i < u->piece; i += CHUNK) {
				size_t c = u->piece - i < CHUNK ? u->piece - i : CHUNK;
				from16(s, s->chunk, src + i, c);
				acc16(s, dst + i, s->chunk, c);
			}
		}
		hpu__dfree(u->gbuf16);
		u->gbuf16 = NULL;
	}
	if (u->gbuf) { /* zero2/3: keep only the owned piece */
		float *src = u->gbuf + (size_t)s->rank * u->piece, *dst = s->GS + u->shard_off;
		if (s->micro == 0)
			memcpy(dst, src, u->piece * 4);
		else
			add_into(dst, src, u->piece);
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
	int rc = hpucoll_wait(&f.req);
	if (rc)
		return coll_fail(s, "gradient collective", rc);
	land(s, f.unit);
	return 0;
}

static int drain(hpu_strat *s)
{
	while (s->qn)
		if (wait_oldest(s) < 0)
			return -1;
	return 0;
}

/* Lands the collectives that have completed, without waiting. */
static int poll(hpu_strat *s)
{
	while (s->qn) {
		int done = 0;
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
	if (s->mp) {
		rc = hpucoll_iall_reduce(s->comm, s->G16 + u->off, s->G16 + u->off, u->len,
					 s->dt16, HPUCOLL_SUM, &req);
	} else if (s->o->grad_comm_dtype == HPU_COMM_BF16) {
		char what[128];
		snprintf(what, sizeof what, "bf16 gradients of %s", layer_name(s, k));
		if (!(u->cbuf = dalloc(s, HPU_MEM_COMM, u->len * 2, what)))
			return -1;
		to16_plain(0, u->cbuf, s->G + u->off, u->len);
		rc = hpucoll_iall_reduce(s->comm, u->cbuf, u->cbuf, u->len, HPUCOLL_BF16,
					 HPUCOLL_SUM, &req);
	} else {
		rc = hpucoll_iall_reduce(s->comm, s->G + u->off, s->G + u->off, u->len,
					 HPUCOLL_F32, HPUCOLL_SUM, &req);
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
	int rc = s->mp ? hpucoll_ireduce_scatter(s->comm, u->gbuf16,
						 u->gbuf16 + (size_t)s->rank * u->piece,
						 u->piece, s->dt16, HPUCOLL_SUM, &req)
		       : hpucoll_ireduce_scatter(s->comm, u->gbuf,
						 u->gbuf + (size_t)s->rank * u->piece,
						 u->piece, HPUCOLL_F32, HPUCOLL_SUM, &req);
	if (rc)
		return coll_fail(s, "gradient reduce-scatter", rc);
	push(s, k, req);
	while (s->qn > (s->o->overlap_comm ? 2 : 0))
		if (wait_oldest(s) < 0)
			return -1;
	return 0;
}

/* Every layer of unit k has run its backward in this micro-step. */
static int unit_done(hpu_strat *s, int k, int final)
{
	switch (s->kind) {
	case HPU_STRATEGY_DDP:
		if (final && s->o->overlap_comm)
			return start_all_reduce(s, k);
		return 0;
	case HPU_STRATEGY_ZERO2:
	case HPU_STRATEGY_ZERO3:
		return start_reduce_scatter(s, k);
	default:
		return 0;
	}
}

/* ---- zero3: gathering parameters ---- */

static int gather_start(hpu_strat *s, int k)
{
	unit *u = &s->u[k];
	if (u->persistent || u->full || u->full16 || (s->mp && s->lcp[u->first]))
		return 0;
	char what[128];
	snprintf(what, sizeof what, "gathered parameters of %s", layer_name(s, k));
	int rc;
	if (s->mp) {
		if (!(u->full16 = dalloc(s, HPU_MEM_PARAMS, u->len * 2, what)))
			return -1;
		rc = hpucoll_iall_gather(s->comm, s->PS16 + u->shard_off, u->full16, u->piece,
					 s->dt16, &u->gather);
	} else {
		if (!(u->full = dalloc(s, HPU_MEM_PARAMS, u->len * 4, what)))
			return -1;
		rc = hpucoll_iall_gather(s->comm, s->PS + u->shard_off, u->full, u->piece,
					 HPUCOLL_F32, &u->gather);
	}
	if (rc)
		return coll_fail(s, "parameter all-gather", rc);
	s->live += u->len;
	return 0;
}

/* Starts gathers of the units after layer i in direction dir (stopping
 * before layer `stop`), up to the prefetch and live-parameter budgets. */
static int prefetch(hpu_strat *s, int i, int dir, int stop)
{
	size_t ahead = 0;
	for (int j = i + dir; j != stop; j += dir) {
		int k = s->b->layers[j]->unit;
		if (k < 0 || s->u[k].persistent)
			continue;
		unit *u = &s->u[k];
		if (u->full || u->full16 || (s->mp && s->lcp[u->first])) {
			ahead += u->len;
			continue;
		}
		if (ahead + u->len > (size_t)s->o->prefetch_bucket ||
		    s->live + u->len > (size_t)s->o->max_live_params)
			break;
		if (gather_start(s, k) < 0)
			return -1;
		ahead += u->len;
	}
	return 0;
}

/* Mixed precision: layer i computes on an fp32 copy of its 16-bit
 * parameters (zero3: gathered first, the 16-bit gather freed once
 * copied), made before its forward and its backward, freed after. */
static int acquire_mp(hpu_strat *s, int i, int dir, int stop)
{
	hpu_layer *l = s->b->layers[i];
	int k = l->unit;
	if (k < 0)
		return 0;
	unit *u = &s->u[k];
	int gathered = s->kind == HPU_STRATEGY_ZERO3 && !u->persistent;
	if (!s->lcp[i]) {
		int64_t t0 = hpu__prof_t0();
		int ahead = u->full16 != NULL;
		if (gathered && !u->full16 && gather_start(s, k) < 0)
			return -1;
		if (u->gather) {
			int rc = hpucoll_wait(&u->gather);
			if (rc)
				return coll_fail(s, "parameter all-gather", rc);
		}
		if (gathered)
			hpu__prof_span("zero3", "gather_params", NULL, t0,
				       "\"unit\":%d,\"bytes\":%zu,\"prefetched\":%d", k,
				       u->len * 2, ahead);
		const uint16_t *src = s->P16 ? s->P16 + l->off : u->full16 + (l->off - u->off);
		char what[128];
		snprintf(what, sizeof what, "fp32 compute copy of %s", l->name);
		if (!(s->lcp[i] = hpu__dalloc_uninit(HPU_MEM_PARAMS, l->plen * 4, what))) {
			fail(s, "%s", hpu__devmem_error());
			return -1;
		}
		from16(s, s->lcp[i], src, l->plen);
		/* the 16-bit source stays with the layer while it runs: bf16
		 * products read it instead of converting the fp32 copy back */
		s->l16[i] = src;
		if (gathered) {
			s->own16[i] = u->full16;
			u->full16 = NULL;
		}
	}
	l->pbase = s->lcp[i];
	return s->kind == HPU_STRATEGY_ZERO3 ? prefetch(s, i, dir, stop) : 0;
}

/* Makes layer i's parameters whole (zero3), prefetching what follows. */
static int acquire(hpu_strat *s, int i, int dir, int stop)
{
	if (s->mp)
		return acquire_mp(s, i, dir, stop);
	int k = s->b->layers[i]->unit;
	if (s->kind != HPU_STRATEGY_ZERO3 || k < 0 || s->u[k].persistent)
		return 0;
	unit *u = &s->u[k];
	int64_t t0 = hpu__prof_t0();
	int ahead = u->full != NULL;
	if (!u->full && gather_start(s, k) < 0)
		return -1;
	if (u->gather) {
		int rc = hpucoll_wait(&u->gather);
		if (rc)
			return coll_fail(s, "parameter all-gather", rc);
	}
	hpu__prof_span("zero3", "gather_params", NULL, t0,
		       "\"unit\":%d,\"bytes\":%zu,\"prefetched\":%d", k, u->len * 4, ahead);
	point(s, k, u->full, NULL);
	return prefetch(s, i, dir, stop);
}

static int release(hpu_strat *s, int k)
{
	unit *u = &s->u[k];
	if (s->kind != HPU_STRATEGY_ZERO3 || u->persistent || !u->full)
		return 0;
	int64_t t0 = hpu__prof_t0();
	if (u->gather) {
		int rc = hpucoll_wait(&u->gather);
		if (rc)
			return coll_fail(s, "parameter all-gather", rc);
	}
	hpu__dfree(u->full);
	u->full = NULL;
	s->live -= u->len;
	hpu__prof_span("zero3", "release_params", NULL, t0, "\"unit\":%d,\"bytes\":%zu", k,
		       u->len * 4);
	return 0;
}

/* After layer i's forward or backward: its parameters may go. */
static int release_layer(hpu_strat *s, int i)
{
	hpu_layer *l = s->b->layers[i];
	if (l->unit < 0)
		return 0;
	if (!s->mp)
		return release(s, l->unit);
	unit *u = &s->u[l->unit];
	if (s->lcp[i]) {
		int64_t t0 = hpu__prof_t0();
		hpu__dfree(s->lcp[i]);
		s->lcp[i] = NULL;
		hpu__dfree(s->own16[i]);
		s->own16[i] = NULL;
		s->l16[i] = NULL;
		if (s->kind == HPU_STRATEGY_ZERO3 && !u->persistent) {
			s->live -= u->len;
			hpu__prof_span("zero3", "release_params", NULL, t0,
				       "\"unit\":%d,\"bytes\":%zu", l->unit, u->len * 2);
		}
	}
	return 0;
}

static int release_all(hpu_strat *s)
{
	for (int k = 0; k < s->nunits; k++) {
		unit *u = &s->u[k];
		if (s->mp && u->full16 && !u->persistent) { /* prefetched, unused */
			if (u->gather) {
				int rc = hpucoll_wait(&u->gather);
				if (rc)
					return coll_fail(s, "parameter all-gather", rc);
			}
			hpu__dfree(u->full16);
			u->full16 = NULL;
			s->live -= u->len;
		}
		if (!s->mp && release(s, k) < 0)
			return -1;
	}
	for (int i = 0; s->mp && i < s->nlayers; i++)
		if (release_layer(s, i) < 0)
			return -1;
	return 0;
}

/* ---- forward and backward ---- */

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

/* zero2/3: the unit's gradient bucket, made when its first layer's
 * backward comes. */
/* Mixed precision: layer i accumulates into fp32 gradients of its own
 * (and zero2/3's unit gets its 16-bit bucket). */
static int grads_for_mp(hpu_strat *s, int i)
{
	hpu_layer *l = s->b->layers[i];
	unit *u = &s->u[l->unit];
	char what[128];
	if (s->GS16 && !u->gbuf16) {
		snprintf(what, sizeof what, "16-bit gradient bucket of %s", layer_name(s, l->unit));
		if (!(u->gbuf16 = dalloc(s, HPU_MEM_GRADS, u->len * 2, what)))
			return -1;
	}
	snprintf(what, sizeof what, "fp32 gradients of %s", l->name);
	if (!(s->lgs[i] = dalloc(s, HPU_MEM_GRADS, l->plen * 4, what)))
		return -1;
	l->gbase = s->lgs[i];
	return 0;
}

/* Mixed precision: layer i's fp32 gradients go into the 16-bit ones
 * (accumulating over micro-steps where they are whole). */
static void grads_done_mp(hpu_strat *s, int i, int final)
{
	hpu_layer *l = s->b->layers[i];
	unit *u = &s->u[l->unit];
	float *g = s->lgs[i];
	if (final && !s->injected && s->o->inject_overflow_step == s->step_no + 1 &&
	    s->rank == 0) {
		g[0] = INFINITY; /* --inject-overflow-step: testing only */
		s->injected = 1;
	}
	if (s->G16 && s->micro == 0) /* the step's first: no sum to add to */
		to16(s, s->G16 + l->off, g, l->plen);
	else if (s->G16)
		acc16(s, s->G16 + l->off, g, l->plen);
	else
		to16(s, u->gbuf16 + (l->off - u->off), g, l->plen);
	hpu__dfree(g);
	s->lgs[i] = NULL;
}

static int grads_for(hpu_strat *s, int k)
{
	unit *u = &s->u[k];
	if (!s->sharded || s->kind == HPU_STRATEGY_ZERO1 || u->gbuf)
		return 0;
	char what[128];
	snprintf(what, sizeof what, "gradient bucket of %s", layer_name(s, k));
	if (!(u->gbuf = dalloc(s, HPU_MEM_GRADS, u->len * 4, what)))
		return -1;
	point(s, k, NULL, u->gbuf);
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
		    ((s->mp ? grads_for_mp(s, i) : grads_for(s, l->unit)) < 0 ||
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
				grads_done_mp(s, i, final);
			if (release_layer(s, i) < 0)
				return -1;
			if (--s->u[l->unit].pending == 0 && unit_done(s, l->unit, final) < 0)
				return -1;
		}
		if (s->transient[i])
			hpu__act_drop(s, i);
		else
			hpu__act_release(s, i);
		if (poll(s) < 0)
			return -1;
		dout = din;
	}
	*loss_out = loss;
	/* zero2/3 land every micro-step's gradients in the shard. */
	if (s->sharded && s->kind != HPU_STRATEGY_ZERO1 && drain(s) < 0)
		return -1;
	return release_all(s);
}

/* ---- the optimizer step ---- */

static int reduce_gradients(hpu_strat *s)
{
	int rc;
	switch (s->kind) {
	case HPU_STRATEGY_DDP:
		if (!s->o->overlap_comm)
			for (int k = s->nunits - 1; k >= 0; k--)
				if (start_all_reduce(s, k) < 0)
					return -1;
		return drain(s);
	case HPU_STRATEGY_FAST_DDP:
		if (start_all_reduce(s, 0) < 0)
			return -1;
		return drain(s);
	case HPU_STRATEGY_ZERO1:
		for (int k = 0; k < s->nunits; k++) {
			unit *u = &s->u[k];
			hpucoll_req *req;
			size_t mine = (size_t)s->rank * u->piece;
			rc = s->mp ? hpucoll_ireduce_scatter(s->comm, s->G16 + u->off,
							     s->G16 + u->off + mine, u->piece,
							     s->dt16, HPUCOLL_SUM, &req)
				   : hpucoll_ireduce_scatter(s->comm, s->G + u->off,
							     s->G + u->off + mine, u->piece,
							     HPUCOLL_F32, HPUCOLL_SUM, &req);
			if (rc)
				return coll_fail(s, "gradient reduce-scatter", rc);
			push(s, k, req);
		}
		return drain(s);
	default:
		return drain(s);
	}
}

/* Brings updated parameters back whole: zero1/2 gather every unit in
 * place, zero3 only its persistent units. */
static int gather_params(hpu_strat *s)
{
	if (!s->sharded)
		return 0;
	hpucoll_req **reqs = calloc((size_t)s->nunits, sizeof *reqs);
	if (!reqs)
		return fail(s, "out of memory");
	int rc = 0, k;
	for (k = 0; k < s->nunits && !rc; k++) {
		unit *u = &s->u[k];
		if (s->mp && s->kind != HPU_STRATEGY_ZERO3)
			rc = hpucoll_iall_gather(s->comm, s->P16 + u->off + (size_t)s->rank * u->piece,
						 s->P16 + u->off, u->piece, s->dt16, &reqs[k]);
		else if (s->mp && u->persistent)
			rc = hpucoll_iall_gather(s->comm, s->PS16 + u->shard_off, u->full16,
						 u->piece, s->dt16, &reqs[k]);
		else if (s->mp)
			continue;
		else if (s->kind != HPU_STRATEGY_ZERO3)
			rc = hpucoll_iall_gather(s->comm, s->P + u->off + (size_t)s->rank * u->piece,
						 s->P + u->off, u->piece, HPUCOLL_F32, &reqs[k]);
		else if (u->persistent)
			rc = hpucoll_iall_gather(s->comm, s->PS + u->shard_off, u->full,
						 u->piece, HPUCOLL_F32, &reqs[k]);
	}
	for (int j = 0; j < s->nunits; j++) {
		int r = reqs[j] ? hpucoll_wait(&reqs[j]) : 0;
		if (!rc)
			rc = r;
	}
	free(reqs);
	return rc ? coll_fail(s, "parameter all-gather", rc) : 0;
}

/* DeepSpeed's DynamicLossScaler: an overflow halves the scale once
 * `hysteresis` overflows have come (not below min_loss_scale); every
 * loss_scale_window steps after the last overflow it doubles. */
static void update_scale(hpu_strat *s, int overflow)
{
	const hpu_train_opts *o = s->o;
	if (s->fp16 && o->loss_scale <= 0) {
		if (overflow) {
			if (o->hysteresis == 1 || s->hyst_left == 1)
				s->scale = fmax(s->scale / 2, o->min_loss_scale);
			else
				s->hyst_left--;
			s->last_overflow = s->step_no;
		} else if ((s->step_no - s->last_overflow) % o->loss_scale_window == 0) {
			s->hyst_left = o->hysteresis;
			s->scale *= 2;
		}
	}
	s->step_no++;
	s->injected = 0;
}

static int step_mp(hpu_strat *s, double lr, double *grad_norm, int *skipped)
{
	/* An overflow anywhere skips the step everywhere. */
	float bad = 0;
	for (int k = 0; k < s->nunits; k++)
		if (nonfinite16(s, s->u[k].opt_g16, s->u[k].opt.n))
			bad = 1;
	if (s->sharded) {
		int rc = hpucoll_all_reduce(s->comm, &bad, &bad, 1, HPUCOLL_F32, HPUCOLL_MAX);
		if (rc)
			return coll_fail(s, "overflow all-reduce", rc);
	}
	*grad_norm = 0;
	*skipped = bad > 0;
	if (!*skipped) {
		float gscale = (float)(1.0 / s->scale);
		if (s->o->clip_norm > 0) {
			double ss = 0;
			for (int k = 0; k < s->nunits; k++)
				for (size_t i = 0; i < s->u[k].opt.n; i += CHUNK) {
					size_t c = s->u[k].opt.n - i < CHUNK ? s->u[k].opt.n - i : CHUNK;
					from16(s, s->chunk, s->u[k].opt_g16 + i, c);
					ss += hpu_sumsq(s->chunk, c);
				}
			if (s->sharded) {
				int rc = hpucoll_all_reduce(s->comm, &ss, &ss, 1, HPUCOLL_F64,
							    HPUCOLL_SUM);
				if (rc)
					return coll_fail(s, "gradient-norm all-reduce", rc);
			}
			*grad_norm = sqrt(ss) / s->scale;
			gscale *= hpu_clip_factor(*grad_norm, s->o->clip_norm);
		}
		for (int k = 0; k < s->nunits; k++) {
			unit *u = &s->u[k];
			hpu_optim_begin(&u->opt);
			for (size_t i = 0; i < u->opt.n; i += CHUNK) {
				size_t c = u->opt.n - i < CHUNK ? u->opt.n - i : CHUNK;
				from16(s, s->chunk, u->opt_g16 + i, c);
				hpu_optim_range(&u->opt, i, c, u->opt_p + i, s->chunk, gscale, lr);
				to16(s, u->opt_p16 + i, u->opt_p + i, c);
			}
		}
	}
	/* G16 needs no zeroing: each step's first micro-step overwrites it */
	double before = s->scale;
	update_scale(s, *skipped);
	if (*skipped) {
		s->skipped++;
		if (s->rank == 0)
			printf("step %ld: gradient overflow: step skipped on every rank; loss scale %g -> %g\n",
			       s->step_no, before, s->scale);
		return 0;
	}
	return gather_params(s);
}

int hpu_strat_step(hpu_strat *s, double lr, double *grad_norm)
{
	if (reduce_gradients(s) < 0)
		return -1;
	if (s->mp) {
		int skipped;
		return step_mp(s, lr, grad_norm, &skipped);
	}
	/* Clipping by the global norm: each rank sums the squares of the
	 * gradients it updates (its shard under ZeRO, everything otherwise,
	 * where every rank holds the same sums), then the shards' sums add. */
	float gscale = 1.0f;
	*grad_norm = 0;
	if (s->o->clip_norm > 0) {
		double ss = 0;
		for (int k = 0; k < s->nunits; k++)
			ss += hpu_sumsq(s->u[k].opt_g, s->u[k].opt.n);
		if (s->sharded) {
			int rc = hpucoll_all_reduce(s->comm, &ss, &ss, 1, HPUCOLL_F64, HPUCOLL_SUM);
			if (rc)
				return coll_fail(s, "gradient-norm all-reduce", rc);
		}
		*grad_norm = sqrt(ss);
		gscale = hpu_clip_factor(*grad_norm, s->o->clip_norm);
	}
	for (int k = 0; k < s->nunits; k++)
		hpu_optim_step(&s->u[k].opt, s->u[k].opt_p, s->u[k].opt_g, gscale, lr);
	if (s->G)
		memset(s->G, 0, s->total * 4);
	return gather_params(s);
}

/* ---- consolidated parameters ---- */

static int write_unit(hpu_strat *s, FILE *f, int k, const float *full)
{
	unit *u = &s->u[k];
	hpu_builder *b = s->b;
	for (int i = u->first; i <= u->last; i++) {
		hpu_layer *l = b->layers[i];
		for (int p = l->first_param; p < l->first_param + l->nparams; p++) {
			const hpu_param_info *pi = &b->params[p];
			const float *src = full + (l->off - u->off) + pi->rel;
			if (fwrite(src, 4, pi->numel, f) != pi->numel)
				return -1;
		}
	}
	return 0;
}

int hpu_strat_save_params(hpu_strat *s, const char *path)
{
	FILE *f = NULL;
	char tmp[4200], real[4096];
	int direct = hpu_out_in_place(path, real, sizeof real);
	snprintf(tmp, sizeof tmp, "%s.tmp", real);
	if (s->rank == 0 && !(f = fopen(direct ? path : tmp, "wb")))
		fail(s, "cannot write %s: %s", direct ? path : tmp, strerror(errno));
	int bad = s->rank == 0 && !f, rc, e = 0;
	for (int k = 0; k < s->nunits; k++) {
		unit *u = &s->u[k];
		const float *full = s->mp ? (s->sharded ? NULL : s->M + u->off)
				  : s->P ? s->P + u->off : u->full;
		const float *piece = s->mp ? s->M + u->shard_off : s->PS + u->shard_off;
		float *tmpbuf = NULL;
		if (!full) { /* sharded: gather it for the file */
			char what[128];
			snprintf(what, sizeof what, "parameters of %s for --save-params",
				 layer_name(s, k));
			if (!(tmpbuf = dalloc(s, HPU_MEM_OTHER, u->len * 4, what)))
				rc = -1;
			else if ((rc = hpucoll_all_gather(s->comm, piece, tmpbuf, u->piece,
							  HPUCOLL_F32)))
				coll_fail(s, "parameter all-gather", rc);
			if (rc) {
				hpu__dfree(tmpbuf);
				if (f) {
					fclose(f);
					if (!direct)
						unlink(tmp);
				}
				return -1;
			}
			full = tmpbuf;
		}
		if (f && full && !bad && write_unit(s, f, k, full) < 0) {
			bad = 1;
			e = errno;
		}
		hpu__dfree(tmpbuf);
	}
	if (f) {
		if (!bad && (fflush(f) != 0 || ferror(f))) {
			bad = 1;
			e = errno;
		}
		if (fclose(f) != 0 && !bad) {
			bad = 1;
			e = errno;
		}
		if (!bad && !direct && rename(tmp, real) != 0) {
			bad = 1;
			e = errno;
		}
		if (bad) {
			if (!s->err[0])
				fail(s, "cannot write %s: %s", path, strerror(e ? e : EIO));
			if (!direct)
				unlink(tmp);
		}
	}
	return bad ? -1 : 0;
}

int hpu_strat_units(const hpu_strat *s)
{
	return s->nunits;
}

double hpu_strat_loss_scale(const hpu_strat *s)
{
	return s->scale;
}

long hpu_strat_skipped(const hpu_strat *s)
{
	return s->skipped;
}

/* ---- making and freeing ---- */

/* Activation checkpointing. A marked layer followed by a marked layer
 * need not keep its output: the next layer has read it, and backward can
 * recompute it from the last output kept below. In a run of m such
 * layers every ceil(sqrt(m))-th output is kept all the same, so that
 * backward recomputes one segment at a time (Chen et al., 2016): about
 * 2 sqrt(m) outputs alive instead of m, for one extra forward. The last
 * layer's output feeds the loss and is always kept. */
static void mark_transient(hpu_strat *s)
{
	hpu_layer **ls = s->b->layers;
	int L = s->nlayers;
	for (int a = 0; a < L;) {
		if (!(ls[a]->ckpt && a + 1 < L && ls[a + 1]->ckpt)) {
			a++;
			continue;
		}
		int z = a; /* the run of marked layers a .. z */
		while (z + 1 < L && ls[z + 1]->ckpt)
			z++;
		/* layers a .. z-1 may drop their outputs */
		int m = z - a, seg = (int)ceil(sqrt((double)m));
		for (int j = a; j < z; j++)
			s->transient[j] = (j - a + 1) % seg != 0;
		a = z;
	}
}

int hpu_strat_new(hpu_strat **out, hpu_builder *b, hpucoll_comm *comm,
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
	s->u = calloc((size_t)b->nlayers + 1, sizeof *s->u);
	s->q = calloc((size_t)b->nlayers + 2, sizeof *s->q);
	s->acts = calloc((size_t)b->nlayers, sizeof *s->acts);
	s->transient = calloc((size_t)b->nlayers, 1);
	s->lcp = calloc((size_t)b->nlayers, sizeof *s->lcp);
	s->lgs = calloc((size_t)b->nlayers, sizeof *s->lgs);
	s->l16 = calloc((size_t)b->nlayers, sizeof *s->l16);
	s->own16 = calloc((size_t)b->nlayers, sizeof *s->own16);
	s->act16 = o->precision == HPU_PREC_BF16_MIXED || o->precision == HPU_PREC_FP8;
	if (s->act16 && !(s->a16 = calloc((size_t)b->nlayers, sizeof *s->a16)))
		return fail(s, "out of memory");
	if (!s->u || !s->q || !s->acts || !s->transient || !s->lcp || !s->lgs || !s->l16 ||
	    !s->own16)
		return fail(s, "out of memory");
	s->mp = o->precision != HPU_PREC_FP32;
	s->fp16 = o->precision == HPU_PREC_FP16_MIXED;
	s->dt16 = s->fp16 ? HPUCOLL_F16 : HPUCOLL_BF16;
	s->scale = !s->fp16 ? 1.0 : o->loss_scale > 0 ? o->loss_scale
				   : ldexp(1.0, o->initial_scale_power);
	s->hyst_left = o->hysteresis;
	s->last_overflow = -1;
	build_units(s);
	s->maxw = b->data[HPU_SPLIT_TRAIN].sample_size;
	for (int i = 0; i < b->nlayers; i++) {
		hpu_layer *l = b->layers[i];
		if (o->activation_checkpointing && i + 1 < b->nlayers)
			l->ckpt = 1;
		if (l->out_size > s->maxw)
			s->maxw = l->out_size;
	}
	mark_transient(s);
	if (o->load_params[0] &&
	    (s->load_fd = hpu__model_params_open(b, o->load_params, err, errlen)) < 0)
		return -1;
	int rc = s->mp ? alloc_states_mp(s) < 0 || init_params_mp(s) < 0
		       : alloc_states(s) < 0 || init_params(s) < 0;
	if (s->load_fd >= 0)
		close(s->load_fd);
	s->load_fd = -1;
	if (rc || (resume && hpu__strat_resume_state(s) < 0))
		return -1;
	for (int k = 0; k < 2; k++)
		if (!(s->dbuf[k] = dalloc(s, HPU_MEM_ACTS, (size_t)maxbatch * s->maxw * 4,
					  "activation gradients")))
			return -1;
	return 0;
}

void hpu_strat_free(hpu_strat **ps)
{
	hpu_strat *s = *ps;
	if (!s)
		return;
	while (s->qn) { /* after an error: let the collectives end first */
		hpucoll_wait(&s->q[s->qhead].req);
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
		hpu__dfree(u->full16);
		hpu__dfree(u->gbuf16);
	}
	for (int i = 0; s->acts && i < s->nlayers; i++) {
		hpu__dfree(s->acts[i]);
		hpu__dfree(s->lcp[i]);
		hpu__dfree(s->lgs[i]);
		hpu__dfree(s->own16[i]);
		if (s->a16)
			hpu__dfree(s->a16[i]);
	}
	hpu__dfree(s->dbuf[0]);
	hpu__dfree(s->dbuf[1]);
	hpu__dfree(s->P);
	hpu__dfree(s->G);
	hpu__dfree(s->PS);
	hpu__dfree(s->GS);
	hpu__dfree(s->state);
	hpu__dfree(s->P16);
	hpu__dfree(s->G16);
	hpu__dfree(s->PS16);
	hpu__dfree(s->GS16);
	hpu__dfree(s->M);
	hpu__dfree(s->chunk);
	free(s->lcp);
	free(s->lgs);
	free(s->l16);
	free(s->own16);
	free(s->a16);
	free(s->u);
	free(s->q);
	free(s->acts);
	free(s->transient);
	free(s->canon);
	free(s);
	*ps = NULL;
}
