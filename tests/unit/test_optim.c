/* Unit tests for the optimizers (worker/optim.c).
 *
 * hpu_optim_step works in fp32. It is compared with a double-precision
 * reference written here from the update rules documented for
 * torch.optim.SGD and torch.optim.AdamW in PyTorch 1.13, run side by side
 * for 5 steps on 37 parameters with random gradients (some tiny, so that
 * where eps goes matters, and one always zero). A second reference is the
 * output of torch 1.13 itself on fixed inputs, hard-coded below. Every
 * comparison prints its largest absolute difference (maxdiff) and its
 * largest relative difference against the tolerance.
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

#include "config.h"
#include "optim.h"

#define N 37
#define STEPS 5
#define REL_TOL 1e-5
/* Relative differences of parameters are taken against
 * max(|want|, REL_FLOOR), so that a parameter that happens to pass near zero
 * is held to 1e-5 of the size of the parameters around it (|p| ~ 0.01..1)
 * rather than of itself. */
#define REL_FLOOR 1e-2
/* AdamW's first step from p = 0 is a handful of fp32 operations: held to
 * 1e-6 relative to the step itself. */
#define FIRST_STEP_TOL 1e-6

/* ---- helpers ---- */

static uint64_t rng_state;

static void rng_seed(uint64_t seed)
{
	rng_state = seed * 0x9E3779B97F4A7C15ull + 1;
}

/* Uniform in [lo, hi), xorshift64*. */
static float rng_uniform(float lo, float hi)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	uint64_t r = rng_state * 0x2545F4914F6CDD1Dull;
	return lo + (hi - lo) * (float)((double)(r >> 40) / (double)(1 << 24));
}

/* Gradients in [-1, 1); every 5th one below 1e-4, where AdamW's eps (1e-8
 * .. 1e-4 below) and where it is added make a visible difference; g[0] is
 * always 0. */
static void random_grad(float *g)
{
	for (int i = 0; i < N; i++) {
		g[i] = rng_uniform(-1.0f, 1.0f);
		if (i % 5 == 3)
			g[i] *= 1e-4f;
	}
	g[0] = 0.0f;
}

/* Prints maxdiff and the largest relative difference |got - want| /
 * max(|want|, floor); fails above tol. */
static void check_rel(const char *what, const float *got, const double *want,
		      size_t n, double tol, double floor)
{
	double maxdiff = 0.0, maxrel = 0.0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		double rel = d / fmax(fabs(want[i]), floor);
		if (!(d <= maxdiff)) /* also catches NaN */
			maxdiff = isnan(d) ? INFINITY : d;
		if (!(rel <= maxrel))
			maxrel = isnan(rel) ? INFINITY : rel;
	}
	printf("  %-44s maxdiff %.3g  rel %.3g (tol %.0e)%s\n", what, maxdiff,
	       maxrel, tol, maxrel <= tol ? "" : "  FAIL");
	assert_true(maxrel <= tol);
}

static void check_close(const char *what, const float *got, const double *want,
			size_t n, double tol)
{
	check_rel(what, got, want, n, tol, REL_FLOOR);
}

/* ---- double references, following the PyTorch 1.13 documentation ---- */

typedef struct ref_hp {
	int adamw;
	double lr, momentum, weight_decay, beta1, beta2, eps;
	int nesterov;
} ref_hp;

typedef struct ref_state {
	long t;
	double buf[N]; /* SGD momentum buffer / Adam exp_avg */
	double sq[N];  /* Adam exp_avg_sq */
} ref_state;

/* torch.optim.SGD, dampening 0:
 *   g = g + wd * p
 *   if mu != 0: b = g at t == 1, else b = mu * b + g
 *               g = g + mu * b if nesterov, else g = b
 *   p = p - lr * g */
static void ref_sgd(const ref_hp *h, ref_state *s, double *p, const float *gf)
{
	for (int i = 0; i < N; i++) {
		double g = (double)gf[i] + h->weight_decay * p[i];
		if (h->momentum != 0.0) {
			if (s->t == 1)
				s->buf[i] = g;
			else
				s->buf[i] = h->momentum * s->buf[i] + g;
			if (h->nesterov)
				g = g + h->momentum * s->buf[i];
			else
				g = s->buf[i];
		}
		p[i] -= h->lr * g;
	}
}

/* torch.optim.AdamW (amsgrad off):
 *   p = p * (1 - lr * wd)
 *   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
 *   m_hat = m / (1 - b1^t);      v_hat = v / (1 - b2^t)
 *   p = p - lr * m_hat / (sqrt(v_hat) + eps) */
static void ref_adamw(const ref_hp *h, ref_state *s, double *p, const float *gf)
{
	double bc1 = 1.0 - pow(h->beta1, (double)s->t);
	double bc2 = 1.0 - pow(h->beta2, (double)s->t);
	for (int i = 0; i < N; i++) {
		double g = gf[i];
		p[i] *= 1.0 - h->lr * h->weight_decay;
		s->buf[i] = h->beta1 * s->buf[i] + (1.0 - h->beta1) * g;
		s->sq[i] = h->beta2 * s->sq[i] + (1.0 - h->beta2) * g * g;
		double m_hat = s->buf[i] / bc1, v_hat = s->sq[i] / bc2;
		p[i] -= h->lr * m_hat / (sqrt(v_hat) + h->eps);
	}
}

static void ref_step(const ref_hp *h, ref_state *s, double *p, const float *g)
{
	s->t++;
	if (h->adamw)
		ref_adamw(h, s, p, g);
	else
		ref_sgd(h, s, p, g);
}

/* The training options that give the optimizer h. */
static void opts_from(hpu_train_opts *o, const ref_hp *h)
{
	hpu_opts_defaults(o);
	o->optimizer = h->adamw ? HPU_OPTIM_ADAMW : HPU_OPTIM_SGD;
	o->lr = h->lr;
	o->momentum = h->momentum;
	o->nesterov = h->nesterov;
	o->weight_decay = h->weight_decay;
	o->beta1 = h->beta1;
	o->beta2 = h->beta2;
	o->eps = h->eps;
}

/* ---- against the double reference ---- */

static void check_against_reference(const char *what, const ref_hp *h,
				    uint64_t seed)
{
	hpu_train_opts opts;
	hpu_optim o;
	ref_state rs;
	float p[N], g[N];
	double pr[N];

	opts_from(&opts, h);
	assert_int_equal(hpu_optim_init(&o, &opts, N), 0);
	memset(&rs, 0, sizeof(rs));
	rng_seed(seed);
	for (int i = 0; i < N; i++) {
		p[i] = rng_uniform(-1.0f, 1.0f);
		pr[i] = p[i];
	}
	for (int t = 1; t <= STEPS; t++) {
		char label[96];
		random_grad(g);
		hpu_optim_step(&o, p, g);
		ref_step(h, &rs, pr, g);
		assert_int_equal(o.t, t);
		snprintf(label, sizeof(label), "%s step %d", what, t);
		check_close(label, p, pr, N, REL_TOL);
	}
	hpu_optim_free(&o);
}

static void test_sgd_reference(void **state)
{
	(void)state;
	const ref_hp plain = {.lr = 0.1};
	const ref_hp wd = {.lr = 0.05, .weight_decay = 0.1};
	const ref_hp mom = {.lr = 0.1, .momentum = 0.9};
	const ref_hp mom_wd = {.lr = 0.03, .momentum = 0.8,
			       .weight_decay = 0.01};
	const ref_hp nest = {.lr = 0.1, .momentum = 0.9, .nesterov = 1};
	const ref_hp nest_wd = {.lr = 0.1, .momentum = 0.9, .nesterov = 1,
				.weight_decay = 0.05};
	check_against_reference("sgd lr .1", &plain, 1);
	check_against_reference("sgd lr .05 wd .1", &wd, 2);
	check_against_reference("sgd lr .1 mom .9", &mom, 3);
	check_against_reference("sgd lr .03 mom .8 wd .01", &mom_wd, 4);
	check_against_reference("sgd lr .1 nesterov .9", &nest, 5);
	check_against_reference("sgd lr .1 nesterov .9 wd .05", &nest_wd, 6);
}

static void test_adamw_reference(void **state)
{
	(void)state;
	const ref_hp def = {.adamw = 1, .lr = 1e-3, .weight_decay = 0.01,
			    .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
	const ref_hp nowd = {.adamw = 1, .lr = 1e-2, .beta1 = 0.9,
			     .beta2 = 0.999, .eps = 1e-8};
	const ref_hp big = {.adamw = 1, .lr = 3e-2, .weight_decay = 0.2,
			    .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6};
	const ref_hp eps = {.adamw = 1, .lr = 1e-2, .weight_decay = 0.01,
			    .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-4};
	check_against_reference("adamw lr 1e-3 wd .01", &def, 11);
	check_against_reference("adamw lr 1e-2 wd 0", &nowd, 12);
	check_against_reference("adamw lr 3e-2 wd .2 b .8/.99 eps 1e-6", &big,
				13);
	check_against_reference("adamw lr 1e-2 wd .01 eps 1e-4", &eps, 14);
}

/* ---- known values ---- */

/* SGD without momentum or weight decay is p -= lr * g, bit for bit. */
static void test_sgd_plain_exact(void **state)
{
	(void)state;
	hpu_train_opts opts;
	hpu_optim o;
	float p[N], g[N], want[N];
	hpu_opts_defaults(&opts);
	opts.optimizer = HPU_OPTIM_SGD;
	opts.momentum = 0.0;
	opts.lr = 0.1;
	assert_int_equal(hpu_optim_init(&o, &opts, N), 0);
	assert_true(o.weight_decay == 0.0); /* SGD's default */
	rng_seed(21);
	for (int i = 0; i < N; i++)
		p[i] = rng_uniform(-1.0f, 1.0f);
	const float lr = (float)opts.lr;
	for (int t = 0; t < STEPS; t++) {
		random_grad(g);
		for (int i = 0; i < N; i++)
			want[i] = p[i] - lr * g[i];
		hpu_optim_step(&o, p, g);
		assert_memory_equal(p, want, sizeof(p));
	}
	hpu_optim_free(&o);
}

/* AdamW's first step is p -= lr * g / (|g| + eps) (with wd 0): every
 * parameter with a gradient well above eps moves by lr against its sign,
 * one without a gradient does not move. */
static void test_adamw_first_step(void **state)
{
	(void)state;
	hpu_train_opts opts;
	hpu_optim o;
	float p[N], g[N];
	double want[N];
	hpu_opts_defaults(&opts);
	opts.weight_decay = 0.0;
	assert_int_equal(opts.optimizer, HPU_OPTIM_ADAMW);
	assert_int_equal(hpu_optim_init(&o, &opts, N), 0);
	rng_seed(31);
	for (int i = 0; i < N; i++) /* 1e-3 <= |g| < 1.001, either sign */
		g[i] = (i % 2 ? -1.0f : 1.0f) * (1e-3f + rng_uniform(0, 1));
	g[0] = 0.0f;
	g[3] = 1000.0f;
	memset(p, 0, sizeof(p)); /* so that p is exactly the step taken */
	hpu_optim_step(&o, p, g);
	for (int i = 0; i < N; i++)
		want[i] = -opts.lr * g[i] / (fabs(g[i]) + opts.eps);
	/* dp itself to fp32 accuracy (torch 1.13 is within 1.2e-7 here) */
	check_rel("adamw first step (p0 = 0), rel to dp", p, want, N,
		  FIRST_STEP_TOL, 1e-30);
	assert_true(p[0] == 0.0f);
	/* |g| >= 1e-3 >> eps = 1e-8: |dp| = lr to 1e-5, against the sign */
	double maxdev = 0.0;
	for (int i = 1; i < N; i++) {
		assert_true(p[i] * g[i] < 0.0f);
		maxdev = fmax(maxdev, fabs(fabs(p[i]) - opts.lr) / opts.lr);
	}
	printf("  %-44s max ||dp| - lr| / lr %.3g (tol %.0e)\n",
	       "adamw first step", maxdev, 2 * REL_TOL);
	assert_true(maxdev <= 2 * REL_TOL);
	hpu_optim_free(&o);

	/* from a non-zero start, with the default wd resolved to 0.01 */
	hpu_opts_defaults(&opts);
	opts.lr = 1e-2;
	assert_int_equal(hpu_optim_init(&o, &opts, N), 0);
	assert_true(o.weight_decay == 0.01);
	for (int i = 0; i < N; i++)
		p[i] = 0.5f;
	hpu_optim_step(&o, p, g);
	for (int i = 0; i < N; i++)
		want[i] = 0.5 * (1.0 - 1e-2 * 0.01) -
			  1e-2 * g[i] / (fabs(g[i]) + 1e-8);
	check_close("adamw first step (p0 = .5, wd .01)", p, want, N, REL_TOL);
	hpu_optim_free(&o);
}

/* Two optimizers keep their state apart, and n = 0 works. */
static void test_independent_state(void **state)
{
	(void)state;
	hpu_train_opts opts;
	hpu_optim a, b, z;
	float pa[N], pb[N], g[N];
	hpu_opts_defaults(&opts);
	assert_int_equal(hpu_optim_init(&a, &opts, N), 0);
	assert_int_equal(hpu_optim_init(&b, &opts, N), 0);
	assert_int_equal(hpu_optim_init(&z, &opts, 0), 0);
	rng_seed(41);
	for (int i = 0; i < N; i++)
		pa[i] = pb[i] = rng_uniform(-1.0f, 1.0f);
	for (int t = 0; t < STEPS; t++) {
		random_grad(g);
		hpu_optim_step(&a, pa, g);
		hpu_optim_step(&b, pb, g);
		hpu_optim_step(&z, pa, g); /* touches nothing */
	}
	assert_memory_equal(pa, pb, sizeof(pa));
	hpu_optim_free(&a);
	hpu_optim_free(&b);
	hpu_optim_free(&z);
	hpu_optim_free(&z); /* safe twice */
}

/* ---- against torch 1.13 ----
 *
 * Produced with Debian's torch 1.13.0a0 (/usr/bin/python3) from the inputs
 * of torch_inputs() (all exact in fp32): p = torch.tensor(p0, float32,
 * requires_grad=True); per step p.grad = torch.tensor(g_s); opt.step(); then
 * "%.9g" of the final p after 5 steps, for
 *   torch.optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True,
 *                   weight_decay=0.01)
 *   torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.999), eps=1e-8,
 *                     weight_decay=0.1)
 * with p0[i] = ((i*29) % 37 - 18) / 16 and g_s[i] = (((7i + 11s) % 19) - 9)
 * / 8, divided by 65536 where i % 6 == 0, and g_s[36] = 0.
 */
static const float torch_sgd[N] = {
	-1.10613477f, 0.432807952f, -0.106428482f, -0.145618185f,
	-0.493336946f, 1.08773923f, 0.491615415f, -0.113487609f,
	-0.806150973f, -1.01689136f, 0.71761179f, 0.678422034f,
	-0.184349388f, -1.17627847f, 1.05827141f, 0.710552573f,
	0.017889265f, -0.192851081f, -0.860338807f, 1.50246227f,
	0.186998248f, -0.352238148f, -0.391427845f, -0.739146531f,
	0.737430632f, -0.0115785068f, -0.359297276f, -1.05196047f,
	1.01103854f, 0.471802115f, 0.0614580847f, 0.084893547f,
	-1.42208827f, 0.812461793f, 0.464742959f, -0.227920413f,
	-0.614524126f,
};

static const float torch_adamw[N] = {
	-1.09187782f, 0.681554198f, 0.163915843f, -0.295526505f,
	-0.791841745f, 0.985931873f, 0.498645484f, -0.0076353522f,
	-0.518259585f, -0.991222084f, 0.793045819f, 0.332888216f,
	-0.154684767f, -0.712778926f, 1.12767875f, 0.621871829f,
	0.109297663f, -0.36252293f, -0.88623035f, 0.96035111f,
	0.432801604f, -0.0848366544f, -0.544279099f, -1.0405941f,
	0.737186909f, 0.249895334f, -0.25638786f, -0.767012f,
	1.06098616f, 0.544293344f, 0.0841183066f, -0.403365344f,
	-0.96153152f, 0.878926158f, 0.373119265f, -0.139454842f,
	-0.621881247f,
};

static void torch_p0(float *p)
{
	for (int i = 0; i < N; i++)
		p[i] = (float)((i * 29) % 37 - 18) / 16.0f;
}

static void torch_grad(float *g, int s)
{
	for (int i = 0; i < N; i++) {
		g[i] = (float)(((i * 7 + s * 11) % 19) - 9) / 8.0f;
		if (i % 6 == 0)
			g[i] /= 65536.0f;
	}
	g[36] = 0.0f;
}

static void check_against_torch(const char *what, const ref_hp *h,
				const float *want_f)
{
	hpu_train_opts opts;
	hpu_optim o;
	ref_state rs;
	float p[N], g[N];
	double pr[N], want[N];
	opts_from(&opts, h);
	assert_int_equal(hpu_optim_init(&o, &opts, N), 0);
	memset(&rs, 0, sizeof(rs));
	torch_p0(p);
	for (int i = 0; i < N; i++)
		pr[i] = p[i];
	for (int s = 0; s < STEPS; s++) {
		torch_grad(g, s);
		hpu_optim_step(&o, p, g);
		ref_step(h, &rs, pr, g);
	}
	for (int i = 0; i < N; i++)
		want[i] = want_f[i];
	char label[96];
	snprintf(label, sizeof(label), "%s: hpu vs torch 1.13", what);
	check_close(label, p, want, N, REL_TOL);
	/* and the double reference agrees with torch too */
	float prf[N];
	for (int i = 0; i < N; i++)
		prf[i] = (float)pr[i];
	snprintf(label, sizeof(label), "%s: reference vs torch 1.13", what);
	check_close(label, prf, want, N, REL_TOL);
	hpu_optim_free(&o);
}

static void test_against_torch(void **state)
{
	(void)state;
	const ref_hp sgd = {.lr = 0.1, .momentum = 0.9, .nesterov = 1,
			    .weight_decay = 0.01};
	const ref_hp adamw = {.adamw = 1, .lr = 0.01, .weight_decay = 0.1,
			      .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
	check_against_torch("sgd nesterov", &sgd, torch_sgd);
	check_against_torch("adamw", &adamw, torch_adamw);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_sgd_reference),
	    cmocka_unit_test(test_adamw_reference),
	    cmocka_unit_test(test_sgd_plain_exact),
	    cmocka_unit_test(test_adamw_first_step),
	    cmocka_unit_test(test_independent_state),
	    cmocka_unit_test(test_against_torch),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
