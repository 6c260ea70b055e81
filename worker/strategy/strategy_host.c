/* strategy_host: host-only layers (HPU_LAYER_HOST_ONLY) on a device whose
 * host may not read device memory (a GPU; cpu-strict). Their forward and
 * backward read and write the tensors' memory themselves, so each call
 * runs on host copies of what it can reach: its inputs, outputs and
 * their gradients, its parameters (its own and those it shares), their
 * gradients, its buffers, its saved and scratch memory. Copied in before
 * the call: what it reads (inputs; outputs and output gradients in
 * backward; parameters; gradients in backward, which it adds to; buffers;
 * saved memory). Copied back after: what it writes (outputs in forward,
 * input gradients in backward, gradients, buffers, saved memory). The
 * host copies live in one pinned block per layer, made at its first
 * staged call (sized for the largest batch) and kept until the strategy
 * is freed. Each copy is the device's (hpu__dev_copy), counted in its
 * h2d/d2h bytes, and planned (hpu__host_stage_plan, the same rules as
 * the calls below). Where the host may read device memory (cpu) nothing is
 * staged. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/device/device.h"
#include "worker/strategy/strategy_impl.h"

typedef struct hpu__lstage hpu__lstage;

/* One layer's staging: its pinned block and where each piece lies. */
struct hpu__lstage {
	char *host;
	size_t in[HPU_MAX_IO], out[HPU_MAX_IO], dout[HPU_MAX_IO], din[HPU_MAX_IO];
	int nown;              /* the layer and the layers whose parameters it uses */
	size_t *poff, *goff;   /* per owner: its parameters' and gradients' copy */
	size_t boff, soff, xoff; /* buffers, saved, scratch */
	size_t bbytes, sbytes;
	/* the device's pointers while a call runs on the host copies */
	void *out_d[HPU_MAX_IO], *din_d[HPU_MAX_IO];
	float **p_d, **g_d, *b_d;
	void *s_d, *x_d;
	int warned;
};

static size_t al64(size_t n)
{
	return (n + 63) & ~(size_t)63;
}

int hpu__host_staged(const hpu_strat *s, int i)
{
	return s->b->layers[i]->device == HPU_LAYER_HOST_ONLY && !hpu__dev_host_can_read();
}

static hpu_layer *owner(const hpu_strat *s, const hpu_layer *l, int j)
{
	return j == 0 ? (hpu_layer *)l : s->b->layers[l->uses[j - 1]];
}

static size_t tbytes(const hpu_strat *s, int t, int batch)
{
	return (size_t)batch * s->b->tensors[t].sample_numel * 4; /* f32, i32 */
}

static size_t buffer_floats(const hpu_layer *l)
{
	if (!l->nbuffers)
		return 0;
	const hpu_buffer_info *f = &l->b->buffers[l->first_buffer];
	const hpu_buffer_info *e = &l->b->buffers[l->first_buffer + l->nbuffers - 1];
	return e->offset + e->numel - f->offset;
}

static void stage_free(hpu__lstage *g)
{
	if (!g)
		return;
	hpu__dev_host_free(g->host);
	free(g->poff);
	free(g->p_d);
	free(g);
}

/* Layer i's staging, laid out for the largest batch. */
static hpu__lstage *stage_make(hpu_strat *s, int i)
{
	hpu_layer *l = s->b->layers[i];
	hpu__lstage *g = calloc(1, sizeof *g);
	if (!g)
		return NULL;
	g->nown = 1 + l->nuses;
	g->poff = calloc(2 * (size_t)g->nown, sizeof *g->poff);
	g->p_d = calloc(2 * (size_t)g->nown, sizeof *g->p_d);
	if (!g->poff || !g->p_d)
		goto fail;
	g->goff = g->poff + g->nown;
	g->g_d = g->p_d + g->nown;
	size_t at = 0;
	for (int k = 0; k < l->nin; k++) {
		g->in[k] = at, at += al64(tbytes(s, l->in[k], s->maxbatch));
		g->din[k] = at, at += al64(tbytes(s, l->in[k], s->maxbatch));
	}
	for (int k = 0; k < l->nout; k++) {
		g->out[k] = at, at += al64(tbytes(s, l->out[k], s->maxbatch));
		g->dout[k] = at, at += al64(tbytes(s, l->out[k], s->maxbatch));
	}
	for (int j = 0; j < g->nown; j++) {
		size_t n = al64(owner(s, l, j)->plen * 4);
		g->poff[j] = at, at += n;
		g->goff[j] = at, at += n;
	}
	g->bbytes = buffer_floats(l) * 4;
	g->boff = at, at += al64(g->bbytes);
	g->sbytes = hpu__strat_saved_floats(s, l) * 4;
	g->soff = at, at += al64(g->sbytes);
	g->xoff = at, at += al64(hpu__strat_scratch_floats(s, l) * 4);
	if (!(g->host = hpu__dev_host_alloc(at ? at : 64)))
		goto fail;
	return g;
fail:
	stage_free(g);
	return NULL;
}

/* A copy of n bytes from src, kept at off of the block; the host copy. */
static void *in_copy(hpu__lstage *g, size_t off, const void *src, size_t n)
{
	if (src && n)
		hpu__dev_copy(g->host + off, src, n);
	return g->host + off;
}

int hpu__host_stage_in(hpu_strat *s, int i, int backward, hpu_tensor *in, hpu_tensor *out,
		       hpu_tensor *dout, hpu_tensor *din)
{
	hpu_layer *l = s->b->layers[i];
	if (!s->stg.lstage && !(s->stg.lstage = calloc((size_t)s->nlayers, sizeof *s->stg.lstage)))
		return hpu__strat_fail(s, "out of memory");
	hpu__lstage *g = s->stg.lstage[i];
	if (!g && !(g = s->stg.lstage[i] = stage_make(s, i)))
		return hpu__strat_fail(s, "layer %s: no pinned host memory to stage its tensors in",
				       l->name);
	if (!g->warned && s->rank == 0) /* every rank stages alike: one line a job */
		printf("warning: layer %s is host-only (HPU_LAYER_HOST_ONLY) on device %s: its "
		       "tensors are staged through host memory (correct, slow)\n",
		       l->name, hpu__dev_name());
	g->warned = 1;
	/* mixed precision: the fp32 values made on the device first, as
	 * hpu_param() would make them (the host copy has none to make) */
	hpu__dev_enter();
	for (int k = 0; !l->params_in_ops && k < l->npidx; k++)
		hpu_param(l, k);
	hpu__dev_leave();
	int batch = s->ctx.batch;
	/* NULL stays NULL: what backward does not read (hpu_layer_backward_reads) */
	for (int k = 0; k < l->nin; k++)
		if (in[k].data)
			in[k].data = in_copy(g, g->in[k], in[k].data, tbytes(s, l->in[k], batch));
	for (int k = 0; k < l->nout; k++) {
		size_t n = tbytes(s, l->out[k], batch);
		g->out_d[k] = out[k].data;
		if (backward) {
			if (out[k].data)
				out[k].data = in_copy(g, g->out[k], out[k].data, n);
			dout[k].data = in_copy(g, g->dout[k], dout[k].data, n);
		} else {
			out[k].data = g->host + g->out[k]; /* the forward writes it */
		}
	}
	for (int k = 0; backward && k < l->nin; k++) {
		g->din_d[k] = din[k].data; /* written by the backward; NULL: none wanted */
		if (din[k].data)
			din[k].data = g->host + g->din[k];
	}
	for (int j = 0; j < g->nown; j++) {
		hpu_layer *o = owner(s, l, j);
		g->p_d[j] = o->pbase;
		g->g_d[j] = o->gbase;
		if (o->pbase)
			o->pbase = in_copy(g, g->poff[j], o->pbase, o->plen * 4);
		if (backward && o->gbase) /* the backward adds to them */
			o->gbase = in_copy(g, g->goff[j], o->gbase, o->plen * 4);
	}
	g->b_d = l->bbase;
	if (l->bbase)
		l->bbase = in_copy(g, g->boff, l->bbase, g->bbytes);
	g->s_d = l->saved;
	if (l->saved)
		l->saved = in_copy(g, g->soff, l->saved, g->sbytes);
	g->x_d = l->scratch;
	if (l->scratch)
		l->scratch = g->host + g->xoff;
	hpu__dev_queue_sync(NULL);
	return 0;
}

void hpu__host_stage_out(hpu_strat *s, int i, int backward, int rc)
{
	hpu_layer *l = s->b->layers[i];
	hpu__lstage *g = s->stg.lstage[i];
	int batch = s->ctx.batch;
	for (int k = 0; rc == 0 && !backward && k < l->nout; k++)
		hpu__dev_copy(g->out_d[k], g->host + g->out[k], tbytes(s, l->out[k], batch));
	for (int k = 0; rc == 0 && backward && k < l->nin; k++)
		if (g->din_d[k])
			hpu__dev_copy(g->din_d[k], g->host + g->din[k], tbytes(s, l->in[k], batch));
	for (int j = 0; j < g->nown; j++) {
		hpu_layer *o = owner(s, l, j);
		if (rc == 0 && backward && g->g_d[j])
			hpu__dev_copy(g->g_d[j], g->host + g->goff[j], o->plen * 4);
		o->pbase = g->p_d[j];
		o->gbase = g->g_d[j];
	}
	if (rc == 0 && g->b_d)
		hpu__dev_copy(g->b_d, g->host + g->boff, g->bbytes);
	if (rc == 0 && g->s_d)
		hpu__dev_copy(g->s_d, g->host + g->soff, g->sbytes);
	l->bbase = g->b_d;
	l->saved = g->s_d;
	l->scratch = g->x_d;
	hpu__dev_queue_sync(NULL);
}

void hpu__host_stage_free(hpu_strat *s)
{
	for (int i = 0; s->stg.lstage && i < s->nlayers; i++)
		stage_free(s->stg.lstage[i]);
	free(s->stg.lstage);
	s->stg.lstage = NULL;
}

/* One layer's bytes per training micro-step: stage_in's and stage_out's
 * copies, for a forward and (where it runs) a backward. */
static void layer_plan(const hpu_strat *s, int i, int micro, uint64_t *h2d, uint64_t *d2h)
{
	const hpu_layer *l = s->b->layers[i];
	uint64_t ins = 0, outs = 0, dins = 0, params = 0;
	for (int k = 0; k < l->nin; k++) {
		ins += tbytes(s, l->in[k], micro);
		if (s->b->tensors[l->in[k]].grad)
			dins += tbytes(s, l->in[k], micro);
	}
	for (int k = 0; k < l->nout; k++)
		outs += tbytes(s, l->out[k], micro);
	for (int j = 0; j < 1 + l->nuses; j++)
		params += owner(s, l, j)->plen * 4;
	uint64_t state = buffer_floats(l) * 4 +
			 hpu__strat_saved_floats(s, l) * 4;
	*d2h += ins + params + state;
	*h2d += outs + state;
	if (!l->backward)
		return;
	*d2h += ins + 2 * outs + 2 * params + state; /* parameters, gradients */
	*h2d += dins + params + state;
}

const char *hpu__host_stage_unrecordable(const hpu_strat *s, int eval)
{
	static char why[HPU_NAME_MAX + 256];
	for (int i = 0; i < s->nlayers; i++) {
		const hpu_layer *l = s->b->layers[i];
		if (!hpu__host_staged(s, i) || !(eval ? l->for_eval : l->for_loss))
			continue;
		snprintf(why, sizeof why,
			 "layer %s is host-only (HPU_LAYER_HOST_ONLY): its tensors are staged "
			 "through host memory by host code, which would run now, on the staging "
			 "buffers' old contents, and not at each launch",
			 l->name);
		return why;
	}
	return NULL;
}

int hpu__host_stage_plan(const hpu_strat *s, int micro, uint64_t *h2d, uint64_t *d2h)
{
	int floor = 0;
	*h2d = *d2h = 0;
	for (int i = 0; i < s->nlayers; i++) {
		const hpu_layer *l = s->b->layers[i];
		if (!hpu__host_staged(s, i) || !l->for_loss)
			continue;
		layer_plan(s, i, micro, h2d, d2h);
		floor |= l->ckpt;
	}
	return floor;
}
