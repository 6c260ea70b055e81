/* Unit tests of the profiler's device wait (HPU_PROFILE_SYNC): the wait
 * the runtime installs runs at each range's start and end on the main
 * thread while a trace is open, never on another thread, never while no
 * trace is open or none is installed. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/hpu/prof.h"
#include "tests/unit/tmp_testlib.h"

static int waits;

static void count_wait(void)
{
	waits++;
}

static void open_trace(const char *name)
{
	char err[256] = "";
	hpu_prof_conf c = {.dir = tmp_dir, .name = name, .world = 1, .job_id = "j",
			   .model = "m", .strategy = "s", .precision = "fp32"};
	if (hpu__prof_open(&c, err, sizeof err) < 0)
		fail_msg("hpu__prof_open: %s", err);
}

static void one_range(void)
{
	int64_t t0 = hpu__prof_t0();
	hpu__prof_span("forward", "forward", "layer", t0, NULL);
}

static void *other_thread(void *arg)
{
	(void)arg;
	one_range();
	return NULL;
}

static void test_wait_on_main_thread(void **state)
{
	(void)state;
	waits = 0;
	hpu__prof_set_sync(count_wait);
	one_range(); /* no trace open: nothing recorded, no wait */
	assert_int_equal(waits, 0);
	open_trace("sync");
	one_range();
	assert_int_equal(waits, 2); /* the range's start and its end */
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
	pthread_join(t, NULL);
	assert_int_equal(waits, 2); /* the loader's or a model's thread: no wait */
	hpu__prof_set_sync(NULL);
	one_range();
	assert_int_equal(waits, 2);
	hpu__prof_close();
	FILE *f = fopen(tmp_at("sync-rank0.json"), "r");
	assert_non_null(f);
	char buf[8192];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	assert_non_null(strstr(buf, "\"forward:layer\"")); /* the ranges were recorded */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_wait_on_main_thread),
	};
	return cmocka_run_group_tests(tests, tmp_setup, tmp_teardown);
}
