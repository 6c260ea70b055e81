/* layer_harness: see layer_harness.h. */
#include "tests/unit/layer_harness.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lh_harness {
	hpu_builder *b;
	int max_batch;
	uint64_t seed;
	uint32_t *samples;       /* max_batch dataset indices for lh_ctx */
	void *data[HPU_MAX_IO];  /* the dataset's values, field by field */
	size_t size;             /* samples in the dataset */
	int nmem;                /* layers the arrays below cover */
	float **pmem, **gmem;    /* each layer's own parameters, gradients */
	void **saved, **scratch; /* each layer's saved and scratch memory */
	float *bufmem;           /* every buffer */
};

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "layer_harness: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	abort();
}

lh_harness *lh_new(int max_batch)
{
	lh_harness *h = calloc(1, sizeof *h);
	if (!h)
		return NULL;
	h->max_batch = max_batch;
	h->b = hpu__model_new(0, 1, max_batch);
	h->samples = calloc((size_t)(max_batch > 0 ? max_batch : 1), sizeof *h->samples);
	if (!h->b || !h->samples) {
		lh_free(&h);
		return NULL;
	}
	for (int i = 0; i < max_batch; i++)
		h->samples[i] = (uint32_t)i;
	return h;
}

static void free_mem(lh_harness *h)
{
	for (int i = 0; i < h->nmem; i++) {
		free(h->pmem[i]);
		free(h->gmem[i]);
		free(h->saved[i]);
		free(h->scratch[i]);
	}
	free(h->pmem);
	free(h->gmem);
	free(h->saved);
	free(h->scratch);
	free(h->bufmem);
	h->pmem = h->gmem = NULL;
	h->saved = h->scratch = NULL;
	h->bufmem = NULL;
	h->nmem = 0;
}

void lh_free(lh_harness **ph)
{
	lh_harness *h = *ph;
	if (!h)
		return;
	free_mem(h);
	if (h->b)
		hpu__model_destroy(&h->b);
	for (int f = 0; f < HPU_MAX_IO; f++)
		free(h->data[f]);
	free(h->samples);
	free(h);
	*ph = NULL;
}

hpu_builder *lh_builder(lh_harness *h)
{
	return h->b;
}

const char *lh_error(lh_harness *h)
{
	return h->b->err;
}

void lh_clear_error(lh_harness *h)
{
	h->b->err[0] = 0;
	h->b->status = HPU_OK; /* errors are sticky: the next declaration runs */
}

/* The dataset's fetch: sample `index` of each field out of h->data. */
static int fetch(void *user, size_t index, void *const *out)
{
	lh_harness *h = user;
	const hpu_dataset *ds = &h->b->data[HPU_SPLIT_TRAIN];
	if (index >= h->size)
		return -1;
	for (int f = 0; f < ds->nfields; f++) {
		size_t n = h->b->tensors[f].sample_numel * 4;
		memcpy(out[f], (const char *)h->data[f] + index * n, n);
	}
	return 0;
}

int lh_dataset(lh_harness *h, int nfields, const hpu_field *fields, const void *const *data,
	       size_t size)
{
	hpu_dataset ds = {.size = size, .nfields = nfields, .fetch = fetch, .user = h};
	if (nfields < 0 || nfields > HPU_MAX_IO)
		return hpu_error(h->b, "lh_dataset: %d fields", nfields);
	memcpy(ds.fields, fields, (size_t)nfields * sizeof *fields);
	int rc = hpu_dataset_set(h->b, HPU_SPLIT_TRAIN, &ds);
	if (rc != HPU_OK)
		return rc;
	h->size = size;
	for (int f = 0; f < nfields; f++) {
		size_t n = h->b->tensors[f].sample_numel * size * 4;
		h->data[f] = calloc(n ? n : 1, 1);
		if (!h->data[f])
			return hpu_error(h->b, "lh_dataset: out of memory");
		if (data && data[f])
			memcpy(h->data[f], data[f], n);
	}
	return HPU_OK;
}

int lh_fetch(lh_harness *h, size_t index, void *const *out)
{
	const hpu_dataset *ds = &h->b->data[HPU_SPLIT_TRAIN];
	return ds->fetch(ds->user, index, out);
}

/* calloc of n elements of `size` bytes, at least one. */
static void *zalloc(size_t n, size_t size)
{
	return calloc(n ? n : 1, size);
}

int lh_alloc(lh_harness *h, uint64_t seed)
{
	hpu_builder *b = h->b;
	char err[256];
	free_mem(h);
	h->seed = seed;
	int n = b->nlayers;
	h->pmem = zalloc((size_t)n, sizeof *h->pmem);
	h->gmem = zalloc((size_t)n, sizeof *h->gmem);
	h->saved = zalloc((size_t)n, sizeof *h->saved);
	h->scratch = zalloc((size_t)n, sizeof *h->scratch);
	h->bufmem = zalloc(b->buffer_numel, sizeof *h->bufmem);
	if (!h->pmem || !h->gmem || !h->saved || !h->scratch || !h->bufmem)
		goto oom;
	h->nmem = n;
	if (hpu__model_init_buffers(b, seed, h->bufmem, err, sizeof err) < 0)
		return hpu_error(b, "lh_alloc: %s", err);
	for (int i = 0; i < n; i++) {
		hpu_layer *l = b->layers[i];
		size_t mb = (size_t)h->max_batch;
		size_t saved = mb * l->saved_ps + l->saved_fixed;
		size_t scratch = mb * l->scratch_ps + l->scratch_fixed;
		h->pmem[i] = zalloc(l->plen, sizeof(float));
		h->gmem[i] = zalloc(l->plen, sizeof(float));
		h->saved[i] = saved ? malloc(saved * 4) : NULL;
		h->scratch[i] = scratch ? malloc(scratch * 4) : NULL;
		if (!h->pmem[i] || !h->gmem[i] || (saved && !h->saved[i]) ||
		    (scratch && !h->scratch[i]))
			goto oom;
		/* all-ones bytes: NaN as f32, -1 as i32 */
		if (saved)
			memset(h->saved[i], 0xff, saved * 4);
		if (scratch)
			memset(h->scratch[i], 0xff, scratch * 4);
		if (hpu__model_init_layer(b, i, seed, h->pmem[i], err, sizeof err) < 0)
			return hpu_error(b, "lh_alloc: %s", err);
		l->pbase = h->pmem[i];
		l->gbase = h->gmem[i];
		l->bbase = l->nbuffers ? h->bufmem + b->buffers[l->first_buffer].offset : NULL;
		l->saved = h->saved[i];
		l->scratch = h->scratch[i];
		l->off = l->decl_off;
	}
	b->phase = HPU__PHASE_RUN; /* memory placed: the layers may run */
	return 0;
oom:
	return hpu_error(b, "lh_alloc: out of memory");
}

hpu_layer *lh_layer(lh_harness *h, const char *name)
{
	for (int i = 0; i < h->b->nlayers; i++)
		if (!strcmp(h->b->layers[i]->name, name))
			return h->b->layers[i];
	return NULL;
}

hpu_ctx lh_ctx(lh_harness *h, const hpu_layer *l, int train, long step, int batch)
{
	return (hpu_ctx){
		.train = train,
		.step = step,
		.accum = 1,
		.batch = batch,
		.world = 1,
		.layer = l->index,
		.seed = h->seed,
		.samples = h->samples,
	};
}

void lh_set_samples(lh_harness *h, const uint32_t *samples, int n)
{
	if (n > h->max_batch)
		die("lh_set_samples: %d samples, max_batch %d", n, h->max_batch);
	memcpy(h->samples, samples, (size_t)n * sizeof *samples);
}

static hpu_tensor tensor_of(const hpu_builder *b, int t, int batch, void *data)
{
	const hpu_tinfo *ti = &b->tensors[t];
	hpu_tensor r = {
		.data = data,
		.dtype = ti->dtype,
		.batch = batch,
		.ndim = ti->ndim,
		.sample_numel = ti->sample_numel,
		.name = ti->name,
	};
	memcpy(r.shape, ti->shape, sizeof r.shape);
	return r;
}

hpu_tensor lh_tensor(lh_harness *h, const char *name, int batch, void *data)
{
	int t = hpu__model_tensor(h->b, name);
	if (t < 0)
		die("no tensor named %s", name);
	return tensor_of(h->b, t, batch, data);
}

size_t lh_numel(lh_harness *h, const char *name)
{
	return lh_tensor(h, name, 0, NULL).sample_numel;
}

int lh_forward(lh_harness *h, hpu_layer *l, const hpu_ctx *c, void *const *in,
	       void *const *out)
{
	hpu_tensor ti[HPU_MAX_IO], to[HPU_MAX_IO];
	for (int k = 0; k < l->nin; k++)
		ti[k] = tensor_of(h->b, l->in[k], c->batch, in[k]);
	for (int k = 0; k < l->nout; k++)
		to[k] = tensor_of(h->b, l->out[k], c->batch, out[k]);
	l->err[0] = 0;
	return l->ops.forward(l, c, ti, to);
}

int lh_backward(lh_harness *h, hpu_layer *l, const hpu_ctx *c, void *const *in,
		void *const *out, void *const *dout, void *const *din)
{
	hpu_tensor ti[HPU_MAX_IO], to[HPU_MAX_IO], tdo[HPU_MAX_IO], tdi[HPU_MAX_IO];
	if (!l->ops.backward)
		return hpu_layer_error(l, "layer %s has no backward", l->name);
	/* as the runtime does: NULL for what the layer's backward does not
	 * read (hpu_layer_backward_reads), so that every gradient check here
	 * checks its declaration too */
	for (int k = 0; k < l->nin; k++) {
		ti[k] = tensor_of(h->b, l->in[k], c->batch, l->reads_in >> k & 1u ? in[k] : NULL);
		tdi[k] = tensor_of(h->b, l->in[k], c->batch, din ? din[k] : NULL);
	}
	for (int k = 0; k < l->nout; k++) {
		to[k] = tensor_of(h->b, l->out[k], c->batch, l->reads_out >> k & 1u ? out[k] : NULL);
		tdo[k] = tensor_of(h->b, l->out[k], c->batch, dout[k]);
	}
	l->err[0] = 0;
	return l->ops.backward(l, c, ti, to, tdo, tdi);
}

const char *lh_layer_error(const hpu_layer *l)
{
	return l->err;
}

void lh_zero_grads(lh_harness *h)
{
	for (int i = 0; i < h->nmem; i++)
		memset(h->gmem[i], 0, h->b->layers[i]->plen * sizeof(float));
}

/* ---- numbers ---- */

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s ? *s : 0x2545f4914f6cdd1dull;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dull;
}

void lh_fill(float *a, size_t n, float lo, float hi, uint64_t *state)
{
	for (size_t i = 0; i < n; i++)
		a[i] = lo + (hi - lo) * (float)((xorshift(state) >> 40) * (1.0 / 16777216.0));
}

double lh_maxrel(const float *got, const float *want, size_t n, double floor)
{
	double scale = floor, m = 0;
	for (size_t i = 0; i < n; i++)
		if (fabs((double)want[i]) > scale)
			scale = fabs((double)want[i]);
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - (double)want[i]);
		if (!(d <= m))
			m = isnan(d) ? INFINITY : d;
	}
	return scale > 0 ? m / scale : m;
}

/* ---- the gradient checker ---- */

/* Everything one check holds; freed by check_free. */
typedef struct check {
	lh_harness *h;
	hpu_layer *l;
	hpu_ctx c;
	int batch;
	size_t nin[HPU_MAX_IO], nout[HPU_MAX_IO]; /* elements of each */
	void *in[HPU_MAX_IO], *out[HPU_MAX_IO];
	float *r[HPU_MAX_IO];                       /* the weights R, = dout */
	float *din[HPU_MAX_IO], *din1[HPU_MAX_IO];
	float *g1[HPU_MAX_IO];                      /* grads after one backward */
	char *msg;
	size_t msglen;
} check;

static void check_free(check *k)
{
	for (int i = 0; i < HPU_MAX_IO; i++) {
		free(k->in[i]);
		free(k->out[i]);
		free(k->r[i]);
		free(k->din[i]);
		free(k->din1[i]);
		free(k->g1[i]);
	}
}

__attribute__((format(printf, 2, 3)))
static int check_fail(check *k, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(k->msg, k->msglen, fmt, ap);
	va_end(ap);
	return -1;
}

static size_t param_numel(check *k, int p)
{
	return k->l->b->params[k->l->pidx[p]].numel;
}

/* L = sum over f32 outputs of out * R, in double; NAN when forward fails
 * (the message in k->msg). */
static double objective(check *k)
{
	hpu_layer *l = k->l;
	if (lh_forward(k->h, l, &k->c, k->in, k->out) != 0) {
		check_fail(k, "layer %s: forward failed: %s", l->name, l->err);
		return NAN;
	}
	double s = 0;
	for (int o = 0; o < l->nout; o++) {
		if (!k->r[o])
			continue;
		const float *y = k->out[o];
		for (size_t i = 0; i < k->nout[o]; i++)
			s += (double)y[i] * (double)k->r[o][i];
	}
	return s;
}

/* Forward, then backward with din pre-filled with `garbage`. */
static int forward_backward(check *k, float garbage)
{
	hpu_layer *l = k->l;
	void *din[HPU_MAX_IO] = {0}, *dout[HPU_MAX_IO];
	if (isnan(objective(k)))
		return -1;
	for (int i = 0; i < l->nin; i++) {
		if (!k->din[i])
			continue;
		for (size_t j = 0; j < k->nin[i]; j++)
			k->din[i][j] = garbage;
		din[i] = k->din[i];
	}
	for (int o = 0; o < l->nout; o++)
		dout[o] = k->r[o];
	if (lh_backward(k->h, l, &k->c, k->in, k->out, dout, din) != 0)
		return check_fail(k, "layer %s: backward failed: %s", l->name, l->err);
	return 0;
}

/* Compares analytic gradient a[n] of `what` with central differences of
 * the objective in v[n]. */
static int compare_fd(check *k, const lh_check_opts *o, const char *what, float *v,
		      const float *a, size_t n)
{
	double worst = 0, scale = 0, want = 0, got = 0;
	size_t at = 0;
	double *num = calloc(n ? n : 1, sizeof *num);
	if (!num)
		return check_fail(k, "out of memory");
	for (size_t i = 0; i < n; i++) {
		float keep = v[i];
		v[i] = (float)(keep + o->eps);
		double up = objective(k);
		v[i] = (float)(keep - o->eps);
		double down = objective(k);
		/* the step really taken, after rounding to float */
		double step = (double)(float)(keep + o->eps) - (double)(float)(keep - o->eps);
		v[i] = keep;
		if (isnan(up) || isnan(down)) {
			free(num);
			return -1;
		}
		num[i] = (up - down) / step;
		if (fabs(num[i]) > scale)
			scale = fabs(num[i]);
	}
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - num[i]);
		if (!(d <= worst)) {
			worst = isnan(d) ? INFINITY : d;
			at = i, want = num[i], got = a[i];
		}
	}
	free(num);
	if (o->verbose)
		printf("  gradcheck %s %s: max |analytic - numeric| %.3g, max |numeric| %.3g\n",
		       k->l->name, what, worst, scale);
	double tol = o->atol + o->rtol * scale;
	if (!(worst <= tol))
		return check_fail(k, "layer %s: gradient of %s differs from finite "
				  "differences at element %zu: analytic %.6g, numeric %.6g (max "
				  "|numeric| %.3g, tolerance %.3g)", k->l->name, what, at, got,
				  want, scale, tol);
	return 0;
}

static int check_setup(check *k, void *const *given, const lh_check_opts *o)
{
	hpu_layer *l = k->l;
	const hpu_builder *b = l->b;
	uint64_t rs = 0x9e3779b97f4a7c15ull ^ (uint64_t)l->index;
	for (int i = 0; i < l->nin; i++) {
		const hpu_tinfo *t = &b->tensors[l->in[i]];
		k->nin[i] = t->sample_numel * (size_t)k->batch;
		k->in[i] = zalloc(k->nin[i], 4);
		if (!k->in[i])
			return check_fail(k, "out of memory");
		if (given && given[i])
			memcpy(k->in[i], given[i], k->nin[i] * 4);
		else if (t->dtype == HPU_F32)
			lh_fill(k->in[i], k->nin[i], o->lo, o->hi, &rs);
		else
			return check_fail(k, "layer %s: input %s is i32: give its values",
					  l->name, t->name);
		if (t->dtype == HPU_F32) {
			k->din[i] = zalloc(k->nin[i], 4);
			k->din1[i] = zalloc(k->nin[i], 4);
			if (!k->din[i] || !k->din1[i])
				return check_fail(k, "out of memory");
		}
	}
	for (int i = 0; i < l->nout; i++) {
		const hpu_tinfo *t = &b->tensors[l->out[i]];
		k->nout[i] = t->sample_numel * (size_t)k->batch;
		k->out[i] = zalloc(k->nout[i], 4);
		k->r[i] = zalloc(k->nout[i], 4); /* zeros for an i32 output */
		if (!k->out[i] || !k->r[i])
			return check_fail(k, "out of memory");
		if (t->dtype == HPU_F32)
			lh_fill(k->r[i], k->nout[i], -1, 1, &rs);
	}
	for (int p = 0; p < l->npidx && p < HPU_MAX_IO; p++) {
		k->g1[p] = zalloc(param_numel(k, p), sizeof(float));
		if (!k->g1[p])
			return check_fail(k, "out of memory");
	}
	if (l->npidx > HPU_MAX_IO)
		return check_fail(k, "layer %s: more than %d parameters", l->name, HPU_MAX_IO);
	return 0;
}

/* Two backwards: din the same both times (overwritten, whatever was
 * there), parameter gradients doubled (accumulated). Leaves din1 and g1
 * holding the first backward's gradients. */
static int check_contract(check *k)
{
	hpu_layer *l = k->l;
	lh_zero_grads(k->h);
	if (forward_backward(k, 12345.0f) < 0)
		return -1;
	for (int i = 0; i < l->nin; i++)
		if (k->din[i])
			memcpy(k->din1[i], k->din[i], k->nin[i] * 4);
	for (int p = 0; p < l->npidx; p++)
		memcpy(k->g1[p], hpu_grad(l, p), param_numel(k, p) * sizeof(float));
	if (forward_backward(k, -777.0f) < 0)
		return -1;
	for (int i = 0; i < l->nin; i++) {
		if (!k->din[i])
			continue;
		double d = lh_maxrel(k->din[i], k->din1[i], k->nin[i], 1e-30);
		if (!(d <= 1e-6))
			return check_fail(k, "layer %s: the gradient of input %d depends on what "
					  "was in it before backward (relative difference %.3g): "
					  "backward must overwrite it", l->name, i, d);
	}
	for (int p = 0; p < l->npidx; p++) {
		size_t n = param_numel(k, p);
		float *twice = malloc(n * sizeof *twice);
		if (!twice)
			return check_fail(k, "out of memory");
		for (size_t j = 0; j < n; j++)
			twice[j] = 2 * k->g1[p][j];
		double d = lh_maxrel(hpu_grad(l, p), twice, n, 1e-30);
		free(twice);
		if (!(d <= 1e-5))
			return check_fail(k, "layer %s: a second backward did not double the "
					  "gradient of parameter %d (relative difference %.3g): "
					  "backward must accumulate into it", l->name, p, d);
	}
	return 0;
}

int lh_gradcheck(lh_harness *h, hpu_layer *l, int batch, void *const *in,
		 const lh_check_opts *opts, char *msg, size_t msglen)
{
	lh_check_opts o = opts ? *opts : (lh_check_opts){0};
	if (o.eps == 0)
		o.eps = 1e-2;
	if (o.rtol == 0)
		o.rtol = 1e-2;
	if (o.atol == 0)
		o.atol = 1e-4;
	if (o.lo == 0 && o.hi == 0)
		o.lo = -1, o.hi = 1;
	check k = {.h = h, .l = l, .batch = batch, .msg = msg, .msglen = msglen};
	k.c = lh_ctx(h, l, o.train == 1, o.step, batch);
	msg[0] = 0;
	if (batch < 1 || batch > h->max_batch) {
		check_fail(&k, "lh_gradcheck: batch %d outside 1..%d", batch, h->max_batch);
		return -1;
	}
	int rc = check_setup(&k, in, &o);
	if (!rc)
		rc = check_contract(&k);
	for (int i = 0; !rc && i < l->nin; i++) {
		char what[96];
		if (!k.din[i])
			continue;
		snprintf(what, sizeof what, "input %s", h->b->tensors[l->in[i]].name);
		rc = compare_fd(&k, &o, what, k.in[i], k.din1[i], k.nin[i]);
	}
	for (int p = 0; !rc && !o.skip_params && p < l->npidx; p++) {
		char what[160];
		snprintf(what, sizeof what, "parameter %s", h->b->params[l->pidx[p]].name);
		rc = compare_fd(&k, &o, what, hpu_param(l, p), k.g1[p], param_numel(&k, p));
	}
	check_free(&k);
	return rc;
}

/* ---- reference files ---- */

typedef struct ref_array {
	char name[33];
	hpu_dtype dtype;
	int ndim;
	int64_t shape[4];
	size_t numel;
	void *data;
} ref_array;

struct lh_ref {
	int count;
	ref_array *a;
};

static int read_u32(FILE *f, uint32_t *v)
{
	unsigned char b[4];
	if (fread(b, 1, 4, f) != 4)
		return -1;
	*v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
	return 0;
}

/* One array's header and values; -1 when short or malformed. */
static int read_array(FILE *f, ref_array *a)
{
	uint32_t dt, nd, dim;
	if (fread(a->name, 1, 32, f) != 32 || read_u32(f, &dt) || read_u32(f, &nd) || dt > 1 ||
	    nd > 4)
		return -1;
	a->name[32] = 0;
	a->dtype = (hpu_dtype)dt;
	a->ndim = (int)nd;
	a->numel = 1;
	for (int d = 0; d < 4; d++) {
		if (read_u32(f, &dim))
			return -1;
		a->shape[d] = dim;
		if (d < a->ndim)
			a->numel *= dim;
	}
	if (a->numel > (1u << 24))
		return -1;
	uint32_t *v = zalloc(a->numel, 4);
	if (!v)
		return -1;
	a->data = v;
	for (size_t i = 0; i < a->numel; i++)
		if (read_u32(f, &v[i]))
			return -1;
	return 0;
}

lh_ref *lh_ref_load(const char *path)
{
	FILE *f = fopen(path, "rb");
	char magic[8];
	uint32_t count;
	if (!f) {
		fprintf(stderr, "lh_ref_load: cannot open %s (tests/fixtures/torch_layers_*.py "
			"write the references)\n", path);
		return NULL;
	}
	lh_ref *r = calloc(1, sizeof *r);
	if (!r || fread(magic, 1, 8, f) != 8 || memcmp(magic, "HPUREF1", 8) ||
	    read_u32(f, &count) || count > 256)
		goto bad;
	r->a = calloc(count ? count : 1, sizeof *r->a);
	if (!r->a)
		goto bad;
	for (uint32_t i = 0; i < count; i++, r->count++)
		if (read_array(f, &r->a[i]) < 0) {
			r->count++; /* its data, if any, is freed too */
			goto bad;
		}
	if (fgetc(f) != EOF)
		goto bad;
	fclose(f);
	return r;
bad:
	fprintf(stderr, "lh_ref_load: %s is not a reference file of the format in "
		"layer_harness.h (or is truncated)\n", path);
	fclose(f);
	lh_ref_free(&r);
	return NULL;
}

void lh_ref_free(lh_ref **pr)
{
	lh_ref *r = *pr;
	if (!r)
		return;
	for (int i = 0; i < r->count; i++)
		free(r->a[i].data);
	free(r->a);
	free(r);
	*pr = NULL;
}

const void *lh_ref_get(const lh_ref *r, const char *name, hpu_dtype dtype, size_t *numel,
		       int *ndim, int64_t *shape)
{
	for (int i = 0; i < r->count; i++) {
		const ref_array *a = &r->a[i];
		if (strcmp(a->name, name) || a->dtype != dtype)
			continue;
		if (numel)
			*numel = a->numel;
		if (ndim)
			*ndim = a->ndim;
		if (shape)
			memcpy(shape, a->shape, sizeof a->shape);
		return a->data;
	}
	return NULL;
}

int32_t lh_ref_int(const lh_ref *r, const char *name, int32_t def)
{
	size_t n;
	const int32_t *v = lh_ref_get(r, name, HPU_I32, &n, NULL, NULL);
	return v && n == 1 ? v[0] : def;
}
