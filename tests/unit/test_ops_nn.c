/* Unit tests for the transformer ops (worker/ops/ops_nn.c).
 *
 * Forward values are compared with naive double-precision loops; gradients
 * with central finite differences of those double references (eps 1e-6,
 * good to ~1e-9), so the tolerance only covers the op's fp32 rounding. The
 * objective of every gradient check is L = sum(y * r) for a random r, so
 * dL/dy = r is what the op's backward gets. Every check prints its largest
 * absolute difference and its largest relative difference (relative to
 * the largest |reference|), and fails on the relative one.
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
#include "worker/ops/dropkeys.h"

#define FD_EPS 1e-6
#define GRAD_TOL 1e-4 /* relative: fp32 sums of a few dozen terms */

/* ---- helpers ---- */

/* Prints the largest absolute and relative (to max |want|) difference and
 * fails if the relative one exceeds tol. NaN counts as infinitely far. */
static void check_rel(const char *what, const float *got, const double *want,
		      size_t n, double tol)
{
	double m = 0.0, scale = 0.0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		if (!(d <= m))
			m = isnan(d) ? INFINITY : d;
		if (fabs(want[i]) > scale)
			scale = fabs(want[i]);
	}
	double rel = scale > 0 ? m / scale : m;
	printf("  %-40s maxdiff %.3g rel %.3g (tol %.1g)%s\n", what, m, rel, tol,
	       rel <= tol ? "" : "  FAIL");
	assert_true(rel <= tol);
}

/* A double objective of the arrays in ctx, for finite differences. */
typedef double (*objective)(void *ctx);

/* grad[k] = dL/da[k] by central differences, a being one of ctx's arrays. */
static void fd_grad(objective f, void *ctx, double *a, size_t n, double *grad)
{
	for (size_t k = 0; k < n; k++) {
		double keep = a[k];
		a[k] = keep + FD_EPS;
		double lp = f(ctx);
		a[k] = keep - FD_EPS;
		double lm = f(ctx);
		a[k] = keep;
		grad[k] = (lp - lm) / (2 * FD_EPS);
	}
}

static double dot(const double *a, const double *b, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* ---- matmul and bmm ---- */

/* c[M,N] (+)= op(a) op(b), a stored [M,K] or [K,M], b [K,N] or [N,K]. */
static void ref_matmul(const float *a, const float *b, double *c, int m, int n,
		       int k, int ta, int tb, int acc)
{
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++) {
			double s = acc ? c[i * n + j] : 0.0;
			for (int p = 0; p < k; p++) {
				double av = ta ? a[p * m + i] : a[i * k + p];
				double bv = tb ? b[j * k + p] : b[p * n + j];
				s += av * bv;
			}
			c[i * n + j] = s;
		}
}

static void check_matmul(int m, int n, int k, int ta, int tb, int acc)
{
	float *a = xcalloc((size_t)m * k, sizeof(float));
	float *b = xcalloc((size_t)k * n, sizeof(float));
	float *c = xcalloc((size_t)m * n, sizeof(float));
	fill(a, (size_t)m * k, -1, 1);
	fill(b, (size_t)k * n, -1, 1);
	if (acc)
		fill(c, (size_t)m * n, -1, 1);
	else
		fill_nan(c, (size_t)m * n); /* output only: never read */
	double *want = to_double(c, (size_t)m * n);
	ref_matmul(a, b, want, m, n, k, ta, tb, acc);
	hpu_matmul(a, b, c, m, n, k, ta, tb, acc);
	char what[80];
	snprintf(what, sizeof what, "matmul %dx%dx%d ta%d tb%d acc%d", m, n, k,
		 ta, tb, acc);
	check_rel(what, c, want, (size_t)m * n, 1e-6);
	free(a), free(b), free(c), free(want);
}

static void test_matmul(void **state)
{
	(void)state;
	rng_seed(1);
	for (int ta = 0; ta < 2; ta++)
		for (int tb = 0; tb < 2; tb++)
			for (int acc = 0; acc < 2; acc++) {
				check_matmul(5, 7, 3, ta, tb, acc);
				check_matmul(33, 17, 29, ta, tb, acc);
			}
	check_matmul(1, 1, 1, 0, 0, 0);

	/* k = 0: an empty sum, c = 0 or unchanged */
	float a[1] = {1}, b[1] = {1}, c[6] = {1, 2, 3, 4, 5, 6};
	hpu_matmul(a, b, c, 2, 3, 0, 0, 0, 1);
	double keep[6] = {1, 2, 3, 4, 5, 6}, zero[6] = {0};
	check_rel("matmul k=0 accumulate: unchanged", c, keep, 6, 0);
	hpu_matmul(a, b, c, 2, 3, 0, 0, 0, 0);
	check_rel("matmul k=0: zeros", c, zero, 6, 0);
}

static void check_bmm(int count, int m, int n, int k, int ta, int tb, int acc,
		      size_t sa, size_t sb, size_t sc)
{
	size_t na = (count - 1) * sa + (size_t)m * k;
	size_t nb = (count - 1) * sb + (size_t)k * n;
	size_t nc = (count - 1) * sc + (size_t)m * n;
	float *a = xcalloc(na, sizeof(float)), *b = xcalloc(nb, sizeof(float));
	float *c = xcalloc(nc, sizeof(float));
	fill(a, na, -1, 1), fill(b, nb, -1, 1);
	for (size_t i = 0; i < nc; i++)
		c[i] = 1234.0f; /* the gaps between the c's must stay */
	if (acc)
		for (int i = 0; i < count; i++)
			fill(c + i * sc, (size_t)m * n, -1, 1);
	double *want = to_double(c, nc);
	for (int i = 0; i < count; i++)
		ref_matmul(a + i * sa, b + i * sb, want + i * sc, m, n, k, ta, tb,
			   acc);
	hpu_bmm(a, b, c, count, m, n, k, ta, tb, acc, sa, sb, sc);
	/* the products, packed, against the reference; the gaps exactly */
	size_t mn = (size_t)m * n;
	float *got = xcalloc(count * mn, sizeof(float));
	double *wp = xcalloc(count * mn, sizeof(double));
	for (int i = 0; i < count; i++)
		for (size_t j = 0; j < mn; j++) {
			got[i * mn + j] = c[i * sc + j];
			wp[i * mn + j] = want[i * sc + j];
			c[i * sc + j] = 1234.0f;
		}
	char what[96];
	snprintf(what, sizeof what, "bmm %d of %dx%dx%d ta%d tb%d strides %zu/%zu/%zu",
		 count, m, n, k, ta, tb, sa, sb, sc);
	check_rel(what, got, wp, count * mn, 1e-6);
	for (size_t i = 0; i < nc; i++)
		assert_true(c[i] == 1234.0f);
	free(got), free(wp);
	free(a), free(b), free(c), free(want);
}

static void test_bmm(void **state)
{
	(void)state;
	rng_seed(2);
	/* packed, padded (gaps untouched), b shared (stride 0), transposed */
	check_bmm(3, 4, 5, 6, 0, 0, 0, 24, 30, 20);
	check_bmm(3, 4, 5, 6, 0, 0, 1, 31, 37, 27);
	check_bmm(4, 4, 5, 6, 1, 1, 0, 29, 0, 25);
	check_bmm(2, 7, 3, 5, 1, 0, 1, 40, 15, 30);
}

/* ---- GELU and tanh ---- */

static double ref_gelu(double x)
{
	const double c = 0.79788456080286535588; /* sqrt(2 / pi) */
	return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}

typedef struct elt_ctx {
	double (*f)(double);
	double *x, *r;
	size_t n;
} elt_ctx;

static double elt_obj(void *p)
{
	elt_ctx *c = p;
	double s = 0.0;
	for (size_t i = 0; i < c->n; i++)
		s += c->f(c->x[i]) * c->r[i];
	return s;
}

/* forward vs f in double, backward vs finite differences, and dx aliasing
 * dy; `by_output` says whether backward takes the forward's output. */
static void check_elementwise(const char *name, double (*f)(double),
			      void (*fwd)(const float *, float *, size_t),
			      void (*bwd)(const float *, const float *, float *,
					  size_t),
			      int by_output)
{
	enum { N = 64 };
	float x[N], y[N], r[N], dx[N], d2[N];
	fill(x, N, -4, 4), fill(r, N, -1, 1);
	x[0] = 0.0f, x[1] = 8.0f, x[2] = -8.0f; /* tails */
	fill_nan(y, N), fill_nan(dx, N);
	fwd(x, y, N);
	bwd(by_output ? y : x, r, dx, N);
	memcpy(d2, r, sizeof d2);
	bwd(by_output ? y : x, d2, d2, N); /* in place */

	double *xd = to_double(x, N), *rd = to_double(r, N), yd[N], g[N];
	for (int i = 0; i < N; i++)
		yd[i] = f(xd[i]);
	elt_ctx c = {f, xd, rd, N};
	fd_grad(elt_obj, &c, xd, N, g);
	char what[64];
	snprintf(what, sizeof what, "%s fwd", name);
	check_rel(what, y, yd, N, 1e-6);
	snprintf(what, sizeof what, "%s bwd vs finite diff", name);
	check_rel(what, dx, g, N, GRAD_TOL);
	snprintf(what, sizeof what, "%s bwd in place (dx = dy)", name);
	double want[N];
	for (int i = 0; i < N; i++)
		want[i] = dx[i];
	check_rel(what, d2, want, N, 0);
	free(xd), free(rd);
}

static void test_gelu(void **state)
{
	(void)state;
	rng_seed(3);
	check_elementwise("gelu", ref_gelu, hpu_gelu_forward, hpu_gelu_backward, 0);
	/* torch.nn.functional.gelu(x, approximate="tanh") at 1 and -1 */
	float x[2] = {1.0f, -1.0f}, y[2];
	double want[2] = {0.8411919906, -0.1588080094};
	hpu_gelu_forward(x, y, 2);
	check_rel("gelu(1), gelu(-1) vs torch", y, want, 2, 1e-6);

	/* element by element over [-100, 100] (the tails saturate: gelu(x)
	 * -> x on the right, -> 0 on the left) and forward-backward pairs */
	enum { N = 4001 };
	float *wx = xcalloc(N, sizeof(float)), *wy = xcalloc(N, sizeof(float));
	float *wd = xcalloc(N, sizeof(float)), *ones = xcalloc(N, sizeof(float));
	for (int i = 0; i < N; i++)
		wx[i] = -100.0f + 0.05f * (float)i, ones[i] = 1.0f;
	hpu_gelu_forward(wx, wy, N);
	hpu_gelu_backward(wx, ones, wd, N);
	double worst = 0, worst_d = 0;
	for (int i = 0; i < N; i++) {
		double v = wx[i], c = 0.79788456080286535588;
		double u = c * (v + 0.044715 * v * v * v), t = tanh(u);
		double d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * 0.044715 * v * v);
		/* relative, but absolute below 1e-3 (the value) and 1e-2 (the
		 * derivative, which crosses 0 at x = -0.75, where the sum
		 * s + ... cancels to ~4e-8 absolute in fp32) */
		double e = fabs(wy[i] - ref_gelu(v)) / fmax(fabs(ref_gelu(v)), 1e-3);
		double ed = fabs(wd[i] - d) / fmax(fabs(d), 1e-2);
		worst = fmax(worst, e), worst_d = fmax(worst_d, ed);
		assert_false(isnan(wy[i]) || isnan(wd[i]));
	}
	printf("  gelu over [-100, 100]: largest relative difference fwd %.3g, "
	       "derivative %.3g (tol 1e-5)\n", worst, worst_d);
	assert_true(worst <= 1e-5 && worst_d <= 1e-5);
	free(wx), free(wy), free(wd), free(ones);
}

static void test_tanh(void **state)
{
	(void)state;
	rng_seed(4);
	check_elementwise("tanh", tanh, hpu_tanh_forward, hpu_tanh_backward, 1);
}

/* ---- softmax ---- */

static void ref_softmax(const double *x, double *y, int rows, int cols)
{
	for (int r = 0; r < rows; r++) {
		const double *xr = x + r * cols;
		double m = xr[0], s = 0.0;
		for (int c = 1; c < cols; c++)
			m = fmax(m, xr[c]);
		for (int c = 0; c < cols; c++)
			s += exp(xr[c] - m);
		for (int c = 0; c < cols; c++)
			y[r * cols + c] = exp(xr[c] - m) / s;
	}
}

typedef struct softmax_ctx {
	double *x, *r;
	int rows, cols;
} softmax_ctx;

static double softmax_obj(void *p)
{
	softmax_ctx *c = p;
	size_t n = (size_t)c->rows * c->cols;
	double *y = xcalloc(n, sizeof *y);
	ref_softmax(c->x, y, c->rows, c->cols);
	double s = dot(y, c->r, n);
	free(y);
	return s;
}

static void test_softmax(void **state)
{
	(void)state;
	enum { R = 4, C = 7, N = R * C };
	float x[N], y[N], r[N], dx[N];
	rng_seed(5);
	fill(x, N, -5, 5), fill(r, N, -1, 1);
	x[C] = 80.0f; /* a big logit: max-subtracted, no overflow */
	hpu_softmax_forward(x, y, R, C);
	double *xd = to_double(x, N), *rd = to_double(r, N), yd[N], g[N];
	ref_softmax(xd, yd, R, C);
	check_rel("softmax fwd", y, yd, N, 1e-6);

	float sums[R];
	double ones[R];
	for (int i = 0; i < R; i++) {
		double s = 0.0;
		for (int c = 0; c < C; c++)
			s += y[i * C + c];
		sums[i] = (float)s, ones[i] = 1.0;
	}
	check_rel("softmax rows sum to 1", sums, ones, R, 1e-6);

	/* huge values in every row stay finite */
	float big[3] = {1e30f, -1e30f, 3e38f}, by[3];
	double bwant[3] = {0, 0, 1};
	hpu_softmax_forward(big, by, 1, 3);
	check_rel("softmax of huge logits", by, bwant, 3, 0);

	hpu_softmax_backward(y, r, dx, R, C);
	softmax_ctx c = {xd, rd, R, C};
	fd_grad(softmax_obj, &c, xd, N, g);
	check_rel("softmax bwd vs finite diff", dx, g, N, GRAD_TOL);
	free(xd), free(rd);
}

/* ---- layer norm ---- */

#define LN_EPS 1e-5f

static void ref_layernorm(const double *x, const double *g, const double *b,
			  double *y, double *xhat, int rows, int cols)
{
	for (int r = 0; r < rows; r++) {
		const double *xr = x + r * cols;
		double m = 0.0, v = 0.0;
		for (int c = 0; c < cols; c++)
			m += xr[c];
		m /= cols;
		for (int c = 0; c < cols; c++)
			v += (xr[c] - m) * (xr[c] - m);
		v /= cols;
		double s = 1.0 / sqrt(v + LN_EPS);
		for (int c = 0; c < cols; c++) {
			double h = (xr[c] - m) * s;
			if (xhat)
				xhat[r * cols + c] = h;
			y[r * cols + c] = h * g[c] + b[c];
		}
	}
}

typedef struct ln_ctx {
	double *x, *g, *b, *r;
	int rows, cols;
} ln_ctx;

static double ln_obj(void *p)
{
	ln_ctx *c = p;
	size_t n = (size_t)c->rows * c->cols;
	double *y = xcalloc(n, sizeof *y);
	ref_layernorm(c->x, c->g, c->b, y, NULL, c->rows, c->cols);
	double s = dot(y, c->r, n);
	free(y);
	return s;
}

static void test_layernorm_forward(void **state)
{
	(void)state;
	enum { R = 5, C = 16, N = R * C };
	float x[N], g[C], b[C], y[N], mean[R], rstd[R];
	rng_seed(6);
	fill(x, N, -3, 3), fill(g, C, 0.5f, 1.5f), fill(b, C, -1, 1);
	for (int c = 0; c < C; c++)
		x[c] += 1000.0f; /* a large mean: two-pass variance */
	hpu_layernorm_forward(x, g, b, y, mean, rstd, R, C, LN_EPS);
	double *xd = to_double(x, N), *gd = to_double(g, C),
	       *bd = to_double(b, C), yd[N];
	ref_layernorm(xd, gd, bd, yd, NULL, R, C);
	/* row 0's fp32 mean of values near 1000 is good to ~1e-4 (its sum
	 * near 16000 has a quantum of 1e-3), and x - mean to as much */
	check_rel("layernorm fwd", y, yd, N, 1e-4);

	/* gamma 1, beta 0: each row has mean 0 and variance 1 (eps aside) */
	float ones[C], zeros[C] = {0}, h[N];
	for (int c = 0; c < C; c++)
		ones[c] = 1.0f;
	hpu_layernorm_forward(x, ones, zeros, h, mean, rstd, R, C, LN_EPS);
	float mv[2 * R];
	double want[2 * R];
	for (int r = 0; r < R; r++) {
		double m = 0.0, v = 0.0, vx = 0.0, mx = 0.0;
		for (int c = 0; c < C; c++)
			m += h[r * C + c], mx += x[r * C + c];
		m /= C, mx /= C;
		for (int c = 0; c < C; c++) {
			v += (h[r * C + c] - m) * (h[r * C + c] - m);
			vx += (x[r * C + c] - mx) * (x[r * C + c] - mx);
		}
		v /= C, vx /= C;
		mv[2 * r] = (float)m, want[2 * r] = 0.0;
		/* var(xhat) = var / (var + eps) */
		mv[2 * r + 1] = (float)v, want[2 * r + 1] = vx / (vx + LN_EPS);
	}
	/* row 0 (mean 1000) again to ~3e-5, the others to ~1e-7 */
	check_rel("layernorm rows: mean 0, variance 1", mv, want, 2 * R, 1e-4);
	free(xd), free(gd), free(bd);
}

static void test_layernorm_backward(void **state)
{
	(void)state;
	enum { R = 3, C = 8, N = R * C };
	float x[N], g[C], b[C], y[N], mean[R], rstd[R], r[N], dx[N];
	float dg[C] = {0}, db[C] = {0};
	rng_seed(7);
	fill(x, N, -2, 2), fill(g, C, 0.5f, 1.5f), fill(b, C, -1, 1);
	fill(r, N, -1, 1), fill_nan(dx, N);
	hpu_layernorm_forward(x, g, b, y, mean, rstd, R, C, LN_EPS);
	hpu_layernorm_backward(x, g, mean, rstd, r, dx, dg, db, R, C);

	double *xd = to_double(x, N), *gd = to_double(g, C),
	       *bd = to_double(b, C), *rd = to_double(r, N);
	double gx[N], gg[C], gb[C];
	ln_ctx c = {xd, gd, bd, rd, R, C};
	fd_grad(ln_obj, &c, xd, N, gx);
	fd_grad(ln_obj, &c, gd, C, gg);
	fd_grad(ln_obj, &c, bd, C, gb);
	check_rel("layernorm bwd dx vs finite diff", dx, gx, N, GRAD_TOL);
	check_rel("layernorm bwd dgamma vs finite diff", dg, gg, C, GRAD_TOL);
	check_rel("layernorm bwd dbeta vs finite diff", db, gb, C, GRAD_TOL);

	/* again: dgamma, dbeta accumulate (double), dx is overwritten */
	float dx2[N];
	fill(dx2, N, 5, 6);
	hpu_layernorm_backward(x, g, mean, rstd, r, dx2, dg, db, R, C);
	double w2g[C], w2b[C], wdx[N];
	for (int k = 0; k < C; k++)
		w2g[k] = 2 * gg[k], w2b[k] = 2 * gb[k];
	for (int k = 0; k < N; k++)
		wdx[k] = dx[k];
	check_rel("layernorm bwd twice: dgamma doubles", dg, w2g, C, GRAD_TOL);
	check_rel("layernorm bwd twice: dbeta doubles", db, w2b, C, GRAD_TOL);
	check_rel("layernorm bwd twice: dx overwritten", dx2, wdx, N, 0);
	free(xd), free(gd), free(bd), free(rd);
}

/* ---- embedding ---- */

static void test_embedding(void **state)
{
	(void)state;
	enum { V = 6, D = 4, N = 7 };
	float table[V * D], y[N * D], dy[N * D], dt[V * D] = {0};
	const int32_t ids[N] = {0, 5, 2, 2, 3, 5, 2}; /* repeats add up */
	rng_seed(8);
	fill(table, V * D, -1, 1), fill(dy, N * D, -1, 1);
	assert_int_equal(hpu_embedding_forward(table, ids, y, N, V, D), 0);
	double want[N * D];
	for (int i = 0; i < N; i++)
		for (int c = 0; c < D; c++)
			want[i * D + c] = table[ids[i] * D + c];
	check_rel("embedding fwd", y, want, N * D, 0);

	/* L = sum(y * dy) is linear in the table: its gradient is exact */
	hpu_embedding_backward(ids, dy, dt, N, D);
	double *td = to_double(table, V * D), g[V * D];
	for (int k = 0; k < V * D; k++) {
		double keep = td[k], lp = 0.0, lm = 0.0;
		for (int s = -1; s <= 1; s += 2) {
			td[k] = keep + s * FD_EPS;
			double l = 0.0;
			for (int i = 0; i < N; i++)
				for (int c = 0; c < D; c++)
					l += td[ids[i] * D + c] * dy[i * D + c];
			*(s < 0 ? &lm : &lp) = l;
		}
		td[k] = keep;
		g[k] = (lp - lm) / (2 * FD_EPS);
	}
	check_rel("embedding bwd vs finite diff", dt, g, V * D, 1e-6);
	hpu_embedding_backward(ids, dy, dt, N, D);
	for (int k = 0; k < V * D; k++)
		g[k] *= 2;
	check_rel("embedding bwd twice: accumulates", dt, g, V * D, 1e-6);

	/* out-of-range ids are refused and nothing is written */
	const int32_t high[3] = {0, V, 1}, low[3] = {0, -1, 1};
	float out[3 * D];
	fill_nan(out, 3 * D);
	int rh = hpu_embedding_forward(table, high, out, 3, V, D);
	int rl = hpu_embedding_forward(table, low, out, 3, V, D);
	printf("  embedding id %d of %d -> %d, id -1 -> %d\n", V, V, rh, rl);
	assert_int_equal(rh, HPU_ERANGE);
	assert_int_equal(rl, HPU_ERANGE);
	for (int k = 0; k < 3 * D; k++)
		assert_true(isnan(out[k]));
	free(td);
}

/* ---- dropout ---- */

static size_t count_kept(const uint8_t *m, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += m[i];
	return k;
}

static size_t count_differ(const uint8_t *a, const uint8_t *b, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += a[i] != b[i];
	return k;
}

/* |got - n q| <= z sigma for a Binomial(n, q) count; prints it. */
static void check_binomial(const char *what, size_t got, size_t n, double q,
			   double z)
{
	double mu = n * q, sigma = sqrt(n * q * (1 - q));
	double dev = fabs((double)got - mu) / sigma;
	printf("  %-40s %zu of %zu (expected %.0f, %.2f sigma)\n", what, got, n,
	       mu, dev);
	assert_true(dev <= z);
}

static void test_dropout_statistics(void **state)
{
	(void)state;
	enum { N = 100000 };
	float *x = xcalloc(N, sizeof(float)), *y = xcalloc(N, sizeof(float));
	uint8_t *m1 = xcalloc(N, 1), *m2 = xcalloc(N, 1), *m3 = xcalloc(N, 1);
	rng_seed(9);
	fill(x, N, -1, 1);
	const float ps[3] = {0.1f, 0.5f, 0.9f};
	for (int k = 0; k < 3; k++) {
		float p = ps[k];
		char what[64];
		hpu_dropout_forward(x, y, m1, N, p, 42, 7);
		snprintf(what, sizeof what, "dropout p=%.1f kept", p);
		check_binomial(what, count_kept(m1, N), N, 1 - p, 3);
		/* y = x * mask / (1 - p) */
		double *want = xcalloc(N, sizeof(double));
		for (size_t i = 0; i < N; i++)
			want[i] = m1[i] ? x[i] / (1.0 - p) : 0.0;
		snprintf(what, sizeof what, "dropout p=%.1f y = x mask / (1-p)", p);
		check_rel(what, y, want, N, 1e-6);
		free(want);

		/* other seeds and streams: independent masks, which differ
		 * in 2 p (1 - p) of the places */
		const uint64_t other[4][2] = {{43, 7}, {42, 8}, {7, 42}, {0, 0}};
		for (int o = 0; o < 4; o++) {
			hpu_dropout_forward(x, y, m2, N, p, other[o][0], other[o][1]);
			snprintf(what, sizeof what,
				 "dropout p=%.1f (42,7) vs (%llu,%llu) differ", p,
				 (unsigned long long)other[o][0],
				 (unsigned long long)other[o][1]);
			check_binomial(what, count_differ(m1, m2, N), N,
				       2 * p * (1 - p), 4);
		}
	}
	free(x), free(y), free(m1), free(m2), free(m3);
}

static void test_dropout_determinism(void **state)
{
	(void)state;
	enum { N = 5000, H = 1777 };
	float x[N], y1[N], y2[N], y3[H];
	uint8_t m1[N], m2[N], m3[H];
	rng_seed(10);
	fill(x, N, -1, 1);
	hpu_dropout_forward(x, y1, m1, N, 0.3f, 123, 4);
	hpu_dropout_forward(x, y2, m2, N, 0.3f, 123, 4);
	printf("  dropout same (seed, stream) twice: %zu masks differ, y %s\n",
	       count_differ(m1, m2, N), memcmp(y1, y2, sizeof y1) ? "differs" : "equal");
	assert_memory_equal(m1, m2, N);
	assert_memory_equal(y1, y2, sizeof y1);
	/* element i depends on i only, not on n: a prefix gets the same mask */
	hpu_dropout_forward(x, y3, m3, H, 0.3f, 123, 4);
	assert_memory_equal(m1, m3, H);
	/* a pure function of (seed, stream, i): these pinned values catch a
	 * change of the hash, which would change every run's masks */
	uint32_t bits = 0;
	for (int i = 0; i < 32; i++)
		bits |= (uint32_t)m1[i] << i;
	printf("  dropout mask bits 0..31 for (123, 4), p 0.3: 0x%08x\n", bits);
	assert_int_equal(bits, 0xd3dbce7fu);

	/* p = 0 passes everything through unchanged */
	hpu_dropout_forward(x, y1, m1, N, 0.0f, 1, 2);
	assert_int_equal(count_kept(m1, N), N);
	assert_memory_equal(x, y1, sizeof x);
	/* p = 1 drops everything, without dividing by 0 */
	hpu_dropout_forward(x, y1, m1, N, 1.0f, 1, 2);
	assert_int_equal(count_kept(m1, N), 0);
	for (int i = 0; i < N; i++)
		assert_true(y1[i] == 0.0f);
}

/* hpu_dropout_ctx (the dropout layer's op): the host's keys
 * (hpu_rand_key) where no recordable run told the ops otherwise; where
 * one did (worker/ops/dropkeys.h), the keys the table's dropout_keys
 * makes from the step and the indices it was given, into its memory:
 * the same keys and mask; a context with other rows (a hook's) gets the
 * host's. */
static int64_t dk_step;
static uint32_t dk_samples[4];
static uint64_t dk_keys[4];
static int dk_asked;

static int dk_ready(void *arg, const int64_t **step, const uint32_t **samples, uint64_t **keys)
{
	(void)arg;
	dk_asked++;
	*step = &dk_step;
	*samples = dk_samples;
	*keys = dk_keys;
	return 0;
}

static void test_dropout_ctx(void **state)
{
	(void)state;
	enum { ROWS = 4, N = 50 };
	uint32_t idx[ROWS] = {7, 4000000000u, 3, 12}, other[ROWS] = {1, 2, 3, 4};
	hpu_ctx c = {.train = 1, .step = 123456789012l, .layer = 5, .seed = 99, .batch = ROWS,
		     .samples = idx};
	static float x[ROWS * N], want[ROWS * N], got[ROWS * N];
	uint64_t keys[ROWS];
	for (int i = 0; i < ROWS * N; i++)
		x[i] = (float)i - 100.0f;
	for (int r = 0; r < ROWS; r++)
		keys[r] = hpu_rand_key(&c, r);
	const uint32_t cut = 1u << 31;
	assert_int_equal(hpu_dropout_rows(x, want, keys, ROWS, N, cut, 2.0f), HPU_OK);
	assert_int_equal(hpu_dropout_ctx(&c, x, got, ROWS, N, cut, 2.0f), HPU_OK);
	assert_memory_equal(got, want, sizeof got);
	dk_step = c.step;
	memcpy(dk_samples, idx, sizeof idx);
	hpu__dropkeys_set(&(hpu__dropkeys){
	    .host = idx, .step = c.step, .rows = ROWS, .ready = dk_ready, .arg = NULL});
	memset(got, 0, sizeof got);
	assert_int_equal(hpu_dropout_ctx(&c, x, got, ROWS, N, cut, 2.0f), HPU_OK);
	assert_int_equal(dk_asked, 1);
	assert_memory_equal(dk_keys, keys, sizeof keys);
	assert_memory_equal(got, want, sizeof got);
	hpu_ctx o = c;
	o.samples = other;
	assert_int_equal(hpu_dropout_ctx(&o, x, got, ROWS, N, cut, 2.0f), HPU_OK);
	assert_int_equal(dk_asked, 1); /* the host's keys */
	hpu__dropkeys_set(NULL);
}

static void test_dropout_backward(void **state)
{
	(void)state;
	enum { N = 200 };
	float x[N], y[N], dy[N], dx[N], d2[N];
	uint8_t mask[N];
	const float p = 0.25f;
	rng_seed(11);
	fill(x, N, -1, 1), fill(dy, N, -1, 1);
	hpu_dropout_forward(x, y, mask, N, p, 5, 6);
	hpu_dropout_backward(dy, mask, dx, N, p);
	/* L = sum(y * dy) with the mask fixed, differenced in double */
	double g[N];
	for (int i = 0; i < N; i++) {
		double f = mask[i] / (1.0 - p);
		double lp = (x[i] + FD_EPS) * f * dy[i];
		double lm = (x[i] - FD_EPS) * f * dy[i];
		g[i] = (lp - lm) / (2 * FD_EPS);
	}
	check_rel("dropout bwd vs finite diff", dx, g, N, 1e-6);
	memcpy(d2, dy, sizeof d2);
	hpu_dropout_backward(d2, mask, d2, N, p);
	double want[N];
	for (int i = 0; i < N; i++)
		want[i] = dx[i];
	check_rel("dropout bwd in place", d2, want, N, 0);
}

/* ---- attention ---- */

/* out[B,T,D] of qkv[B,T,3D], causal, in double; att[B,H,T,T] if wanted. */
static void ref_attention(const double *qkv, double *out, double *att, int B,
			  int T, int H, int hd)
{
	const int D = H * hd;
	double *s = xcalloc((size_t)T, sizeof *s);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int i = 0; i < T; i++) {
				const double *q = qkv + ((size_t)b * T + i) * 3 * D + h * hd;
				double m = -INFINITY, sum = 0.0;
				for (int j = 0; j <= i; j++) {
					const double *k = qkv + ((size_t)b * T + j) * 3 * D + D + h * hd;
					s[j] = dot(q, k, hd) / sqrt((double)hd);
					m = fmax(m, s[j]);
				}
				for (int j = 0; j <= i; j++)
					sum += (s[j] = exp(s[j] - m));
				double *o = out + ((size_t)b * T + i) * D + h * hd;
				for (int c = 0; c < hd; c++)
					o[c] = 0.0;
				for (int j = 0; j < T; j++) {
					double pj = j <= i ? s[j] / sum : 0.0;
					if (att)
						att[(((size_t)b * H + h) * T + i) * T + j] = pj;
					const double *v = qkv + ((size_t)b * T + j) * 3 * D + 2 * D + h * hd;
					for (int c = 0; c < hd && j <= i; c++)
						o[c] += pj * v[c];
				}
			}
	free(s);
}

typedef struct att_ctx {
	double *qkv, *r;
	int B, T, H, hd;
} att_ctx;

static double att_obj(void *p)
{
	att_ctx *c = p;
	size_t n = (size_t)c->B * c->T * c->H * c->hd;
	double *out = xcalloc(n, sizeof *out);
	ref_attention(c->qkv, out, NULL, c->B, c->T, c->H, c->hd);
	double s = dot(out, c->r, n);
	free(out);
	return s;
}

static void check_attention_forward(int B, int T, int H, int hd)
{
	const int D = H * hd;
	size_t nq = (size_t)B * T * 3 * D, no = (size_t)B * T * D;
	size_t na = (size_t)B * H * T * T;
	float *qkv = xcalloc(nq, sizeof(float)), *out = xcalloc(no, sizeof(float));
	float *att = xcalloc(na, sizeof(float));
	fill(qkv, nq, -2, 2), fill_nan(out, no), fill_nan(att, na);
	hpu_attention_forward(qkv, out, att, B, T, H, hd);
	double *qd = to_double(qkv, nq), *od = xcalloc(no, sizeof(double));
	double *ad = xcalloc(na, sizeof(double));
	ref_attention(qd, od, ad, B, T, H, hd);
	char what[80];
	snprintf(what, sizeof what, "attention fwd B%d T%d H%d hd%d", B, T, H, hd);
	check_rel(what, out, od, no, 1e-5);
	snprintf(what, sizeof what, "attention probabilities B%d T%d H%d hd%d", B,
		 T, H, hd);
	check_rel(what, att, ad, na, 1e-5); /* zeros above the diagonal too */
	free(qkv), free(out), free(att), free(qd), free(od), free(ad);
}

static void test_attention_forward(void **state)
{
	(void)state;
	rng_seed(12);
	check_attention_forward(2, 5, 2, 3);
	check_attention_forward(1, 1, 1, 4); /* T = 1: out = v */
	check_attention_forward(3, 17, 4, 8);
}

/* Changing q, k, v of position s changes no output before s (nor any in
 * another sequence): bitwise. */
static void test_attention_causal(void **state)
{
	(void)state;
	enum { B = 2, T = 6, H = 2, HD = 4, D = H * HD };
	float qkv[B * T * 3 * D], q2[B * T * 3 * D];
	float out[B * T * D], o2[B * T * D], att[B * H * T * T];
	rng_seed(13);
	fill(qkv, B * T * 3 * D, -2, 2);
	hpu_attention_forward(qkv, out, att, B, T, H, HD);
	for (int s = 0; s < T; s++) {
		memcpy(q2, qkv, sizeof q2);
		for (int c = 0; c < 3 * D; c++)
			q2[s * 3 * D + c] += 1.0f + rng_uniform(0, 1);
		hpu_attention_forward(q2, o2, att, B, T, H, HD);
		int same_before = !memcmp(out, o2, (size_t)s * D * sizeof(float));
		int same_other = !memcmp(out + T * D, o2 + T * D,
					 (size_t)T * D * sizeof(float));
		int changed_at = !!memcmp(out + s * D, o2 + s * D, D * sizeof(float));
		printf("  attention: position %d changed: rows < %d %s, row %d %s, other sequence %s\n",
		       s, s, same_before ? "same" : "CHANGED", s,
		       changed_at ? "changed" : "same", same_other ? "same" : "CHANGED");
		assert_true(same_before && same_other && changed_at);
	}
}

static void test_attention_backward(void **state)
{
	(void)state;
	enum { B = 2, T = 5, H = 2, HD = 3, D = H * HD };
	enum { NQ = B * T * 3 * D, NO = B * T * D };
	float qkv[NQ], out[NO], att[B * H * T * T], r[NO], dqkv[NQ];
	rng_seed(14);
	fill(qkv, NQ, -2, 2), fill(r, NO, -1, 1), fill_nan(dqkv, NQ);
	hpu_attention_forward(qkv, out, att, B, T, H, HD);
	hpu_attention_backward(qkv, att, r, dqkv, B, T, H, HD);

	double *qd = to_double(qkv, NQ), *rd = to_double(r, NO), g[NQ];
	att_ctx c = {qd, rd, B, T, H, HD};
	fd_grad(att_obj, &c, qd, NQ, g);
	/* split into the q, k and v parts of every position */
	static const char *names[3] = {"attention bwd dq vs finite diff",
				       "attention bwd dk vs finite diff",
				       "attention bwd dv vs finite diff"};
	for (int part = 0; part < 3; part++) {
		float got[B * T * D];
		double want[B * T * D];
		for (int p = 0; p < B * T; p++)
			for (int k = 0; k < D; k++) {
				got[p * D + k] = dqkv[p * 3 * D + part * D + k];
				want[p * D + k] = g[p * 3 * D + part * D + k];
			}
		check_rel(names[part], got, want, B * T * D, GRAD_TOL);
	}
	free(qd), free(rd);
}

/* A bigger shape through the fp32 op itself: finite differences of the
 * fp32 forward on a few coordinates (eps 1e-2 swamps fp32 rounding). */
static void test_attention_backward_fp32(void **state)
{
	(void)state;
	enum { B = 2, T = 24, H = 3, HD = 8, D = H * HD };
	enum { NQ = B * T * 3 * D, NO = B * T * D };
	float *qkv = xcalloc(NQ, sizeof(float)), *out = xcalloc(NO, sizeof(float));
	float *att = xcalloc(B * H * T * T, sizeof(float));
	float *r = xcalloc(NO, sizeof(float)), *dqkv = xcalloc(NQ, sizeof(float));
	rng_seed(15);
	fill(qkv, NQ, -1, 1), fill(r, NO, -1, 1);
	hpu_attention_forward(qkv, out, att, B, T, H, HD);
	hpu_attention_backward(qkv, att, r, dqkv, B, T, H, HD);
	enum { K = 64 };
	float got[K];
	double want[K];
	for (int s = 0; s < K; s++) {
		size_t k = (size_t)(rng_uniform(0, 1) * NQ) % NQ;
		const float eps = 1e-2f;
		float keep = qkv[k];
		double l[2];
		for (int side = 0; side < 2; side++) {
			qkv[k] = keep + (side ? -eps : eps);
			hpu_attention_forward(qkv, out, att, B, T, H, HD);
			double sum = 0.0;
			for (int i = 0; i < NO; i++)
				sum += (double)out[i] * r[i];
			l[side] = sum;
		}
		qkv[k] = keep;
		got[s] = dqkv[k];
		want[s] = (l[0] - l[1]) / (2 * eps);
	}
	check_rel("attention bwd B2 T24 H3 hd8 vs fp32 fd", got, want, K, 2e-3);
	free(qkv), free(out), free(att), free(r), free(dqkv);
}

/* The attention layer's score masking against its definition: query i
 * may attend to key j when (!causal || j <= i) && (!mask || mask[j]);
 * before the softmax -inf elsewhere, after it exact zeros, and a row
 * with no key it may attend to all zeros. Samples: no padding, leading
 * and inner padding, and all padding. */
static void test_mask_scores(void **state)
{
	(void)state;
	enum { B = 3, H = 2, T = 7 };
	static const int32_t mask[B * T] = {1, 1, 1, 1, 1, 1, 1, /**/ 0, 0, 1, 1, 0, 1, 1,
					    /**/ 0, 0, 0, 0, 0, 0, 0};
	float att[B * H * T * T], want[B * H * T * T];
	int checked = 0;
	for (int causal = 0; causal < 2; causal++)
		for (int masked = 0; masked < 2; masked++)
			for (int after = 0; after < 2; after++) {
				if (!causal && !masked)
					continue; /* the layer masks nothing then */
				for (size_t k = 0; k < sizeof att / sizeof *att; k++)
					att[k] = want[k] = (float)rng_uniform(-3, 3);
				const int32_t *m = masked ? mask : NULL;
				for (int b = 0; b < B; b++)
					for (int h = 0; h < H; h++)
						for (int i = 0; i < T; i++) {
							float *row = want + (((size_t)b * H + h) * T + i) * T;
							int any = 0;
							for (int j = 0; j < T; j++)
								any |= (!causal || j <= i) && (!m || m[b * T + j]);
							for (int j = 0; j < T; j++)
								if (!any)
									row[j] = 0.0f;
								else if (!((!causal || j <= i) && (!m || m[b * T + j])))
									row[j] = after ? 0.0f : -INFINITY;
						}
				assert_int_equal(hpu_mask_scores(att, m, B, H, T, causal, after), HPU_OK);
				if (memcmp(att, want, sizeof att))
					fail_msg("mask_scores causal %d masked %d after %d differs from its definition",
						 causal, masked, after);
				checked++;
			}
	assert_int_equal(checked, 6);
	printf("  mask_scores: 6 cases (causal, key mask, before/after) bit for bit\n");
}

/* split_heads and merge_heads move rows between [B, T, ld] (head h at
 * columns h*hd) and head-major [B, H, T, hd], scaled; merge undoes split. */
static void test_split_merge_heads(void **state)
{
	(void)state;
	enum { B = 2, H = 3, T = 5, HD = 4, LD = 3 * H * HD + 2 };
	float src[B * T * LD], hm[B * H * T * HD], back[B * T * LD];
	for (size_t k = 0; k < B * T * LD; k++)
		src[k] = (float)rng_uniform(-1, 1), back[k] = 7.0f;
	assert_int_equal(hpu_split_heads(src + H * HD, LD, hm, B, H, T, HD, 0.5f), HPU_OK);
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int i = 0; i < T; i++)
				for (int e = 0; e < HD; e++)
					assert_true(hm[(((size_t)b * H + h) * T + i) * HD + e] ==
						    src[((size_t)b * T + i) * LD + H * HD + h * HD + e] * 0.5f);
	assert_int_equal(hpu_merge_heads(hm, back + H * HD, LD, B, H, T, HD, 2.0f), HPU_OK);
	for (int r = 0; r < B * T; r++)
		for (int c = 0; c < LD; c++) {
			int in = c >= H * HD && c < 2 * H * HD; /* the columns merged into */
			assert_true(back[(size_t)r * LD + c] == (in ? src[(size_t)r * LD + c] : 7.0f));
		}
}

/* The definition of hpu_mask_scores, one value at a time (the loops
 * ops_heads.c had before its vector clones): what the op must write, bit
 * for bit. */
static void mask_def(float *att, const int32_t *mask, int B, int H, int T, int causal,
		     int after)
{
	for (int b = 0; b < B; b++)
		for (int h = 0; h < H; h++)
			for (int i = 0; i < T; i++) {
				float *row = att + (((size_t)b * H + h) * T + i) * T;
				const int32_t *m = mask ? mask + (size_t)b * T : NULL;
				int any = 0;
				for (int j = 0; j < T; j++)
					any |= (!causal || j <= i) && (!m || m[j]);
				for (int j = 0; j < T; j++)
					if (!any)
						row[j] = 0.0f;
					else if (!((!causal || j <= i) && (!m || m[j])))
						row[j] = after ? 0.0f : -INFINITY;
			}
}

/* The vector clones of the head copies and the masking at awkward shapes
 * (T 1 and odd, 1 and 3 heads, hd 1 and past a vector's 16 lanes, rows
 * with no key, scores holding NaNs with payloads, -0 and infinities),
 * against one value at a time, bit for bit: the copies are products by
 * mul alone, the masking pure stores. */
static void test_heads_mask_shapes(void **state)
{
	(void)state;
	static const int ts[] = {1, 2, 5, 17, 33}, hs[] = {1, 3}, hds[] = {1, 4, 17, 32};
	const uint32_t odd[] = {0x7fc01234u, 0xffa00001u, 0x80000000u, 0x7f800000u};
	int cases = 0;
	for (size_t ti = 0; ti < sizeof ts / sizeof *ts; ti++)
		for (size_t hi = 0; hi < sizeof hs / sizeof *hs; hi++) {
			int T = ts[ti], H = hs[hi], B = 3;
			size_t na = (size_t)B * H * T * T;
			float *att = malloc(na * sizeof *att), *want = malloc(na * sizeof *want);
			int32_t *mask = malloc((size_t)B * T * sizeof *mask);
			assert_non_null(att), assert_non_null(want), assert_non_null(mask);
			/* sample 0 no padding, 1 every other key (and the first), 2 all */
			for (int j = 0; j < T; j++)
				mask[j] = 1, mask[T + j] = j % 2, mask[2 * T + j] = 0;
			for (int causal = 0; causal < 2; causal++)
				for (int masked = 0; masked < 2; masked++)
					for (int after = 0; after < 2; after++) {
						for (size_t k = 0; k < na; k++) {
							att[k] = (float)rng_uniform(-3, 3);
							if (k % 7 == 3)
								memcpy(&att[k], &odd[k % 4], sizeof *att);
						}
						memcpy(want, att, na * sizeof *att);
						const int32_t *m = masked ? mask : NULL;
						mask_def(want, m, B, H, T, causal, after);
						assert_int_equal(hpu_mask_scores(att, m, B, H, T, causal, after), HPU_OK);
						if (memcmp(att, want, na * sizeof *att))
							fail_msg("mask_scores T %d heads %d causal %d masked %d after %d "
								 "differs from one value at a time", T, H, causal, masked, after);
						cases++;
					}
			for (size_t di = 0; di < sizeof hds / sizeof *hds; di++) {
				int hd = hds[di];
				size_t ld = (size_t)3 * H * hd + 1, ns = (size_t)B * T * ld;
				size_t nh = (size_t)B * H * T * hd;
				float *src = malloc(ns * sizeof *src), *hm = malloc(nh * sizeof *hm);
				float *hw = malloc(nh * sizeof *hw), *back = malloc(ns * sizeof *back);
				float *bw = malloc(ns * sizeof *bw);
				assert_non_null(src), assert_non_null(hm), assert_non_null(hw);
				assert_non_null(back), assert_non_null(bw);
				for (size_t k = 0; k < ns; k++) {
					src[k] = (float)rng_uniform(-2, 2);
					if (k % 5 == 2)
						memcpy(&src[k], &odd[k % 4], sizeof *src);
					back[k] = bw[k] = 7.0f;
				}
				const float mul = 0.3535534f; /* 1 / sqrt(8), rounded: inexact products */
				for (int b = 0; b < B; b++)
					for (int h = 0; h < H; h++)
						for (int i = 0; i < T; i++)
							for (int e = 0; e < hd; e++) {
								size_t major = (((size_t)b * H + h) * T + i) * hd + e;
								size_t str = ((size_t)b * T + i) * ld + (size_t)H * hd +
									     (size_t)h * hd + e;
								hw[major] = src[str] * mul;
								bw[str] = hw[major] * 3.0f;
							}
				assert_int_equal(hpu_split_heads(src + H * hd, ld, hm, B, H, T, hd, mul),
						 HPU_OK);
				if (memcmp(hm, hw, nh * sizeof *hm))
					fail_msg("split_heads T %d heads %d hd %d differs", T, H, hd);
				assert_int_equal(hpu_merge_heads(hm, back + H * hd, ld, B, H, T, hd, 3.0f),
						 HPU_OK);
				if (memcmp(back, bw, ns * sizeof *back))
					fail_msg("merge_heads T %d heads %d hd %d differs (or wrote outside "
						 "its columns)", T, H, hd);
				free(src), free(hm), free(hw), free(back), free(bw);
				cases += 2;
			}
			free(att), free(want), free(mask);
		}
	assert_int_equal(cases, 10 * 8 + 10 * 4 * 2);
	printf("  heads and mask_scores: %d cases at awkward shapes bit for bit\n", cases);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_matmul),
	    cmocka_unit_test(test_bmm),
	    cmocka_unit_test(test_gelu),
	    cmocka_unit_test(test_tanh),
	    cmocka_unit_test(test_softmax),
	    cmocka_unit_test(test_layernorm_forward),
	    cmocka_unit_test(test_layernorm_backward),
	    cmocka_unit_test(test_embedding),
	    cmocka_unit_test(test_dropout_statistics),
	    cmocka_unit_test(test_dropout_determinism),
	    cmocka_unit_test(test_dropout_backward),
	    cmocka_unit_test(test_dropout_ctx),
	    cmocka_unit_test(test_attention_forward),
	    cmocka_unit_test(test_attention_causal),
	    cmocka_unit_test(test_attention_backward),
	    cmocka_unit_test(test_attention_backward_fp32),
	    cmocka_unit_test(test_mask_scores),
	    cmocka_unit_test(test_split_merge_heads),
	    cmocka_unit_test(test_heads_mask_shapes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
