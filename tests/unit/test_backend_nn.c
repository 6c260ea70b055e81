/* Unit tests for the oneDNN backend's eltwise, softmax and layer norm
 * (worker/ops/backend_dnnl_nn.c) against the reference kernels (ops_ref.h),
 * and for the public ops on the default backend against the reference
 * table (hpu__be_set(hpu__be_reference())).
 *
 * Every check prints (as llm.c does) the largest absolute difference and
 * that difference relative to the largest |reference| of the array, and
 * fails on the relative one: 1e-5 in fp32, which covers oneDNN's own
 * exp/tanh approximations and summation order. Shapes are the awkward
 * ones: n = 1, 7 and 1000003 (no multiple of any vector width), a single
 * row or column, cols 3, 129, 1000; inputs up to +-30, where exp and tanh
 * saturate.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/ops/backend.h"
#include "worker/ops/backend_host.h"
#include "worker/ops/autocast.h"
#include "worker/ops/backend_dnnl.h"
#include "worker/ops/backend_vec.h"
#include "worker/ops/fp8.h"
#include "common/lowp.h"
#include "tests/unit/num_testlib.h"
#include "worker/ops/ops_ref.h"

#include "hpu/ops.h"

#define TOL 1e-5

/* Prints the largest absolute difference of got and want, and relative to
 * max(max |want|, floor); fails if the relative one exceeds tol. NaN counts
 * as infinitely far. */
static void check_floor(const char *what, const float *got, const float *want, size_t n,
			double tol, double floor)
{
	double m = 0.0, scale = floor;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - (double)want[i]);
		if (!(d <= m))
			m = isnan(d) ? INFINITY : d;
		if (fabs(want[i]) > scale)
			scale = fabs(want[i]);
	}
	double rel = scale > 0 ? m / scale : m;
	printf("  %-44s maxdiff %.3g rel %.3g (tol %.1g)%s\n", what, m, rel, tol,
	       rel <= tol ? "" : "  FAIL");
	assert_true(rel <= tol);
}

static void check(const char *what, const float *got, const float *want, size_t n,
		  double tol)
{
	check_floor(what, got, want, n, tol, 0.0);
}

/* Eltwise results relative to max |want| but at least 1: a single element
 * in GELU's left tail (|gelu(x)| ~ 1e-15 at x = -8) is good to ~1e-7
 * absolute from oneDNN, not relative (test_gelu_tail). */
#define check_elt(what, got, want, n) check_floor(what, got, want, n, TOL, 1.0)

static float *fbuf(size_t n)
{
	return xcalloc(n, sizeof(float));
}

static float *copy(const float *a, size_t n)
{
	float *c = fbuf(n);
	memcpy(c, a, n * sizeof *c);
	return c;
}

/* The oneDNN table: the default, checked by name so that a test cannot
 * pass on the reference fallback. Its eltwise entries run oneDNN only
 * where it is the faster (backend_dnnl.c): the copy here runs every
 * eltwise op on oneDNN, so that all of them are tested. */
static const hpu__backend *dnnl(void)
{
	static hpu__backend all;
	hpu__be_set(NULL);
	const hpu__backend *be = hpu__be();
	assert_string_equal(be->name, "oneDNN");
	all = *be;
	all.eltwise_fwd = hpu__dnnl_eltwise_fwd;
	all.eltwise_bwd = hpu__dnnl_eltwise_bwd;
	return &all;
}

/* ---- eltwise ---- */

typedef struct elt_ref {
	hpu__eltwise op;
	const char *name;
	void (*fwd)(const float *x, float *y, size_t n);
	void (*bwd)(const float *at, const float *dy, float *dx, size_t n);
	int at_is_input; /* the backward's `at`: x (GELU) or y */
	float range;
} elt_ref;

static const elt_ref elts[] = {
	{HPU_ELT_RELU, "relu", hpu__ref_relu_forward, hpu__ref_relu_backward, 0, 5.0f},
	{HPU_ELT_GELU_TANH, "gelu", hpu__ref_gelu_forward, hpu__ref_gelu_backward, 1, 30.0f},
	{HPU_ELT_TANH, "tanh", hpu__ref_tanh_forward, hpu__ref_tanh_backward, 0, 30.0f},
};

static void test_eltwise(void **state)
{
	(void)state;
	const hpu__backend *be = dnnl();
	static const size_t ns[] = {1, 7, 1000003};
	rng_seed(1);
	for (size_t e = 0; e < sizeof elts / sizeof elts[0]; e++) {
		const elt_ref *r = &elts[e];
		for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
			size_t n = ns[t];
			float *x = fbuf(n), *y = fbuf(n), *yr = fbuf(n), *dy = fbuf(n);
			float *dx = fbuf(n), *dxr = fbuf(n);
			fill(x, n, -r->range, r->range);
			fill(dy, n, -1.0f, 1.0f);
			fill_nan(y, n);
			fill_nan(dx, n);
			char what[96];

			assert_int_equal(be->eltwise_fwd(r->op, x, y, n), HPU_BE_OK);
			r->fwd(x, yr, n);
			snprintf(what, sizeof what, "%s fwd n=%zu x in +-%g", r->name, n,
				 (double)r->range);
			check_elt(what, y, yr, n);

			const float *at = r->at_is_input ? x : yr;
			assert_int_equal(be->eltwise_bwd(r->op, at, dy, dx, n), HPU_BE_OK);
			r->bwd(at, dy, dxr, n);
			snprintf(what, sizeof what, "%s bwd n=%zu", r->name, n);
			check_elt(what, dx, dxr, n);

			/* dx may alias dy (ops.h) */
			float *io = copy(dy, n);
			assert_int_equal(be->eltwise_bwd(r->op, at, io, io, n), HPU_BE_OK);
			snprintf(what, sizeof what, "%s bwd in place (dx = dy) n=%zu", r->name, n);
			check_elt(what, io, dxr, n);

			/* y may alias x */
			memcpy(io, x, n * sizeof *io);
			assert_int_equal(be->eltwise_fwd(r->op, io, io, n), HPU_BE_OK);
			snprintf(what, sizeof what, "%s fwd in place (y = x) n=%zu", r->name, n);
			check_elt(what, io, yr, n);

			if (r->op == HPU_ELT_RELU) /* a selection: exact */
				for (size_t i = 0; i < n; i++) {
					assert_true(y[i] == yr[i]);
					assert_true(dx[i] == dxr[i]);
				}
			free(x), free(y), free(yr), free(dy), free(dx), free(dxr), free(io);
		}
	}
	/* n = 0 writes nothing and succeeds */
	assert_int_equal(be->eltwise_fwd(HPU_ELT_GELU_TANH, NULL, NULL, 0), HPU_BE_OK);
	assert_int_equal(be->eltwise_bwd(HPU_ELT_TANH, NULL, NULL, NULL, 0), HPU_BE_OK);
}

/* Fails, naming the first element whose bits differ. */
static void check_bits(const char *what, const float *got, const float *want, size_t n)
{
	size_t i = 0;
	while (i < n && !memcmp(&got[i], &want[i], sizeof *got))
		i++;
	uint32_t g = 0, r = 0;
	if (i < n)
		memcpy(&g, &got[i], 4), memcpy(&r, &want[i], 4);
	printf("  %-44s %s", what, i < n ? "" : "bit for bit\n");
	if (i < n)
		printf("element %zu: 0x%08x, the reference 0x%08x  FAIL\n", i, (unsigned)g,
		       (unsigned)r);
	assert_true(i == n);
}

/* Inputs where a selection can go wrong: NaN of both signs, signed zeros,
 * subnormals, infinities, and ordinary values, one in 3 special. */
static void fill_special(float *a, size_t n)
{
	static const float v[] = {NAN, -NAN, 0.0f, -0.0f, 1e-45f, -1e-45f, INFINITY, -INFINITY};
	for (size_t i = 0; i < n; i++) {
		float u = rng_uniform(0.0f, 24.0f);
		a[i] = u < 8.0f ? v[(int)u] : rng_uniform(-2.0f, 2.0f);
	}
}

/* ReLU on the table (forward oneDNN's, backward backend_vec.c's loop) is
 * the reference's selection bit for bit: NaN, -0, subnormals, from 1
 * element to past where the backward streams (2^20), dx off the 64-byte
 * line, and in place. */
static void test_relu_bits(void **state)
{
	(void)state;
	hpu__be_set(NULL);
	const hpu__backend *be = hpu__be();
	assert_string_equal(be->name, "oneDNN");
	static const size_t ns[] = {1, 7, 16, 17, 33, 1000003, ((size_t)1 << 20) + 21};
	rng_seed(5);
	for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
		size_t n = ns[t];
		float *x = fbuf(n), *y = fbuf(n), *yr = fbuf(n), *dy = fbuf(n);
		float *dxb = fbuf(n + 1), *dxr = fbuf(n), *io = fbuf(n);
		float *dx = dxb + 1; /* 4 bytes past calloc's alignment */
		fill_special(x, n), fill_special(dy, n);
		fill_nan(y, n), fill_nan(dxb, n + 1);
		char what[96];
		assert_int_equal(be->eltwise_fwd(HPU_ELT_RELU, x, y, n), HPU_BE_OK);
		hpu__ref_relu_forward(x, yr, n);
		snprintf(what, sizeof what, "relu fwd n=%zu (table)", n);
		check_bits(what, y, yr, n);
		if (!hpu__vec_ok()) { /* no AVX-512F: the backward is the reference */
			assert_int_equal(be->eltwise_bwd(HPU_ELT_RELU, x, dy, dx, n),
					 HPU_BE_UNSUPPORTED);
			free(x), free(y), free(yr), free(dy), free(dxb), free(dxr), free(io);
			continue;
		}
		/* at = x: NaN and -0 reach the backward's test too */
		hpu__ref_relu_backward(x, dy, dxr, n);
		assert_int_equal(be->eltwise_bwd(HPU_ELT_RELU, x, dy, dx, n), HPU_BE_OK);
		snprintf(what, sizeof what, "relu bwd n=%zu (table)", n);
		check_bits(what, dx, dxr, n);
		memcpy(io, dy, n * sizeof *io);
		assert_int_equal(hpu__vec_relu_bwd(x, io, io, n), HPU_BE_OK);
		snprintf(what, sizeof what, "relu bwd n=%zu in place (vec)", n);
		check_bits(what, io, dxr, n);
		free(x), free(y), free(yr), free(dy), free(dxb), free(dxr), free(io);
	}
}

/* GELU on the table (backend_vec.c's loops) is the reference's bit for
 * bit: 2^20 bit patterns spread over all 2^32 (every sign, exponent,
 * NaN payloads, subnormals, the clamp's edges), the specials, odd
 * lengths, and the backward in place. (The loops were checked once
 * over every one of the 2^32 inputs.) */
static void test_gelu_bits(void **state)
{
	(void)state;
	hpu__be_set(NULL);
	const hpu__backend *be = hpu__be();
	assert_string_equal(be->name, "oneDNN");
	enum { N = (1 << 20) + 3 };
	float *x = fbuf(N), *y = fbuf(N), *yr = fbuf(N), *dy = fbuf(N), *dx = fbuf(N);
	float *dr = fbuf(N);
	for (uint32_t i = 0; i < N; i++) {
		uint32_t u = i * 4099u + 0x3f000000u;
		memcpy(&x[i], &u, sizeof u);
		dy[i] = rng_uniform(-2.0f, 2.0f);
	}
	fill_special(x, 64), fill_special(dy + N - 64, 64);
	x[64] = -87.0f / -2.0f, x[65] = 88.0f / -2.0f; /* near exp's clamp (u ~ x) */
	if (!hpu__vec_ok()) { /* no AVX-512F: the ops run the reference */
		assert_int_equal(be->eltwise_fwd(HPU_ELT_GELU_TANH, x, y, N), HPU_BE_UNSUPPORTED);
		free(x), free(y), free(yr), free(dy), free(dx), free(dr);
		return;
	}
	static const size_t ns[] = {1, 15, 17, N};
	for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
		size_t n = ns[t];
		char what[64];
		fill_nan(y, N), fill_nan(dx, N);
		assert_int_equal(be->eltwise_fwd(HPU_ELT_GELU_TANH, x, y, n), HPU_BE_OK);
		hpu__ref_gelu_forward(x, yr, n);
		snprintf(what, sizeof what, "gelu fwd n=%zu (table)", n);
		check_bits(what, y, yr, n);
		assert_true(n == N || isnan(y[n])); /* nothing past n */
		hpu__ref_gelu_backward(x, dy, dr, n);
		memcpy(dx, dy, n * sizeof *dx);
		assert_int_equal(be->eltwise_bwd(HPU_ELT_GELU_TANH, x, dx, dx, n), HPU_BE_OK);
		snprintf(what, sizeof what, "gelu bwd n=%zu in place (table)", n);
		check_bits(what, dx, dr, n);
	}
	free(x), free(y), free(yr), free(dy), free(dx), free(dr);
}

/* oneDNN's gelu_tanh is 0.5 x (1 + tanh u): in the left tail 1 + tanh u
 * cancels, so it is good to ~1e-7 absolute there, not relative (ours, x
 * sigmoid(2u), is). Prints both, bounds the absolute error. */
static void test_gelu_tail(void **state)
{
	(void)state;
	const hpu__backend *be = dnnl();
	enum { N = 4001 };
	float *x = fbuf(N), *y = fbuf(N), *yr = fbuf(N), *d = fbuf(N), *dr = fbuf(N);
	float *ones = fbuf(N);
	for (int i = 0; i < N; i++)
		x[i] = -100.0f + 0.05f * (float)i, ones[i] = 1.0f;
	assert_int_equal(be->eltwise_fwd(HPU_ELT_GELU_TANH, x, y, N), HPU_BE_OK);
	assert_int_equal(be->eltwise_bwd(HPU_ELT_GELU_TANH, x, ones, d, N), HPU_BE_OK);
	hpu__ref_gelu_forward(x, yr, N);
	hpu__ref_gelu_backward(x, ones, dr, N);
	double abs_f = 0, abs_d = 0, rel_f = 0;
	for (int i = 0; i < N; i++) {
		abs_f = fmax(abs_f, fabs((double)y[i] - yr[i]));
		abs_d = fmax(abs_d, fabs((double)d[i] - dr[i]));
		if (yr[i] != 0.0f)
			rel_f = fmax(rel_f, fabs((double)y[i] - yr[i]) / fabs(yr[i]));
		assert_false(isnan(y[i]) || isnan(d[i]));
	}
	printf("  gelu over [-100, 100], oneDNN vs reference: largest absolute difference "
	       "fwd %.3g, derivative %.3g; elementwise relative fwd %.3g\n",
	       abs_f, abs_d, rel_f);
	assert_true(abs_f <= 1e-6 && abs_d <= 1e-5);
	free(x), free(y), free(yr), free(d), free(dr), free(ones);
}

/* ---- softmax ---- */

static const int shapes[][2] = {{1, 1}, {7, 1}, {1, 7}, {5, 3}, {4, 129}, {3, 1000},
				{64, 100}};

static void test_softmax(void **state)
{
	(void)state;
	const hpu__backend *be = dnnl();
	rng_seed(2);
	for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
		int rows = shapes[s][0], cols = shapes[s][1];
		size_t n = (size_t)rows * cols;
		float *x = fbuf(n), *y = fbuf(n), *yr = fbuf(n), *dy = fbuf(n);
		float *dx = fbuf(n), *dxr = fbuf(n);
		fill(x, n, -30.0f, 30.0f);
		fill(dy, n, -1.0f, 1.0f);
		fill_nan(y, n);
		fill_nan(dx, n);
		char what[96];

		assert_int_equal(be->softmax_fwd(x, y, rows, cols), HPU_BE_OK);
		hpu__ref_softmax_forward(x, yr, rows, cols);
		snprintf(what, sizeof what, "softmax fwd %dx%d x in +-30", rows, cols);
		check(what, y, yr, n, TOL);
		for (int r = 0; r < rows; r++) { /* each row sums to 1 */
			double sum = 0;
			for (int c = 0; c < cols; c++)
				sum += y[(size_t)r * cols + c];
			assert_true(fabs(sum - 1.0) <= 1e-5);
		}

		assert_int_equal(be->softmax_bwd(yr, dy, dx, rows, cols), HPU_BE_OK);
		hpu__ref_softmax_backward(yr, dy, dxr, rows, cols);
		snprintf(what, sizeof what, "softmax bwd %dx%d", rows, cols);
		check(what, dx, dxr, n, TOL);

		float *io = copy(dy, n); /* dx = dy, as the reference allows */
		assert_int_equal(be->softmax_bwd(yr, io, io, rows, cols), HPU_BE_OK);
		snprintf(what, sizeof what, "softmax bwd in place %dx%d", rows, cols);
		check(what, io, dxr, n, TOL);
		free(x), free(y), free(yr), free(dy), free(dx), free(dxr), free(io);
	}
	assert_int_equal(be->softmax_fwd(NULL, NULL, 0, 5), HPU_BE_OK);
	assert_int_equal(be->softmax_bwd(NULL, NULL, NULL, 3, 0), HPU_BE_OK);
}

/* ---- layer norm ---- */

static void layernorm_case(const hpu__backend *be, int rows, int cols, float offset,
			   float eps)
{
	size_t n = (size_t)rows * cols;
	float *x = fbuf(n), *g = fbuf(cols), *b = fbuf(cols), *y = fbuf(n), *yr = fbuf(n);
	float *mean = fbuf(rows), *rstd = fbuf(rows), *meanr = fbuf(rows), *rstdr = fbuf(rows);
	float *dy = fbuf(n), *dx = fbuf(n), *dxr = fbuf(n);
	float *dg = fbuf(cols), *db = fbuf(cols), *dgr = fbuf(cols), *dbr = fbuf(cols);
	fill(x, n, offset - 3.0f, offset + 3.0f);
	fill(g, cols, 0.5f, 1.5f);
	fill(b, cols, -1.0f, 1.0f);
	fill(dy, n, -1.0f, 1.0f);
	fill_nan(y, n);
	fill_nan(mean, rows);
	fill_nan(rstd, rows);
	fill_nan(dx, n);
	char what[96];

	assert_int_equal(be->layernorm_fwd(x, g, b, y, mean, rstd, rows, cols, eps), HPU_BE_OK);
	hpu__ref_layernorm_forward(x, g, b, yr, meanr, rstdr, rows, cols, eps);
	/* both against y in double */
	double eb = 0, er = 0, scale = 0;
	for (int r = 0; r < rows; r++) {
		const float *xr = x + (size_t)r * cols;
		double m = 0, v = 0;
		for (int c = 0; c < cols; c++)
			m += xr[c];
		m /= cols;
		for (int c = 0; c < cols; c++)
			v += (xr[c] - m) * (xr[c] - m);
		double s = 1.0 / sqrt(v / cols + eps);
		for (int c = 0; c < cols; c++) {
			size_t i = (size_t)r * cols + c;
			double want = (xr[c] - m) * s * g[c] + b[c];
			eb = fmax(eb, fabs(y[i] - want));
			er = fmax(er, fabs(yr[i] - want));
			scale = fmax(scale, fabs(want));
		}
	}
	printf("  layernorm fwd y %dx%d mean %g vs double: oneDNN %.3g, reference %.3g "
	       "(rel to max |y|)\n", rows, cols, (double)offset, eb / scale, er / scale);
	assert_true(eb / scale <= fmax(er / scale, TOL));
	/* at mean 300 the reference's serial fp32 sum of the mean is off by
	 * ~3e-5 relative (oneDNN ~8e-6): the two agree to 1e-4 there */
	snprintf(what, sizeof what, "layernorm fwd y %dx%d mean %g", rows, cols, (double)offset);
	check(what, y, yr, n, offset != 0.0f ? 1e-4 : TOL);
	snprintf(what, sizeof what, "layernorm fwd mean %dx%d", rows, cols);
	check(what, mean, meanr, rows, TOL);
	snprintf(what, sizeof what, "layernorm fwd rstd %dx%d", rows, cols);
	check(what, rstd, rstdr, rows, TOL);

	/* dgamma and dbeta accumulate: start both from the same values */
	fill(dg, cols, -2.0f, 2.0f);
	fill(db, cols, -2.0f, 2.0f);
	memcpy(dgr, dg, cols * sizeof *dg);
	memcpy(dbr, db, cols * sizeof *db);
	assert_int_equal(be->layernorm_bwd(x, g, meanr, rstdr, dy, dx, dg, db, rows, cols),
			 HPU_BE_OK);
	hpu__ref_layernorm_backward(x, g, meanr, rstdr, dy, dxr, dgr, dbr, rows, cols);
	snprintf(what, sizeof what, "layernorm bwd dx %dx%d", rows, cols);
	check(what, dx, dxr, n, TOL);
	snprintf(what, sizeof what, "layernorm bwd dgamma (+=) %dx%d", rows, cols);
	check(what, dg, dgr, cols, TOL);
	snprintf(what, sizeof what, "layernorm bwd dbeta (+=) %dx%d", rows, cols);
	check(what, db, dbr, cols, TOL);

	/* a second call adds the same again; dx is overwritten, not added */
	fill_nan(dx, n);
	assert_int_equal(be->layernorm_bwd(x, g, meanr, rstdr, dy, dx, dg, db, rows, cols),
			 HPU_BE_OK);
	hpu__ref_layernorm_backward(x, g, meanr, rstdr, dy, dxr, dgr, dbr, rows, cols);
	snprintf(what, sizeof what, "layernorm bwd twice: dx %dx%d", rows, cols);
	check(what, dx, dxr, n, TOL);
	snprintf(what, sizeof what, "layernorm bwd twice: dgamma %dx%d", rows, cols);
	check(what, dg, dgr, cols, TOL);
	snprintf(what, sizeof what, "layernorm bwd twice: dbeta %dx%d", rows, cols);
	check(what, db, dbr, cols, TOL);

	free(x), free(g), free(b), free(y), free(yr), free(mean), free(rstd), free(meanr);
	free(rstdr), free(dy), free(dx), free(dxr), free(dg), free(db), free(dgr), free(dbr);
}

static void test_layernorm(void **state)
{
	(void)state;
	const hpu__backend *be = dnnl();
	rng_seed(3);
	static const int ln_shapes[][2] = {{1, 1}, {7, 1}, {1, 7}, {5, 3}, {4, 129},
					   {3, 1000}, {64, 128}};
	for (size_t s = 0; s < sizeof ln_shapes / sizeof ln_shapes[0]; s++)
		layernorm_case(be, ln_shapes[s][0], ln_shapes[s][1], 0.0f, 1e-5f);
	/* a large mean (the variance must not come from E[x^2] - E[x]^2), and
	 * another eps (a key of its own) */
	layernorm_case(be, 8, 129, 300.0f, 1e-5f);
	layernorm_case(be, 8, 129, 0.0f, 1e-3f);
	/* on two threads */
	be->set_threads(2);
	layernorm_case(be, 64, 1000, 0.0f, 1e-5f);
	be->set_threads(1);
	assert_int_equal(be->layernorm_fwd(NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, 1e-5f),
			 HPU_BE_OK);
	assert_int_equal(be->layernorm_bwd(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0,
					   8),
			 HPU_BE_OK);
}

/* ---- the public ops: default backend vs the reference table ---- */

enum { PR = 33, PC = 129, PN = PR * PC };

typedef struct pub_out {
	float y[6][PN];  /* relu, gelu, tanh, softmax, layernorm; relu in place */
	float dx[7][PN]; /* their backwards; gelu's and tanh's with dx = dy */
	float stat[2][PR]; /* layernorm's mean and rstd */
	float dgb[2][PC];  /* dgamma, dbeta */
} pub_out;

static void run_public(pub_out *o, const float *x, const float *dy, const float *g,
		       const float *b)
{
	hpu_relu_forward(x, o->y[0], PN);
	hpu_relu_backward(o->y[0], dy, o->dx[0], PN);
	hpu_gelu_forward(x, o->y[1], PN);
	hpu_gelu_backward(x, dy, o->dx[1], PN);
	hpu_tanh_forward(x, o->y[2], PN);
	hpu_tanh_backward(o->y[2], dy, o->dx[2], PN);
	hpu_softmax_forward(x, o->y[3], PR, PC);
	hpu_softmax_backward(o->y[3], dy, o->dx[3], PR, PC);
	hpu_layernorm_forward(x, g, b, o->y[4], o->stat[0], o->stat[1], PR, PC, 1e-5f);
	for (int c = 0; c < PC; c++)
		o->dgb[0][c] = 1.0f, o->dgb[1][c] = -1.0f;
	hpu_layernorm_backward(x, g, o->stat[0], o->stat[1], dy, o->dx[4], o->dgb[0],
			       o->dgb[1], PR, PC);
	/* in place, as ops.h allows: y = x (relu), dx = dy */
	memcpy(o->y[5], x, sizeof o->y[5]);
	hpu_relu_forward(o->y[5], o->y[5], PN);
	memcpy(o->dx[5], dy, sizeof o->dx[5]);
	hpu_gelu_backward(x, o->dx[5], o->dx[5], PN);
	memcpy(o->dx[6], dy, sizeof o->dx[6]);
	hpu_tanh_backward(o->y[2], o->dx[6], o->dx[6], PN);
}

static void compare_public(const char *mode, double tol)
{
	static pub_out be, ref;
	float *x = fbuf(PN), *dy = fbuf(PN), *g = fbuf(PC), *b = fbuf(PC);
	fill(x, PN, -8.0f, 8.0f);
	fill(dy, PN, -1.0f, 1.0f);
	fill(g, PC, 0.5f, 1.5f);
	fill(b, PC, -1.0f, 1.0f);
	hpu__be_set(hpu__be_reference());
	run_public(&ref, x, dy, g, b);
	dnnl();
	run_public(&be, x, dy, g, b);
	static const char *names[7] = {"relu", "gelu", "tanh", "softmax", "layernorm",
				       "gelu (dx = dy)", "tanh (dx = dy)"};
	char what[96];
	for (int i = 0; i < 5; i++) {
		snprintf(what, sizeof what, "%s: hpu_%s_forward", mode, names[i]);
		check(what, be.y[i], ref.y[i], PN, tol);
	}
	snprintf(what, sizeof what, "%s: hpu_relu_forward in place", mode);
	check(what, be.y[5], ref.y[5], PN, tol);
	for (int i = 0; i < 7; i++) {
		snprintf(what, sizeof what, "%s: %s backward", mode, names[i]);
		check(what, be.dx[i], ref.dx[i], PN, tol);
	}
	snprintf(what, sizeof what, "%s: layernorm mean", mode);
	check(what, be.stat[0], ref.stat[0], PR, tol);
	snprintf(what, sizeof what, "%s: layernorm rstd", mode);
	check(what, be.stat[1], ref.stat[1], PR, tol);
	snprintf(what, sizeof what, "%s: layernorm dgamma (+=)", mode);
	check(what, be.dgb[0], ref.dgb[0], PC, tol);
	snprintf(what, sizeof what, "%s: layernorm dbeta (+=)", mode);
	check(what, be.dgb[1], ref.dgb[1], PC, tol);
	free(x), free(dy), free(g), free(b);
}

static void test_public_fp32(void **state)
{
	(void)state;
	rng_seed(4);
	char err[256];
	unsetenv("LOWER_LIST");
	unsetenv("FP32_LIST");
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_NONE, err, sizeof err), 0);
	compare_public("fp32", TOL);
}

/* bf16-lowered: the inputs and outputs are rounded around either kernel,
 * so the two may differ by one bf16 rounding (2^-8 relative) */
static void test_public_bf16(void **state)
{
	(void)state;
	rng_seed(5);
	char path[] = "/tmp/test_backend_nn.XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	const char *list = "relu\ngelu\ntanh\nsoftmax\nlayernorm\n";
	assert_int_equal(write(fd, list, strlen(list)), (int)strlen(list));
	close(fd);
	setenv("LOWER_LIST", path, 1);
	unsetenv("FP32_LIST");
	char err[256] = "";
	int rc = hpu__autocast_init(HPU_AUTOCAST_BF16, err, sizeof err);
	unlink(path);
	if (rc != 0)
		fail_msg("hpu__autocast_init: %s", err);
	assert_int_equal(hpu_autocast_lowered("gelu"), 1);
	compare_public("bf16", 1.0 / 128);
	unsetenv("LOWER_LIST");
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_NONE, err, sizeof err), 0);
}

/* ---- the ops' own passes through the table ----
 *
 * A device fills the table's entries for the ops' own passes (bias
 * gradients, roundings, conversions, fp8's amax and quantization, id
 * checks, the accuracy count); the ops must call them where they are
 * filled and give the same results. Here a copy of the reference table
 * fills them with plain C (counting the calls), and each op runs on it and
 * on the reference table: the same bits, and every entry called. */

enum { H_BIAS, H_BIAS16, H_ROUND, H_TO_BF16, H_FROM16, H_ADD, H_AMAX, H_QUANT, H_IDS,
       H_CORRECT, H_AMAX_SCALE, H_QUANT_AT, H_ROLL, H_STATE_COPY, H_N };
static const char *const hook_names[H_N] = {
	"bias_grad f32", "bias_grad bf16", "round",	     "to_bf16",	     "from16",
	"add",		 "amax",	   "fp8_fake_quant", "ids_in_range", "count_correct",
	"fp8_amax_scale", "fp8_quant_at",  "fp8_roll",	     "fp8_state_copy"};
static int hook_calls[H_N];
static hpu__backend hooked;

static int one(void)
{
	return 1;
}

static int h_bias_grad(hpu__dtype dt, const void *dy, float *db, int rows, int cols)
{
	hook_calls[dt == HPU_DT_BF16 ? H_BIAS16 : H_BIAS]++;
	for (int r = 0; r < rows; r++)
		for (int c = 0; c < cols; c++) {
			size_t o = (size_t)r * cols + c;
			db[c] += dt == HPU_DT_BF16 ? hpu_from_bf16(((const uint16_t *)dy)[o])
						   : ((const float *)dy)[o];
		}
	return HPU_BE_OK;
}

static int h_round(int fp16, const float *x, float *y, size_t n)
{
	hook_calls[H_ROUND]++;
	for (size_t i = 0; i < n; i++)
		y[i] = fp16 ? hpu_from_fp16(hpu_to_fp16(x[i])) : hpu_from_bf16(hpu_to_bf16(x[i]));
	return HPU_BE_OK;
}

static int h_to_bf16(const float *x, uint16_t *y, size_t n)
{
	hook_calls[H_TO_BF16]++;
	for (size_t i = 0; i < n; i++)
		y[i] = hpu_to_bf16(x[i]);
	return HPU_BE_OK;
}

static int h_from16(int fp16, const uint16_t *x, float *y, size_t n)
{
	hook_calls[H_FROM16]++;
	for (size_t i = 0; i < n; i++)
		y[i] = fp16 ? hpu_from_fp16(x[i]) : hpu_from_bf16(x[i]);
	return HPU_BE_OK;
}

static int h_add(const float *x, float *y, size_t n)
{
	hook_calls[H_ADD]++;
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
	return HPU_BE_OK;
}

/* fp8's and the accuracy's hooks call the op itself on the reference
 * table (its C loop), then put the hooked table back */
static int h_amax(const float *x, size_t n, float *out)
{
	hook_calls[H_AMAX]++;
	hpu__be_set(hpu__be_reference());
	*out = hpu__fp8_amax(x, n);
	hpu__be_set(&hooked);
	return HPU_BE_OK;
}

static int h_quant(const float *x, float *y, size_t n, float scale, int fmt)
{
	hook_calls[H_QUANT]++;
	hpu__be_set(hpu__be_reference());
	hpu__fp8_fake_quant(x, y, n, scale, fmt);
	hpu__be_set(&hooked);
	return HPU_BE_OK;
}

/* fp8 training's state entries: the host's kernels, counted */
static int h_amax_scale(const float *x, size_t n, float *step, float *sc, int fmt, int margin)
{
	hook_calls[H_AMAX_SCALE]++;
	return hpu__host_fp8_amax_scale(x, n, step, sc, fmt, margin);
}

static int h_quant_at(const float *x, float *y, size_t n, const float *scale, int fmt)
{
	hook_calls[H_QUANT_AT]++;
	return hpu__host_fp8_quant_at(x, y, n, scale, fmt);
}

static int h_roll(float *chunk, int count, int cap, int history, int algo, int margin)
{
	hook_calls[H_ROLL]++;
	return hpu__host_fp8_roll(chunk, count, cap, history, algo, margin);
}

static int h_state_copy(void *dst, const void *src, size_t bytes)
{
	hook_calls[H_STATE_COPY]++;
	return hpu__host_fp8_state_copy(dst, src, bytes);
}

static int h_ids(const int32_t *ids, int n, int limit, int *ok)
{
	hook_calls[H_IDS]++;
	*ok = 1;
	for (int i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= limit)
			*ok = 0;
	return HPU_BE_OK;
}

static int h_correct(const float *z, const int32_t *labels, int batch, int classes, int *out)
{
	hook_calls[H_CORRECT]++;
	hpu__be_set(hpu__be_reference());
	*out = hpu_accuracy_forward(z, labels, batch, classes);
	hpu__be_set(&hooked);
	return HPU_BE_OK;
}

/* The ops whose passes go through the entries, on table `be`, into out
 * (fixed size, zeroed first). bf16_native is 1 on both tables, so the
 * lowered linear takes its bf16 path (the reference's products then run
 * in fp32 on the bf16 values). */
#define HB 9
#define HI 21
#define HO 11
#define HOUT 4096
static void run_passes(const hpu__backend *be, float *out)
{
	char err[256];
	float x[HB * HI], w[HO * HI], b[HO], dy[HB * HO];
	float dx[HB * HI], dw[HO * HI], db[HO];
	int32_t lab[HB];
	size_t k = 0;
	rng_seed(21);
	fill(x, HB * HI, -1, 1), fill(w, HO * HI, -1, 1), fill(b, HO, -1, 1);
	fill(dy, HB * HO, -1, 1);
	for (int i = 0; i < HB; i++)
		lab[i] = i % HO;
	memset(out, 0, HOUT * sizeof *out);
	hpu__be_set(be);
	for (int lowp = 0; lowp < 2; lowp++) { /* fp32, then bf16 autocast */
		unsetenv("LOWER_LIST");
		unsetenv("FP32_LIST");
		assert_int_equal(hpu__autocast_init(lowp ? HPU_AUTOCAST_BF16 : HPU_AUTOCAST_NONE,
						    err, sizeof err),
				 0);
		memset(dw, 0, sizeof dw), memset(db, 0, sizeof db);
		hpu_linear_backward(x, w, dy, dx, dw, db, HB, HI, HO);
		memcpy(out + k, dx, sizeof dx), k += HB * HI;
		memcpy(out + k, db, sizeof db), k += HO;
		/* an accumulating product, rounded: the rounded product added */
		float c[HB * HO];
		memcpy(c, dy, sizeof c);
		hpu_matmul(x, w, c, HB, HO, HI, 0, 1, 1);
		memcpy(out + k, c, sizeof c), k += HB * HO;
	}
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_NONE, err, sizeof err), 0);
	/* a 16-bit working copy's fp32 values made */
	uint16_t p16[HI];
	float base[HI];
	for (int i = 0; i < HI; i++)
		p16[i] = hpu_to_bf16(x[i]);
	assert_int_equal(hpu__ac_param16_add(base, p16, HI, 0, 0), 0);
	hpu__ac_param_f32(base, HI);
	hpu__ac_param16_remove(base);
	memcpy(out + k, base, sizeof base), k += HI;
	/* fp8 */
	out[k++] = hpu__fp8_amax(x, HB * HI);
	hpu__fp8_fake_quant(x, out + k, HB * HI, 8.0f, HPU_FP8_E4M3), k += HB * HI;
	/* fp8 training: a layer's linear forward and backward, two steps
	 * (the step's amax brought back, as for a reduction over ranks, and
	 * the roll), then its state as a checkpoint takes it */
	float p8[HO * HI + HO], y8[HB * HO];
	memcpy(p8, w, sizeof w), memcpy(p8 + HO * HI, b, sizeof b);
	hpu_fp8_recipe r8 = {4, 0, HPU_FP8_AMAX_MAX};
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_FP8, err, sizeof err), 0);
	hpu__fp8_set_mode(HPU_FP8_TRAIN, &r8);
	for (int step = 0; step < 2; step++) {
		hpu__op_layer(0, "fc", p8, HO * HI + HO, 0);
		hpu_linear_forward(x, p8, p8 + HO * HI, y8, HB, HI, HO);
		hpu__op_layer(0, "fc", p8, HO * HI + HO, 1);
		memset(dw, 0, sizeof dw), memset(db, 0, sizeof db);
		hpu_linear_backward(x, p8, dy, dx, dw, db, HB, HI, HO);
		hpu__op_layer(-1, NULL, NULL, 0, 0);
		memcpy(out + k, y8, sizeof y8), k += HB * HO;
		memcpy(out + k, dx, sizeof dx), k += HB * HI;
		memcpy(out + k, dw, sizeof dw), k += HO * HI;
		size_t n8;
		const float *a8 = hpu__fp8_step_amax(&n8);
		assert_int_equal(n8, 3);
		memcpy(out + k, a8, 3 * sizeof *a8), k += 3;
		hpu__fp8_roll();
	}
	hpu_fp8_saved sv;
	assert_int_equal(hpu__fp8_saved_get(0, &sv), 0);
	memcpy(out + k, sv.scale, sizeof sv.scale), k += 3;
	memcpy(out + k, sv.hist, 3 * 4 * sizeof *sv.hist), k += 3 * 4;
	out[k++] = (float)sv.nhist, out[k++] = (float)sv.pos;
	hpu__fp8_set_mode(HPU_FP8_OFF, NULL);
	assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_NONE, err, sizeof err), 0);
	/* labels and ids checked, accuracy counted */
	out[k++] = hpu_cross_entropy_forward(dy, lab, NULL, HB, HO);
	out[k++] = (float)hpu_accuracy_forward(dy, lab, HB, HO);
	lab[HB - 1] = HO; /* out of range: refused */
	out[k++] = hpu_cross_entropy_forward(dy, lab, NULL, HB, HO);
	float y[HB * 2];
	out[k++] = (float)hpu_embedding_forward(w, lab, y, HB, HO, 2);
	assert_true(k <= HOUT);
	hpu__be_set(NULL);
}

static void test_passes_on_table(void **state)
{
	(void)state;
	hpu__backend ref = *hpu__be_reference();
	ref.bf16_native = one;
	hooked = ref;
	hooked.name = "hooked";
	hooked.bias_grad = h_bias_grad;
	hooked.round = h_round;
	hooked.to_bf16 = h_to_bf16;
	hooked.from16 = h_from16;
	hooked.add = h_add;
	hooked.amax = h_amax;
	hooked.fp8_fake_quant = h_quant;
	hooked.ids_in_range = h_ids;
	hooked.count_correct = h_correct;
	hooked.fp8_amax_scale = h_amax_scale;
	hooked.fp8_quant_at = h_quant_at;
	hooked.fp8_roll = h_roll;
	hooked.fp8_state_copy = h_state_copy;
	float *want = xcalloc(HOUT, sizeof *want), *got = xcalloc(HOUT, sizeof *got);
	run_passes(&ref, want);
	memset(hook_calls, 0, sizeof hook_calls);
	run_passes(&hooked, got);
	int missing = 0;
	for (int i = 0; i < H_N; i++) {
		printf("  %-16s called %d times\n", hook_names[i], hook_calls[i]);
		missing += hook_calls[i] == 0;
	}
	assert_int_equal(missing, 0);
	assert_memory_equal(got, want, HOUT * sizeof *got);
	free(want), free(got);
}

/* A working copy's fp32 values are made with one widening per run of
 * chunks not made yet, not one per chunk: chunk by chunk, GPT-2's token
 * table was 37,728 kernel launches a step on a GPU. The values are the
 * 16-bit ones either way. */
static void test_param16_runs(void **state)
{
	(void)state;
	enum { C = HPU__AC_P16_CHUNK, LEN = 10 * C + 300 }; /* 11 chunks, the last short */
	uint16_t *p16 = xcalloc(LEN, sizeof *p16);
	float *base = xcalloc(LEN, sizeof *base);
	rng_seed(5);
	for (int fp16 = 0; fp16 < 2; fp16++) {
		for (size_t i = 0; i < LEN; i++) {
			float v = rng_uniform(-10.0f, 10.0f);
			p16[i] = fp16 ? hpu_to_fp16(v) : hpu_to_bf16(v);
			base[i] = NAN;
		}
		hooked = *hpu__be_reference();
		hooked.name = "hooked";
		hooked.from16 = h_from16;
		hpu__be_set(&hooked);
		memset(hook_calls, 0, sizeof hook_calls);
		assert_int_equal(hpu__ac_param16_add(base, p16, LEN, fp16, 0), 0);
		hpu__ac_param_f32(base + 2 * C + 5, C); /* chunks 2 and 3: one call */
		assert_int_equal(hook_calls[H_FROM16], 1);
		assert_true(isnan(base[2 * C + 4]) == 0 && isnan(base[C]) && isnan(base[4 * C]));
		hpu__ac_param_f32(base + 5 * C, 1); /* chunk 5 */
		assert_int_equal(hook_calls[H_FROM16], 2);
		hpu__ac_param_f32(base, LEN); /* the runs 0-1, 4 and 6-10 */
		assert_int_equal(hook_calls[H_FROM16], 5);
		hpu__ac_param_f32(base, LEN); /* all made: none */
		assert_int_equal(hook_calls[H_FROM16], 5);
		hpu__ac_param16_remove(base);
		hpu__be_set(NULL);
		for (size_t i = 0; i < LEN; i++)
			assert_true(base[i] == (fp16 ? hpu_from_fp16(p16[i]) : hpu_from_bf16(p16[i])));
	}
	free(p16), free(base);
}

/* A batched product under bf16 autocast rounds (and, accumulating, adds)
 * products that follow each other in one call each: a call per product
 * was 192 kernel launches for each of GPT-2's attention products at batch
 * 16. Strided apart, one call per product, the gaps left alone. The
 * values are the reference table's either way. */
static void test_bmm_rounds_once(void **state)
{
	(void)state;
	enum { CNT = 6, M = 5, N = 7, K = 9, GAP = 3 };
	char err[256];
	float a[CNT * M * K], b[CNT * K * N];
	rng_seed(9);
	fill(a, CNT * M * K, -1, 1), fill(b, CNT * K * N, -1, 1);
	for (int strided = 0; strided < 2; strided++)
		for (int acc = 0; acc < 2; acc++) {
			size_t sc = (size_t)M * N + (strided ? GAP : 0), nc = CNT * sc;
			float want[CNT * (M * N + GAP)], got[CNT * (M * N + GAP)];
			for (size_t i = 0; i < nc; i++)
				want[i] = got[i] = 1.2345678f; /* not bf16: a rounding shows */
			assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_BF16, err, sizeof err), 0);
			/* bf16_native: the operands' bf16 forms made by to_bf16, so
			 * that every round call is a product's */
			hpu__backend ref = *hpu__be_reference();
			ref.bf16_native = one;
			hpu__be_set(&ref);
			hpu_bmm(a, b, want, CNT, M, N, K, 0, 0, acc, M * K, K * N, sc);
			hooked = ref;
			hooked.name = "hooked";
			hooked.round = h_round;
			hooked.add = h_add;
			hpu__be_set(&hooked);
			memset(hook_calls, 0, sizeof hook_calls);
			hpu_bmm(a, b, got, CNT, M, N, K, 0, 0, acc, M * K, K * N, sc);
			hpu__be_set(NULL);
			assert_int_equal(hpu__autocast_init(HPU_AUTOCAST_NONE, err, sizeof err), 0);
			assert_int_equal(hook_calls[H_ROUND], strided ? CNT : 1);
			assert_int_equal(hook_calls[H_ADD], acc ? (strided ? CNT : 1) : 0);
			assert_memory_equal(got, want, nc * sizeof *got);
			if (strided)
				for (int i = 0; i < CNT; i++)
					for (int g = 0; g < GAP; g++)
						assert_true(got[i * sc + M * N + g] == 1.2345678f);
		}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_eltwise),   cmocka_unit_test(test_gelu_tail),
		cmocka_unit_test(test_relu_bits), cmocka_unit_test(test_gelu_bits),
		cmocka_unit_test(test_softmax),   cmocka_unit_test(test_layernorm),
		cmocka_unit_test(test_public_fp32), cmocka_unit_test(test_public_bf16),
		cmocka_unit_test(test_passes_on_table), cmocka_unit_test(test_param16_runs),
		cmocka_unit_test(test_bmm_rounds_once),
	};
	printf("backend: %s\n", hpu__be()->describe());
	return cmocka_run_group_tests(tests, NULL, NULL);
}
