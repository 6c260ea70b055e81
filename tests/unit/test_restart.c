/* Unit tests for `hpulaunch --max-restarts` (launcher/args.c) and the
 * restart bookkeeping (agent/restart.c): the flag's range and errors,
 * the per-attempt job token, and the attempts counted against K. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/args_testlib.h"

#include "launcher/args.h"
#include "agent/restart.h"

static int setup(void **state)
{
	return args_clean_env(state);
}

static void test_flag_values(void **state)
{
	(void)state;
	hpu_launch_args a;
	parse_ok(&a, ARGV("--exec", "/bin/true"));
	assert_int_equal(a.max_restarts, 0); /* the default */
	hpu__args_free(&a);
	static const struct {
		const char *v;
		int want;
	} ok[] = {{"0", 0}, {"1", 1}, {"3", 3}, {"1000", 1000}};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		parse_ok(&a, ARGV("--devices", "2", "--max-restarts", (char *)ok[i].v, "--exec",
				  "/bin/true"));
		assert_int_equal(a.max_restarts, ok[i].want);
		assert_int_equal(a.devices, 2); /* the options around it still count */
		hpu__args_free(&a);
	}
	/* with several nodes, torchrun style */
	setenv("HPU_JOB_TOKEN", "t", 1);
	parse_ok(&a, ARGV("--nodes", "2", "--node-rank", "1", "--master-port", "29500",
			  "--max-restarts", "5", "--exec", "/bin/true"));
	assert_int_equal(a.max_restarts, 5);
	assert_int_equal(a.node_rank, 1);
	hpu__args_free(&a);
	setup(NULL);
}

static void test_flag_errors(void **state)
{
	(void)state;
	static const char *bad[] = {"1001", "-1", "x", "", "2.5", "3x", "99999999999"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char want[128];
		snprintf(want, sizeof want,
			 "--max-restarts takes a whole number of restarts from 0 to 1000, not '%s'",
			 bad[i]);
		parse_fails(ARGV("--max-restarts", (char *)bad[i], "--exec", "/bin/true"), want);
	}
	parse_fails(ARGV("--max-restarts"), "option --max-restarts needs a value");
}

static void test_help_mentions_flag(void **state)
{
	(void)state;
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	assert_non_null(f);
	hpu__args_usage(f);
	fclose(f);
	assert_non_null(strstr(text, "--max-restarts K"));
	assert_non_null(strstr(text, "HPU_RESTART_COUNT"));
	free(text);
}

/* Restart 0 keeps the job's token; each restart has its own, the same on
 * every node (a function of the token and the restart only). */
static void test_attempt_token(void **state)
{
	(void)state;
	char t0[129], t1[129], t1b[129], t2[129], u1[129];
	hpu__attempt_token("secret", 0, t0, sizeof t0);
	hpu__attempt_token("secret", 1, t1, sizeof t1);
	hpu__attempt_token("secret", 1, t1b, sizeof t1b);
	hpu__attempt_token("secret", 2, t2, sizeof t2);
	hpu__attempt_token("other", 1, u1, sizeof u1);
	assert_string_equal(t0, "secret");
	assert_int_equal((int)strlen(t1), 64);
	assert_int_equal((int)strspn(t1, "0123456789abcdef"), 64);
	assert_string_equal(t1, t1b);
	assert_string_not_equal(t1, t2);
	assert_string_not_equal(t1, u1);
	assert_string_not_equal(t1, "secret");
}

/* K restarts: attempts 1..K fail and restart, attempt K+1 ends the job. */
static void test_attempts_counted(void **state)
{
	(void)state;
	hpu_restarts r;
	hpu__restarts_init(&r, 2);
	assert_int_equal(r.attempt, 0);
	assert_int_equal(hpu__restarts_next(&r, "first cause"), 1);
	assert_int_equal(r.attempt, 1);
	assert_int_equal(hpu__restarts_next(&r, "second cause"), 1);
	assert_int_equal(r.attempt, 2);
	assert_int_equal(hpu__restarts_next(&r, "third cause"), 0);
	assert_string_equal(r.causes[0], "first cause");
	assert_string_equal(r.causes[2], "third cause");
	hpu__restarts_free(&r);
	hpu__restarts_free(&r); /* safe twice */
	hpu__restarts_init(&r, 0);
	assert_int_equal(hpu__restarts_next(&r, "only cause"), 0);
	hpu__restarts_free(&r);
	/* 10 attempts: the first 3 and the last 3 in full, the 4 between
	 * counted (the line grew by a cause an attempt: 90 KB at 1000) */
	hpu__restarts_init(&r, 9);
	char cause[32];
	for (int i = 1; i <= 10; i++) {
		snprintf(cause, sizeof cause, "cause %d", i);
		assert_int_equal(hpu__restarts_next(&r, cause), i < 10);
	}
	char *all = hpu__restarts_causes(&r);
	assert_non_null(all);
	printf("  %s\n", all);
	assert_string_equal(all, "attempt 1: cause 1; attempt 2: cause 2; attempt 3: cause 3; "
				 "4 more attempts (4 to 7); attempt 8: cause 8; attempt 9: cause 9; "
				 "attempt 10: cause 10");
	free(all);
	hpu__restarts_free(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_flag_values),
		cmocka_unit_test(test_flag_errors),
		cmocka_unit_test(test_help_mentions_flag),
		cmocka_unit_test(test_attempt_token),
		cmocka_unit_test(test_attempts_counted),
	};
	return cmocka_run_group_tests(tests, setup, NULL);
}
