/* Unit tests for the oneDNN convolution and pooling kernels
 * (worker/ops/backend_dnnl_conv.c) and the public ops' use of them
 * (worker/ops/ops_conv.c): every kernel against the reference kernels
 * (ops_ref.h) at awkward shapes.
 *
 * fp32: within 1e-5 of the largest reference value (summation order).
 * bf16: against the reference run on the bf16-rounded inputs; the
 * products are exact in fp32 and accumulate in fp32, so the same 1e-5.
 * Public ops under autocast / fp8: against the same calls on the
 * reference backend (hpu__be_set), within one bf16 rounding of the
 * outputs the ops round (2^-8 relative), 1e-5 for the fp32 accumulators.
 * Every check prints its maxdiff (llm.c style). Both backward
 * convolutions in one call (dy's reorder shared): bit for bit with the two
 * calls. Max pooling on
 * backend_vec.c's loops: bit for bit, ties, NaN and signed zeros in the
 * windows.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/ops/backend.h"
#include "worker/ops/backend_dnnl.h"
#include "worker/ops/backend_vec.h"
#include "worker/ops/fp8.h"
#include "tests/unit/num_testlib.h"
#include "worker/ops/ops_ref.h"

#include "hpu/ops.h"

#define TOL 1e-5
#define TOL_BF16 (1.0 / 128) /* one bf16 rounding of an output, relative */

/* ---- helpers ---- */

/* max |got - want| / max |want| (NaN counts as infinitely far). */
static double rel_maxdiff(const float *got, const float *want, size_t n)
{
	double m = 0.0, scale = 0.0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		if (!(d <= m))
			m = isnan(d) ? INFINITY : d;
		if (fabs(want[i]) > scale)
			scale = fabs(want[i]);
	}
	return scale > 0 ? m / scale : m;
}

static void check(const char *what, const float *got, const float *want, size_t n,
		  double tol)
{
	double m = rel_maxdiff(got, want, n);
	printf("  %-62s rel maxdiff %.3g (tol %.1g)%s\n", what, m, tol,
	       m <= tol ? "" : "  FAIL");
	assert_true(m <= tol);
}

static uint16_t to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* a16 = bf16(a), a rounded in place */
static uint16_t *round_bf16(float *a, size_t n)
{
	uint16_t *h = xcalloc(n ? n : 1, 2);
	for (size_t i = 0; i < n; i++) {
		h[i] = to_bf16(a[i]);
		a[i] = from_bf16(h[i]);
	}
	return h;
}

static int is_bf16(const float *a, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &a[i], 4);
		if (u & 0xffffu)
			return 0;
	}
	return 1;
}

static float *dup(const float *a, size_t n)
{
	float *d = xcalloc(n ? n : 1, 4);
	memcpy(d, a, n * 4);
	return d;
}

static void set_policy(int lowp)
{
	char err[256];
	unsetenv("LOWER_LIST");
	unsetenv("FP32_LIST");
	if (hpu__autocast_init(lowp, err, sizeof err) < 0)
		fail_msg("%s", err);
}

/* ---- cases ---- */

static const hpu_conv2d_shape cases[] = {
	/* B  C   H   W   O  K  S  P */
	{1, 1, 5, 5, 1, 1, 1, 0},     /* the smallest: 1x1, one channel */
	{1, 3, 7, 5, 5, 3, 1, 1},     /* batch 1, H != W, odd channels */
	{2, 3, 9, 7, 4, 3, 2, 1},     /* stride 2 */
	{3, 5, 11, 8, 7, 5, 3, 2},    /* stride 3 that does not divide, pad 2 */
	{2, 4, 6, 6, 3, 1, 1, 0},     /* 1x1 */
	{2, 4, 7, 4, 3, 1, 2, 0},     /* 1x1 stride 2: the last row unread */
	{1, 17, 10, 13, 19, 3, 2, 0}, /* odd channels > 16, rows/cols unread */
	{2, 2, 3, 3, 2, 3, 1, 2},     /* more padding than image at corners */
	{2, 16, 8, 8, 33, 2, 2, 1},   /* even kernel, padding */
	{3, 1, 28, 28, 32, 5, 1, 2},  /* the CNN's first layer */
	{2, 32, 14, 14, 64, 5, 1, 2}, /* the CNN's second layer */
};
#define NCASES (sizeof cases / sizeof cases[0])

static void name_of(char *buf, size_t len, const hpu_conv2d_shape *s, const char *what)
{
	snprintf(buf, len, "conv %dx%dx%dx%d o%d k%d s%d p%d %s", s->batch, s->in_ch,
		 s->height, s->width, s->out_ch, s->kernel, s->stride, s->pad, what);
}

typedef struct bufs {
	size_t nx, nw, ny, no, ns;
	float *x, *w, *b, *dy, *dw0, *db0, *scratch;
} bufs;

static void bufs_init(bufs *t, const hpu_conv2d_shape *s)
{
	t->nx = (size_t)s->batch * s->in_ch * s->height * s->width;
	t->nw = (size_t)s->out_ch * s->in_ch * s->kernel * s->kernel;
	t->ny = (size_t)s->batch * s->out_ch * hpu_conv2d_out_h(s) * hpu_conv2d_out_w(s);
	t->no = (size_t)s->out_ch;
	t->ns = hpu_conv2d_scratch(s);
	t->x = xcalloc(t->nx, 4), t->w = xcalloc(t->nw, 4), t->b = xcalloc(t->no, 4);
	t->dy = xcalloc(t->ny, 4), t->dw0 = xcalloc(t->nw, 4), t->db0 = xcalloc(t->no, 4);
	t->scratch = xcalloc(t->ns, 4);
	fill(t->x, t->nx, -1, 1), fill(t->w, t->nw, -1, 1), fill(t->b, t->no, -1, 1);
	fill(t->dy, t->ny, -1, 1), fill(t->dw0, t->nw, -1, 1), fill(t->db0, t->no, -1, 1);
}

static void bufs_free(bufs *t)
{
	free(t->x), free(t->w), free(t->b), free(t->dy), free(t->dw0), free(t->db0);
	free(t->scratch);
}

/* The backend's three kernels in dtype dt (inputs x16/w16/dy16 when bf16,
 * whose float forms are t's, already rounded) against the reference. */
static void check_kernels(const hpu_conv2d_shape *s, bufs *t, hpu__dtype dt,
			  const void *x, const void *w, const void *dy)
{
	const char *tag = dt == HPU_DT_BF16 ? "bf16" : "f32";
	char what[160], w2[64];
	float *y = xcalloc(t->ny, 4), *yr = xcalloc(t->ny, 4);
	float *dx = xcalloc(t->nx, 4), *dxr = xcalloc(t->nx, 4);
	for (int bias = 0; bias < 2; bias++) {
		fill_nan(y, t->ny);
		assert_int_equal(hpu__dnnl_conv_fwd(s, dt, x, w, bias ? t->b : NULL, y),
				 HPU_BE_OK);
		hpu__ref_conv2d_forward(s, t->x, t->w, bias ? t->b : NULL, yr, t->scratch);
		snprintf(w2, sizeof w2, "%s fwd%s", tag, bias ? "" : " no bias");
		name_of(what, sizeof what, s, w2);
		check(what, y, yr, t->ny, TOL);
	}
	/* reference backward: dx, and dw, db from dw0, db0 */
	float *dwr = dup(t->dw0, t->nw), *dbr = dup(t->db0, t->no);
	hpu__ref_conv2d_backward(s, t->x, t->w, t->dy, dxr, dwr, dbr, t->scratch);
	fill_nan(dx, t->nx);
	assert_int_equal(hpu__dnnl_conv_bwd_data(s, dt, w, dy, dx), HPU_BE_OK);
	snprintf(w2, sizeof w2, "%s bwd_data", tag);
	name_of(what, sizeof what, s, w2);
	check(what, dx, dxr, t->nx, TOL);
	float *dw = dup(t->dw0, t->nw), *db = dup(t->db0, t->no);
	assert_int_equal(hpu__dnnl_conv_bwd_weights(s, dt, x, dy, dw, db), HPU_BE_OK);
	snprintf(w2, sizeof w2, "%s bwd_weights dw (+=)", tag);
	name_of(what, sizeof what, s, w2);
	check(what, dw, dwr, t->nw, TOL);
	snprintf(w2, sizeof w2, "%s bwd_weights db (+=)", tag);
	name_of(what, sizeof what, s, w2);
	check(what, db, dbr, t->no, TOL);
	/* without db: dw the same; twice: accumulates twice */
	float *dw2 = dup(t->dw0, t->nw);
	assert_int_equal(hpu__dnnl_conv_bwd_weights(s, dt, x, dy, dw2, NULL), HPU_BE_OK);
	snprintf(w2, sizeof w2, "%s bwd_weights dw, db NULL", tag);
	name_of(what, sizeof what, s, w2);
	check(what, dw2, dwr, t->nw, TOL);
	assert_int_equal(hpu__dnnl_conv_bwd_weights(s, dt, x, dy, dw, db), HPU_BE_OK);
	hpu__ref_conv2d_backward(s, t->x, t->w, t->dy, NULL, dwr, dbr, t->scratch);
	snprintf(w2, sizeof w2, "%s bwd_weights dw, twice", tag);
	name_of(what, sizeof what, s, w2);
	check(what, dw, dwr, t->nw, TOL);
	snprintf(w2, sizeof w2, "%s bwd_weights db, twice", tag);
	name_of(what, sizeof what, s, w2);
	check(what, db, dbr, t->no, TOL);
	free(y), free(yr), free(dx), free(dxr), free(dwr), free(dbr), free(dw), free(db);
	free(dw2);
}

static void test_conv_f32(void **state)
{
	(void)state;
	rng_seed(11);
	for (size_t i = 0; i < NCASES; i++) {
		bufs t;
		bufs_init(&t, &cases[i]);
		check_kernels(&cases[i], &t, HPU_DT_F32, t.x, t.w, t.dy);
		bufs_free(&t);
	}
}

static void test_conv_bf16(void **state)
{
	(void)state;
	if (!hpu__dnnl_backend()->bf16_native()) {
		printf("  no native bf16 on this CPU: bf16 kernels answer unsupported\n");
		skip();
	}
	rng_seed(12);
	for (size_t i = 0; i < NCASES; i++) {
		bufs t;
		bufs_init(&t, &cases[i]);
		uint16_t *x16 = round_bf16(t.x, t.nx), *w16 = round_bf16(t.w, t.nw);
		uint16_t *dy16 = round_bf16(t.dy, t.ny);
		check_kernels(&cases[i], &t, HPU_DT_BF16, x16, w16, dy16);
		free(x16), free(w16), free(dy16);
		bufs_free(&t);
	}
}

/* The public ops under policy lowp on oneDNN against the same calls on the
 * reference backend. */
static void check_public(const hpu_conv2d_shape *s, int lowp)
{
	static const char *names[] = {"fp32", "bf16", "fp16"};
	bufs t;
	bufs_init(&t, s);
	float *y[2], *dx[2], *dw[2], *db[2];
	for (int r = 0; r < 2; r++) { /* 0: oneDNN, 1: reference */
		hpu__be_set(r ? hpu__be_reference() : NULL);
		set_policy(lowp);
		y[r] = xcalloc(t.ny, 4), dx[r] = xcalloc(t.nx, 4);
		dw[r] = dup(t.dw0, t.nw), db[r] = dup(t.db0, t.no);
		fill_nan(y[r], t.ny), fill_nan(dx[r], t.nx);
		hpu_conv2d_forward(s, t.x, t.w, t.b, y[r], t.scratch);
		hpu_conv2d_backward(s, t.x, t.w, t.dy, dx[r], dw[r], db[r], t.scratch);
	}
	hpu__be_set(NULL);
	set_policy(HPU_AUTOCAST_NONE);
	double tol_out = lowp ? TOL_BF16 : TOL;
	if (lowp == HPU_AUTOCAST_FP16)
		tol_out = 1.0 / 1024; /* one fp16 rounding */
	char what[160], w2[64];
	snprintf(w2, sizeof w2, "public %s y", names[lowp]);
	name_of(what, sizeof what, s, w2);
	check(what, y[0], y[1], t.ny, tol_out);
	snprintf(w2, sizeof w2, "public %s dx", names[lowp]);
	name_of(what, sizeof what, s, w2);
	check(what, dx[0], dx[1], t.nx, tol_out);
	snprintf(w2, sizeof w2, "public %s dw (+=, fp32)", names[lowp]);
	name_of(what, sizeof what, s, w2);
	check(what, dw[0], dw[1], t.nw, TOL);
	snprintf(w2, sizeof w2, "public %s db (+=, fp32)", names[lowp]);
	name_of(what, sizeof what, s, w2);
	check(what, db[0], db[1], t.no, TOL);
	if (lowp == HPU_AUTOCAST_BF16) { /* overwritten outputs are bf16 */
		assert_true(is_bf16(y[0], t.ny));
		assert_true(is_bf16(dx[0], t.nx));
	}
	/* dx and db may be NULL */
	float *dw2 = dup(t.dw0, t.nw);
	set_policy(lowp);
	hpu_conv2d_backward(s, t.x, t.w, t.dy, NULL, dw2, NULL, t.scratch);
	set_policy(HPU_AUTOCAST_NONE);
	snprintf(w2, sizeof w2, "public %s dw, dx = db = NULL", names[lowp]);
	name_of(what, sizeof what, s, w2);
	check(what, dw2, dw[0], t.nw, TOL);
	for (int r = 0; r < 2; r++)
		free(y[r]), free(dx[r]), free(dw[r]), free(db[r]);
	free(dw2);
	bufs_free(&t);
}

static void test_public_fp32(void **state)
{
	(void)state;
	rng_seed(13);
	for (size_t i = 0; i < NCASES; i++)
		check_public(&cases[i], HPU_AUTOCAST_NONE);
}

static void test_public_bf16(void **state)
{
	(void)state;
	rng_seed(14);
	for (size_t i = 0; i < NCASES; i++)
		check_public(&cases[i], HPU_AUTOCAST_BF16);
}

static void test_public_fp16(void **state)
{
	(void)state;
	rng_seed(15);
	for (size_t i = 0; i < NCASES; i += 3)
		check_public(&cases[i], HPU_AUTOCAST_FP16);
}

/* fp8 inference (QUANTIZE): conv2d's forward on oneDNN's bf16 kernel
 * against the reference backend's emulation (fp32 products of the E4M3
 * read-backs), and counted as fp8. */
static void test_public_fp8(void **state)
{
	(void)state;
	rng_seed(16);
	for (size_t i = 0; i < NCASES; i += 2) {
		const hpu_conv2d_shape *s = &cases[i];
		bufs t;
		bufs_init(&t, s);
		float *params = xcalloc(t.nw + t.no, 4);
		memcpy(params, t.w, t.nw * 4);
		memcpy(params + t.nw, t.b, t.no * 4);
		const float m[3] = {hpu__fp8_amax(t.x, t.nx), hpu__fp8_amax(t.w, t.nw), 4.0f};
		float *y[2];
		for (int r = 0; r < 2; r++) {
			hpu__be_set(r ? hpu__be_reference() : NULL);
			set_policy(HPU_AUTOCAST_NONE);
			hpu__fp8_set_mode(HPU_FP8_QUANTIZE, NULL);
			assert_int_equal(hpu__fp8_preload("conv/conv2d#0", m, 1), 0);
			uint64_t before = hpu__autocast_count("conv2d", HPU_AUTOCAST_COUNT_FP8);
			hpu__op_layer(0, "conv", params, t.nw + t.no, 0);
			y[r] = xcalloc(t.ny, 4);
			fill_nan(y[r], t.ny);
			hpu_conv2d_forward(s, t.x, params, params + t.nw, y[r], t.scratch);
			hpu__op_layer(-1, NULL, NULL, 0, 0);
			assert_null(hpu__fp8_error());
			assert_int_equal(hpu__autocast_count("conv2d", HPU_AUTOCAST_COUNT_FP8),
					 before + 1);
			hpu__fp8_set_mode(HPU_FP8_OFF, NULL);
		}
		hpu__be_set(NULL);
		char what[160];
		name_of(what, sizeof what, s, "public fp8 (QUANTIZE) y vs emulation");
		check(what, y[0], y[1], t.ny, TOL_BF16);
		assert_true(is_bf16(y[0], t.ny));
		free(y[0]), free(y[1]), free(params);
		bufs_free(&t);
	}
}

/* ---- pooling ---- */

typedef struct pool_case {
	int batch, ch, h, w, k, stride;
} pool_case;

static const pool_case pool_cases[] = {
	/* B  C  H  W  k  s */
	{2, 3, 6, 8, 2, 2},   /* the CNN's 2x2 */
	{1, 1, 7, 5, 2, 2},   /* odd sizes: the last row/column is dropped */
	{2, 5, 7, 9, 3, 2},   /* overlapping windows */
	{3, 2, 5, 6, 3, 1},   /* stride 1 */
	{1, 1, 4, 4, 4, 4},   /* one window */
	{2, 3, 11, 10, 3, 3}, /* stride 3 */
	{4, 32, 28, 28, 2, 2}, /* the CNN's first pooling, batch 4 */
};

/* A pooling case's buffers: x and dx of nx floats, the others of ny; the
 * reference's results in the *r ones. */
typedef struct pool_bufs {
	float *x, *dy, *y, *yr, *dx, *dxr;
	int32_t *idx, *idxr;
} pool_bufs;

static pool_bufs pool_bufs_new(size_t nx, size_t ny)
{
	return (pool_bufs){.x = xcalloc(nx, 4), .dy = xcalloc(ny, 4), .y = xcalloc(ny, 4),
			   .yr = xcalloc(ny, 4), .dx = xcalloc(nx, 4), .dxr = xcalloc(nx, 4),
			   .idx = xcalloc(ny, 4), .idxr = xcalloc(ny, 4)};
}

static void pool_bufs_free(pool_bufs *b)
{
	free(b->x), free(b->dy), free(b->y), free(b->yr);
	free(b->dx), free(b->dxr), free(b->idx), free(b->idxr);
}

static void test_pool(void **state)
{
	(void)state;
	rng_seed(17);
	for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++) {
		const pool_case *p = &pool_cases[i];
		int oh = (p->h - p->k) / p->stride + 1, ow = (p->w - p->k) / p->stride + 1;
		size_t nx = (size_t)p->batch * p->ch * p->h * p->w;
		size_t ny = (size_t)p->batch * p->ch * oh * ow;
		pool_bufs pb = pool_bufs_new(nx, ny);
		float *x = pb.x, *dy = pb.dy, *y = pb.y, *yr = pb.yr, *dx = pb.dx, *dxr = pb.dxr;
		int32_t *idx = pb.idx, *idxr = pb.idxr;
		fill(x, nx, -1, 1), fill(dy, ny, -1, 1);
		char what[160];
		/* average pooling (oneDNN's kernel, which the table declines) */
		fill_nan(y, ny), fill_nan(dx, nx);
		assert_int_equal(hpu__dnnl_avgpool_fwd(x, y, p->batch, p->ch, p->h, p->w, p->k,
						       p->stride),
				 HPU_BE_OK);
		assert_int_equal(hpu__dnnl_avgpool_bwd(dy, dx, p->batch, p->ch, p->h, p->w,
						       p->k, p->stride),
				 HPU_BE_OK);
		hpu__ref_avgpool2d_forward(x, yr, p->batch, p->ch, p->h, p->w, p->k, p->stride);
		hpu__ref_avgpool2d_backward(dy, dxr, p->batch, p->ch, p->h, p->w, p->k,
					    p->stride);
		snprintf(what, sizeof what, "avgpool %dx%dx%dx%d k%d s%d oneDNN fwd", p->batch,
			 p->ch, p->h, p->w, p->k, p->stride);
		check(what, y, yr, ny, TOL);
		snprintf(what, sizeof what, "avgpool %dx%dx%dx%d k%d s%d oneDNN bwd", p->batch,
			 p->ch, p->h, p->w, p->k, p->stride);
		check(what, dx, dxr, nx, TOL);
		/* max pooling through the public ops: the reference's idx */
		hpu_maxpool2d_forward(x, y, idx, p->batch, p->ch, p->h, p->w, p->k, p->stride);
		hpu_maxpool2d_backward(dy, idx, dx, p->batch, p->ch, p->h, p->w, p->k,
				       p->stride);
		hpu__ref_maxpool2d_forward(x, yr, idxr, p->batch, p->ch, p->h, p->w, p->k,
					   p->stride);
		hpu__ref_maxpool2d_backward(dy, idxr, dxr, p->batch, p->ch, p->h, p->w, p->k,
					    p->stride);
		assert_memory_equal(idx, idxr, ny * 4);
		snprintf(what, sizeof what, "maxpool %dx%dx%dx%d k%d s%d public fwd", p->batch,
			 p->ch, p->h, p->w, p->k, p->stride);
		check(what, y, yr, ny, 0);
		snprintf(what, sizeof what, "maxpool %dx%dx%dx%d k%d s%d public bwd", p->batch,
			 p->ch, p->h, p->w, p->k, p->stride);
		check(what, dx, dxr, nx, 0);
		pool_bufs_free(&pb);
	}
}

/* ---- max pooling on backend_vec.c's AVX-512 loops ---- */

/* Fails, naming the first element whose bits differ (n of 4 bytes). */
static void check_bits(const char *what, const void *got, const void *want, size_t n)
{
	const uint32_t *g = got, *r = want;
	size_t i = 0;
	while (i < n && g[i] == r[i])
		i++;
	if (i < n)
		printf("  %-44s element %zu: 0x%08x, the reference 0x%08x  FAIL\n", what, i,
		       (unsigned)g[i], (unsigned)r[i]);
	else
		printf("  %-44s bit for bit\n", what);
	assert_true(i == n);
}

/* Values that tie and NaN: drawn from {-1, -0, +0, 0.5, 1, NaN}, NaN one
 * time in 12, so that windows hold equal maxima, signed zeros and NaN in
 * every position. */
static void fill_ties(float *a, size_t n)
{
	static const float v[] = {-1.0f, -0.0f, 0.0f, 0.5f, 1.0f, 1.0f};
	for (size_t i = 0; i < n; i++) {
		float u = rng_uniform(0.0f, 12.0f);
		a[i] = u < 1.0f ? NAN : v[(int)u % 6];
	}
}

static void test_maxpool_vec(void **state)
{
	(void)state;
	if (!hpu__vec_ok())
		skip(); /* no AVX-512F: the table runs the reference */
	static const pool_case cases[] = {
		{1, 1, 2, 2, 2, 2},    {2, 3, 7, 5, 2, 2},  /* odd: last row, column unread */
		{3, 2, 9, 35, 2, 2},   /* 17 windows a row: a full vector and one lane */
		{2, 2, 6, 66, 2, 2},   {1, 3, 3, 3, 2, 2},
		{4, 32, 28, 28, 2, 2}, {4, 64, 14, 14, 2, 2}, /* the CNN's */
	};
	rng_seed(29);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const pool_case *p = &cases[i];
		int oh = p->h / 2, ow = p->w / 2;
		size_t nx = (size_t)p->batch * p->ch * p->h * p->w;
		size_t ny = (size_t)p->batch * p->ch * oh * ow;
		pool_bufs pb = pool_bufs_new(nx, ny);
		float *x = pb.x, *dy = pb.dy, *y = pb.y, *yr = pb.yr, *dx = pb.dx, *dxr = pb.dxr;
		int32_t *idx = pb.idx, *idxr = pb.idxr;
		fill_ties(x, nx), fill_ties(dy, ny);
		fill_nan(y, ny), fill_nan(dx, nx), memset(idx, 0xff, ny * 4);
		assert_int_equal(hpu__vec_maxpool_fwd(x, y, idx, p->batch, p->ch, p->h, p->w, 2, 2),
				 HPU_BE_OK);
		hpu__ref_maxpool2d_forward(x, yr, idxr, p->batch, p->ch, p->h, p->w, 2, 2);
		/* the backward from the reference's idx (the same, checked below) */
		assert_int_equal(hpu__vec_maxpool_bwd(dy, idxr, dx, p->batch, p->ch, p->h, p->w,
						      2, 2),
				 HPU_BE_OK);
		hpu__ref_maxpool2d_backward(dy, idxr, dxr, p->batch, p->ch, p->h, p->w, 2, 2);
		char what[160];
		snprintf(what, sizeof what, "maxpool %dx%dx%dx%d vec fwd y", p->batch, p->ch, p->h,
			 p->w);
		check_bits(what, y, yr, ny);
		snprintf(what, sizeof what, "maxpool %dx%dx%dx%d vec fwd idx", p->batch, p->ch,
			 p->h, p->w);
		check_bits(what, idx, idxr, ny);
		snprintf(what, sizeof what, "maxpool %dx%dx%dx%d vec bwd", p->batch, p->ch, p->h,
			 p->w);
		check_bits(what, dx, dxr, nx);
		pool_bufs_free(&pb);
	}
	/* other windows are the reference's: nothing written */
	float x[9] = {0}, y[4] = {0};
	int32_t idx[4] = {0};
	assert_int_equal(hpu__vec_maxpool_fwd(x, y, idx, 1, 1, 3, 3, 2, 1), HPU_BE_UNSUPPORTED);
	assert_int_equal(hpu__vec_maxpool_fwd(x, y, idx, 1, 1, 3, 3, 3, 3), HPU_BE_UNSUPPORTED);
	assert_int_equal(hpu__vec_maxpool_bwd(y, idx, x, 1, 1, 3, 3, 3, 2), HPU_BE_UNSUPPORTED);
}

/* ---- both backward convolutions in one call ---- */

/* hpu__dnnl_conv_bwd against bwd_weights then bwd_data, bit for bit (dx
 * overwritten, dw and db accumulated); on the CNN's second layer (dy in
 * nChw16c for both) backward data must read the dy backward weights
 * reordered. */
static void check_bwd_pair(const hpu_conv2d_shape *s, hpu__dtype dt, int seed)
{
	const char *tag = dt == HPU_DT_BF16 ? "bf16" : "f32";
	char what[160], w2[64];
	rng_seed(seed);
	bufs t;
	bufs_init(&t, s);
	uint16_t *x16 = NULL, *w16 = NULL, *dy16 = NULL;
	const void *x = t.x, *w = t.w, *dy = t.dy;
	if (dt == HPU_DT_BF16) {
		x = x16 = round_bf16(t.x, t.nx), w = w16 = round_bf16(t.w, t.nw);
		dy = dy16 = round_bf16(t.dy, t.ny);
	}
	float *dx[2], *dw[2], *db[2];
	for (int r = 0; r < 2; r++) {
		dx[r] = xcalloc(t.nx, 4), dw[r] = dup(t.dw0, t.nw), db[r] = dup(t.db0, t.no);
		fill_nan(dx[r], t.nx);
	}
	assert_int_equal(hpu__dnnl_conv_bwd_weights(s, dt, x, dy, dw[0], db[0]), HPU_BE_OK);
	assert_int_equal(hpu__dnnl_conv_bwd_data(s, dt, w, dy, dx[0]), HPU_BE_OK);
	unsigned long shared = hpu__dnnl_conv_dy_shared;
	int wd = -1;
	assert_int_equal(hpu__dnnl_conv_bwd(s, dt, x, w, dy, dx[1], dw[1], db[1], &wd), HPU_BE_OK);
	assert_int_equal(wd, 1);
	const char *out[3] = {"dx", "dw (+=)", "db (+=)"};
	float *got[3] = {dx[1], dw[1], db[1]}, *want[3] = {dx[0], dw[0], db[0]};
	size_t n[3] = {t.nx, t.nw, t.no};
	for (int i = 0; i < 3; i++) {
		snprintf(w2, sizeof w2, "%s bwd pair %s%s", tag, out[i],
			 hpu__dnnl_conv_dy_shared > shared ? ", dy shared" : "");
		name_of(what, sizeof what, s, w2);
		check_bits(what, got[i], want[i], n[i]);
	}
	if (s->in_ch == 32 && s->out_ch == 64) /* the CNN's second layer */
		assert_true(hpu__dnnl_conv_dy_shared == shared + 1);
	for (int r = 0; r < 2; r++)
		free(dx[r]), free(dw[r]), free(db[r]);
	free(x16), free(w16), free(dy16);
	bufs_free(&t);
}

static void test_conv_bwd_pair(void **state)
{
	(void)state;
	int bf16 = hpu__dnnl_backend()->bf16_native();
	for (size_t i = 0; i < NCASES; i++) {
		check_bwd_pair(&cases[i], HPU_DT_F32, 40 + (int)i);
		if (bf16)
			check_bwd_pair(&cases[i], HPU_DT_BF16, 60 + (int)i);
	}
	if (!bf16)
		printf("  no native bf16 on this CPU: the pair checked in f32 only\n");
}

int main(void)
{
	printf("backend: %s\n", hpu__dnnl_backend()->describe());
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_conv_f32),    cmocka_unit_test(test_conv_bf16),
		cmocka_unit_test(test_public_fp32), cmocka_unit_test(test_public_bf16),
		cmocka_unit_test(test_public_fp16), cmocka_unit_test(test_public_fp8),
		cmocka_unit_test(test_pool),        cmocka_unit_test(test_maxpool_vec),
		cmocka_unit_test(test_conv_bwd_pair),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
