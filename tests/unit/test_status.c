/* Unit tests for a worker's status records (proto/status.c): a forced
 * record goes out at once; records within 200 ms of the last one sent
 * are held, and the last one held goes out when the 200 ms are over,
 * from the flusher thread, while the reporting thread has gone quiet
 * (a frozen worker's agent sees the step it stopped in); a record
 * reported while one is held replaces it without waking the flusher
 * (it would cost the training thread a wake-up every step). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/status.h"

static int rd = -1;

/* What the pipe holds within ms milliseconds (after the first byte, what
 * comes within 50 ms more), NUL-ended in buf. */
static size_t drain(char *buf, size_t len, int ms)
{
	size_t n = 0;
	struct pollfd p = {.fd = rd, .events = POLLIN};
	while (n + 1 < len && poll(&p, 1, n ? 50 : ms) > 0) {
		ssize_t k = read(rd, buf + n, len - 1 - n);
		if (k <= 0)
			break;
		n += (size_t)k;
	}
	buf[n] = '\0';
	return n;
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

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static void test_held_then_flushed(void **state)
{
	(void)state;
	static char buf[8192];
	report(1, 1);
	drain(buf, sizeof buf, 1000);
	assert_int_equal(lines(buf), 1);
	assert_non_null(strstr(buf, "S1 1 100 1 1 "));
	/* 49 steps within the 200 ms: held, nothing written now */
	for (long s = 2; s <= 50; s++)
		report(s, 0);
	assert_int_equal(drain(buf, sizeof buf, 0), 0);
	/* then the worker goes quiet: the last one comes, alone */
	drain(buf, sizeof buf, 1000);
	assert_int_equal(lines(buf), 1);
	assert_non_null(strstr(buf, "S1 50 100 1 1 "));
	/* again after that flush (within 200 ms of it: held, then sent) */
	report(51, 0);
	report(52, 0);
	drain(buf, sizeof buf, 1000);
	assert_int_equal(lines(buf), 1);
	assert_non_null(strstr(buf, "S1 52 100 1 1 "));
	/* a forced record while one is held goes at once; the held one is
	 * dropped for it (it is newer) */
	report(53, 0);
	report(54, 1);
	drain(buf, sizeof buf, 100);
	assert_non_null(strstr(buf, "S1 54 100 1 1 "));
	sleep_ms(300);
	drain(buf, sizeof buf, 0);
	assert_null(strstr(buf, "S1 53 "));
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
