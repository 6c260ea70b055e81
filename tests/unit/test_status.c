/* Unit tests for a worker's status records (proto/status.c): a forced
 * record goes out at once; records within 200 ms of the last one sent
 * are held, and the last one held goes out when the 200 ms are over,
 * from the flusher thread, while the reporting thread has gone quiet
 * (a frozen worker's agent sees the step it stopped in), again after a
 * flush; a record reported while one is held is the one sent; a held
 * record never follows a newer forced one. (That the flusher is not
 * woken for each held record, the point of the code, no test can see:
 * bench/RESULTS.md measures it.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/status.h"

static int rd = -1;
static char got[65536]; /* everything read so far this phase */
static size_t ngot;

/* Reads what comes into got until `want` is in it (or `ms` pass); 1
 * when it came. Records come 200 ms apart at most: 3 s is slack for a
 * loaded machine, not a figure the test depends on. */
static int until_ms(const char *want, int ms)
{
	for (int waited = 0; waited < ms && !strstr(got, want); waited += 20) {
		struct pollfd p = {.fd = rd, .events = POLLIN};
		if (poll(&p, 1, 20) > 0) {
			ssize_t k = read(rd, got + ngot, sizeof got - 1 - ngot);
			if (k > 0)
				ngot += (size_t)k;
			got[ngot] = '\0';
		}
	}
	return strstr(got, want) != NULL;
}

static int until(const char *want)
{
	return until_ms(want, 3000);
}

static void phase(void)
{
	ngot = 0;
	got[0] = '\0';
}

static int lines(const char *s)
{
	int n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

static void report(long step, int force)
{
	hpu_status_rec r = {.step = step, .total = 100, .epoch = 1, .epochs = 1, .loss = 0.5,
			    .phase = HPU_PHASE_TRAIN};
	hpu__status_report(&r, force);
}

static void test_held_then_flushed(void **state)
{
	(void)state;
	phase();
	report(1, 1);
	assert_true(until("S1 1 100 1 1 "));
	/* 49 steps at once: the rate limit holds them back (a record every
	 * 200 ms at most), and the last one comes when the worker has gone
	 * quiet: the step it stopped in */
	phase();
	for (long s = 2; s <= 50; s++)
		report(s, 0);
	if (!until("S1 50 100 1 1 "))
		fail_msg("the last held record never came; got:\n%s", got);
	assert_true(lines(got) <= 3);
	/* held again after that flush, and sent */
	phase();
	report(51, 0);
	report(52, 0);
	if (!until("S1 52 100 1 1 "))
		fail_msg("the record held after a flush never came; got:\n%s", got);
	/* a forced record goes at once, and a held older one never follows
	 * it (the flusher must not send a stale record after a newer one) */
	phase();
	report(53, 0);
	report(54, 1);
	assert_true(until("S1 54 100 1 1 "));
	until_ms("S1 never", 400); /* what a held 53 would send meanwhile */
	const char *s53 = strstr(got, "S1 53 "), *s54 = strstr(got, "S1 54 ");
	assert_true(!s53 || s53 < s54);
}

int main(void)
{
	int p[2];
	if (pipe(p) != 0)
		return 1;
	rd = p[0];
	char v[16];
	snprintf(v, sizeof v, "%d", p[1]);
	setenv("HPU_STATUS_FD", v, 1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_held_then_flushed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
