/* Integration tests of hpulaunch --max-restarts: the real hpulaunch with
 * shell workers (--exec) on one node or two (two hpulaunch, loopback).
 * Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/harness.h"

#define LAUNCH h_build("bin/hpulaunch")

/* ---- --max-restarts ---- */

/* A shell worker: each rank writes what it saw to DIR/rRANK.COUNT (whole,
 * or not at all), then runs `body`. */
static void restart_script(char *out, size_t len, const char *dir, const char *body)
{
	snprintf(out, len,
		 "echo \"count=$HPU_RESTART_COUNT max=$HPU_MAX_RESTARTS\" > %s/.r$RANK && "
		 "mv %s/.r$RANK %s/r$RANK.$HPU_RESTART_COUNT; %s",
		 dir, dir, dir, body);
}

/* The line of `out` that starts with `prefix`, as a new string, or NULL. */
static char *line_with(const char *out, const char *prefix)
{
	const char *p = strstr(out, prefix);
	if (!p)
		return NULL;
	size_t n = strcspn(p, "\n");
	return strndup(p, n);
}

static int count_of(const char *s, const char *what)
{
	int n = 0;
	for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

/* Rank 1 kills itself (kill -9) on the first attempt once rank 0 is up
 * and waiting; with --max-restarts 1 the job is stopped (rank 0 too),
 * started again with HPU_RESTART_COUNT=1, and succeeds. The log file of
 * each rank keeps both attempts. */
static void test_restart_after_failure(void **state)
{
	(void)state;
	char dir[64], script[1024];
	h_scratch_dir(dir, sizeof dir);
	char body[512];
	snprintf(body, sizeof body,
		 "if [ \"$HPU_RESTART_COUNT\" = 0 ]; then "
		 "  if [ \"$RANK\" = 1 ]; then "
		 "    while [ ! -e %s/up0 ]; do sleep 0.05; done; kill -9 $$; "
		 "  fi; "
		 "  echo up; touch %s/up0; sleep 300; touch %s/late0; exit 0; "
		 "fi; echo \"resumed at restart $HPU_RESTART_COUNT\"",
		 dir, dir, dir);
	restart_script(script, sizeof script, dir, body);
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--max-restarts", "1", "--log-dir", dir,
			"--exec", "/bin/sh", "-c", script, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "hpulaunch: attempt 1 of 2 failed: rank 1 (node 0, pid "));
	/* an --exec program reports no steps: nothing said of where */
	assert_non_null(strstr(p.out, "was killed by signal 9 (Killed); restarting (restart 1 of 1)"));
	assert_non_null(strstr(p.out, "[rank 0] resumed at restart 1"));
	assert_non_null(strstr(p.out, "[rank 1] resumed at restart 1"));
	assert_null(strstr(p.out, "job failed after"));
	/* the restart says the cause; a job that then succeeds shows no error */
	assert_null(strstr(p.out, "hpulaunch: error:"));
	assert_true(h_file_has(dir, "r0.0", "count=0 max=1"));
	assert_true(h_file_has(dir, "r1.0", "count=0 max=1"));
	assert_true(h_file_has(dir, "r0.1", "count=1 max=1"));
	assert_true(h_file_has(dir, "r1.1", "count=1 max=1"));
	assert_false(h_file_exists(dir, "r0.2"));
	assert_false(h_file_exists(dir, "late0")); /* rank 0 was stopped */
	/* the log keeps both attempts */
	assert_true(h_file_has(dir, "rank_0.log", "[rank 0] up\n[rank 0] resumed at restart 1"));
	h_free(&p);
	assert_int_equal(h_rmtree(dir), 0);
}

/* A worker that always fails: with --max-restarts 2 the job runs three
 * times, then exits 1 naming the root cause of each attempt. */
static void test_restart_gives_up(void **state)
{
	(void)state;
	char dir[64], script[1024];
	h_scratch_dir(dir, sizeof dir);
	restart_script(script, sizeof script, dir,
		       "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 300");
	char *argv[] = {(char *)LAUNCH, "-q", "--devices", "2", "--max-restarts", "2", "--exec",
			"/bin/sh", "-c", script, NULL};
	proc p;
	int code = h_run(&p, argv, NULL, 120000);
	printf("%s", p.out);
	assert_int_equal(code, 1);
	assert_non_null(strstr(p.out, "restarting (restart 1 of 2)"));
	assert_non_null(strstr(p.out, "hpulaunch: attempt 2 of 3 failed: rank 1 (node 0, pid "));
	assert_non_null(strstr(p.out, "restarting (restart 2 of 2)"));
	char *last = line_with(p.out, "hpulaunch: job failed after 2 restarts: ");
	assert_non_null(last);
	assert_non_null(strstr(last, ": attempt 1: rank 1 (node 0, pid "));
	assert_non_null(strstr(last, "; attempt 2: rank 1 (node 0, pid "));
	assert_non_null(strstr(last, "; attempt 3: rank 1 (node 0, pid "));
	assert_int_equal(count_of(last, "exited with code 3"), 3);
	free(last);
	for (int a = 0; a < 3; a++) {
		char name[16], want[32];
		snprintf(name, sizeof name, "r1.%d", a);
		snprintf(want, sizeof want, "count=%d max=2", a);
		assert_true(h_file_has(dir, name, want));
	}
	assert_false(h_file_exists(dir, "r1.3"));
	h_free(&p);
	assert_int_equal(h_rmtree(dir), 0);
}

/* --max-restarts 0, and no flag at all: a failure ends the job as before,
 * and the workers see HPU_RESTART_COUNT=0, HPU_MAX_RESTARTS=0. */
static void test_restart_zero_as_before(void **state)
{
	(void)state;
	for (int flag = 0; flag < 2; flag++) {
		char dir[64], script[1024], body[256];
		h_scratch_dir(dir, sizeof dir);
		snprintf(body, sizeof body,
			 "if [ \"$RANK\" = 1 ]; then "
			 "  while [ ! -e %s/r0.0 ]; do sleep 0.05; done; exit 3; "
			 "fi; exec sleep 300",
			 dir);
		restart_script(script, sizeof script, dir, body);
		char *with[] = {(char *)LAUNCH, "--devices", "2", "--max-restarts", "0", "--exec",
				"/bin/sh", "-c", script, NULL};
		char *without[] = {(char *)LAUNCH, "--devices", "2", "--exec", "/bin/sh", "-c",
				   script, NULL};
		proc p;
		int code = h_run(&p, flag ? with : without, NULL, 60000);
		printf("%s", p.out);
		assert_int_equal(code, 1);
		assert_non_null(strstr(p.out, "hpulaunch: error: rank 1 (node 0, pid "));
		assert_null(strstr(p.out, "restart"));
		assert_true(h_file_has(dir, "r0.0", "count=0 max=0"));
		assert_true(h_file_has(dir, "r1.0", "count=0 max=0"));
		assert_false(h_file_exists(dir, "r1.1"));
		h_free(&p);
		assert_int_equal(h_rmtree(dir), 0);
	}
}

/* SIGTERM to hpulaunch during an attempt (here the second) stops the job
 * for good: exit 143, no further restart, no worker left. */
static void test_restart_not_after_sigterm(void **state)
{
	(void)state;
	char dir[64], script[1024];
	h_scratch_dir(dir, sizeof dir);
	restart_script(script, sizeof script, dir,
		       "if [ \"$HPU_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 1 ]; then exit 3; fi; "
		       "echo \"up at restart $HPU_RESTART_COUNT\"; exec sleep 300");
	char *argv[] = {(char *)LAUNCH, "--devices", "2", "--max-restarts", "3", "--exec",
			"/bin/sh", "-c", script, NULL};
	proc p;
	assert_int_equal(h_start(&p, argv, NULL), 0);
	int seen = h_wait_for(&p, "[rank 0] up at restart 1", 60000) |
		   h_wait_for(&p, "[rank 1] up at restart 1", 60000);
	pid_t kids[8];
	int n = h_children(p.pid, kids, 8);
	if (seen || n != 2) {
		h_kill_groups(kids, n);
		h_kill(&p);
		fail_msg("the second attempt did not start (%d workers): %s", n, p.out);
	}
	kill(p.pid, SIGTERM);
	int exited = h_wait(&p, 20000);
	int alive = h_alive(kids[0]) || h_alive(kids[1]);
	h_kill_groups(kids, n);
	if (exited)
		h_kill(&p);
	printf("%s", p.out);
	assert_int_equal(exited, 0);
	assert_int_equal(h_code(&p), 128 + SIGTERM);
	assert_non_null(strstr(p.out, "interrupted by SIGTERM"));
	assert_non_null(strstr(p.out, "restarting (restart 1 of 3)"));
	assert_null(strstr(p.out, "restart 2 of 3"));
	assert_null(strstr(p.out, "job failed after"));
	assert_false(h_file_exists(dir, "r0.2"));
	assert_false(alive);
	h_free(&p);
	assert_int_equal(h_rmtree(dir), 0);
}

/* Rank 1 fails while a restart remains, and Ctrl-C comes while rank 0
 * (which ignores SIGTERM) is still being stopped: no restart follows to
 * say the failure, so hpulaunch prints its cause before exiting 130 (the
 * error line is kept back while a restart remains; the cause was lost). */
static void test_failure_then_interrupt_said(void **state)
{
	(void)state;
	/* the workers' grace is 2 s: a try whose Ctrl-C came after it (the
	 * restart under way, on a loaded machine) is tried again */
	for (int t = 0; t < 3; t++) {
		char dir[64], script[1024], body[512];
		h_scratch_dir(dir, sizeof dir);
		snprintf(body, sizeof body,
			 "if [ \"$HPU_RESTART_COUNT\" != 0 ]; then exec sleep 60; fi; "
			 "if [ \"$RANK\" = 1 ]; then while [ ! -e %s/up0 ]; do sleep 0.05; done; "
			 "touch %s/failed1; exit 3; fi; "
			 "trap '' TERM; touch %s/up0; sleep 60",
			 dir, dir, dir);
		restart_script(script, sizeof script, dir, body);
		char *argv[] = {(char *)LAUNCH, "--devices", "2", "--max-restarts", "2", "--exec",
				"/bin/sh", "-c", script, NULL};
		proc p;
		assert_int_equal(h_start(&p, argv, NULL), 0);
		for (int i = 0; i < 1200 && !h_file_exists(dir, "failed1"); i++)
			usleep(50000);
		/* rank 1's exit seen (reaped: only rank 0 is left of
		 * hpulaunch's children), rank 0 in its grace */
		pid_t kids[8];
		int n = h_children(p.pid, kids, 8);
		for (int i = 0; i < 3000 && n > 1; i++) {
			usleep(10000);
			n = h_children(p.pid, kids, 8);
		}
		assert_int_equal(n, 1);
		kill(p.pid, SIGINT);
		int exited = h_wait(&p, 60000);
		h_kill_groups(kids, n);
		if (exited)
			h_kill(&p);
		printf("%s", p.out);
		assert_int_equal(exited, 0);
		assert_int_equal(h_code(&p), 128 + SIGINT);
		int late = strstr(p.out, "restarting") != NULL;
		if (!late || t == 2) {
			assert_false(late);
			assert_non_null(strstr(p.out, "hpulaunch: error: rank 1 (node 0, pid "));
			assert_non_null(strstr(p.out, ") exited with code 3"));
		}
		h_free(&p);
		assert_int_equal(h_rmtree(dir), 0);
		if (!late)
			break;
	}
}

/* Two nodes (two hpulaunch, one fixed coordinator port): rank 1 fails on
 * the first attempt while node 0's worker ignores SIGTERM, so node 0 is
 * still stopping (its coordinator still bound) when node 1 restarts. Node
 * 1's restart must wait for node 0's next coordinator, which binds the
 * same port again; then both attempts' ranks meet and run collectives. */
static void test_restart_two_nodes(void **state)
{
	(void)state;
	char port[16], script[512];
	snprintf(port, sizeof port, "%d", h_free_port());
	snprintf(script, sizeof script,
		 "if [ \"$HPU_RESTART_COUNT\" = 0 ]; then "
		 "  if [ \"$RANK\" = 1 ]; then exit 3; fi; trap '' TERM; sleep 300; "
		 "fi; exec %s",
		 h_build("bin/coll_env_check"));
	char *env[] = {"HPU_JOB_TOKEN=restart-secret", NULL};
	char *a0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
		      "--master-port", port, "--max-restarts", "1", "--exec", "/bin/sh", "-c",
		      script, NULL};
	char *a1[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "1",
		      "--master-port", port, "--max-restarts", "1", "--exec", "/bin/sh", "-c",
		      script, NULL};
	proc n0, n1;
	h_two_nodes(&n0, a0, env, 120000, &n1, a1, env, 30000);
	assert_int_equal(h_code(&n0), 0);
	assert_int_equal(h_code(&n1), 0);
	assert_non_null(strstr(n0.out, "restarting (restart 1 of 1)"));
	assert_non_null(strstr(n1.out, "restarting (restart 1 of 1)"));
	assert_non_null(strstr(n0.out, "[rank 0] coll ok: rank 0 of 2"));
	assert_non_null(strstr(n1.out, "[rank 1] coll ok: rank 1 of 2"));
	assert_null(strstr(n0.out, "address in use"));
	h_free(&n0);
	h_free(&n1);
}

/* A worker that presents the previous attempt's credentials is refused
 * by the restarted coordinator, which says so; the job then fails after
 * its one restart with both attempts' causes. */
static void test_restart_refuses_other_attempt(void **state)
{
	(void)state;
	char port[16], master_port[32], script[512];
	int pnum = h_free_port();
	snprintf(port, sizeof port, "%d", pnum);
	snprintf(master_port, sizeof master_port, "MASTER_PORT=%d", pnum);
	snprintf(script, sizeof script,
		 "if [ \"$HPU_RESTART_COUNT\" = 0 ]; then exit 3; fi; exec %s",
		 h_build("bin/coll_env_check"));
	char *env0[] = {"HPU_JOB_TOKEN=the-job-secret", NULL};
	char *argv0[] = {(char *)LAUNCH, "--nodes", "2", "--devices", "1", "--node-rank", "0",
			 "--master-port", port, "--join-timeout", "10", "--max-restarts", "1",
			 "--exec", "/bin/sh", "-c", script, NULL};
	proc node0;
	assert_int_equal(h_start(&node0, argv0, env0), 0);
	if (h_wait_for(&node0, "restarting (restart 1 of 1)", 30000)) {
		h_kill(&node0);
		fail_msg("no restart: %s", node0.out);
	}
	/* rank 1 of attempt 0: the job's own token, as attempt 0 had it */
	char *envw[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0", "NODE_RANK=1",
			"MASTER_ADDR=127.0.0.1", master_port, "HPU_JOB_ID=hpujob",
			"HPU_JOB_TOKEN=the-job-secret", NULL};
	char *argvw[] = {(char *)h_build("bin/coll_env_check"), NULL};
	proc w;
	int wcode = h_run(&w, argvw, envw, 30000);
	printf("stale worker: %s", w.out);
	assert_int_equal(wcode, 1);
	assert_non_null(strstr(w.out, "refused rank 1: it is a worker of restart 0 of this job, this is restart 1"));
	h_free(&w);
	int exited = h_wait(&node0, 60000);
	if (exited)
		h_kill(&node0);
	printf("node 0: %s", node0.out);
	assert_int_equal(exited, 0);
	assert_int_equal(h_code(&node0), 1);
	char *last = line_with(node0.out, "hpulaunch: job failed after 1 restart: ");
	assert_non_null(last);
	assert_non_null(strstr(last, "attempt 1: rank 0 (node 0, pid "));
	assert_non_null(strstr(last, "; attempt 2: rank 1 did not join within 10 s"));
	free(last);
	h_free(&node0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_restart_after_failure),
		cmocka_unit_test(test_restart_gives_up),
		cmocka_unit_test(test_restart_zero_as_before),
		cmocka_unit_test(test_restart_not_after_sigterm),
		cmocka_unit_test(test_failure_then_interrupt_said),
		cmocka_unit_test(test_restart_two_nodes),
		cmocka_unit_test(test_restart_refuses_other_attempt),
	};
	/* HPU_TEST=test_name (a glob) runs only the tests it names. */
	if (getenv("HPU_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
