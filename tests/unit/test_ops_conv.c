/* Unit tests for convolution and pooling (worker/ops/ops_conv.c).
 *
 * Forward: against naive direct loops in double. Backward: against central
 * finite differences of L = sum(y * r), r random, taken on those double
 * references (eps 1e-6: the references are linear in each input, or
 * piecewise linear for max pooling, so the differences are good to ~1e-9
 * and the tolerance only covers the op's fp32 rounding). One more test
 * differences the fp32 ops themselves, chained as a model chains them.
 * Every check prints its largest difference relative to the largest
 * reference value (rel maxdiff) and its tolerance.
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
#define TOL 1e-5    /* fp32 sums of at most a few hundred products */

/* ---- helpers ---- */

/* max |got - want| / max |want|; NaN anywhere counts as infinitely far. */
static double rel_maxdiff(const float *got, const double *want, size_t n)
{
	double m = 0.0, scale = 0.0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		if (!(d <= m)) /* also catches NaN */
			m = isnan(d) ? INFINITY : d;
		if (fabs(want[i]) > scale)
			scale = fabs(want[i]);
	}
	return scale > 0 ? m / scale : m;
}

/* Prints the relative maxdiff and fails the test if it exceeds tol. */
static void check_rel(const char *what, const float *got, const double *want,
		      size_t n, double tol)
{
	double m = rel_maxdiff(got, want, n);
	printf("  %-52s rel maxdiff %.3g (tol %.1g)%s\n", what, m, tol,
	       m <= tol ? "" : "  FAIL");
	assert_true(m <= tol);
}

/* ---- convolution: the double reference ---- */

typedef struct conv_case {
	int batch, in_ch, height, width, out_ch, kernel, stride, pad;
} conv_case;

static hpu_conv2d_shape shape_of(const conv_case *c)
{
	hpu_conv2d_shape s = {c->batch,  c->in_ch,  c->height, c->width,
			      c->out_ch, c->kernel, c->stride, c->pad};
	return s;
}

static int conv_oh(const conv_case *c)
{
	return (c->height + 2 * c->pad - c->kernel) / c->stride + 1;
}

static int conv_ow(const conv_case *c)
{
	return (c->width + 2 * c->pad - c->kernel) / c->stride + 1;
}

/* y[B,O,OH,OW] = sum over c, ki, kj of x[b, c, oh*S-P+ki, ow*S-P+kj]
 * (0 outside) * w[o, c, ki, kj], + b[o]: the definition, directly. */
static void ref_conv(const conv_case *c, const double *x, const double *w,
		     const double *b, double *y)
{
	int OH = conv_oh(c), OW = conv_ow(c), K = c->kernel;
	for (int n = 0; n < c->batch; n++)
		for (int o = 0; o < c->out_ch; o++)
			for (int oh = 0; oh < OH; oh++)
				for (int ow = 0; ow < OW; ow++) {
					double s = b ? b[o] : 0.0;
					for (int ci = 0; ci < c->in_ch; ci++)
						for (int ki = 0; ki < K; ki++)
							for (int kj = 0; kj < K; kj++) {
								int ih = oh * c->stride - c->pad + ki;
								int iw = ow * c->stride - c->pad + kj;
								if (ih < 0 || ih >= c->height || iw < 0 ||
								    iw >= c->width)
									continue;
								s += x[((n * c->in_ch + ci) * c->height + ih) *
									       c->width + iw] *
								     w[((o * c->in_ch + ci) * K + ki) * K + kj];
							}
					y[((n * c->out_ch + o) * OH + oh) * OW + ow] = s;
				}
}

typedef struct conv_ref {
	const conv_case *c;
	double *x, *w, *b, *r, *y; /* y: the reference's own output buffer */
	size_t ny;
} conv_ref;

/* L = sum(conv(x, w, b) * r), so dL/dy = r. */
static double conv_obj(const conv_ref *R)
{
	ref_conv(R->c, R->x, R->w, R->b, R->y);
	double s = 0.0;
	for (size_t k = 0; k < R->ny; k++)
		s += R->y[k] * R->r[k];
	return s;
}

/* grad[k] = dL/da[k] by central differences, a one of R's x, w, b. */
static void fd_conv(const conv_ref *R, double *a, size_t n, double *grad)
{
	for (size_t k = 0; k < n; k++) {
		double keep = a[k];
		a[k] = keep + FD_EPS;
		double lp = conv_obj(R);
		a[k] = keep - FD_EPS;
		double lm = conv_obj(R);
		a[k] = keep;
		grad[k] = (lp - lm) / (2 * FD_EPS);
	}
}

/* ---- convolution tests ---- */

static void conv_name(char *buf, size_t len, const conv_case *c, const char *what)
{
	snprintf(buf, len, "conv %dx%dx%dx%d o%d k%d s%d p%d %s", c->batch, c->in_ch,
		 c->height, c->width, c->out_ch, c->kernel, c->stride, c->pad, what);
}

static void check_conv_forward(const conv_case *c, int with_bias)
{
	hpu_conv2d_shape s = shape_of(c);
	assert_int_equal(hpu_conv2d_out_h(&s), conv_oh(c));
	assert_int_equal(hpu_conv2d_out_w(&s), conv_ow(c));
	size_t nx = (size_t)c->batch * c->in_ch * c->height * c->width;
	size_t nw = (size_t)c->out_ch * c->in_ch * c->kernel * c->kernel;
	size_t ny = (size_t)c->batch * c->out_ch * conv_oh(c) * conv_ow(c);
	size_t ns = hpu_conv2d_scratch(&s);
	assert_int_equal(ns, nw / c->out_ch * conv_oh(c) * conv_ow(c));
	float *x = xcalloc(nx, 4), *w = xcalloc(nw, 4), *b = xcalloc(c->out_ch, 4);
	float *y = xcalloc(ny, 4), *scratch = xcalloc(ns, 4);
	fill(x, nx, 0, 1); /* like pixels or relu outputs */
	float bound = 1.0f / sqrtf((float)(nw / c->out_ch));
	fill(w, nw, -bound, bound);
	fill(b, c->out_ch, -bound, bound);
	fill_nan(y, ny); /* output only, even without a bias */
	fill_nan(scratch, ns);

	hpu_conv2d_forward(&s, x, w, with_bias ? b : NULL, y, scratch);

	double *xd = to_double(x, nx), *wd = to_double(w, nw);
	double *bd = to_double(b, c->out_ch), *yd = xcalloc(ny, sizeof(*yd));
	ref_conv(c, xd, wd, with_bias ? bd : NULL, yd);
	char what[128];
	conv_name(what, sizeof what, c, with_bias ? "fwd vs direct" : "fwd vs direct, no bias");
	check_rel(what, y, yd, ny, TOL);
	free(x), free(w), free(b), free(y), free(scratch);
	free(xd), free(wd), free(bd), free(yd);
}

static const conv_case fd_cases[] = {
	/* B  C  H  W  O  K  S  P */
	{2, 3, 7, 5, 4, 3, 1, 1}, /* padding 1, non-square */
	{2, 2, 8, 6, 3, 3, 2, 1}, /* stride 2, padding 1 */
	{2, 3, 6, 9, 2, 2, 2, 0}, /* stride 2, no padding, non-square */
	{1, 1, 6, 6, 2, 5, 1, 2}, /* the CNN's 5x5 pad 2 */
	{2, 2, 7, 6, 3, 4, 3, 2}, /* stride 3 that does not divide */
	{2, 4, 5, 4, 3, 1, 1, 0}, /* 1x1: no im2col */
	{2, 2, 4, 5, 2, 1, 2, 0}, /* 1x1 with stride: im2col */
	{2, 2, 3, 3, 2, 3, 1, 2}, /* more padding than image at the corners */
};

static void test_conv_forward(void **state)
{
	(void)state;
	rng_seed(1);
	for (size_t i = 0; i < sizeof fd_cases / sizeof fd_cases[0]; i++) {
		check_conv_forward(&fd_cases[i], 1);
		check_conv_forward(&fd_cases[i], 0);
	}
	/* the CNN's two layers at a batch of 2 */
	const conv_case conv1 = {2, 1, 28, 28, 32, 5, 1, 2};
	const conv_case conv2 = {2, 32, 14, 14, 64, 5, 1, 2};
	check_conv_forward(&conv1, 1);
	check_conv_forward(&conv2, 1);
}

static void check_conv_backward_fd(const conv_case *c)
{
	hpu_conv2d_shape s = shape_of(c);
	size_t nx = (size_t)c->batch * c->in_ch * c->height * c->width;
	size_t nw = (size_t)c->out_ch * c->in_ch * c->kernel * c->kernel;
	size_t no = (size_t)c->out_ch;
	size_t ny = (size_t)c->batch * c->out_ch * conv_oh(c) * conv_ow(c);
	size_t ns = hpu_conv2d_scratch(&s);
	float *x = xcalloc(nx, 4), *w = xcalloc(nw, 4), *b = xcalloc(no, 4);
	float *r = xcalloc(ny, 4), *scratch = xcalloc(ns, 4);
	float *dx = xcalloc(nx, 4), *dw = xcalloc(nw, 4), *db = xcalloc(no, 4);
	float *dw0 = xcalloc(nw, 4), *db0 = xcalloc(no, 4);
	fill(x, nx, -1, 1), fill(w, nw, -1, 1), fill(b, no, -1, 1);
	fill(r, ny, -1, 1);
	/* dw, db start from earlier micro-batches: backward adds to them */
	fill(dw0, nw, -1, 1), fill(db0, no, -1, 1);
	memcpy(dw, dw0, nw * 4), memcpy(db, db0, no * 4);
	fill_nan(dx, nx); /* overwritten, never read */
	fill_nan(scratch, ns);

	hpu_conv2d_backward(&s, x, w, r, dx, dw, db, scratch);

	double *yref = xcalloc(ny, sizeof(double));
	conv_ref R = {c, to_double(x, nx), to_double(w, nw), to_double(b, no),
		      to_double(r, ny), yref, ny};
	double *gx = xcalloc(nx, 8), *gw = xcalloc(nw, 8), *gb = xcalloc(no, 8);
	fd_conv(&R, R.x, nx, gx);
	fd_conv(&R, R.w, nw, gw);
	fd_conv(&R, R.b, no, gb);
	for (size_t k = 0; k < nw; k++)
		gw[k] += dw0[k];
	for (size_t k = 0; k < no; k++)
		gb[k] += db0[k];
	char what[128];
	conv_name(what, sizeof what, c, "dx vs fd");
	check_rel(what, dx, gx, nx, TOL);
	conv_name(what, sizeof what, c, "dw (+=) vs fd");
	check_rel(what, dw, gw, nw, TOL);
	conv_name(what, sizeof what, c, "db (+=) vs fd");
	check_rel(what, db, gb, no, TOL);

	/* dx and db may be NULL: dw is the same as with them */
	float *dw2 = xcalloc(nw, 4);
	memcpy(dw2, dw0, nw * 4);
	hpu_conv2d_backward(&s, x, w, r, NULL, dw2, NULL, scratch);
	double *want = to_double(dw, nw);
	conv_name(what, sizeof what, c, "dw with dx=db=NULL");
	check_rel(what, dw2, want, nw, 0);

	free(x), free(w), free(b), free(r), free(scratch);
	free(dx), free(dw), free(db), free(dw0), free(db0), free(dw2), free(want);
	free(R.x), free(R.w), free(R.b), free(R.r), free(yref);
	free(gx), free(gw), free(gb);
}

static void test_conv_backward_fd(void **state)
{
	(void)state;
	rng_seed(2);
	for (size_t i = 0; i < sizeof fd_cases / sizeof fd_cases[0]; i++)
		check_conv_backward_fd(&fd_cases[i]);
}

/* ---- pooling: double references ---- */

typedef struct pool_case {
	int batch, ch, h, w, k, stride;
} pool_case;

static int pool_oh(const pool_case *p)
{
	return (p->h - p->k) / p->stride + 1;
}

static int pool_ow(const pool_case *p)
{
	return (p->w - p->k) / p->stride + 1;
}

/* y = max (or mean) over each window; arg (if not NULL) = the first
 * maximum's in-plane position, windows read row by row. */
static void ref_pool(const pool_case *p, const double *x, double *y, int32_t *arg,
		     int is_max)
{
	int OH = pool_oh(p), OW = pool_ow(p);
	for (int pl = 0; pl < p->batch * p->ch; pl++)
		for (int oh = 0; oh < OH; oh++)
			for (int ow = 0; ow < OW; ow++) {
				double best = -INFINITY, sum = 0.0;
				int32_t at = -1;
				for (int ki = 0; ki < p->k; ki++)
					for (int kj = 0; kj < p->k; kj++) {
						int pos = (oh * p->stride + ki) * p->w +
							  ow * p->stride + kj;
						double v = x[(size_t)pl * p->h * p->w + pos];
						sum += v;
						if (v > best)
							best = v, at = pos;
					}
				size_t o = ((size_t)pl * OH + oh) * OW + ow;
				y[o] = is_max ? best : sum / (p->k * p->k);
				if (arg)
					arg[o] = at;
			}
}

static double pool_obj(const pool_case *p, const double *x, const double *r,
		       double *y, int is_max)
{
	ref_pool(p, x, y, NULL, is_max);
	double s = 0.0;
	for (size_t k = 0; k < (size_t)p->batch * p->ch * pool_oh(p) * pool_ow(p); k++)
		s += y[k] * r[k];
	return s;
}

static void check_pool(const pool_case *p, int is_max)
{
	size_t nx = (size_t)p->batch * p->ch * p->h * p->w;
	size_t ny = (size_t)p->batch * p->ch * pool_oh(p) * pool_ow(p);
	float *x = xcalloc(nx, 4), *y = xcalloc(ny, 4), *r = xcalloc(ny, 4);
	float *dx = xcalloc(nx, 4);
	int32_t *idx = xcalloc(ny, 4), *want_idx = xcalloc(ny, 4);
	fill(x, nx, -1, 1), fill(r, ny, -1, 1);
	fill_nan(y, ny), fill_nan(dx, nx);
	for (size_t k = 0; k < ny; k++)
		idx[k] = -7;

	const char *name = is_max ? "maxpool" : "avgpool";
	if (is_max) {
		hpu_maxpool2d_forward(x, y, idx, p->batch, p->ch, p->h, p->w, p->k, p->stride);
		hpu_maxpool2d_backward(r, idx, dx, p->batch, p->ch, p->h, p->w, p->k, p->stride);
	} else {
		hpu_avgpool2d_forward(x, y, p->batch, p->ch, p->h, p->w, p->k, p->stride);
		hpu_avgpool2d_backward(r, dx, p->batch, p->ch, p->h, p->w, p->k, p->stride);
	}

	double *xd = to_double(x, nx), *rd = to_double(r, ny);
	double *yd = xcalloc(ny, 8), *g = xcalloc(nx, 8);
	ref_pool(p, xd, yd, want_idx, is_max);
	char what[128];
	snprintf(what, sizeof what, "%s %dx%dx%dx%d k%d s%d fwd vs direct", name,
		 p->batch, p->ch, p->h, p->w, p->k, p->stride);
	check_rel(what, y, yd, ny, is_max ? 0 : 1e-6);
	if (is_max)
		for (size_t k = 0; k < ny; k++)
			assert_int_equal(idx[k], want_idx[k]);

	for (size_t k = 0; k < nx; k++) {
		double keep = xd[k];
		xd[k] = keep + FD_EPS;
		double lp = pool_obj(p, xd, rd, yd, is_max);
		xd[k] = keep - FD_EPS;
		double lm = pool_obj(p, xd, rd, yd, is_max);
		xd[k] = keep;
		g[k] = (lp - lm) / (2 * FD_EPS);
	}
	snprintf(what, sizeof what, "%s %dx%dx%dx%d k%d s%d dx vs fd", name, p->batch,
		 p->ch, p->h, p->w, p->k, p->stride);
	check_rel(what, dx, g, nx, TOL);
	free(x), free(y), free(r), free(dx), free(idx), free(want_idx);
	free(xd), free(rd), free(yd), free(g);
}

static const pool_case pool_cases[] = {
	/* B  C  H  W  k  s */
	{2, 3, 6, 8, 2, 2}, /* the CNN's 2x2 */
	{2, 2, 7, 5, 2, 2}, /* odd sizes: the last row/column is dropped */
	{2, 2, 7, 9, 3, 2}, /* overlapping windows */
	{2, 3, 5, 6, 3, 1}, /* stride 1: heavy overlap */
	{1, 1, 4, 4, 4, 4}, /* one window */
};

static void test_maxpool(void **state)
{
	(void)state;
	rng_seed(3);
	for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++)
		check_pool(&pool_cases[i], 1);
}

static void test_avgpool(void **state)
{
	(void)state;
	rng_seed(4);
	for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++)
		check_pool(&pool_cases[i], 0);
}

/* Ties go to the first maximum in row-major window order, and the whole
 * gradient goes to it; backward overwrites dx. */
static void test_maxpool_ties(void **state)
{
	(void)state;
	const float x[16] = {
		1, 3, 0, 0,
		3, 2, 0, 0,
		5, 5, -1, -2,
		5, 5, -3, -1,
	};
	float y[4], dx[16];
	int32_t idx[4];
	hpu_maxpool2d_forward(x, y, idx, 1, 1, 4, 4, 2, 2);
	const int32_t want_idx[4] = {1, 2, 8, 10};
	const double want_y[4] = {3, 0, 5, -1};
	check_rel("maxpool ties: values", y, want_y, 4, 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(idx[i], want_idx[i]);
	const float dy[4] = {1, 2, 3, 4};
	for (int i = 0; i < 16; i++)
		dx[i] = 9; /* garbage */
	hpu_maxpool2d_backward(dy, idx, dx, 1, 1, 4, 4, 2, 2);
	double want_dx[16] = {0};
	want_dx[1] = 1, want_dx[2] = 2, want_dx[8] = 3, want_dx[10] = 4;
	check_rel("maxpool ties: dx to the first max only", dx, want_dx, 16, 0);
	printf("  maxpool ties: arg-max %d %d %d %d\n", idx[0], idx[1], idx[2], idx[3]);
}

/* ---- the fp32 ops chained, differenced through fp32 ---- */

/* conv (3x3, pad 1) -> relu -> maxpool 2x2 -> L = sum(y * r), as a CNN
 * chains them; L is summed in double from the fp32 outputs. */
typedef struct chain {
	hpu_conv2d_shape s;
	float *x, *w, *b, *h, *y, *r, *scratch;
	int32_t *idx;
	int oh, ow;
} chain;

static double chain_loss(chain *m)
{
	hpu_conv2d_forward(&m->s, m->x, m->w, m->b, m->h, m->scratch);
	size_t nh = (size_t)m->s.batch * m->s.out_ch * m->oh * m->ow;
	hpu_relu_forward(m->h, m->h, nh);
	hpu_maxpool2d_forward(m->h, m->y, m->idx, m->s.batch, m->s.out_ch, m->oh, m->ow, 2, 2);
	double s = 0.0;
	for (size_t k = 0; k < nh / 4; k++)
		s += (double)m->y[k] * m->r[k];
	return s;
}

static void test_chain_fp32_fd(void **state)
{
	(void)state;
	chain m = {.s = {2, 2, 6, 8, 3, 3, 1, 1}};
	m.oh = hpu_conv2d_out_h(&m.s), m.ow = hpu_conv2d_out_w(&m.s);
	size_t nx = 2 * 2 * 6 * 8, nw = 3 * 2 * 9, nh = 2 * 3 * 6 * 8, ny = nh / 4;
	m.x = xcalloc(nx, 4), m.w = xcalloc(nw, 4), m.b = xcalloc(3, 4);
	m.h = xcalloc(nh, 4), m.y = xcalloc(ny, 4), m.r = xcalloc(ny, 4);
	m.idx = xcalloc(ny, 4), m.scratch = xcalloc(hpu_conv2d_scratch(&m.s), 4);
	rng_seed(5);
	fill(m.x, nx, -1, 1), fill(m.w, nw, -1, 1), fill(m.b, 3, -0.5f, 0.5f);
	fill(m.r, ny, -1, 1);

	/* analytic: forward, then backward in reverse */
	float *dh = xcalloc(nh, 4), *dx = xcalloc(nx, 4);
	float *dw = xcalloc(nw, 4), *db = xcalloc(3, 4);
	chain_loss(&m);
	hpu_maxpool2d_backward(m.r, m.idx, dh, 2, 3, m.oh, m.ow, 2, 2);
	hpu_relu_backward(m.h, dh, dh, nh);
	hpu_conv2d_backward(&m.s, m.x, m.w, dh, dx, dw, db, m.scratch);

	struct {
		const char *name;
		float *p, *grad;
		size_t n;
	} params[] = {
		{"conv-relu-maxpool dx vs fp32 fd", m.x, dx, nx},
		{"conv-relu-maxpool dw vs fp32 fd", m.w, dw, nw},
		{"conv-relu-maxpool db vs fp32 fd", m.b, db, 3},
	};
	const float eps = 1e-3f;
	for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
		double *g = xcalloc(params[i].n, 8);
		for (size_t k = 0; k < params[i].n; k++) {
			float *p = params[i].p, keep = p[k];
			p[k] = keep + eps;
			float up = p[k];
			double lp = chain_loss(&m);
			p[k] = keep - eps;
			float down = p[k];
			double lm = chain_loss(&m);
			p[k] = keep;
			g[k] = (lp - lm) / ((double)up - (double)down);
		}
		/* fp32 rounding of the outputs (~1e-7 each) over 2e-3 */
		check_rel(params[i].name, params[i].grad, g, params[i].n, 2e-3);
		free(g);
	}
	free(m.x), free(m.w), free(m.b), free(m.h), free(m.y), free(m.r);
	free(m.idx), free(m.scratch), free(dh), free(dx), free(dw), free(db);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_conv_forward),
		cmocka_unit_test(test_conv_backward_fd),
		cmocka_unit_test(test_maxpool),
		cmocka_unit_test(test_avgpool),
		cmocka_unit_test(test_maxpool_ties),
		cmocka_unit_test(test_chain_fp32_fd),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
