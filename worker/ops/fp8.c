/* fp8: conversions, scaling and the op instances of fp8 training and
 * inference (see fp8.h).
 *
 * Like the autocast scratch, the instance table is process-wide and used
 * by the one training thread that runs the ops.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"
#include "worker/ops/fp8.h"
#include "worker/ops/fp8_arith.h"
#include "common/env.h"
#include "common/lowp.h"
#include "common/simd.h"

/* Per format: max, the smallest normal's exponent, mantissa bits. */
static const struct {
	float max;
	int emin; /* smallest normal = 2^emin */
	int mbits;
	int bias;
} fmts[2] = {
	{448.0f, -6, 3, 7},
	{57344.0f, -14, 2, 15},
};

float hpu__fp8_max(int fmt)
{
	return fmts[fmt].max;
}

/* Rounds a finite a >= 0 to the format's grid (saturating at max). Below
 * the smallest normal the grid is evenly spaced by the smallest
 * subnormal, 2^(emin - mbits): adding and taking away 1.5 * 2^(23 + emin
 * - mbits) rounds to it (round to nearest even, in fp32's own rounding).
 * Above, keeping mbits mantissa bits with the usual carry trick does. */
static inline float grid(float a, float max, float tiny, float magic, uint32_t keep,
			 int shift)
{
	a = a < max ? a : max;
	uint32_t u = hpu__f32_bits(a);
	uint32_t r = (u + (keep >> 1) + ((u >> shift) & 1)) & ~keep;
	float sub = (a + magic) - magic;
	return a < tiny ? sub : hpu__bits_f32(r);
}

/* fp8 rounding of every x[i] * scale, read back (/ scale). */
HPU_CLONES static void fake_quant(const float *x, float *y, size_t n, float scale,
				  float inv, float max, float tiny, float magic,
				  uint32_t keep, int shift, int has_inf)
{
	for (size_t i = 0; i < n; i++) {
		float v = x[i] * scale;
		float a = fabsf(v);
		float r = grid(a, max, tiny, magic, keep, shift);
		r = copysignf(r, v) * inv;
		if (!(a <= INFINITY)) /* NaN */
			r = v;
		else if (a == INFINITY)
			r = has_inf ? v : NAN;
		y[i] = r;
	}
}

/* hpu__fp8_fake_quant's C loop (the encoding of one host value uses it
 * directly). */
static void fake_quant_c(const float *x, float *y, size_t n, float scale, int fmt)
{
	int m = fmts[fmt].mbits, shift = 23 - m;
	float tiny = ldexpf(1.0f, fmts[fmt].emin);
	float magic = 1.5f * ldexpf(1.0f, 23 + fmts[fmt].emin - m);
	fake_quant(x, y, n, scale, 1.0f / scale, fmts[fmt].max, tiny, magic,
		   (1u << shift) - 1, shift, fmt == HPU_FP8_E5M2);
}

/* On the backend's kernel where it has one (a GPU's), else in C. */
void hpu__fp8_fake_quant(const float *x, float *y, size_t n, float scale, int fmt)
{
	const hpu__backend *be = hpu__be();
	if ((be->fp8_fake_quant && be->fp8_fake_quant(x, y, n, scale, fmt) == HPU_BE_OK) ||
	    hpu__be_refused("fp8's quantization (hpu__fp8_fake_quant)", "fp8_fake_quant, %zu values",
			    n))
		return;
	fake_quant_c(x, y, n, scale, fmt);
}

/* The CPU's fp8_fake_quant (hpu__be_host). */
int hpu__host_fp8_fake_quant(const float *x, float *y, size_t n, float scale, int fmt)
{
	fake_quant_c(x, y, n, scale, fmt);
	return HPU_BE_OK;
}

uint8_t hpu__fp8_encode(float v, int fmt)
{
	float r;
	fake_quant_c(&v, &r, 1, 1.0f, fmt);
	return hpu__fp8_byte(r, fmts[fmt].mbits, fmts[fmt].emin, fmts[fmt].bias);
}

float hpu__fp8_decode(uint8_t b, int fmt)
{
	int m = fmts[fmt].mbits, bias = fmts[fmt].bias;
	int e = (b & 0x7f) >> m, man = b & ((1 << m) - 1);
	float sign = b & 0x80 ? -1.0f : 1.0f;
	if (fmt == HPU_FP8_E4M3 && (b & 0x7f) == 0x7f)
		return NAN;
	if (fmt == HPU_FP8_E5M2 && e == 31)
		return man ? NAN : sign * INFINITY;
	if (e == 0)
		return sign * ldexpf((float)man, 1 - bias - m);
	return sign * ldexpf((float)((1 << m) | man), e - bias - m);
}

HPU_CLONES static float amax_c(const float *x, size_t n)
{
	float m = 0.0f;
	for (size_t i = 0; i < n; i++) {
		float a = fabsf(x[i]);
		m = a > m ? a : m;
	}
	return m;
}

float hpu__fp8_amax(const float *x, size_t n)
{
	const hpu__backend *be = hpu__be();
	float m = 0.0f;
	if ((be->amax && be->amax(x, n, &m) == HPU_BE_OK) ||
	    hpu__be_refused("fp8's scaling (hpu__fp8_amax)", "amax, %zu values", n))
		return m;
	return amax_c(x, n);
}

/* The CPU's amax (hpu__be_host). */
int hpu__host_amax(const float *x, size_t n, float *amax)
{
	*amax = amax_c(x, n);
	return HPU_BE_OK;
}

float hpu__fp8_scale_for(float amax, int fmt, int margin)
{
	return hpu__fp8_scale_of(amax, fmts[fmt].max, margin);
}

/* ---- TRAIN's scaling state on the device (fp8.h): the CPU's kernels ---- */

int hpu__host_fp8_amax_scale(const float *x, size_t n, float *step, float *sc, int fmt,
			     int margin)
{
	float a = amax_c(x, n);
	if (a > step[0])
		step[0] = a;
	step[1] = 1.0f;
	if (sc[0] == 0.0f) /* a new instance: this tensor sets it */
		sc[0] = hpu__fp8_scale_for(a, fmt, margin);
	return HPU_BE_OK;
}

int hpu__host_fp8_quant_at(const float *x, float *y, size_t n, const float *scale, int fmt)
{
	fake_quant_c(x, y, n, *scale != 0.0f ? *scale : 1.0f, fmt);
	return HPU_BE_OK;
}

int hpu__host_fp8_roll(float *chunk, int count, int cap, int history, int algo, int margin)
{
	for (int i = 0; i < count; i++)
		hpu__fp8_roll_one(chunk + hpu__fp8_off_step(i, 0),
				  chunk + hpu__fp8_off_scale(cap, i, 0),
				  chunk + hpu__fp8_off_hist(cap, history, i), history,
				  algo == HPU_FP8_AMAX_MAX, margin, fmts[HPU_FP8_E4M3].max,
				  fmts[HPU_FP8_E5M2].max);
	return HPU_BE_OK;
}

int hpu__host_fp8_state_copy(void *dst, const void *src, size_t bytes)
{
	memcpy(dst, src, bytes);
	return HPU_BE_OK;
}

int hpu__host_fp8_quant8(const float *x, uint8_t *q, int rows, int cols, int trans, float *sc,
			 int fmt)
{
	float s = sc[0] != 0.0f ? sc[0] : 1.0f;
	float *v = malloc((size_t)(cols > 0 ? cols : 1) * sizeof *v);
	if (!v)
		return HPU_BE_NOMEM;
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)r * cols;
		for (int c = 0; c < cols; c++) /* fake_quant's x * s, then its grid */
			v[c] = xr[c] * s;
		fake_quant_c(v, v, (size_t)cols, 1.0f, fmt);
		for (int c = 0; c < cols; c++) {
			uint8_t b = hpu__fp8_byte(v[c], fmts[fmt].mbits, fmts[fmt].emin,
						  fmts[fmt].bias);
			q[trans ? (size_t)c * rows + r : (size_t)r * cols + c] = b;
		}
	}
	free(v);
	sc[1] = 1.0f / s;
	return HPU_BE_OK;
}

/* The table's entry where it has one, else the C loop above (as
 * hpu__fp8_fake_quant). */
#define FP8_RUN(entry, what, ...)                                                            \
	do {                                                                                 \
		const hpu__backend *be_ = hpu__be();                                         \
		if ((be_->entry && be_->entry(__VA_ARGS__) == HPU_BE_OK) ||                  \
		    hpu__be_refused(what, "%s", #entry))                                     \
			break;                                                               \
		hpu__host_##entry(__VA_ARGS__);                                              \
	} while (0)

/* ---- instances ---- */

enum { T_X = 0, T_W = 1, T_DY = 2 }; /* TRAIN's tensors; MEASURE: a, b, out */

typedef struct inst {
	char name[112];
	int layer, op, k;
	size_t wrel;      /* linear: the weight's offset in the layer, or SIZE_MAX */
	int resolved;     /* QUANTIZE: matched to a call site */
	int quantize;     /* QUANTIZE: 0 when blocklisted */
	float maxabs[3];
	float scale[3];   /* QUANTIZE; TRAIN: the device's, as last brought back */
	int fwd;          /* TRAIN: a forward ran in fp8 */
	int decl[3];      /* TRAIN: the rows (batch) at which the table declined
			   * the fp8 product of the forward, dx, dw (0: none) */
	float *hist;      /* TRAIN: [3][history], as last brought back */
	int nhist, pos;
	int used;
} inst;

/* TRAIN's state on the device: chunks of HPU_FP8_CHUNK instances (fp8.h) */
typedef struct chunk {
	float *d;
	void (*release)(void *p);
} chunk;

static struct {
	int measuring;
	inst *v;
	int n, cap;
	float *amax; /* TRAIN: [3 * cap], this step's, as brought back */
	int amax_out; /* hpu__fp8_step_amax handed it out: the roll puts it back */
	uint64_t n_fp8, n_bf16; /* linear products on fp8 arithmetic, on bf16 */
	chunk *ch;
	int nch;
	float *host; /* one chunk's worth of host memory, for the copies */
	/* the layer running now */
	int layer;
	char lname[64];
	const float *pbase;
	size_t plen;
	int backward;
	int calls[HPU_OP_COUNT];
	char err[256];
} S = {.layer = -1};

static void forget(void)
{
	for (int i = 0; i < S.n; i++)
		free(S.v[i].hist);
	for (int c = 0; c < S.nch; c++)
		S.ch[c].release(S.ch[c].d);
	free(S.v);
	free(S.amax);
	free(S.ch);
	free(S.host);
	S.v = NULL;
	S.amax = NULL;
	S.ch = NULL;
	S.host = NULL;
	S.n = S.cap = S.nch = S.amax_out = 0;
	S.n_fp8 = S.n_bf16 = 0;
	S.err[0] = '\0';
}

/* ---- TRAIN's state on the device ---- */

static int history(void)
{
	return hpu__fp8_recipe()->history;
}

static float *dev_chunk(int i)
{
	return S.ch[i / HPU_FP8_CHUNK].d;
}

static float *dev_step(int i, int t)
{
	return dev_chunk(i) + hpu__fp8_off_step(i % HPU_FP8_CHUNK, t);
}

static float *dev_scale(int i, int t)
{
	return dev_chunk(i) + hpu__fp8_off_scale(HPU_FP8_CHUNK, i % HPU_FP8_CHUNK, t);
}

static float *dev_hist(int i)
{
	return dev_chunk(i) + hpu__fp8_off_hist(HPU_FP8_CHUNK, history(), i % HPU_FP8_CHUNK);
}

static void state_copy(void *dst, const void *src, size_t bytes)
{
	FP8_RUN(fp8_state_copy, "fp8's scaling state", dst, src, bytes);
}

/* A chunk more, all zeros: made eagerly (in a recording its zeros would
 * be replayed: the recording is refused, and the call runs without
 * fp8). 0, or -1. */
static int chunk_add(void)
{
	char why[192];
	snprintf(why, sizeof why,
		 "fp8: call site %d is the first of a new block of fp8's scaling state (%d call "
		 "sites a block), which is made on the device eagerly, not while recording",
		 S.n + 1, HPU_FP8_CHUNK);
	if (hpu__be_recording_refuse(why))
		return -1;
	size_t floats = hpu__fp8_chunk_floats(HPU_FP8_CHUNK, history());
	if (!S.host && !(S.host = calloc(floats, sizeof *S.host)))
		return -1;
	chunk *ch = realloc(S.ch, (size_t)(S.nch + 1) * sizeof *ch);
	if (!ch)
		return -1;
	S.ch = ch;
	chunk *c = &S.ch[S.nch];
	if (!(c->d = hpu__ac_alloc(floats * sizeof *c->d, &c->release)))
		return -1;
	memset(S.host, 0, floats * sizeof *S.host);
	state_copy(c->d, S.host, floats * sizeof *c->d);
	S.nch++;
	return 0;
}

void hpu__fp8_set_mode(hpu_fp8_mode mode, const hpu_fp8_recipe *recipe)
{
	hpu_fp8_recipe r = recipe ? *recipe : (hpu_fp8_recipe){16, 0, HPU_FP8_AMAX_MAX};

	forget();
	if (r.history < 1)
		r.history = 1;
	hpu__ac_set_fp8(mode, &r);
	S.measuring = 0;
	if (mode == HPU_FP8_TRAIN) /* the first chunk before any step: none is recorded yet */
		(void)chunk_add(); /* (out of memory: again at the first instance) */
}

hpu_fp8_mode hpu__fp8_mode(void)
{
	return hpu__ac_fp8_mode();
}

const hpu_fp8_recipe *hpu__fp8_recipe(void)
{
	return hpu__ac_fp8_recipe();
}

/* hpu__op_layer_now's copy of S.layer and S.backward, which another
 * thread reads */
static _Atomic int now_layer = -1, now_backward;

void hpu__op_layer(int index, const char *name, const float *pbase, size_t plen,
		   int backward)
{
	atomic_store_explicit(&now_backward, backward, memory_order_relaxed);
	atomic_store_explicit(&now_layer, index, memory_order_release);
	S.layer = index;
	snprintf(S.lname, sizeof S.lname, "%s", name ? name : "");
	S.pbase = pbase;
	S.plen = plen;
	S.backward = backward;
	memset(S.calls, 0, sizeof S.calls);
}

int hpu__op_layer_now(int *backward)
{
	int l = atomic_load_explicit(&now_layer, memory_order_acquire);
	*backward = atomic_load_explicit(&now_backward, memory_order_relaxed);
	return l;
}

const char *hpu__op_layer_name(void)
{
	return S.layer >= 0 ? S.lname : "";
}

int hpu__op_layer_backward(void)
{
	return S.layer >= 0 && S.backward;
}

void hpu__fp8_measuring(int on)
{
	S.measuring = on;
}

const char *hpu__fp8_error(void)
{
	return S.err[0] ? S.err : NULL;
}

static inst *add(const char *name)
{
	if (hpu__fp8_mode() == HPU_FP8_TRAIN && S.n == S.nch * HPU_FP8_CHUNK && chunk_add() < 0)
		return NULL;
	if (S.n == S.cap) {
		int cap = S.cap ? 2 * S.cap : 16;
		inst *v = realloc(S.v, (size_t)cap * sizeof *v);
		if (!v)
			return NULL;
		S.v = v;
		float *a = realloc(S.amax, (size_t)cap * 3 * sizeof *a);
		if (!a)
			return NULL;
		S.amax = a;
		S.cap = cap;
	}
	inst *p = &S.v[S.n];
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "%s", name);
	p->layer = -1;
	p->wrel = SIZE_MAX;
	p->quantize = 1;
	for (int t = 0; t < 3; t++)
		S.amax[3 * S.n + t] = -1.0f;
	if (hpu__fp8_mode() == HPU_FP8_TRAIN &&
	    !(p->hist = calloc((size_t)3 * hpu__fp8_recipe()->history, sizeof *p->hist)))
		return NULL;
	S.n++;
	return p;
}

int hpu__fp8_preload(const char *name, const float maxabs[3], int quantize)
{
	inst *p = add(name);
	if (!p)
		return -1;
	memcpy(p->maxabs, maxabs, sizeof p->maxabs);
	p->quantize = quantize;
	for (int t = 0; t < 2; t++)
		p->scale[t] = hpu__fp8_scale_for(maxabs[t], HPU_FP8_E4M3, 0);
	return 0;
}

/* TRAIN: instance i's scales (and with hist its history) brought back
 * from the device into *p. */
static void pull(int i, int hist)
{
	inst *p = &S.v[i];
	float sc[6];
	state_copy(sc, dev_scale(i, 0), sizeof sc);
	for (int t = 0; t < 3; t++)
		p->scale[t] = sc[2 * t];
	if (!hist)
		return;
	size_t len = 2 + 3 * (size_t)history();
	state_copy(S.host, dev_hist(i), len * sizeof *S.host);
	p->nhist = (int)S.host[0];
	p->pos = (int)S.host[1];
	memcpy(p->hist, S.host + 2, (len - 2) * sizeof *p->hist);
}

int hpu__fp8_saved_get(int i, hpu_fp8_saved *out)
{
	if (i < 0 || i >= S.n || !S.v[i].hist)
		return -1;
	pull(i, 1);
	const inst *p = &S.v[i];
	*out = (hpu_fp8_saved){p->name, p->layer, p->op, p->k, {p->scale[0], p->scale[1], p->scale[2]},
			       p->hist, p->nhist, p->pos};
	return 0;
}

int hpu__fp8_saved_put(const hpu_fp8_saved *in)
{
	inst *p = add(in->name);
	if (!p)
		return -1;
	p->layer = in->layer;
	p->op = in->op;
	p->k = in->k;
	p->resolved = 1;
	memcpy(p->scale, in->scale, sizeof p->scale);
	if (p->hist)
		memcpy(p->hist, in->hist, (size_t)3 * hpu__fp8_recipe()->history * sizeof *p->hist);
	p->nhist = in->nhist;
	p->pos = in->pos;
	if (p->hist) { /* TRAIN: onto the device */
		int i = (int)(p - S.v);
		float sc[6] = {0};
		for (int t = 0; t < 3; t++)
			sc[2 * t] = p->scale[t];
		state_copy(dev_scale(i, 0), sc, sizeof sc);
		size_t len = 2 + 3 * (size_t)history();
		S.host[0] = (float)p->nhist;
		S.host[1] = (float)p->pos;
		memcpy(S.host + 2, p->hist, (len - 2) * sizeof *S.host);
		state_copy(dev_hist(i), S.host, len * sizeof *S.host);
	}
	return 0;
}

int hpu__fp8_count(void)
{
	return S.n;
}

int hpu__fp8_info_get(int i, hpu_fp8_info *out)
{
	if (i < 0 || i >= S.n)
		return -1;
	if (S.v[i].hist)
		pull(i, 0);
	const inst *p = &S.v[i];
	out->name = p->name;
	out->op = p->op;
	memcpy(out->maxabs, p->maxabs, sizeof out->maxabs);
	memcpy(out->scale, p->scale, sizeof out->scale);
	out->used = p->used;
	return 0;
}

void hpu__fp8_set_maxabs(int i, const float maxabs[3])
{
	if (i >= 0 && i < S.n)
		memcpy(S.v[i].maxabs, maxabs, sizeof S.v[i].maxabs);
}

/* This call's instance: the k-th call of op in the running layer's
 * forward; made when new (TRAIN, MEASURE) or matched by name to a loaded
 * one (QUANTIZE). NULL outside a layer, or when QUANTIZE has no entry. */
static inst *site(int op)
{
	if (S.layer < 0)
		return NULL;
	int k = S.calls[op]++;
	for (int i = 0; i < S.n; i++) {
		inst *p = &S.v[i];
		if (p->layer == S.layer && p->op == op && p->k == k)
			return p;
	}
	char name[112];
	snprintf(name, sizeof name, "%s/%s#%d", S.lname, hpu__autocast_op_name(op), k);
	inst *p = NULL;
	if (hpu__fp8_mode() == HPU_FP8_QUANTIZE) {
		for (int i = 0; i < S.n && !p; i++)
			if (!S.v[i].resolved && strcmp(S.v[i].name, name) == 0)
				p = &S.v[i];
		if (!p) {
			if (!S.err[0])
				snprintf(S.err, sizeof S.err,
					 "op %s has no max-abs figures in the measurement file "
					 "(measured with another model?)",
					 name);
			return NULL;
		}
	} else if (!(p = add(name))) {
		return NULL;
	}
	p->layer = S.layer;
	p->op = op;
	p->k = k;
	p->resolved = 1;
	return p;
}

/* TRAIN, on the device: tensor t of p, x[n]: its amax into the step's,
 * and a new instance's first scale from it (fp8_amax_scale) */
static void train_amax(const inst *p, int t, const float *x, size_t n)
{
	int i = (int)(p - S.v);
	FP8_RUN(fp8_amax_scale, "fp8's scaling (amax)", x, n, dev_step(i, t), dev_scale(i, t),
		t == T_DY ? HPU_FP8_E5M2 : HPU_FP8_E4M3, hpu__fp8_recipe()->margin);
}

/* y[n] = x[n] quantized at tensor t's scale, read when the kernel runs */
static void train_quant(const inst *p, int t, const float *x, float *y, size_t n)
{
	int i = (int)(p - S.v);
	FP8_RUN(fp8_quant_at, "fp8's quantization", x, y, n, dev_scale(i, t),
		t == T_DY ? HPU_FP8_E5M2 : HPU_FP8_E4M3);
}

int hpu__fp8_begin(hpu__fp8_call *c, hpu__op op, int lp, const float *a, size_t na,
		   const float *b, size_t nb)
{
	memset(c, 0, sizeof *c);
	if (hpu__fp8_mode() == HPU_FP8_MEASURE) {
		if (!S.measuring || S.backward)
			return lp;
		inst *p = site(op);
		if (!p)
			return lp;
		float ma = hpu__fp8_amax(a, na), mb = hpu__fp8_amax(b, nb);
		p->maxabs[0] = ma > p->maxabs[0] ? ma : p->maxabs[0];
		p->maxabs[1] = mb > p->maxabs[1] ? mb : p->maxabs[1];
		p->used++;
		c->inst = p;
		return lp;
	}
	if (lp != HPU_AUTOCAST_FP8)
		return lp;
	/* Training needs the weight among the layer's parameters: backward
	 * finds the call site again by its place there. */
	int weight_ok = hpu__fp8_mode() != HPU_FP8_TRAIN ||
			(S.pbase && b >= S.pbase && b < S.pbase + S.plen);
	inst *p = S.backward || !weight_ok ? NULL : site(op);
	if (!p || !p->quantize) {
		/* outside a layer, a weight from elsewhere, missing or
		 * blocklisted */
		hpu__ac_recount(op, HPU_AUTOCAST_FP8, hpu__ac_fallback(op));
		return hpu__ac_fallback(op);
	}
	p->used++;
	c->on = 1;
	c->inst = p;
	if (hpu__fp8_mode() == HPU_FP8_TRAIN) { /* quantized when the product is chosen */
		p->wrel = (size_t)(b - S.pbase);
		p->fwd = 1;
		train_amax(p, T_X, a, na);
		train_amax(p, T_W, b, nb);
		c->x = a;
		c->w = b;
		c->nx = na;
		c->nw = nb;
		return lp;
	}
	float *qa = hpu__ac_scratch(0, na), *qb = hpu__ac_scratch(1, nb);
	float sa = p->scale[0] != 0.0f ? p->scale[0] : 1.0f;
	float sb = p->scale[1] != 0.0f ? p->scale[1] : 1.0f;
	hpu__fp8_fake_quant(a, qa, na, sa, HPU_FP8_E4M3);
	hpu__fp8_fake_quant(b, qb, nb, sb, HPU_FP8_E4M3);
	c->a = qa;
	c->b = qb;
	return lp;
}

void hpu__fp8_operands(hpu__fp8_call *c)
{
	if (!c->on || c->a)
		return;
	float *qa = hpu__ac_scratch(0, c->nx), *qb = hpu__ac_scratch(1, c->nw);
	S.n_bf16++;
	train_quant(c->inst, T_X, c->x, qa, c->nx);
	train_quant(c->inst, T_W, c->w, qb, c->nw);
	c->a = qa;
	c->b = qb;
}

/* The table's fp8 products, where it has them and HPU_FP8_NATIVE is not
 * 0 (hpu-worker refuses another value than 0 or 1) */
static const hpu__backend *native(void)
{
	static int off = -1;
	if (off < 0) {
		long v = 1;
		off = hpu__env_long(HPU_ENV_HPU_FP8_NATIVE, 0, 1, &v) == 1 && v == 0;
	}
	const hpu__backend *be = hpu__be();
	return !off && hpu__fp8_mode() == HPU_FP8_TRAIN && be->gemm_fp8 && be->fp8_quant8 ? be
											 : NULL;
}

/* Scratch slot `slot` as n bytes */
static uint8_t *bytes8(int slot, size_t n)
{
	return (uint8_t *)hpu__ac_scratch(slot, (n + 3) / 4);
}

int hpu__fp8_forward_native(hpu__fp8_call *c, const float *bias, float *y, int batch, int in,
			    int out)
{
	const hpu__backend *be = native();
	inst *p = c->inst;
	if (!be || !c->on || c->a || p->decl[0] == batch)
		return 0;
	int i = (int)(p - S.v);
	float *sx = dev_scale(i, T_X), *sw = dev_scale(i, T_W);
	uint8_t *x8 = bytes8(4, c->nx), *w8 = bytes8(5, c->nw);
	if (be->fp8_quant8(c->x, x8, batch, in, 0, sx, HPU_FP8_E4M3) != HPU_BE_OK ||
	    be->fp8_quant8(c->w, w8, out, in, 0, sw, HPU_FP8_E4M3) != HPU_BE_OK ||
	    be->gemm_fp8(batch, out, in, x8, HPU_FP8_E4M3, w8, HPU_FP8_E4M3, sx + 1, sw + 1, bias,
			 y, 0) != HPU_BE_OK) {
		p->decl[0] = batch; /* not tried again at these rows */
		return 0;
	}
	S.n_fp8++;
	return 1;
}

void hpu__fp8_end(hpu__fp8_call *c, const float *y, size_t ny)
{
	inst *p = c->inst;
	if (hpu__fp8_mode() != HPU_FP8_MEASURE || !p)
		return;
	float m = hpu__fp8_amax(y, ny);
	p->maxabs[2] = m > p->maxabs[2] ? m : p->maxabs[2];
}

int hpu__fp8_bwd_begin(hpu__fp8_bwd *h, const float *w, const float *dy, size_t ndy)
{
	inst *p = NULL;
	if (S.layer >= 0 && S.pbase && w >= S.pbase && w < S.pbase + S.plen) {
		size_t rel = (size_t)(w - S.pbase);
		for (int i = 0; i < S.n && !p; i++)
			if (S.v[i].layer == S.layer && S.v[i].op == HPU_OP_LINEAR &&
			    S.v[i].wrel == rel)
				p = &S.v[i];
	}
	h->inst = NULL;
	h->done = h->dx = 0;
	if (hpu__fp8_mode() != HPU_FP8_TRAIN || !p || !p->fwd) {
		hpu__ac_recount(HPU_OP_LINEAR, HPU_AUTOCAST_FP8, hpu__ac_fallback(HPU_OP_LINEAR));
		return 0;
	}
	train_amax(p, T_DY, dy, ndy);
	p->used++;
	h->inst = p;
	return 1;
}

/* bwd_native's answer, noted in h */
static int bwd_done(hpu__fp8_bwd *h, int done)
{
	h->done = done;
	S.n_fp8 += (uint64_t)(done == 2 ? 1 + h->dx : done);
	return done;
}

int hpu__fp8_bwd_native(hpu__fp8_bwd *h, const float *x, const float *w, const float *dy,
			float *dx, float *dw, int dw_fresh, int batch, int in, int out)
{
	const hpu__backend *be = native();
	inst *p = h->inst;
	h->dx = dx != NULL;
	if (!be || !p || (dx && p->decl[1] == batch))
		return bwd_done(h, 0);
	int i = (int)(p - S.v);
	size_t nx = (size_t)batch * in, nw = (size_t)out * in, ny = (size_t)batch * out;
	float *sx = dev_scale(i, T_X), *sw = dev_scale(i, T_W), *sd = dev_scale(i, T_DY);
	if (dx) { /* dx[B, in] = dy[B, out] (w^T)[in, out]^T */
		uint8_t *dy8 = bytes8(4, ny), *wt8 = bytes8(5, nw);
		if (be->fp8_quant8(dy, dy8, batch, out, 0, sd, HPU_FP8_E5M2) != HPU_BE_OK ||
		    be->fp8_quant8(w, wt8, out, in, 1, sw, HPU_FP8_E4M3) != HPU_BE_OK ||
		    be->gemm_fp8(batch, in, out, dy8, HPU_FP8_E5M2, wt8, HPU_FP8_E4M3, sd + 1, sw + 1,
				 NULL, dx, 0) != HPU_BE_OK) {
			p->decl[1] = batch; /* not tried again at these rows */
			return bwd_done(h, 0);
		}
	}
	if (p->decl[2] == batch)
		return bwd_done(h, dx ? 1 : 0);
	/* dw[out, in] = (dy^T)[out, B] (x^T)[in, B]^T */
	uint8_t *dyt8 = bytes8(6, ny), *xt8 = bytes8(7, nx);
	if (be->fp8_quant8(dy, dyt8, batch, out, 1, sd, HPU_FP8_E5M2) != HPU_BE_OK ||
	    be->fp8_quant8(x, xt8, batch, in, 1, sx, HPU_FP8_E4M3) != HPU_BE_OK ||
	    be->gemm_fp8(out, in, batch, dyt8, HPU_FP8_E5M2, xt8, HPU_FP8_E4M3, sd + 1, sx + 1, NULL,
			 dw, !dw_fresh) != HPU_BE_OK) {
		p->decl[2] = batch;
		return bwd_done(h, dx ? 1 : 0);
	}
	return bwd_done(h, 2);
}

void hpu__fp8_bwd_operands(const hpu__fp8_bwd *h, const float *x, size_t nx, const float *w,
			   size_t nw, const float *dy, size_t ndy, const float **xq,
			   const float **wq, const float **dyq)
{
	const inst *p = h->inst;
	float *qx = hpu__ac_scratch(0, nx), *qw = hpu__ac_scratch(1, nw);
	float *qd = hpu__ac_scratch(2, ndy);
	S.n_bf16 += (uint64_t)((h->dx && h->done == 0) + (h->done < 2));
	/* x and w at the forward's scales: only a roll changes a scale once
	 * set, and it comes after the step */
	train_quant(p, T_X, x, qx, nx);
	train_quant(p, T_W, w, qw, nw);
	train_quant(p, T_DY, dy, qd, ndy);
	*xq = qx;
	*wq = qw;
	*dyq = qd;
}

float *hpu__fp8_step_amax(size_t *n)
{
	*n = (size_t)S.n * 3;
	for (int c = 0; c < S.nch && c * HPU_FP8_CHUNK < S.n; c++) {
		state_copy(S.host, S.ch[c].d, (size_t)HPU_FP8_CHUNK * 6 * sizeof *S.host);
		for (int j = 0; j < HPU_FP8_CHUNK && c * HPU_FP8_CHUNK + j < S.n; j++)
			for (int t = 0; t < 3; t++) {
				const float *st = S.host + hpu__fp8_off_step(j, t);
				S.amax[3 * (c * HPU_FP8_CHUNK + j) + t] = st[1] != 0.0f ? st[0] : -1.0f;
			}
	}
	S.amax_out = 1;
	return S.amax;
}

void hpu__fp8_roll(void)
{
	for (int c = 0; S.amax_out && c < S.nch && c * HPU_FP8_CHUNK < S.n; c++) {
		/* the values handed out (reduced over the ranks) back */
		memset(S.host, 0, (size_t)HPU_FP8_CHUNK * 6 * sizeof *S.host);
		for (int j = 0; j < HPU_FP8_CHUNK && c * HPU_FP8_CHUNK + j < S.n; j++)
			for (int t = 0; t < 3; t++) {
				float v = S.amax[3 * (c * HPU_FP8_CHUNK + j) + t], *st;
				st = S.host + hpu__fp8_off_step(j, t);
				st[0] = v < 0.0f ? 0.0f : v;
				st[1] = v < 0.0f ? 0.0f : 1.0f;
			}
		state_copy(S.ch[c].d, S.host, (size_t)HPU_FP8_CHUNK * 6 * sizeof *S.host);
	}
	S.amax_out = 0;
	const hpu_fp8_recipe *r = hpu__fp8_recipe();
	for (int c = 0; c < S.nch && c * HPU_FP8_CHUNK < S.n; c++) {
		int count = S.n - c * HPU_FP8_CHUNK;
		count = count < HPU_FP8_CHUNK ? count : HPU_FP8_CHUNK;
		FP8_RUN(fp8_roll, "fp8's delayed scaling (the roll)", S.ch[c].d, count,
			HPU_FP8_CHUNK, r->history, r->algo, r->margin);
	}
}

void hpu__fp8_products(uint64_t *fp8, uint64_t *bf16)
{
	*fp8 = S.n_fp8;
	*bf16 = S.n_bf16;
}
