/* strategy_nvme: the NVMe tier (ZeRO-Infinity), two swap files (swap.h).
 *
 * --offload-optimizer nvme: the optimizer's
 * space of this rank -- the moments, and under mixed precision the fp32
 * master weights -- lives in one swap file (swap.h), not in memory. It is
 * cut into sub-groups of at most --sub-group-size elements, none across a
 * unit, each stored as one aligned slot [master | m | v] (the sections
 * present). The step reads a sub-group into one of --offload-buffer-count
 * buffers, updates it there and writes it back; with more than one buffer
 * the reads of the next sub-groups and the write of the previous one are
 * in flight meanwhile (DeepSpeed's pipelined optimizer swapping). The
 * parameters and gradients the update reads stay where they are. The
 * buffers are host memory, counted as optimizer state.
 *
 * --offload-param nvme (zero3): the parameter shard -- each unit's piece,
 * fp32 or 16-bit -- lives in a second swap file, except the persistent
 * units' pieces, which stay in memory as DeepSpeed keeps them. A piece is
 * in memory only while something uses it, in one of
 * --param-buffer-count buffers: read by one prefetch (strategy_zero.c)
 * and gathered by the next, so the read has a layer's compute to land
 * (a unit not read ahead is read when its gather starts), and freed once
 * the gather is done; the optimizer step reads each unit's
 * piece (the next one's read in flight), updates it and writes it back
 * while it goes on with the next. u->opt_w (and, fp32, u->opt_p)
 * point at the piece while it is in memory, NULL otherwise. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ops/autocast.h"
#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "worker/strategy/strategy_impl.h"
#include "worker/strategy/swap.h"

typedef struct group {
	int unit;
	size_t from;  /* within the unit's owned range */
	size_t n;
	uint64_t off; /* in the file */
	size_t bytes; /* the slot, aligned */
} group;

/* A swap file and its buffers. */
typedef struct store {
	hpu_swap *sw;
	int nbuf;
	void **raw;   /* hpu__halloc'd, for freeing */
	void **buf;   /* raw aligned to HPU_SWAP_ALIGN */
	int *use;     /* per buffer, -1 when none: the optimizer's transfer in
		       * flight / the unit whose piece it holds */
} store;

struct hpu_nv {
	store st;
	group *g;
	int ng;
	int nsec;     /* floats per element in a slot */
};

typedef struct piece {
	uint64_t off; /* in the file */
	size_t bytes; /* aligned */
	int buf;      /* the buffer holding it, or -1 (persistent: in keep) */
	int ticket;   /* its transfer in flight, or -1 */
	void *keep;   /* persistent units: always in memory, never in the file */
} piece;

struct hpu_nvp {
	store st;
	piece *p;     /* per unit */
	int cur, prev; /* the optimizer step: the unit being updated, the
			* one being written back */
};

static size_t align_up(size_t x)
{
	return (x + HPU_SWAP_ALIGN - 1) / HPU_SWAP_ALIGN * HPU_SWAP_ALIGN;
}

/* Swap file "r<rank>-<kind>" of `bytes` in dir for `what`, and nbuf
 * buffers of `bufbytes` counted as host memory of kind mk. 0, or -1
 * (s->err). */
static int store_open(hpu_strat *s, store *st, const char *dir, const char *kind,
		      const char *what, uint64_t bytes, int nbuf, size_t bufbytes,
		      hpu_mem_kind mk)
{
	const hpu_train_opts *o = s->o;
	hpu_swap_opts so = {
		.block_size = o->aio_block_size,
		.queue_depth = o->aio_queue_depth,
		.single_submit = o->aio_single_submit,
		.overlap_events = o->aio_overlap_events,
		.thread_count = o->aio_thread_count,
	};
	char tag[32];
	snprintf(tag, sizeof tag, "r%d-%s", s->rank, kind);
	if (!(st->sw = hpu__swap_open(dir, tag, what, bytes, &so, s->err, s->errlen)))
		return -1;
	if (!nbuf)
		return 0;
	st->nbuf = nbuf;
	st->raw = calloc((size_t)nbuf, sizeof *st->raw);
	st->buf = calloc((size_t)nbuf, sizeof *st->buf);
	st->use = malloc((size_t)nbuf * sizeof *st->use);
	if (!st->raw || !st->buf || !st->use)
		return hpu__strat_fail(s, "out of memory");
	for (int b = 0; b < nbuf; b++) {
		char name[96];
		snprintf(name, sizeof name, "NVMe swap buffer %d of %d (%s)", b + 1, nbuf, what);
		if (!(st->raw[b] = hpu__halloc(mk, bufbytes + HPU_SWAP_ALIGN, name)))
			return hpu__strat_fail(s, "%s", hpu__devmem_error());
		st->buf[b] = (void *)align_up((size_t)st->raw[b]);
		st->use[b] = -1;
	}
	return 0;
}

/* Waits for what is in flight, then closes the file (it goes with its
 * descriptor) and frees the buffers. */
static void store_close(store *st)
{
	hpu__swap_close(st->sw);
	for (int b = 0; st->raw && b < st->nbuf; b++)
		hpu__dfree(st->raw[b]);
	free(st->raw);
	free(st->buf);
	free(st->use);
}

static size_t owned_n(const hpu_strat *s, const unit *u)
{
	return s->sharded ? u->piece : u->len;
}

static size_t owned_from(const hpu_strat *s, int j)
{
	const unit *u = &s->u[j];
	return u->off + (s->sharded ? (size_t)s->rank * u->piece : 0);
}

static int swap_fail(hpu_strat *s)
{
	return hpu__strat_fail(s, "%s", hpu__swap_error(s->nv->st.sw));
}

int hpu__nv_open(hpu_strat *s)
{
	const hpu_train_opts *o = s->o;
	int nsec = s->plan.e[HPU_PLAN_MASTER].copies + s->plan.e[HPU_PLAN_OPTIM].copies;
	if (!nsec)
		return 0; /* plain SGD in fp32: no optimizer space at all */
	hpu_nv *nv = calloc(1, sizeof *nv);
	if (!nv)
		return hpu__strat_fail(s, "out of memory");
	s->nv = nv;
	nv->nsec = nsec;
	/* 0: a unit each (DeepSpeed's sub_group_size 0: a tensor each) */
	size_t sub = o->sub_group_size ? (size_t)o->sub_group_size : SIZE_MAX;
	int cap = 0;
	uint64_t at = 0;
	size_t largest = 0;
	for (int j = 0; j < s->nunits; j++) {
		size_t n = owned_n(s, &s->u[j]);
		for (size_t from = 0; from < n; from += sub) {
			if (nv->ng == cap) {
				cap = cap ? 2 * cap : 64;
				group *g = realloc(nv->g, (size_t)cap * sizeof *g);
				if (!g)
					return hpu__strat_fail(s, "out of memory");
				nv->g = g;
			}
			size_t c = n - from < sub ? n - from : sub;
			group *g = &nv->g[nv->ng++];
			*g = (group){j, from, c, at, align_up(c * (size_t)nsec * 4)};
			at += g->bytes;
			if (g->bytes > largest)
				largest = g->bytes;
		}
	}
	/* more buffers than sub-groups would never be used */
	int nbuf = o->offload_buffer_count < nv->ng ? o->offload_buffer_count : nv->ng;
	return store_open(s, &nv->st, o->nvme_path, "optim", "optimizer state", at, nbuf, largest,
			  HPU_MEM_OPTIM);
}

void hpu__nv_close(hpu_strat *s)
{
	hpu_nv *nv = s->nv;
	if (!nv)
		return;
	store_close(&nv->st);
	free(nv->g);
	free(nv);
	s->nv = NULL;
}

void hpu__strat_nvme_stats(const hpu_strat *s, hpu_nvme_stats *st)
{
	memset(st, 0, sizeof *st);
	if (s->nv)
		hpu__swap_stats(s->nv->st.sw, &st->read, &st->written, &st->wait_s);
	if (s->nvp) {
		double w = 0;
		hpu__swap_stats(s->nvp->st.sw, &st->param_read, &st->param_written, &w);
		st->read += st->param_read;
		st->written += st->param_written;
		st->wait_s += w;
	}
}

/* Section k (0 the master weights, 1 m, 2 v) of a slot holding n elements,
 * or NULL where the slot has none (fp32: the master weights are the
 * parameters themselves, in memory). */
static float *section(const hpu_strat *s, float *slot, size_t n, int k)
{
	int at = k - 1 + s->plan.e[HPU_PLAN_MASTER].copies;
	return at < 0 || at >= s->nv->nsec ? NULL : slot + (size_t)at * n;
}

int hpu__nv_has(const hpu_strat *s, int k)
{
	return s->nv && (k > 0 || s->plan.e[HPU_PLAN_MASTER].copies);
}

/* One slot read or written, waited for. */
static int transfer(hpu_swap *sw, int write, const group *g, float *slot)
{
	int t = write ? hpu__swap_write(sw, g->off, slot, g->bytes)
		      : hpu__swap_read(sw, g->off, slot, g->bytes);
	return t < 0 ? -1 : hpu__swap_wait(sw, t);
}

int hpu__nv_each(hpu_strat *s, int j, int k, hpu__nv_mode mode, hpu__nv_fn fn, void *arg)
{
	hpu_nv *nv = s->nv;
	size_t base = owned_from(s, j);
	float *slot = nv->st.buf[0];
	if (hpu__swap_wait_all(nv->st.sw) < 0)
		return swap_fail(s);
	for (int b = 0; b < nv->st.nbuf; b++)
		nv->st.use[b] = -1;
	for (int i = 0; i < nv->ng; i++) {
		const group *g = &nv->g[i];
		if (g->unit != j)
			continue;
		if (mode == HPU_NV_FILL)
			memset(slot, 0, g->bytes);
		else if (transfer(nv->st.sw, 0, g, slot) < 0)
			return swap_fail(s);
		if (fn(s, base + g->from, g->n, section(s, slot, g->n, k), arg) < 0)
			return -1;
		if (mode != HPU_NV_READ && transfer(nv->st.sw, 1, g, slot) < 0)
			return swap_fail(s);
	}
	return 0;
}

/* Copies between a sub-group's section and the owned range's values. */
typedef struct span {
	float *vals;  /* the owned range's floats */
	size_t from;  /* the layout position of vals[0] */
	int out;      /* section -> vals */
} span;

static int copy_span(hpu_strat *s, size_t from, size_t n, float *sec, void *arg)
{
	(void)s;
	span *sp = arg;
	float *v = sp->vals + (from - sp->from);
	memcpy(sp->out ? v : sec, sp->out ? sec : v, n * 4);
	return 0;
}

int hpu__nv_get(hpu_strat *s, int j, int k, float *dst)
{
	span sp = {dst, owned_from(s, j), 1};
	return hpu__nv_each(s, j, k, HPU_NV_READ, copy_span, &sp);
}

int hpu__nv_fill(hpu_strat *s, int j, const float *master)
{
	span sp = {(float *)master, owned_from(s, j), 0};
	return hpu__nv_each(s, j, 0, HPU_NV_FILL, copy_span, &sp);
}

/* Sub-group i's update in buf: the moments are the slot's, the master
 * weights the slot's (mixed precision: the 16-bit gradients converted a
 * chunk at a time, the result rounded into the working copy) or the
 * parameters themselves (fp32). */
static void update(hpu_strat *s, const group *g, float *buf, float gscale, double lr)
{
	unit *u = &s->u[g->unit];
	hpu_optim view = u->opt;
	view.m = section(s, buf, g->n, 1);
	view.v = section(s, buf, g->n, 2);
	float *p = hpu__strat_has_master(s) ? section(s, buf, g->n, 0) : u->opt_p + g->from;
	hpu__strat_update(s, &view, 0, g->n, p,
			  hpu__strat_at(s, HPU_PLAN_GRADS, u->opt_g, g->from),
			  hpu__strat_at(s, HPU_PLAN_PARAMS, u->opt_w, g->from),
			  gscale, lr);
}

/* Sub-group i into its buffer, once that buffer's last transfer is done. */
static int start_read(hpu_strat *s, int i)
{
	hpu_nv *nv = s->nv;
	int b = i % nv->st.nbuf;
	if (nv->st.use[b] >= 0 && hpu__swap_wait(nv->st.sw, nv->st.use[b]) < 0)
		return -1;
	nv->st.use[b] = hpu__swap_read(nv->st.sw, nv->g[i].off, nv->st.buf[b], nv->g[i].bytes);
	return nv->st.use[b] < 0 ? -1 : 0;
}

int hpu__nv_step(hpu_strat *s, float gscale, double lr)
{
	hpu_nv *nv = s->nv; /* the units' opt.t counts this step (hpu__vars_decide) */
	/* With B buffers, B - 1 sub-groups are read ahead: sub-group i + B - 1
	 * goes into the buffer sub-group i - 1 is being written from. One
	 * buffer: one sub-group at a time, nothing overlapped. */
	int ahead = nv->st.nbuf > 1 ? nv->st.nbuf - 1 : 1;
	for (int i = 0; i < ahead && i < nv->ng; i++)
		if (start_read(s, i) < 0)
			return swap_fail(s);
	for (int i = 0; i < nv->ng; i++) {
		int b = i % nv->st.nbuf;
		if (hpu__swap_wait(nv->st.sw, nv->st.use[b]) < 0) {
			nv->st.use[b] = -1;
			return swap_fail(s);
		}
		if (s->nvp && hpu__nvp_step_at(s, nv->g[i].unit) < 0)
			return -1;
		update(s, &nv->g[i], nv->st.buf[b], gscale, lr);
		nv->st.use[b] = hpu__swap_write(nv->st.sw, nv->g[i].off, nv->st.buf[b], nv->g[i].bytes);
		if (nv->st.use[b] < 0 || (i + ahead < nv->ng && start_read(s, i + ahead) < 0))
			return swap_fail(s);
	}
	/* the writes land before anything reads the file or a checkpoint
	 * says the step is done */
	int rc = hpu__swap_wait_all(nv->st.sw);
	for (int b = 0; b < nv->st.nbuf; b++)
		nv->st.use[b] = -1;
	if (rc < 0)
		return swap_fail(s);
	return s->nvp ? hpu__nvp_step_at(s, s->nunits) : 0;
}

/* ---- the parameters: --offload-param nvme ---- */

static int nvp_fail(hpu_strat *s)
{
	return hpu__strat_fail(s, "%s", hpu__swap_error(s->nvp->st.sw));
}

/* Unit k's piece now at `at` (NULL: not in memory). */
static void point_piece(hpu_strat *s, int k, void *at)
{
	s->u[k].opt_w = at;
	if (!hpu__strat_has_master(s)) /* the parameters are what is updated */
		s->u[k].opt_p = at;
}

int hpu__nvp_open(hpu_strat *s)
{
	const hpu_train_opts *o = s->o;
	size_t esz = hpu__plan_esize(&s->plan.e[HPU_PLAN_PARAMS]);
	hpu_nvp *nvp = calloc(1, sizeof *nvp);
	if (!nvp || !(nvp->p = calloc((size_t)s->nunits, sizeof *nvp->p))) {
		free(nvp);
		return hpu__strat_fail(s, "out of memory");
	}
	s->nvp = nvp;
	nvp->cur = nvp->prev = -1;
	uint64_t at = 0;
	size_t largest = 0;
	for (int k = 0; k < s->nunits; k++) {
		unit *u = &s->u[k];
		piece *p = &nvp->p[k];
		p->buf = p->ticket = -1;
		if (u->persistent) {
			char what[128];
			snprintf(what, sizeof what, "parameter piece of %s (persistent)",
				 hpu__strat_unit_name(s, k));
			if (!(p->keep = hpu__halloc(HPU_MEM_PARAMS, u->piece * esz, what)))
				return hpu__strat_fail(s, "%s", hpu__devmem_error());
			point_piece(s, k, p->keep);
			continue;
		}
		if (u->piece > (size_t)o->param_buffer_size)
			return hpu__strat_fail(
				s, "--param-buffer-size %ld (offload_param.buffer_size) is smaller than the "
				   "piece of %s this rank keeps (%zu elements); make it at least that",
				o->param_buffer_size, hpu__strat_unit_name(s, k), u->piece);
		p->off = at;
		p->bytes = align_up(u->piece * esz);
		at += p->bytes;
		if (p->bytes > largest)
			largest = p->bytes;
	}
	/* every unit persistent: nothing to swap, but the path is checked
	 * all the same, on one block */
	return store_open(s, &nvp->st, o->param_nvme_path, "params", "parameters",
			  at ? at : HPU_SWAP_ALIGN, at ? o->param_buffer_count : 0, largest,
			  HPU_MEM_PARAMS);
}

void hpu__nvp_close(hpu_strat *s)
{
	hpu_nvp *nvp = s->nvp;
	if (!nvp)
		return;
	store_close(&nvp->st);
	for (int k = 0; k < s->nunits; k++)
		hpu__dfree(nvp->p[k].keep);
	free(nvp->p);
	free(nvp);
	s->nvp = NULL;
}

/* Unit k's piece out of memory, the gather sending from it and its
 * transfer waited for first. */
int hpu__nvp_drop(hpu_strat *s, int k)
{
	piece *p = &s->nvp->p[k];
	if (p->keep || p->buf < 0)
		return 0;
	if (s->u[k].gather) {
		int rc = hpucoll_wait(&s->u[k].gather);
		if (rc)
			return hpu__strat_coll_fail(s, "parameter all-gather", rc);
	}
	int t = p->ticket;
	s->nvp->st.use[p->buf] = -1;
	p->buf = p->ticket = -1;
	point_piece(s, k, NULL);
	return t >= 0 && hpu__swap_wait(s->nvp->st.sw, t) < 0 ? nvp_fail(s) : 0;
}

int hpu__nvp_drop_all(hpu_strat *s)
{
	for (int k = 0; k < s->nunits; k++)
		if (hpu__nvp_drop(s, k) < 0)
			return -1;
	return 0;
}

/* A free buffer, or -1. */
static int free_buf(const hpu_nvp *nvp)
{
	for (int b = 0; b < nvp->st.nbuf; b++)
		if (nvp->st.use[b] < 0)
			return b;
	return -1;
}

/* A buffer for unit k's piece: a free one, else one taken from another
 * piece -- one not in a gather first, else the first held by a gather,
 * which is waited for (never the step's unit being updated). The same
 * state always picks the same buffer: what is read is deterministic. */
static int take_buf(hpu_strat *s, int k)
{
	hpu_nvp *nvp = s->nvp;
	int b = free_buf(nvp), victim = -1;
	if (b >= 0)
		return b;
	for (b = 0; b < nvp->st.nbuf; b++) {
		int o = nvp->st.use[b];
		if (o == nvp->cur)
			continue;
		if (!s->u[o].gather) {
			victim = b;
			break;
		}
		if (victim < 0)
			victim = b;
	}
	if (victim < 0)
		return hpu__strat_fail(s, "no parameter buffer free for %s "
					  "(--param-buffer-count %d is too few)",
				       hpu__strat_unit_name(s, k), nvp->st.nbuf);
	return hpu__nvp_drop(s, nvp->st.use[victim]) < 0 ? -1 : victim;
}

/* Unit k's piece into buffer b, its read started (read) or not. */
static int place(hpu_strat *s, int k, int b, int read)
{
	hpu_nvp *nvp = s->nvp;
	piece *p = &nvp->p[k];
	nvp->st.use[b] = k;
	p->buf = b;
	p->ticket = -1;
	point_piece(s, k, nvp->st.buf[b]);
	if (read && (p->ticket = hpu__swap_read(nvp->st.sw, p->off, nvp->st.buf[b], p->bytes)) < 0) {
		nvp->st.use[b] = p->buf = -1;
		point_piece(s, k, NULL);
		return nvp_fail(s);
	}
	return 0;
}

int hpu__nvp_fetched(const hpu_strat *s, int k)
{
	const piece *p = &s->nvp->p[k];
	return p->keep || p->buf >= 0;
}

int hpu__nvp_fetch(hpu_strat *s, int k)
{
	if (hpu__nvp_fetched(s, k))
		return 0;
	int b = free_buf(s->nvp);
	return b < 0 ? 0 : place(s, k, b, 1);
}

void *hpu__nvp_get(hpu_strat *s, int k, int read)
{
	hpu_nvp *nvp = s->nvp;
	piece *p = &nvp->p[k];
	if (p->keep)
		return p->keep;
	if (p->buf < 0) {
		int b = take_buf(s, k);
		if (b < 0 || place(s, k, b, read) < 0)
			return NULL;
	}
	if (p->ticket >= 0) { /* its read, or an earlier write */
		int t = p->ticket;
		p->ticket = -1;
		if (hpu__swap_wait(nvp->st.sw, t) < 0) {
			nvp_fail(s);
			return NULL;
		}
	}
	return nvp->st.buf[p->buf];
}

int hpu__nvp_put(hpu_strat *s, int k)
{
	hpu_nvp *nvp = s->nvp;
	piece *p = &nvp->p[k];
	if (p->keep)
		return 0;
	if (p->ticket >= 0 && hpu__swap_wait(nvp->st.sw, p->ticket) < 0)
		return nvp_fail(s);
	p->ticket = hpu__swap_write(nvp->st.sw, p->off, nvp->st.buf[p->buf], p->bytes);
	return p->ticket < 0 ? nvp_fail(s) : 0;
}

int hpu__nvp_step_at(hpu_strat *s, int k)
{
	hpu_nvp *nvp = s->nvp;
	if (k == nvp->cur)
		return 0;
	if (nvp->cur >= 0) { /* the unit just updated goes back */
		if (hpu__nvp_put(s, nvp->cur) < 0)
			return -1;
		if (nvp->prev >= 0 && hpu__nvp_drop(s, nvp->prev) < 0)
			return -1;
		nvp->prev = nvp->cur;
	}
	nvp->cur = -1;
	if (k >= s->nunits) { /* done: every write landed */
		nvp->prev = -1;
		return hpu__nvp_drop_all(s);
	}
	if (!hpu__nvp_get(s, k, 1))
		return -1;
	nvp->cur = k;
	return k + 1 < s->nunits ? hpu__nvp_fetch(s, k + 1) : 0;
}
