/* Unit tests for the shape, sequence and binary-loss layers
 * (worker/layers/shape.c, seq1d.c, bce.c), driven in-process by
 * layer_harness: reduce (sum, mean, max), reshape, slice, concat,
 * permute, transpose, conv1d, conv2d_rect, max / average pooling along
 * one dimension, sigmoid, BCE with logits and of probabilities.
 *
 * Per layer: the PyTorch references of tests/fixtures/refs/c_*.ref
 * (tests/fixtures/torch_layers_c.py) to 1e-5 relative (output, input and
 * parameter gradients), central finite-difference checks of the
 * gradients (which also check that backward overwrites din and
 * accumulates into the parameter gradients), and declaration errors
 * (NULL and a message naming the layer and what was wrong).
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

#include <hpu/hpu.h>
#include <hpu/layers.h>
#include <hpu/ops.h>

#include "tests/unit/layer_harness.h"
#include "tests/unit/layer_testlib.h"

/* ---- helpers ---- */

static void shape_is(lh_harness *h, const char *t, int ndim, const int64_t *want)
{
	hpu_tensor y = lh_tensor(h, t, 0, NULL);
	assert_int_equal(y.ndim, ndim);
	for (int i = 0; i < ndim; i++)
		assert_int_equal(y.shape[i], want[i]);
}

/* n distinct values 0.05 apart, shuffled: no two within a finite
 * difference of each other, so max's arg-max does not move. */
static float *spaced(size_t n, uint64_t seed)
{
	float *x = malloc(n * sizeof *x);
	assert_non_null(x);
	for (size_t i = 0; i < n; i++)
		x[i] = 0.05f * (float)i - 0.025f * (float)n;
	lt_shuffle(x, n, seed);
	return x;
}

/* ---- PyTorch references ---- */

static const int32_t *ints(const lh_ref *r, const char *name, size_t want)
{
	size_t n;
	const int32_t *v = lh_ref_get(r, name, HPU_I32, &n, NULL, NULL);
	assert_non_null(v);
	assert_int_equal(n, want);
	return v;
}

static hpu_layer *ref_reduce(hpu_builder *b, const lh_ref *r)
{
	return hpu_reduce(b, "red", "x", "y", (hpu_reduce_opts){.dim = lh_ref_int(r, "dim", 99), .op = (hpu_reduce_op)lh_ref_int(r, "op", -1)});
}

static hpu_layer *ref_reshape(hpu_builder *b, const lh_ref *r)
{
	const int32_t *s = ints(r, "shape", 3);
	return hpu_reshape(b, "view", "x", "y",
			   (hpu_reshape_opts){.ndim = 3, .shape = {s[0], s[1], s[2]}});
}

static hpu_layer *ref_slice(hpu_builder *b, const lh_ref *r)
{
	return hpu_slice(b, "cut", "x", "y", (hpu_slice_opts){.dim = lh_ref_int(r, "dim", 99), .start = lh_ref_int(r, "start", -1), .len = lh_ref_int(r, "len", -1)});
}

static hpu_layer *ref_concat(hpu_builder *b, const lh_ref *r)
{
	return hpu_concat(b, "cat", "a,b", "y", (hpu_concat_opts){.dim = lh_ref_int(r, "dim", 99)});
}

static hpu_layer *ref_permute(hpu_builder *b, const lh_ref *r)
{
	const int32_t *p = ints(r, "perm", 3);
	return hpu_permute(b, "perm", "x", "y",
			   (hpu_permute_opts){.ndim = 3, .perm = {p[0], p[1], p[2]}});
}

static hpu_layer *ref_transpose(hpu_builder *b, const lh_ref *r)
{
	return hpu_transpose(b, "tr", "x", "y", (hpu_transpose_opts){.dim0 = lh_ref_int(r, "dim0", 99), .dim1 = lh_ref_int(r, "dim1", 99)});
}

static hpu_layer *ref_conv1d(hpu_builder *b, const lh_ref *r)
{
	return hpu_conv1d(b, "conv", "x", "y", (hpu_conv1d_opts){.out = lh_ref_int(r, "out_ch", 0), .kernel = lh_ref_int(r, "kernel", 0), .stride = lh_ref_int(r, "stride", 0), .pad = lh_ref_int(r, "pad", -1), .bias = true});
}

static hpu_layer *ref_conv2d_rect(hpu_builder *b, const lh_ref *r)
{
	const int32_t *k = ints(r, "kernel", 2), *s = ints(r, "stride", 2), *p = ints(r, "pad", 2);
	return hpu_conv2d_rect(b, "conv", "x", "y",
			       (hpu_conv2d_rect_opts){.out = lh_ref_int(r, "out_ch", 0),
						      .kernel = {k[0], k[1]}, .stride = {s[0], s[1]},
						      .pad = {p[0], p[1]}, .bias = true});
}

static hpu_layer *ref_maxpool1d(hpu_builder *b, const lh_ref *r)
{
	return hpu_maxpool1d(b, "pool", "x", "y", (hpu_pool1d_opts){.dim = lh_ref_int(r, "dim", 99), .kernel = lh_ref_int(r, "kernel", 0), .stride = lh_ref_int(r, "stride", 0)});
}

static hpu_layer *ref_avgpool1d(hpu_builder *b, const lh_ref *r)
{
	return hpu_avgpool1d(b, "pool", "x", "y", (hpu_pool1d_opts){.dim = lh_ref_int(r, "dim", 99), .kernel = lh_ref_int(r, "kernel", 0), .stride = lh_ref_int(r, "stride", 0)});
}

static hpu_layer *ref_sigmoid(hpu_builder *b, const lh_ref *r)
{
	(void)r;
	return hpu_sigmoid(b, "act", "x", "y");
}

static hpu_layer *ref_bce_logits(hpu_builder *b, const lh_ref *r)
{
	(void)r;
	return hpu_bce_with_logits(b, "loss", "logits,target", "y");
}

static hpu_layer *ref_bce(hpu_builder *b, const lh_ref *r)
{
	(void)r;
	return hpu_binary_cross_entropy(b, "loss", "prob,target", "y");
}

static void test_torch_references(void **state)
{
	(void)state;
	static const lt_ref_case cases[] = {
		{"c_reduce_sum.ref", 1, {"x"}, {"dx"}, ref_reduce},
		{"c_reduce_mean.ref", 1, {"x"}, {"dx"}, ref_reduce},
		{"c_reduce_max.ref", 1, {"x"}, {"dx"}, ref_reduce},
		{"c_reshape.ref", 1, {"x"}, {"dx"}, ref_reshape},
		{"c_slice.ref", 1, {"x"}, {"dx"}, ref_slice},
		{"c_concat.ref", 2, {"a", "b"}, {"da", "db"}, ref_concat},
		{"c_permute.ref", 1, {"x"}, {"dx"}, ref_permute},
		{"c_transpose.ref", 1, {"x"}, {"dx"}, ref_transpose},
		{"c_conv1d.ref", 1, {"x"}, {"dx"}, ref_conv1d},
		{"c_conv2d_rect.ref", 1, {"x"}, {"dx"}, ref_conv2d_rect},
		{"c_maxpool1d.ref", 1, {"x"}, {"dx"}, ref_maxpool1d},
		{"c_avgpool1d.ref", 1, {"x"}, {"dx"}, ref_avgpool1d},
		{"c_maxpool1d_h.ref", 1, {"x"}, {"dx"}, ref_maxpool1d},
		{"c_sigmoid.ref", 1, {"x"}, {"dx"}, ref_sigmoid},
		{"c_bce_logits.ref", 2, {"logits", "target"}, {"dlogits", "dtarget"}, ref_bce_logits},
		{"c_bce.ref", 2, {"prob", "target"}, {"dprob", "dtarget"}, ref_bce},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		lt_run_ref(&cases[i]);
}

/* ---- finite differences ---- */

static void test_reduce(void **state)
{
	(void)state;
	int64_t shape[3] = {3, 4, 2};
	for (int op = HPU_REDUCE_SUM; op <= HPU_REDUCE_MAX; op++)
		for (int dim = -3; dim < 3; dim++) {
			lh_harness *h = lt_harness_x(2, 3, shape);
			hpu_layer *l = hpu_reduce(lh_builder(h), "red", "x", "y", (hpu_reduce_opts){.dim = dim, .op = (hpu_reduce_op)op});
			assert_non_null(l);
			int d = dim < 0 ? dim + 3 : dim;
			int64_t want[2];
			for (int i = 0, k = 0; i < 3; i++)
				if (i != d)
					want[k++] = shape[i];
			shape_is(h, "y", 2, want);
			assert_int_equal(lh_alloc(h, 2), 0);
			float *x = spaced(2 * 24, (uint64_t)(op * 7 + dim + 3));
			void *in[1] = {x};
			lt_gradcheck_ok(h, l, 2, in, NULL);
			free(x);
			lh_free(&h);
		}
	/* a 1-D input reduces to one value a sample */
	int64_t n = 5;
	lh_harness *h = lt_harness_x(2, 1, &n);
	assert_non_null(hpu_reduce(lh_builder(h), "red", "x", "y", (hpu_reduce_opts){.dim = 0, .op = HPU_REDUCE_MEAN}));
	shape_is(h, "y", 0, NULL);
	lh_free(&h);
}

static void test_copies(void **state)
{
	(void)state;
	int64_t shape[3] = {2, 3, 4};
	int64_t pshape[3] = {3, 4, 2}, vshape[2] = {4, 6};
	lh_harness *h = lt_harness_x(3, 3, shape);
	hpu_builder *b = lh_builder(h);
	hpu_layer *ls[4] = {
		hpu_reshape(b, "view", "x", "v", (hpu_reshape_opts){.ndim = 2, .shape = {-1, 6}}),
		hpu_slice(b, "cut", "x", "s", (hpu_slice_opts){.dim = -1, .start = 1, .len = 2}),
		hpu_permute(b, "perm", "x", "p", (hpu_permute_opts){.ndim = 3, .perm = {1, 2, 0}}),
		hpu_transpose(b, "tr", "x", "t", (hpu_transpose_opts){.dim0 = 0, .dim1 = 2}),
	};
	for (int i = 0; i < 4; i++)
		assert_non_null(ls[i]);
	shape_is(h, "v", 2, vshape);
	shape_is(h, "p", 3, pshape);
	int64_t sshape[3] = {2, 3, 2}, tshape[3] = {4, 3, 2};
	shape_is(h, "s", 3, sshape);
	shape_is(h, "t", 3, tshape);
	assert_int_equal(lh_alloc(h, 3), 0);
	for (int i = 0; i < 4; i++)
		lt_gradcheck_ok(h, ls[i], 3, NULL, NULL);
	lh_free(&h);
}

static void test_concat(void **state)
{
	(void)state;
	int64_t sa[2] = {2, 3}, sb[2] = {2, 1}, sc[2] = {2, 2};
	hpu_field f[3] = {lt_field("a", 2, sa), lt_field("b", 2, sb), lt_field("c", 2, sc)};
	lh_harness *h = lt_harness(2, 3, f);
	hpu_layer *l = hpu_concat(lh_builder(h), "cat", "a,b,c", "y", (hpu_concat_opts){.dim = 1});
	assert_non_null(l);
	int64_t want[2] = {2, 6};
	shape_is(h, "y", 2, want);
	assert_int_equal(lh_alloc(h, 4), 0);
	/* values: a sample's row 0 is a0 a1 a2 b0 c0 c1 */
	float a[12], bv[4], c[8], y[24];
	for (int i = 0; i < 12; i++)
		a[i] = (float)i;
	for (int i = 0; i < 4; i++)
		bv[i] = 100.0f + (float)i;
	for (int i = 0; i < 8; i++)
		c[i] = 200.0f + (float)i;
	void *in[3] = {a, bv, c}, *out[1] = {y};
	hpu_ctx ctx = lh_ctx(h, l, 1, 0, 2);
	assert_int_equal(lh_forward(h, l, &ctx, in, out), 0);
	const float row0[6] = {0, 1, 2, 100, 200, 201}, row3[6] = {9, 10, 11, 103, 206, 207};
	assert_memory_equal(y, row0, sizeof row0);
	assert_memory_equal(y + 18, row3, sizeof row3);
	lt_gradcheck_ok(h, l, 2, NULL, NULL);
	lh_free(&h);
}

static void test_conv_gradients(void **state)
{
	(void)state;
	int64_t s1[2] = {3, 9}, s2[3] = {2, 6, 7};
	for (int bias = 0; bias <= 1; bias++) {
		hpu_field f[2] = {lt_field("x", 2, s1), lt_field("z", 3, s2)};
		lh_harness *h = lt_harness(2, 2, f);
		hpu_layer *c1 = hpu_conv1d(lh_builder(h), "c1", "x", "y1", (hpu_conv1d_opts){.out = 4, .kernel = 3, .stride = 2, .pad = 1, .bias = bias});
		hpu_layer *c2 = hpu_conv2d_rect(lh_builder(h), "c2", "z", "y2",
						(hpu_conv2d_rect_opts){.out = 3, .kernel = {3, 2}, .stride = {1, 2}, .pad = {0, 1}, .bias = bias});
		assert_non_null(c1);
		assert_non_null(c2);
		int64_t w1[2] = {4, 5}, w2[3] = {3, 4, 4};
		shape_is(h, "y1", 2, w1);
		shape_is(h, "y2", 3, w2);
		assert_int_equal(lh_alloc(h, 5), 0);
		lt_gradcheck_ok(h, c1, 2, NULL, NULL);
		lt_gradcheck_ok(h, c2, 2, NULL, NULL);
		lh_free(&h);
	}
}

static void test_pool1d_gradients(void **state)
{
	(void)state;
	int64_t shape[3] = {2, 7, 5};
	for (int dim = 0; dim < 3; dim++) {
		lh_harness *h = lt_harness_x(2, 3, shape);
		hpu_layer *mx = hpu_maxpool1d(lh_builder(h), "mx", "x", "m", (hpu_pool1d_opts){.dim = dim, .kernel = 2, .stride = 1});
		hpu_layer *av = hpu_avgpool1d(lh_builder(h), "av", "x", "a", (hpu_pool1d_opts){.dim = dim, .kernel = 2, .stride = 2});
		assert_non_null(mx);
		assert_non_null(av);
		assert_int_equal(lh_alloc(h, 6), 0);
		float *x = spaced(2 * 70, (uint64_t)dim + 11);
		void *in[1] = {x};
		lt_gradcheck_ok(h, mx, 2, in, NULL);
		lt_gradcheck_ok(h, av, 2, NULL, NULL);
		free(x);
		lh_free(&h);
	}
}

static void test_binary_gradients(void **state)
{
	(void)state;
	int64_t shape[2] = {2, 3};
	hpu_field f[2] = {lt_field("x", 2, shape), lt_field("t", 2, shape)};
	lh_harness *h = lt_harness(3, 2, f);
	hpu_builder *b = lh_builder(h);
	hpu_layer *sg = hpu_sigmoid(b, "sg", "x", "p");
	hpu_layer *bl = hpu_bce_with_logits(b, "bl", "x,t", "l1");
	hpu_layer *bp = hpu_binary_cross_entropy(b, "bp", "x,t", "l2");
	assert_non_null(sg);
	assert_non_null(bl);
	assert_non_null(bp);
	shape_is(h, "l1", 0, NULL);
	assert_int_equal(lh_alloc(h, 7), 0);
	lh_check_opts wide = {.lo = -4, .hi = 4}, unit = {.lo = 0.1f, .hi = 0.9f, .eps = 1e-3};
	lt_gradcheck_ok(h, sg, 3, NULL, &wide);
	lt_gradcheck_ok(h, bl, 3, NULL, &wide);
	lt_gradcheck_ok(h, bp, 3, NULL, &unit);
	lh_free(&h);
}

/* ---- ops ---- */

static double maxrel(const float *got, const float *want, size_t n)
{
	return lh_maxrel(got, want, n, 1e-6);
}

/* The rectangular op with equal sizes per axis computes what the square
 * op (hpu_conv2d_*, oneDNN's) does: forward, dx, dw and db. */
static void test_conv_rect_equals_square(void **state)
{
	(void)state;
	const hpu_conv2d_shape sq = {2, 3, 7, 6, 4, 3, 2, 1};
	const hpu_conv2d_rect_shape re = {2, 3, 7, 6, 4, 3, 3, 2, 2, 1, 1};
	assert_int_equal(hpu_conv2d_rect_out_h(&re), hpu_conv2d_out_h(&sq));
	assert_int_equal(hpu_conv2d_rect_out_w(&re), hpu_conv2d_out_w(&sq));
	size_t nx = 2 * 3 * 7 * 6, nw = 4 * 3 * 3 * 3;
	size_t ny = 2 * 4 * (size_t)hpu_conv2d_out_h(&sq) * (size_t)hpu_conv2d_out_w(&sq);
	size_t ns = hpu_conv2d_scratch(&sq) > hpu_conv2d_rect_scratch(&re)
			    ? hpu_conv2d_scratch(&sq) : hpu_conv2d_rect_scratch(&re);
	float *x = lt_alloc_f(nx), *w = lt_alloc_f(nw), *bias = lt_alloc_f(4), *dy = lt_alloc_f(ny);
	float *y[2], *dx[2], *dw[2], *db[2], *scratch = lt_alloc_f(ns);
	uint64_t seed = 42;
	lh_fill(x, nx, -1, 1, &seed);
	lh_fill(w, nw, -1, 1, &seed);
	lh_fill(bias, 4, -1, 1, &seed);
	lh_fill(dy, ny, -1, 1, &seed);
	for (int k = 0; k < 2; k++) {
		y[k] = lt_alloc_f(ny), dx[k] = lt_alloc_f(nx), dw[k] = lt_alloc_f(nw), db[k] = lt_alloc_f(4);
		if (k == 0) {
			hpu_conv2d_forward(&sq, x, w, bias, y[k], scratch);
			hpu_conv2d_backward(&sq, x, w, dy, dx[k], dw[k], db[k], scratch);
		} else {
			hpu_conv2d_rect_forward(&re, x, w, bias, y[k], scratch);
			hpu_conv2d_rect_backward(&re, x, w, dy, dx[k], dw[k], db[k], scratch);
		}
	}
	double d[4] = {maxrel(y[1], y[0], ny), maxrel(dx[1], dx[0], nx), maxrel(dw[1], dw[0], nw),
		       maxrel(db[1], db[0], 4)};
	printf("  rect vs square: y %.3g, dx %.3g, dw %.3g, db %.3g\n", d[0], d[1], d[2], d[3]);
	for (int i = 0; i < 4; i++)
		assert_true(d[i] <= 1e-5);
	for (int k = 0; k < 2; k++)
		free(y[k]), free(dx[k]), free(dw[k]), free(db[k]);
	free(x), free(w), free(bias), free(dy), free(scratch);
}

/* A permutation of 5 dimensions against index arithmetic, and back. */
static void test_permute_op(void **state)
{
	(void)state;
	const int64_t shape[5] = {2, 3, 1, 4, 5};
	const int perm[5] = {3, 0, 4, 2, 1}, inv[5] = {1, 4, 3, 0, 2};
	float x[120], y[120], back[120];
	for (int i = 0; i < 120; i++)
		x[i] = (float)i;
	hpu_permute_forward(x, y, 5, shape, perm);
	int64_t ys[5];
	for (int d = 0; d < 5; d++)
		ys[d] = shape[perm[d]];
	int i = 0;
	for (int a = 0; a < ys[0]; a++)
		for (int b = 0; b < ys[1]; b++)
			for (int c = 0; c < ys[2]; c++)
				for (int d = 0; d < ys[3]; d++)
					for (int e = 0; e < ys[4]; e++, i++) {
						int at[5]; /* x's index: at[perm[k]] = y's k-th */
						at[perm[0]] = a, at[perm[1]] = b, at[perm[2]] = c;
						at[perm[3]] = d, at[perm[4]] = e;
						int off = (((at[0] * 3 + at[1]) * 1 + at[2]) * 4 + at[3]) * 5 +
							  at[4];
						assert_true(y[i] == x[off]);
					}
	hpu_permute_forward(y, back, 5, ys, inv);
	assert_memory_equal(back, x, sizeof x);
}

/* ---- errors ---- */

static void test_refused(void **state)
{
	(void)state;
	int64_t shape[3] = {2, 3, 4}, other[3] = {2, 5, 3};
	hpu_field f[2] = {lt_field("x", 3, shape), lt_field("w", 3, other)};
	lh_harness *h = lt_harness(2, 2, f);
	hpu_builder *b = lh_builder(h);
	lt_refused(h, hpu_reduce(b, "r", "x", "y", (hpu_reduce_opts){.dim = 3, .op = HPU_REDUCE_SUM}), "layer r", "dim 3");
	lt_refused(h, hpu_reduce(b, "r", "x", "y", (hpu_reduce_opts){.dim = -4, .op = HPU_REDUCE_SUM}), "layer r", "dim -4");
	lt_refused(h, hpu_reduce(b, "r", "x", "y", (hpu_reduce_opts){.dim = 0, .op = (hpu_reduce_op)7}), "layer r", "reduce op 7");
	lt_refused(h, hpu_reshape(b, "v", "x", "y", (hpu_reshape_opts){.ndim = 2, .shape = {5, -1}}), "layer v", "24 values");
	lt_refused(h, hpu_slice(b, "s", "x", "y", (hpu_slice_opts){.dim = 1, .start = 2, .len = 2}), "layer s", "is not inside it");
	lt_refused(h, hpu_concat(b, "c", "x,w", "y", (hpu_concat_opts){.dim = 0}), "layer c", "differs from x's");
	lt_refused(h, hpu_concat(b, "c", "x", "y", (hpu_concat_opts){.dim = 0}), "layer c", "2 to 8 inputs");
	lt_refused(h, hpu_permute(b, "p", "x", "y", (hpu_permute_opts){.ndim = 3, .perm = {0, 0, 1}}), "layer p", "once");
	lt_refused(h, hpu_conv1d(b, "c1", "x", "y", (hpu_conv1d_opts){.out = 2, .kernel = 3, .stride = 1, .pad = 0, .bias = true}), "layer c1", "needs [C, T]");
	lt_refused(h, hpu_conv2d_rect(b, "c2", "x", "y",
				   (hpu_conv2d_rect_opts){.out = 2, .kernel = {4, 1}, .stride = {1, 1}, .bias = true}), "layer c2", "along H");
	lt_refused(h, hpu_maxpool1d(b, "m", "x", "y", (hpu_pool1d_opts){.dim = 1, .kernel = 4, .stride = 1}), "layer m", "kernel 4");
	lt_refused(h, hpu_bce_with_logits(b, "l", "x,w", "y"), "layer l", "differ in shape");
	lh_free(&h);
}

/* A probability outside [0, 1] fails the forward naming it. */
static void test_bce_bad_probability(void **state)
{
	(void)state;
	int64_t n = 2;
	hpu_field f[2] = {lt_field("p", 1, &n), lt_field("t", 1, &n)};
	lh_harness *h = lt_harness(2, 2, f);
	hpu_layer *l = hpu_binary_cross_entropy(lh_builder(h), "loss", "p,t", "y");
	assert_non_null(l);
	assert_int_equal(lh_alloc(h, 1), 0);
	float pv[4] = {0.5f, 0.25f, 1.5f, 0.0f}, tv[4] = {1, 0, 1, 0}, y[2];
	void *in[2] = {pv, tv}, *out[1] = {y};
	hpu_ctx c = lh_ctx(h, l, 1, 0, 2);
	assert_int_not_equal(lh_forward(h, l, &c, in, out), 0);
	printf("  %s\n", lh_layer_error(l));
	assert_non_null(strstr(lh_layer_error(l), "layer loss: probability 1.5 at row 1 (dataset sample 1), "
				    "element 0 is outside [0, 1]"));
	lh_free(&h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_torch_references),
		cmocka_unit_test(test_reduce),
		cmocka_unit_test(test_copies),
		cmocka_unit_test(test_concat),
		cmocka_unit_test(test_conv_gradients),
		cmocka_unit_test(test_pool1d_gradients),
		cmocka_unit_test(test_binary_gradients),
		cmocka_unit_test(test_conv_rect_equals_square),
		cmocka_unit_test(test_permute_op),
		cmocka_unit_test(test_refused),
		cmocka_unit_test(test_bce_bad_probability),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
