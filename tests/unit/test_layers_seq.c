/* Unit tests for the normalization and sequence layers of <hpu/layers.h>
 * (worker/layers/norm.c, seq.c), run in-process by layer_harness:
 *  - against PyTorch 1.13 (tests/fixtures/torch_layers_b.py wrote
 *    tests/fixtures/refs/b_*.ref): outputs, input and parameter gradients,
 *    batch norm's running statistics and its evaluation;
 *  - finite-difference gradient checks (lh_gradcheck), which also check
 *    that backward overwrites input gradients and accumulates parameter
 *    gradients;
 *  - batch norm's running statistics under recompute, attention's fully
 *    masked rows, embedding's out-of-range ids, the evaluation forward
 *    without saved memory, the parameters' names and initial values, and
 *    the declaration errors.
 * Every comparison prints its largest relative difference.
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

#include <hpu/layers.h>
#include <hpu/ops.h>

#include "tests/unit/layer_harness.h"

#ifndef HPU_REFS_DIR
#error "HPU_REFS_DIR (tests/fixtures/refs) must be defined by the build"
#endif

/* Against float64 PyTorch: our fp32 math on a few dozen terms */
#define REF_TOL 1e-5

/* ---- helpers ---- */

static lh_ref *ref_open(const char *file)
{
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", HPU_REFS_DIR, file);
	lh_ref *r = lh_ref_load(path);
	if (!r)
		fail_msg("cannot load %s (run tests/fixtures/torch_layers_b.py)", path);
	return r;
}

/* Reference array `name`, which must hold n values of `dtype`. */
static const void *ref_get(const lh_ref *r, const char *name, hpu_dtype dtype, size_t n)
{
	size_t got = 0;
	const void *v = lh_ref_get(r, name, dtype, &got, NULL, NULL);
	if (!v || got != n)
		fail_msg("reference array %s: %s, want %zu values", name,
			 v ? "another size" : "missing", n);
	return v;
}

static const float *ref_f32(const lh_ref *r, const char *name, size_t n)
{
	return ref_get(r, name, HPU_F32, n);
}

static void *ref_data(const lh_ref *r, const char *name, hpu_dtype dtype, size_t n)
{
	return (void *)ref_get(r, name, dtype, n); /* the layers only read inputs */
}

/* Fails when got[n] is further than tol from want[n], relative to the
 * largest |want|; prints the difference either way. */
static void check_close(const char *what, const float *got, const float *want, size_t n,
			double tol)
{
	double rel = lh_maxrel(got, want, n, 1e-6);
	printf("  %-40s rel %.3g (tol %.1g)%s\n", what, rel, tol, rel <= tol ? "" : "  FAIL");
	assert_true(rel <= tol);
}

static float *falloc(size_t n)
{
	float *p = calloc(n ? n : 1, sizeof *p);
	assert_non_null(p);
	return p;
}

static void set_param(hpu_layer *l, int k, const float *v, size_t n)
{
	memcpy(hpu_param(l, k), v, n * sizeof *v);
}

/* A harness for batches of up to max_batch over the given fields. */
static lh_harness *harness(int max_batch, int nfields, const hpu_field *f)
{
	lh_harness *h = lh_new(max_batch);
	assert_non_null(h);
	if (lh_dataset(h, nfields, f, NULL, (size_t)max_batch) != HPU_OK)
		fail_msg("lh_dataset: %s", lh_error(h));
	return h;
}

static void alloc(lh_harness *h, hpu_layer *l)
{
	if (!l)
		fail_msg("declaring the layer failed: %s", lh_error(h));
	if (lh_alloc(h, 7) != 0)
		fail_msg("lh_alloc: %s", lh_error(h));
}

static void gradcheck(lh_harness *h, hpu_layer *l, int batch, void *const *in, int train)
{
	char msg[512];
	lh_check_opts o = {.train = train, .verbose = 1};
	if (lh_gradcheck(h, l, batch, in, &o, msg, sizeof msg) != 0)
		fail_msg("%s", msg);
}

/* The forward must succeed; its error otherwise. */
static void forward_ok(lh_harness *h, hpu_layer *l, const hpu_ctx *c, void *const *in,
		       void *const *out)
{
	if (lh_forward(h, l, c, in, out) != 0)
		fail_msg("forward failed: %s", lh_layer_error(l));
}

static void backward_ok(lh_harness *h, hpu_layer *l, const hpu_ctx *c, void *const *in,
			void *const *out, void *const *dout, void *const *din)
{
	if (lh_backward(h, l, c, in, out, dout, din) != 0)
		fail_msg("backward failed: %s", lh_layer_error(l));
}

static void expect_contains(const char *what, const char *text, const char *part)
{
	if (!strstr(text, part))
		fail_msg("%s: \"%s\" does not contain \"%s\"", what, text, part);
}

/* ---- layer norm ---- */

static void test_layernorm_torch(void **state)
{
	(void)state;
	lh_ref *r = ref_open("b_layernorm.ref");
	const int batch = 3, cols = 6;
	const size_t n = (size_t)batch * 4 * cols;
	hpu_field f = {"x", HPU_F32, 2, {4, cols}};
	lh_harness *h = harness(batch, 1, &f);
	hpu_layer *l = hpu_layernorm(lh_builder(h), "ln", "x", "y", (hpu_layernorm_opts){.eps = ref_f32(r, "eps", 1)[0]});
	alloc(h, l);
	set_param(l, 0, ref_f32(r, "weight", cols), cols);
	set_param(l, 1, ref_f32(r, "bias", cols), cols);
	float *y = falloc(n), *dx = falloc(n), g[2][6];
	void *in[] = {ref_data(r, "x", HPU_F32, n)}, *out[] = {y}, *din[] = {dx};
	void *dout[] = {ref_data(r, "dy", HPU_F32, n)}, *none[] = {NULL};
	hpu_ctx c = lh_ctx(h, l, 1, 0, batch);
	forward_ok(h, l, &c, in, out);
	check_close("layernorm y", y, ref_f32(r, "y", n), n, REF_TOL);
	backward_ok(h, l, &c, in, out, dout, din);
	check_close("layernorm dx", dx, ref_f32(r, "dx", n), n, REF_TOL);
	check_close("layernorm dweight", hpu_grad(l, 0), ref_f32(r, "dweight", cols), cols,
		    REF_TOL);
	check_close("layernorm dbias", hpu_grad(l, 1), ref_f32(r, "dbias", cols), cols, REF_TOL);
	/* with no input gradient wanted: the same parameter gradients */
	memcpy(g[0], hpu_grad(l, 0), sizeof g[0]);
	memcpy(g[1], hpu_grad(l, 1), sizeof g[1]);
	lh_zero_grads(h);
	backward_ok(h, l, &c, in, out, dout, none);
	assert_memory_equal(hpu_grad(l, 0), g[0], sizeof g[0]);
	assert_memory_equal(hpu_grad(l, 1), g[1], sizeof g[1]);
	/* evaluation, also without saved memory: the same output */
	float *y2 = falloc(n);
	void *out2[] = {y2};
	c = lh_ctx(h, l, 0, 0, batch);
	void *saved = l->saved;
	l->saved = NULL;
	forward_ok(h, l, &c, in, out2);
	l->saved = saved;
	assert_memory_equal(y2, y, n * sizeof *y);
	free(y), free(y2), free(dx);
	lh_free(&h);
	lh_ref_free(&r);
}

static void test_layernorm_gradcheck(void **state)
{
	(void)state;
	hpu_field f[] = {{"x", HPU_F32, 3, {2, 3, 5}}, {"v", HPU_F32, 1, {7}}};
	lh_harness *h = harness(3, 2, f);
	hpu_layer *a = hpu_layernorm(lh_builder(h), "ln3d", "x", "y", (hpu_layernorm_opts){.eps = 1e-5f});
	hpu_layer *b = hpu_layernorm(lh_builder(h), "ln1d", "v", "w", (hpu_layernorm_opts){.eps = 1e-3f});
	assert_non_null(a);
	alloc(h, b);
	/* weights away from ones and zeros, so their role shows */
	uint64_t s = 3;
	lh_fill(hpu_param(a, 0), 5, 0.5f, 1.5f, &s);
	lh_fill(hpu_param(a, 1), 5, -1, 1, &s);
	lh_fill(hpu_param(b, 0), 7, 0.5f, 1.5f, &s);
	gradcheck(h, a, 3, NULL, 1);
	gradcheck(h, b, 2, NULL, 1);
	lh_free(&h);
}

/* ---- batch norm ---- */

static void batchnorm_torch(const char *file, int batch, int ndim, const int64_t *shape)
{
	lh_ref *r = ref_open(file);
	hpu_field f = {"x", HPU_F32, ndim, {0}};
	memcpy(f.shape, shape, (size_t)ndim * sizeof *shape);
	lh_harness *h = harness(batch, 1, &f);
	hpu_layer *l = hpu_batchnorm(lh_builder(h), "bn", "x", "y", (hpu_batchnorm_opts){.eps = ref_f32(r, "eps", 1)[0], .momentum = ref_f32(r, "momentum", 1)[0], .sync = HPU_BUFFER_MEAN});
	alloc(h, l);
	size_t ch = (size_t)shape[0], n = (size_t)batch * lh_numel(h, "x");
	set_param(l, 0, ref_f32(r, "weight", ch), ch);
	set_param(l, 1, ref_f32(r, "bias", ch), ch);
	memcpy(hpu_buffer(l, 0), ref_f32(r, "running_mean0", ch), ch * sizeof(float));
	memcpy(hpu_buffer(l, 1), ref_f32(r, "running_var0", ch), ch * sizeof(float));
	float *y = falloc(n), *dx = falloc(n);
	void *in[] = {ref_data(r, "x", HPU_F32, n)}, *out[] = {y}, *din[] = {dx};
	void *dout[] = {ref_data(r, "dy", HPU_F32, n)};
	hpu_ctx c = lh_ctx(h, l, 1, 0, batch);
	printf(" %s:\n", file);
	forward_ok(h, l, &c, in, out);
	check_close("batchnorm y (training)", y, ref_f32(r, "y", n), n, REF_TOL);
	check_close("batchnorm running_mean", hpu_buffer(l, 0), ref_f32(r, "running_mean", ch), ch,
		    REF_TOL);
	check_close("batchnorm running_var", hpu_buffer(l, 1), ref_f32(r, "running_var", ch), ch,
		    REF_TOL);
	backward_ok(h, l, &c, in, out, dout, din);
	check_close("batchnorm dx", dx, ref_f32(r, "dx", n), n, REF_TOL);
	check_close("batchnorm dweight", hpu_grad(l, 0), ref_f32(r, "dweight", ch), ch, REF_TOL);
	check_close("batchnorm dbias", hpu_grad(l, 1), ref_f32(r, "dbias", ch), ch, REF_TOL);
	/* evaluation: the updated running statistics, which stay */
	float keep[2][16];
	memcpy(keep[0], hpu_buffer(l, 0), ch * sizeof(float));
	memcpy(keep[1], hpu_buffer(l, 1), ch * sizeof(float));
	void *in_eval[] = {ref_data(r, "x_eval", HPU_F32, n)};
	c = lh_ctx(h, l, 0, 0, batch);
	forward_ok(h, l, &c, in_eval, out);
	check_close("batchnorm y (evaluation)", y, ref_f32(r, "y_eval", n), n, REF_TOL);
	assert_memory_equal(hpu_buffer(l, 0), keep[0], ch * sizeof(float));
	assert_memory_equal(hpu_buffer(l, 1), keep[1], ch * sizeof(float));
	free(y), free(dx);
	lh_free(&h);
	lh_ref_free(&r);
}

static void test_batchnorm_torch(void **state)
{
	(void)state;
	const int64_t s2[] = {3, 3, 2}, s1[] = {5};
	batchnorm_torch("b_batchnorm2d.ref", 4, 3, s2);
	batchnorm_torch("b_batchnorm1d.ref", 6, 1, s1);
}

/* The running statistics follow torch's formula, computed here in
 * double; a recomputed forward leaves them as they were and gives the
 * same output; evaluation normalizes with them. */
static void test_batchnorm_running_stats(void **state)
{
	(void)state;
	enum { B = 4, C = 3, S = 4 };
	const float eps = 1e-3f, mom = 0.25f;
	hpu_field f = {"x", HPU_F32, 3, {C, 2, 2}};
	lh_harness *h = harness(B, 1, &f);
	hpu_layer *l = hpu_batchnorm(lh_builder(h), "bn", "x", "y", (hpu_batchnorm_opts){.eps = eps, .momentum = mom, .sync = HPU_BUFFER_LOCAL});
	alloc(h, l);
	float x[B * C * S], y[B * C * S], y1[B * C * S], want[C], rm1[C], rv1[C];
	uint64_t seed = 11;
	lh_fill(x, B * C * S, -2, 3, &seed);
	void *in[] = {x}, *out[] = {y};
	float *rm = hpu_buffer(l, 0), *rv = hpu_buffer(l, 1);
	for (int k = 0; k < C; k++)
		assert_true(rm[k] == 0 && rv[k] == 1); /* zeros and ones at start */
	for (int round = 0; round < 2; round++) {
		double mean[C] = {0}, var[C] = {0};
		for (int k = 0; k < C; k++) {
			for (int b = 0; b < B; b++)
				for (int i = 0; i < S; i++)
					mean[k] += x[(b * C + k) * S + i];
			mean[k] /= B * S;
			for (int b = 0; b < B; b++)
				for (int i = 0; i < S; i++) {
					double d = x[(b * C + k) * S + i] - mean[k];
					var[k] += d * d;
				}
			var[k] /= B * S - 1; /* unbiased */
		}
		float pm[C], pv[C];
		memcpy(pm, rm, sizeof pm);
		memcpy(pv, rv, sizeof pv);
		hpu_ctx c = lh_ctx(h, l, 1, round, B);
		forward_ok(h, l, &c, in, out);
		for (int k = 0; k < C; k++)
			want[k] = (float)((1 - mom) * pm[k] + mom * mean[k]);
		check_close("running_mean = (1-m) rm + m mean", rm, want, C, 1e-6);
		for (int k = 0; k < C; k++)
			want[k] = (float)((1 - mom) * pv[k] + mom * var[k]);
		check_close("running_var = (1-m) rv + m var (unbiased)", rv, want, C, 1e-6);
		/* recomputed: the same output, the statistics untouched */
		memcpy(y1, y, sizeof y);
		memcpy(rm1, rm, sizeof rm1);
		memcpy(rv1, rv, sizeof rv1);
		c.recompute = 1;
		memset(y, 0, sizeof y);
		forward_ok(h, l, &c, in, out);
		assert_memory_equal(y, y1, sizeof y);
		assert_memory_equal(rm, rm1, sizeof rm1);
		assert_memory_equal(rv, rv1, sizeof rv1);
		lh_fill(x, B * C * S, -1, 2, &seed); /* the next round's batch */
	}
	/* evaluation: (x - running_mean) / sqrt(running_var + eps), weight
	 * 1, bias 0 */
	hpu_ctx c = lh_ctx(h, l, 0, 2, 2);
	forward_ok(h, l, &c, in, out);
	float ev[2 * C * S];
	for (int b = 0; b < 2; b++)
		for (int k = 0; k < C; k++)
			for (int i = 0; i < S; i++) {
				int at = (b * C + k) * S + i;
				ev[at] = (float)((x[at] - (double)rm[k]) /
						 sqrt((double)rv[k] + eps));
			}
	check_close("batchnorm evaluation with the running stats", y, ev, 2 * C * S, 1e-6);
	assert_memory_equal(rm, rm1, sizeof rm1);
	assert_memory_equal(rv, rv1, sizeof rv1);
	lh_free(&h);
}

static void test_batchnorm_gradcheck(void **state)
{
	(void)state;
	hpu_field f[] = {{"x", HPU_F32, 3, {3, 3, 2}}, {"v", HPU_F32, 1, {5}},
			 {"u", HPU_F32, 2, {2, 4}}};
	lh_harness *h = harness(6, 3, f);
	hpu_layer *a = hpu_batchnorm(lh_builder(h), "bn2d", "x", "y", (hpu_batchnorm_opts){.eps = 1e-5f, .momentum = 0.1f, .sync = HPU_BUFFER_BROADCAST});
	hpu_layer *b = hpu_batchnorm(lh_builder(h), "bn1d", "v", "w", (hpu_batchnorm_opts){.eps = 1e-5f, .momentum = 0.1f, .sync = HPU_BUFFER_MEAN});
	hpu_layer *c = hpu_batchnorm(lh_builder(h), "bncl", "u", "z", (hpu_batchnorm_opts){.eps = 1e-5f, .momentum = 0.1f, .sync = HPU_BUFFER_MEAN});
	assert_non_null(a);
	assert_non_null(b);
	alloc(h, c);
	uint64_t s = 5;
	lh_fill(hpu_param(a, 0), 3, 0.5f, 1.5f, &s);
	lh_fill(hpu_param(a, 1), 3, -1, 1, &s);
	lh_fill(hpu_param(b, 0), 5, 0.5f, 1.5f, &s);
	gradcheck(h, a, 4, NULL, 1);
	gradcheck(h, b, 6, NULL, 1);
	gradcheck(h, c, 3, NULL, 1);
	lh_free(&h);
}

/* Training on one value per channel has no statistics: torch refuses it
 * too. */
static void test_batchnorm_one_value(void **state)
{
	(void)state;
	hpu_field f = {"v", HPU_F32, 1, {4}};
	lh_harness *h = harness(2, 1, &f);
	hpu_layer *l = hpu_batchnorm(lh_builder(h), "bn", "v", "y", (hpu_batchnorm_opts){.eps = 1e-5f, .momentum = 0.1f, .sync = HPU_BUFFER_MEAN});
	alloc(h, l);
	float x[4] = {1, 2, 3, 4}, y[4];
	void *in[] = {x}, *out[] = {y};
	hpu_ctx c = lh_ctx(h, l, 1, 0, 1);
	assert_int_not_equal(lh_forward(h, l, &c, in, out), 0);
	expect_contains("batch norm error", lh_layer_error(l), "more than one value per channel");
	c.train = 0; /* evaluation has the running statistics */
	forward_ok(h, l, &c, in, out);
	lh_free(&h);
}

/* ---- embedding ---- */

static void test_embedding_torch(void **state)
{
	(void)state;
	lh_ref *r = ref_open("b_embedding.ref");
	const int batch = 3, vocab = lh_ref_int(r, "vocab", 0), dim = lh_ref_int(r, "dim", 0);
	const size_t nid = (size_t)batch * 5, n = nid * (size_t)dim;
	hpu_field f = {"ids", HPU_I32, 1, {5}};
	lh_harness *h = harness(batch, 1, &f);
	hpu_layer *l = hpu_embedding(lh_builder(h), "emb", "ids", "y", (hpu_embedding_opts){.vocab = vocab, .dim = dim});
	alloc(h, l);
	hpu_tensor t = lh_tensor(h, "y", 0, NULL);
	assert_int_equal(t.ndim, 2);
	assert_int_equal(t.shape[0], 5);
	assert_int_equal(t.shape[1], dim);
	set_param(l, 0, ref_f32(r, "weight", (size_t)vocab * dim), (size_t)vocab * dim);
	float *y = falloc(n);
	void *in[] = {ref_data(r, "ids", HPU_I32, nid)}, *out[] = {y}, *din[] = {NULL};
	void *dout[] = {ref_data(r, "dy", HPU_F32, n)};
	hpu_ctx c = lh_ctx(h, l, 1, 0, batch);
	forward_ok(h, l, &c, in, out);
	check_close("embedding y", y, ref_f32(r, "y", n), n, REF_TOL);
	backward_ok(h, l, &c, in, out, dout, din);
	check_close("embedding dweight", hpu_grad(l, 0),
		    ref_f32(r, "dweight", (size_t)vocab * dim), (size_t)vocab * dim, REF_TOL);
	gradcheck(h, l, batch, in, 1);
	free(y);
	lh_free(&h);
	lh_ref_free(&r);
}

/* Ids of any shape: none (one id per sample), [2, 3]. */
static void test_embedding_shapes(void **state)
{
	(void)state;
	hpu_field f[] = {{"tok", HPU_I32, 0, {0}}, {"grid", HPU_I32, 2, {2, 3}}};
	lh_harness *h = harness(4, 2, f);
	hpu_layer *a = hpu_embedding(lh_builder(h), "e0", "tok", "y0", (hpu_embedding_opts){.vocab = 5, .dim = 3});
	hpu_layer *b = hpu_embedding(lh_builder(h), "e2", "grid", "y2", (hpu_embedding_opts){.vocab = 9, .dim = 2});
	assert_non_null(a);
	alloc(h, b);
	hpu_tensor t = lh_tensor(h, "y0", 0, NULL);
	assert_int_equal(t.ndim, 1);
	assert_int_equal(t.shape[0], 3);
	t = lh_tensor(h, "y2", 0, NULL);
	assert_int_equal(t.ndim, 3);
	assert_true(t.shape[0] == 2 && t.shape[1] == 3 && t.shape[2] == 2);
	int32_t tok[4] = {4, 0, 4, 1}, grid[24];
	for (int i = 0; i < 24; i++)
		grid[i] = (i * 5) % 9;
	float y0[12];
	void *in0[] = {tok}, *out0[] = {y0}, *in2[] = {grid};
	hpu_ctx c = lh_ctx(h, a, 1, 0, 4);
	forward_ok(h, a, &c, in0, out0);
	for (int i = 0; i < 4; i++) /* row tok[i] of the table */
		assert_memory_equal(y0 + 3 * i, hpu_param(a, 0) + 3 * tok[i], 3 * sizeof(float));
	gradcheck(h, a, 4, in0, 1);
	gradcheck(h, b, 4, in2, 1);
	lh_free(&h);
}

/* hpu_param_init re-initializes a library layer's parameter, as
 * torch.nn.init does after construction: N(0, 0.02) instead of N(0, 1);
 * an unknown name or a bad initializer is refused. */
static void test_param_init(void **state)
{
	(void)state;
	hpu_field f[] = {{"tok", HPU_I32, 0, {0}}};
	lh_harness *h = harness(4, 1, f);
	hpu_builder *b = lh_builder(h);
	hpu_layer *l = hpu_embedding(b, "emb", "tok", "y", (hpu_embedding_opts){.vocab = 400, .dim = 50});
	assert_non_null(l);
	assert_int_equal(hpu_param_init(b, "emb.weight", HPU_INIT(NORMAL, 0, 0.02f)), HPU_OK);
	assert_int_equal(hpu_param_init(b, "emb.bias", HPU_INIT(ZEROS)), HPU_ENOENT);
	assert_int_equal(hpu_param_init(b, "emb.weight", HPU_INIT(NORMAL, 0, -1.0f)), HPU_EINVAL);
	lh_clear_error(h);
	alloc(h, l);
	const float *w = hpu_param(l, 0);
	double ss = 0, mean = 0;
	for (int i = 0; i < 400 * 50; i++) {
		mean += w[i];
		ss += (double)w[i] * w[i];
	}
	mean /= 400 * 50;
	double sd = sqrt(ss / (400 * 50) - mean * mean);
	printf("  emb.weight after hpu_param_init: mean %.5f, std %.5f\n", mean, sd);
	assert_true(fabs(mean) < 0.001 && fabs(sd - 0.02) < 0.001);
	lh_free(&h);
}

static void test_embedding_bad_id(void **state)
{
	(void)state;
	hpu_field f = {"ids", HPU_I32, 1, {4}};
	lh_harness *h = harness(3, 1, &f);
	hpu_layer *l = hpu_embedding(lh_builder(h), "emb", "ids", "y", (hpu_embedding_opts){.vocab = 7, .dim = 2});
	alloc(h, l);
	const uint32_t samples[] = {40, 41, 42};
	lh_set_samples(h, samples, 3);
	int32_t ids[12] = {0, 1, 2, 3, 4, 5, 6, 9, 1, 1, 1, 1};
	float y[24];
	void *in[] = {ids}, *out[] = {y};
	hpu_ctx c = lh_ctx(h, l, 1, 0, 3);
	assert_int_equal(lh_forward(h, l, &c, in, out), HPU_ERANGE);
	const char *e = lh_layer_error(l);
	printf("  error: %s\n", e);
	expect_contains("bad id", e, "id 9 ");
	expect_contains("bad id", e, "position 3 of row 1");
	expect_contains("bad id", e, "dataset sample 41");
	expect_contains("bad id", e, "[0, 7)");
	ids[7] = 6;
	ids[10] = -3;
	assert_int_equal(lh_forward(h, l, &c, in, out), HPU_ERANGE);
	expect_contains("negative id", lh_layer_error(l), "id -3 at position 2 of row 2");
	ids[10] = 0;
	forward_ok(h, l, &c, in, out);
	lh_free(&h);
}

/* N(0, 1): a table of 2000 values has mean and standard deviation near
 * 0 and 1. */
static void test_embedding_init(void **state)
{
	(void)state;
	hpu_field f = {"ids", HPU_I32, 0, {0}};
	lh_harness *h = harness(1, 1, &f);
	hpu_layer *l = hpu_embedding(lh_builder(h), "emb", "ids", "y", (hpu_embedding_opts){.vocab = 200, .dim = 10});
	alloc(h, l);
	const hpu_param_info *p = &lh_builder(h)->params[l->pidx[0]];
	assert_string_equal(p->name, "emb.weight");
	assert_true(p->ndim == 2 && p->shape[0] == 200 && p->shape[1] == 10);
	double s = 0, sq = 0;
	const float *w = hpu_param(l, 0);
	for (int i = 0; i < 2000; i++)
		s += w[i], sq += (double)w[i] * w[i];
	double mean = s / 2000, sd = sqrt(sq / 2000 - mean * mean);
	printf("  embedding init: mean %.3f, sd %.3f\n", mean, sd);
	assert_true(fabs(mean) < 0.1 && fabs(sd - 1) < 0.1);
	lh_free(&h);
}

/* ---- attention ---- */

enum { AT_T = 5, AT_D = 8 };

/* A harness over x [5, 8] and mask i32 [5] with layer "attn" (reading
 * "x,mask" when masked). */
static lh_harness *attention_harness(int batch, int heads, int causal, int masked,
				     hpu_layer **l)
{
	hpu_field f[] = {{"x", HPU_F32, 2, {AT_T, AT_D}}, {"mask", HPU_I32, 1, {AT_T}}};
	lh_harness *h = harness(batch, 2, f);
	*l = hpu_attention(lh_builder(h), "attn", masked ? "x,mask" : "x", "y", (hpu_attention_opts){.heads = heads, .causal = causal});
	alloc(h, *l);
	return h;
}

static void attention_torch(const char *file)
{
	lh_ref *r = ref_open(file);
	const int batch = 3, masked = lh_ref_get(r, "mask", HPU_I32, NULL, NULL, NULL) != NULL;
	const size_t n = (size_t)batch * AT_T * AT_D, dd = AT_D * AT_D;
	hpu_layer *l;
	lh_harness *h = attention_harness(batch, lh_ref_int(r, "heads", 0),
					  lh_ref_int(r, "causal", -1), masked, &l);
	printf(" %s:\n", file);
	set_param(l, 0, ref_f32(r, "in_proj_weight", 3 * dd), 3 * dd);
	set_param(l, 1, ref_f32(r, "in_proj_bias", 3 * AT_D), 3 * AT_D);
	set_param(l, 2, ref_f32(r, "out_proj_weight", dd), dd);
	set_param(l, 3, ref_f32(r, "out_proj_bias", AT_D), AT_D);
	float *y = falloc(n), *dx = falloc(n), *y2 = falloc(n);
	void *in[] = {ref_data(r, "x", HPU_F32, n),
		      masked ? ref_data(r, "mask", HPU_I32, (size_t)batch * AT_T) : NULL};
	void *out[] = {y}, *out2[] = {y2}, *din[] = {dx, NULL};
	void *dout[] = {ref_data(r, "dy", HPU_F32, n)};
	hpu_ctx c = lh_ctx(h, l, 1, 0, batch);
	forward_ok(h, l, &c, in, out);
	check_close("attention y", y, ref_f32(r, "y", n), n, REF_TOL);
	backward_ok(h, l, &c, in, out, dout, din);
	check_close("attention dx", dx, ref_f32(r, "dx", n), n, REF_TOL);
	check_close("attention d in_proj_weight", hpu_grad(l, 0),
		    ref_f32(r, "din_proj_weight", 3 * dd), 3 * dd, REF_TOL);
	check_close("attention d in_proj_bias", hpu_grad(l, 1),
		    ref_f32(r, "din_proj_bias", 3 * AT_D), 3 * AT_D, REF_TOL);
	check_close("attention d out_proj.weight", hpu_grad(l, 2),
		    ref_f32(r, "dout_proj_weight", dd), dd, REF_TOL);
	check_close("attention d out_proj.bias", hpu_grad(l, 3),
		    ref_f32(r, "dout_proj_bias", AT_D), AT_D, REF_TOL);
	/* evaluation without saved memory: the same output */
	c = lh_ctx(h, l, 0, 0, batch);
	void *saved = l->saved;
	l->saved = NULL;
	forward_ok(h, l, &c, in, out2);
	l->saved = saved;
	assert_memory_equal(y2, y, n * sizeof *y);
	free(y), free(dx), free(y2);
	lh_free(&h);
	lh_ref_free(&r);
}

static void test_attention_torch(void **state)
{
	(void)state;
	attention_torch("b_mha_causal.ref");
	attention_torch("b_mha_pad.ref");
	attention_torch("b_mha_causal_pad.ref");
}

static void test_attention_gradcheck(void **state)
{
	(void)state;
	/* padding at the end, in the middle, none */
	int32_t mask[3 * AT_T] = {1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1};
	void *in[] = {NULL, mask};
	for (int causal = 0; causal < 2; causal++)
		for (int masked = 0; masked < 2; masked++) {
			hpu_layer *l;
			lh_harness *h = attention_harness(3, 2, causal, masked, &l);
			printf(" causal %d, key mask %d:\n", causal, masked);
			gradcheck(h, l, 3, masked ? in : NULL, 1);
			lh_free(&h);
		}
	hpu_layer *l; /* one head, and four: head_dim 8 and 2 */
	lh_harness *h = attention_harness(2, 1, 1, 0, &l);
	gradcheck(h, l, 2, NULL, 1);
	lh_free(&h);
	h = attention_harness(2, 4, 0, 1, &l);
	gradcheck(h, l, 2, in, 1);
	lh_free(&h);
}

/* A query with no key to attend to (causal row 0 at a padding key 0, or
 * a sample all padding) gets zeros before the output projection: its
 * output is out_proj.bias, and no gradient flows through it. Keys at
 * padding get no gradient either. */
static void test_attention_fully_masked(void **state)
{
	(void)state;
	for (int causal = 0; causal < 2; causal++) {
		enum { B = 2, N = B * AT_T * AT_D };
		int32_t mask[B * AT_T] = {0, 1, 1, 0, 1, 0, 0, 0, 0, 0};
		hpu_layer *l;
		lh_harness *h = attention_harness(B, 2, causal, 1, &l);
		uint64_t s = 9;
		lh_fill(hpu_param(l, 1), 3 * AT_D, -1, 1, &s);
		lh_fill(hpu_param(l, 3), AT_D, -1, 1, &s);
		float x[N], y[N], dy[N], dx[N];
		lh_fill(x, N, -1, 1, &s);
		lh_fill(dy, N, -1, 1, &s);
		void *in[] = {x, mask}, *out[] = {y}, *dout[] = {dy}, *din[] = {dx, NULL};
		hpu_ctx c = lh_ctx(h, l, 1, 0, B);
		forward_ok(h, l, &c, in, out);
		backward_ok(h, l, &c, in, out, dout, din);
		const float *bo = hpu_param(l, 3);
		for (int b = 0; b < B; b++)
			for (int i = 0; i < AT_T; i++) {
				int empty = b == 1 || (causal && i == 0);
				const float *yr = y + (b * AT_T + i) * AT_D;
				const float *dxr = dx + (b * AT_T + i) * AT_D;
				for (int e = 0; e < AT_D; e++) {
					assert_false(isnan(yr[e]) || isnan(dxr[e]));
					if (empty)
						assert_true(fabsf(yr[e] - bo[e]) <= 1e-6f);
				}
				/* such a row is at a padding key too: x there
				 * feeds no query, as q, k or v */
				if (empty) {
					float z[AT_D] = {0};
					assert_memory_equal(dxr, z, sizeof z);
				}
			}
		printf(" causal %d: rows with no key give out_proj.bias and zero gradient\n",
		       causal);
		gradcheck(h, l, B, in, 1);
		lh_free(&h);
	}
}

static void test_attention_bad_mask(void **state)
{
	(void)state;
	hpu_layer *l;
	lh_harness *h = attention_harness(1, 2, 0, 1, &l);
	float x[AT_T * AT_D] = {0}, y[AT_T * AT_D];
	int32_t mask[AT_T] = {1, 1, 2, 1, 0};
	void *in[] = {x, mask}, *out[] = {y};
	hpu_ctx c = lh_ctx(h, l, 1, 0, 1);
	assert_int_not_equal(lh_forward(h, l, &c, in, out), 0);
	expect_contains("mask value", lh_layer_error(l), "key mask mask has 2 at position 2");
	lh_free(&h);
}

/* HPU_FUSED_ATTENTION=1 when the layer is declared: the fused ops (on
 * the CPU the host's rows of worker/ops/flash_rows.h) give PyTorch's
 * outputs and gradients, pass the gradient check, keep lse [heads, T]
 * instead of the probabilities [heads, T, T], and a query with no key
 * still gives out_proj.bias. Unset, the layer declares the unfused
 * memory again. */
static void test_attention_fused(void **state)
{
	int32_t mask[3 * AT_T] = {1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 1, 1, 1};
	void *in[] = {NULL, mask};
	hpu_layer *l;
	assert_int_equal(setenv("HPU_FUSED_ATTENTION", "1", 1), 0);
	assert_int_equal(hpu_attention_fused(), 1);
	lh_harness *h = attention_harness(1, 2, 1, 0, &l);
	assert_int_equal(l->saved_ps, 4 * AT_T * AT_D + 2 * AT_T);
	assert_int_equal(l->scratch_ps, 4 * AT_T * AT_D + 2 * AT_T);
	lh_free(&h);
	test_attention_torch(state);
	test_attention_fully_masked(state);
	for (int causal = 0; causal < 2; causal++) {
		h = attention_harness(3, 2, causal, 1, &l);
		printf(" fused, causal %d, key mask:\n", causal);
		gradcheck(h, l, 3, in, 1);
		lh_free(&h);
	}
	assert_int_equal(unsetenv("HPU_FUSED_ATTENTION"), 0);
	assert_int_equal(hpu_attention_fused(), 0);
	h = attention_harness(1, 2, 1, 0, &l);
	assert_int_equal(l->saved_ps, 4 * AT_T * AT_D + 2 * AT_T * AT_T);
	lh_free(&h);
}

/* torch.nn.MultiheadAttention's names, shapes and initialization. */
static void test_attention_params(void **state)
{
	(void)state;
	hpu_layer *l;
	lh_harness *h = attention_harness(1, 2, 1, 0, &l);
	const hpu_builder *b = lh_builder(h);
	static const struct {
		const char *name;
		int ndim;
		int64_t rows, cols;
		hpu_init_kind init;
	} want[] = {
		{"attn.in_proj_weight", 2, 3 * AT_D, AT_D, HPU_INIT_XAVIER_UNIFORM},
		{"attn.in_proj_bias", 1, 3 * AT_D, 0, HPU_INIT_ZEROS},
		{"attn.out_proj.weight", 2, AT_D, AT_D, HPU_INIT_FAN_IN_UNIFORM},
		{"attn.out_proj.bias", 1, AT_D, 0, HPU_INIT_ZEROS},
	};
	assert_int_equal(l->npidx, 4);
	for (int k = 0; k < 4; k++) {
		const hpu_param_info *p = &b->params[l->pidx[k]];
		assert_string_equal(p->name, want[k].name);
		assert_int_equal(p->ndim, want[k].ndim);
		assert_int_equal(p->shape[0], want[k].rows);
		if (p->ndim == 2)
			assert_int_equal(p->shape[1], want[k].cols);
		assert_int_equal(p->init.kind, want[k].init);
	}
	/* xavier: U(+-sqrt(6 / (D + 3D))); Linear's: U(+-1/sqrt(D)) */
	double bound[2] = {sqrt(6.0 / (4 * AT_D)), 1 / sqrt((double)AT_D)}, top[2] = {0, 0};
	for (int k = 0; k < 2; k++) {
		const float *w = hpu_param(l, 2 * k), *bias = hpu_param(l, 2 * k + 1);
		size_t n = k ? AT_D * AT_D : 3 * AT_D * AT_D, nb = k ? AT_D : 3 * AT_D;
		for (size_t i = 0; i < n; i++)
			top[k] = fmax(top[k], fabs(w[i]));
		for (size_t i = 0; i < nb; i++)
			assert_true(bias[i] == 0.0f);
		printf("  max |weight| %.4f, bound %.4f\n", top[k], bound[k]);
		assert_true(top[k] <= bound[k] && top[k] > 0.8 * bound[k]);
	}
	lh_free(&h);
}

/* ---- declarations ---- */

/* The last declaration failed with an error naming the layer and `part`,
 * and added no layer. */
static void expect_refused(lh_harness *h, hpu_layer *l, int nlayers, const char *name,
			   const char *part)
{
	const char *e = lh_error(h);
	printf("  %s: %s\n", name, e);
	assert_null(l);
	expect_contains(name, e, name);
	expect_contains(name, e, part);
	assert_int_equal(lh_builder(h)->nlayers, nlayers);
	lh_clear_error(h);
}

static void test_declaration_errors(void **state)
{
	(void)state;
	hpu_field f[] = {{"x", HPU_F32, 2, {4, 8}}, {"ids", HPU_I32, 1, {4}},
			 {"m", HPU_I32, 1, {4}}, {"m5", HPU_I32, 1, {5}},
			 {"v", HPU_F32, 4, {2, 2, 2, 2}}, {"s", HPU_F32, 0, {0}},
			 {"fm", HPU_F32, 1, {4}}, {"big", HPU_I32, 4, {1, 1, 1, 2}}};
	lh_harness *h = harness(2, 8, f);
	hpu_builder *b = lh_builder(h);
	lh_clear_error(h);
	expect_refused(h, hpu_layernorm(b, "ln1", "ids", "o", (hpu_layernorm_opts){.eps = 1e-5f}), 0, "ln1", "must be f32");
	expect_refused(h, hpu_layernorm(b, "ln2", "nope", "o", (hpu_layernorm_opts){.eps = 1e-5f}), 0, "ln2",
		       "nope is not a tensor declared before it");
	/* a space after the list's comma: said, the name quoted (it read
	 * "input  x is not a tensor", the space invisible) */
	expect_refused(h, hpu_add(b, "sp", "x, x", "o"), 0, "sp",
		       "input \" x\" is not a tensor declared before it: it has a space (names in a "
		       "list are separated by ',' alone)");
	expect_refused(h, hpu_layernorm(b, "ln3", "x", "o", (hpu_layernorm_opts){.eps = -1}), 0, "ln3", "eps");
	expect_refused(h, hpu_layernorm(b, "ln4", "x", "o", (hpu_layernorm_opts){.eps = NAN}), 0, "ln4", "eps");
	expect_refused(h, hpu_layernorm(b, "ln5", "s", "o", (hpu_layernorm_opts){.eps = 1e-5f}), 0, "ln5", "last dimension");
	expect_refused(h, hpu_layernorm(b, "ln6", NULL, "o", (hpu_layernorm_opts){.eps = 1e-5f}), 0, "ln6", "(null)");
	expect_refused(h, hpu_batchnorm(b, "bn1", "v", "o", (hpu_batchnorm_opts){.eps = 1e-5f, .momentum = 0.1f, .sync = HPU_BUFFER_MEAN}), 0,
		       "bn1", "[C], [C, L] or [C, H, W]");
	expect_refused(h, hpu_batchnorm(b, "bn2", "s", "o", (hpu_batchnorm_opts){.eps = 1e-5f, .momentum = 0.1f, .sync = HPU_BUFFER_MEAN}), 0,
		       "bn2", "[C], [C, L] or [C, H, W]");
	expect_refused(h, hpu_batchnorm(b, "bn3", "x", "o", (hpu_batchnorm_opts){.eps = 1e-5f, .momentum = 1.5f, .sync = HPU_BUFFER_MEAN}), 0,
		       "bn3", "momentum 1.5 must be in [0, 1] (0: the default, 0.1)");
	expect_refused(h, hpu_batchnorm(b, "bn4", "x", "o", (hpu_batchnorm_opts){.eps = 1e-5f, .momentum = 0.1f, .sync = (hpu_buffer_sync)7}), 0,
		       "bn4", "sync 7");
	expect_refused(h, hpu_batchnorm(b, "bn5", "m", "o", (hpu_batchnorm_opts){.eps = 1e-5f, .momentum = 0.1f, .sync = HPU_BUFFER_MEAN}), 0,
		       "bn5", "must be f32");
	expect_refused(h, hpu_embedding(b, "e1", "x", "o", (hpu_embedding_opts){.vocab = 10, .dim = 4}), 0, "e1", "must be i32");
	expect_refused(h, hpu_embedding(b, "e2", "ids", "o", (hpu_embedding_opts){.vocab = 0, .dim = 4}), 0, "e2", "vocab 0");
	expect_refused(h, hpu_embedding(b, "e3", "ids", "o", (hpu_embedding_opts){.vocab = 10, .dim = -1}), 0, "e3", "dim -1");
	expect_refused(h, hpu_embedding(b, "e4", "big", "o", (hpu_embedding_opts){.vocab = 10, .dim = 4}), 0, "e4",
		       "at most 4");
	expect_refused(h, hpu_attention(b, "a1", "x", "o", (hpu_attention_opts){.heads = 3}), 0, "a1",
		       "heads must be at least 1 and divide the model dimension 8, is 3");
	expect_refused(h, hpu_attention(b, "a2", "x", "o", (hpu_attention_opts){.heads = 0}), 0, "a2", "is 0");
	expect_refused(h, hpu_attention(b, "a3", "x,m5", "o", (hpu_attention_opts){.heads = 2}), 0, "a3",
		       "key mask m5 must be i32 [4]");
	expect_refused(h, hpu_attention(b, "a4", "x,fm", "o", (hpu_attention_opts){.heads = 2}), 0, "a4",
		       "key mask fm must be i32 [4]");
	expect_refused(h, hpu_attention(b, "a5", "x,m,m", "o", (hpu_attention_opts){.heads = 2}), 0, "a5",
		       "must be \"x\" or \"x,mask\"");
	expect_refused(h, hpu_attention(b, "a6", "x,", "o", (hpu_attention_opts){.heads = 2}), 0, "a6",
		       "must be \"x\" or \"x,mask\"");
	expect_refused(h, hpu_attention(b, "a7", "ids", "o", (hpu_attention_opts){.heads = 2}), 0, "a7", "must be f32");
	expect_refused(h, hpu_attention(b, "a8", "fm", "o", (hpu_attention_opts){.heads = 2}), 0, "a8", "[T, D]");
	expect_refused(h, hpu_attention(b, "a9", "x,nope", "o", (hpu_attention_opts){.heads = 2}), 0, "a9",
		       "key mask nope is not a tensor");
	/* the builder's own checks, after the layer is added */
	assert_non_null(hpu_layernorm(b, "ok1", "x", "xn", (hpu_layernorm_opts){.eps = 1e-5f}));
	assert_null(hpu_layernorm(b, "ok1", "x", "xn2", (hpu_layernorm_opts){.eps = 1e-5f}));
	expect_contains("twice", lh_error(h), "declared twice");
	lh_clear_error(h);
	assert_null(hpu_embedding(b, "e5", "ids", "xn", (hpu_embedding_opts){.vocab = 10, .dim = 4}));
	expect_contains("output taken", lh_error(h), "xn is declared twice");
	lh_clear_error(h);
	/* and valid ones */
	assert_non_null(hpu_attention(b, "ok2", "x,m", "att", (hpu_attention_opts){.heads = 2, .causal = true}));
	assert_non_null(hpu_batchnorm(b, "ok3", "x", "bn", (hpu_batchnorm_opts){.eps = 1e-5f, .momentum = 0.1f, .sync = HPU_BUFFER_LOCAL}));
	assert_string_equal(lh_error(h), "");
	const hpu_buffer_info *bi = &b->buffers[b->nbuffers - 2];
	assert_string_equal(bi[0].name, "ok3.running_mean");
	assert_string_equal(bi[1].name, "ok3.running_var");
	assert_int_equal(bi[0].init.kind, HPU_INIT_ZEROS);
	assert_int_equal(bi[1].init.kind, HPU_INIT_ONES);
	assert_int_equal(bi[0].sync, HPU_BUFFER_LOCAL);
	lh_free(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_layernorm_torch),
	    cmocka_unit_test(test_layernorm_gradcheck),
	    cmocka_unit_test(test_batchnorm_torch),
	    cmocka_unit_test(test_batchnorm_running_stats),
	    cmocka_unit_test(test_batchnorm_gradcheck),
	    cmocka_unit_test(test_batchnorm_one_value),
	    cmocka_unit_test(test_embedding_torch),
	    cmocka_unit_test(test_embedding_shapes),
	    cmocka_unit_test(test_param_init),
	    cmocka_unit_test(test_embedding_bad_id),
	    cmocka_unit_test(test_embedding_init),
	    cmocka_unit_test(test_attention_torch),
	    cmocka_unit_test(test_attention_gradcheck),
	    cmocka_unit_test(test_attention_fully_masked),
	    cmocka_unit_test(test_attention_bad_mask),
	    cmocka_unit_test(test_attention_params),
	    cmocka_unit_test(test_attention_fused),
	    cmocka_unit_test(test_declaration_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
