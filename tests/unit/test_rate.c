/* rate (worker/runtime/rate.h): samples/s at given times. The warm-up's
 * steps are left out, a run no longer than the warm-up is measured whole,
 * log lines give the rate since the last one, and the time spent
 * validating or saving (hpu__rate_pause) is in no figure: a run of
 * 40 steps at 0.01 s a step with a 2 s validation after step 20 read
 * 1.5x to 40x slower than the same steps without it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "worker/runtime/rate.h"

#define BATCH 64
#define STEP_S 0.01

static void near(double got, double want)
{
	if (fabs(got - want) > 1e-6 * want)
		fail_msg("%.6f, want %.6f", got, want);
}

/* 40 steps at STEP_S from t = 100, warm-up 1, a pause of `pause` s after
 * step 20 (not counted); returns the final rate, and the log rate of the
 * step-30 line (logs every 10) in *log30. */
static double run(double pause, double *log30)
{
	hpu_rate R;
	double t = 100;
	hpu__rate_start(&R, 1, 0, t);
	for (long step = 1; step <= 40; step++) {
		t += STEP_S;
		hpu__rate_tick(&R, step, t);
		if (step % 10 == 0) {
			double sps = hpu__rate_log(&R, step, t, BATCH);
			if (step == 30)
				*log30 = sps;
		}
		if (step == 20) {
			double tp = t;
			t += pause; /* validating, saving */
			hpu__rate_pause(&R, t - tp);
		}
	}
	return hpu__rate_final(&R, 40, t, BATCH);
}

static void test_pause_left_out(void **state)
{
	(void)state;
	double log_plain = 0, log_paused = 0;
	double plain = run(0, &log_plain), paused = run(2.0, &log_paused);
	near(plain, BATCH / STEP_S);
	near(paused, BATCH / STEP_S);
	near(log_plain, BATCH / STEP_S);
	near(log_paused, BATCH / STEP_S);
}

static void test_warmup_and_short_run(void **state)
{
	(void)state;
	hpu_rate R;
	/* the first step takes 1 s (allocation): left out */
	hpu__rate_start(&R, 1, 0, 0);
	hpu__rate_tick(&R, 1, 1.0);
	assert_false(hpu__rate_measuring(&R, 1));
	assert_true(hpu__rate_log(&R, 1, 1.0, BATCH) == 0);
	hpu__rate_tick(&R, 2, 1.5);
	assert_true(hpu__rate_measuring(&R, 2));
	near(hpu__rate_final(&R, 2, 1.5, BATCH), BATCH / 0.5);
	/* a run of one step, no longer than the warm-up: measured whole */
	hpu__rate_start(&R, 1, 0, 0);
	hpu__rate_tick(&R, 1, 0.25);
	near(hpu__rate_final(&R, 1, 0.25, BATCH), BATCH / 0.25);
	/* resumed after 7 steps: counted from there */
	hpu__rate_start(&R, 0, 7, 10);
	hpu__rate_tick(&R, 8, 10.5);
	near(hpu__rate_final(&R, 8, 10.5, BATCH), BATCH / 0.5);
	/* no step: 0 */
	hpu__rate_start(&R, 1, 0, 0);
	assert_true(hpu__rate_final(&R, 0, 5, BATCH) == 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pause_left_out),
		cmocka_unit_test(test_warmup_and_short_run),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
