/* The strategy's side of checkpoints: which floats of the canonical space
 * (ckpt.h) a rank saves, where they sit in its layout, and reading a
 * checkpoint saved under any strategy and world size back into this one.
 * And --save-params: the whole canonical space, consolidated, in one flat
 * file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/device/device.h"
#include "worker/hpu/devmem.h"
#include "common/fileio.h"
#include "common/shapetext.h"
#include "worker/strategy/strategy_impl.h"

/* Parameter i's first float in the canonical space. */
static const uint64_t *canon(hpu_strat *s)
{
	if (!s->canon) {
		hpu_builder *b = s->b;
		if (!(s->canon = malloc(((size_t)b->nparams + 1) * sizeof *s->canon)))
			return NULL;
		uint64_t at = 0;
		for (int i = 0; i < b->nparams; i++) {
			s->canon[i] = at;
			at += b->params[i].numel;
		}
		s->canon[b->nparams] = at;
	}
	return s->canon;
}

/* One run of floats both contiguous in the layout and in the canonical
 * space: layout [pos, pos + count), canonical [start, start + count). */
typedef struct run {
	size_t pos;
	uint64_t start, count;
} run;

typedef int (*run_fn)(hpu_strat *s, const run *r, void *arg);

/* Calls fn for every parameter run inside layout [from, from + n) of unit
 * j, in order, clipped to canonical [clo, chi). */
static int each_run(hpu_strat *s, int j, size_t from, size_t n, uint64_t clo, uint64_t chi,
		    run_fn fn, void *arg)
{
	const uint64_t *cn = canon(s);
	if (!cn)
		return hpu__strat_fail(s, "out of memory");
	const unit *u = &s->u[j];
	hpu_builder *b = s->b;
	for (int i = u->first; i <= u->last; i++) {
		const hpu_layer *l = b->layers[i];
		for (int p = l->first_param; p < l->first_param + l->nparams; p++) {
			const hpu_param_info *pi = &b->params[p];
			size_t lo = l->off + pi->rel, hi = lo + pi->numel;
			if (lo < from)
				lo = from;
			if (hi > from + n)
				hi = from + n;
			uint64_t c0 = cn[p] + (lo - (l->off + pi->rel)), c1 = c0 + (hi - lo);
			if (c0 < clo) {
				lo += clo - c0;
				c0 = clo;
			}
			if (c1 > chi)
				c1 = chi;
			if (c1 <= c0)
				continue;
			run r = {lo, c0, c1 - c0};
			if (fn(s, &r, arg) < 0)
				return -1;
		}
	}
	return 0;
}

/* The layout range rank r keeps the optimizer state of in unit j. */
static void owned(const hpu_strat *s, int j, int r, size_t *from, size_t *n)
{
	const unit *u = &s->u[j];
	*from = u->off + (s->sharded ? (size_t)r * u->piece : 0);
	*n = s->sharded ? u->piece : u->len;
}

/* Without sharding every rank holds everything; rank r saves the r-th of
 * W equal slices of the canonical space. */
static void slice(hpu_strat *s, int r, uint64_t *lo, uint64_t *hi)
{
	uint64_t psi = canon(s) ? s->canon[s->b->nparams] : 0;
	if (s->sharded) {
		*lo = 0;
		*hi = psi;
		return;
	}
	*lo = psi * (uint64_t)r / (uint64_t)s->world;
	*hi = psi * (uint64_t)(r + 1) / (uint64_t)s->world;
}

int hpu__strat_ckpt_sections(const hpu_strat *s, const char *names[3])
{
	names[0] = "params";
	if (hpu__optim_state_floats(s->o) == 2) {
		names[1] = "exp_avg";
		names[2] = "exp_avg_sq";
		return 3;
	}
	if (hpu__optim_state_floats(s->o) == 1) {
		names[1] = "momentum_buffer";
		return 2;
	}
	return 1;
}

typedef struct seglist {
	hpu_ckpt_seg *v;
	size_t n, cap;
} seglist;

static int add_seg(hpu_strat *s, const run *r, void *arg)
{
	seglist *L = arg;
	if (L->n && L->v[L->n - 1].start + L->v[L->n - 1].count == r->start) {
		L->v[L->n - 1].count += r->count;
		return 0;
	}
	if (L->n == L->cap) {
		size_t cap = L->cap ? 2 * L->cap : 64;
		hpu_ckpt_seg *g = realloc(L->v, cap * sizeof *g);
		if (!g)
			return hpu__strat_fail(s, "out of memory");
		L->v = g;
		L->cap = cap;
	}
	L->v[L->n++] = (hpu_ckpt_seg){r->start, r->count};
	return 0;
}

int hpu__strat_ckpt_segments(const hpu_strat *cs, int r, hpu_ckpt_seg **segs, size_t *n)
{
	hpu_strat *s = (hpu_strat *)cs; /* the canonical offsets are cached */
	seglist L = {0};
	uint64_t clo, chi;
	slice(s, r, &clo, &chi);
	for (int j = 0; j < s->nunits; j++) {
		size_t from, len;
		owned(s, j, r, &from, &len);
		if (each_run(s, j, from, len, clo, chi, add_seg, &L) < 0) {
			free(L.v);
			return -1;
		}
	}
	*segs = L.v;
	*n = L.n;
	return 0;
}

typedef struct put {
	hpu_ckpt_writer *w;
	const float *base; /* the unit's array of this section, at its owned range */
	size_t from;       /* the layout position of base[0] */
} put;

/* Floats a checkpoint moves through host memory at a time, where the
 * host may not read the device's. */
#define CKPT_STAGE 65536

static int put_run(hpu_strat *s, const run *r, void *arg)
{
	put *p = arg;
	const float *src = p->base + (r->pos - p->from);
	if (!hpu__dev_owns(src))
		return hpu__ckpt_writer_put(p->w, src, r->count * 4, s->err, s->errlen);
	float *h = hpu__dev_host_alloc(CKPT_STAGE * 4);
	int rc = h ? 0 : hpu__strat_fail(s, "out of host memory for a checkpoint");
	for (uint64_t i = 0; !rc && i < r->count; i += CKPT_STAGE) {
		size_t n = r->count - i < CKPT_STAGE ? r->count - i : CKPT_STAGE;
		hpu__dev_d2h(NULL, h, src + i, n * 4);
		rc = hpu__ckpt_writer_put(p->w, h, n * 4, s->err, s->errlen);
	}
	hpu__dev_host_free(h);
	return rc;
}

/* Unit j's array holding section k over its owned range: the master
 * weights (fp32: the parameters themselves), then the moments. */
static const float *section_base(const hpu_strat *s, int j, int k)
{
	const unit *u = &s->u[j];
	return k == 0 ? u->opt_p : k == 1 ? u->opt.m : u->opt.v;
}

/* nvme: one sub-group's floats of a section into the checkpoint. */
typedef struct put_nv {
	hpu_ckpt_writer *w;
	int j;
	uint64_t clo, chi;
} put_nv;

static int put_group(hpu_strat *s, size_t from, size_t n, float *sec, void *arg)
{
	put_nv *q = arg;
	put p = {q->w, sec, from};
	return each_run(s, q->j, from, n, q->clo, q->chi, put_run, &p);
}

int hpu__strat_ckpt_write(hpu_strat *s, hpu_ckpt_writer *w)
{
	const char *names[3];
	int ns = hpu__strat_ckpt_sections(s, names);
	uint64_t clo, chi;
	slice(s, s->rank, &clo, &chi);
	for (int k = 0; k < ns; k++)
		for (int j = 0; j < s->nunits; j++) {
			if (hpu__nv_has(s, k)) {
				put_nv q = {w, j, clo, chi};
				if (hpu__nv_each(s, j, k, HPU_NV_READ, put_group, &q) < 0)
					return -1;
				continue;
			}
			/* fp32 --offload-param nvme: the master weights are the
			 * parameters, read in from their swap file */
			if (k == 0 && s->nvp && !hpu__strat_has_master(s) && !hpu__nvp_get(s, j, 1))
				return -1;
			put p = {w, section_base(s, j, k), 0};
			size_t len;
			owned(s, j, s->rank, &p.from, &len);
			if (each_run(s, j, p.from, len, clo, chi, put_run, &p) < 0)
				return -1;
		}
	return s->nvp ? hpu__nvp_drop_all(s) : 0;
}

typedef struct get {
	int section;
	float *dst;
	size_t from;
} get;

static int get_run(hpu_strat *s, const run *r, void *arg)
{
	get *g = arg;
	float *dst = g->dst + (r->pos - g->from);
	if (!hpu__dev_owns(dst))
		return hpu__ckpt_read(s->resume, g->section, r->start, r->count, dst, s->err,
				      s->errlen);
	float *h = hpu__dev_host_alloc(CKPT_STAGE * 4);
	int rc = h ? 0 : hpu__strat_fail(s, "out of host memory for a checkpoint");
	for (uint64_t i = 0; !rc && i < r->count; i += CKPT_STAGE) {
		size_t n = r->count - i < CKPT_STAGE ? r->count - i : CKPT_STAGE;
		rc = hpu__ckpt_read(s->resume, g->section, r->start + i, n, h, s->err, s->errlen);
		if (rc == 0)
			hpu__dev_h2d(NULL, dst + i, h, n * 4);
	}
	hpu__dev_host_free(h);
	return rc;
}

/* The unit holding layout position `pos`. */
static int unit_at(const hpu_strat *s, size_t pos)
{
	for (int j = 0; j < s->nunits; j++)
		if (pos >= s->u[j].off && pos < s->u[j].off + s->u[j].len)
			return j;
	return -1;
}

int hpu__strat_read_layout(hpu_strat *s, int section, size_t from, size_t n, float *dst)
{
	if (hpu__dev_owns(dst))
		hpu__dev_memset(NULL, dst, 0, n * 4);
	else
		memset(dst, 0, n * 4);
	int j = n ? unit_at(s, from) : -1;
	if (j < 0)
		return 0;
	get g = {section, dst, from};
	return each_run(s, j, from, n, 0, UINT64_MAX, get_run, &g);
}

/* nvme: one sub-group's floats of checkpoint section *arg. */
static int get_group(hpu_strat *s, size_t from, size_t n, float *sec, void *arg)
{
	return hpu__strat_read_layout(s, *(int *)arg, from, n, sec);
}

int hpu__strat_resume_state(hpu_strat *s)
{
	hpu_ckpt *c = s->resume;
	const char *names[3];
	int ns = hpu__strat_ckpt_sections(s, names);
	for (int k = 1; k < ns; k++) {
		int sec = hpu__ckpt_section(c, names[k]);
		if (sec < 0 && hpu__ckpt_num(c->m, "optimizer_steps", 0) == 0)
			continue; /* the initial model (--max-steps 0): the state is zero */
		if (sec < 0 && s->o->optimizer == HPU_OPTIM_SGD && !strcmp(c->optimizer, "sgd"))
			return hpu__strat_fail(s, "checkpoint %s was saved with --optimizer sgd "
						  "--momentum 0, which keeps no momentum buffer; this "
						  "run's --momentum %g needs one (resume with --momentum "
						  "0, or start from its weights: hpu-ckpt export, then "
						  "--load-params)",
					       c->dir, s->o->momentum);
		if (sec < 0)
			return hpu__strat_fail(s, "checkpoint %s has no optimizer state \"%s\" "
						  "(saved with optimizer %s, this run uses %s)",
					       c->dir, names[k], c->optimizer,
					       hpu__optim_name(s->o->optimizer));
		for (int j = 0; j < s->nunits; j++) {
			if (hpu__nv_has(s, k)) {
				if (hpu__nv_each(s, j, k, HPU_NV_UPDATE, get_group, &sec) < 0)
					return -1;
				continue;
			}
			size_t from, len;
			owned(s, j, s->rank, &from, &len);
			float *dst = (float *)section_base(s, j, k);
			if (hpu__strat_read_layout(s, sec, from, len, dst) < 0)
				return -1;
		}
	}
	long t = (long)hpu__ckpt_num(c->m, "optimizer_steps", 0);
	for (int j = 0; j < s->nunits; j++)
		s->u[j].opt.t = t;
	const cJSON *ls = cJSON_GetObjectItemCaseSensitive(c->m, "loss_scaler");
	/* the step counters of every mixed precision go on from the
	 * checkpoint's step (they started at 0 under bf16-mixed and fp8:
	 * an overflow was said at the wrong step, --inject-overflow-step
	 * fired again, the skipped steps were lost); the scale and its
	 * hysteresis only from a 16-mixed checkpoint into a 16-mixed run */
	if (s->plan.mixed) {
		int same = cJSON_IsObject(ls) && strcmp(c->precision, "fp32") != 0;
		s->steps.step_no = c->step;
		s->steps.last_overflow = same ? (long)hpu__ckpt_num(ls, "last_overflow", -1) : -1;
		s->steps.skipped = same ? (long)hpu__ckpt_num(ls, "skipped", 0) : 0;
	}
	/* a fixed --loss-scale is this run's (resume_apply.c says when the
	 * checkpoint's differs); a checkpoint's fixed scale is no dynamic
	 * state (the dynamic scale went on from a static 3, not a power of
	 * two, in silence): the dynamic scaler starts afresh */
	if (s->plan.fp16 && cJSON_IsObject(ls) && strcmp(c->precision, "16-mixed") == 0 &&
	    !(s->o->loss_scale > 0) &&
	    !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ls, "static"))) {
		s->steps.scale = hpu__ckpt_num(ls, "scale", s->steps.scale);
		s->steps.hyst_left = (int)hpu__ckpt_num(ls, "hysteresis_left", s->steps.hyst_left);
	}
	return 0;
}

void hpu__strat_get_state(const hpu_strat *s, hpu_strat_state *st)
{
	st->opt_steps = s->nunits ? s->u[0].opt.t : 0;
	st->loss_scale = s->steps.scale;
	st->hysteresis_left = s->steps.hyst_left;
	st->scaler_steps = s->steps.step_no;
	st->last_overflow = s->steps.last_overflow;
	st->skipped = s->steps.skipped;
}

/* ---- consolidated parameters ---- */

/* Calls fn(s, unit, its whole fp32 parameters, arg) for every unit in
 * order, gathering a sharded unit's pieces first (collective: every rank
 * must call it). Stops at fn's first non-zero return (after the same
 * collectives on every rank: fn's failures are local). */
typedef int (*unit_fn)(hpu_strat *s, int k, const float *full, void *arg);

static int each_full_unit(hpu_strat *s, unit_fn fn, void *arg, const char *why)
{
	int bad = 0, fn_errno = 0;
	for (int k = 0; k < s->nunits; k++) {
		unit *u = &s->u[k];
		int nv = hpu__nv_has(s, 0); /* the master weights: read them in */
		/* the fp32 values: the master weights where the plan keeps
		 * them (whole unless sharded; NULL on NVMe), else the
		 * parameters; this rank's piece at opt_p */
		const float *full = hpu__strat_has_master(s) ? (s->sharded ? NULL : u->opt_p)
				  : s->P ? (float *)s->P + u->off : u->full;
		const float *piece = u->opt_p;
		float *tmpbuf = NULL;
		if (!full && !hpu__strat_has_master(s) && s->nvp && !(piece = hpu__nvp_get(s, k, 1)))
			return -1;
		if (!full) { /* sharded: gather it */
			char what[128];
			int rc = 0;
			snprintf(what, sizeof what, "parameters of %s %s",
				 hpu__strat_unit_name(s, k), why);
			if (!(tmpbuf = hpu__dev_hbuf_alloc(HPU_MEM_OTHER, u->len * 4, what)))
				rc = hpu__strat_fail(s, "%s", hpu__devmem_error());
			if (!rc && nv) {
				/* this rank's range, then (sharded) gathered in place */
				size_t mine = s->sharded ? (size_t)s->rank * u->piece : 0;
				rc = hpu__nv_get(s, k, 0, tmpbuf + mine);
				piece = tmpbuf + mine;
			}
			if (!rc && s->sharded) { /* in place, in host memory */
				float *at = tmpbuf + (size_t)s->rank * u->piece;
				if (piece != at)
					hpu__dev_copy(at, piece, u->piece * 4);
				if ((rc = hpucoll_all_gather(s->comm, at, tmpbuf, u->piece,
							     HPUCOLL_F32)))
					hpu__strat_coll_fail(s, "parameter all-gather", rc);
			}
			if (rc) {
				hpu__dev_hbuf_free(tmpbuf);
				return -1;
			}
			full = tmpbuf;
		} else if (hpu__dev_owns(full)) { /* the host reads a copy */
			if (!(tmpbuf = hpu__dev_host_alloc(u->len * 4)))
				return hpu__strat_fail(s, "out of host memory for the parameters of %s",
						       hpu__strat_unit_name(s, k));
			hpu__dev_d2h(NULL, tmpbuf, full, u->len * 4);
			full = tmpbuf;
		}
		if (!bad && fn(s, k, full, arg) < 0) {
			bad = 1;
			fn_errno = errno; /* the later units' gathers may set errno */
		}
		hpu__dev_hbuf_free(tmpbuf);
	}
	if (s->nvp && hpu__nvp_drop_all(s) < 0 && !bad)
		return -1;
	if (bad)
		errno = fn_errno;
	return bad ? -1 : 0;
}

/* Each of unit k's parameters, unpadded, in declaration order. */
static int write_unit(hpu_strat *s, int k, const float *full, void *arg)
{
	FILE *f = arg;
	unit *u = &s->u[k];
	hpu_builder *b = s->b;
	if (!f)
		return 0;
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

int hpu__strat_save_params(hpu_strat *s, const char *path)
{
	hpu_outfile o;
	FILE *f = NULL;
	int e = 0;
	if (s->rank == 0) {
		/* a signal from the open on removes the temporary file */
		if (hpu__outfile_open_guarded(&o, path, 0644) < 0 ||
		    !(f = hpu__outfile_stream(&o))) {
			e = errno;
			char why[1200];
			if (o.direct && f == NULL && e == ENOENT) /* a link to nothing: named */
				hpu__strat_fail(s, "%s", (hpu__outfile_error(&o, "open", why, sizeof why), why));
			else
				hpu__strat_fail(s, "cannot write %s: %s", o.tmp[0] ? o.tmp : path, strerror(e));
			hpu__outfile_abort(&o);
			hpu__outfile_unguard();
		}
	}
	int bad = s->rank == 0 && (!f || hpu__params_write_header(s->b, f, s->o->save_params_format, path) < 0);
	if (each_full_unit(s, write_unit, bad ? NULL : f, "for --save-params") < 0) {
		e = s->err[0] ? 0 : errno;
		bad = 1;
	}
	if (f) {
		if (!bad && hpu__outfile_commit(&o, NULL) < 0) {
			bad = 1;
			e = errno;
		}
		if (bad && !s->err[0])
			hpu__strat_fail(s, "cannot write %s: %s", path, strerror(e ? e : EIO));
		hpu__outfile_abort(&o);
		hpu__outfile_unguard();
	}
	return bad ? -1 : 0;
}

/* Unit k's parameters into dst (float *) at their canonical places. */
static int copy_unit(hpu_strat *s, int k, const float *full, void *arg)
{
	float *dst = arg;
	const uint64_t *cn = canon(s);
	unit *u = &s->u[k];
	hpu_builder *b = s->b;
	if (!cn)
		return hpu__strat_fail(s, "out of memory");
	for (int i = u->first; i <= u->last; i++) {
		hpu_layer *l = b->layers[i];
		for (int p = l->first_param; p < l->first_param + l->nparams; p++)
			memcpy(dst + cn[p], full + (l->off - u->off) + b->params[p].rel,
			       b->params[p].numel * 4);
	}
	return 0;
}

int hpu__strat_gather_all(hpu_strat *s, float *dst)
{
	return each_full_unit(s, copy_unit, dst, "for a hook");
}


/* The checkpoint's buffers, matched to the model's by name and shape, into
 * dst (host memory laid out as s->B) at each buffer's place (its padding
 * zeroed). Buffers are whole on
 * every rank whatever the world size, so any checkpoint's file serves:
 * every rank reads it (rank 0's values are broadcast after). */
int hpu__strat_resume_buffers(hpu_strat *s, float *dst)
{
	hpu_ckpt *c = s->resume;
	hpu_builder *b = s->b;
	if (b->nbuffers && !c->nbuffers)
		return hpu__strat_fail(s,
				       "checkpoint %s holds no buffers, but the model %s "
				       "declares %d (%s, ...): it was saved by a model without "
				       "them",
				       c->dir, b->path, b->nbuffers, b->buffers[0].name);
	/* every one of the checkpoint's must be the model's: none left over */
	for (int k = 0; k < c->nbuffers; k++)
		if (hpu__model_buffer(b, c->buffers[k].name) < 0)
			return hpu__strat_fail(s,
					       "checkpoint %s holds buffer %s, which the model "
					       "%s does not declare (another model?)",
					       c->dir, c->buffers[k].name, b->path);
	memset(dst, 0, b->buffer_numel * 4);
	for (int i = 0; i < b->nbuffers; i++) {
		const hpu_buffer_info *bi = &b->buffers[i];
		int k = hpu__ckpt_buffer_find(c, bi->name);
		if (k < 0)
			return hpu__strat_fail(s,
					       "checkpoint %s has no buffer %s, which the model "
					       "%s declares (saved by another version of it?)",
					       c->dir, bi->name, b->path);
		const hpu_ckpt_buffer *q = &c->buffers[k];
		int same = q->ndim == bi->ndim;
		for (int d = 0; same && d < bi->ndim; d++)
			same = q->shape[d] == bi->shape[d];
		if (!same) {
			char there[160], here[160];
			hpu__shape_text(there, sizeof there, q->ndim, q->shape);
			hpu__shape_text(here, sizeof here, bi->ndim, bi->shape);
			return hpu__strat_fail(s,
					       "checkpoint %s: buffer %s is %s there, %s in "
					       "the model %s",
					       c->dir, bi->name, there, here, b->path);
		}
		if (hpu__ckpt_read_buffers(c, q->offset, q->numel, dst + bi->offset, s->err,
					   s->errlen) < 0)
			return -1;
	}
	return 0;
}
