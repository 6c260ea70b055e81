/* strategy_nvme: --offload-optimizer nvme (ZeRO-Infinity). The optimizer's
 * space of this rank -- the moments, and under mixed precision the fp32
 * master weights -- lives in one swap file (swap.h), not in memory. It is
 * cut into sub-groups of at most --sub-group-size elements, none across a
 * unit, each stored as one aligned slot [master | m | v] (the sections
 * present). The step reads a sub-group into one of --offload-buffer-count
 * buffers, updates it there and writes it back; with more than one buffer
 * the reads of the next sub-groups and the write of the previous one are
 * in flight meanwhile (DeepSpeed's pipelined optimizer swapping). The
 * parameters and gradients the update reads stay where they are. The
 * buffers are host memory, counted as optimizer state. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autocast.h"
#include "devmem.h"
#include "strategy_impl.h"
#include "swap.h"

typedef struct group {
	int unit;
	size_t from;  /* within the unit's owned range */
	size_t n;
	uint64_t off; /* in the file */
	size_t bytes; /* the slot, aligned */
} group;

struct hpu_nv {
	hpu_swap *sw;
	group *g;
	int ng;
	int nsec;     /* floats per element in a slot */
	int nbuf;
	void **raw;   /* hpu__halloc'd, for freeing */
	float **buf;  /* raw aligned to HPU_SWAP_ALIGN */
	int *ticket;  /* per buffer: its transfer in flight, or -1 */
};

static size_t align_up(size_t x)
{
	return (x + HPU_SWAP_ALIGN - 1) / HPU_SWAP_ALIGN * HPU_SWAP_ALIGN;
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
	return hpu__strat_fail(s, "%s", hpu_swap_error(s->nv->sw));
}

int hpu__nv_open(hpu_strat *s)
{
	const hpu_train_opts *o = s->o;
	int nsec = hpu_optim_state_floats(o) + (s->mp ? 1 : 0);
	if (!nsec)
		return 0; /* plain SGD in fp32: no optimizer space at all */
	hpu_nv *nv = calloc(1, sizeof *nv);
	if (!nv)
		return hpu__strat_fail(s, "out of memory");
	s->nv = nv;
	nv->nsec = nsec;
	size_t sub = (size_t)o->sub_group_size;
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
	hpu_swap_opts so = {
		.block_size = o->aio_block_size,
		.queue_depth = o->aio_queue_depth,
		.single_submit = o->aio_single_submit,
		.overlap_events = o->aio_overlap_events,
		.thread_count = o->aio_thread_count,
	};
	char tag[32];
	snprintf(tag, sizeof tag, "r%d-optim", s->rank);
	if (!(nv->sw = hpu_swap_open(o->nvme_path, tag, "optimizer state", at, &so, s->err,
				     s->errlen)))
		return -1;
	/* more buffers than sub-groups would never be used */
	nv->nbuf = o->offload_buffer_count < nv->ng ? o->offload_buffer_count : nv->ng;
	nv->raw = calloc((size_t)nv->nbuf, sizeof *nv->raw);
	nv->buf = calloc((size_t)nv->nbuf, sizeof *nv->buf);
	nv->ticket = malloc((size_t)nv->nbuf * sizeof *nv->ticket);
	if (!nv->raw || !nv->buf || !nv->ticket)
		return hpu__strat_fail(s, "out of memory");
	for (int b = 0; b < nv->nbuf; b++) {
		char what[96];
		snprintf(what, sizeof what, "NVMe swap buffer %d of %d (optimizer state)", b + 1,
			 nv->nbuf);
		if (!(nv->raw[b] = hpu__halloc(HPU_MEM_OPTIM, largest + HPU_SWAP_ALIGN, what)))
			return hpu__strat_fail(s, "%s", hpu__devmem_error());
		nv->buf[b] = (float *)align_up((size_t)nv->raw[b]);
		nv->ticket[b] = -1;
	}
	return 0;
}

void hpu__nv_close(hpu_strat *s)
{
	hpu_nv *nv = s->nv;
	if (!nv)
		return;
	hpu_swap_close(nv->sw); /* waits for what is in flight first */
	for (int b = 0; nv->raw && b < nv->nbuf; b++)
		hpu__dfree(nv->raw[b]);
	free(nv->raw);
	free(nv->buf);
	free(nv->ticket);
	free(nv->g);
	free(nv);
	s->nv = NULL;
}

void hpu_strat_nvme_stats(const hpu_strat *s, uint64_t *read, uint64_t *written, double *wait_s)
{
	*read = *written = 0;
	*wait_s = 0;
	if (s->nv)
		hpu_swap_stats(s->nv->sw, read, written, wait_s);
}

/* Section k (0 the master weights, 1 m, 2 v) of a slot holding n elements,
 * or NULL where the slot has none (fp32: the master weights are the
 * parameters themselves, in memory). */
static float *section(const hpu_strat *s, float *slot, size_t n, int k)
{
	int at = s->mp ? k : k - 1;
	return at < 0 || at >= s->nv->nsec ? NULL : slot + (size_t)at * n;
}

int hpu__nv_has(const hpu_strat *s, int k)
{
	return s->nv && (s->mp || k > 0);
}

/* One slot read or written, waited for. */
static int transfer(hpu_swap *sw, int write, const group *g, float *slot)
{
	int t = write ? hpu_swap_write(sw, g->off, slot, g->bytes)
		      : hpu_swap_read(sw, g->off, slot, g->bytes);
	return t < 0 ? -1 : hpu_swap_wait(sw, t);
}

int hpu__nv_each(hpu_strat *s, int j, int k, hpu__nv_mode mode, hpu__nv_fn fn, void *arg)
{
	hpu_nv *nv = s->nv;
	size_t base = owned_from(s, j);
	float *slot = nv->buf[0];
	if (hpu_swap_wait_all(nv->sw) < 0)
		return swap_fail(s);
	for (int b = 0; b < nv->nbuf; b++)
		nv->ticket[b] = -1;
	for (int i = 0; i < nv->ng; i++) {
		const group *g = &nv->g[i];
		if (g->unit != j)
			continue;
		if (mode == HPU_NV_FILL)
			memset(slot, 0, g->bytes);
		else if (transfer(nv->sw, 0, g, slot) < 0)
			return swap_fail(s);
		if (fn(s, base + g->from, g->n, section(s, slot, g->n, k), arg) < 0)
			return -1;
		if (mode != HPU_NV_READ && transfer(nv->sw, 1, g, slot) < 0)
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
	if (!s->mp) {
		hpu_optim_range(&view, 0, g->n, u->opt_p + g->from, u->opt_g + g->from, gscale, lr);
		return;
	}
	float *master = section(s, buf, g->n, 0);
	for (size_t i = 0; i < g->n; i += HPU__STRAT_CHUNK) {
		size_t c = hpu__strat_chunk(g->n, i);
		hpu__ac_from16(s->fp16, s->chunk, u->opt_g16 + g->from + i, c);
		hpu_optim_range(&view, i, c, master + i, s->chunk, gscale, lr);
		hpu__mp_to16(s->fp16, u->opt_p16 + g->from + i, master + i, c);
	}
}

/* Sub-group i into its buffer, once that buffer's last transfer is done. */
static int start_read(hpu_strat *s, int i)
{
	hpu_nv *nv = s->nv;
	int b = i % nv->nbuf;
	if (nv->ticket[b] >= 0 && hpu_swap_wait(nv->sw, nv->ticket[b]) < 0)
		return -1;
	nv->ticket[b] = hpu_swap_read(nv->sw, nv->g[i].off, nv->buf[b], nv->g[i].bytes);
	return nv->ticket[b] < 0 ? -1 : 0;
}

int hpu__nv_step(hpu_strat *s, float gscale, double lr)
{
	hpu_nv *nv = s->nv;
	for (int k = 0; k < s->nunits; k++)
		hpu_optim_begin(&s->u[k].opt);
	/* With B buffers, B - 1 sub-groups are read ahead: sub-group i + B - 1
	 * goes into the buffer sub-group i - 1 is being written from. One
	 * buffer: one sub-group at a time, nothing overlapped. */
	int ahead = nv->nbuf > 1 ? nv->nbuf - 1 : 1;
	for (int i = 0; i < ahead && i < nv->ng; i++)
		if (start_read(s, i) < 0)
			return swap_fail(s);
	for (int i = 0; i < nv->ng; i++) {
		int b = i % nv->nbuf;
		if (hpu_swap_wait(nv->sw, nv->ticket[b]) < 0) {
			nv->ticket[b] = -1;
			return swap_fail(s);
		}
		update(s, &nv->g[i], nv->buf[b], gscale, lr);
		nv->ticket[b] = hpu_swap_write(nv->sw, nv->g[i].off, nv->buf[b], nv->g[i].bytes);
		if (nv->ticket[b] < 0 || (i + ahead < nv->ng && start_read(s, i + ahead) < 0))
			return swap_fail(s);
	}
	/* the writes land before anything reads the file or a checkpoint
	 * says the step is done */
	int rc = hpu_swap_wait_all(nv->sw);
	for (int b = 0; b < nv->nbuf; b++)
		nv->ticket[b] = -1;
	return rc < 0 ? swap_fail(s) : 0;
}
