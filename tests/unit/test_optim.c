/* Unit tests for the optimizers (worker/strategy/optim.c).
 *
 * hpu__optim_step works in fp32. It is compared with a double-precision
 * reference written here from the update rules documented for
 * torch.optim.SGD, torch.optim.Adam and torch.optim.AdamW in PyTorch 1.13,
 * run side by side for 5 steps on 37 parameters with random gradients (some
 * tiny, so that where eps goes matters, and one always zero), with a fixed
 * lr and with the lr and the gradient scale (clip_grad_norm_'s factor)
 * changing every step. A second reference is the output of torch 1.13
 * itself on fixed inputs, hard-coded below, with and without
 * clip_grad_norm_. Every comparison prints its largest absolute difference
 * (maxdiff) and its largest relative difference against the tolerance.
 * hpu__sumsq is checked against a double loop and hpu__clip_factor against
 * the factors torch 1.13's clip_grad_norm_ applied.
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

#include "options/config.h"
#include "worker/strategy/optim.h"

#define N 37
#define STEPS 5
#define REL_TOL 1e-5
/* Relative differences of parameters are taken against
 * max(|want|, REL_FLOOR), so that a parameter that happens to pass near zero
 * is held to 1e-5 of the size of the parameters around it (|p| ~ 0.01..1)
 * rather than of itself. */
#define REL_FLOOR 1e-2
/* Adam's first step from p = 0 is a handful of fp32 operations: held to
 * 1e-6 relative to the step itself. */
#define FIRST_STEP_TOL 1e-6

/* ---- helpers ---- */

/* Gradients in [-1, 1); every 5th one below 1e-4, where Adam's eps (1e-8
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
	printf("  %-48s maxdiff %.3g  rel %.3g (tol %.0e)%s\n", what, maxdiff,
	       maxrel, tol, maxrel <= tol ? "" : "  FAIL");
	assert_true(maxrel <= tol);
}

static void check_close(const char *what, const float *got, const double *want,
			size_t n, double tol)
{
	check_rel(what, got, want, n, tol, REL_FLOOR);
}

/* An optimizer with its state memory, which the caller owns. */
typedef struct opt_mem {
	hpu_optim o;
	float *state;
} opt_mem;

static void opt_init(opt_mem *m, const hpu_train_opts *opts, size_t n)
{
	size_t floats = (size_t)hpu__optim_state_floats(opts) * n;
	m->state = floats ? calloc(floats, sizeof(float)) : NULL;
	assert_true(floats == 0 || m->state != NULL);
	hpu__optim_init(&m->o, opts, n, m->state);
}

static void opt_free(opt_mem *m)
{
	free(m->state);
	m->state = NULL;
}

/* ---- double references, following the PyTorch 1.13 documentation ---- */

typedef struct ref_hp {
	hpu_optim_kind kind;
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
static void ref_sgd(const ref_hp *h, ref_state *s, double *p, const double *g0,
		    double lr)
{
	for (int i = 0; i < N; i++) {
		double g = g0[i] + h->weight_decay * p[i];
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
		p[i] -= lr * g;
	}
}

/* torch.optim.Adam and torch.optim.AdamW (amsgrad off):
 *   Adam:  g = g + wd * p          AdamW: p = p * (1 - lr * wd)
 *   m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
 *   m_hat = m / (1 - b1^t);      v_hat = v / (1 - b2^t)
 *   p = p - lr * m_hat / (sqrt(v_hat) + eps) */
static void ref_adam(const ref_hp *h, ref_state *s, double *p, const double *g0,
		     double lr)
{
	const int adamw = h->kind == HPU_OPTIM_ADAMW;
	double bc1 = 1.0 - pow(h->beta1, (double)s->t);
	double bc2 = 1.0 - pow(h->beta2, (double)s->t);
	for (int i = 0; i < N; i++) {
		double g = g0[i];
		if (adamw)
			p[i] *= 1.0 - lr * h->weight_decay;
		else
			g += h->weight_decay * p[i];
		s->buf[i] = h->beta1 * s->buf[i] + (1.0 - h->beta1) * g;
		s->sq[i] = h->beta2 * s->sq[i] + (1.0 - h->beta2) * g * g;
		double m_hat = s->buf[i] / bc1, v_hat = s->sq[i] / bc2;
		p[i] -= lr * m_hat / (sqrt(v_hat) + h->eps);
	}
}

/* One step on the gradients gscale * g with learning rate lr. */
static void ref_step(const ref_hp *h, ref_state *s, double *p, const float *gf,
		     double gscale, double lr)
{
	double g[N];
	for (int i = 0; i < N; i++)
		g[i] = gscale * gf[i];
	s->t++;
	if (h->kind == HPU_OPTIM_SGD)
		ref_sgd(h, s, p, g, lr);
	else
		ref_adam(h, s, p, g, lr);
}

/* The training options that give the optimizer h. */
static void opts_from(hpu_train_opts *o, const ref_hp *h)
{
	hpu__opts_defaults(o);
	o->optimizer = h->kind;
	o->lr = h->lr;
	o->momentum = h->momentum;
	o->nesterov = h->nesterov;
	o->weight_decay = h->weight_decay;
	o->beta1 = h->beta1;
	o->beta2 = h->beta2;
	o->eps = h->eps;
}

/* ---- against the double reference ---- */

/* Per-step lr factors and gradient scales for the varying runs: the lr
 * goes up and down (as under warm-up and decay), the scale is 1 on some
 * steps (no clipping) and well below 1 on others. */
static const double lr_factor[STEPS] = {0.1, 1.0, 0.5, 2.0, 0.03};
static const float gscales[STEPS] = {1.0f, 0.25f, 1.0f, 0.0625f, 0.7f};

static void check_against_reference(const char *what, const ref_hp *h,
				    uint64_t seed, int vary)
{
	hpu_train_opts opts;
	opt_mem om;
	ref_state rs;
	float p[N], g[N];
	double pr[N];

	opts_from(&opts, h);
	opt_init(&om, &opts, N);
	memset(&rs, 0, sizeof(rs));
	rng_seed(seed);
	for (int i = 0; i < N; i++) {
		p[i] = rng_uniform(-1.0f, 1.0f);
		pr[i] = p[i];
	}
	for (int t = 1; t <= STEPS; t++) {
		char label[96];
		double lr = vary ? h->lr * lr_factor[t - 1] : h->lr;
		float gs = vary ? gscales[t - 1] : 1.0f;
		random_grad(g);
		hpu__optim_step(&om.o, p, g, gs, lr);
		ref_step(h, &rs, pr, g, gs, lr);
		assert_int_equal(om.o.t, t);
		snprintf(label, sizeof(label), "%s%s step %d", what,
			 vary ? " (lr, gscale vary)" : "", t);
		check_close(label, p, pr, N, REL_TOL);
	}
	opt_free(&om);
}

static void check_both(const char *what, const ref_hp *h, uint64_t seed)
{
	check_against_reference(what, h, seed, 0);
	check_against_reference(what, h, seed + 100, 1);
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
	check_both("sgd lr .1", &plain, 1);
	check_both("sgd lr .05 wd .1", &wd, 2);
	check_both("sgd lr .1 mom .9", &mom, 3);
	check_both("sgd lr .03 mom .8 wd .01", &mom_wd, 4);
	check_both("sgd lr .1 nesterov .9", &nest, 5);
	check_both("sgd lr .1 nesterov .9 wd .05", &nest_wd, 6);
}

static void test_adamw_reference(void **state)
{
	(void)state;
	const hpu_optim_kind k = HPU_OPTIM_ADAMW;
	const ref_hp def = {.kind = k, .lr = 1e-3, .weight_decay = 0.01,
			    .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
	const ref_hp nowd = {.kind = k, .lr = 1e-2, .beta1 = 0.9,
			     .beta2 = 0.999, .eps = 1e-8};
	const ref_hp big = {.kind = k, .lr = 3e-2, .weight_decay = 0.2,
			    .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6};
	const ref_hp eps = {.kind = k, .lr = 1e-2, .weight_decay = 0.01,
			    .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-4};
	check_both("adamw lr 1e-3 wd .01", &def, 11);
	check_both("adamw lr 1e-2 wd 0", &nowd, 12);
	check_both("adamw lr 3e-2 wd .2 b .8/.99 eps 1e-6", &big, 13);
	check_both("adamw lr 1e-2 wd .01 eps 1e-4", &eps, 14);
}

/* Adam's L2 decay acts through the moments, so wd large enough to matter
 * next to |g| ~ 0.5 (0.1, 0.5) is used as well as a small one. */
static void test_adam_reference(void **state)
{
	(void)state;
	const hpu_optim_kind k = HPU_OPTIM_ADAM;
	const ref_hp nowd = {.kind = k, .lr = 1e-3, .beta1 = 0.9,
			     .beta2 = 0.999, .eps = 1e-8};
	const ref_hp wd = {.kind = k, .lr = 1e-2, .weight_decay = 0.01,
			   .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
	const ref_hp big = {.kind = k, .lr = 3e-2, .weight_decay = 0.5,
			    .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6};
	const ref_hp eps = {.kind = k, .lr = 1e-2, .weight_decay = 0.1,
			    .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-4};
	check_both("adam lr 1e-3 wd 0", &nowd, 21);
	check_both("adam lr 1e-2 wd .01", &wd, 22);
	check_both("adam lr 3e-2 wd .5 b .8/.99 eps 1e-6", &big, 23);
	check_both("adam lr 1e-2 wd .1 eps 1e-4", &eps, 24);
}

/* ---- known values ---- */

/* SGD without momentum or weight decay is p -= lr * (gscale * g), bit for
 * bit in fp32, with lr and gscale changing every step. (Like the pre-scaled
 * test below, this holds while the compiler does not contract a multiply
 * and an add into an FMA: x86-64 without -mfma / -march=native.) */
static void test_sgd_plain_exact(void **state)
{
	(void)state;
	hpu_train_opts opts;
	opt_mem om;
	float p[N], g[N], want[N];
	hpu__opts_defaults(&opts);
	opts.optimizer = HPU_OPTIM_SGD;
	opts.momentum = 0.0;
	opts.lr = 0.1;
	opt_init(&om, &opts, N);
	assert_null(om.state);
	assert_true(om.o.weight_decay == 0.0); /* SGD's default */
	rng_seed(21);
	for (int i = 0; i < N; i++)
		p[i] = rng_uniform(-1.0f, 1.0f);
	for (int t = 0; t < STEPS; t++) {
		const double lr = opts.lr * lr_factor[t];
		const float lrf = (float)lr, gs = gscales[t] * 0.9f;
		random_grad(g);
		for (int i = 0; i < N; i++) {
			float gi = gs * g[i];
			want[i] = p[i] - lrf * gi;
		}
		hpu__optim_step(&om.o, p, g, gs, lr);
		assert_memory_equal(p, want, sizeof(p));
	}
	opt_free(&om);
}

/* Adam's first step is p -= lr * g / (|g| + eps) (with wd 0): every
 * parameter with a gradient well above eps moves by lr against its sign,
 * one without a gradient does not move. Same for Adam and AdamW. */
static void check_first_step(hpu_optim_kind kind)
{
	hpu_train_opts opts;
	opt_mem om;
	float p[N], g[N];
	double want[N];
	char label[96];
	const char *name = hpu__optim_name(kind);
	hpu__opts_defaults(&opts);
	opts.optimizer = kind;
	opts.weight_decay = 0.0;
	opt_init(&om, &opts, N);
	rng_seed(31);
	for (int i = 0; i < N; i++) /* 1e-3 <= |g| < 1.001, either sign */
		g[i] = (i % 2 ? -1.0f : 1.0f) * (1e-3f + rng_uniform(0, 1));
	g[0] = 0.0f;
	g[3] = 1000.0f;
	memset(p, 0, sizeof(p)); /* so that p is exactly the step taken */
	hpu__optim_step(&om.o, p, g, 1.0f, opts.lr);
	for (int i = 0; i < N; i++)
		want[i] = -opts.lr * g[i] / (fabs(g[i]) + opts.eps);
	/* dp itself to fp32 accuracy (torch 1.13 is within 1.2e-7 here) */
	snprintf(label, sizeof(label), "%s first step (p0 = 0), rel to dp", name);
	check_rel(label, p, want, N, FIRST_STEP_TOL, 1e-30);
	assert_true(p[0] == 0.0f);
	/* |g| >= 1e-3 >> eps = 1e-8: |dp| = lr to 1e-5, against the sign */
	double maxdev = 0.0;
	for (int i = 1; i < N; i++) {
		assert_true(p[i] * g[i] < 0.0f);
		maxdev = fmax(maxdev, fabs(fabs(p[i]) - opts.lr) / opts.lr);
	}
	snprintf(label, sizeof(label), "%s first step", name);
	printf("  %-48s max ||dp| - lr| / lr %.3g (tol %.0e)\n", label, maxdev,
	       2 * REL_TOL);
	assert_true(maxdev <= 2 * REL_TOL);
	opt_free(&om);
}

static void test_adam_first_step(void **state)
{
	(void)state;
	hpu_train_opts opts;
	opt_mem om;
	float p[N], g[N];
	double want[N];

	hpu__opts_defaults(&opts);
	assert_int_equal(opts.optimizer, HPU_OPTIM_ADAMW);
	check_first_step(HPU_OPTIM_ADAMW);
	check_first_step(HPU_OPTIM_ADAM);

	rng_seed(32);
	for (int i = 0; i < N; i++)
		g[i] = (i % 2 ? -1.0f : 1.0f) * (1e-3f + rng_uniform(0, 1));
	/* AdamW from a non-zero start, with the default wd resolved to 0.01 */
	hpu__opts_defaults(&opts);
	opts.lr = 1e-2;
	opt_init(&om, &opts, N);
	assert_true(om.o.weight_decay == 0.01);
	for (int i = 0; i < N; i++)
		p[i] = 0.5f;
	hpu__optim_step(&om.o, p, g, 1.0f, opts.lr);
	for (int i = 0; i < N; i++)
		want[i] = 0.5 * (1.0 - 1e-2 * 0.01) -
			  1e-2 * g[i] / (fabs(g[i]) + 1e-8);
	check_close("adamw first step (p0 = .5, wd .01)", p, want, N, REL_TOL);
	opt_free(&om);

	/* Adam: torch's default wd is 0; with wd 0.4 the step follows the
	 * sign of g + 0.4 * 0.5, not of g */
	hpu__opts_defaults(&opts);
	opts.optimizer = HPU_OPTIM_ADAM;
	opts.lr = 1e-2;
	opt_init(&om, &opts, N);
	assert_true(om.o.weight_decay == 0.0);
	opt_free(&om);
	opts.weight_decay = 0.4;
	opt_init(&om, &opts, N);
	for (int i = 0; i < N; i++)
		p[i] = 0.5f;
	hpu__optim_step(&om.o, p, g, 1.0f, opts.lr);
	for (int i = 0; i < N; i++) {
		double gi = g[i] + 0.4 * 0.5;
		want[i] = 0.5 - 1e-2 * gi / (fabs(gi) + 1e-8);
	}
	check_close("adam first step (p0 = .5, wd .4)", p, want, N, REL_TOL);
	opt_free(&om);
}

/* A step on g with gscale s is a step on the fp32 gradients s * g (what
 * clip_grad_norm_ leaves in p.grad) with gscale 1: the parameters and the
 * state agree bit for bit, step after step, lr changing too. (Bit for bit
 * holds because gscale * g is rounded to fp32 before anything else, and
 * the build does not contract it into an FMA: x86-64 without -mfma.) */
static void check_prescaled(const char *what, const ref_hp *h, uint64_t seed)
{
	static const float scales[STEPS] = {0.3f, 1.0f, 0.0123f, 0.7071f, 2.5f};
	hpu_train_opts opts;
	opt_mem a, b;
	float pa[N], pb[N], g[N], gp[N];
	opts_from(&opts, h);
	opt_init(&a, &opts, N);
	opt_init(&b, &opts, N);
	rng_seed(seed);
	for (int i = 0; i < N; i++)
		pa[i] = pb[i] = rng_uniform(-1.0f, 1.0f);
	for (int t = 0; t < STEPS; t++) {
		const double lr = h->lr * lr_factor[t];
		random_grad(g);
		for (int i = 0; i < N; i++)
			gp[i] = scales[t] * g[i];
		hpu__optim_step(&a.o, pa, g, scales[t], lr);
		hpu__optim_step(&b.o, pb, gp, 1.0f, lr);
		assert_memory_equal(pa, pb, sizeof(pa));
	}
	size_t floats = (size_t)hpu__optim_state_floats(&opts) * N;
	if (floats)
		assert_memory_equal(a.state, b.state, floats * sizeof(float));
	printf("  %-48s bit-identical (%zu state floats)\n", what, floats);
	opt_free(&a);
	opt_free(&b);
}

static void test_gscale_prescaled(void **state)
{
	(void)state;
	const ref_hp sgd = {.lr = 0.1, .weight_decay = 0.01};
	const ref_hp nest = {.lr = 0.1, .momentum = 0.9, .nesterov = 1,
			     .weight_decay = 0.05};
	const ref_hp adamw = {.kind = HPU_OPTIM_ADAMW, .lr = 1e-2,
			      .weight_decay = 0.1, .beta1 = 0.9,
			      .beta2 = 0.999, .eps = 1e-8};
	const ref_hp adam = {.kind = HPU_OPTIM_ADAM, .lr = 1e-2,
			     .weight_decay = 0.1, .beta1 = 0.9,
			     .beta2 = 0.999, .eps = 1e-8};
	check_prescaled("sgd wd .01: gscale vs pre-scaled g", &sgd, 51);
	check_prescaled("sgd nesterov: gscale vs pre-scaled g", &nest, 52);
	check_prescaled("adamw: gscale vs pre-scaled g", &adamw, 53);
	check_prescaled("adam: gscale vs pre-scaled g", &adam, 54);
}

/* How much state each optimizer asks for, where it puts it, and that it
 * writes nothing past it. */
static void test_state_layout(void **state)
{
	(void)state;
	static const struct {
		hpu_optim_kind kind;
		double momentum;
		int floats;
	} cases[] = {
	    {HPU_OPTIM_ADAMW, 0.0, 2}, {HPU_OPTIM_ADAM, 0.9, 2},
	    {HPU_OPTIM_SGD, 0.9, 1},   {HPU_OPTIM_SGD, 0.0, 0},
	};
	enum { GUARD = 8 };
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		hpu_train_opts opts;
		hpu_optim o;
		float mem[2 * N + GUARD], p[N], g[N];
		hpu__opts_defaults(&opts);
		opts.optimizer = cases[c].kind;
		opts.momentum = cases[c].momentum;
		const int floats = hpu__optim_state_floats(&opts);
		assert_int_equal(floats, cases[c].floats);
		memset(mem, 0, sizeof(mem));
		for (int i = floats * N; i < 2 * N + GUARD; i++)
			mem[i] = 12345.0f;
		hpu__optim_init(&o, &opts, N, floats ? mem : NULL);
		assert_ptr_equal(o.m, floats >= 1 ? mem : NULL);
		assert_ptr_equal(o.v, floats >= 2 ? mem + N : NULL);
		rng_seed(61);
		for (int i = 0; i < N; i++)
			p[i] = rng_uniform(-1.0f, 1.0f);
		for (int t = 0; t < STEPS; t++) {
			random_grad(g);
			hpu__optim_step(&o, p, g, 0.5f, 1e-2);
		}
		for (int i = floats * N; i < 2 * N + GUARD; i++)
			assert_true(mem[i] == 12345.0f);
		for (int i = 0; i < N; i++)
			assert_true(isfinite(p[i]));
	}
}

/* Two optimizers keep their state apart, and n = 0 works. */
static void test_independent_state(void **state)
{
	(void)state;
	hpu_train_opts opts;
	opt_mem a, b, z;
	float pa[N], pb[N], g[N];
	hpu__opts_defaults(&opts);
	opt_init(&a, &opts, N);
	opt_init(&b, &opts, N);
	opt_init(&z, &opts, 0);
	assert_null(z.state);
	rng_seed(41);
	for (int i = 0; i < N; i++)
		pa[i] = pb[i] = rng_uniform(-1.0f, 1.0f);
	for (int t = 0; t < STEPS; t++) {
		random_grad(g);
		hpu__optim_step(&a.o, pa, g, 1.0f, 1e-3);
		hpu__optim_step(&b.o, pb, g, 1.0f, 1e-3);
		hpu__optim_step(&z.o, pa, g, 1.0f, 1e-3); /* touches nothing */
	}
	assert_memory_equal(pa, pb, sizeof(pa));
	assert_int_equal(z.o.t, STEPS);
	opt_free(&a);
	opt_free(&b);
	opt_free(&z);
}

/* ---- hpu__sumsq ---- */

static double sumsq_ref(const float *g, size_t n)
{
	double s = 0.0;
	for (size_t i = 0; i < n; i++)
		s += (double)g[i] * (double)g[i];
	return s;
}

/* Against a double loop, at sizes around the block length (256) and
 * scales from 1e-15 to 1e15: relative 2e-6 (fp32 within 256-element
 * blocks); typically ~1e-9. */
static void test_sumsq(void **state)
{
	(void)state;
	static const size_t sizes[] = {0, 1, 7, 255, 256, 257, 1000, 4109,
				       100003};
	static const float scales[] = {1.0f, 1e-15f, 1e15f};
	const size_t maxn = 100003;
	float *g = malloc(maxn * sizeof(float));
	assert_non_null(g);
	double worst = 0.0;
	rng_seed(71);
	for (size_t s = 0; s < sizeof(scales) / sizeof(scales[0]); s++) {
		for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
			size_t n = sizes[k];
			for (size_t i = 0; i < n; i++)
				g[i] = scales[s] * rng_uniform(-1.0f, 1.0f);
			double got = hpu__sumsq(g, n), want = sumsq_ref(g, n);
			double rel = n ? fabs(got - want) / want : fabs(got);
			if (!(rel <= 2e-6))
				printf("  sumsq n %zu scale %g: %.17g vs %.17g\n",
				       n, scales[s], got, want);
			assert_true(rel <= 2e-6);
			worst = fmax(worst, rel);
		}
	}
	printf("  %-48s rel %.3g (tol 2e-06)\n", "hpu__sumsq vs double loop",
	       worst);

	/* squares that overflow fp32 (|g| = 1e20) are summed in double */
	for (size_t i = 0; i < 1000; i++)
		g[i] = rng_uniform(-1.0f, 1.0f);
	g[300] = 1e20f;
	g[301] = -3e25f;
	double got = hpu__sumsq(g, 1000), want = sumsq_ref(g, 1000);
	printf("  %-48s %.9g vs %.9g\n", "hpu__sumsq with |g| = 3e25", got,
	       want);
	assert_true(isfinite(got) && fabs(got - want) <= 1e-12 * want);
	/* NaN and inf come through */
	g[301] = INFINITY;
	assert_true(isinf(hpu__sumsq(g, 1000)));
	g[301] = NAN;
	assert_true(isnan(hpu__sumsq(g, 1000)));
	g[301] = 0.0f;
	g[999] = NAN; /* in the tail after the last whole block */
	assert_true(isnan(hpu__sumsq(g, 1000)));
	free(g);
}

/* ---- hpu__clip_factor against torch 1.13 ----
 *
 * Produced with torch 1.13.0a0 (/usr/bin/python3): for each (x, max_norm),
 * a.grad = torch.tensor([x]), b.grad = torch.tensor([1.0]),
 * n = torch.nn.utils.clip_grad_norm_([a, b], max_norm); printed "%.9g" of n
 * (the fp32 total norm sqrt(x^2 + 1)) and of b.grad afterwards, which is
 * exactly the factor torch applied (1.0 * coef). hpu__clip_factor of that
 * norm must give the same fp32 value, bit for bit. */
static const struct {
	double norm, max_norm;
	float coef;
} torch_clip[] = {
	{1, 2, 1.0f},                           /* x = 0 */
	{1.11803401, 2, 1.0f},                  /* x = 0.5 */
	{1.41421354, 1, 0.707106292f},          /* x = 1 */
	{3.1622777, 1, 0.316227674f},           /* x = 3 */
	{3.1622777, 0.1, 0.0316227674f},        /* x = 3 */
	{100.004997, 1, 0.00999950059f},        /* x = 100 */
	{1000000, 5, 4.99999987e-06f},          /* x = 1e6 */
	{INFINITY, 1, 0.0f},                    /* x = 1e20: fp32 norm inf */
	{1.00000048, 1.0000005, 0.999999046f},  /* x = 0.001 */
	{2.23606801, 2.236068, 0.999999583f},   /* x = 2: norm == max_norm */
	{7.07106781, 0.001, 0.000141421333f},   /* x = 7 */
	{1.41421354, 1000000, 1.0f},            /* x = 1 */
};

static void test_clip_factor(void **state)
{
	(void)state;
	for (size_t c = 0; c < sizeof(torch_clip) / sizeof(torch_clip[0]); c++) {
		float got = hpu__clip_factor(torch_clip[c].norm,
					     torch_clip[c].max_norm);
		if (got != torch_clip[c].coef)
			printf("  clip norm %.9g max %.9g: %.9g, torch %.9g\n",
			       torch_clip[c].norm, torch_clip[c].max_norm,
			       (double)got, (double)torch_clip[c].coef);
		assert_true(got == torch_clip[c].coef);
	}
	/* no gradient at all: max_norm / 1e-6, clamped */
	assert_true(hpu__clip_factor(0.0, 1.0) == 1.0f);
	/* a NaN norm gives NaN, as torch's clamp does */
	assert_true(isnan(hpu__clip_factor(NAN, 1.0)));
	printf("  %-48s %zu cases bit-identical\n",
	       "hpu__clip_factor vs clip_grad_norm_",
	       sizeof(torch_clip) / sizeof(torch_clip[0]));
}

/* ---- against torch 1.13 ----
 *
 * Produced with Debian's torch 1.13.0a0 (/usr/bin/python3) from the inputs
 * of torch_p0() and torch_grad() (all exact in fp32): p = torch.tensor(p0,
 * float32, requires_grad=True); per step p.grad = torch.tensor(g_s);
 * opt.step(); then "%.9g" of the final p after 5 steps, for
 *   torch.optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True,
 *                   weight_decay=0.01)
 *   torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.999), eps=1e-8,
 *                     weight_decay=0.1)
 *   torch.optim.Adam([p], lr=0.01, betas=(0.9, 0.999), eps=1e-8,
 *                    weight_decay=0.1)
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

static const float torch_adam[N] = {
	-1.07504106f, 0.681864619f, 0.163847536f, -0.295375824f,
	-0.782259285f, 0.986096025f, 0.450097769f, -0.00763072632f,
	-0.518550277f, -0.990777612f, 0.792265892f, 0.332899392f,
	-0.137821987f, -0.713054419f, 1.12684202f, 0.621271253f,
	0.109326109f, -0.362318277f, -0.825053215f, 0.960950315f,
	0.432967782f, -0.084820807f, -0.544041395f, -1.03124452f,
	0.700063229f, 0.249764845f, -0.256053627f, -0.767412424f,
	1.06088352f, 0.543711543f, 0.0142834699f, -0.403930068f,
	-0.961799443f, 0.878254175f, 0.372786045f, -0.139496982f,
	-0.575076699f,
};

/* The same inputs with clipping and a different lr every step: per step
 * opt.param_groups[0]['lr'] = lr_s; p.grad = torch.tensor(g_s);
 * n_s = torch.nn.utils.clip_grad_norm_([p], 2.0); opt.step(), with
 * lr_s = (0.01, 0.02, 0.005, 0.015, 0.001) for AdamW and Adam and 10 times
 * that for SGD, and otherwise
 *   torch.optim.SGD([p], lr=1, momentum=0.9, weight_decay=0.01)
 *   torch.optim.AdamW([p], lr=1, betas=(0.9, 0.999), eps=1e-8,
 *                     weight_decay=0.1)
 *   torch.optim.Adam([p], lr=1, betas=(0.9, 0.999), eps=1e-8,
 *                    weight_decay=0.1)
 * The norms n_s clip_grad_norm_ returned (all above 2, so every step is
 * clipped) are torch_norms. */
static const double torch_lrs[STEPS] = {0.01, 0.02, 0.005, 0.015, 0.001};
#define TORCH_MAX_NORM 2.0
static const double torch_norms[STEPS] = {
	3.7207190990448, 3.77077579498291, 3.7852509021759033,
	3.6848506927490234, 3.7479159832000732,
};

static const float torch_sgd_clip[N] = {
	-1.11183488f, 0.575441897f, 0.0167288557f, -0.227034882f,
	-0.593480229f, 0.905609667f, 0.494149327f, 0.0532080531f,
	-0.733147919f, -1.01416266f, 0.712570012f, 0.468806267f,
	-0.185302034f, -0.926187515f, 1.11549449f, 0.749049187f,
	-0.0373068005f, -0.318321615f, -0.864763677f, 1.16464746f,
	0.328366697f, -0.230346367f, -0.474110156f, -0.84055537f,
	0.741224408f, 0.172578111f, -0.193867192f, -0.980223238f,
	1.02420795f, 0.465494812f, 0.0617712438f, -0.144714251f,
	-1.17326283f, 0.868419349f, 0.501973987f, -0.284381986f,
	-0.61768806f,
};

static const float torch_adamw_clip[N] = {
	-1.09202325f, 0.680022538f, 0.162224248f, -0.295706093f,
	-0.784042716f, 0.976483345f, 0.498471886f, 0.0010518037f,
	-0.526485503f, -0.992939651f, 0.79237622f, 0.332608968f,
	-0.148113564f, -0.715060472f, 1.127406f, 0.630344808f,
	0.100230813f, -0.364632547f, -0.87820822f, 0.960014343f,
	0.431295156f, -0.0865030363f, -0.544433415f, -1.0327698f,
	0.727787197f, 0.249749199f, -0.247675523f, -0.775212705f,
	1.05906045f, 0.543648899f, 0.0838501751f, -0.396697551f,
	-0.963787854f, 0.87867856f, 0.381617606f, -0.148496479f,
	-0.621818244f,
};

static const float torch_adam_clip[N] = {
	-1.07403564f, 0.678223908f, 0.161141589f, -0.2941899f,
	-0.773155749f, 0.973338783f, 0.449086785f, 0.00106209051f,
	-0.52539432f, -0.988224864f, 0.786596656f, 0.331217855f,
	-0.136796564f, -0.711549044f, 1.12141943f, 0.626592755f,
	0.0999206826f, -0.36280331f, -0.824046612f, 0.956622422f,
	0.430048883f, -0.0860593766f, -0.541796267f, -1.0219661f,
	0.699055433f, 0.248456046f, -0.245969817f, -0.773421407f,
	1.05538583f, 0.539437532f, 0.013309245f, -0.396773309f,
	-0.958567083f, 0.873881221f, 0.379526109f, -0.14808616f,
	-0.574067652f,
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

/* Runs h on the torch inputs; with `clip`, the lr is lr_scale *
 * torch_lrs[s] and the gradients are clipped to TORCH_MAX_NORM through
 * hpu__sumsq and hpu__clip_factor, as the worker does. */
static void check_against_torch(const char *what, const ref_hp *h,
				const float *want_f, int clip, double lr_scale)
{
	hpu_train_opts opts;
	opt_mem om;
	ref_state rs;
	float p[N], g[N];
	double pr[N], want[N], maxnorm = 0.0;
	opts_from(&opts, h);
	opt_init(&om, &opts, N);
	memset(&rs, 0, sizeof(rs));
	torch_p0(p);
	for (int i = 0; i < N; i++)
		pr[i] = p[i];
	for (int s = 0; s < STEPS; s++) {
		double lr = clip ? lr_scale * torch_lrs[s] : h->lr;
		float gs = 1.0f;
		torch_grad(g, s);
		if (clip) {
			double norm = sqrt(hpu__sumsq(g, N));
			maxnorm = fmax(maxnorm, fabs(norm - torch_norms[s]) /
						    torch_norms[s]);
			gs = hpu__clip_factor(norm, TORCH_MAX_NORM);
			assert_true(gs < 1.0f);
		}
		hpu__optim_step(&om.o, p, g, gs, lr);
		ref_step(h, &rs, pr, g, gs, lr);
	}
	if (clip) {
		printf("  %-48s rel %.3g (tol 1e-06)\n",
		       "sqrt(hpu__sumsq) vs torch's norms", maxnorm);
		assert_true(maxnorm <= 1e-6);
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
	opt_free(&om);
}

static void test_against_torch(void **state)
{
	(void)state;
	const ref_hp sgd = {.lr = 0.1, .momentum = 0.9, .nesterov = 1,
			    .weight_decay = 0.01};
	const ref_hp adamw = {.kind = HPU_OPTIM_ADAMW, .lr = 0.01,
			      .weight_decay = 0.1, .beta1 = 0.9,
			      .beta2 = 0.999, .eps = 1e-8};
	const ref_hp adam = {.kind = HPU_OPTIM_ADAM, .lr = 0.01,
			     .weight_decay = 0.1, .beta1 = 0.9,
			     .beta2 = 0.999, .eps = 1e-8};
	const ref_hp sgd_mom = {.lr = 1, .momentum = 0.9,
				.weight_decay = 0.01};
	check_against_torch("sgd nesterov", &sgd, torch_sgd, 0, 1);
	check_against_torch("adamw", &adamw, torch_adamw, 0, 1);
	check_against_torch("adam", &adam, torch_adam, 0, 1);
	check_against_torch("sgd mom, clip + lr per step", &sgd_mom,
			    torch_sgd_clip, 1, 10);
	check_against_torch("adamw, clip + lr per step", &adamw,
			    torch_adamw_clip, 1, 1);
	check_against_torch("adam, clip + lr per step", &adam, torch_adam_clip,
			    1, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_sgd_reference),
	    cmocka_unit_test(test_adamw_reference),
	    cmocka_unit_test(test_adam_reference),
	    cmocka_unit_test(test_sgd_plain_exact),
	    cmocka_unit_test(test_adam_first_step),
	    cmocka_unit_test(test_gscale_prescaled),
	    cmocka_unit_test(test_state_layout),
	    cmocka_unit_test(test_independent_state),
	    cmocka_unit_test(test_sumsq),
	    cmocka_unit_test(test_clip_factor),
	    cmocka_unit_test(test_against_torch),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
