/* Unit tests for the hpu ops (worker/ops/ops.c).
 *
 * Each op is compared with a naive double-precision reference: forward
 * values directly, gradients against central finite differences of that
 * reference taken in double (eps 1e-6, so the differences themselves are
 * good to ~1e-9 and the tolerance only has to cover the op's fp32 rounding).
 * One more test takes finite differences through the fp32 ops themselves,
 * chained as the training loop chains them. Every comparison prints its
 * largest absolute difference (maxdiff) and its tolerance.
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

#include "tests/unit/num_testlib.h"

#include "hpu/ops.h"

#define FD_EPS 1e-6 /* central-difference step on the double references */

/* ---- helpers ---- */

/* Largest |got - want|; NaN anywhere counts as infinitely far. */
static double maxdiff(const float *got, const double *want, size_t n)
{
	double m = 0.0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		if (!(d <= m)) /* also catches NaN */
			m = isnan(d) ? INFINITY : d;
	}
	return m;
}

/* Prints maxdiff and fails the test if it exceeds tol. */
static void check_close(const char *what, const float *got, const double *want,
			size_t n, double tol)
{
	double m = maxdiff(got, want, n);
	printf("  %-34s maxdiff %.3g (tol %.1g)%s\n", what, m, tol,
	       m <= tol ? "" : "  FAIL");
	assert_true(m <= tol);
}

/* ---- double references ---- */

/* y[B,out] = x[B,in] * w[out,in]^T + b[out] */
static void ref_linear(const double *x, const double *w, const double *b,
		       double *y, int batch, int in, int out)
{
	for (int i = 0; i < batch; i++)
		for (int o = 0; o < out; o++) {
			double s = b ? b[o] : 0.0;
			for (int k = 0; k < in; k++)
				s += x[i * in + k] * w[o * in + k];
			y[i * out + o] = s;
		}
}

/* L = sum(linear(x, w, b) * r): dL/dy = r. */
static double ref_linear_obj(const double *x, const double *w, const double *b,
			     const double *r, int batch, int in, int out)
{
	double *y = xcalloc((size_t)batch * out, sizeof(*y));
	ref_linear(x, w, b, y, batch, in, out);
	double s = 0.0;
	for (int k = 0; k < batch * out; k++)
		s += y[k] * r[k];
	free(y);
	return s;
}

/* Mean softmax cross-entropy, computed the textbook way in double. */
static double ref_xent(const double *z, const int32_t *labels, int batch,
		       int classes)
{
	double loss = 0.0;
	for (int i = 0; i < batch; i++) {
		double sum = 0.0;
		for (int c = 0; c < classes; c++)
			sum += exp(z[i * classes + c]);
		loss += log(sum) - z[i * classes + labels[i]];
	}
	return loss / batch;
}

/* ---- linear ---- */

static void check_linear_forward(int batch, int in, int out, int with_bias)
{
	size_t nx = (size_t)batch * in, nw = (size_t)out * in;
	size_t ny = (size_t)batch * out;
	float *x = xcalloc(nx, sizeof(*x)), *w = xcalloc(nw, sizeof(*w));
	float *b = xcalloc(out, sizeof(*b)), *y = xcalloc(ny, sizeof(*y));
	/* x like pixels or relu outputs, w and b like torch's init */
	fill(x, nx, 0.0f, 1.0f);
	float bound = 1.0f / sqrtf((float)in);
	fill(w, nw, -bound, bound);
	fill(b, out, -bound, bound);
	fill_nan(y, ny); /* y is output only, even with no bias (beta = 0) */

	hpu_linear_forward(x, w, with_bias ? b : NULL, y, batch, in, out);

	double *xd = to_double(x, nx), *wd = to_double(w, nw);
	double *bd = to_double(b, out);
	double *yd = xcalloc(ny, sizeof(*yd));
	ref_linear(xd, wd, with_bias ? bd : NULL, yd, batch, in, out);
	char what[64];
	snprintf(what, sizeof(what), "linear fwd %dx%d->%d%s", batch, in, out,
		 with_bias ? "" : " no bias");
	/* |y| <= ~1; fp32 sums of `in` products: ~in * 6e-8 worst case */
	check_close(what, y, yd, ny, 1e-5 + in * 1e-7);
	free(x), free(w), free(b), free(y);
	free(xd), free(wd), free(bd), free(yd);
}

static void test_linear_forward(void **state)
{
	(void)state;
	rng_seed(1);
	check_linear_forward(3, 5, 4, 1);
	check_linear_forward(3, 5, 4, 0);
	check_linear_forward(17, 33, 9, 1);
	check_linear_forward(128, 784, 1024, 1); /* the benchmark's layer 1 */
}

/* Central differences of L = sum(y * r) w.r.t. every element of a, where a
 * is one of x, w, b (the others held fixed). */
static void fd_linear(double *a, size_t n, double *grad, const double *x,
		      const double *w, const double *b, const double *r,
		      int batch, int in, int out)
{
	for (size_t k = 0; k < n; k++) {
		double keep = a[k];
		a[k] = keep + FD_EPS;
		double lp = ref_linear_obj(x, w, b, r, batch, in, out);
		a[k] = keep - FD_EPS;
		double lm = ref_linear_obj(x, w, b, r, batch, in, out);
		a[k] = keep;
		grad[k] = (lp - lm) / (2 * FD_EPS);
	}
}

static void test_linear_backward_fd(void **state)
{
	(void)state;
	const int batch = 3, in = 5, out = 4;
	const size_t nx = batch * in, nw = out * in, ny = batch * out;
	float x[3 * 5], w[4 * 5], b[4], r[3 * 4];
	float dx[3 * 5], dw[4 * 5] = {0}, db[4] = {0};
	rng_seed(2);
	fill(x, nx, -1, 1), fill(w, nw, -1, 1), fill(b, out, -1, 1);
	fill(r, ny, -1, 1);
	fill_nan(dx, nx); /* overwritten, never read */

	/* L = sum(y * r), so dy = r */
	hpu_linear_backward(x, w, r, dx, dw, db, batch, in, out);

	double *xd = to_double(x, nx), *wd = to_double(w, nw);
	double *bd = to_double(b, out), *rd = to_double(r, ny);
	double gx[3 * 5], gw[4 * 5], gb[4];
	fd_linear(xd, nx, gx, xd, wd, bd, rd, batch, in, out);
	fd_linear(wd, nw, gw, xd, wd, bd, rd, batch, in, out);
	fd_linear(bd, out, gb, xd, wd, bd, rd, batch, in, out);
	/* gradients are sums of <= 4 products of numbers in [-1, 1] */
	check_close("linear bwd dx vs finite diff", dx, gx, nx, 1e-5);
	check_close("linear bwd dw vs finite diff", dw, gw, nw, 1e-5);
	check_close("linear bwd db vs finite diff", db, gb, out, 1e-5);
	free(xd), free(wd), free(bd), free(rd);
}

static void test_linear_backward_accumulates(void **state)
{
	(void)state;
	const int batch = 3, in = 5, out = 4;
	const size_t nx = batch * in, nw = out * in, ny = batch * out;
	float x[3 * 5], w[4 * 5], dy[3 * 4];
	float dx1[3 * 5], dw1[4 * 5] = {0}, db1[4] = {0};
	float dx2[3 * 5], dw2[4 * 5] = {0}, db2[4] = {0};
	rng_seed(3);
	fill(x, nx, -1, 1), fill(w, nw, -1, 1), fill(dy, ny, -1, 1);

	hpu_linear_backward(x, w, dy, dx1, dw1, db1, batch, in, out);
	hpu_linear_backward(x, w, dy, dx2, dw2, db2, batch, in, out);
	fill(dx2, nx, 5, 6); /* garbage: the next call must overwrite dx */
	hpu_linear_backward(x, w, dy, dx2, dw2, db2, batch, in, out);

	double want_dw[4 * 5], want_db[4], want_dx[3 * 5];
	for (size_t k = 0; k < nw; k++)
		want_dw[k] = 2.0 * dw1[k];
	for (int k = 0; k < out; k++)
		want_db[k] = 2.0 * db1[k];
	for (size_t k = 0; k < nx; k++)
		want_dx[k] = dx1[k];
	/* Doubling is exact in fp32 only if the sums round the same way. */
	check_close("linear bwd twice: dw doubles", dw2, want_dw, nw, 1e-6);
	check_close("linear bwd twice: db doubles", db2, want_db, out, 1e-6);
	check_close("linear bwd twice: dx overwritten", dx2, want_dx, nx, 0);

	/* dx and db may be NULL; dw is still accumulated. */
	float dw3[4 * 5] = {0};
	hpu_linear_backward(x, w, dy, NULL, dw3, NULL, batch, in, out);
	double want_dw3[4 * 5];
	for (size_t k = 0; k < nw; k++)
		want_dw3[k] = dw1[k];
	check_close("linear bwd dx=NULL db=NULL: dw", dw3, want_dw3, nw, 0);
}

/* ---- relu ---- */

static void test_relu(void **state)
{
	(void)state;
	enum { N = 16 };
	float x[N], y[N], dy[N], dx[N];
	rng_seed(4);
	fill(x, N, -1, 1), fill(dy, N, -1, 1);
	/* keep finite differences away from the kink */
	for (int i = 0; i < N; i++)
		if (fabsf(x[i]) < 1e-3f)
			x[i] = 0.5f;

	hpu_relu_forward(x, y, N);
	hpu_relu_backward(y, dy, dx, N);

	/* L = sum(relu(x) * dy), differenced in double */
	double yd[N], g[N];
	for (int i = 0; i < N; i++) {
		double xi = x[i];
		yd[i] = xi > 0 ? xi : 0;
		double lp = fmax(xi + FD_EPS, 0) * dy[i];
		double lm = fmax(xi - FD_EPS, 0) * dy[i];
		g[i] = (lp - lm) / (2 * FD_EPS);
	}
	check_close("relu fwd", y, yd, N, 0);
	check_close("relu bwd vs finite diff", dx, g, N, 1e-8);

	/* At 0 (and -0) the output is 0 and the gradient is 0. */
	float z[3] = {0.0f, -0.0f, 2.0f}, zy[3], zdy[3] = {1, 1, 1}, zdx[3];
	hpu_relu_forward(z, zy, 3);
	hpu_relu_backward(zy, zdy, zdx, 3);
	double want_y[3] = {0, 0, 2}, want_dx[3] = {0, 0, 1};
	check_close("relu fwd at 0", zy, want_y, 3, 0);
	check_close("relu bwd at 0", zdx, want_dx, 3, 0);

	/* In place, as the header allows: y aliases x, dx aliases dy. */
	float a[N], d[N];
	memcpy(a, x, sizeof(a));
	memcpy(d, dy, sizeof(d));
	hpu_relu_forward(a, a, N);
	hpu_relu_backward(a, d, d, N);
	double want_a[N], want_d[N];
	for (int i = 0; i < N; i++)
		want_a[i] = y[i], want_d[i] = dx[i];
	check_close("relu fwd in place", a, want_a, N, 0);
	check_close("relu bwd in place", d, want_d, N, 0);
}

/* ---- softmax cross-entropy ---- */

static void test_xent_hand_computed(void **state)
{
	(void)state;
	/* Row 0: z = (1, 2, 3), label 2: -log(e^3 / (e + e^2 + e^3))
	 *        = log(1 + e^-1 + e^-2) = 0.40760596...
	 * Row 1: z = (0, 0, 0), label 1: log 3 = 1.09861229...
	 * Mean 0.75310912...; dz = (softmax - onehot) / 2. */
	const float z[6] = {1, 2, 3, 0, 0, 0};
	const int32_t labels[2] = {2, 1};
	float dz[6];
	float loss = hpu_cross_entropy_forward(z, labels, dz, 2, 3);
	double s = 1 + exp(-1.0) + exp(-2.0);
	double want_loss = 0.75310912;
	double want_dz[6] = {
	    exp(-2.0) / s / 2, exp(-1.0) / s / 2, (1 / s - 1) / 2,
	    1.0 / 3 / 2,       (1.0 / 3 - 1) / 2, 1.0 / 3 / 2,
	};
	check_close("xent hand-computed loss", &loss, &want_loss, 1, 1e-6);
	check_close("xent hand-computed dlogits", dz, want_dz, 6, 1e-7);

	/* dlogits may be NULL: the loss alone. */
	float loss2 = hpu_cross_entropy_forward(z, labels, NULL, 2, 3);
	check_close("xent loss with dlogits=NULL", &loss2, &want_loss, 1, 1e-6);

	/* Huge logits: the row max is subtracted, so nothing overflows. */
	const float big[6] = {1000, 0, -1000, 1000, 0, -1000};
	const int32_t big_labels[2] = {0, 2};
	float dbig[6];
	float big_loss = hpu_cross_entropy_forward(big, big_labels, dbig, 2, 3);
	double want_big = (0.0 + 2000.0) / 2;
	double want_dbig[6] = {0, 0, 0, 0.5, 0, -0.5};
	check_close("xent huge logits loss", &big_loss, &want_big, 1, 1e-3);
	check_close("xent huge logits dlogits", dbig, want_dbig, 6, 1e-7);
}

static void test_xent_bad_label(void **state)
{
	(void)state;
	const float z[6] = {1, 2, 3, 0, 0, 0};
	float dz[6];
	const int32_t too_big[2] = {0, 3}; /* classes = 3 */
	const int32_t negative[2] = {-1, 0};
	float l1 = hpu_cross_entropy_forward(z, too_big, dz, 2, 3);
	float l2 = hpu_cross_entropy_forward(z, negative, NULL, 2, 3);
	printf("  xent label 3 of 3 -> %g, label -1 -> %g\n", l1, l2);
	assert_true(l1 < 0);
	assert_true(l2 < 0);
	const int32_t edge[2] = {2, 0}; /* classes - 1 and 0 are valid */
	assert_true(hpu_cross_entropy_forward(z, edge, dz, 2, 3) >= 0);
}

static void test_xent_fd(void **state)
{
	(void)state;
	enum { B = 3, C = 4 };
	float z[B * C], dz[B * C];
	const int32_t labels[B] = {1, 3, 0};
	rng_seed(5);
	fill(z, B * C, -3, 3);

	float loss = hpu_cross_entropy_forward(z, labels, dz, B, C);

	double *zd = to_double(z, B * C);
	double want_loss = ref_xent(zd, labels, B, C), g[B * C];
	for (int k = 0; k < B * C; k++) {
		double keep = zd[k];
		zd[k] = keep + FD_EPS;
		double lp = ref_xent(zd, labels, B, C);
		zd[k] = keep - FD_EPS;
		double lm = ref_xent(zd, labels, B, C);
		zd[k] = keep;
		g[k] = (lp - lm) / (2 * FD_EPS);
	}
	check_close("xent loss vs reference", &loss, &want_loss, 1, 1e-6);
	check_close("xent dlogits vs finite diff", dz, g, B * C, 1e-6);
	free(zd);
}

/* ---- the ops chained, differenced through fp32 ---- */

struct mlp {
	float *x, *w1, *b1, *h, *w2, *b2, *z;
	int32_t labels[3];
	int batch, in, hid, classes;
};

static float mlp_loss(struct mlp *m, float *dz)
{
	hpu_linear_forward(m->x, m->w1, m->b1, m->h, m->batch, m->in, m->hid);
	hpu_relu_forward(m->h, m->h, (size_t)m->batch * m->hid);
	hpu_linear_forward(m->h, m->w2, m->b2, m->z, m->batch, m->hid,
			   m->classes);
	return hpu_cross_entropy_forward(m->z, m->labels, dz, m->batch, m->classes);
}

/* Central difference of the fp32 loss w.r.t. p[k]; eps 1e-2 is large
 * enough to swamp fp32 rounding (~1e-7) and small enough that, for this
 * seed, no relu changes side. */
static double mlp_fd(struct mlp *m, float *p, size_t k)
{
	const float eps = 1e-2f;
	float keep = p[k];
	p[k] = keep + eps;
	float up = p[k];
	double lp = mlp_loss(m, NULL);
	p[k] = keep - eps;
	float down = p[k];
	double lm = mlp_loss(m, NULL);
	p[k] = keep;
	return (lp - lm) / ((double)up - (double)down);
}

static void test_mlp_fd(void **state)
{
	(void)state;
	struct mlp m = {
	    .labels = {2, 0, 1}, .batch = 3, .in = 5, .hid = 4, .classes = 3};
	float x[3 * 5], w1[4 * 5], b1[4], h[3 * 4], w2[3 * 4], b2[3], z[3 * 3];
	m.x = x, m.w1 = w1, m.b1 = b1, m.h = h, m.w2 = w2, m.b2 = b2, m.z = z;
	rng_seed(6);
	fill(x, 15, 0, 1), fill(w1, 20, -1, 1), fill(b1, 4, -0.5f, 0.5f);
	fill(w2, 12, -1, 1), fill(b2, 3, -0.5f, 0.5f);

	/* Analytic: forward, then backward in reverse, as a model does. */
	float dz[3 * 3], dh[3 * 4];
	float dw1[4 * 5] = {0}, db1[4] = {0}, dw2[3 * 4] = {0}, db2[3] = {0};
	assert_true(mlp_loss(&m, dz) >= 0);
	hpu_linear_backward(h, w2, dz, dh, dw2, db2, 3, 4, 3);
	hpu_relu_backward(h, dh, dh, 12);
	hpu_linear_backward(x, w1, dh, NULL, dw1, db1, 3, 5, 4);

	struct {
		const char *name;
		float *p, *grad;
		size_t n;
	} params[] = {
	    {"mlp dw1 vs fp32 finite diff", w1, dw1, 20},
	    {"mlp db1 vs fp32 finite diff", b1, db1, 4},
	    {"mlp dw2 vs fp32 finite diff", w2, dw2, 12},
	    {"mlp db2 vs fp32 finite diff", b2, db2, 3},
	};
	for (size_t i = 0; i < sizeof(params) / sizeof(params[0]); i++) {
		double g[20];
		for (size_t k = 0; k < params[i].n; k++)
			g[k] = mlp_fd(&m, params[i].p, k);
		/* fp32 loss error ~3e-7 / 2e-2, plus O(eps^2) curvature */
		check_close(params[i].name, params[i].grad, g, params[i].n,
			    1e-4);
	}
}

/* ---- accuracy ---- */

static void test_count_correct(void **state)
{
	(void)state;
	const float z[3 * 3] = {
	    5,  1,  1,  /* arg-max 0 */
	    1,  3,  3,  /* tie: the first max (1) wins */
	    -2, -1, -3, /* all negative: arg-max 1 */
	};
	const int32_t labels[3] = {0, 1, 1};
	int n = hpu_accuracy_forward(z, labels, 3, 3);
	printf("  count_correct: %d of 3 (want 3)\n", n);
	assert_int_equal(n, 3);
	const int32_t none[3] = {2, 2, 0}; /* row 1: label 2 loses the tie */
	assert_int_equal(hpu_accuracy_forward(z, none, 3, 3), 0);
	assert_int_equal(hpu_accuracy_forward(z, labels, 0, 3), 0);
}

/* hpu_strerror (through libhpu.so): a sentence of its own for every
 * hpu_err code, the codes negative but HPU_OK (models test `rc < 0`), and
 * one "unknown" sentence for anything else. */
static void test_strerror(void **state)
{
	(void)state;
	const int codes[] = {HPU_OK,     HPU_ERROR,  HPU_EINVAL, HPU_ENOMEM,
			     HPU_ERANGE, HPU_ENODEV, HPU_ENOENT};
	const int n = (int)(sizeof codes / sizeof codes[0]);
	const char *unknown = hpu_strerror(1);
	assert_string_equal(unknown, "Unknown error code.");
	for (int i = 0; i < n; i++) {
		const char *s = hpu_strerror(codes[i]);
		printf("  %d: %s\n", codes[i], s);
		assert_non_null(s);
		assert_string_not_equal(s, unknown);
		assert_true(i == 0 ? codes[i] == 0 : codes[i] < 0);
		for (int j = 0; j < i; j++)
			assert_string_not_equal(s, hpu_strerror(codes[j]));
	}
	assert_string_equal(hpu_strerror(HPU_ERANGE), "Index out of range.");
	const int others[] = {-n, INT32_MIN, INT32_MAX, 7};
	for (int i = 0; i < 4; i++)
		assert_string_equal(hpu_strerror(others[i]), unknown);
	/* an op's error code, as a model sees it */
	const float table[2] = {1, 2};
	const int32_t ids[1] = {2};
	float y[1];
	assert_int_equal(hpu_embedding_forward(table, ids, y, 1, 2, 1), HPU_ERANGE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_linear_forward),
	    cmocka_unit_test(test_linear_backward_fd),
	    cmocka_unit_test(test_linear_backward_accumulates),
	    cmocka_unit_test(test_relu),
	    cmocka_unit_test(test_xent_hand_computed),
	    cmocka_unit_test(test_xent_bad_label),
	    cmocka_unit_test(test_xent_fd),
	    cmocka_unit_test(test_mlp_fd),
	    cmocka_unit_test(test_count_correct),
	    cmocka_unit_test(test_strerror),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
