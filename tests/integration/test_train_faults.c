/* A training run that cannot write what it was asked to, or whose loss is
 * not finite, fails the job (hpulaunch exits 1) with a sentence that says
 * why -- never exit 0 with a short file or an infinite loss:
 *
 * - --metrics /dev/full (every write: ENOSPC): the step records, the
 *   final record alone, a checkpoint's report (the run stops there: no
 *   later checkpoint), a resumed run's report (no step trained);
 * - --save-params into a link to /dev/full, with a whole and a sharded
 *   strategy (the link stays a link: written through, never renamed over);
 *   into a link to a regular file: the file written, the link kept;
 * - a model whose loss turns NaN, +Inf or -Inf at its third call (the
 *   fixture bad_loss.so); the same model with a finite loss trains.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runlib.h"

#define BAD_LOSS h_build("lib/bad_loss.so")
#define NOSPACE "No space left on device"

static char T[256]; /* the test's temporary directory */

static const char *path(const char *rel)
{
	static char bufs[8][600];
	static int k;
	char *p = bufs[k++ & 7];
	snprintf(p, sizeof bufs[0], "%s/%s", T, rel);
	return p;
}

static int exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

static void has(const char *out, const char *needle)
{
	if (!strstr(out, needle))
		fail_msg("output does not say \"%s\":\n%s", needle, out);
}

static int setup(void **state)
{
	(void)state;
	const char *t = getenv("TMPDIR");
	snprintf(T, sizeof T, "%s/test_train_faults.XXXXXX", t && *t ? t : "/tmp");
	return mkdtemp(T) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	h_rmtree(T);
	return 0;
}

/* ---- --metrics ---- */

static void test_metrics_full_disk(void **state)
{
	(void)state;
	const char *says = "cannot write the metrics file /dev/full: " NOSPACE;
	run r;
	/* a record every step */
	start(&r, 2);
	args(&r, "--max-steps", "2", "--log-every", "1", "--metrics", "/dev/full", NULL);
	char *out = finish(&r, 1, NULL);
	has(out, says);
	free(out);
	/* only the final record */
	start(&r, 2);
	args(&r, "--max-steps", "2", "--metrics", "/dev/full", NULL);
	out = finish(&r, 1, NULL);
	has(out, says);
	free(out);
}

static void test_metrics_full_disk_checkpoints(void **state)
{
	(void)state;
	const char *says = "cannot write the metrics file /dev/full: " NOSPACE;
	const char *ck = path("ck");
	char step2[700];
	snprintf(step2, sizeof step2, "%s/step-00000002", ck);
	/* the report of step 1's checkpoint cannot be written: the job
	 * stops there, before step 2's checkpoint */
	run r;
	start(&r, 2);
	args(&r, "--max-steps", "2", "--checkpoint-dir", ck, "--checkpoint-every", "1",
	     "--metrics", "/dev/full", NULL);
	char *out = finish(&r, 1, NULL);
	has(out, says);
	assert_false(exists(step2));
	free(out);
	/* a run resumed from step 1: its load report fails it before a step */
	start(&r, 2);
	args(&r, "--max-steps", "2", "--checkpoint-dir", ck, "--checkpoint-every", "1",
	     "--resume", "auto", "--metrics", "/dev/full", NULL);
	out = finish(&r, 1, NULL);
	has(out, "resume: 2 ranks verified");
	has(out, says);
	assert_false(exists(step2));
	free(out);
	/* the same with a metrics file it can write trains on */
	start(&r, 2);
	args(&r, "--max-steps", "2", "--checkpoint-dir", ck, "--checkpoint-every", "1",
	     "--resume", "auto", "--metrics", path("m.jsonl"), NULL);
	free(finish(&r, 0, NULL));
	assert_true(exists(step2));
	char *m = h_slurp(path("m.jsonl"));
	assert_non_null(m);
	has(m, "\"checkpoint\":\"loaded\"");
	has(m, "\"final\":true");
	free(m);
}

/* ---- --save-params ---- */

static void test_save_params_full_disk(void **state)
{
	(void)state;
	const char *full = path("full");
	assert_int_equal(symlink("/dev/full", full), 0);
	const char *strategies[] = {"fast_ddp", "zero3"};
	for (int i = 0; i < 2; i++) {
		run r;
		start(&r, 2);
		args(&r, "--max-steps", "1", "--strategy", strategies[i], "--save-params", full,
		     NULL);
		char *out = finish(&r, 1, NULL);
		has(out, full);
		has(out, NOSPACE);
		free(out);
		struct stat st;
		assert_int_equal(lstat(full, &st), 0);
		assert_true(S_ISLNK(st.st_mode));
	}
	/* a link to a regular file: the file gets the parameters, the link
	 * stays */
	const char *link = path("link.bin");
	assert_int_equal(h_write_file(path("target.bin"), "old", 0644), 0);
	assert_int_equal(symlink("target.bin", link), 0);
	run r;
	start(&r, 2);
	args(&r, "--max-steps", "1", "--save-params", link, NULL);
	free(finish(&r, 0, NULL));
	struct stat st;
	assert_int_equal(lstat(link, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	size_t n;
	free(load_params(path("target.bin"), &n));
	assert_int_equal(n, 1863690); /* the MLP's parameters */
}

/* ---- the loss ---- */

/* Trains bad_loss.so on `devices` workers, its loss `loss` from the
 * third call on; returns the output after asserting the exit code. */
static char *train_bad_loss(int want, const char *devices, const char *loss)
{
	const char *argv[] = {LAUNCH,      "-q",      "--devices", devices,  "--no-eval",
			      "--log-every", "1",     "--batch-size", "16",   "--max-steps",
			      "5",          BAD_LOSS, "--",        "--loss", loss,
			      "--from",     "3",      NULL};
	proc p;
	int code = h_run(&p, (char *const *)argv, NULL, 120000);
	char *out = strdup(p.out ? p.out : "");
	h_free(&p);
	if (code != want)
		fail_msg("--loss %s: exit %d, wanted %d; output:\n%s", loss, code, want, out);
	return out;
}

static void test_nonfinite_loss(void **state)
{
	(void)state;
	static const struct {
		const char *loss, *says;
	} bad[] = {
		{"nan", "the model's loss returned NaN"},
		{"inf", "the model's loss returned +Inf"},
		{"-inf", "the model's loss returned -Inf"},
		{"-1", "the model's loss returned a negative value (bad labels?)"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		/* one worker: with two, the failing rank's abort can end rank
		 * 0 before its log line of step 2 is out */
		char *out = train_bad_loss(1, "1", bad[i].loss);
		has(out, bad[i].says);
		has(out, "step 2/5"); /* the first two steps were fine */
		if (strstr(out, "step 3/5"))
			fail_msg("--loss %s: step 3 was logged:\n%s", bad[i].loss, out);
		free(out);
	}
	char *out = train_bad_loss(0, "2", "0.25"); /* finite: it trains */
	has(out, "trained 5 steps on 2 workers");
	has(out, "final loss 0.2500");
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_metrics_full_disk),
	    cmocka_unit_test(test_metrics_full_disk_checkpoints),
	    cmocka_unit_test(test_save_params_full_disk),
	    cmocka_unit_test(test_nonfinite_loss),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
