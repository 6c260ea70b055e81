/* Unit tests for the learning-rate schedules (worker/runtime/lrsched.c).
 *
 * hpu__sched_lr(s, k) is the lr of optimizer step k (0-based): the value a
 * torch or DeepSpeed scheduler holds after k scheduler.step() calls, with
 * optimizer.step() before scheduler.step() in every iteration.
 *
 * StepLR and CosineAnnealingLR are compared with values printed by torch
 * 1.13 itself, hard-coded below. DeepSpeed is not installed here, so
 * WarmupLR and WarmupDecayLR are compared with a double-precision model of
 * DeepSpeed's scheduler objects written in this file from
 * deepspeed/runtime/lr_schedules.py (an object with last_batch_iteration
 * that step() advances and that sets the optimizer's lr; the constructor
 * sets it to warmup_min_lr), and with a few values worked out by hand.
 * Every comparison prints its largest difference relative to the peak lr.
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

#include "options/config.h"
#include "worker/runtime/lrsched.h"

/* Differences are taken relative to the peak lr: torch's recursive forms
 * and the closed forms agree to a few ulps of it, and an lr that passes
 * through 0 (cosine with eta_min 0) has no relative error of its own. */
#define TOL 1e-12

static void check_lrs(const char *what, const hpu_sched *s, const double *want,
		      long n)
{
	double maxdiff = 0.0;
	for (long k = 0; k < n; k++) {
		double got = hpu__sched_lr(s, k);
		double d = fabs(got - want[k]) / s->lr;
		if (!(d <= TOL))
			printf("  %s: k %ld: %.17g, want %.17g\n", what, k, got,
			       want[k]);
		if (!(d <= maxdiff))
			maxdiff = isnan(d) ? INFINITY : d;
	}
	printf("  %-52s %3ld steps, maxdiff/lr %.3g (tol %.0e)%s\n", what, n,
	       maxdiff, TOL, maxdiff <= TOL ? "" : "  FAIL");
	assert_true(maxdiff <= TOL);
}

static void close_to(const hpu_sched *s, long k, double want)
{
	double got = hpu__sched_lr(s, k);
	if (!(fabs(got - want) <= TOL * s->lr))
		printf("  k %ld: %.17g, want %.17g\n", k, got, want);
	assert_true(fabs(got - want) <= TOL * s->lr);
}

/* ---- constant ---- */

static void test_constant(void **state)
{
	(void)state;
	hpu_train_opts o;
	hpu_sched s;
	hpu__opts_defaults(&o);
	assert_int_equal(o.sched, HPU_SCHED_CONSTANT);
	o.lr = 0.25;
	o.warmup_min_lr = 0.1; /* belongs to the warm-up schedules only */
	hpu__sched_init(&s, &o, 100);
	assert_int_equal(s.total_steps, 100);
	for (long k = 0; k < 300; k += 7)
		assert_true(hpu__sched_lr(&s, k) == 0.25);
}

/* ---- torch 1.13 ----
 *
 * Produced with Debian's torch 1.13.0a0 (/usr/bin/python3): p =
 * torch.zeros(1, requires_grad=True); opt = torch.optim.SGD([p], lr=LR);
 * sched = <scheduler>(opt, ...); then for each k: record
 * opt.param_groups[0]['lr'] ("%.17g"), opt.step(), sched.step(). */

/* StepLR(step_size=3, gamma=0.5), LR 0.1 */
static const double torch_step[] = {
	0.10000000000000001, 0.10000000000000001, 0.10000000000000001,
	0.050000000000000003, 0.050000000000000003, 0.050000000000000003,
	0.025000000000000001, 0.025000000000000001, 0.025000000000000001,
	0.012500000000000001, 0.012500000000000001, 0.012500000000000001,
	0.0062500000000000003,
};

/* StepLR(step_size=2, gamma=0.1), LR 0.3 */
static const double torch_step2[] = {
	0.29999999999999999, 0.29999999999999999, 0.029999999999999999,
	0.029999999999999999, 0.0030000000000000001, 0.0030000000000000001,
	0.00030000000000000003, 0.00030000000000000003, 3.0000000000000004e-05,
	3.0000000000000004e-05, 3.0000000000000005e-06,
};

/* CosineAnnealingLR(T_max=10, eta_min=0.001), LR 0.1: down to eta_min at
 * k = 10, back up to LR at 20 and down again at 30 (torch's recursion
 * continues the cosine past T_max; so does the closed form). */
static const double torch_cos[] = {
	0.10000000000000001, 0.097577297556610113, 0.090546341221559898,
	0.079595369988477424, 0.065796341221559904, 0.050500000000000003,
	0.03520365877844011, 0.021404630011522589, 0.010453658778440109,
	0.0034227024433899004, 0.001, 0.0034227024433899004,
	0.01045365877844014, 0.021404630011522669, 0.035203658778440255,
	0.050500000000000218, 0.065796341221560181, 0.079595369988477771,
	0.090546341221560314, 0.097577297556610543, 0.10000000000000045,
	0.097577297556610543, 0.090546341221560328, 0.079595369988477785,
	0.065796341221560195, 0.050500000000000225, 0.035203658778440269,
	0.021404630011522683, 0.010453658778440154, 0.0034227024433899161,
	0.001,
};

/* CosineAnnealingLR(T_max=7) (eta_min 0), LR 0.05 */
static const double torch_cos0[] = {
	0.050000000000000003, 0.04752422169756048, 0.040587245046468344,
	0.030563023348907863, 0.019436976651092144, 0.009412754953531664,
	0.002475778302439524, 0, 0.0024757783024395214,
	0.009412754953531657, 0.019436976651092137, 0.030563023348907838,
	0.040587245046468337, 0.047524221697560494, 0.05000000000000001,
	0.047524221697560494,
};

#define COUNT(a) ((long)(sizeof(a) / sizeof((a)[0])))

static void test_step_torch(void **state)
{
	(void)state;
	hpu_train_opts o;
	hpu_sched s;
	hpu__opts_defaults(&o);
	o.sched = HPU_SCHED_STEP;
	o.lr = 0.1;
	o.step_size = 3;
	o.gamma = 0.5;
	hpu__sched_init(&s, &o, 1000);
	check_lrs("StepLR(3, 0.5) vs torch 1.13", &s, torch_step,
		  COUNT(torch_step));
	o.lr = 0.3;
	o.step_size = 2;
	o.gamma = 0.1;
	hpu__sched_init(&s, &o, 1000);
	check_lrs("StepLR(2, 0.1) vs torch 1.13", &s, torch_step2,
		  COUNT(torch_step2));
	/* the defaults: x0.1 every 1000 steps */
	hpu__opts_defaults(&o);
	o.sched = HPU_SCHED_STEP;
	hpu__sched_init(&s, &o, 5000);
	close_to(&s, 999, 1e-3);
	close_to(&s, 1000, 1e-4);
	close_to(&s, 2999, 1e-5);
}

static void test_cosine_torch(void **state)
{
	(void)state;
	hpu_train_opts o;
	hpu_sched s;
	hpu__opts_defaults(&o);
	o.sched = HPU_SCHED_COSINE;
	o.lr = 0.1;
	o.min_lr = 0.001;
	o.total_steps = 10;
	hpu__sched_init(&s, &o, 500); /* total_steps given: run_steps unused */
	assert_int_equal(s.total_steps, 10);
	check_lrs("CosineAnnealingLR(10, 1e-3) vs torch 1.13", &s, torch_cos,
		  COUNT(torch_cos));

	/* total_steps 0: the run's steps are T_max */
	o.total_steps = 0;
	hpu__sched_init(&s, &o, 10);
	assert_int_equal(s.total_steps, 10);
	check_lrs("  the same, T_max from run_steps = 10", &s, torch_cos,
		  COUNT(torch_cos));

	o.lr = 0.05;
	o.min_lr = 0.0;
	o.total_steps = 7;
	hpu__sched_init(&s, &o, 0);
	check_lrs("CosineAnnealingLR(7) vs torch 1.13", &s, torch_cos0,
		  COUNT(torch_cos0));
	assert_true(fabs(hpu__sched_lr(&s, 7)) <= 1e-18);
}

/* ---- DeepSpeed WarmupLR / WarmupDecayLR ---- */

/* A model of DeepSpeed's scheduler objects (lr_schedules.py, warmup_type
 * in {log, linear}), one parameter group. */
typedef struct ds_sched {
	int decay;                /* WarmupDecayLR */
	int linear;               /* warmup_type "linear" */
	double min_lr, delta_lr;  /* warmup_min_lr, max_lr - min_lr */
	long warmup_num_steps;    /* max(2, warmup_num_steps) */
	double inverse_log_warm_up;
	long total_num_steps;
	long last_batch_iteration;
	double group_lr;          /* optimizer.param_groups[0]['lr'] */
} ds_sched;

static double ds_get_gamma(const ds_sched *d)
{
	long it = d->last_batch_iteration;
	if (it < d->warmup_num_steps) {
		if (!d->linear)
			return d->inverse_log_warm_up * log((double)(it + 1));
		return (double)it / (double)d->warmup_num_steps;
	}
	if (!d->decay)
		return 1.0;
	double num = (double)(d->total_num_steps - it);
	double den = (double)(d->total_num_steps - d->warmup_num_steps);
	if (den < 1.0)
		den = 1.0;
	double g = num / den;
	return g > 0.0 ? g : 0.0;
}

/* get_lr(): warmup_min_lr before the first step, as the constructor sets */
static double ds_get_lr(const ds_sched *d)
{
	if (d->last_batch_iteration < 0)
		return d->min_lr;
	return d->min_lr + d->delta_lr * ds_get_gamma(d);
}

static void ds_init(ds_sched *d, const hpu_train_opts *o, long total)
{
	memset(d, 0, sizeof(*d));
	d->decay = o->sched == HPU_SCHED_WARMUP_DECAY;
	d->linear = o->warmup_type == HPU_WARMUP_LINEAR;
	d->min_lr = o->warmup_min_lr;
	d->delta_lr = o->lr - o->warmup_min_lr;
	d->warmup_num_steps = o->warmup_steps < 2 ? 2 : o->warmup_steps;
	d->inverse_log_warm_up = 1.0 / log((double)d->warmup_num_steps);
	d->total_num_steps = total;
	d->last_batch_iteration = -1;
	d->group_lr = ds_get_lr(d); /* "Initialize lr in optimizer" */
}

static void ds_step(ds_sched *d)
{
	d->last_batch_iteration++;
	d->group_lr = ds_get_lr(d);
}

/* The lrs the optimizer sees for steps 0..n-1: read, optimizer.step(),
 * scheduler.step(). */
static void ds_run(const hpu_train_opts *o, long total, double *out, long n)
{
	ds_sched d;
	ds_init(&d, o, total);
	for (long k = 0; k < n; k++) {
		out[k] = d.group_lr;
		ds_step(&d);
	}
}

static void check_ds(const char *what, const hpu_train_opts *o, long run_steps,
		     long n)
{
	hpu_sched s;
	double *want = malloc((size_t)n * sizeof(double));
	assert_non_null(want);
	hpu__sched_init(&s, o, run_steps);
	ds_run(o, o->total_steps ? o->total_steps : run_steps, want, n);
	check_lrs(what, &s, want, n);
	free(want);
}

static void warm_opts(hpu_train_opts *o, hpu_sched_kind kind,
		      hpu_warmup_type type, long warmup, long total,
		      double min_lr, double lr)
{
	hpu__opts_defaults(o);
	o->sched = kind;
	o->warmup_type = type;
	o->warmup_steps = warmup;
	o->total_steps = total;
	o->warmup_min_lr = min_lr;
	o->lr = lr;
}

static void test_warmup_log(void **state)
{
	(void)state;
	hpu_train_opts o;
	hpu_sched s;
	warm_opts(&o, HPU_SCHED_WARMUP, HPU_WARMUP_LOG, 10, 0, 1e-5, 1e-3);
	check_ds("WarmupLR log, 10 steps vs DeepSpeed model", &o, 100, 40);
	hpu__sched_init(&s, &o, 100);
	/* by hand: steps 0 and 1 at warmup_min_lr (log(0 + 1) = 0), step k at
	 * min + (max - min) * log(k) / log(10), the peak at k = 10 */
	close_to(&s, 0, 1e-5);
	close_to(&s, 1, 1e-5);
	close_to(&s, 2, 1e-5 + 99e-5 * log(2.0) / log(10.0));
	close_to(&s, 5, 1e-5 + 99e-5 * log(5.0) / log(10.0));
	close_to(&s, 10, 1e-3);
	close_to(&s, 11, 1e-3);
	close_to(&s, 100000, 1e-3);
	/* DeepSpeed's defaults: 1000 steps from 0 */
	warm_opts(&o, HPU_SCHED_WARMUP, HPU_WARMUP_LOG, 1000, 0, 0.0, 1e-3);
	check_ds("WarmupLR log, 1000 steps vs DeepSpeed model", &o, 10, 1200);
}

static void test_warmup_linear(void **state)
{
	(void)state;
	hpu_train_opts o;
	hpu_sched s;
	warm_opts(&o, HPU_SCHED_WARMUP, HPU_WARMUP_LINEAR, 8, 0, 0.0, 0.1);
	check_ds("WarmupLR linear, 8 steps vs DeepSpeed model", &o, 100, 30);
	hpu__sched_init(&s, &o, 100);
	/* by hand: step k at max * (k - 1) / 8 up to k = 8, then max */
	close_to(&s, 0, 0.0);
	close_to(&s, 1, 0.0);
	close_to(&s, 2, 0.1 / 8);
	close_to(&s, 8, 0.1 * 7 / 8);
	close_to(&s, 9, 0.1);
	close_to(&s, 29, 0.1);
	warm_opts(&o, HPU_SCHED_WARMUP, HPU_WARMUP_LINEAR, 8, 0, 0.02, 0.1);
	check_ds("WarmupLR linear, min .02 vs DeepSpeed model", &o, 100, 30);
}

/* warmup_num_steps below 2 is raised to 2 (DeepSpeed does), which also
 * keeps 1 / log(warmup_num_steps) finite. */
static void test_warmup_short(void **state)
{
	(void)state;
	hpu_train_opts o;
	hpu_sched s;
	for (long w = 0; w <= 2; w++) {
		warm_opts(&o, HPU_SCHED_WARMUP_DECAY, HPU_WARMUP_LOG, w, 10,
			  0.0, 1.0);
		hpu__sched_init(&s, &o, 0);
		assert_int_equal(s.warmup_steps, 2);
		close_to(&s, 0, 0.0);
		close_to(&s, 1, 0.0);
		close_to(&s, 2, 1.0); /* log(2) / log(2) */
		close_to(&s, 3, 1.0); /* (10 - 2) / (10 - 2) */
		close_to(&s, 4, 7.0 / 8.0);
		char what[64];
		snprintf(what, sizeof(what),
			 "WarmupDecayLR, warmup %ld vs DeepSpeed model", w);
		check_ds(what, &o, 0, 15);
	}
}

static void test_warmup_decay(void **state)
{
	(void)state;
	hpu_train_opts o;
	hpu_sched s;

	/* log warm-up over 10 steps, then linear decay to warmup_min_lr
	 * (gamma 0) at last_batch_iteration = total_steps = 50 */
	warm_opts(&o, HPU_SCHED_WARMUP_DECAY, HPU_WARMUP_LOG, 10, 50, 1e-4,
		  1e-2);
	check_ds("WarmupDecayLR log 10/50 vs DeepSpeed model", &o, 1000, 70);
	hpu__sched_init(&s, &o, 1000);
	assert_int_equal(s.total_steps, 50);
	close_to(&s, 0, 1e-4);
	close_to(&s, 10, 1e-2); /* the end of warm-up: log(10) / log(10) */
	close_to(&s, 11, 1e-2); /* (50 - 10) / (50 - 10) */
	close_to(&s, 31, 1e-4 + (1e-2 - 1e-4) * 20.0 / 40.0);
	/* the last step of a 50-step run still has 2/40 of the range... */
	close_to(&s, 49, 1e-4 + (1e-2 - 1e-4) * 2.0 / 40.0);
	close_to(&s, 50, 1e-4 + (1e-2 - 1e-4) * 1.0 / 40.0);
	/* ...gamma reaches 0 after total_steps scheduler steps and stays */
	assert_true(hpu__sched_lr(&s, 51) == 1e-4);
	assert_true(hpu__sched_lr(&s, 52) == 1e-4);
	assert_true(hpu__sched_lr(&s, 10000) == 1e-4);

	/* linear warm-up, min 0: the decay reaches exactly 0 */
	warm_opts(&o, HPU_SCHED_WARMUP_DECAY, HPU_WARMUP_LINEAR, 5, 20, 0.0,
		  0.1);
	check_ds("WarmupDecayLR linear 5/20 vs DeepSpeed model", &o, 1000, 30);
	hpu__sched_init(&s, &o, 1000);
	close_to(&s, 5, 0.1 * 4 / 5);
	close_to(&s, 6, 0.1);
	close_to(&s, 16, 0.1 * 5 / 15);
	assert_true(hpu__sched_lr(&s, 21) == 0.0);
	assert_true(hpu__sched_lr(&s, 25) == 0.0);

	/* total_steps below warmup_num_steps: full warm-up, then gamma
	 * (6 - it) / max(1, 6 - 10) < 0, clamped to 0 */
	warm_opts(&o, HPU_SCHED_WARMUP_DECAY, HPU_WARMUP_LOG, 10, 6, 1e-3,
		  1e-2);
	check_ds("WarmupDecayLR total 6 < warmup 10 vs DeepSpeed model", &o,
		 1000, 20);
	hpu__sched_init(&s, &o, 1000);
	close_to(&s, 10, 1e-2);
	assert_true(hpu__sched_lr(&s, 11) == 1e-3);
}

/* total_steps 0: the number of optimizer steps in this run stands in. */
static void test_decay_run_steps(void **state)
{
	(void)state;
	hpu_train_opts o;
	hpu_sched a, b;
	warm_opts(&o, HPU_SCHED_WARMUP_DECAY, HPU_WARMUP_LINEAR, 10, 0, 0.0,
		  1e-3);
	hpu__sched_init(&a, &o, 40);
	assert_int_equal(a.total_steps, 40);
	o.total_steps = 40;
	hpu__sched_init(&b, &o, 7777);
	assert_int_equal(b.total_steps, 40);
	for (long k = 0; k < 60; k++)
		assert_true(hpu__sched_lr(&a, k) == hpu__sched_lr(&b, k));
	o.total_steps = 0;
	check_ds("WarmupDecayLR, total from run_steps 40", &o, 40, 60);
	assert_true(hpu__sched_lr(&a, 41) == 0.0);
	assert_true(hpu__sched_lr(&a, 40) > 0.0);

	/* no steps at all (and total_steps 0): a schedule still comes out */
	hpu__sched_init(&a, &o, 0);
	assert_true(a.total_steps >= 1);
	o.sched = HPU_SCHED_COSINE;
	hpu__sched_init(&a, &o, 0);
	assert_true(a.total_steps >= 1);
	assert_true(isfinite(hpu__sched_lr(&a, 0)));
	assert_true(hpu__sched_lr(&a, 0) == 1e-3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_constant),
	    cmocka_unit_test(test_step_torch),
	    cmocka_unit_test(test_cosine_torch),
	    cmocka_unit_test(test_warmup_log),
	    cmocka_unit_test(test_warmup_linear),
	    cmocka_unit_test(test_warmup_short),
	    cmocka_unit_test(test_warmup_decay),
	    cmocka_unit_test(test_decay_run_steps),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
